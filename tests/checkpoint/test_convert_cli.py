import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from tests.arch.tiny_hf import make_tiny_hf


def test_convert_cli_round_trip(tmp_path):
    from verl_bridge.commands.convert import convert

    make_tiny_hf("qwen2", tmp_path / "hf")
    runner = CliRunner()
    r = runner.invoke(convert, [str(tmp_path / "hf"), str(tmp_path / "meg"), "--to", "megatron", "--tp", "2", "--pp", "2"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "meg" / "iter_0000000" / "mp_rank_00_001" / "model_optim_rng.pt").is_file()
    r = runner.invoke(convert, [str(tmp_path / "meg"), str(tmp_path / "out"), "--to", "hf"])
    assert r.exit_code == 0, r.output
    a, b = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_convert_cli_errors_are_one_paragraph(tmp_path):
    from verl_bridge.commands.convert import convert

    make_tiny_hf("llama", tmp_path / "hf")  # 2 query groups: TP=4 cannot shard them
    r = CliRunner().invoke(convert, [str(tmp_path / "hf"), str(tmp_path / "meg"), "--to", "megatron", "--tp", "4"])
    assert r.exit_code == 1
    assert "TP=4 does not divide num_query_groups=2" in r.output and "Traceback" not in r.output
