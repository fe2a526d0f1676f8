"""Memory and refit planning: the seed article's layout checked against arithmetic written out by hand."""

import math
from pathlib import Path

from verl_bridge.config import load_config
from verl_bridge.planning.memory import GiB, plan_memory, stage_params_per_rank, total_params
from verl_bridge.planning.refit import coalesced_peak_bytes, count_buckets, plan_refit
from verl_bridge.planning.shapes import BUILTIN_SHAPES, resolve_shape, stream_entries

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "templates" / "megatron_ppo.yaml"


def _seed_cfg(*overrides):
    return load_config(TEMPLATE, list(overrides), world_size=4, check_paths=False)


# ---- OPT-1.3B by hand: 24 layers, hidden 2048, 32 heads, ffn 8192, vocab 50272, max pos 2048, biases
# everywhere, LayerNorm (weight + bias), learned positions, tied embeddings.
H, L, FFN, V, POS = 2048, 24, 8192, 50272, 2048
LAYER_FULL = (H * 3 * H + 3 * H) + (H * H + H) + (H * FFN + FFN) + (FFN * H + H) + 2 * (2 * H)
# HF's position table has 2 extra rows (OPT's offset): 1,315,758,080, the count transformers reports
TOTAL = V * H + (POS + 2) * H + L * LAYER_FULL + 2 * H
# TP=2: linear weights and column-parallel biases (qkv, fc1) halve; o_proj/fc2 biases, LayerNorms and the
# position table are replicated; the vocabulary is padded to a multiple of 128 * 2 = 256 -> 50432 rows.
V_PAD = 50432
LAYER_TP2 = ((H * 3 * H // 2 + 3 * H // 2) + (H * H // 2 + H) + (H * FFN // 2 + FFN // 2) + (FFN * H // 2 + H)
             + 2 * 2 * H)
STAGE0 = V_PAD // 2 * H + POS * H + 12 * LAYER_TP2  # embeddings + 12 layers
STAGE1 = 12 * LAYER_TP2 + 2 * H + V_PAD // 2 * H  # 12 layers + final LayerNorm + tied output copy (PP > 1)
SEQ = 256 + 256
KV = 2 * (24 // 2) * (32 // 2) * (2048 // 32) * 2 * (32 * 1 // 1) * SEQ  # 2*L/PP*kv/TP*hd*bf16*samples/DP*seq


def test_hand_arithmetic_constants():
    assert TOTAL == 1_315_758_080 and V_PAD % 256 == 0 and V_PAD - 256 < V <= V_PAD
    assert (STAGE0, STAGE1) == (358_060_032, 353_869_824)
    assert KV == 805_306_368


def test_seed_layout_parameters_kv_cache_and_optimizer_state():
    cfg = _seed_cfg()
    shape, source = resolve_shape(cfg)
    assert shape == BUILTIN_SHAPES["opt-1.3b"] and "opt-1.3b" in source
    assert total_params(shape) == TOTAL
    assert stage_params_per_rank(shape, 2, 2, 0) == STAGE0
    assert stage_params_per_rank(shape, 2, 2, 1) == STAGE1
    plan = plan_memory(cfg, 4, shape, source, 80 * GiB, "given")
    first, last = plan.ranks
    assert (first.stage, last.stage) == (0, 1)
    # bf16 params (2 B) + fp32 grads (4 B) + Adam m, v and fp32 master (12 B) over DP=1
    assert first.roles["actor"] == {"params": STAGE0 * 2, "grads": STAGE0 * 4, "optimizer": STAGE0 * 12}
    assert last.roles["actor"]["params"] == STAGE1 * 2
    assert first.roles["reference"] == {"params": STAGE0 * 2}
    # the template's Hugging Face critic: full HF model + value head (h + 1), replicated, optimizer not sharded
    critic = TOTAL + H + 1
    assert sum(first.roles["critic"].values()) == critic * (2 + 4 + 12)
    assert first.kv_cache == last.kv_cache == KV
    # activations: Korthikanti with SP and flash attention, s*b*h*34/t per layer; 1F1B: stage 0 holds 2
    # micro-batches in flight, the last stage 1 plus its fp32 logits s*b*V/t*4
    per_layer = SEQ * 4 * H * 34 / 2
    assert math.isclose(first.activations, 12 * per_layer * 2)
    assert math.isclose(last.activations, 12 * per_layer + SEQ * 4 * V_PAD / 2 * 4)
    # the generation replica (2 rollout workers = TP groups): the whole model at TP=2 in bf16, on every rank,
    # kept between rollouts: both stages minus the last stage's copy of the tied embedding
    replica = STAGE0 + STAGE1 - V_PAD // 2 * H
    assert replica == 660_287_488 == stage_params_per_rank(shape, 2, 1, 0)
    assert first.roles["replica"] == last.roles["replica"] == {"params": replica * 2}
    assert first.replica == "kept" and first.rollout_weights == 0
    static0 = STAGE0 * 18 + STAGE0 * 2 + critic * 18 + replica * 2
    assert math.isclose(first.peak, static0 + max(KV, 12 * per_layer * 2))
    assert any("2 generation replica(s)" in n and "extra 1.23 GiB/rank" in n and "kept between rollouts" in n
               for n in plan.notes), plan.notes
    assert plan.warnings == [] and first.peak < 80 * GiB
    # the distributed optimizer divides the optimizer state by DP (here 8 GPUs -> DP 2)
    cfg8 = load_config(TEMPLATE, ["trainer.args.dp_size=2", "data.num_rollout_workers=4"], world_size=8, check_paths=False)
    r8 = plan_memory(cfg8, 8, shape, source).ranks[0]
    assert r8.roles["actor"]["optimizer"] == STAGE0 * 12 / 2
    assert r8.kv_cache == KV // 2  # 32 samples over 2 DP ranks


def test_refit_bytes_buckets_and_peak():
    shape = BUILTIN_SHAPES["opt-1.3b"]
    plan = plan_refit(shape, "bf16", 256, bandwidth_gbps=400, tp=2)
    # HF tensors in bf16 (unpadded vocabulary, tied output layer sent once)
    assert plan.bytes_per_sync == TOTAL * 2
    bucket = 256 * 1024 ** 2
    assert plan.buckets >= math.ceil(TOTAL * 2 / bucket) == 10
    # the largest gathered tensor: the TP-padded embedding (50432 rows at TP=2), smaller than a bucket
    assert plan.largest_tensor == "embedding" and plan.largest_tensor_bytes == V_PAD * H * 2
    # at TP=2 the coalesced exporter holds a gather buffer and an output buffer (about a bucket each);
    # its fast path (TP=1 / PP=1) holds one bucket plus the tensor in flight
    assert bucket * 2 - V_PAD * H * 2 <= plan.peak_extra_bytes <= 2 * bucket + V_PAD * H * 2
    assert plan.peak_extra_bytes == coalesced_peak_bytes(
        [(n, f * 2, [p * 2 for p in ps]) for n, f, ps in stream_entries(shape, 2)], bucket, 2)
    tp1 = plan_refit(shape, "bf16", 256, tp=1)
    assert tp1.peak_extra_bytes == bucket + tp1.largest_tensor_bytes
    assert plan_refit(shape, "bf16", 256, tp=1, pp=2).peak_extra_bytes == coalesced_peak_bytes(
        [(n, f * 2, [p * 2 for p in ps]) for n, f, ps in stream_entries(shape, 1)], bucket, 1)
    assert math.isclose(plan.seconds, TOTAL * 2 / (400e9 / 8))
    # packing rule: (name, full bytes, [piece bytes]); flush before a tensor whose full size overflows,
    # and before a piece that overflows
    assert count_buckets([("a", 3, [3]), ("b", 3, [3]), ("c", 3, [3])], 6) == 2
    assert count_buckets([("a", 7, [7]), ("b", 1, [1]), ("c", 1, [1])], 6) == 2
    assert count_buckets([("a", 2, [2]), ("qkv", 6, [2, 2, 2])], 6) == 2 and count_buckets([], 6) == 0


def test_remedies_carry_numbers():
    cfg = _seed_cfg("data.rollout_batch_size=4096")
    shape, source = resolve_shape(cfg)
    plan = plan_memory(cfg, 4, shape, source, 80 * GiB, "given")
    text = "\n".join(plan.warnings)
    assert "exceeds the device memory 80.00 GiB" in text
    # KV cache per sample is KV / 32; samples that fit next to each stage's static memory, by hand
    critic = (TOTAL + H + 1) * 18
    replica = (STAGE0 + STAGE1 - V_PAD // 2 * H) * 2  # the generation replica, kept between rollouts
    static = [STAGE0 * 18 + STAGE0 * 2 + critic + replica, STAGE1 * 18 + STAGE1 * 2 + critic + replica]
    fit = min((80 * GiB - s) // (KV // 32) for s in static)
    assert fit == 2135
    assert f"at most {fit} samples per TPxPP group fit (now 4096); use data.rollout_batch_size <= {fit}" in text
    assert f"model.reference.args.offload: true saves {STAGE0 * 2 / GiB:.2f} GiB" in text
    assert "sequence length: max_prompt_length + max_response_length <= " in text
    # sequence parallelism is already on in the seed layout: no SP remedy; off, it is offered with its saving
    assert "sequence_parallel: true saves" not in text
    off = plan_memory(_seed_cfg("data.rollout_batch_size=4096", "trainer.args.sequence_parallel=false"), 4, shape,
                      source, 80 * GiB, "given")
    saving = 12 * 2 * SEQ * 4 * H * ((10 + 24 / 2) - 34 / 2)  # stage 0, 2 in flight: no-SP minus SP
    assert f"sequence_parallel: true saves {saving / GiB:.2f} GiB" in "\n".join(off.warnings)


def test_shape_sources(tmp_path):
    from tests.arch.tiny_hf import ARCHS, make_config
    from transformers import AutoModelForCausalLM

    from verl_bridge.planning.shapes import shape_from_hf_config

    for arch in ARCHS:  # the config.json reader counts exactly what transformers builds
        hf = make_config(arch)
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf).parameters())
        assert total_params(shape_from_hf_config(hf.to_dict(), arch)) == n, arch
    make_config("qwen2").save_pretrained(str(tmp_path / "q"))
    cfg = load_config(None, ["model.actor.args.preset=null", f"model.actor.args.model_name_or_path={tmp_path / 'q'}"],
                      check_paths=False)
    shape, source = resolve_shape(cfg)
    assert shape.qkv_bias and shape.num_query_groups == 2 and source.endswith("config.json")
    shape, source = resolve_shape(load_config(None, ["model.actor.args.preset=tiny"]))
    assert shape.name == "tiny" and shape.vocab_size == 16 and "tiny" in source
    assert resolve_shape(cfg, "llama-2-7b")[0].num_layers == 32


def test_generation_replica_memory_per_engine():
    """PP=1: the training actor is the replica (nothing extra). vLLM: its weights (whole model at
    rollout.tp_size) count in the rollout phase only, freed between rollouts."""
    shape = BUILTIN_SHAPES["opt-1.3b"]
    pp1 = load_config(TEMPLATE, ["trainer.args.pp_size=1", "trainer.args.dp_size=2", "data.num_rollout_workers=null"],
                      world_size=4, check_paths=False)
    plan = plan_memory(pp1, 4, shape, "given")
    assert all("replica" not in r.roles and r.rollout_weights == 0 for r in plan.ranks)
    assert any("the training actor is the replica (PP=1): no extra memory" in n for n in plan.notes)
    vllm = load_config(TEMPLATE, ["rollout.engine=vllm", "rollout.tp_size=1", "data.num_rollout_workers=4"],
                       world_size=4, check_paths=False)
    plan = plan_memory(vllm, 4, shape, "given")
    whole = stage_params_per_rank(shape, 1, 1, 0) * 2  # bf16, vLLM TP=1
    for r in plan.ranks:
        assert "replica" not in r.roles and r.rollout_weights == whole and r.replica == "freed"
        assert math.isclose(r.peak, r.static + max(r.kv_cache + whole, r.activations))
    assert any("4 generation replica(s)" in n and "freed between rollouts" in n for n in plan.notes), plan.notes


# ---- Mixture-of-Experts: Mixtral-8x7B by hand (32 layers, hidden 4096, 32 heads / 8 KV heads, 8 SwiGLU experts
# of 14336, top-2, vocab 32000, untied): 46,702,792,704 parameters, the count Mistral AI publishes.
MX_ATTN = 4096 * (4096 + 2 * 1024) + 4096 * 4096
MX_EXPERT = 3 * 4096 * 14336
MX_LAYER = MX_ATTN + 8 * MX_EXPERT + 8 * 4096 + 2 * 4096  # attention, experts, router, two RMSNorms
MX_TOTAL = 32 * MX_LAYER + 2 * 32000 * 4096 + 4096
# TP=2 x EP=4: attention and each expert halve over TP, 8 / 4 = 2 experts per rank; router and norms replicated
MX_RANK = 32 * (MX_ATTN // 2 + 2 * MX_EXPERT // 2 + 8 * 4096 + 2 * 4096) + 2 * 32000 // 2 * 4096 + 4096


def test_moe_expert_memory_per_rank():
    from verl_bridge.planning.memory import expert_params_per_rank
    from verl_bridge.planning.shapes import shape_from_hf_config

    s = BUILTIN_SHAPES["mixtral-8x7b"]
    assert MX_TOTAL == 46_702_792_704 == total_params(s)
    assert stage_params_per_rank(s, 1, 1, 0) == MX_TOTAL
    assert stage_params_per_rank(s, 2, 1, 0, ep=4) == MX_RANK == 6_440_620_032
    assert expert_params_per_rank(s, 2, 4) == 2 * MX_EXPERT // 2
    assert total_params(BUILTIN_SHAPES["qwen3-30b-a3b"]) == 30_532_122_624
    hf = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
          "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
          "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False}
    assert total_params(shape_from_hf_config(hf, "mixtral-8x7b")) == MX_TOTAL
    cfg = load_config(REPO / "templates" / "moe_grpo.yaml", ["trainer.args.tp_size=2", "trainer.args.ep_size=4",
                                                             "algorithm.micro_batch_size=8"],
                      world_size=8, check_paths=False)
    plan = plan_memory(cfg, 8, s, "built-in", 80 * GiB, "given")
    actor = plan.ranks[0].roles["actor"]
    assert actor["grads"] == MX_RANK * 4  # fp32 gradients of this rank's parameters
    assert any("8 per layer (top-2), 2 on each rank (EP=4)" in n for n in plan.notes), plan.notes
