"""Optimizers for trainable roles.

:class:`TorchOptimizer` runs on CPU and CUDA: torch.optim.AdamW (fused on CUDA), DP gradient
all-reduce, a TP/PP-aware global gradient norm (megatron's rule: count a parameter once unless it
is TP-sharded) computed on the device with one host sync, clipping, and the step. With bf16/fp16
parameters it keeps fp32 master weights and fp32 Adam state (what megatron's
``Float16OptimizerWithFloat16Params`` does) and copies the result back into the model's
parameters in place, so the rollout engine, which reads those tensors, sees every update.

Not wired yet: megatron-core's ``DistributedDataParallel`` + distributed optimizer (optimizer state
sharded over DP). On one GPU it would change nothing; for multi-GPU memory it is the next step.
Interface: ``zero_grad()``, ``step() -> (ok, grad_norm)``, ``state_dict()``, ``load_state_dict()``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class TorchOptimizer:
    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, betas, eps: float,
                 clip_grad: float, warmup_steps: int = 0, layout=None):
        self.model = model
        self.layout = layout  # a ParallelLayout: its DP group averages the gradients (None: megatron's)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # bf16 / fp16 parameters: optimise fp32 master copies, write the result back in place
        self.mixed = any(p.dtype in (torch.bfloat16, torch.float16) for p in self.params)
        self.masters = ([p.detach().float().clone() for p in self.params] if self.mixed else self.params)
        decay = [m for p, m in zip(self.params, self.masters) if p.dim() > 1]
        no_decay = [m for p, m in zip(self.params, self.masters) if p.dim() <= 1]
        on_cuda = bool(self.params) and self.params[0].is_cuda
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=tuple(betas), eps=eps, **({"fused": True} if on_cuda else {}),
        )
        self.clip_grad = clip_grad
        self.base_lr = lr
        self.warmup_steps = warmup_steps
        self.num_steps = 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.mixed:
            for p in self.params:
                p.grad = None

    def _dp(self):
        """``(dp_size, dp_group)``: the layout's (a placement's role group), else megatron's current one."""
        if self.layout is not None:
            return self.layout.dp_size, self.layout.dp_group
        from verl_bridge.distributed import data_parallel_group, data_parallel_world_size

        return data_parallel_world_size(), data_parallel_group()

    def grad_norm(self) -> float:
        """Global L2 norm over TP and PP: megatron's rule, each parameter counted once (TP-sharded
        ones on every TP rank, replicated ones on TP rank 0, the tied embedding on the first stage)."""
        from megatron.core import parallel_state as mpu
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        dev = self.params[0].device if self.params else torch.device("cpu")
        sq = torch.zeros(1, dtype=torch.float64, device=dev)
        for p in self.params:
            if p.grad is None or getattr(p, "shared", False):  # megatron's param_is_not_shared
                continue
            if param_is_not_tensor_parallel_duplicate(p):
                sq += p.grad.detach().double().pow(2).sum()
        if mpu.get_model_parallel_group() is not None and dist.get_world_size(mpu.get_model_parallel_group()) > 1:
            dist.all_reduce(sq, group=mpu.get_model_parallel_group())
        return math.sqrt(sq.item())

    def step(self) -> tuple[bool, float]:
        """Finalize gradients (:func:`~verl_bridge.runtime.grads.finalize_grads`: DP average, SP norms
        over TP, tied embeddings over PP), clip, step. ``(False, norm)`` and no update when the
        norm is not finite (inf / nan gradients): the caller counts the skipped step."""
        from verl_bridge.runtime.grads import finalize_grads

        dp, group = self._dp()
        finalize_grads(self.model, self.params, dp_size=dp, dp_group=group)
        norm = self.grad_norm()
        if not math.isfinite(norm):
            self.zero_grad()
            return False, norm
        if self.clip_grad and norm > self.clip_grad:
            scale = self.clip_grad / (norm + 1e-6)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
        self.num_steps += 1
        if self.warmup_steps:
            factor = min(1.0, self.num_steps / self.warmup_steps)
            for g in self.optimizer.param_groups:
                g["lr"] = self.base_lr * factor
        if self.mixed:
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.detach().float()
        self.optimizer.step()
        if self.mixed:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)
        return True, norm

    def state_dict(self) -> dict:
        out = {"optimizer": self.optimizer.state_dict(), "num_steps": self.num_steps}
        if self.mixed:
            out["fp32_masters"] = [m.detach().clone() for m in self.masters]
        return out

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_steps = state.get("num_steps", 0)
        if self.mixed:
            with torch.no_grad():
                for m, p, saved in zip(self.masters, self.params, state.get("fp32_masters") or [None] * len(self.masters)):
                    m.copy_(saved if saved is not None else p.float())


def build_optimizer(model: torch.nn.Module, optim_cfg, layout=None) -> TorchOptimizer:
    return TorchOptimizer(
        model, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay, betas=optim_cfg.betas,
        eps=optim_cfg.eps, clip_grad=optim_cfg.clip_grad, warmup_steps=optim_cfg.warmup_steps, layout=layout,
    )
