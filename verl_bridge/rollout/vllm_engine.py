"""``rollout.engine: vllm``: vLLM colocated in the torchrun ranks (GPU only).

Each training rank also runs one vLLM worker in-process
(``LLM(..., distributed_executor_backend="external_launcher", enable_sleep_mode=True,
load_format="dummy")``). vLLM's tensor parallel size is ``rollout.tp_size`` (default: the training
TP size) and is independent of training TP: the world is split into ``world // rollout_tp``
vLLM data-parallel replicas of consecutive ranks. Per step:

* ``generate``: wake vLLM if needed, gather the prompts of the vLLM TP group (its ranks must
  issue identical requests), generate with per-request seeds, keep this rank's rows, broadcast
  the result over megatron's model-parallel group (so TP/PP ranks of the trainer hold identical
  samples whatever the rollout TP), and put vLLM to sleep (level 2: KV cache and weights freed
  while the trainer trains).
* ``sync_weights``: wake the weight memory, stream the actor through
  :class:`verl_bridge.resharding.export.WeightExporter` in ``rollout.bucket_mb`` buckets (every
  rank receives full HF-named tensors; vLLM's own ``load_weights`` shards them for its TP rank),
  wake the KV cache, then verify (:meth:`VllmEngine.verify`): vLLM's ``prompt_logprobs`` on the
  probe batch vs the trainer's log-probs (:func:`verl_bridge.rollout.verify.probe_sync`).

Weight updates go through ONE gate, :func:`weight_update_path`: vLLM >= 0.22 has the native
weight-transfer API (worker methods ``init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``, reached through ``LLM.collective_rpc``; in 0.33 the
``LLM`` class itself does not expose them). Colocated in one process there is nothing to
transport, so we register a tiny in-process backend (:data:`INPROC_BACKEND`) whose
``update_weights`` hands the bucket's tensors to the model's ``load_weights`` inside vLLM's
layerwise-reload session (which re-runs weight post-processing, e.g. quantization). Older vLLM
(or an LLM built without the transfer config, see :func:`supports_transfer_api`) uses
``collective_rpc`` into the model runner's ``load_weights``.

What was verified where: the version gate and feature check are unit-tested without vLLM; the
in-process transfer backend and the ``load_weights`` layout are tested on the CPU with vLLM's own
model classes (``tests/vllm``, :mod:`verl_bridge.rollout.vllm_cpu`). ``VllmEngine`` itself
(LLM construction, sleep/wake, generation, prompt log-probs) needs a CUDA GPU and vLLM, and has
NOT been run: the GPU machine's image has no vLLM.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, Optional

import torch
import torch.distributed as dist

from verl_bridge.rollout.base import RolloutBatch, SamplingParams

TRANSFER_API_MIN_VERSION = (0, 22)
TRANSFER_API_METHODS = ("init_weight_transfer_engine", "start_weight_update", "update_weights",
                        "finish_weight_update")
INPROC_BACKEND = "verl_bridge_inproc"
ALLOWED_ENGINES = ("native", "vllm")


# ---- version gate (pure; tested without vLLM) ----------------------------------------------

def parse_version(version: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: ``"0.22.0rc1"`` -> ``(0, 22, 0)``."""
    nums = []
    for part in str(version).strip().lstrip("vV").split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        nums.append(int(m.group()))
        if m.end() != len(part):  # "0rc1", "1+cu121": the release part ends here
            break
    if not nums:
        raise ValueError(f"not a version: {version!r}")
    return tuple(nums)


def weight_update_path(vllm_version: str) -> str:
    """``"transfer_api"`` for vLLM >= 0.22 (native weight-transfer API), else ``"collective_rpc"``."""
    v = parse_version(vllm_version)
    padded = v + (0,) * (len(TRANSFER_API_MIN_VERSION) - len(v))
    return "transfer_api" if padded >= TRANSFER_API_MIN_VERSION else "collective_rpc"


def _worker_has_transfer_api(worker) -> bool:
    return (all(callable(getattr(worker, m, None)) for m in TRANSFER_API_METHODS)
            and getattr(worker, "weight_transfer_engine", None) is not None)


def supports_transfer_api(llm) -> bool:
    """Feature check on a built ``LLM``: its workers have the four transfer methods and a transfer
    engine was configured (``weight_transfer_config``). Also true when the ``LLM`` object itself
    exposes the methods (newer vLLM)."""
    if all(callable(getattr(llm, m, None)) for m in TRANSFER_API_METHODS):
        return True
    rpc = getattr(llm, "collective_rpc", None)
    if rpc is None:
        return False
    try:
        answers = rpc(_worker_has_transfer_api)
    except Exception:  # noqa: BLE001 - an engine that cannot answer has no usable API
        return False
    return bool(answers) and all(bool(a) for a in answers)


def choose_update_path(llm, vllm_version: str) -> str:
    """The version gate, downgraded to ``collective_rpc`` when the feature check fails."""
    path = weight_update_path(vllm_version)
    if path == "transfer_api" and not supports_transfer_api(llm):
        return "collective_rpc"
    return path


# ---- availability ---------------------------------------------------------------------------

class VllmUnavailableError(RuntimeError):
    pass


def require_vllm(cuda_available: Optional[bool] = None) -> None:
    """Raise :class:`VllmUnavailableError` with one readable paragraph when vLLM cannot run here."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmUnavailableError(
            "rollout.engine='vllm' needs vLLM, which is not installed in this environment. Install it on a "
            "GPU machine (pip install 'verl-bridge[vllm]'), or set rollout.engine: native "
            f"(allowed values: {', '.join(ALLOWED_ENGINES)}; native runs everywhere, vllm needs vLLM and a GPU).")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        raise VllmUnavailableError(
            "vLLM generation needs a GPU; use rollout.engine: native "
            f"(allowed values: {', '.join(ALLOWED_ENGINES)}; no CUDA device is visible on this machine).")


# ---- the in-process weight-transfer backend (vLLM side) -----------------------------------

_REGISTERED = False


def inproc_transfer_engine_class():
    """vLLM ``WeightTransferEngine`` for a trainer in the same process: the update info carries
    the bucket itself (``{"weights": [(hf_name, tensor), ...]}``); start/finish run vLLM's
    layerwise reload like its checkpoint-format (IPC) backend. ``loaded_names`` collects what
    ``load_weights`` reported since the last ``start_weight_update``."""
    from dataclasses import dataclass

    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclass
    class InprocInitInfo(WeightTransferInitInfo):
        pass

    @dataclass
    class InprocUpdateInfo(WeightTransferUpdateInfo):
        weights: list

    class InprocWeightTransferEngine(WeightTransferEngine[InprocInitInfo, InprocUpdateInfo]):
        init_info_cls = InprocInitInfo
        update_info_cls = InprocUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loaded_names: set[str] = set()
            self.layerwise = True

        def init_transfer_engine(self, init_info) -> None:
            return None

        def start_weight_update(self) -> None:
            self.loaded_names = set()
            if self.layerwise:
                from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

                initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            if self.layerwise:
                from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

                finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info) -> None:
            # the base class synchronizes the accelerator, which a CPU build may lack
            self.receive_weights(self.parse_update_info(update_info))
            if torch.cuda.is_available():
                torch.cuda.synchronize()

        def receive_weights(self, update_info) -> None:
            loaded = self.model.load_weights(iter(update_info.weights))
            self.loaded_names |= set(loaded or ())

        def shutdown(self) -> None:
            return None

    return InprocWeightTransferEngine


def register_inproc_backend() -> str:
    """Register :data:`INPROC_BACKEND` with vLLM's transfer-engine factory (idempotent)."""
    global _REGISTERED
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if not _REGISTERED and INPROC_BACKEND not in getattr(WeightTransferEngineFactory, "_registry", {}):
        cls = inproc_transfer_engine_class()
        WeightTransferEngineFactory.register_engine(INPROC_BACKEND, cls)
    _REGISTERED = True
    return INPROC_BACKEND


def _rpc_load_weights(worker, bucket) -> list[str]:
    """Runs on the vLLM worker (collective_rpc path): load one bucket with the model's own loader."""
    model = worker.model_runner.get_model() if hasattr(worker.model_runner, "get_model") else worker.model_runner.model
    return sorted(model.load_weights(iter(bucket)) or ())


def _rpc_unloaded_params(worker, loaded: Optional[list] = None) -> list[str]:
    """Runs on the vLLM worker: its parameters that the last sync did not load (``loaded`` given
    for the collective_rpc path; the transfer backend keeps its own record)."""
    model = worker.model_runner.get_model() if hasattr(worker.model_runner, "get_model") else worker.model_runner.model
    if loaded is None:
        loaded = getattr(worker.weight_transfer_engine, "loaded_names", ())
    done = set(loaded or ())
    return sorted(n for n, _ in model.named_parameters() if n not in done)


# ---- the engine (GPU only) --------------------------------------------------------------

class VllmEngine:
    """vLLM rollout engine colocated with the trainer (every rank of the torchrun world calls
    every method together). GPU only: constructing it without vLLM or CUDA raises
    :class:`VllmUnavailableError`. Not run in this repository's CI (no GPU with vLLM)."""

    def __init__(self, actor, *, hf_dir: str, rollout_cfg, train_tp: int, seed: int, vocab_size: int,
                 dtype: str = "auto", max_model_len: Optional[int] = None, sleep_level: int = 2,
                 llm_kwargs: Optional[dict] = None):
        require_vllm()
        import vllm
        from vllm import LLM

        self.actor = actor
        self.cfg = rollout_cfg
        self.vocab_size = vocab_size
        self.sleep_level = sleep_level
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.tp = int(rollout_cfg.tp_size or train_tp)
        if world % self.tp:
            raise ValueError(f"rollout.tp_size={self.tp} does not divide the world size {world}")
        self.version = vllm.__version__
        kwargs: dict[str, Any] = dict(
            model=str(hf_dir), distributed_executor_backend="external_launcher", enable_sleep_mode=True,
            load_format="dummy", tensor_parallel_size=self.tp, data_parallel_size=world // self.tp,
            gpu_memory_utilization=rollout_cfg.gpu_memory_utilization, seed=seed, dtype=dtype,
            skip_tokenizer_init=True,
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if weight_update_path(self.version) == "transfer_api":
            from vllm.config import WeightTransferConfig

            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=register_inproc_backend())
        kwargs.update(llm_kwargs or {})
        self.llm = LLM(**kwargs)
        self.update_path = choose_update_path(self.llm, self.version)
        if self.update_path == "transfer_api":
            self.llm.collective_rpc("init_weight_transfer_engine", args=({},))
        self._awake = True
        self._weights_valid = False  # load_format="dummy": random until the first sync
        self.last_report = None
        self.sync_weights()

    # -- sleep / wake ------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free vLLM's GPU memory while the trainer trains (level 2 drops the weights too)."""
        if self._awake:
            self.llm.sleep(level=self.sleep_level)
            self._awake = False
            if self.sleep_level >= 2:
                self._weights_valid = False

    def wake_up(self) -> None:
        if not self._weights_valid:
            self.sync_weights()  # wakes weights, loads them, wakes the KV cache
        elif not self._awake:
            self.llm.wake_up()
            self._awake = True

    # -- weights -----------------------------------------------------------------------------
    def _exporter(self):
        """One exporter for the engine's life: its metadata and (at TP=1, PP=1) its plan of
        parameter views are built on the first sync and reused while the parameters stay put."""
        from verl_bridge.resharding.export import WeightExporter

        if getattr(self, "_weight_exporter", None) is None:  # tests build the engine without __init__
            self._weight_exporter = WeightExporter(self.actor, bucket_bytes=int(self.cfg.bucket_mb) << 20,
                                                   vocab_size=self.vocab_size)
        return self._weight_exporter

    def sync_weights(self) -> None:
        if not self._awake:
            self.llm.wake_up(tags=["weights"])
        exporter = self._exporter()
        if self.update_path == "transfer_api":
            self.llm.collective_rpc("start_weight_update")
            for bucket in exporter.iter_buckets():
                self.llm.collective_rpc("update_weights", args=({"weights": bucket},))
            self.llm.collective_rpc("finish_weight_update")
            unloaded = self.llm.collective_rpc(_rpc_unloaded_params)
        else:
            loaded: set[str] = set()
            for bucket in exporter.iter_buckets():
                for names in self.llm.collective_rpc(_rpc_load_weights, args=(bucket,)):
                    loaded |= set(names)
            unloaded = self.llm.collective_rpc(_rpc_unloaded_params, args=(sorted(loaded),))
        self.export_stats = exporter.stats
        missing = sorted({n for per_worker in unloaded for n in per_worker})
        if missing:  # a parameter left at its dummy init would generate garbage silently
            raise RuntimeError(
                f"Weight sync into vLLM left {len(missing)} parameter(s) unloaded: "
                f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}. The exporter's HF names do "
                "not match what vLLM's model class loads; check the architecture map (verl_bridge.arch).")
        if not self._awake:
            self.llm.wake_up(tags=["kv_cache"])
            self._awake = True
        self._weights_valid = True
        if self.cfg.verify_sync:
            self.last_report = self.verify()

    # -- verification --------------------------------------------------------------------------
    def prompt_log_probs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """vLLM's next-token log-probs [B, S-1] of *input_ids* via ``prompt_logprobs`` (GPU only)."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        rows = [TokensPrompt(prompt_token_ids=[int(t) for t in row]) for row in input_ids.tolist()]
        outs = self.llm.generate(rows, VSP(max_tokens=1, prompt_logprobs=0, temperature=1.0), use_tqdm=False)
        lp = torch.empty((input_ids.shape[0], input_ids.shape[1] - 1), dtype=torch.float64)
        for i, out in enumerate(outs):
            ids = input_ids[i].tolist()
            for t in range(1, len(ids)):
                entry = out.prompt_logprobs[t]
                lp[i, t - 1] = entry[ids[t]].logprob
        return lp

    def verify(self):
        """Probe check after a sync: trainer vs vLLM log-probs (raises SyncVerificationError).

        Needs the trainer's forward at PP=1 (megatron_log_probs); with PP > 1 the probe is not
        run and ``None`` is returned. GPU only, like the rest of this class.
        """
        from megatron.core import parallel_state as mpu

        from verl_bridge.rollout.verify import probe_sync, resolve_threshold

        if mpu.model_parallel_is_initialized() and mpu.get_pipeline_model_parallel_world_size() > 1:
            return None
        return probe_sync(self.actor, self.prompt_log_probs,
                          threshold=resolve_threshold(self.cfg.verify_threshold, self.actor),
                          vocab_size=self.vocab_size)

    # -- generation ------------------------------------------------------------------------------
    def _vllm_tp_group(self):
        from vllm.distributed import parallel_state as vps

        return vps.get_tp_group().cpu_group

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        from verl_bridge.rollout.base import left_pad

        self.wake_up()
        # every rank of a vLLM TP group must issue the same requests: gather theirs, answer all
        group = self._vllm_tp_group() if self.tp > 1 else None
        if group is not None:
            gathered: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, (list(map(list, prompts)), seed), group=group)
        else:
            gathered = [(prompts, seed)]
        requests, sps, mine = [], [], None
        me = dist.get_rank(group) if group is not None else 0
        for r, (ps, s) in enumerate(gathered):
            if r == me:
                mine = len(requests)
            for i, p in enumerate(ps):
                requests.append(TokensPrompt(prompt_token_ids=list(p)))
                sps.append(VSP(max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                               top_k=max(params.top_k, 0), seed=s * 100003 + i,
                               stop_token_ids=[params.eos_token_id] if params.eos_token_id is not None else None,
                               ignore_eos=params.eos_token_id is None, detokenize=False))
        outs = self.llm.generate(requests, sps, use_tqdm=False)[mine: mine + len(prompts)]
        device = torch.device("cuda", torch.cuda.current_device())
        prompt_ids, prompt_mask = left_pad(prompts, params.pad_token_id, device)
        bsz = len(prompts)
        response = torch.full((bsz, params.max_new_tokens), params.pad_token_id, dtype=torch.long, device=device)
        resp_mask = torch.zeros_like(response)
        for i, out in enumerate(outs):
            toks = list(out.outputs[0].token_ids)[: params.max_new_tokens]
            if toks:
                response[i, : len(toks)] = torch.tensor(toks, dtype=torch.long, device=device)
                resp_mask[i, : len(toks)] = 1
        self._broadcast_model_parallel(response, resp_mask)
        self.sleep()
        return RolloutBatch(prompt_ids, prompt_mask, response, resp_mask)

    @staticmethod
    def _broadcast_model_parallel(*tensors: torch.Tensor) -> None:
        """Trainer TP/PP ranks must hold identical samples whatever the rollout TP."""
        from megatron.core import parallel_state as mpu

        if not mpu.model_parallel_is_initialized():
            return
        group = mpu.get_model_parallel_group()
        if dist.get_world_size(group) == 1:
            return
        src = dist.get_process_group_ranks(group)[0]
        for t in tensors:
            dist.broadcast(t, src=src, group=group)


def hf_dir_for_actor(cfg) -> str:
    """The HF directory vLLM is built from: ``model.actor.args.model_name_or_path`` (config.json only
    is read, ``load_format="dummy"``). A clear error when the actor has none."""
    import os

    path = getattr(getattr(getattr(cfg.model, "actor", None), "args", None), "model_name_or_path", None)
    if not path or not os.path.isfile(os.path.join(str(path), "config.json")):
        raise VllmUnavailableError(
            "rollout.engine='vllm' builds vLLM from the actor's Hugging Face directory "
            "(model.actor.args.model_name_or_path with a config.json), and this actor has none "
            f"(got {path!r}). Set it, or use rollout.engine: native.")
    return str(path)


def build_vllm_engine(cfg, actor, layout, vocab_size: Optional[int] = None) -> VllmEngine:
    """What ``MegatronTrainer.setup`` calls for ``rollout.engine: vllm`` (GPU only).

    Raises :class:`VllmUnavailableError` (one readable paragraph) without vLLM, without CUDA, or
    without an HF directory for the actor. ``vocab_size`` defaults to the HF config's.
    """
    require_vllm()
    hf_dir = hf_dir_for_actor(cfg)
    if vocab_size is None:
        from verl_bridge.arch.hf import load_hf_config

        vocab_size = int(load_hf_config(hf_dir).vocab_size)
    return VllmEngine(actor, hf_dir=hf_dir, rollout_cfg=cfg.rollout, train_tp=layout.tp_size,
                      seed=cfg.trainer.seed, vocab_size=vocab_size,
                      max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length)


__all__ = [
    "INPROC_BACKEND", "TRANSFER_API_METHODS", "TRANSFER_API_MIN_VERSION", "VllmEngine", "VllmUnavailableError",
    "build_vllm_engine", "choose_update_path", "hf_dir_for_actor", "inproc_transfer_engine_class",
    "parse_version", "register_inproc_backend", "require_vllm", "supports_transfer_api", "weight_update_path",
]
