"""The Megatron-LM-style example script through the bridge: parameter parity with the user's own
model after their load_checkpoint, and PPO from the example's ppo.yaml."""

import math
import sys
from pathlib import Path

from tests.dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_model_provider"
FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
         "--vocab-size", "16", "--make-vocab-size-divisible-by", "16", "--swiglu",
         "--untie-embeddings-and-output-weights"]


def _config(out, extra=()):
    from verl_bridge.config import load_config

    return load_config(str(EXAMPLE / "ppo.yaml"), [f"trainer.output_dir={out}", "trainer.progress_bar=false",
                                                   *extra])


def _parity_and_train(rank, world_size, root):
    import torch
    from megatron.core import parallel_state as mpu

    sys.path.insert(0, str(EXAMPLE))
    import train_megatron as script

    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.checkpoint.megatron import save
    from verl_bridge.runtime.trainer import MegatronTrainer

    ckpt = f"{root}/ckpt"
    out = {}
    # --- the user's own way: their initializer, their provider, a checkpoint, their loader
    sys.argv = ["train_megatron.py", *FLAGS, "--load", ckpt, "--seed", "11"]
    script.initialize_megatron()
    torch.manual_seed(123)
    saved = script.model_provider()
    save(ckpt, 7, {"model": saved, "optimizer": None, "opt_param_scheduler": None, "args": script.get_args()})
    user_model = script.model_provider()
    fresh = {k: v.clone() for k, v in user_model.state_dict().items() if torch.is_tensor(v)}
    assert script.load_checkpoint([user_model], None, None) == 7
    user_sd = {k: v for k, v in user_model.state_dict().items() if torch.is_tensor(v)}
    out["load_changed_weights"] = any(not torch.equal(fresh[k], user_sd[k]) for k in user_sd)
    mpu.destroy_model_parallel()

    # --- the bridge: same three functions as callables; its actor must hold exactly those tensors
    cfg = _config(f"{root}/parity")
    bridge = MegatronBridge(script.model_provider, script.initialize_megatron, script.load_checkpoint, config=cfg)
    bridge.initialize()
    out["reused_groups"] = bridge.reused_groups
    roles = bridge.build_roles()

    def compare(model):
        sd = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
        if set(sd) != set(user_sd):
            return f"keys differ: {sorted(set(sd) ^ set(user_sd))[:5]}"
        bad = [k for k in sd if sd[k].shape != user_sd[k].shape or not torch.equal(sd[k], user_sd[k])]
        return bad or len(sd)

    out["actor"] = compare(roles.actor)
    out["reference"] = compare(roles.reference)
    mpu.destroy_model_parallel()

    # --- no user loader: verl-bridge's own reader of the same checkpoint gives the same actor
    cfg2 = _config(f"{root}/own_reader", ["model.actor.args.load_checkpoint=null", f"model.actor.args.load_path={ckpt}"])
    b2 = MegatronBridge.from_config(cfg2)
    b2.initialize()
    out["own_reader"] = compare(b2.build_roles().actor)
    mpu.destroy_model_parallel()

    # --- PPO from the example's ppo.yaml (hooks named there as "train_megatron:...")
    history = MegatronTrainer(_config(f"{root}/run", ["trainer.total_steps=2", "trainer.log_every=1"])).train()
    out["history"] = history
    return out


def test_bridge_actor_equals_users_model_after_their_load_checkpoint(tmp_path):
    out = run_distributed(_parity_and_train, 1, str(tmp_path))[0]
    assert out["load_changed_weights"], "the checkpoint must hold different weights than a fresh build"
    assert out["reused_groups"] is True
    for role in ("actor", "reference", "own_reader"):
        assert isinstance(out[role], int) and out[role] > 10, (role, out[role])  # every tensor equal
    history = out["history"]
    assert [h["step"] for h in history] == [1, 2]
    for h in history:
        for k in ("actor_loss", "critic_loss", "reward_mean", "kl"):
            assert math.isfinite(h[k]), (k, h)


def test_save_init_writes_megatron_lm_legacy_layout(tmp_path):
    import subprocess

    r = subprocess.run([sys.executable, str(EXAMPLE / "train_megatron.py"), *FLAGS, "--save-init", "--save",
                        str(tmp_path / "c")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "c" / "latest_checkpointed_iteration.txt").read_text().strip() == "0"
    import torch

    state = torch.load(tmp_path / "c" / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)
    assert state["model"]["embedding.word_embeddings.weight"].shape == (16, 64)
    assert state["args"].hidden_size == 64 and state["args"].padded_vocab_size == 16
