"""A prompt tokenizer inside a dataset transform handed over by ``functools.partial``: its ``max_length``
is the value the partial binds (the function is never called directly), and a prompt returned as a dict
entry ({"prompt_ids": tokenizer(...)["input_ids"]}) is a prompt."""

from __future__ import annotations

from .helpers import GRPO, recognizer

SETUP = """
import functools

PROMPT_CAP = 48

def encode_rows(row, tok, cap):
    return {"prompt_ids": tok(row["text"], truncation=True, max_length=cap, padding="max_length")["input_ids"]}

def prepare(rows, tok):
    rows.set_transform(functools.partial(encode_rows, tok=tok, cap=PROMPT_CAP))
    return rows
"""


def test_partial_binds_the_prompt_length():
    r = recognizer(SETUP + GRPO)
    assert r.a.config.get("data.max_prompt_length") == 48, (r.a.config, r.a.warnings)


def test_a_direct_call_with_another_length_is_not_overridden_by_the_partial():
    src = SETUP + "\n\ndef warm(tok):\n    return encode_rows({'text': 'x'}, tok, 99)\n" + GRPO
    r = recognizer(src)
    assert "data.max_prompt_length" not in r.a.config or r.a.config["data.max_prompt_length"] == 99, r.a.config
