"""JSONL and Parquet prompt files load; bad rows name the file and line."""

import pytest

from verl_bridge.config import load_config
from verl_bridge.data import PromptFileError, load_prompt_file


def _cfg(tmp_path, files):
    return load_config(None, [f"data.train_files={files}", "model.actor.args.preset=tiny",
                              "algorithm.name=grpo", "algorithm.group_size=2", "data.rollout_batch_size=4",
                              "algorithm.micro_batch_size=4"])


def test_jsonl_and_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": 4}\n')
    pq.write_table(pa.table({"prompt": ["3+3="], "answer": ["6"]}), tmp_path / "b.parquet")
    rows = load_prompt_file(_cfg(tmp_path, f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.parquet'}"))
    assert rows == [("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6")]


def test_bad_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "answer": "1"}\n{"question": "no prompt key"}\n')
    with pytest.raises(PromptFileError, match=r"bad.jsonl: line 2: missing 'prompt'"):
        load_prompt_file(_cfg(tmp_path, str(bad)))
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(PromptFileError, match=r"bad.jsonl:2: not valid JSON"):
        load_prompt_file(_cfg(tmp_path, str(bad)))
