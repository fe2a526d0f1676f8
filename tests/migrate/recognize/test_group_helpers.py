"""Course-assignment shape: rewards grouped with ``view(n_groups, G)``, the std divisor held in a
variable under an ``if`` that a flag settles, and a clipped objective that only a non-default
``loss_type`` selects."""

from __future__ import annotations


from .helpers import recognizer

SCRIPT = """
import argparse
import torch
from transformers import AutoModelForCausalLM


CLIP = 0.25


def correctness(text, truth):
    return float(truth in text)


def group_scores(texts, truths, g, eps, by_std):
    raw = torch.tensor([correctness(t, a) for t, a in zip(texts, truths)])
    n_groups = len(texts) // g
    grid = raw.view(n_groups, g)
    centre = grid.mean(dim=1, keepdim=True)
    spread = grid.std(dim=1, keepdim=True)
    if by_std:
        out = (grid - centre) / (spread + eps)
    else:
        out = grid - centre
    return out.view(-1)


def plain_pg(logp, adv):
    return -adv * logp


def clipped_pg(logp, old, adv, eps):
    ratio = torch.exp(logp - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv)


def pg_loss(kind, logp, old, adv, eps):
    if kind == "plain":
        return plain_pg(logp, adv)
    elif kind == "clipped":
        return clipped_pg(logp, old, adv, eps)
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objective", default="plain")
    ap.add_argument("--eps_clip", type=float, default=0.25)
    ap.add_argument("--raw_advantages", action="store_true")
    args = ap.parse_args()
    lm = AutoModelForCausalLM.from_pretrained("./ckpt/lm")
    opt = torch.optim.AdamW(lm.parameters(), lr=2e-6)
    for it in range(50):
        idx = torch.randperm(len(POOL))[:16].tolist()
        prompts = [POOL[i][0] for i in idx]
        truths = [POOL[i][1] for i in idx]
        ids = lm.generate(prompts, max_new_tokens=300, num_return_sequences=4)
        adv = group_scores(decode(ids), truths * 4, 4, 1e-6, not args.raw_advantages)
        logp = token_logp(lm, ids)
        loss = pg_loss(args.objective, logp, logp.detach(), adv[:, None], args.eps_clip).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
"""


def test_rows_from_length_over_group_size_are_groups():
    r = recognizer(SCRIPT)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.name"] == "grpo"
    assert r.a.config["algorithm.group_size"] == 4


def test_std_divisor_through_a_variable_under_a_settled_flag():
    r = recognizer(SCRIPT)
    assert r.a.config["algorithm.norm_adv_by_std"] is True


def test_std_division_under_an_unsettled_flag_is_not_claimed():
    r = recognizer(SCRIPT.replace("not args.raw_advantages", "bool(os.environ.get('STD'))").replace(
        "import argparse\n", "import argparse\nimport os\n", 1))
    assert "algorithm.norm_adv_by_std" not in r.a.config


def test_clip_of_an_objective_the_defaults_do_not_select_is_not_reported():
    r = recognizer(SCRIPT)
    assert "algorithm.clip_ratio" not in r.a.config
    r2 = recognizer(SCRIPT.replace('ap.add_argument("--objective", default="plain")',
                                   'ap.add_argument("--objective", default="clipped")'))
    assert r2.a.config["algorithm.clip_ratio"] == 0.25


def test_prompts_drawn_by_a_permutation_converted_to_a_list():
    # torch.randperm(n)[:16].tolist(): 16 prompts per step
    r = recognizer(SCRIPT)
    assert r.a.config["data.rollout_batch_size"] == 16
