"""A step that collects per-prompt groups into a buffer and trains on it in mini-batches drawn by a
DataLoader bound to a variable; the loss is reduced by an annotated helper and guarded by a run-time
finiteness check before backward()."""

from __future__ import annotations

from .helpers import recognizer

SCRIPT = """
from typing import Optional
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM
from lossfns import per_row_mean


def score(completion, truth):
    return float(truth in completion)


def centred(r):
    return (r - r.mean()) / (r.std() + 1e-6)


def main():
    policy = AutoModelForCausalLM.from_pretrained("./ckpt/policy")
    opt = torch.optim.Adam(policy.parameters(), lr=3e-6)
    samples_per_prompt = 6
    for step, prompts in enumerate(prompt_batches()):
        store = []
        with torch.no_grad():
            for q, truth in prompts:
                ids = policy.generate(encode(q).repeat(samples_per_prompt, 1), max_new_tokens=200)
                r = torch.tensor([score(t, truth) for t in decode(ids)])
                adv = centred(r)
                store.extend(rows(ids, adv, logp(policy, ids)))
        batches = DataLoader(store, batch_size=12, shuffle=True, collate_fn=stack)
        for ids, adv, old in batches:
            new = logp(policy, ids)
            ratio = (new - old).exp()
            surr = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            objective = -surr
            tok_mask = ids_mask(ids)
            loss = per_row_mean(objective, tok_mask, dim=-1).mean()
            if not torch.isfinite(loss):
                print("skipping", loss)
                continue
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
"""

LOSSFNS = """
from typing import Optional
import torch


def per_row_mean(values: torch.Tensor, tok_mask: Optional[torch.Tensor], dim: int = None) -> torch.Tensor:
    if tok_mask is None:
        return values.mean(dim)
    return (values * tok_mask).sum(dim) / tok_mask.sum(dim)
"""


def _run(tmp_path):
    return recognizer(SCRIPT, tmp_path, {"lossfns.py": LOSSFNS})


def test_group_std_division_sets_norm_adv_by_std(tmp_path):
    r = _run(tmp_path)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.name"] == "grpo"
    assert r.a.config["algorithm.group_size"] == 6
    assert r.a.config["algorithm.norm_adv_by_std"] is True


def test_named_dataloader_is_the_minibatch_loop(tmp_path):
    r = _run(tmp_path)
    # one optimizer step per DataLoader batch of 12 rows, no inner accumulation loop
    assert r.a.config["algorithm.mini_batch_size"] == 12
    assert r.a.config["algorithm.micro_batch_size"] == 12


def test_loss_agg_through_annotated_helper_and_finiteness_guard(tmp_path):
    r = _run(tmp_path)
    assert r.a.config["algorithm.loss_agg_mode"] == "seq-mean-token-mean"
