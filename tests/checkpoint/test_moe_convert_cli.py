"""``verl-bridge convert`` both ways for the Mixture-of-Experts architectures (Mixtral, Qwen2-MoE,
Qwen3-MoE): HF -> Megatron legacy at TP=2 x PP=2 x EP=2 (Megatron-LM's ``mp_rank_TT_PPP_EEE``
directories, each EP rank holding its own experts under local indices) -> HF is bit-exact, and
so is HF -> torch_dist -> HF (experts by global index)."""

import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from tests.arch.tiny_moe_hf import MOE_ARCHS, make_tiny_moe_hf


def _same(a_dir, b_dir) -> bool:
    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_moe_convert_cli_round_trip_ep2(tmp_path):
    from verl_bridge.checkpoint.safe_load import safe_load
    from verl_bridge.commands.convert import convert

    runner = CliRunner()
    for arch in MOE_ARCHS:
        hf, meg, out = tmp_path / arch, tmp_path / f"{arch}-meg", tmp_path / f"{arch}-out"
        make_tiny_moe_hf(arch, hf)
        r = runner.invoke(convert, [str(hf), str(meg), "--to", "megatron", "--tp", "2", "--pp", "2", "--ep", "2"])
        assert r.exit_code == 0, r.output
        assert "EP=2" in r.output
        it = meg / "iter_0000000"
        assert sorted(p.name for p in it.iterdir() if p.is_dir()) == [f"mp_rank_{t:02d}_{p:03d}_{e:03d}"
                                                        for t in range(2) for p in range(2) for e in range(2)]
        state = safe_load(it / "mp_rank_01_000_001" / "model_optim_rng.pt")
        experts = sorted({n.split("local_experts.")[1].split(".")[0] for n in state["model"] if "local_experts" in n})
        assert experts == ["0", "1"] and state["args"].expert_model_parallel_size == 2
        assert state["args"].num_experts == 4
        # TP shard of expert fc1 (gated: [gate_i; up_i]) of this EP rank's local expert 1 = global expert 3
        assert tuple(state["model"]["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"].shape)[0] \
            == (16 if arch != "mixtral" else 48)
        r = runner.invoke(convert, [str(meg), str(out), "--to", "hf"])
        assert r.exit_code == 0, r.output
        assert _same(hf, out), arch
    # torch_dist (experts stored by global index) both ways, for one architecture
    arch = "qwen2_moe"
    r = runner.invoke(convert, [str(tmp_path / arch), str(tmp_path / "td"), "--to", "megatron", "--format", "torch_dist"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(convert, [str(tmp_path / "td"), str(tmp_path / "td-out"), "--to", "hf"])
    assert r.exit_code == 0, r.output
    assert _same(tmp_path / arch, tmp_path / "td-out")


def test_moe_convert_cli_refusals(tmp_path):
    from verl_bridge.commands.convert import convert

    make_tiny_moe_hf("mixtral", tmp_path / "hf")
    r = CliRunner().invoke(convert, [str(tmp_path / "hf"), str(tmp_path / "meg"), "--to", "megatron", "--ep", "3"])
    assert r.exit_code == 1 and "EP=3 does not divide num_experts=4" in r.output and "Traceback" not in r.output
