"""GSM8K rule reward (``#### <number>``) and prompt-file rows reaching a reward function with their extra fields."""

import json
from pathlib import Path

import pytest

from verl_bridge.config import ConfigError, load_config
from verl_bridge.data import GroundTruth, load_prompt_file
from verl_bridge.rewards import load_reward_fn
from verl_bridge.rewards.gsm8k import compute_score, extract_answer, extract_ground_truth

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "gsm8k_sample.jsonl"


@pytest.mark.parametrize("response, truth, expected", [
    ("48/2 = 24, 48+24 = 72\n#### 72", "... 48+24 = 72 clips\n#### 72", 1.0),   # correct
    ("so the answer is\n#### 71", "#### 72", 0.0),                               # wrong
    ("the answer is 72", "#### 72", 0.0),                                        # strict: no ####
    ("#### 2,050", "It sold 2,050 apples.\n#### 2,050", 1.0),                    # commas both sides
    ("#### $1,000.", "1000", 1.0),                                               # $, comma, trailing dot
    ("#### -7", "5 - 12 = -7\n#### -7", 1.0),                                    # negative
    ("#### 7", "#### -7", 0.0),                                                  # sign matters
    ("#### 2.5", "#### 2.5", 1.0),                                               # decimal
    ("#### 2.50", "#### 2.5", 1.0),                                              # numerically equal
    ("#### 2.4", "#### 2.5", 0.0),
    ("#### 3\nwait, no\n#### 72", "#### 72", 1.0),                               # last #### wins
])
def test_strict_scores(response, truth, expected):
    assert compute_score(response, truth) == expected


def test_flexible_takes_last_number_and_extraction():
    assert compute_score("24 in May, 72 in total.", "#### 72", method="flexible") == 1.0
    assert compute_score("72 in total, then 5", "#### 72", method="flexible") == 0.0
    assert compute_score("no digits here", "#### 72", method="flexible") == 0.0
    assert extract_answer("x #### -1,234.5.") == -1234.5
    assert extract_answer("x 12 then 13") is None
    assert extract_ground_truth("Tom ... 42 - 9 = 33 pencils left.\n#### 33") == 33.0
    assert extract_ground_truth("72") == 72.0
    with pytest.raises(ValueError, match="holds no number"):
        compute_score("#### 1", "no answer here")


def test_builtin_names_resolve_and_validate():
    strict, flexible = load_reward_fn("gsm8k"), load_reward_fn("gsm8k_flexible")
    assert strict("so 72", "#### 72") == 0.0 and flexible("so 72", "#### 72") == 1.0
    fn = ["model.actor.args.preset=tiny", "model.reward.type=function"]
    assert load_config(None, fn + ["model.reward.args.path=gsm8k"])
    with pytest.raises(ConfigError, match=r"model.reward.args.path='gsm8k_typo': expected 'module:function'"):
        load_config(None, fn + ["model.reward.args.path=gsm8k_typo"])


def _cfg():
    return load_config(None, [f"data.train_files={SAMPLE}", "data.prompt_key=question", "data.answer_key=answer",
                              "model.actor.args.preset=tiny", "model.reward.type=function",
                              "model.reward.args.path=gsm8k",
                              "data.rollout_batch_size=4", "algorithm.micro_batch_size=4"])


def test_sample_file_loads_with_question_key_and_scores_its_own_answers():
    rows = load_prompt_file(_cfg())
    lines = [json.loads(x) for x in SAMPLE.read_text().splitlines()]
    assert len(rows) == len(lines) == 10
    assert [p for p, _ in rows] == [r["question"] for r in lines]
    reward = load_reward_fn("gsm8k")
    for (_, truth), row in zip(rows, lines):
        final = row["answer"].split("####")[-1].strip()
        assert reward(f"reasoning...\n#### {final}", truth) == 1.0
        assert reward("reasoning...\n#### 99999", truth) == 0.0
        assert isinstance(truth, GroundTruth) and truth.extra == {"split": row["split"], "index": row["index"]}


def test_reward_fn_receives_extra_fields(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def with_extra(response, ground_truth, extra):\n"
        "    return float(extra['index']) if extra.get('split') == 'test' else -1.0\n"
        "def with_kwargs(response, ground_truth, **kwargs):\n"
        "    return float(len(kwargs['extra']))\n"
        "def plain(response, ground_truth):\n"
        "    return 0.5\n")
    rows = load_prompt_file(_cfg())
    with_extra = load_reward_fn("my_rewards:with_extra", str(tmp_path))
    with_kwargs = load_reward_fn("my_rewards:with_kwargs", str(tmp_path))
    plain = load_reward_fn("my_rewards:plain", str(tmp_path))
    assert [with_extra("r", t) for _, t in rows] == [-1.0] * 6 + [6.0, 7.0, 8.0, 9.0]
    assert with_kwargs("r", rows[0][1]) == 2.0
    assert plain("r", rows[0][1]) == 0.5
    # a bare string answer (toy tasks, old callers) gives an empty extra dict
    assert with_kwargs("r", "72") == 0.0
    # the answer keeps its extra fields through pickling (rows may cross process boundaries)
    import pickle

    again = pickle.loads(pickle.dumps(rows[7][1]))
    assert again == rows[7][1] and again.extra == {"split": "test", "index": 7}
