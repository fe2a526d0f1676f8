"""Create the two tiny local Hugging Face models this example trains (nothing is downloaded).

    python examples/hf_critic/make_models.py          # -> examples/hf_critic/models/{actor,critic}

actor:  a Llama (RMSNorm, SwiGLU, RoPE, GQA) that verl-bridge imports into a megatron-core
        GPTModel through ``model.actor.args.model_name_or_path``;
critic: a Qwen2 (a different architecture: QKV bias) loaded with ``transformers.AutoModel`` and
        given a scalar value head (``model.critic.type: huggingface``).
Both share the toy task's 16-token vocabulary (a critic must read the actor's token ids).
"""

import os
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(vocab_size=16, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, max_position_embeddings=64, tie_word_embeddings=False)


def main(out_dir: str = os.path.join(HERE, "models")) -> None:
    for name, config in (("actor", LlamaConfig(**SHAPE)), ("critic", Qwen2Config(**SHAPE))):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(os.path.join(out_dir, name))
        print(f"wrote {os.path.join(out_dir, name)} ({config.architectures or type(model).__name__})")


if __name__ == "__main__":
    main(*sys.argv[1:])
