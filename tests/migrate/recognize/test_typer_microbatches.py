"""A typer entry point (parameter defaults written as ``typer.Option(default, help=...)``) whose update
slices each train batch into micro-batches with a local generator."""

from __future__ import annotations

from .helpers import recognizer

SCRIPT = """
import torch
import typer
from transformers import AutoModelForCausalLM


def match(text, truth):
    return float(text.strip() == truth)


def chunks(rows, size):
    for s in range(0, len(rows), size):
        yield rows[s:s + size]


def main(
    policy_path: str = typer.Option("./ckpt/policy", help="policy weights"),
    steps: int = typer.Option(120, help="updates"),
    lr: float = typer.Option(4e-6),
    group: int = 4,
    train_batch: int = 32,
    accum: int = 8,
):
    lm = AutoModelForCausalLM.from_pretrained(policy_path)
    opt = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.0)
    micro = train_batch // accum
    for it in range(steps):
        prompts, truths = next_prompts(16)
        ids = lm.generate(prompts, max_new_tokens=256, num_return_sequences=group)
        r = torch.tensor([match(t, a) for t, a in zip(decode(ids), truths * group)])
        g = r.view(-1, group)
        adv = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-6)).view(-1)
        rows = list(zip(ids, adv))
        for start in range(0, len(rows), train_batch):
            for mb in chunks(rows[start:start + train_batch], micro):
                a = stack_adv(mb)
                ratio = torch.exp(logp(lm, mb) - old_logp(mb))
                loss = -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a).mean() / accum
                loss.backward()
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    typer.run(main)
"""


def test_typer_option_defaults_are_the_parameter_values():
    r = recognizer(SCRIPT)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["optim.actor.lr"] == 4e-6
    assert r.a.config["trainer.total_steps"] == 120
    assert r.a.config["model.actor.args.model_name_or_path"] == "./ckpt/policy"


def test_generator_stride_is_the_micro_batch_not_the_mini_batch():
    r = recognizer(SCRIPT)
    assert r.a.config["algorithm.mini_batch_size"] == 32
    assert r.a.config["algorithm.micro_batch_size"] == 4
