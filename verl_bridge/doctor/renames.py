"""megatron names that moved, were renamed or removed between releases (megatron-core 0.8 -> 0.19).

Data only: ``old`` is the full dotted name user code refers to, ``new`` its replacement (None
when there is none), ``changed`` the release that renamed or deprecated it and ``removed`` the
release from which the old name is gone (None: still present as a deprecated alias in the
releases we checked). ``KEYWORDS`` are renamed keyword arguments, matched on any call.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rename:
    old: str
    new: str | None
    changed: str
    removed: str | None = None
    note: str = ""
    package: str = "megatron-core"

    def when(self) -> str:
        text = f"renamed in {self.package} {self.changed}" if self.new else f"removed in {self.package} {self.changed}"
        if self.new and self.removed:
            text += f", old name removed in {self.removed}"
        return text

    def describe(self) -> str:
        target = f"-> {self.new}" if self.new else "(no replacement)"
        extra = f"; {self.note}" if self.note else ""
        return f"{self.old} {target}: {self.when()}{extra}"


PS = "megatron.core.parallel_state"

RENAMES: tuple[Rename, ...] = (
    # Expert-parallel refactor (expert tensor parallelism), megatron-core 0.10.
    Rename(f"{PS}.get_data_modulo_expert_parallel_group", f"{PS}.get_expert_data_parallel_group", "0.10",
           note="the old name is a deprecated alias that warns"),
    Rename(f"{PS}.get_data_modulo_expert_parallel_rank", f"{PS}.get_expert_data_parallel_rank", "0.10", "0.10"),
    Rename(f"{PS}.get_data_modulo_expert_parallel_world_size", f"{PS}.get_expert_data_parallel_world_size", "0.10", "0.10"),
    Rename(f"{PS}.get_tensor_and_expert_parallel_group", f"{PS}.get_expert_tensor_and_model_parallel_group", "0.10", "0.10"),
    Rename(f"{PS}.get_tensor_and_expert_parallel_rank", f"{PS}.get_expert_tensor_and_model_parallel_rank", "0.10", "0.10"),
    Rename(f"{PS}.get_tensor_and_expert_parallel_world_size", f"{PS}.get_expert_tensor_and_model_parallel_world_size", "0.10", "0.10"),
    # Transformer Engine wrappers moved out of transformer/, megatron-core 0.9 (old module warns).
    Rename("megatron.core.transformer.custom_layers.transformer_engine", "megatron.core.extensions.transformer_engine", "0.9",
           note="the old module only re-exports with a DeprecationWarning"),
    # Explicit process groups: ModelCommProcessGroups / model_comm_pgs became ProcessGroupCollection / pg_collection.
    Rename("megatron.core.process_groups_config.ModelCommProcessGroups",
           "megatron.core.process_groups_config.ProcessGroupCollection", "0.15", "0.15"),  # the wheels: 0.14.0 has only the old name
    # Megatron-LM (not the megatron-core wheel): training code moved under megatron.training (core_r0.6.0).
    Rename("megatron.get_args", "megatron.training.get_args", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.get_timers", "megatron.training.get_timers", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.get_tokenizer", "megatron.training.get_tokenizer", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.print_rank_0", "megatron.training.utils.print_rank_0", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.arguments", "megatron.training.arguments", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.initialize", "megatron.training.initialize", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.checkpointing", "megatron.training.checkpointing", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.global_vars", "megatron.training.global_vars", "0.6", "0.6", package="Megatron-LM"),
    Rename("megatron.core.tensor_parallel.layers.linear_with_grad_accumulation_and_async_allreduce",
           "megatron.core.tensor_parallel.layers.linear_with_grad_accumulation_and_async_allreduce", "0.8",
           note="keyword async_grad_allreduce became allreduce_dgrad"),
)

KEYWORDS: dict[str, Rename] = {
    "model_comm_pgs": Rename("model_comm_pgs", "pg_collection", "0.14", "0.14",
                             note="keyword argument of GPTModel, TransformerBlock and the layer builders"),
    "async_grad_allreduce": Rename("async_grad_allreduce", "allreduce_dgrad", "0.8", "0.8",
                                   note="keyword of linear_with_grad_accumulation_and_async_allreduce"),
}

_BY_OLD = {r.old: r for r in RENAMES if r.old != r.new}


def lookup(dotted: str) -> Rename | None:
    """The rename entry for ``dotted`` or for the module it lives in."""
    if dotted in _BY_OLD:
        return _BY_OLD[dotted]
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        hit = _BY_OLD.get(".".join(parts[:i]))
        if hit:
            return hit
    return None


def lookup_name(name: str) -> Rename | None:
    """The entry whose last component is ``name`` (for messages that give no module)."""
    for r in RENAMES:
        if r.old != r.new and r.old.rsplit(".", 1)[-1] == name:
            return r
    return KEYWORDS.get(name)
