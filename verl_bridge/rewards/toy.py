"""Built-in toy tasks over a 16-token digit vocabulary (no tokenizer files, no downloads).

Each task makes prompts from a seeded generator and scores a decoded response against the
sample's ground truth with a reward in [0, 1]. They are small enough that a 2-layer GPT learns
them from scratch with PPO or GRPO on a 2-core CPU in about a minute.

* ``repeat``: prompt ``<bos> d =``; answer: ``d`` repeated ``n`` times. Reward: fraction of the
  ``n`` answer positions the response gets right. (The quickstart task.)
* ``copy``:   prompt ``<bos> d1 d2 d3 =``; answer: ``d1 d2 d3``. Reward: per-position accuracy.
* ``sum``:    prompt ``<bos> a + b =``; answer: the last digit of ``a + b``. Reward: 1 or 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable


class ToyTokenizer:
    """Digits 0-9 plus ``+ = <pad> <bos> <eos>``; vocab padded to 16."""

    symbols = [str(i) for i in range(10)] + ["+", "=", "<pad>", "<bos>", "<eos>"]
    vocab_size = 16
    pad_token_id = 12
    bos_token_id = 13
    eos_token_id = 14

    def encode(self, text: str) -> list[int]:
        ids = []
        i = 0
        while i < len(text):
            for sym in ("<pad>", "<bos>", "<eos>"):
                if text.startswith(sym, i):
                    ids.append(self.symbols.index(sym))
                    i += len(sym)
                    break
            else:
                ch = text[i]
                i += 1
                if ch == " ":
                    continue
                if ch not in self.symbols:
                    raise ValueError(f"character {ch!r} is not in the toy vocabulary {self.symbols[:12]}")
                ids.append(self.symbols.index(ch))
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = []
        for t in ids:
            t = int(t)
            if t == self.eos_token_id and skip_special_tokens:
                break
            if t >= len(self.symbols):
                out.append("?")
                continue
            sym = self.symbols[t]
            if skip_special_tokens and sym.startswith("<"):
                continue
            out.append(sym)
        return "".join(out)


def positional_accuracy(response: str, ground_truth: str) -> float:
    """Fraction of ground-truth positions that the response matches (extra characters ignored)."""
    if not ground_truth:
        return 0.0
    hits = sum(1 for a, b in zip(response, ground_truth) if a == b)
    return hits / len(ground_truth)


def exact_match(response: str, ground_truth: str) -> float:
    return 1.0 if response.strip() == ground_truth.strip() else 0.0


@dataclass(frozen=True)
class ToyTask:
    name: str
    make: Callable[[random.Random], tuple[str, str]]  # rng -> (prompt text, ground truth)
    reward_fn: Callable[[str, str], float]
    max_response_length: int

    def sample(self, rng: random.Random, n: int) -> list[tuple[str, str]]:
        return [self.make(rng) for _ in range(n)]


def _repeat(rng: random.Random, n: int = 4) -> tuple[str, str]:
    d = str(rng.randrange(10))
    return f"<bos>{d}=", d * n


def _copy(rng: random.Random) -> tuple[str, str]:
    digits = "".join(str(rng.randrange(10)) for _ in range(3))
    return f"<bos>{digits}=", digits


def _sum(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"<bos>{a}+{b}=", str((a + b) % 10)


TASKS: dict[str, ToyTask] = {
    "repeat": ToyTask("repeat", _repeat, positional_accuracy, 4),
    "copy": ToyTask("copy", _copy, positional_accuracy, 3),
    "sum": ToyTask("sum", _sum, exact_match, 1),
}
TASKS["digits"] = TASKS["repeat"]  # default name in the config schema


def get_task(name: str) -> ToyTask:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(sorted(TASKS))}") from None
