"""Sync verification: an intact stream passes, a corrupted tensor is caught and named."""

from __future__ import annotations

import pytest
import torch

from tests.resharding.helpers import ARCHS
from tests.resharding.workers import CORRUPT_NOISE, CORRUPT_SUBTLE
from verl_bridge.rollout.verify import (
    SyncVerificationError,
    checksums_of_fused,
    compare_checksums,
    tensor_checksums,
    verify_sync,
)


def _verify_results(layout_results):
    for rank, out in enumerate(layout_results):
        for tp in (1, 2):
            for arch in ARCHS:
                yield f"rank {rank} TP={tp} {arch}", out[("verify", tp, arch)]


@pytest.mark.slow  # the shared 4-process run
def test_stream_loads_completely_into_transformers(layout_results):
    for where, r in _verify_results(layout_results):
        assert r["unexpected"] == [], where
        assert r["unfilled"] == [], f"{where}: parameters the stream never filled: {r['unfilled']}"


@pytest.mark.slow  # the shared 4-process run
def test_intact_stream_passes_the_probe(layout_results):
    for where, r in _verify_results(layout_results):
        report, err = r["intact"]
        assert err is None, (where, err)
        assert report.ok and report.checksums_compared and report.suspects == [], where
        assert report.tokens == 30 and report.max_abs_diff <= 1e-4, (where, report)


@pytest.mark.slow  # the shared 4-process run
def test_noised_tensor_is_caught_and_named(layout_results):
    for where, r in _verify_results(layout_results):
        report, err = r["noise"]
        assert err is not None, f"{where}: corrupted {CORRUPT_NOISE} was not caught"
        assert report.suspects == [CORRUPT_NOISE], (where, report.suspects)
        assert report.max_abs_diff > 1e-4, (where, report)
        for needle in (CORRUPT_NOISE, "rollout.verify_threshold", "rollout.verify_sync: false", "threshold",
                       f"max {report.max_abs_diff:.3g}", f"mean {report.mean_abs_diff:.3g}"):
            assert needle in err, (where, needle, err)
        # without checksums the log-probs alone still stop it, and the message says why no names
        report2, err2 = r["noise_no_checksums"]
        assert err2 is not None and report2.suspects == [] and not report2.checksums_compared, where
        assert "No per-parameter checksums" in err2 and CORRUPT_NOISE not in err2, (where, err2)


@pytest.mark.slow  # the shared 4-process run
def test_subtle_corruption_is_named_by_checksums(layout_results):
    for where, r in _verify_results(layout_results):
        report, err = r["subtle"]
        assert report.max_abs_diff <= report.threshold, (where, report)  # invisible in the log-probs
        assert err is not None and report.suspects == [CORRUPT_SUBTLE], (where, report)
        assert CORRUPT_SUBTLE in err and "probe passed" in err, (where, err)


@pytest.mark.slow  # the shared 4-process run
def test_native_engine_kv_path_matches_the_trainer_forward(layout_results):
    for where, r in _verify_results(layout_results):
        report = r["native"]
        assert report is not None and report.ok and report.tokens == 30, (where, report)


# ---- in-process unit checks ---------------------------------------------------------------

def test_verify_sync_threshold_mask_and_nan():
    a = torch.zeros(2, 4)
    b = a.clone()
    b[0, 3] = 0.5
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(SyncVerificationError) as info:
        verify_sync(a, b, mask, threshold=0.1)
    assert info.value.report.max_abs_diff == pytest.approx(0.5)
    assert info.value.report.mean_abs_diff == pytest.approx(0.5 / 8)
    mask[0, 3] = False  # the differing token is masked out
    assert verify_sync(a, b, mask, threshold=0.1).ok
    b[1, 0] = float("nan")
    with pytest.raises(SyncVerificationError):
        verify_sync(a, b, None, threshold=10.0)
    with pytest.raises(ValueError):
        verify_sync(a, b[:, :3], None, threshold=1.0)


def test_checksums_catch_scaling_permutation_and_missing_tensors():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 8, generator=g)
    base = tensor_checksums({"w": w, "b": torch.ones(3)})
    assert compare_checksums(base, tensor_checksums({"w": w.clone(), "b": torch.ones(3)})) == []
    assert compare_checksums(base, tensor_checksums({"w": w * 1.001, "b": torch.ones(3)})) == ["w"]
    assert compare_checksums(base, tensor_checksums({"w": w.flip(0), "b": torch.ones(3)})) == ["w"]
    assert compare_checksums(base, tensor_checksums({"w": w})) == ["b"]


def test_fused_receiver_checksums_match_the_separate_tensors():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(rows, 8, generator=g) for rows in (8, 4, 4))
    sender = tensor_checksums({"q": q, "k": k, "v": v})
    fused = torch.cat([q, k, v])
    assert checksums_of_fused(fused, [("q", 8), ("k", 4), ("v", 4)]) == sender
    fused[9] += 1.0  # a row of k corrupted on the receiver
    assert compare_checksums(sender, checksums_of_fused(fused, [("q", 8), ("k", 4), ("v", 4)])) == ["k"]
    with pytest.raises(ValueError):
        checksums_of_fused(fused, [("q", 8), ("k", 4)])


def test_checksums_are_computed_in_bounded_chunks(monkeypatch):
    import verl_bridge.rollout.verify as verify

    x = torch.randn(10_001, generator=torch.Generator().manual_seed(2))
    whole = tensor_checksums({"x": x})
    monkeypatch.setattr(verify, "_CHUNK", 1000)  # 11 chunks, the last one partial
    assert compare_checksums(whole, tensor_checksums({"x": x})) == []
    assert compare_checksums(whole, tensor_checksums({"x": x.roll(1)})) == ["x"]
