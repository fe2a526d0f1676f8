"""bf16 parameters train through fp32 master weights (updates below bf16 resolution are not lost)."""

import torch

from tests.dist_utils import run_distributed


def _tiny_updates_accumulate(rank, world_size):
    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.runtime.optimizer import TorchOptimizer

    init_model_parallel(1, 1)
    model = torch.nn.Linear(4, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = TorchOptimizer(model, lr=1e-4, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
    assert opt.mixed and all(m.dtype == torch.float32 for m in opt.masters)
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    for _ in range(100):
        opt.zero_grad()
        model(x).sum().backward()  # gradient +2 on every weight: Adam moves each by ~lr per step
        ok, norm = opt.step()
        assert ok and norm > 0
    # each step is 1e-4, far below bf16's spacing at 1.0 (2**-7): pure bf16 AdamW would never move
    assert abs(float(opt.masters[0][0, 0]) - (1.0 - 100 * 1e-4)) < 1e-4
    assert model.weight.dtype == torch.bfloat16
    assert torch.equal(model.weight, opt.masters[0].to(torch.bfloat16))
    assert float(model.weight[0, 0]) < 1.0
    # resume keeps the fp32 masters exactly
    state = opt.state_dict()
    other = TorchOptimizer(model, lr=1e-4, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
    other.load_state_dict(state)
    assert torch.equal(other.masters[0], opt.masters[0])


def test_bf16_params_use_fp32_masters():
    run_distributed(_tiny_updates_accumulate, 1)
