"""Mixture-of-Experts conversion against transformers' own MoE classes (Mixtral, Qwen2-MoE with its
gated shared expert, Qwen3-MoE with q/k norms), tiny random configs, fp32, CPU:

* HF -> megatron -> HF is bit-exact (pure tensor maps, global and EP-local expert names);
* logits of the megatron-core model built from the converted weights match transformers at EP=1
  and at EP=2 (two gloo ranks, two experts each), and ``resolve_architecture`` names the map;
* the ``WeightExporter`` streams the EP=2 model as exactly the HF checkpoint's names and tensors,
  experts gathered over EP (per-tensor and bucketed streams);
* what the maps do not cover (DeepSeek-V3: MLA, sigmoid scores with expert bias, grouped top-k) is
  named, not converted.
"""

from __future__ import annotations

import pytest
import torch

from tests.arch.tiny_moe_hf import MOE_ARCHS, make_tiny_moe_hf
from tests.dist_utils import run_distributed

TOL_LOGITS = 1e-5


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_hf")
    models = {a: make_tiny_moe_hf(a, root / a) for a in MOE_ARCHS}
    return {a: str(root / a) for a in MOE_ARCHS}, models


def _hf_file(d):
    from verl_bridge.arch.hf import SafetensorsDir

    r = SafetensorsDir(d)
    return {k: r[k] for k in r}


def test_moe_roundtrip_bit_exact_and_expert_owners(moe_dirs):
    from verl_bridge.arch import hf_sources, hf_to_mcore, mcore_names, mcore_to_hf
    from verl_bridge.arch.convert import expert_global_name, expert_local_name, expert_owner
    from verl_bridge.arch.hf import SafetensorsDir, arch_of_hf, dims_from_hf, load_hf_config

    dirs, _ = moe_dirs
    for arch, d in dirs.items():
        hf = load_hf_config(d)
        spec = arch_of_hf(hf)
        assert spec.name == arch
        dims = dims_from_hf(hf, 128)
        reader = SafetensorsDir(d)
        names = mcore_names(spec, dims)
        assert sum("local_experts" in n for n in names) == 2 * 4 * 2  # layers x experts x (fc1, fc2)
        full = {n: hf_to_mcore(n, reader, spec, dims) for n in names}
        fc1 = full["decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"]
        gate_name, up_name = hf_sources("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight", spec)
        assert torch.equal(fc1, torch.cat([reader[gate_name], reader[up_name]]))  # gated fc1 = [gate; up]
        back = {}
        for n, t in full.items():
            back.update(mcore_to_hf(n, t, spec, dims))
        ref = {k: reader[k] for k in reader}
        assert set(back) == set(ref), (arch, set(back) ^ set(ref))
        assert all(torch.equal(back[k], ref[k]) for k in ref), arch
    # global expert e lives on EP rank e // (E/ep) as local expert e % (E/ep)
    assert [expert_owner(e, 8, 4) for e in range(8)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    g = "decoder.layers.0.mlp.experts.local_experts.5.linear_fc2.weight"
    rank, local = expert_local_name(g, 8, 2)
    assert (rank, local) == (1, "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight")
    assert expert_global_name(local, rank, 4) == g
    assert expert_local_name("decoder.layers.0.mlp.router.weight", 8, 2) == (None, "decoder.layers.0.mlp.router.weight")


def test_moe_maps_name_what_they_do_not_cover():
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformers import DeepseekV3Config

    from verl_bridge.arch import detect_architecture
    from verl_bridge.arch.hf import hf_to_mcore_config

    with pytest.raises(ValueError) as exc:
        detect_architecture(DeepseekV3Config(architectures=["DeepseekV3ForCausalLM"]))
    assert "DeepseekV3ForCausalLM is a Mixture-of-Experts model the conversion maps do not cover" in str(exc.value)
    assert "multi-latent attention (MLA)" in str(exc.value) and "grouped top-k" in str(exc.value)
    with pytest.raises(ValueError, match="DeepseekV3ForCausalLM is a Mixture-of-Experts model"):
        hf_to_mcore_config(DeepseekV3Config(architectures=["DeepseekV3ForCausalLM"]))

    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, normalization="RMSNorm", gated_linear_unit=True,
                add_bias_linear=False, num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=16)
    assert detect_architecture(TransformerConfig(**base)) == "mixtral"
    assert detect_architecture(TransformerConfig(**base, add_qkv_bias=True, moe_shared_expert_intermediate_size=32,
                                                 moe_shared_expert_gate=True)) == "qwen2_moe"
    assert detect_architecture(TransformerConfig(**base, qk_layernorm=True, moe_router_pre_softmax=True)) == "qwen3_moe"
    dsv3 = TransformerConfig(**base, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                             moe_router_num_groups=4, moe_router_group_topk=2, moe_shared_expert_intermediate_size=32)
    with pytest.raises(ValueError) as exc:
        detect_architecture(dsv3)
    msg = str(exc.value)
    for part in ("grouped top-k routing (moe_router_num_groups=4, moe_router_group_topk=2)",
                 "moe_router_score_function='sigmoid'", "router expert bias", "shared experts without a sigmoid gate",
                 "do not cover"):
        assert part in msg, (part, msg)
    dense = {k: v for k, v in base.items() if not k.startswith(("num_moe", "moe_"))}
    assert detect_architecture(TransformerConfig(**dense, ffn_hidden_size=64)) == "llama"  # dense maps stay dense


def _ep_worker(rank, world_size, dirs):
    """EP=1 (two data-parallel replicas holding all experts), then EP=2 (two experts per rank) on
    the same two gloo ranks: megatron's groups are torn down and built again in between."""
    from megatron.core import parallel_state as mpu

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.bridge.architecture import resolve_architecture
    from verl_bridge.compat.cpu_device import cpu_device_shims
    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.resharding import WeightExporter

    tokens = torch.randint(2, 100, (2, 10), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(10).unsqueeze(0).expand(2, -1)
    out = {}
    for ep in (1, 2):
        init_model_parallel(1, 1, ep_size=ep)
        for arch, d in dirs.items():
            model = hf_model_provider(d)(True, True).eval()
            n_fc1 = sum(1 for n, _ in model.named_parameters() if "local_experts" in n and n.endswith("fc1.weight"))
            with torch.no_grad(), cpu_device_shims():  # megatron's EP token gather allocates on CUDA
                logits = model(tokens, pos, None)[..., :100].clone()
            ex = WeightExporter(model)
            per_tensor = ex.export_state_dict()
            buckets = [(n, t.clone()) for b in WeightExporter(model, bucket_bytes=16 << 10).iter_buckets() for n, t in b]
            out[ep, arch] = dict(resolved=resolve_architecture(model), logits=logits, local_fc1=n_fc1,
                                 export=per_tensor, bucket_names=[n for n, _ in buckets], hf_names=ex.hf_names(),
                                 bucket_equal=all(torch.equal(t, per_tensor[n]) for n, t in buckets))
        if ep == 2:
            out["preset"] = _preset_checks(ep)
        mpu.destroy_model_parallel()
    return out, tokens


def _preset_checks(ep: int) -> dict:
    """The tiny-moe preset (a provider-built megatron MoE model) resolves to the Mixtral map; with an
    ungated shared expert the error names it."""
    from verl_bridge.bridge.architecture import resolve_architecture
    from verl_bridge.common.hooks import call_model_provider
    from verl_bridge.config import load_config
    from verl_bridge.models.tiny import tiny_model_provider

    cfg = load_config("templates/moe_grpo.yaml", ["trainer.output_dir=null", "model.actor.args.hidden_size=32"])
    a = cfg.model.actor.args
    out = {"tiny_moe": resolve_architecture(call_model_provider(tiny_model_provider(a, 16, 32, ep_size=ep)))}
    a.moe_shared_expert_intermediate_size = 16
    try:
        resolve_architecture(call_model_provider(tiny_model_provider(a, 16, 32, ep_size=ep)))
    except ValueError as e:
        out["ungated_shared"] = str(e)
    return out


def test_moe_logits_parity_and_export_ep1_ep2(moe_dirs):
    dirs, models = moe_dirs
    results = run_distributed(_ep_worker, 2, dirs)
    worst = {}
    for rank, (out, tokens) in enumerate(results):
        preset = out.pop("preset")
        assert preset["tiny_moe"] == "mixtral"
        assert "shared experts without a sigmoid gate" in preset["ungated_shared"], preset
        for (ep, arch), r in out.items():
            assert r["resolved"] == arch
            assert r["local_fc1"] == 2 * 4 // ep  # layers x this EP rank's experts
            with torch.no_grad():
                ref = models[arch](input_ids=tokens).logits
            diff = (r["logits"] - ref).abs().max().item()
            worst[ep, arch] = max(worst.get((ep, arch), 0.0), diff)
            assert diff <= TOL_LOGITS, (arch, ep, rank, diff)
            hf = _hf_file(dirs[arch])
            assert set(r["export"]) == set(hf) and r["hf_names"] == list(r["export"]), arch
            assert all(torch.equal(r["export"][k], hf[k]) for k in hf), (arch, ep, rank)
            assert r["bucket_names"] == r["hf_names"] and r["bucket_equal"], (arch, ep, rank)
    print("\nmax |logits - transformers|: " + ", ".join(f"EP={ep} {a} {d:.2e}" for (ep, a), d in sorted(worst.items())))
