"""Checkpoints cross the verl-bridge / Megatron-LM boundary in both directions.

The "Megatron-LM side" here is written with torch and megatron.core only, following
Megatron-LM's ``checkpointing.py``: ``read_metadata`` (tracker file), ``get_checkpoint_name``
(``iter_%07d/mp_rank_%02d``), ``torch.load`` of ``model_optim_rng.pt``, ``checkpoint_version``
check, ``model.load_state_dict(state_dict['model'], strict=True)``, RNG restore; and for
torch_dist ``dist_checkpointing.load_common_state_dict`` + ``dist_checkpointing.load`` with the
model's sharded state dict and the ``rng_state`` ShardedObject.
"""

import argparse
import os
import random

import numpy as np
import pytest
import torch

from tests.arch.tiny_hf import make_tiny_hf


@pytest.fixture(scope="module")
def parallel():
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    yield


def _verl_state(model, hf_dir):
    from transformers import AutoConfig

    from verl_bridge.checkpoint.hf import make_args
    from verl_bridge.checkpoint.megatron import capture_rng_state

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(0, 100, (1, 6)), torch.arange(6)[None], None).sum().backward()
    opt.step()
    args = make_args(AutoConfig.from_pretrained(str(hf_dir)), "llama", 1, 1, 128)
    return {"model": model, "optimizer": opt.state_dict(), "opt_param_scheduler": {"num_steps": 3},
            "rng_state": capture_rng_state(), "args": args, "checkpoint_version": 3.0,
            "kl_controller": {"coef": 0.05}}


def _megatron_lm_load_legacy(load_dir, model):
    """Megatron-LM's load_checkpoint path for a legacy checkpoint, torch + megatron.core only."""
    with open(os.path.join(load_dir, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    name = os.path.join(load_dir, "iter_{:07d}".format(iteration), "mp_rank_00", "model_optim_rng.pt")
    state_dict = torch.load(name, map_location="cpu", weights_only=False)
    assert state_dict["checkpoint_version"] == 3.0
    assert state_dict["args"].tensor_model_parallel_size == 1
    model.load_state_dict(state_dict["model"], strict=True)
    rng = state_dict["rng_state"][0]
    random.setstate(rng["random_rng_state"])
    np.random.set_state(rng["np_rng_state"])
    torch.set_rng_state(rng["torch_rng_state"])
    return state_dict, iteration


@pytest.mark.parametrize("fmt", ["legacy", "torch_dist"])
def test_megatron_lm_loads_verl_bridge_checkpoint(fmt, tmp_path, parallel):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.checkpoint.megatron import save

    make_tiny_hf("llama", tmp_path / "hf")
    src = hf_model_provider(tmp_path / "hf")(True, True)
    state = _verl_state(src, tmp_path / "hf")
    save(tmp_path / "ckpt", 12, state, fmt=fmt)
    dst = hf_model_provider(tmp_path / "hf", load_weights=False)(True, True)
    assert not all(torch.equal(a, b) for a, b in zip(src.parameters(), dst.parameters()))
    if fmt == "legacy":
        loaded, iteration = _megatron_lm_load_legacy(str(tmp_path / "ckpt"), dst)
        assert loaded["optimizer"]["param_groups"][0]["lr"] == 1e-3
    else:
        d = str(tmp_path / "ckpt" / "iter_0000012")
        # torch >= 2.6 loads weights_only; Megatron-LM allowlists Namespace and numpy RNG state
        allow = [argparse.Namespace, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                 np.core.multiarray._reconstruct]
        with torch.serialization.safe_globals(allow):
            common = dist_checkpointing.load_common_state_dict(d)
            assert common["args"].num_layers == 2 and common["checkpoint_version"] == 3.0
            loaded = dist_checkpointing.load(
                {"model": dst.sharded_state_dict(),
                 "rng_state": ShardedObject("rng_state", None, (1, 1), (0, 0), replica_id=0)}, d)
        dst.load_state_dict(loaded["model"], strict=True)
        iteration = loaded["iteration"]
        assert torch.equal(loaded["rng_state"][0]["torch_rng_state"], state["rng_state"][0]["torch_rng_state"])
    assert iteration == 12
    for (n, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        if torch.is_tensor(a):
            assert torch.equal(a, b), n


def test_megatron_lm_written_checkpoint_loads_into_verl_bridge(tmp_path, parallel):
    """A checkpoint laid out exactly as Megatron-LM's save_checkpoint writes it (legacy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.checkpoint.hf import export_hf, make_args
    from verl_bridge.checkpoint.megatron import load

    hf_model = make_tiny_hf("llama", tmp_path / "hf")
    model = hf_model_provider(tmp_path / "hf")(True, True)
    args = make_args(AutoConfig.from_pretrained(str(tmp_path / "hf")), "llama", 1, 1, 128)
    del args.hf_activation, args.vocab_size  # Megatron-LM knows neither
    rng_state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                  "torch_rng_state": torch.get_rng_state()}]
    state_dict = {"args": args, "checkpoint_version": 3.0, "iteration": 40,
                  "model": model.state_dict_for_save_checkpoint(),
                  "optimizer": torch.optim.SGD(model.parameters(), lr=0.1).state_dict(),
                  "opt_param_scheduler": {"max_lr": 0.1, "num_steps": 40}, "rng_state": rng_state,
                  "num_floating_point_operations_so_far": 0}
    path = tmp_path / "mlm" / "iter_0000040" / "mp_rank_00" / "model_optim_rng.pt"
    path.parent.mkdir(parents=True)
    torch.save(state_dict, path)
    (tmp_path / "mlm" / "latest_checkpointed_iteration.txt").write_text("40")

    fresh = hf_model_provider(tmp_path / "hf", load_weights=False)(True, True)
    state = load(tmp_path / "mlm", model=fresh)  # safe loading: Namespace + numpy RNG allowlisted
    assert state["iteration"] == 40 and state["opt_param_scheduler"]["num_steps"] == 40
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    # and on to HF: config.json synthesised from args (no verl-bridge metadata in this file)
    export_hf(tmp_path / "mlm", tmp_path / "back", vocab_size=100)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    tokens = torch.randint(0, 100, (1, 9))
    with torch.no_grad():
        assert (back(input_ids=tokens).logits - hf_model(input_ids=tokens).logits).abs().max() <= 1e-5
