"""megatron-core version shims. Supported range: megatron-core 0.12 to 0.19.

CI runs ``tests/bridge`` on two versions: 0.16.1 (the main venv; Python 3.11 caps megatron-core
at 0.16.x on CPU machines) and 0.13.1 (``.ci/mcore_old_tier.sh``). The GPU machine runs Python
3.12 with 0.19.x. Each shim is named after the version where the API changed and says what
changed; each acts only on objects verl-bridge (or the user's provider) built, never on a
library module.

===========================  ===================================================================
shim                         what changed
===========================  ===================================================================
``VP_STAGE_SINCE``  (0.13)   ``GPTModel`` / ``TransformerBlock`` take ``vp_stage``; before, a
                             provider must not pass it (:func:`gpt_model_kwargs`)
``PG_COLLECTION_SINCE``      ``ProcessGroupCollection`` (``megatron.core.process_groups_config``)
(0.15)                       and ``pg_collection=`` arguments; before, modules read
                             ``parallel_state`` globals (:func:`default_pg_collection` -> None)
``ROPE_GET_EMB_SINCE``       ``RotaryEmbedding.get_emb`` holds the CPU->CUDA move of
(0.16)                       ``inv_freq``; in 0.12-0.15 ``forward`` does the move itself, so
                             :func:`verl_bridge.compat.cpu.make_cpu_safe` also replaces ``forward`` there (CPU only)
``GPTMODEL_DEPRECATED_SINCE``  ``GPTModel`` announces its deprecation in favour of
(0.19)                       ``HybridModel``; verl-bridge still builds ``GPTModel`` (the layout of
                             users' checkpoints), and :func:`gpt_model_class` imports it with that
                             one notice shown once instead of on every build
``DIST_CKPT_STRATEGY_BASE``  ``dist_checkpointing.strategies.base`` (``SaveShardedStrategy``) is
``_REMOVED_IN`` (0.19)       gone and ``dist_checkpointing.save`` replaces any strategy that is not
                             a ``TorchDistSaveShardedStrategy``; verl-bridge's synchronous (CPU)
                             torch_dist writer subclasses whichever applies
                             (:func:`torch_dist_save_strategy_base`)
``DIST_CKPT_COMMON_IN``      ``dist_checkpointing.save`` hands the common (non-sharded) state to
``_DISTCP_SINCE`` (0.19)     the strategy as a ``ShardedObject("common_state")`` for the .distcp
                             files instead of writing ``common.pt``; verl-bridge keeps writing
                             ``common.pt`` (its layout on every version, which 0.19's loader still
                             reads) (:data:`COMMON_STATE_SHARDED_KEY`)
``RESHARD_TASK_ID_KWARG``    ``megatron.core.resharding``'s executor calls
``_SINCE`` (0.18)            ``CopyService.submit_send/submit_recv(..., task_id=)`` and
                             ``CopyService.__init__`` takes ``group``; 0.16-0.17 call
                             ``submit_send_with_id(task_id, ...)`` when the service has it
                             (:func:`copy_service_init_kwargs`)
``RESHARD_EXECUTOR_CUDA``    ``execute_reshard_plan`` calls ``torch.cuda.synchronize()`` after
``_SYNC_SINCE`` (0.17)       the copy service ran, whatever the tensors' device; 0.16 does not
                             (:func:`reshard_needs_cuda_sync`)
===========================  ===================================================================

``megatron.core.resharding`` (``swap_model_weights``) exists from 0.16 on
(:data:`RESHARDING_SINCE`); its ``"gloo"`` backend stages through CUDA streams and pinned memory
in 0.16-0.19, so on the CPU it runs with :class:`verl_bridge.compat.refit.CpuGlooCopyService`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Optional


SUPPORTED = ((0, 12), (0, 19))
VP_STAGE_SINCE = (0, 13)
PG_COLLECTION_SINCE = (0, 15)
ROPE_GET_EMB_SINCE = (0, 16)
GPTMODEL_DEPRECATED_SINCE = (0, 19)
DIST_CKPT_STRATEGY_BASE_REMOVED_IN = (0, 19)
DIST_CKPT_COMMON_IN_DISTCP_SINCE = (0, 19)
COMMON_STATE_SHARDED_KEY = "common_state"
RESHARD_TASK_ID_KWARG_SINCE = (0, 18)
RESHARD_EXECUTOR_CUDA_SYNC_SINCE = (0, 17)
RESHARDING_SINCE = (0, 16)


@functools.lru_cache(maxsize=1)
def mcore_version() -> tuple[int, int]:
    """(major, minor) of the installed megatron-core."""
    try:
        from megatron.core import __version__ as v
    except ImportError:  # very old layouts keep it in package_info
        from megatron.core.package_info import __version__ as v
    parts = str(v).split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def check_supported() -> Optional[str]:
    """A one-line warning when the installed version is outside the supported range, else None."""
    v = mcore_version()
    lo, hi = SUPPORTED
    if v < lo or v > hi:
        return (f"megatron-core {v[0]}.{v[1]} is outside verl-bridge's supported range "
                f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}; the bridge may fail in version-specific ways")
    return None


def gpt_model_kwargs(vp_stage: Optional[int] = None) -> dict:
    """``vp_stage=`` for GPTModel where it exists (>= 0.13), nothing before."""
    if vp_stage is None or mcore_version() < VP_STAGE_SINCE:
        return {}
    return {"vp_stage": vp_stage}


def default_pg_collection() -> Any:
    """megatron's ProcessGroupCollection of the current parallel_state (>= 0.15), else None."""
    if mcore_version() < PG_COLLECTION_SINCE:
        return None
    try:
        from megatron.core.process_groups_config import ProcessGroupCollection
    except ImportError:
        return None
    use = getattr(ProcessGroupCollection, "use_mpu_process_groups", None)
    return use() if use is not None else None


@functools.lru_cache(maxsize=1)
def gpt_model_class() -> type:
    """``megatron.core.models.gpt.GPTModel``; from 0.19 its deprecation notice is shown once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from megatron.core.models.gpt import GPTModel
    for w in caught:
        if mcore_version() >= GPTMODEL_DEPRECATED_SINCE and "GPTModel" in str(w.message):
            warnings.warn(f"{w.message} (verl-bridge keeps building GPTModel: your checkpoints' layout)",
                          FutureWarning, stacklevel=2)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return GPTModel


def torch_dist_save_strategy_base() -> type:
    """The class a synchronous torch_dist save strategy must subclass on this megatron-core.

    <= 0.18: ``dist_checkpointing.strategies.base.SaveShardedStrategy``. >= 0.19: that module is
    gone, and ``dist_checkpointing.save`` silently swaps any ``sharded_strategy`` that is not a
    ``TorchDistSaveShardedStrategy`` for the stock one (whose writer calls ``torch.cuda.synchronize``),
    so the subclass must be of ``TorchDistSaveShardedStrategy``.
    """
    if mcore_version() >= DIST_CKPT_STRATEGY_BASE_REMOVED_IN:
        from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

        return TorchDistSaveShardedStrategy
    from megatron.core.dist_checkpointing.strategies.base import SaveShardedStrategy

    return SaveShardedStrategy


def common_state_in_sharded_dict() -> bool:
    """Whether ``dist_checkpointing.save`` passes the common state to the strategy as the
    ``ShardedObject`` :data:`COMMON_STATE_SHARDED_KEY` (0.19 on) instead of writing ``common.pt``."""
    return mcore_version() >= DIST_CKPT_COMMON_IN_DISTCP_SINCE


def copy_service_init_kwargs(group: Any = None) -> dict:
    """Keyword arguments for ``megatron.core.resharding``'s ``CopyService.__init__``: ``group=``
    from 0.18 (which also passes ``task_id=`` to ``submit_send/submit_recv``), none before."""
    if mcore_version() >= RESHARD_TASK_ID_KWARG_SINCE:
        return {"group": group}
    return {}


def reshard_needs_cuda_sync() -> bool:
    """Whether ``megatron.core.resharding.execute_reshard_plan`` calls ``torch.cuda.synchronize()``
    unconditionally (0.17 on); on a machine without CUDA that call raises."""
    return mcore_version() >= RESHARD_EXECUTOR_CUDA_SYNC_SINCE
