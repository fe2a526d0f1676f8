"""The CUDA optimizer path (megatron DDP + distributed optimizer), checked as far as a CPU allows.

megatron-core's ``DistributedDataParallel`` allocates its gradient buffers with
``torch.cuda.current_device()``, so ``MegatronOptimizer`` itself can only be built on a GPU (the
GPU script of issue #17 runs it). Here: the megatron symbols it uses import from the installed
megatron-core, the configs it builds from ``optim.<role>`` and the model's precision, the
device rule of ``build_optimizer``, and that the CPU optimizer exposes the same interface.
"""

import pytest
import torch

from tests.dist_utils import run_distributed


def test_megatron_symbols_used_on_cuda_import():
    from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer

    from verl_bridge.runtime.optimizer import MegatronOptimizer

    assert callable(finalize_model_grads) and callable(get_megatron_optimizer)
    for name in ("zero_grad_buffer", "no_sync", "finish_grad_sync"):
        assert hasattr(DistributedDataParallel, name), name
    for name in ("zero_grad", "step", "state_dict", "load_state_dict"):
        assert callable(getattr(MegatronOptimizer, name)), name


def _configs(rank, world_size, precision):
    from megatron.core import parallel_state as mpu

    from verl_bridge.config.schema import OptimRole
    from verl_bridge.models.tiny import precision_kwargs
    from verl_bridge.runtime.optimizer import build_optimizer, megatron_configs, uses_megatron_optimizer
    from tests.runtime.gpt_factory import build_gpt

    mpu.initialize_model_parallel(1, 1)
    model = build_gpt(1)
    if precision != "fp32":
        for k, v in precision_kwargs(precision).items():
            setattr(model.config, k, v)
    role = OptimRole(lr=3e-6, clip_grad=0.5, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-7, warmup_steps=4)
    opt, ddp = megatron_configs(model, role)
    cpu_opt = build_optimizer(model, role)
    return {
        "lr": opt.lr, "wd": opt.weight_decay, "betas": (opt.adam_beta1, opt.adam_beta2), "eps": opt.adam_eps,
        "clip": opt.clip_grad, "bf16": opt.bf16, "fp16": opt.fp16, "params_dtype": str(opt.params_dtype),
        "dist_opt": opt.use_distributed_optimizer and ddp.use_distributed_optimizer,
        "fp32_reduce": ddp.grad_reduce_in_fp32, "overlap": ddp.overlap_grad_reduce,
        "cpu_uses_megatron": uses_megatron_optimizer(model), "cpu_optimizer": type(cpu_opt).__name__,
        "module_is_model": cpu_opt.module is model,
    }


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_megatron_configs_follow_the_role_and_model_precision(precision):
    got = run_distributed(_configs, 1, precision)[0]
    assert got["lr"] == 3e-6 and got["wd"] == 0.1 and got["betas"] == (0.8, 0.95) and got["eps"] == 1e-7
    assert got["clip"] == 0.5 and got["dist_opt"] and not got["overlap"]
    assert got["bf16"] == (precision == "bf16") and not got["fp16"]
    assert got["fp32_reduce"] == (precision == "bf16")
    assert got["params_dtype"] == ("torch.bfloat16" if precision == "bf16" else "torch.float32")
    # on this CPU machine build_optimizer keeps the CPU optimizer, whose module is the model itself
    assert not got["cpu_uses_megatron"] and got["cpu_optimizer"] == "TorchOptimizer" and got["module_is_model"]


def _non_finite_step(rank, world_size):
    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.runtime.optimizer import TorchOptimizer

    init_model_parallel(1, 1)
    model = torch.nn.Linear(3, 1)
    before = [p.detach().clone() for p in model.parameters()]
    opt = TorchOptimizer(model, lr=1e-1, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=1.0)
    model(torch.tensor([[1.0, float("inf"), 0.0]])).sum().backward()
    ok, norm = opt.step()
    unchanged = all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    return ok, norm, unchanged, opt.num_steps


def test_torch_optimizer_skips_non_finite_steps_without_moving():
    ok, norm, unchanged, steps = run_distributed(_non_finite_step, 1)[0]
    assert not ok and not (norm < float("inf")) and unchanged and steps == 0


class _DistOptLeaf:
    """The parts of megatron's DistributedOptimizer (CUDA-only to build) that its real
    ``_set_main_param_and_optimizer_states`` reads; ``load_parameter_state_from_dp_zero`` hands it
    one parameter's checkpoint tensors, as megatron's does after its scatter over DP."""

    def __init__(self, model_param, torch_optimizer):
        from megatron.core.optimizer import OptimizerConfig

        self.optimizer = torch_optimizer
        self.config = OptimizerConfig()
        self.model_param_group_index_map = {model_param: (0, 0)}
        self.model_param = model_param

    @torch.no_grad()  # as megatron's load_parameter_state_from_dp_zero
    def load_parameter_state_from_dp_zero(self, tensors):
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        DistributedOptimizer._set_main_param_and_optimizer_states(self, self.model_param, tensors)


def test_param_state_load_holds_torch_adams_step_aside():
    from verl_bridge.runtime.optimizer import load_param_state_dp_zero

    model_param, main_param = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    adam = torch.optim.Adam([main_param])
    main_param.grad = torch.ones(4)
    adam.step()  # torch's Adam state: step (a tensor), exp_avg, exp_avg_sq
    leaf = _DistOptLeaf(model_param, adam)
    saved = {"param": torch.full((4,), 2.0), "exp_avg": torch.full((4,), 3.0), "exp_avg_sq": torch.full((4,), 4.0)}
    with pytest.raises(KeyError, match="step"):  # megatron's own load, as it fails on the H200
        leaf.load_parameter_state_from_dp_zero(saved)
    step = adam.state[main_param]["step"]
    load_param_state_dp_zero(leaf, saved)
    assert torch.equal(main_param.detach(), saved["param"])
    assert torch.equal(adam.state[main_param]["exp_avg"], saved["exp_avg"])
    assert torch.equal(adam.state[main_param]["exp_avg_sq"], saved["exp_avg_sq"])
    assert adam.state[main_param]["step"] is step and float(step) == 1.0
