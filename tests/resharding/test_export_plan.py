"""The exporter's TP=1 / PP=1 fast path (a plan of parameter views built once) against its general
path and the HF file, in one process: same buckets, same names, same tensors, and zero copies for
every HF tensor that is a slice of a megatron parameter."""

import pytest
import torch

from tests.arch.tiny_hf import ARCHS, make_tiny_hf

HF_VOCAB = 100
BUCKET = 12 << 10


@pytest.fixture(scope="module")
def parallel():
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    yield


def _stream(exporter):
    """[[(name, tensor clone, aliases a parameter)]] per bucket, and the stats."""
    params = {p.untyped_storage().data_ptr() for p in exporter.chunks[0].parameters()}
    out = [[(n, t.clone(), t.untyped_storage().data_ptr() in params) for n, t in b] for b in exporter.iter_buckets()]
    return out, exporter.stats


def _model(arch, tmp_path):
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.arch.hf import SafetensorsDir

    make_tiny_hf(arch, tmp_path)
    return hf_model_provider(tmp_path)(True, True), SafetensorsDir(str(tmp_path))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_fast_path_streams_what_the_general_path_streams(arch, dtype, tmp_path, parallel):
    from verl_bridge.resharding import WeightExporter

    model, ref = _model(arch, tmp_path)
    pos = "model.decoder.embed_positions.weight"  # OPT's two leading position rows: not in megatron
    kw = dict(vocab_size=HF_VOCAB, bucket_bytes=BUCKET, dtype=dtype, checksum=True,
              hf_extras={pos: ref[pos][:2]} if arch == "opt" else None)
    fast = WeightExporter(model, **kw)
    slow = WeightExporter(model, fast_path=False, **kw)
    got, st = _stream(fast)
    want, st_slow = _stream(slow)
    assert fast._plan is not None and slow._plan is None  # the fast path really ran
    assert [[n for n, *_ in b] for b in got] == [[n for n, *_ in b] for b in want]
    assert sorted(n for b in got for n, *_ in b) == sorted(ref.keys())
    for b_fast, b_slow in zip(got, want):
        for (name, t, _), (_, u, _) in zip(b_fast, b_slow):
            assert t.dtype == u.dtype == (dtype or torch.float32) and torch.equal(t, u), name
            assert torch.equal(t, ref[name].to(t.dtype)), name
    assert (st.buckets, st.tensors, st.bytes) == (st_slow.buckets, st_slow.tensors, st_slow.bytes)
    assert st.buckets > 3 and fast.checksums == slow.checksums
    aliased = {n for b in got for n, _, alias in b if alias}
    if dtype is None:  # every plain slice of a parameter is handed out as is
        plain = (("model.decoder.embed_tokens.weight", "model.decoder.layers.0.fc2.weight",
                  "model.decoder.layers.1.self_attn.out_proj.weight") if arch == "opt" else
                 ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight",
                  "model.layers.1.self_attn.o_proj.weight"))
        assert set(plain) <= aliased, set(plain) - aliased
        if arch != "opt":  # gate/up are the two halves of linear_fc1
            assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"} <= aliased
        # q/k/v of a model with 2 query groups are not contiguous in megatron's layout: copied
        assert not any("q_proj" in n or "k_proj" in n for n in aliased)
        assert 0 < st.peak_extra_bytes < st.bytes / 4
    else:  # a cast copies everything, within one bucket's worth of memory
        assert not aliased and 0 < st.peak_extra_bytes <= BUCKET


def test_plan_is_reused_across_in_place_updates_and_rebuilt_when_a_parameter_moves(tmp_path, parallel):
    from verl_bridge.resharding import WeightExporter

    model, ref = _model("qwen2", tmp_path)
    fast = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=BUCKET)
    slow = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=BUCKET, fast_path=False)
    _stream(fast)
    plan = fast._plan
    with torch.no_grad():  # an optimizer step updates parameters in place
        for p in model.parameters():
            p.mul_(1.5).add_(0.25)
    got, _ = _stream(fast)
    assert fast._plan is plan
    want, _ = _stream(slow)
    assert all(torch.equal(t, u) for b, c in zip(got, want) for (_, t, _), (_, u, _) in zip(b, c))
    assert not torch.equal(dict((n, t) for b in got for n, t, _ in b)["model.layers.0.self_attn.q_proj.weight"],
                           ref["model.layers.0.self_attn.q_proj.weight"])
    # a parameter given new storage (e.g. reloaded): the plan's views would be stale, so it is rebuilt
    w = model.decoder.layers[0].mlp.linear_fc2.weight
    w.data = w.data.clone().neg_()
    got, _ = _stream(fast)
    assert fast._plan is not plan
    down = dict((n, t) for b in got for n, t, _ in b)["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(down, w.detach())
    fast.reset()
    assert fast._plan is None


def test_assign_buckets_is_the_rule_the_planner_counts():
    from verl_bridge.planning.refit import count_buckets
    from verl_bridge.resharding.export import assign_buckets

    # a parameter whose full size could overflow starts a bucket; its pieces may straddle; a piece
    # larger than the cap is a bucket of its own
    assert assign_buckets([(3, [3]), (3, [3]), (3, [3])], 6) == [[(0, 0), (1, 0)], [(2, 0)]]
    assert assign_buckets([(2, [2]), (6, [2, 2, 2])], 6) == [[(0, 0)], [(1, 0), (1, 1), (1, 2)]]
    assert assign_buckets([(7, [7]), (1, [1])], 6) == [[(0, 0)], [(1, 0)]]
    assert count_buckets([("a", 7, [7]), ("b", 1, [1]), ("c", 1, [1])], 6) == 2


def test_a_strided_piece_is_copied_on_its_own(tmp_path, parallel, monkeypatch):
    """q/k/v normally split into one contiguous slice per query group; a layout that does not
    (forced here) takes the per-piece copy and still streams the same tensors."""
    from verl_bridge.resharding import WeightExporter, export

    model, ref = _model("qwen2", tmp_path)
    monkeypatch.setattr(export, "_pieces", lambda part: [part])
    fast = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=BUCKET)
    got, _ = _stream(fast)
    assert any(g.strided for b in fast._plan.buckets for g in b.staged)
    assert sorted(n for b in got for n, *_ in b) == sorted(ref.keys())
    assert all(torch.equal(t, ref[n]) for b in got for n, t, _ in b)


def test_mixed_source_dtypes_cast_in_one_bucket(tmp_path, parallel):
    """megatron keeps norm weights in fp32 beside bf16 weights; export to bf16 casts both kinds."""
    from verl_bridge.resharding import WeightExporter

    model, ref = _model("qwen2", tmp_path)
    model.to(torch.bfloat16)
    for layer in model.decoder.layers:  # the norms back in fp32, as megatron's mixed precision keeps them
        layer.input_layernorm.weight.data = layer.input_layernorm.weight.data.float()
    fast = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=1 << 30, dtype=torch.bfloat16)
    got, st = _stream(fast)
    assert st.buckets == 1 and len(fast._plan.buckets[0].staged[0].by_src_dtype) == 2  # bf16 weights and fp32 norms
    for n, t, _ in got[0]:
        assert t.dtype == torch.bfloat16 and torch.equal(t, ref[n].to(torch.bfloat16)), n
