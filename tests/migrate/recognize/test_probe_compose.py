"""The advantage block is probed together with the code that computes its inputs: a method whose
parameters are the group mean and std computed by its caller, and a nested per-sample function whose
baseline comes from the enclosing function (closure)."""

from __future__ import annotations

from .helpers import recognizer

DRIVER = """
from learner import Learner

def model_provider(pre_process=True, post_process=True):
    return build()

K = 6
net = model_provider()
Learner(net, samples_per_prompt=K, lr=4e-6).fit()
"""

LEARNER = """
import torch

class Learner:
    def __init__(self, net, samples_per_prompt=2, lr=1e-5, clip=0.25):
        self.net = net
        self.k = samples_per_prompt
        self.clip = clip
        self.opt = torch.optim.AdamW(net.parameters(), lr=lr)

    def score(self, texts):
        return torch.tensor([float(len(t) % 3) for t in texts])

    def objective(self, seqs, before, scores, centre, spread, keep):
        adv: torch.Tensor = (scores - centre) / (spread + 1e-5)
        now = lp(self.net, seqs)
        ratio = torch.exp(now - before)
        per_tok = -torch.min(ratio * adv[:, None], torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * adv[:, None])
        return ((per_tok * keep).sum(-1) / keep.sum(-1)).mean()

    def fit(self, rounds=300):
        for it in range(rounds):
            ids = torch.repeat_interleave(prompt_ids(), self.k, dim=0)
            seqs = self.net.generate(ids, max_new_tokens=96)
            scores = self.score(decode(seqs))
            centre = scores.mean(dim=-1).unsqueeze(-1)
            spread = scores.std(dim=-1).unsqueeze(-1)
            before = lp(self.net, seqs).detach()
            loss = self.objective(seqs, before, scores, centre, spread, resp_mask(seqs))
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
"""

# the baseline of one sample comes from the enclosing function's group statistics
NESTED = """
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def group_objective(model, group, lo, hi):
    scores = torch.Tensor([item.score for item in group])
    centre = scores.mean().item()
    spread = scores.std().item()

    def one(item):
        a = (item.score - centre) / spread
        ratio = torch.exp(lp(model, item) - item.old_lp)
        return torch.minimum(ratio * a, torch.clip(ratio, 1 - lo, 1 + hi) * a)

    return torch.cat([one(item) for item in group]).mean()

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, maximize=True)
    for step in range(25):
        groups = [[sample_one(model) for _ in range(5)] for _ in range(4)]
        total = torch.stack([group_objective(model, g, 0.2, 0.3) for g in groups]).sum()
        total.backward()
        opt.step()
        opt.zero_grad()

def sample_one(model):
    return model.generate(prompt(), max_new_tokens=8)

if __name__ == "__main__":
    main()
"""


def test_a_method_fed_the_group_mean_and_std_by_its_caller(tmp_path):
    r = recognizer(DRIVER, tmp_path, modules={"learner.py": LEARNER})
    assert r.a.status == "migrate", (r.a.reasons, r.a.warnings)
    assert r.a.config["algorithm.name"] == "grpo"
    assert r.a.config["algorithm.norm_adv_by_std"] is True
    # torch.repeat_interleave(x, G): the count is the second argument, bound through the constructor
    assert r.a.config["algorithm.group_size"] == 6
    assert any("identified by running the block" in w for w in r.a.warnings)


def test_a_nested_per_sample_function_reads_its_group_statistics_from_the_closure():
    r = recognizer(NESTED)
    assert r.a.config.get("algorithm.name") == "grpo", (r.a.reasons, r.a.warnings)
    assert r.a.config.get("algorithm.norm_adv_by_std") is True


def test_a_reward_helper_that_returns_a_method_of_a_given_object_is_not_the_reward_path():
    src = NESTED.replace("""def sample_one(model):
    return model.generate(prompt(), max_new_tokens=8)""", """def judge_reward(tok, world, ids):
    text = tok.decode(ids)
    return world.reward(text)

def sample_one(model):
    ids = model.generate(prompt(), max_new_tokens=8)
    return Item(ids, judge_reward(TOK, WORLD, ids))""")
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    assert "model.reward.args.path" not in r.a.config
    assert any("world.reward()" in w for w in r.a.warnings), r.a.warnings
