"""An on-policy update that accumulates gradients over a strided micro-batch loop and steps once per
rollout batch: micro_batch_size is the stride, mini_batch_size the whole batch (prompts x responses);
a hand-written decoder (multinomial over the softmax of the logits) gives the sampling settings."""

from __future__ import annotations

from .helpers import recognizer

SRC = """
import random
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def reward_fn(response_text, ground_truth):
    return 1.0

HEAT = 0.8
PER_Q = 4
Q_EACH = 10
CHUNK = 5

def decode(model, ids, steps):
    for _ in range(steps):
        scores = model(ids)[:, -1]
        dist = torch.softmax(scores / HEAT, dim=-1)
        nxt = torch.multinomial(dist, num_samples=1)
        ids = torch.cat([ids, nxt], dim=1)
    return ids

def learn(model, opt, seqs, adv):
    for lo in range(0, len(seqs), CHUNK):
        part = seqs[lo:lo + CHUNK]
        (-(lp(model, part) * adv[lo:lo + CHUNK]).mean()).backward()
    opt.step()
    opt.zero_grad()

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-6)
    bank = questions()
    for it in range(70):
        chosen = random.sample(bank, Q_EACH)
        ids = encode(chosen).repeat_interleave(PER_Q, dim=0)
        seqs = decode(model, ids, 64)
        r = torch.tensor([reward_fn(s, q) for s, q in pairs(seqs, chosen)])
        g = r.view(-1, PER_Q)
        adv = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-6)).view(-1)
        learn(model, opt, seqs, adv)

if __name__ == "__main__":
    main()
"""


def test_strided_accumulation_and_one_step_per_batch():
    r = recognizer(SRC)
    assert r.a.status == "migrate", r.a.reasons
    c = r.a.config
    assert c["algorithm.ppo_epochs"] == 1
    assert c["data.rollout_batch_size"] == 10 and c["algorithm.group_size"] == 4
    assert c.get("algorithm.micro_batch_size") == 5, (c, r.a.warnings)
    assert c.get("algorithm.mini_batch_size") == 40, (c, r.a.warnings)


def test_hand_written_sampling():
    r = recognizer(SRC)
    c = r.a.config
    assert (c.get("rollout.temperature"), c.get("rollout.top_p"), c.get("rollout.top_k")) == (0.8, 1.0, 0), c
    # a top-k filter in the decoder: nothing is claimed about top_k / top_p
    r2 = recognizer(SRC.replace("scores = model(ids)[:, -1]",
                                "scores = model(ids)[:, -1]\n        kth = torch.topk(scores, 20).values[:, -1:]"))
    assert "rollout.top_k" not in r2.a.config and "rollout.top_p" not in r2.a.config
