"""Writing megatron-core's ``torch_dist`` layout on CPU.

megatron-core 0.16.1's (and 0.19.2's) default ``torch_dist`` save strategy (``TorchDistSaveShardedStrategy``)
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

from verl_bridge.compat.mcore_versions import (
    COMMON_STATE_SHARDED_KEY,
    common_state_in_sharded_dict,
    torch_dist_save_strategy_base,
)


class SyncTorchDistSaveStrategy(torch_dist_save_strategy_base()):
    """megatron-core's torch_dist layout, written synchronously (no CUDA call): a
    ``SaveShardedStrategy`` up to 0.18, a ``TorchDistSaveShardedStrategy`` from 0.19 (see
    :func:`verl_bridge.compat.mcore_versions.torch_dist_save_strategy_base`)."""

    def __init__(self, backend: str = "torch_dist", version: int = 1):
        super().__init__(backend, version)

    @property
    def can_handle_sharded_objects(self):
        return True  # ShardedObjects go into the .distcp files, as with the stock strategy

    def save(self, sharded_state_dict, checkpoint_dir: Path):
        import torch
        import torch.distributed.checkpoint as dcp
        from megatron.core.dist_checkpointing.strategies.torch import (
            MCoreSavePlanner,
            _replace_state_dict_keys_with_sharded_keys,
            mcore_to_pyt_state_dict,
        )

        if common_state_in_sharded_dict():  # >= 0.19: common.pt as on every other version (0.19 reads it)
            common = sharded_state_dict.pop(COMMON_STATE_SHARDED_KEY)
            if torch.distributed.get_rank() == 0:
                torch.save(common.data, Path(checkpoint_dir) / "common.pt")
        sharded_state_dict, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, True)
        pyt_state_dict = mcore_to_pyt_state_dict(sharded_state_dict, False)
        dcp.save(
            pyt_state_dict,
            storage_writer=dcp.FileSystemWriter(str(checkpoint_dir)),
            planner=MCoreSavePlanner(dedup_replicated_tensors=False, flatten_state_dict=False),
        )


def is_torch_dist_dir(path) -> bool:
    return (Path(path) / "metadata.json").is_file()
