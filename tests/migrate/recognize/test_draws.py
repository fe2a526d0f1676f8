"""Prompts drawn at random each step give data.rollout_batch_size; a periodic evaluation that generates
inside the update loop does not make that loop a data loop (trainer.total_steps stays proven)."""

from __future__ import annotations

from .helpers import recognizer

SRC = """
import random
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def reward_fn(response_text, ground_truth):
    return 1.0

ITERS = 40
PROMPTS_EACH = 12
SAMPLES = 6

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-6)
    pool = load_questions()
    seen = 0
    for it in range(ITERS):
        picked = random.sample(pool, PROMPTS_EACH)
        texts = [q.text for q in picked]
        outs = model.generate(texts, max_new_tokens=40, num_return_sequences=SAMPLES)
        r = torch.tensor([reward_fn(o, q.answer) for o, q in zip(outs, picked)])
        g = r.view(-1, SAMPLES)
        adv = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-6)).view(-1)
        for part in range(0, len(outs), 24):
            logp = lp(model, outs[part:part + 24])
            (-(logp * adv[part:part + 24]).mean()).backward()
            seen += 24
            if seen % 480 == 0:
                print(score(model.generate(held_out(), max_new_tokens=40)))
        opt.step()
        opt.zero_grad()

if __name__ == "__main__":
    main()
"""


def test_random_prompt_draw_and_periodic_evaluation():
    r = recognizer(SRC)
    assert r.a.config.get("data.rollout_batch_size") == 12, (r.a.config, r.a.warnings)
    assert r.a.config.get("trainer.total_steps") == 40, (r.a.config, r.a.warnings)
    assert r.a.provenance["data.rollout_batch_size"] == "t.py:12"  # PROMPTS_EACH = 12
    # a draw that never reaches the rollout is not the prompts per step
    r2 = recognizer(SRC.replace("outs = model.generate(texts,", "outs = model.generate(load_questions(),"))
    assert "data.rollout_batch_size" not in r2.a.config or r2.a.config["data.rollout_batch_size"] != 12
