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


def test_convert_is_quiet_megatron_and_torch_notices_fold_into_one_line(tmp_path):
    """A fresh ``verl-bridge convert`` process (megatron-core imported there for the first time) through a
    torch_dist checkpoint, both ways: megatron-core's no-TE/apex fallbacks and torch's DCP deprecations
    (load_state_dict, ShardedTensor), which megatron's torch_dist strategy triggers, fold into one
    [INFO] line on stderr instead of a page of ``warnings.warn(`` source lines."""
    import os
    import subprocess
    import sys

    make_tiny_hf("llama", tmp_path / "hf")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_BRIDGE_VERBOSE", "PYTHONWARNINGS")}
    env["OMP_NUM_THREADS"] = "1"
    cli = [sys.executable, "-m", "verl_bridge.cli", "convert"]
    for args in ([str(tmp_path / "hf"), str(tmp_path / "meg"), "--to", "megatron", "--format", "torch_dist"],
                 [str(tmp_path / "meg"), str(tmp_path / "out"), "--to", "hf"]):
        r = subprocess.run(cli + args, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "warnings.warn(" not in r.stderr and "Falling back to" not in r.stderr, r.stderr
        assert "deprecating ShardedTensor" not in r.stderr and "`load_state_dict` is deprecated" not in r.stderr
        assert r.stderr.count("[INFO] megatron-core ") == 1, r.stderr
    a, b = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
