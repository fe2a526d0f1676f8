"""Optimizers for trainable roles; :func:`build_optimizer` picks one by device.

One interface: ``module`` (what the forward/backward schedule must run: gradients are collected
through it), ``zero_grad()``, ``step() -> (ok, grad_norm)`` (``ok=False``: the step was skipped,
e.g. inf/nan gradients, and the parameters did not move), ``state_dict()``, ``load_state_dict()``.

* :class:`MegatronOptimizer` (CUDA, megatron models): megatron-core's ``DistributedDataParallel``
  (contiguous gradient buffers, DP reduce-scatter) + ``get_megatron_optimizer`` with the
  distributed optimizer (fp32 master weights and Adam state sharded over DP), as Megatron-LM's
  ``setup_model_and_optimizer``. The model config gets megatron's ``finalize_model_grads`` (DP,
  SP norms over TP, tied embeddings over PP), ``no_sync`` and the loss scaler, which megatron's
  schedules call.
* :class:`TorchOptimizer` (CPU, or a module that is not a megatron model): torch.optim.AdamW,
  :func:`~verl_bridge.runtime.grads.finalize_grads` (the same three reductions), a TP/PP-aware
  global gradient norm (megatron's rule: each parameter counted once), clipping, the step. With
  bf16/fp16 parameters it keeps fp32 master weights and fp32 Adam state (what megatron's
  ``Float16OptimizerWithFloat16Params`` does) and copies the result back into the model's
  parameters in place, so the rollout engine, which reads those tensors, sees every update.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class TorchOptimizer:
    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, betas, eps: float,
                 clip_grad: float, warmup_steps: int = 0, layout=None):
        self.model = self.module = model
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

        from verl_bridge.compat.moe import is_expert_param

        dev = self.params[0].device if self.params else torch.device("cpu")
        sq = torch.zeros(1, dtype=torch.float64, device=dev)
        sq_expert = torch.zeros(1, dtype=torch.float64, device=dev)
        has_experts = False
        for p in self.params:
            if p.grad is None or getattr(p, "shared", False):  # megatron's param_is_not_shared
                continue
            if is_expert_param(p):  # MoE experts: distinct on each EP rank, counted over the expert grid
                has_experts = True
                if param_is_not_tensor_parallel_duplicate(p):
                    sq_expert += p.grad.detach().double().pow(2).sum()
            elif param_is_not_tensor_parallel_duplicate(p):
                sq += p.grad.detach().double().pow(2).sum()
        if mpu.get_model_parallel_group() is not None and dist.get_world_size(mpu.get_model_parallel_group()) > 1:
            dist.all_reduce(sq, group=mpu.get_model_parallel_group())
        if has_experts:  # megatron's expert optimizer: the norm over expert TP x EP x PP
            group = mpu.get_expert_tensor_model_pipeline_parallel_group()
            if group is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(sq_expert, group=group)
            sq += sq_expert
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


def megatron_configs(model: torch.nn.Module, optim_cfg):
    """``(OptimizerConfig, DistributedDataParallelConfig)`` for ``optim.<role>`` and the model's precision.

    Adam with decoupled weight decay (AdamW; megatron exempts biases and norms, as
    :class:`TorchOptimizer` does), fp32 master weights and gradient reduction for bf16/fp16
    models, dynamic loss scaling for fp16, the distributed optimizer. ``clip_grad: 0`` turns
    clipping off (megatron's rule too).
    """
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from verl_bridge.compat import unwrap_model

    mcfg = unwrap_model(model).config
    bf16, fp16 = bool(getattr(mcfg, "bf16", False)), bool(getattr(mcfg, "fp16", False))
    opt = OptimizerConfig(
        optimizer="adam", lr=optim_cfg.lr, min_lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay,
        adam_beta1=float(optim_cfg.betas[0]), adam_beta2=float(optim_cfg.betas[1]), adam_eps=optim_cfg.eps,
        clip_grad=float(optim_cfg.clip_grad), bf16=bf16, fp16=fp16,
        params_dtype=getattr(mcfg, "params_dtype", torch.float32), use_distributed_optimizer=True,
    )
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=bf16 or fp16, overlap_grad_reduce=False,
                                        use_distributed_optimizer=True, check_for_nan_in_grad=False)
    return opt, ddp


def _leaves(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def load_param_state_dp_zero(leaf, param_state) -> None:
    """``leaf.load_parameter_state_from_dp_zero(param_state)`` with torch's Adam inside (no apex / TE).

    megatron-core 0.12-0.19 ``DistributedOptimizer._set_main_param_and_optimizer_states`` copies every
    tensor of the inner optimizer's per-parameter state from the checkpoint's tensors, which hold
    ``param``, ``exp_avg`` and ``exp_avg_sq`` only. torch's Adam also keeps ``step`` there as a
    tensor (apex's / TE's FusedAdam keep it in the param groups), so the load raises
    ``KeyError: 'step'`` (seen on the H200, megatron-core 0.19.2). The step tensors are held aside
    for the call and put back: megatron's ``load_state_dict`` has already set them from the param
    groups. Acts on this optimizer's state only.
    """
    inner = getattr(leaf, "optimizer", None)
    state = getattr(inner, "state", None)
    held = {}
    if isinstance(state, dict) or hasattr(state, "items"):
        for param, st in list(state.items()):
            if isinstance(st, dict) and isinstance(st.get("step"), torch.Tensor):
                held[param] = st.pop("step")
    try:
        leaf.load_parameter_state_from_dp_zero(param_state)
    finally:
        for param, step in held.items():
            state[param]["step"] = step


class MegatronOptimizer:
    """megatron-core DDP + distributed optimizer behind the :class:`TorchOptimizer` interface (CUDA).

    ``module`` is the DDP-wrapped model: the trainer runs megatron's schedule on it, and the
    schedule calls ``finalize_model_grads`` on it after the last micro-batch's backward. The
    wrapped model's parameters are the caller's (megatron re-points their storage into its
    contiguous buffer), so the rollout engine keeps reading the weights it was given, and the
    distributed optimizer all-gathers the updated shards into them at every step.
    """

    def __init__(self, model: torch.nn.Module, optim_cfg, warmup_steps: int = 0):
        from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
        from megatron.core.optimizer import get_megatron_optimizer

        from verl_bridge.compat import unwrap_model

        opt_cfg, ddp_cfg = megatron_configs(model, optim_cfg)
        mcfg = unwrap_model(model).config
        self.model = model
        self.module = DistributedDataParallel(config=mcfg, ddp_config=ddp_cfg, module=model)
        self.optimizer = get_megatron_optimizer(opt_cfg, [self.module])
        # what Megatron-LM's training.setup_model_and_optimizer / train() set for its schedules
        mcfg.no_sync_func = self.module.no_sync
        mcfg.finalize_model_grads_func = finalize_model_grads
        mcfg.grad_scale_func = self.optimizer.scale_loss
        self.fp16 = opt_cfg.fp16
        self.base_lr = optim_cfg.lr
        self.warmup_steps = warmup_steps
        self.num_steps = 0

    def zero_grad(self) -> None:
        self.module.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _grads_finite(self) -> bool:
        """Whether every rank's reduced gradient buffers are finite (one MAX all-reduce).

        megatron's optimizer only detects inf/nan with an fp16 loss scaler; for bf16/fp32 it would
        step with them. This check lets bf16/fp32 skip such a step too, as :class:`TorchOptimizer` does.
        """
        # megatron's DDP keeps its _ParamAndGradBuffers in these list attributes (0.12-0.19)
        lists = [getattr(self.module, name, None) for name in ("buffers", "expert_parallel_buffers")]
        buffers = [b for bufs in lists if isinstance(bufs, (list, tuple)) for b in bufs]
        bad = torch.zeros(1, device=torch.cuda.current_device())
        for b in buffers:
            bad = torch.maximum(bad, (~torch.isfinite(b.grad_data)).any().float())
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return bool(bad.item() == 0)

    def step(self) -> tuple[bool, float]:
        """Gradients are already finalized (megatron's schedule called ``finalize_model_grads``).
        ``(False, nan)`` and nothing moves when they are not finite (fp16: megatron's loss scaler
        decides, and lowers its scale)."""
        if not self.fp16 and not self._grads_finite():
            self.zero_grad()
            return False, float("nan")
        if self.warmup_steps:
            factor = min(1.0, (self.num_steps + 1) / self.warmup_steps)
            for g in self.optimizer.param_groups:
                g["lr"] = self.base_lr * factor
        ok, norm, _zeros = self.optimizer.step()
        if norm is None:  # clip_grad: 0 -> megatron does not compute it
            norm = self.optimizer.get_grad_norm() if ok else float("nan")
        if ok:
            self.num_steps += 1
        return bool(ok), float(norm)

    def state_dict(self) -> dict:
        """megatron's optimizer state plus the DP-sharded parameter state gathered to DP rank 0
        (``get_parameter_state_dp_zero``, a collective over DP: every DP rank must call it)."""
        param_state = [o.get_parameter_state_dp_zero() if hasattr(o, "get_parameter_state_dp_zero") else None
                       for o in _leaves(self.optimizer)]
        return {"megatron_optimizer": self.optimizer.state_dict(), "param_state": param_state,
                "num_steps": self.num_steps}

    def load_state_dict(self, state: dict) -> None:
        if "megatron_optimizer" not in state:
            raise ValueError("this checkpoint's optimizer state was written by the CPU optimizer (TorchOptimizer); "
                             "a CUDA run uses megatron's distributed optimizer and cannot resume it: "
                             "resume on the device that wrote it, or start with trainer.resume=never")
        self.optimizer.load_state_dict(state["megatron_optimizer"])
        for o, ps in zip(_leaves(self.optimizer), state.get("param_state") or []):
            if ps is not None:
                load_param_state_dp_zero(o, ps)
        self.num_steps = state.get("num_steps", 0)


def uses_megatron_optimizer(model: torch.nn.Module, layout=None) -> bool:
    """CUDA parameters and a megatron-core model (a ``TransformerConfig``): megatron's DDP + optimizer.

    Not when the role's DP group is not megatron's (roles on separate ranks, :mod:`verl_bridge.placement`:
    megatron's DP groups then span ranks that never train): :class:`TorchOptimizer` reduces over the
    role's own group.
    """
    from megatron.core import parallel_state as mpu
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.compat import unwrap_model
    from verl_bridge.distributed import data_parallel_group

    params = [p for p in model.parameters() if p.requires_grad]
    if not params or not params[0].is_cuda:
        return False
    group = layout.dp_group if layout is not None and layout.dp_group is not None else data_parallel_group()
    if group is not mpu.get_data_parallel_group():
        return False
    return isinstance(getattr(unwrap_model(model), "config", None), TransformerConfig)


def build_optimizer(model: torch.nn.Module, optim_cfg, layout=None):
    """:class:`MegatronOptimizer` for a megatron model on CUDA, else :class:`TorchOptimizer`."""
    if uses_megatron_optimizer(model, layout):
        return MegatronOptimizer(model, optim_cfg, warmup_steps=optim_cfg.warmup_steps)
    return TorchOptimizer(
        model, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay, betas=optim_cfg.betas,
        eps=optim_cfg.eps, clip_grad=optim_cfg.clip_grad, warmup_steps=optim_cfg.warmup_steps, layout=layout,
    )
