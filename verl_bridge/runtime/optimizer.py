"""Optimizers for trainable roles.

On CUDA: megatron-core's ``get_megatron_optimizer`` over models wrapped in megatron's
``DistributedDataParallel`` (the distributed optimizer when ``trainer.args.use_distributed_optimizer``).
On CPU, megatron's DDP and optimizers allocate CUDA tensors, so :class:`TorchOptimizer` does the
same job with torch.optim.AdamW: DP gradient all-reduce, a TP/PP-aware global gradient norm
(megatron's rule: count a parameter once unless it is TP-sharded), clipping, and the step.
Both expose ``zero_grad()``, ``step() -> (ok, grad_norm)``, ``state_dict()``, ``load_state_dict()``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class TorchOptimizer:
    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, betas, eps: float,
                 clip_grad: float, warmup_steps: int = 0):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in self.params if p.dim() > 1]
        no_decay = [p for p in self.params if p.dim() <= 1]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=tuple(betas), eps=eps,
        )
        self.clip_grad = clip_grad
        self.base_lr = lr
        self.warmup_steps = warmup_steps
        self.num_steps = 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _reduce_dp(self) -> None:
        from verl_bridge.parallel import data_parallel_group, data_parallel_world_size

        dp = data_parallel_world_size()
        if dp == 1:
            return
        group = data_parallel_group()
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat /= dp
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def grad_norm(self) -> float:
        from megatron.core import parallel_state as mpu
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        sq = torch.zeros(1, dtype=torch.float64)
        for p in self.params:
            if p.grad is None:
                continue
            if param_is_not_tensor_parallel_duplicate(p):
                sq += p.grad.detach().double().pow(2).sum().cpu()
        if mpu.get_model_parallel_group() is not None and dist.get_world_size(mpu.get_model_parallel_group()) > 1:
            dist.all_reduce(sq, group=mpu.get_model_parallel_group())
        return math.sqrt(sq.item())

    def step(self) -> tuple[bool, float]:
        self._reduce_dp()
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
        self.optimizer.step()
        return True, norm

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "num_steps": self.num_steps}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_steps = state.get("num_steps", 0)


def build_optimizer(model: torch.nn.Module, optim_cfg) -> TorchOptimizer:
    return TorchOptimizer(
        model, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay, betas=optim_cfg.betas,
        eps=optim_cfg.eps, clip_grad=optim_cfg.clip_grad, warmup_steps=optim_cfg.warmup_steps,
    )
