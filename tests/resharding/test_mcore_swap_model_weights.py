"""megatron-core's own refit, ``megatron.core.resharding.swap_model_weights``, between GPTModels of
different TP layouts, on two gloo processes (megatron-core 0.16.1 in the main venv, 0.19.2 in
.ci/mcore_019_tier.sh).

A TP=2 model's weights go into a TP=1 model (data-parallel over both ranks) and from there into
a fresh TP=2 model; after each swap the receiving model computes the sender's logits. The
models are Llama-style (SwiGLU: ``linear_fc1`` holds gate and up halves per TP rank, so a plan
that ignored ``partition_stride`` would scramble them), and every receiver starts from other
weights, so a swap that moved nothing fails. Transport: verl_bridge.compat.refit's
CpuGlooCopyService (megatron's own "gloo" service needs CUDA streams).
"""

import pytest
import torch

from tests.dist_utils import run_distributed

SEQ = torch.randint(1, 64, (2, 10), generator=torch.Generator().manual_seed(0))


def _full_logits(model):
    """Logits over the whole vocabulary (the output layer is vocab-parallel at TP > 1)."""
    from verl_bridge.common.batch import model_inputs

    model.eval()
    with torch.no_grad():
        ids, pos, mask = model_inputs(SEQ, torch.ones_like(SEQ))
        local = model(ids, pos, mask).float()
    tp = model.pg_collection.tp
    if tp is None or tp.size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(tp.size())]
    torch.distributed.all_gather(parts, local.contiguous(), group=tp)
    return torch.cat(parts, dim=-1)


def _layout(tp):
    from megatron.core import parallel_state as mpu

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)


def _swap_worker(rank, world_size):
    import megatron.core

    from tests.runtime.gpt_factory import build_gpt
    from verl_bridge.compat.mcore_versions import mcore_version
    from verl_bridge.compat.refit import swap_model_weights_cpu
    from verl_bridge.distributed import seed_everything

    out = {"version": megatron.core.__version__, "parsed": mcore_version()}
    _layout(2)
    seed_everything(1)
    src = build_gpt(tp=2)
    out["src_fc1_shape"] = tuple(src.decoder.layers[0].mlp.linear_fc1.weight.shape)
    ref = _full_logits(src)
    seed_everything(3)
    back = build_gpt(tp=2)  # the TP=2 receiver of the second swap

    _layout(1)  # TP=1 over both ranks: data-parallel 2
    seed_everything(2)
    mid = build_gpt(tp=1)
    before = _full_logits(mid)
    swap_model_weights_cpu(src, mid)  # TP=2 -> TP=1
    after = _full_logits(mid)
    out["tp2_to_tp1_before"] = float((before - ref).abs().max())
    out["tp2_to_tp1_after"] = float((after - ref).abs().max())
    out["mid_fc1_shape"] = tuple(mid.decoder.layers[0].mlp.linear_fc1.weight.shape)

    swap_model_weights_cpu(mid, back)  # TP=1 -> TP=2
    _layout(2)
    back_logits = _full_logits(back)
    out["tp1_to_tp2_after"] = float((back_logits - ref).abs().max())
    out["ref_scale"] = float(ref.abs().max())
    return out


@pytest.fixture(scope="module")
def swapped():
    pytest.importorskip("megatron.core.resharding", reason="megatron.core.resharding exists from megatron-core 0.16")
    return run_distributed(_swap_worker, 2)


def test_tp2_to_tp1_swap_gives_the_senders_logits(swapped):
    for r in swapped:
        assert r["src_fc1_shape"] == (64, 32) and r["mid_fc1_shape"] == (128, 32)  # sharded vs full SwiGLU fc1
        assert r["tp2_to_tp1_before"] > 1e-3  # the receiver started from other weights
        assert r["tp2_to_tp1_after"] <= 1e-5 * max(1.0, r["ref_scale"]), r


def test_tp1_to_tp2_swap_gives_the_senders_logits(swapped):
    for r in swapped:
        assert r["tp1_to_tp2_after"] <= 1e-5 * max(1.0, r["ref_scale"]), r


def test_ran_on_the_installed_megatron_core(swapped):
    import megatron.core

    from verl_bridge.compat.mcore_versions import RESHARDING_SINCE

    assert {r["version"] for r in swapped} == {megatron.core.__version__}
    assert swapped[0]["parsed"] >= RESHARDING_SINCE
