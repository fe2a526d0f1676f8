"""`verl-bridge convert` refuses unreadable or inconsistent input with one exit-2 paragraph and writes nothing."""

import json
import shutil

import pytest
from click.testing import CliRunner

from tests.arch.tiny_hf import make_tiny_hf


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "hf"
    make_tiny_hf("llama", d)
    return d


def _truncate(d):
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garble(d):
    p = d / "model.safetensors"
    p.write_bytes(b"\x00\xff" * 64 + p.read_bytes()[128:])


def _not_json(d):
    (d / "config.json").write_text('{"model_type": "llama", "hidden_size": 32,,,')


def _wrong_hidden(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = 64  # the weights are 32 wide
    (d / "config.json").write_text(json.dumps(cfg))


def _wrong_intermediate(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 48  # the weights say 64
    (d / "config.json").write_text(json.dumps(cfg))


CASES = {
    "truncated safetensors": (_truncate, "truncated"),
    "garbled safetensors": (_garble, "safetensors"),
    "config.json not JSON": (_not_json, "is not valid JSON"),
    "hidden_size disagrees": (_wrong_hidden, "do not match"),
    "intermediate_size disagrees": (_wrong_intermediate, "do not match"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fmt", ["legacy", "torch_dist"])
def test_bad_hf_input_is_refused_and_nothing_written(case, fmt, hf_dir, tmp_path):
    from verl_bridge.commands.convert import convert

    src = tmp_path / "hf"
    shutil.copytree(hf_dir, src)
    damage, words = CASES[case]
    damage(src)
    out = tmp_path / "meg"
    r = CliRunner().invoke(convert, [str(src), str(out), "--to", "megatron", "--format", fmt])
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output, r.output
    assert "Nothing was written" in r.output
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


def test_hidden_size_message_names_the_key_and_both_shapes(hf_dir, tmp_path):
    from verl_bridge.commands.convert import convert

    src = tmp_path / "hf"
    shutil.copytree(hf_dir, src)
    _wrong_hidden(src)
    r = CliRunner().invoke(convert, [str(src), str(tmp_path / "meg"), "--to", "megatron"])
    assert r.exit_code == 2 and "hidden_size=64" in r.output and str(src / "config.json") in r.output, r.output
