"""Write a small OPT-shaped Hugging Face model directory with its own tokenizer; nothing is downloaded.

    python examples/seed_layout/make_opt.py DIR [--layers 4] [--hidden 64] [--seed 0]

The tokenizer is a word-level one made here over the toy tasks' 16 symbols (digits, ``+ = <pad>
<bos> <eos>``, in verl-bridge's ToyTokenizer order), so ``data.task=repeat`` prompts and the model
agree on ids. The model is a random ``OPTForCausalLM`` (learned positions, LayerNorm, ReLU, biases,
tied embeddings), the shape family of the seed article's OPT actor, small enough for a CPU.
"""

from __future__ import annotations

import argparse
import os
import sys


def make_opt(out_dir: str, layers: int = 4, hidden: int = 64, seed: int = 0) -> str:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import OPTConfig, OPTForCausalLM, PreTrainedTokenizerFast

    from verl_bridge.rewards import ToyTokenizer

    toy = ToyTokenizer()
    vocab = {sym: i for i, sym in enumerate(toy.symbols)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<pad>")
    config = OPTConfig(vocab_size=toy.vocab_size, hidden_size=hidden, num_attention_heads=4, num_hidden_layers=layers,
                       ffn_dim=4 * hidden, max_position_embeddings=64, word_embed_proj_dim=hidden,
                       do_layer_norm_before=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                       pad_token_id=vocab["<pad>"], bos_token_id=vocab["<bos>"], eos_token_id=vocab["<eos>"])
    torch.manual_seed(seed)
    model = OPTForCausalLM(config).eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    fast.save_pretrained(out_dir)
    return out_dir


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(f"wrote {make_opt(a.out_dir, a.layers, a.hidden, a.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
