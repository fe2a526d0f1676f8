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
