"""Gradient finalisation on CPU over gloo (issue #17): SP norms summed over TP, tied embeddings over PP.

Both tests go through ``TorchOptimizer.step()``, the CPU optimizer, with real megatron-core
``GPTModel``s and megatron's own process groups.

What cannot run here, and how the tests stand in for it:
- Sequence parallelism: megatron-core's SP collectives allocate their buffers with
  ``torch.cuda.current_device()`` and its only SP-capable norms come from Transformer Engine or
  apex, so a full SP forward cannot run on CPU. The model is a real TP=2 ``GPTModel`` built with
  ``sequence_parallel=True``; its norms are torch RMSNorms that tag their parameters
  ``sequence_parallel`` exactly as TENorm / FusedLayerNorm do (``gpt_factory._SPTaggedRMSNorm``, the
  one stand-in).
  Each TP rank then runs the model's own norm modules on ITS slice of a shared sequence, as SP
  does, and backpropagates: the partial gradients are real.
- Tied embeddings with PP=2: megatron's pipeline schedules need CUDA, and
  ``LanguageModule.setup_embeddings_and_output_layer`` moves the shared weight to CUDA when PP > 1.
  Each rank builds its stage of a real ``GPTModel`` (first: embedding; last: output layer) with
  megatron's real embedding group (``initialize_model_parallel(pp=2)``), declares the output
  weight tied (``share_embeddings_and_output_weights``, ``shared``) as megatron does after that
  setup, syncs the initial weights itself, and sets stage-specific gradients directly.
"""

import torch

from tests.dist_utils import run_distributed
from tests.runtime.gpt_factory import build_gpt


def _norms(model):
    return [model.decoder.layers[0].input_layernorm, model.decoder.layers[1].pre_mlp_layernorm,
            model.decoder.final_layernorm]


def _sp_backward(model, rank, tp):
    """Each norm runs on this TP rank's slice of one shared [S, B, H] sequence, as under SP."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(8, 2, 32, generator=g)
    weights = torch.randn(8, 2, 32, generator=g)
    part = slice(rank * 8 // tp, (rank + 1) * 8 // tp)
    loss = sum((norm(hidden[part]) * weights[part]).sum() for norm in _norms(model))
    loss.backward()


def _sequence_parallel_step(rank, world_size):
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from verl_bridge.runtime.optimizer import TorchOptimizer

    mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(1)
    model = build_gpt(tp=2, sequence_parallel=True)
    assert all(getattr(n.weight, "sequence_parallel", False) for n in _norms(model))
    # the full-sequence gradient a TP=1 run would compute, with the same norm modules
    _sp_backward(model, 0, 1)
    expected = [n.weight.grad.clone() for n in _norms(model)]
    model.zero_grad(set_to_none=True)

    _sp_backward(model, rank, 2)
    qkv = model.decoder.layers[0].self_attention.linear_qkv.weight  # TP-sharded: must not be reduced
    qkv.grad = torch.full_like(qkv, float(rank + 1))
    partial = [n.weight.grad.clone() for n in _norms(model)]
    opt = TorchOptimizer(model, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
    ok, norm = opt.step()
    assert ok
    got = [n.weight.grad for n in _norms(model)]
    for g, e, p in zip(got, expected, partial):
        assert not torch.allclose(p, e, atol=1e-4)  # one slice's gradient is not the full one...
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)  # ...the sum over TP is
    assert torch.equal(qkv.grad, torch.full_like(qkv, float(rank + 1)))
    # grad norm: the norms counted once (replicated), the sharded qkv once per shard
    sq = sum(float(e.double().pow(2).sum()) for e in expected) + float(qkv.numel()) * (1 + 4)
    assert abs(norm - sq ** 0.5) < 1e-4 * sq ** 0.5, (norm, sq ** 0.5)
    # the replicated norm weights took the same step on both TP ranks
    after = torch.cat([n.weight.detach().reshape(-1) for n in _norms(model)])
    both = [torch.empty_like(after) for _ in range(2)]
    dist.all_gather(both, after, group=mpu.get_tensor_model_parallel_group())
    assert torch.equal(both[0], both[1])
    return True


def test_sequence_parallel_norm_grads_are_summed_over_tp():
    assert run_distributed(_sequence_parallel_step, 2) == [True, True]


def _tied_embedding_step(rank, world_size):
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from verl_bridge.runtime.grads import tied_embedding_weight
    from verl_bridge.runtime.optimizer import TorchOptimizer

    mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
    first, last = rank == 0, rank == 1
    torch.manual_seed(2)
    stage = build_gpt(tp=1, pre_process=first, post_process=last, layers=2)
    # what setup_embeddings_and_output_layer does for a tied model with PP > 1 (it needs CUDA):
    # mark the last stage's output weight as the shared copy and start it equal to the embedding
    stage.share_embeddings_and_output_weights = True
    weight = tied_embedding_weight(stage)
    assert weight is (stage.embedding.word_embeddings.weight if first else stage.output_layer.weight)
    if last:
        weight.shared = True
        weight.shared_embedding = True
    group = mpu.get_embedding_group()
    assert sorted(dist.get_process_group_ranks(group)) == [0, 1]
    with torch.no_grad():
        dist.broadcast(weight, src=0, group=group)

    g = torch.Generator().manual_seed(10 + rank)
    grad = torch.randn(weight.shape, generator=g)  # stage-specific: input-side vs output-side gradient
    weight.grad = grad.clone()
    grads = [torch.empty_like(grad) for _ in range(2)]
    dist.all_gather(grads, grad)
    opt = TorchOptimizer(stage, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
    ok, norm = opt.step()
    assert ok
    torch.testing.assert_close(weight.grad, grads[0] + grads[1])
    # counted once in the global grad norm (megatron skips the `shared` copy)
    expected_norm = float((grads[0] + grads[1]).double().pow(2).sum()) ** 0.5
    assert abs(norm - expected_norm) < 1e-5 * expected_norm, (norm, expected_norm)
    # both copies took the same step
    copies = [torch.empty_like(weight) for _ in range(2)]
    dist.all_gather(copies, weight.detach().contiguous())
    assert torch.equal(copies[0], copies[1])
    return True


def test_tied_embedding_grads_are_summed_across_first_and_last_stage():
    assert run_distributed(_tied_embedding_step, 2) == [True, True]
