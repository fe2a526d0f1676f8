"""Hugging Face <-> Megatron checkpoint directories, offline (what ``verl-bridge convert`` runs).

Import (HF safetensors dir -> Megatron save dir, iteration 0):

* legacy: pure tensor sharding in one process, no process group: for every (TP, PP) rank the
  HF tensors are converted (:func:`verl_bridge.arch.hf_to_mcore`), sharded
  (:func:`~verl_bridge.arch.shard_for_tp`, PP stage = even layer split with local indices) and
  written as ``mp_rank_XX[_YYY]/model_optim_rng.pt`` with ``model``, ``args``,
  ``checkpoint_version``, ``iteration`` (no optimizer / RNG: load with Megatron-LM's
  ``--no-load-optim --no-load-rng`` or ``--finetune``).
* torch_dist: the layout is parallelism-agnostic (global tensors + shard metadata), so the
  full model is built once at TP=1/PP=1 and saved through megatron.core.dist_checkpointing; the
  requested TP sets the vocabulary padding and ``args``. dist_checkpointing needs a process
  group, so a private world of one (gloo over a FileStore in a temp dir: no network, no
  torchrun) is created for the duration of the call when none exists.

Both carry a ``verl_bridge`` entry (``arch``, the original ``hf_config``, the HF ``vocab_size``
and ``hf_extras`` -- HF data megatron has no place for, e.g. OPT's 2 leading position rows), so
that export reproduces the HF tensors bit for bit. Export also works for plain Megatron-LM
checkpoints (config.json then synthesised from ``args``).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from verl_bridge.arch import get_arch, hf_to_mcore, mcore_names, mcore_to_hf, merge_tp, shard_for_tp
from verl_bridge.arch.convert import (
    ModelDims,
    expert_index,
    expert_local_name,
    padded_vocab_size,
    pp_layer_range,
    stage_names,
    to_global_name,
)
from verl_bridge.arch.hf import (
    SafetensorsDir,
    check_layer_count,
    dims_from_hf,
    load_hf_config,
    raw_layer_count,
    save_safetensors_dir,
)
from verl_bridge.checkpoint.layout import LEGACY_FILE, iter_dir, rank_dir_name
from verl_bridge.checkpoint.megatron import (
    CHECKPOINT_VERSION,
    begin,
    is_disk_full,
    latest_valid_iteration,
    publish,
    tensor_bytes,
    validate_iteration,
)
from verl_bridge.checkpoint.safe_load import CheckpointError, safe_load
from verl_bridge.checkpoint.torch_dist import is_torch_dist_dir


# Megatron-LM's MoE args (``num_experts`` is TransformerConfig's ``num_moe_experts``)
MOE_ARG_KEYS = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
                "moe_router_pre_softmax", "moe_router_score_function", "moe_aux_loss_coeff",
                "moe_router_load_balancing_type", "moe_token_dispatcher_type", "moe_grouped_gemm")


def moe_args(tf: dict, ep: int = 1) -> dict:
    """Megatron-LM args of the MoE fields in TransformerConfig kwargs (``num_experts`` None: dense)."""
    if tf.get("num_moe_experts") is None:
        return {"num_experts": None}
    return {"num_experts": tf["num_moe_experts"], "expert_model_parallel_size": ep,
            **{k: tf[k] for k in MOE_ARG_KEYS if k in tf}}


def mcore_moe_kwargs(args) -> dict:
    """TransformerConfig MoE kwargs from Megatron-LM args (empty for a dense model)."""
    if getattr(args, "num_experts", None) is None:
        return {}
    return {"num_moe_experts": args.num_experts, "moe_grouped_gemm": False,
            **{k: getattr(args, k) for k in MOE_ARG_KEYS if getattr(args, k, None) is not None and k != "moe_grouped_gemm"}}


def make_args(hf, arch: str, tp: int, pp: int, padded: int, ep: int = 1) -> argparse.Namespace:
    """Megatron-LM-style ``args`` for an HF model (the fields Megatron-LM's checks read; MoE fields
    under Megatron-LM's names, ``expert_model_parallel_size`` = ``ep``)."""
    spec = get_arch(arch)
    tf, gpt = spec.mcore_config(hf)
    return argparse.Namespace(
        **moe_args(tf, ep), qk_layernorm=bool(tf.get("qk_layernorm", False)),
        num_layers=tf["num_layers"], hidden_size=tf["hidden_size"], ffn_hidden_size=tf["ffn_hidden_size"],
        num_attention_heads=tf["num_attention_heads"], kv_channels=tf["kv_channels"],
        group_query_attention=tf["num_query_groups"] != tf["num_attention_heads"],
        num_query_groups=tf["num_query_groups"], max_position_embeddings=gpt["max_sequence_length"],
        seq_length=gpt["max_sequence_length"], position_embedding_type=gpt["position_embedding_type"],
        use_rotary_position_embeddings=gpt["position_embedding_type"] == "rope",
        add_position_embedding=gpt["position_embedding_type"] == "learned_absolute",
        rotary_base=gpt["rotary_base"], normalization=tf["normalization"], norm_epsilon=tf["layernorm_epsilon"],
        swiglu=tf["gated_linear_unit"], add_qkv_bias=tf["add_qkv_bias"], add_bias_linear=tf["add_bias_linear"],
        untie_embeddings_and_output_weights=not gpt["share_embeddings_and_output_weights"],
        vocab_size=hf.vocab_size, padded_vocab_size=padded, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=1,
        params_dtype=torch.float32, fp16=False, bf16=False, apply_layernorm_1p=False,
        hidden_dropout=0.0, attention_dropout=0.0, iteration=0,
        hf_activation=tf["activation_func"].__name__,
    )


def _dims_from_args(args, vocab_size: Optional[int]) -> ModelDims:
    heads = args.num_attention_heads
    return ModelDims(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=heads,
        num_query_groups=(args.num_query_groups if getattr(args, "group_query_attention", False) else heads) or heads,
        head_dim=getattr(args, "kv_channels", None) or args.hidden_size // heads,
        ffn_hidden_size=args.ffn_hidden_size, gated_linear_unit=bool(getattr(args, "swiglu", False)),
        vocab_size=vocab_size, padded_vocab_size=getattr(args, "padded_vocab_size", None),
        tie_embeddings=not getattr(args, "untie_embeddings_and_output_weights", False),
        num_experts=getattr(args, "num_experts", None),
        moe_ffn_hidden_size=getattr(args, "moe_ffn_hidden_size", None),
        shared_expert_ffn_hidden_size=getattr(args, "moe_shared_expert_intermediate_size", None),
    )


def _arch_from_args(args) -> str:
    from verl_bridge.arch import detect_architecture

    ns = argparse.Namespace(
        normalization=getattr(args, "normalization", "LayerNorm"), gated_linear_unit=bool(getattr(args, "swiglu", False)),
        add_qkv_bias=bool(getattr(args, "add_qkv_bias", False)), add_bias_linear=bool(getattr(args, "add_bias_linear", True)),
        position_embedding_type=getattr(args, "position_embedding_type", "learned_absolute"),
        rotary_base=getattr(args, "rotary_base", None), num_query_groups=getattr(args, "num_query_groups", None),
        qk_layernorm=bool(getattr(args, "qk_layernorm", False)), num_moe_experts=getattr(args, "num_experts", None),
        **{k: getattr(args, k) for k in MOE_ARG_KEYS if hasattr(args, k)},
    )
    return detect_architecture(ns)


def _extra_state_names(stage_local: list[str], last: bool) -> list[str]:
    mods = sorted({n.rsplit(".", 1)[0] for n in stage_local
                   if re.search(r"\.(linear_qkv|linear_proj|linear_fc1|linear_fc2)\.weight$", n)})
    out = [m + "._extra_state" for m in mods]
    if last:
        out.append("output_layer._extra_state")
    return out


# ---- import -------------------------------------------------------------------------------

def expected_mcore_shape(name: str, dims: ModelDims) -> Optional[tuple]:
    """The full (TP=1) shape a megatron GPTModel with *dims* gives parameter *name* (None: not checked)."""
    h, hd = dims.hidden_size, dims.head_dim
    qkv = (dims.num_attention_heads + 2 * dims.num_query_groups) * hd
    ffn = dims.ffn_hidden_size
    if ".local_experts." in name:
        ffn = dims.moe_ffn_hidden_size or ffn
    elif ".shared_experts." in name:
        ffn = dims.shared_expert_ffn_hidden_size or ffn
    fc1 = ffn * (2 if dims.gated_linear_unit else 1)
    leaf = name.rsplit(".", 2)
    tail = ".".join(leaf[-2:])
    if tail == "router.weight":
        return (dims.num_experts, h)
    if tail == "shared_experts.gate_weight":
        return (1, h)
    table = {
        "word_embeddings.weight": (dims.padded_vocab_size, h), "output_layer.weight": (dims.padded_vocab_size, h),
        "linear_qkv.weight": (qkv, h), "linear_qkv.bias": (qkv,), "linear_qkv.layer_norm_weight": (h,),
        "linear_qkv.layer_norm_bias": (h,), "linear_proj.weight": (h, dims.num_attention_heads * hd),
        "linear_proj.bias": (h,), "linear_fc1.weight": (fc1, h), "linear_fc1.bias": (fc1,),
        "linear_fc1.layer_norm_weight": (h,), "linear_fc1.layer_norm_bias": (h,), "linear_fc2.weight": (h, ffn),
        "linear_fc2.bias": (h,), "input_layernorm.weight": (h,), "input_layernorm.bias": (h,),
        "pre_mlp_layernorm.weight": (h,), "pre_mlp_layernorm.bias": (h,), "final_layernorm.weight": (h,),
        "final_layernorm.bias": (h,), "q_layernorm.weight": (hd,), "k_layernorm.weight": (hd,),
    }
    if tail == "position_embeddings.weight":
        return None  # rows depend on the architecture's position offset; columns checked below
    return table.get(tail)


def check_shapes(full: dict, dims: ModelDims, config_path) -> None:
    """Raise :class:`CheckpointError` listing every tensor whose shape contradicts the config."""
    bad = []
    for name, t in full.items():
        want = expected_mcore_shape(name, dims)
        if want is None and name.endswith("position_embeddings.weight"):
            if t.dim() != 2 or t.shape[1] != dims.hidden_size:
                bad.append(f"{name}: {tuple(t.shape)}, expected (*, {dims.hidden_size})")
            continue
        if want is not None and tuple(t.shape) != want:
            bad.append(f"{name}: {tuple(t.shape)}, expected {want}")
    if bad:
        raise CheckpointError(
            f"the weights do not match {config_path} (hidden_size={dims.hidden_size}, "
            f"num_attention_heads={dims.num_attention_heads}, num_key_value_heads={dims.num_query_groups}, "
            f"head_dim={dims.head_dim}, intermediate_size={dims.ffn_hidden_size}, vocab_size={dims.vocab_size}): "
            + "; ".join(bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else "")
            + ". Nothing was written; use the config.json that was saved with these weights.")


def read_hf_input(hf_dir):
    """(HF config, safetensors reader) of *hf_dir*, refusing unreadable files with one clear error."""
    import json

    from safetensors import SafetensorError

    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{hf_dir} is not a Hugging Face model directory (no config.json)")
    try:
        json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); it must be the config.json that "
                              "transformers' save_pretrained() writes. Nothing was written.") from None
    try:
        reader = SafetensorsDir(hf_dir)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"the safetensors weights in {hf_dir} are truncated or not safetensors files "
                              f"({type(exc).__name__}: {exc}). Nothing was written.") from None
    try:  # before transformers reads the config: a count of 10**9 layers would allocate per-layer lists
        check_layer_count(raw_layer_count(path), reader, path)
    except ValueError as exc:
        raise CheckpointError(f"{exc}. Nothing was written.") from None
    try:
        hf = load_hf_config(hf_dir)
    except Exception as exc:  # noqa: BLE001 - transformers' many config errors
        raise CheckpointError(f"{path} is not a config transformers can read: {type(exc).__name__}: {exc}. "
                              "Nothing was written.") from None
    return hf, reader


def import_hf(hf_dir, out_dir, *, tp: int = 1, pp: int = 1, fmt: str = "legacy", iteration: int = 0,
              ep: int = 1) -> Path:
    """Write the HF model in *hf_dir* as a Megatron checkpoint (TP=*tp*, PP=*pp*) under *out_dir*.

    Mixture-of-Experts models: ``ep`` > 1 writes the legacy layout per EP rank
    (``mp_rank_TT[_PPP]_EEE``, Megatron-LM's names), EP rank ``r`` holding the experts
    ``r * E/ep ...`` under their local indices; torch_dist stores experts by global index
    (any EP loads it), so there ``ep`` only goes into ``args``.

    Everything is read and checked before anything is written: a config.json that is not JSON,
    unreadable safetensors files and tensors whose shapes contradict the config raise
    :class:`CheckpointError`.
    """
    from safetensors import SafetensorError

    hf, reader = read_hf_input(hf_dir)
    from verl_bridge.arch.hf import arch_of_hf

    spec = arch_of_hf(hf)
    padded = padded_vocab_size(hf.vocab_size, tp)
    dims = dims_from_hf(hf, padded)
    if dims.num_query_groups % tp or dims.num_attention_heads % tp:
        raise ValueError(f"TP={tp} does not divide num_query_groups={dims.num_query_groups} "
                         f"/ num_attention_heads={dims.num_attention_heads}")
    pp_layer_range(dims.num_layers, pp, 0)  # raises when PP does not divide the layers
    if ep > 1 and not dims.num_experts:
        raise ValueError(f"--ep={ep} needs a Mixture-of-Experts model; {spec.name} has no experts")
    if dims.num_experts and dims.num_experts % ep:
        raise ValueError(f"EP={ep} does not divide num_experts={dims.num_experts}")
    args = make_args(hf, spec.name, tp, pp, padded, ep)
    extras: dict = {}
    config_path = Path(hf_dir) / "config.json"
    try:
        full = {n: hf_to_mcore(n, reader, spec, dims, extras=extras) for n in mcore_names(spec, dims)}
    except SafetensorError as exc:
        raise CheckpointError(f"the safetensors weights in {hf_dir} are truncated or corrupted ({exc}). "
                              "Nothing was written.") from None
    except (RuntimeError, ValueError, KeyError) as exc:  # a missing tensor, or a fused tensor that cannot be reshaped as the config says
        raise CheckpointError(f"the weights in {hf_dir} do not match {config_path}: {exc}. "
                              "Nothing was written.") from None
    check_shapes(full, dims, config_path)
    meta = {"arch": spec.name, "hf_config": hf.to_dict(), "vocab_size": hf.vocab_size, "hf_extras": extras}
    if fmt == "torch_dist":
        return _import_torch_dist(hf_dir, out_dir, args, meta, iteration, full)
    if fmt != "legacy":
        raise ValueError(f"checkpoint format {fmt!r} is not one of legacy, torch_dist")
    fresh = not Path(out_dir).exists()
    tmp = begin(out_dir, iteration)
    try:
        for pp_rank in range(pp):
            names = stage_names(list(full), dims.num_layers, pp, pp_rank, dims.tie_embeddings)
            last = pp_rank == pp - 1
            if last and pp > 1 and dims.tie_embeddings:  # last stage keeps a copy of the tied embeddings
                names["embedding.word_embeddings.weight#out"] = "output_layer.weight"
            for tp_rank in range(tp):
                for ep_rank in range(ep):
                    model = {}
                    for g, local in names.items():
                        src = g.split("#")[0]
                        if expert_index(src) is not None:
                            owner, local = expert_local_name(local, dims.num_experts, ep)
                            if owner != ep_rank:
                                continue  # another EP rank's expert
                        model[local] = shard_for_tp(src, full[src], tp, tp_rank, dims).clone()
                    for n in _extra_state_names(list(model), last):
                        model[n] = None
                    state = {"model": model, "args": args, "checkpoint_version": CHECKPOINT_VERSION,
                             "iteration": iteration, "verl_bridge": meta}
                    path = tmp / rank_dir_name(tp_rank, pp_rank, pp, ep_rank, ep) / LEGACY_FILE
                    path.parent.mkdir(parents=True, exist_ok=True)
                    torch.save(state, path)
    except BaseException as exc:
        _discard(tmp, out_dir if fresh else None)
        if isinstance(exc, Exception) and is_disk_full(exc):
            need = tensor_bytes(full)
            raise CheckpointError(f"no space left on device while writing {tmp}: the converted checkpoint needs "
                                  f"about {need / 2**20:.1f} MiB. The partial output was removed and {out_dir} is "
                                  "as it was; free space or choose a DST on a larger disk.") from None
        raise
    return publish(out_dir, tmp, iteration)


def _discard(tmp: Path, created: Optional[Path]) -> None:
    """Remove a failed import's temporary directory (and *created*, the output directory this call
    made, when nothing else is in it): a failed conversion leaves DST as it was."""
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    if created is not None:
        try:
            os.rmdir(created)
        except OSError:
            pass


@contextmanager
def world_of_one():
    """A private single-process gloo group (FileStore, no network) when none exists."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() != 1:
            raise CheckpointError("offline torch_dist conversion must run in a single process")
        from megatron.core import parallel_state as mpu

        if mpu.model_parallel_is_initialized():
            yield
            return
        mpu.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            mpu.destroy_model_parallel()
        return
    with tempfile.TemporaryDirectory() as d:
        store = dist.FileStore(os.path.join(d, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            from megatron.core import parallel_state as mpu

            mpu.initialize_model_parallel(1, 1)
            try:
                yield
            finally:
                mpu.destroy_model_parallel()
        finally:
            dist.destroy_process_group()


def _full_tp1_model(args, arch: str):
    from verl_bridge.arch.hf import PORTABLE_FLAGS, build_gpt_model
    from verl_bridge.models.spec import get_portable_gpt_layer_spec

    spec = get_arch(arch)
    act = {"relu": torch.nn.functional.relu, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}
    tf = dict(PORTABLE_FLAGS, num_layers=args.num_layers, hidden_size=args.hidden_size,
              num_attention_heads=args.num_attention_heads,
              num_query_groups=args.num_query_groups if args.group_query_attention else args.num_attention_heads,
              kv_channels=args.kv_channels, ffn_hidden_size=args.ffn_hidden_size, normalization=args.normalization,
              layernorm_epsilon=args.norm_epsilon, gated_linear_unit=args.swiglu,
              activation_func=act[getattr(args, "hf_activation", "silu" if args.swiglu else "gelu")],
              add_bias_linear=args.add_bias_linear, add_qkv_bias=args.add_qkv_bias,
              qk_layernorm=bool(getattr(args, "qk_layernorm", False)), **mcore_moe_kwargs(args))
    gpt = dict(vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
               position_embedding_type=args.position_embedding_type, rotary_base=args.rotary_base,
               share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
               transformer_layer_spec=get_portable_gpt_layer_spec(
                   args.normalization, qk_layernorm=tf["qk_layernorm"], num_experts=tf.get("num_moe_experts")))
    del spec
    return build_gpt_model(tf, gpt, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                           **({"expert_model_parallel_size": 1} if tf.get("num_moe_experts") else {}))


def _import_torch_dist(hf_dir, out_dir, args, meta, iteration, full) -> Path:
    from verl_bridge.checkpoint.megatron import save

    with world_of_one():
        model = _full_tp1_model(args, meta["arch"])
        sd = model.state_dict()
        with torch.no_grad():
            for name, t in sd.items():
                if name.endswith("._extra_state") or t is None:
                    continue
                t.copy_(full[name])
        return save(out_dir, iteration, {"model": model, "args": args, "checkpoint_version": CHECKPOINT_VERSION,
                                         "verl_bridge": meta}, fmt="torch_dist")


# ---- export -------------------------------------------------------------------------------

def _rank_files_ep(d: Path) -> dict[tuple[int, int, int], Path]:
    """(tp, pp, ep) -> file of a legacy checkpoint (``mp_rank_TT[_PPP][_EEE]``), once the first file's
    args say whether the suffixes are pipeline or expert ranks (as Megatron-LM reads them)."""
    names = {}
    for rd in d.iterdir():
        m = re.match(r"^mp_rank_(\d+)((?:_\d+){0,2})$", rd.name)
        if m and (rd / LEGACY_FILE).is_file():
            names[(int(m.group(1)),) + tuple(int(x) for x in m.group(2).split("_")[1:])] = rd / LEGACY_FILE
    if not names:
        return {}
    args = check_loaded_state(safe_load(names[min(names)]), names[min(names)])
    pp = getattr(args, "pipeline_model_parallel_size", 1) or 1
    ep = (getattr(args, "expert_model_parallel_size", 1) or 1) if getattr(args, "num_experts", None) else 1
    out = {}
    for key, path in names.items():
        parts = list(key[1:])
        p = parts.pop(0) if pp > 1 and parts else 0
        e = parts.pop(0) if ep > 1 and parts else 0
        if parts:
            raise CheckpointError(f"{path.parent.name}: unexpected rank directory for PP={pp}, EP={ep}")
        out[(key[0], p, e)] = path
    return out


_ARG_INTS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")


def check_loaded_state(state, path, *, model: bool = True) -> argparse.Namespace:
    """The ``args`` of a loaded checkpoint file (``model_optim_rng.pt`` / ``common.pt``) after checking
    what conversion reads from it; :class:`CheckpointError` naming the file and the field otherwise."""
    where = f"checkpoint file {path}"
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} holds a {type(state).__name__}, not the dict Megatron-LM saves")
    args = state.get("args")
    if not isinstance(args, argparse.Namespace):
        raise CheckpointError(f"{where} has no Megatron-LM 'args' (found {type(args).__name__}); converting needs "
                              "the model's shape from them (num_layers, hidden_size, ...)")
    bad = [f"args.{k}={getattr(args, k, None)!r}" for k in _ARG_INTS
           if not isinstance(getattr(args, k, None), int) or isinstance(getattr(args, k), bool) or getattr(args, k) < 1]
    if bad:
        raise CheckpointError(f"{where}: {', '.join(bad)}; each must be a positive integer")
    if model:
        weights = state.get("model")
        if not isinstance(weights, dict):
            raise CheckpointError(f"{where} has no 'model' state dict (found {type(weights).__name__})")
        odd = [n for n, t in weights.items() if t is not None and not torch.is_tensor(t)
               and not str(n).endswith("._extra_state")]
        if odd:
            raise CheckpointError(f"{where}: model entries {', '.join(map(repr, odd[:3]))} are "
                                  f"{type(weights[odd[0]]).__name__}, not tensors")
    meta = state.get("verl_bridge", {})
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where}: the 'verl_bridge' entry is a {type(meta).__name__}, not a dict")
    return args


def read_full_megatron(src_dir, iteration=None) -> tuple[dict, argparse.Namespace, dict]:
    """(full TP-merged state dict with global names, args, verl_bridge metadata) of a checkpoint."""
    src_dir = Path(src_dir)
    if iteration is None:
        iteration = latest_valid_iteration(src_dir)
        if iteration is None:
            raise CheckpointError(f"no valid checkpoint in {src_dir}")
    else:
        validate_iteration(src_dir, iteration)  # checksums and structure; names the failing file
    d = iter_dir(src_dir, iteration)
    if is_torch_dist_dir(d):
        from verl_bridge.checkpoint.megatron import load
        from verl_bridge.checkpoint.safe_torch_dist import load_common

        with world_of_one():
            common = load_common(d)
            args = check_loaded_state(common, d / "common.pt", model=False)
            meta = common.get("verl_bridge", {})
            model = _full_tp1_model(args, meta.get("arch") or _arch_from_args(args))
            load(src_dir, iteration, model=model, validated=True, model_only=True)  # any TP x PP it was saved at
            full = {k: v.detach().clone() for k, v in model.state_dict().items()
                    if not k.endswith("._extra_state") and v is not None}
        return full, args, meta
    files = _rank_files_ep(d)
    if not files:
        raise CheckpointError(f"{d} holds neither a legacy (mp_rank_*) nor a torch_dist checkpoint")
    tp = 1 + max(t for t, _, _ in files)
    pp = 1 + max(p for _, p, _ in files)
    ep = 1 + max(e for _, _, e in files)
    missing = [rank_dir_name(t, p, pp, e, ep) for t in range(tp) for p in range(pp) for e in range(ep)
               if (t, p, e) not in files]
    if missing:
        raise CheckpointError(f"{d} is incomplete: it has ranks up to TP={tp}, PP={pp}, EP={ep} but no "
                              f"{', '.join(m + '/' + LEGACY_FILE for m in missing[:4])}"
                              + (f" (and {len(missing) - 4} more)" if len(missing) > 4 else ""))
    states = {k: safe_load(v) for k, v in files.items()}
    for k, v in files.items():
        check_loaded_state(states[k], v)
    args = states[(0, 0, 0)]["args"]
    meta = states[(0, 0, 0)].get("verl_bridge", {})
    per_stage = args.num_layers // pp
    n_local = args.num_experts // ep if getattr(args, "num_experts", None) else None
    tie = not getattr(args, "untie_embeddings_and_output_weights", False)
    gated = argparse.Namespace(gated_linear_unit=bool(getattr(args, "swiglu", False)))
    full: dict = {}
    for p in range(pp):
        for e in range(ep):
            names = [n for n, t in states[(0, p, e)]["model"].items()
                     if t is not None and not n.endswith("._extra_state")]
            for local in names:
                if local == "output_layer.weight" and tie:
                    continue  # the last stage's copy of the tied embeddings
                if e > 0 and expert_index(local) is None:
                    continue  # replicated over EP ranks: taken from EP rank 0
                g = to_global_name(local, p * per_stage, ep_rank=e, num_local_experts=n_local)
                parts = [states[(t, p, e)]["model"].get(local) for t in range(tp)]
                if any(x is None for x in parts):
                    t = next(t for t, x in enumerate(parts) if x is None)
                    raise CheckpointError(f"checkpoint file {files[(t, p, e)]} lacks the tensor {local!r} "
                                          f"that {files[(0, p, e)]} has (TP shards of different models?)")
                full[g] = merge_tp(g, parts, gated)
    return full, args, meta


def _describe(args, vocab_size: int) -> dict:
    return dict(num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
                num_query_groups=args.num_query_groups if getattr(args, "group_query_attention", False)
                else args.num_attention_heads,
                head_dim=getattr(args, "kv_channels", None) or args.hidden_size // args.num_attention_heads,
                ffn_hidden_size=args.ffn_hidden_size, vocab_size=vocab_size,
                max_position_embeddings=args.max_position_embeddings, norm_eps=getattr(args, "norm_epsilon", 1e-5),
                rotary_base=getattr(args, "rotary_base", 10000), tie_embeddings=not args.untie_embeddings_and_output_weights,
                num_experts=getattr(args, "num_experts", None), moe_router_topk=getattr(args, "moe_router_topk", None),
                moe_ffn_hidden_size=getattr(args, "moe_ffn_hidden_size", None),
                shared_expert_ffn_hidden_size=getattr(args, "moe_shared_expert_intermediate_size", None),
                moe_router_pre_softmax=bool(getattr(args, "moe_router_pre_softmax", False)),
                moe_aux_loss_coeff=getattr(args, "moe_aux_loss_coeff", 0.0))


def export_hf(src_dir, out_dir, *, iteration=None, arch: Optional[str] = None, vocab_size: Optional[int] = None) -> Path:
    """Write a Megatron checkpoint (either layout, any TP/PP) as an HF safetensors dir + config.json."""
    check_export_dst(out_dir)
    full, args, meta = read_full_megatron(src_dir, iteration)
    spec = get_arch(arch or meta.get("arch") or _arch_from_args(args))
    vocab = vocab_size or meta.get("vocab_size") or getattr(args, "vocab_size", None) or args.padded_vocab_size
    dims = _dims_from_args(args, vocab)
    extras = meta.get("hf_extras") or {}
    tensors: dict = {}
    for name, t in full.items():
        try:
            pairs = mcore_to_hf(name, t, spec, dims, extras=extras)
        except (RuntimeError, ValueError, IndexError) as exc:  # a tensor that cannot be split as args say
            raise CheckpointError(
                f"the tensor {name} of shape {tuple(t.shape)} in {src_dir} does not fit the model its args describe "
                f"(num_layers={args.num_layers}, hidden_size={args.hidden_size}, num_attention_heads="
                f"{args.num_attention_heads}, num_query_groups={dims.num_query_groups}, ffn_hidden_size="
                f"{args.ffn_hidden_size}): {exc}. Nothing was written.") from None
        for hf_name, ht in pairs:
            tensors[hf_name] = ht
    config = meta.get("hf_config") or spec.hf_config(_describe(args, vocab))
    _write_hf_dir(tensors, config, out_dir)
    return Path(out_dir)


_EXPORT_FILES = ("model.safetensors", "config.json")


def check_export_dst(out_dir) -> None:
    """Refuse an export into a directory that holds other weights (shards of an earlier sharded save,
    a ``model.safetensors.index.json``, ``.bin`` weights): next to them the new ``model.safetensors``
    would make a directory whose readers disagree (an index wins in verl-bridge's reader, the single
    file in transformers'), i.e. the old weights could be loaded silently. Nothing is deleted."""
    out = Path(out_dir)
    if not out.is_dir():
        return
    other = sorted(p.name for p in out.iterdir()
                   if p.name not in _EXPORT_FILES and (p.name.endswith((".safetensors", ".bin", ".pt", ".pth"))
                                                       or p.name.endswith(".index.json")))
    if other:
        raise CheckpointError(
            f"{out} already holds other weights ({', '.join(other[:4])}{', ...' if len(other) > 4 else ''}); "
            "writing model.safetensors next to them would leave a directory whose readers load different "
            "weights. Nothing was written or deleted: choose a new or empty output directory, or remove those files.")


def _write_hf_dir(tensors: dict, config: dict, out_dir) -> None:
    """Write into a fresh sibling directory, then move each file into *out_dir* with ``os.replace``:
    a failed export leaves *out_dir* as it was, and a symlink planted there is replaced, never
    followed."""
    import shutil

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_safetensors_dir(tensors, config, tmp)
        out.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
