"""The exporter's coalesced general path (a plan built once: packed buffers, one broadcast per owning
stage, one all-gather per bucket) against the per-tensor general path and the HF file: the same
buckets, names and bits. In-process at TP=1 / PP=1; at TP=2, PP=2 and TP=2 x PP=2 inside the one
4-process gloo run the resharding tests share (tests/resharding/workers.py: about 10 s more there)."""

import pytest
import torch

from tests.arch.tiny_hf import make_tiny_hf
from tests.resharding.workers import LAYOUTS

HF_VOCAB = 100
SMALL = 12 << 10
ARCHS = ("llama", "qwen2", "opt")  # GQA q/k/v, QKV bias + tied embeddings, learned positions + biases
CAPS = (1, SMALL, 1 << 30)  # every piece alone (a parameter straddles buckets), a few per bucket, one bucket


def _stream(exporter):
    """[[(name, dtype, tensor clone)]] per bucket."""
    return [[(n, t.dtype, t.clone()) for n, t in b] for b in exporter.iter_buckets()]


def _compare(model, ref, arch, **kw):
    """Coalesced vs per-tensor general path vs the HF file; a list of what differs (empty = same)."""
    from verl_bridge.resharding import WeightExporter

    pos = "model.decoder.embed_positions.weight"
    kw = dict(vocab_size=HF_VOCAB, checksum=True, fast_path=False,
              hf_extras={pos: ref[pos][:2]} if arch == "opt" else None, **kw)
    new, old = WeightExporter(model, **kw), WeightExporter(model, coalesce=False, **kw)
    got, want = _stream(new), _stream(old)
    problems = []
    if new._cplan is None or old._cplan is not None:
        problems.append("the coalesced plan did not run (or ran with coalesce=False)")
    if [[n for n, *_ in b] for b in got] != [[n for n, *_ in b] for b in want]:
        problems.append("buckets differ")
    dt = kw.get("dtype")
    for name, dtype, t in (x for b in got for x in b):
        if dt is not None and dtype != dt:
            problems.append(f"{name}: dtype {dtype}")
        if not torch.equal(t, ref[name].to(t.dtype)):
            problems.append(f"{name}: differs from the HF file")
    for bg, bw in zip(got, want):
        problems += [f"{n}: differs from the per-tensor path" for (n, d, t), (_, e, u) in zip(bg, bw)
                     if d != e or not torch.equal(t, u)]
    if sorted(n for b in got for n, *_ in b) != sorted(ref.keys()):
        problems.append("names differ from the HF file")
    s, o = new.stats, old.stats
    if (s.buckets, s.tensors, s.bytes) != (o.buckets, o.tensors, o.bytes) or new.checksums != old.checksums:
        problems.append(f"stats or checksums differ: {s} vs {o}")
    plan = new._cplan
    again = _stream(new)  # a second sync reuses the plan and streams the same bits
    if new._cplan is not plan or any(not torch.equal(t, u) for a, b in zip(again, got)
                                      for (_, _, t), (_, _, u) in zip(a, b)):
        problems.append("second sync differs or rebuilt the plan")
    return problems, s, plan


def _buffer_views(plan, got_names_tensors):
    """How many yielded tensors are views of the gather buffer (no copy)."""
    ptrs = {t.untyped_storage().data_ptr() for t in plan.gbuf.values()}
    return sum(1 for t in got_names_tensors if t.untyped_storage().data_ptr() in ptrs)


@pytest.fixture(scope="module")
def parallel():
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    yield


@pytest.mark.parametrize("arch", ARCHS)
def test_tp1_coalesced_equals_per_tensor_path(arch, tmp_path, parallel):
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.arch.hf import SafetensorsDir
    from verl_bridge.resharding import WeightExporter

    make_tiny_hf(arch, tmp_path)
    model, ref = hf_model_provider(tmp_path)(True, True), SafetensorsDir(str(tmp_path))
    for cap in CAPS:
        for dtype in (None, torch.bfloat16):
            problems, st, plan = _compare(model, ref, arch, bucket_bytes=cap, dtype=dtype)
            assert problems == [], (cap, dtype, problems[:5])
            assert st.buckets > (3 if cap < (1 << 30) else 0) and st.peak_extra_bytes > 0
    # at TP=1 the HF tensors that are slices of a parameter are views of the received buffer
    ex = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=SMALL, fast_path=False)
    views = sum(_buffer_views(ex._cplan, [t for _, t in b]) for b in ex.iter_buckets())
    assert views >= len(ex.hf_names()) // 2, views
    # an optimizer step updates the parameters in place: the plan is kept and sees the new values
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5).add_(0.25)
    plan = ex._cplan
    old = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=SMALL, fast_path=False, coalesce=False)
    got = [(n, t.clone()) for b in ex.iter_buckets() for n, t in b]
    want = [(n, t.clone()) for b in old.iter_buckets() for n, t in b]
    assert ex._cplan is plan and [n for n, _ in got] == [n for n, _ in want]
    assert all(torch.equal(t, u) for (_, t), (_, u) in zip(got, want))
    ex.reset()
    assert ex._cplan is None


def test_tp1_mixed_source_dtypes_use_one_buffer_per_dtype(tmp_path, parallel):
    """bf16 weights beside fp32 norms (megatron's mixed precision) with no export dtype: two buffers."""
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.arch.hf import SafetensorsDir

    make_tiny_hf("qwen2", tmp_path)
    model, ref = hf_model_provider(tmp_path)(True, True), SafetensorsDir(str(tmp_path))
    model.to(torch.bfloat16)
    for layer in model.decoder.layers:
        layer.input_layernorm.weight.data = layer.input_layernorm.weight.data.float()
    ref = {n: ref[n].to(torch.bfloat16).to(torch.float32 if "input_layernorm" in n else torch.bfloat16)
           for n in ref.keys()}
    problems, _, plan = _compare(model, ref, "qwen2", bucket_bytes=SMALL)
    assert problems == [] and set(plan.gbuf) == {torch.bfloat16, torch.float32}, problems[:5]


@pytest.mark.slow  # rides on the 4-process run tests/resharding/test_export.py shares (tests/resharding/workers.py)
def test_tp2_pp2_coalesced_stream_is_bit_identical(layout_results):
    for rank, out in enumerate(layout_results):
        coalesced = out["coalesced"]
        assert {k[:3] for k in coalesced} == {(tp, pp, a) for tp, pp in LAYOUTS if (tp, pp) != (1, 1) for a in ARCHS}, rank
        for key, r in coalesced.items():
            assert r["problems"] == [], (rank, key, r["problems"])
    for (tp, pp, arch, cap, dtype), r in layout_results[0]["coalesced"].items():
        where = (tp, pp, arch, cap, dtype)
        if pp > 1:  # one broadcast per owning stage and unit: one bucket -> both stages, once each
            assert r["bcasts"] >= r["units"], where
            if cap == 1 << 30:
                assert r["units"] == 1 and r["bcasts"] == 2, where
        else:
            assert r["bcasts"] == 0, where
        if tp > 1:  # one all-gather per unit and dtype
            assert r["units"] <= r["gathers"] <= 2 * r["units"], where
            if cap == 1 << 30:
                assert r["gathers"] == 1, where
        else:
            assert r["gathers"] == 0, where
        if cap == 1:  # every HF tensor its own bucket; fused q/k/v and gate/up span a unit of buckets
            assert r["buckets"] > r["units"], where
