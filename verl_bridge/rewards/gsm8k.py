"""GSM8K rule reward (verl's ``gsm8k`` scorer): the answer after ``#### ``, compared numerically.

* ``strict`` (default): the response must contain ``#### <number>``; the last such number counts.
* ``flexible``: the last number anywhere in the response counts (no ``####`` needed).

Numbers are normalised before comparison: thousands commas, a ``$`` sign and a trailing ``.``
are dropped (``#### $1,000.`` reads as 1000). The ground truth may be a bare number or a GSM8K
solution ending in ``#### 72``; it is extracted the same way. Score: ``score`` (1.0) when equal,
``format_score`` (0.0) when an answer was found but differs, 0.0 when none was found.

Config: ``model.reward.args.path: gsm8k`` (strict) or ``gsm8k_flexible``, or the full
``verl_bridge.rewards.gsm8k:compute_score``.
"""

from __future__ import annotations

import math
import re
from typing import Optional

_NUMBER = r"-?\$?\s?[0-9][0-9,]*(?:\.[0-9]+)?\.?|-?\$?\.[0-9]+"
_STRICT = re.compile(r"####\s*(" + _NUMBER + r")")
_ANY = re.compile(r"(" + _NUMBER + r")")


def normalize_number(text: str) -> Optional[float]:
    """``"$1,234."`` -> 1234.0; ``None`` when ``text`` is not a number after normalisation."""
    s = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = float(s)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def extract_answer(text: str, method: str = "strict") -> Optional[float]:
    """The final numeric answer of ``text``; ``None`` when there is none (strict: no ``#### n``)."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method={method!r}: expected 'strict' or 'flexible'")
    pattern = _STRICT if method == "strict" else _ANY
    for match in reversed(pattern.findall(text)):
        value = normalize_number(match)
        if value is not None:
            return value
    return None


def extract_ground_truth(ground_truth: str) -> Optional[float]:
    """A GSM8K answer (``"... #### 72"``) or a bare number (``"72"``, ``"1,000"``)."""
    value = extract_answer(str(ground_truth), "strict")
    if value is None:
        value = normalize_number(str(ground_truth))
    return value


def compute_score(response: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    truth = extract_ground_truth(ground_truth)
    if truth is None:
        raise ValueError(f"GSM8K ground truth {str(ground_truth)[-80:]!r} holds no number (expected '... #### 72')")
    answer = extract_answer(response, method)
    if answer is None:
        return 0.0
    return score if math.isclose(answer, truth, rel_tol=1e-9, abs_tol=1e-6) else format_score


def compute_score_flexible(response: str, ground_truth: str) -> float:
    return compute_score(response, ground_truth, method="flexible")
