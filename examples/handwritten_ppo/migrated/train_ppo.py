"""A hand-written PPO loop over megatron-core (GRPO-style advantages), as teams write them.

Toy task without a tokenizer: a prompt is a row of digits (token id = digit), the ground truth is
the prompt's last digit, and the reward is the fraction of response digits equal to it.

Runs on CPU in a few seconds:  python examples/handwritten_ppo/train_ppo.py
`verl-bridge migrate` turns it into migrated/train_ppo.py + migrated/train_ppo.yaml.
"""

import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from verl_bridge.compat import make_cpu_safe
from verl_bridge.models.spec import get_portable_gpt_layer_spec
from verl_bridge import MegatronTrainer, load_config

# ---- hyperparameters -------------------------------------------------------------------
VOCAB_SIZE = 32
PROMPT_LEN = 6
MAX_NEW_TOKENS = 4
PROMPTS_PER_STEP = 4
GROUP_SIZE = 4
TOTAL_STEPS = 3
PPO_EPOCHS = 2
MINI_BATCH_SIZE = 8
LEARNING_RATE = 1e-4
CLIP_EPS = 0.2
KL_COEF = 0.05
TEMPERATURE = 1.0
TP_SIZE = 1
PP_SIZE = 1


def initialize_megatron():
    """Our own init: a world of one on CPU (torchrun sets the env vars on a cluster)."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=int(os.environ.get("RANK", "0")),
                                world_size=int(os.environ.get("WORLD_SIZE", "1")))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP_SIZE,
                                                 pipeline_model_parallel_size=PP_SIZE)


def model_provider(pre_process=True, post_process=True):
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
        bias_dropout_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, apply_rope_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
    )
    model = GPTModel(
        config=config, transformer_layer_spec=get_portable_gpt_layer_spec(), vocab_size=VOCAB_SIZE,
        max_sequence_length=64, pre_process=pre_process, post_process=post_process,
        position_embedding_type="rope",
    )
    return make_cpu_safe(model)


def load_checkpoint(model, optimizer=None, opt_param_scheduler=None, load_dir=None):
    """Load a state dict saved by torch.save if one exists; returns the iteration."""
    path = os.path.join(load_dir, "model.pt") if load_dir else None
    if path and os.path.exists(path):
        model.load_state_dict(torch.load(path, map_location="cpu"))
    return 0


def reward_fn(response_text, ground_truth):
    """Fraction of response characters equal to the ground-truth digit."""
    if not response_text:
        return 0.0
    return sum(ch == ground_truth for ch in response_text) / len(response_text)


def sample_prompts(num_prompts, generator):
    return torch.randint(0, 10, (num_prompts, PROMPT_LEN), generator=generator)


def forward_logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    return model(input_ids=tokens, position_ids=positions, attention_mask=None)


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0):
    tokens = prompts
    for _ in range(max_new_tokens):
        logits = forward_logits(model, tokens)[:, -1, :10].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1)], dim=1)
    return tokens


def response_logprobs(model, tokens, prompt_len):
    logits = forward_logits(model, tokens)[:, prompt_len - 1:-1, :10].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, tokens[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


def main():
    config = load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_ppo.yaml"))
    MegatronTrainer(config).train()


if __name__ == "__main__":
    main()
