"""Writing megatron-core's ``torch_dist`` layout on CPU.

megatron-core 0.16.1's default ``torch_dist`` save strategy (``TorchDistSaveShardedStrategy``)
always goes through its async machinery: ``FileSystemWriterAsync.preload_tensors`` calls
``torch.cuda.synchronize()`` and ``save_state_dict_async_finalize`` broadcasts a CUDA tensor, so
it fails on a CPU-only machine.

Path taken here: :class:`SyncTorchDistSaveStrategy`, a ``SaveShardedStrategy`` registered under
the same backend name and version (``torch_dist``, 1). It reuses megatron-core's own pieces
for everything that defines the layout -- ``_replace_state_dict_keys_with_sharded_keys``,
``mcore_to_pyt_state_dict`` (ShardedTensor / ShardedObject translation) and ``MCoreSavePlanner``
-- and writes with ``torch.distributed.checkpoint.save`` and the synchronous
``FileSystemWriter`` instead of the async writer. It is passed as ``sharded_strategy`` to the
unmodified ``megatron.core.dist_checkpointing.save``, which still writes ``common.pt`` and
``metadata.json`` (``{"sharded_backend": "torch_dist", ...}``). The result is read by the stock
``dist_checkpointing.load`` (``TorchDistLoadShardedStrategy``), i.e. by Megatron-LM. On CUDA
the same strategy works; Megatron-LM's own async strategy can be used there too.
"""

from __future__ import annotations

from pathlib import Path

try:  # megatron-core <= 0.16 (the CPU machines); 0.19 removed strategies.base
    from megatron.core.dist_checkpointing.strategies.base import SaveShardedStrategy
except ImportError:  # pragma: no cover - exercised on the GPU machine (megatron-core 0.19.2)
    SaveShardedStrategy = None


class _Unavailable:
    def __init__(self, *_, **__):
        import megatron.core

        raise RuntimeError(
            "checkpoint_format=torch_dist: verl-bridge's synchronous torch_dist writer is built on "
            "megatron.core.dist_checkpointing.strategies.base, which megatron-core "
            f"{getattr(megatron.core, '__version__', '?')} does not have (it exists up to 0.16). "
            "Use trainer.checkpoint_format=legacy with this megatron-core, or megatron-core <= 0.16.")


class SyncTorchDistSaveStrategy(SaveShardedStrategy or _Unavailable):
    def __init__(self, backend: str = "torch_dist", version: int = 1):
        super().__init__(backend, version)

    @property
    def can_handle_sharded_objects(self):
        return True  # ShardedObjects go into the .distcp files, as with the stock strategy

    def save(self, sharded_state_dict, checkpoint_dir: Path):
        import torch.distributed.checkpoint as dcp
        from megatron.core.dist_checkpointing.strategies.torch import (
            MCoreSavePlanner,
            _replace_state_dict_keys_with_sharded_keys,
            mcore_to_pyt_state_dict,
        )

        sharded_state_dict, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, True)
        pyt_state_dict = mcore_to_pyt_state_dict(sharded_state_dict, False)
        dcp.save(
            pyt_state_dict,
            storage_writer=dcp.FileSystemWriter(str(checkpoint_dir)),
            planner=MCoreSavePlanner(dedup_replicated_tensors=False, flatten_state_dict=False),
        )


def is_torch_dist_dir(path) -> bool:
    return (Path(path) / "metadata.json").is_file()
