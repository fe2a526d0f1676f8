"""Never a wrong prompt count: next() that draws whole DataLoader batches counts batch x draws (or
nothing), a draw loop that also trains is no draw of prompts, and a DataLoader whose batches the
optimizer accumulates over several iterations (``if i % k == 0: opt.step()``) gives no per-step count."""

from __future__ import annotations

from .helpers import recognizer

HEAD = """
import torch
from torch.utils.data import DataLoader

def model_provider(pre_process=True, post_process=True):
    return build()

def reward_fn(response_text, ground_truth):
    return 1.0

G = 4
"""

STEP = """
        outs = model.generate(prompts, max_new_tokens=32, num_return_sequences=G)
        r = torch.tensor([reward_fn(o, None) for o in outs]).view(-1, G)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
        lp = logps(model, outs)
        ratio = torch.exp(lp - lp.detach())
        loss = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
"""


def test_next_of_a_loader_iterator_counts_its_batches():
    src = HEAD + """
def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    stream = iter(DataLoader(load_rows(), batch_size=3, shuffle=True))
    for step in range(50):
        prompts = [next(stream) for _ in range(2)]
""" + STEP + """
        opt.zero_grad()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
"""
    r = recognizer(src)
    assert r.a.config.get("data.rollout_batch_size") == 6, (r.a.config, r.a.reasons)


def test_a_draw_loop_that_trains_is_no_prompt_count():
    src = HEAD + """
def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    stream = iter(load_rows())
    for step in range(50):
        for _ in range(4):
            prompts = next(stream)
""" + STEP.replace("\n        ", "\n            ") + """
            loss.backward()
        opt.step()
        opt.zero_grad()

if __name__ == "__main__":
    main()
"""
    r = recognizer(src)
    assert "data.rollout_batch_size" not in r.a.config, r.a.config


def test_a_loader_accumulated_over_batches_gives_no_per_step_count():
    src = HEAD + """
def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loader = DataLoader(load_rows(), batch_size=8)
    for epoch in range(3):
        for i, prompts in enumerate(loader):
""" + STEP.replace("\n        ", "\n            ") + """
            loss.backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()

if __name__ == "__main__":
    main()
"""
    r = recognizer(src)
    assert "data.rollout_batch_size" not in r.a.config, r.a.config
    assert "trainer.total_steps" not in r.a.config or r.a.config["trainer.total_steps"] != 3, r.a.config



# a DataLoader stored on self in __init__ and iterated by a method: its batch size is the argument the one
# construction passes (4), not the parameter's default (16)
SELF_LOADER = """
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

def reward_fn(response_text, ground_truth):
    return 1.0

class Trainer:
    def __init__(self, model_dir, batch_size=16, group=8, steps=100, lr=1e-6):
        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.loader = DataLoader(load_prompts(), batch_size=batch_size, shuffle=True, drop_last=True)
        self.group = group
        self.steps = steps

    def train(self):
        for epoch in range(self.steps):
            for prompts in self.loader:
                out = self.model.generate(prompts, do_sample=True, max_new_tokens=64, num_return_sequences=self.group)
                r = torch.tensor([reward_fn(t, None) for t in decode(out)]).view(-1, self.group)
                adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
                loss = -(seq_lp(self.model, out) * adv).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()

if __name__ == "__main__":
    Trainer("./m", batch_size=4).train()
"""


def test_a_loader_stored_on_self_takes_the_constructor_argument():
    r = recognizer(SELF_LOADER)
    assert r.a.config.get("data.rollout_batch_size") == 4, (r.a.config, r.a.reasons)
    assert r.a.config.get("algorithm.mini_batch_size") == 32, r.a.config


def test_next_of_an_unknown_iterator_is_no_prompt_count():
    # a generator of the program may yield whole batches: N draws are not N prompts
    src = HEAD + """
def chunks(rows, n):
    for i in range(0, len(rows), n):
        yield rows[i:i + n]

def main():
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    stream = chunks(load_rows(), 5)
    for step in range(50):
        prompts = [next(stream) for _ in range(2)]
""" + STEP + """
        opt.zero_grad()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
"""
    r = recognizer(src)
    assert "data.rollout_batch_size" not in r.a.config, r.a.config
