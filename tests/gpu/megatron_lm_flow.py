"""A Megatron-LM user's flow on one GPU, end to end through verl-bridge (issue 17's acceptance run).

    python tests/gpu/megatron_lm_flow.py --workdir /tmp/mlm_flow [--steps 3] [--json out.json]

Needs CUDA and Megatron-LM's ``megatron.training`` (megatron-core >= 0.17 wheels ship it; tested
with megatron-core 0.19.2, no Transformer Engine, no apex). Three fresh processes:

1. ``save``: Megatron-LM's own way. ``parse_and_validate_args()`` then ``initialize_megatron()``
   (Megatron-LM >= 0.19; <= 0.18 ``initialize_megatron()`` parses the flags itself), then
   ``get_model(model_provider, wrap_with_ddp=False)``: a local-spec GPT (``--transformer-impl
   local``, LayerNorm, learned absolute positions) that ``get_model`` wraps in ``Float16Module``
   for ``--bf16``. Megatron-LM's ``save_checkpoint`` writes it twice, ``--ckpt-format torch``
   (legacy) and ``torch_dist``; the exact tensors go to ``reference.pt`` for the check in 2.
2. ``rl --format torch`` and 3. ``rl --format torch_dist``: ``MegatronBridge(model_provider,
   initialize_megatron=initialize, load_checkpoint=...)``, where the loader is Megatron-LM's own
   ``load_checkpoint`` (``--load DIR --finetune``), wrapped only to compare what it loaded with
   ``reference.pt``; then GRPO from ``templates/grpo.yaml`` (its ``preset: tiny`` is cleared by
   the bridge) for ``--steps`` steps, one line per step with reward and loss.

``initialize``, ``model_provider`` and ``gpt_model`` are examples/megatron_lm/rl_gpt.py's (the script a
Megatron-LM user runs); see there for the version switch, the no-apex flags
(``--no-persist-layer-norm --no-masked-softmax-fusion --no-gradient-accumulation-fusion``) and the
wheel's missing dataset-helper Makefile.

What runs on CPU (tests/bridge/test_megatron_lm_flow.py): ``gpt_model``, :func:`run_grpo`,
:func:`compare_weights` and the config/bridge path; only ``megatron.training`` and CUDA are GPU-only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "templates" / "grpo.yaml"
FORMATS = ("torch", "torch_dist")  # Megatron-LM's --ckpt-format names: legacy, distributed

# The model: Megatron-LM flags for a small GPT of the local spec (no Transformer Engine).
MODEL_FLAGS = [
    "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute",
    "--transformer-impl", "local", "--bf16",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "16", "--make-vocab-size-divisible-by", "16",
    "--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-4", "--train-iters", "1",
    "--seed", "1234", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
]
NO_APEX_FLAGS = ["--no-persist-layer-norm", "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion"]


def megatron_argv(phase: str, workdir: str, fmt: str) -> list[str]:
    """The command line each phase gives Megatron-LM's parser."""
    ckpt = os.path.join(workdir, f"ckpt_{fmt}")
    if phase == "save":
        io = ["--save", ckpt, "--save-interval", "1000", "--ckpt-format", fmt]
    else:  # start RL from the pretrained checkpoint: weights only (--finetune: no optimizer, no RNG)
        io = ["--load", ckpt, "--ckpt-format", fmt, "--finetune", "--no-load-optim", "--no-load-rng"]
    return ["megatron_lm_flow.py", *MODEL_FLAGS, *NO_APEX_FLAGS, *io]


def grpo_overrides(workdir: str, fmt: str, steps: int, device: str = "cuda") -> list[str]:
    return [f"trainer.total_steps={steps}", "trainer.log_every=1", "trainer.progress_bar=false",
            f"trainer.output_dir={os.path.join(workdir, 'run_' + fmt)}", "trainer.precision=bf16",
            f"trainer.device={device}", "trainer.save_every=0"]


# The Megatron-LM side: initialize (>= 0.19 and <= 0.18), the local-spec model_provider and its
# GPTModel, from the example a Megatron-LM user runs (examples/megatron_lm/rl_gpt.py).
sys.path.insert(0, str(REPO / "examples" / "megatron_lm"))
from rl_gpt import gpt_model, initialize, model_provider  # noqa: E402,F401


# ---------------------------------------------------------------- checks and the GRPO run (CPU-testable)
def tensor_state(model) -> dict:
    """Parameter tensors by checkpoint key (``Float16Module`` / DDP unwrapped), on the CPU."""
    from verl_bridge.compat import unwrap_model

    sd = unwrap_model(model).state_dict()
    return {k: v.detach().cpu().clone() for k, v in sd.items() if hasattr(v, "dtype") and "_extra_state" not in k}


def compare_weights(model, reference: dict) -> dict:
    """What ``model`` holds against ``reference`` (``tensor_state`` of the saved model): exact or not."""
    import torch

    got = tensor_state(model)
    missing = sorted(set(reference) - set(got))
    diffs = {k: float((got[k].float() - reference[k].float()).abs().max()) for k in reference if k in got}
    dtypes = sorted({str(v.dtype).replace("torch.", "") for k, v in got.items() if v.is_floating_point()})
    same_dtype = all(got[k].dtype == reference[k].dtype for k in reference if k in got)
    return {"tensors": len(diffs), "missing": missing, "max_abs_diff": max(diffs.values(), default=float("nan")),
            "exact": not missing and all(torch.equal(got[k], reference[k]) for k in diffs),
            "same_dtypes": same_dtype, "dtypes": dtypes}


def run_grpo(bridge, template: str, overrides: list[str]) -> tuple[list[dict], object]:
    """GRPO through ``MegatronTrainer`` with the bridge; per-step reward/loss and the trainer."""
    from verl_bridge.runtime.trainer import MegatronTrainer

    trainer = MegatronTrainer(bridge.load_config(template, overrides), bridge=bridge)
    history = trainer.train()
    steps = [{"step": m["step"], "reward_mean": m["reward_mean"], "actor_loss": m["actor_loss"],
              "kl": m.get("kl"), "entropy": m.get("entropy")} for m in history if "reward_mean" in m]
    return steps, trainer


# ---------------------------------------------------------------- phases (GPU)
def phase_save(workdir: str) -> dict:
    import torch
    from megatron.training import get_args, get_model
    from megatron.training.checkpointing import save_checkpoint
    from megatron.training.utils.common_utils import update_use_dist_ckpt

    initialize()
    args = get_args()
    model = get_model(model_provider, wrap_with_ddp=False)
    inner = model[0].module
    out = {"wrapper": type(model[0]).__name__, "megatron_core": _mcore_version(),
           "padded_vocab_size": args.padded_vocab_size,
           "layernorm_dtype": str(inner.decoder.layers[0].input_layernorm.weight.dtype),
           "position_embedding_dtype": str(inner.embedding.position_embeddings.weight.dtype),
           "layernorm_class": type(inner.decoder.layers[0].input_layernorm).__name__}
    torch.save(tensor_state(model[0]), os.path.join(workdir, "reference.pt"))
    iteration = 10
    for fmt in FORMATS:  # the same model in both of Megatron-LM's formats
        args.ckpt_format = fmt
        update_use_dist_ckpt(args)
        args.save = os.path.join(workdir, f"ckpt_{fmt}")
        save_checkpoint(iteration, model, None, None, num_floating_point_operations_so_far=0)
        out[f"saved_{fmt}"] = sorted(os.path.relpath(os.path.join(d, n), args.save)
                                     for d, _, names in os.walk(args.save) for n in names)
    from megatron.training.async_utils import maybe_finalize_async_save

    maybe_finalize_async_save(blocking=True, terminate=True)  # as pretrain() ends: no save worker left
    torch.distributed.barrier()
    return out


def phase_rl(workdir: str, fmt: str, steps: int) -> dict:
    import torch
    from megatron.training.checkpointing import load_checkpoint as megatron_load_checkpoint

    from verl_bridge import MegatronBridge

    reference = torch.load(os.path.join(workdir, "reference.pt"))
    loaded: dict = {}

    def load_checkpoint(model, optimizer, opt_param_scheduler):
        """Megatron-LM's own loader; the wrapper only records what it loaded."""
        iteration = megatron_load_checkpoint(model, optimizer, opt_param_scheduler)
        if isinstance(iteration, tuple):
            iteration = iteration[0]
        if not loaded:  # the actor (the reference model copies the actor's weights)
            loaded.update(iteration=iteration, **compare_weights(model[0], reference))
        return iteration

    bridge = MegatronBridge(model_provider, initialize_megatron=initialize, load_checkpoint=load_checkpoint)
    t0 = time.time()
    steps_out, trainer = run_grpo(bridge, str(TEMPLATE), grpo_overrides(workdir, fmt, steps))
    actor = trainer.roles.actor
    return {"format": fmt, "loaded": loaded, "steps": steps_out, "seconds": round(time.time() - t0, 1),
            "reused_megatron_groups": bridge.reused_groups, "decode_path": trainer.engine.path,
            "actor_dtypes": sorted({str(p.dtype) for p in actor.parameters()}),
            "actor_layernorm_dtype": str(actor.decoder.layers[0].input_layernorm.weight.dtype)}


def _mcore_version() -> str:
    try:
        from importlib.metadata import version

        return version("megatron-core")
    except Exception:  # noqa: BLE001
        return "unknown"


def _child(phase: str, workdir: str, fmt: str, steps: int, result_file: str) -> int:
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    sys.argv = megatron_argv(phase, workdir, fmt)
    result = phase_save(workdir) if phase == "save" else phase_rl(workdir, fmt, steps)
    with open(result_file, "w") as f:
        json.dump(result, f, indent=1, default=str)
    import torch

    torch.distributed.destroy_process_group()
    return 0


def _run_child(args, phase: str, fmt: str) -> dict:
    result_file = os.path.join(args.workdir, f"result_{phase}_{fmt}.json")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, "--child", phase, "--format", fmt, "--workdir", args.workdir,
           "--steps", str(args.steps), "--result", result_file]
    print(f"=== {phase} {fmt if phase == 'rl' else ''}: {' '.join(megatron_argv(phase, args.workdir, fmt)[1:])}",
          flush=True)
    t0 = time.time()
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise SystemExit(f"{phase} {fmt}: the child process exited {rc}")
    with open(result_file) as f:
        out = json.load(f)
    out["wall_s"] = round(time.time() - t0, 1)
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/megatron_lm_flow")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default=None, help="write the summary here")
    p.add_argument("--child", choices=("save", "rl"), help=argparse.SUPPRESS)
    p.add_argument("--format", default="torch", choices=FORMATS, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    if args.child:
        return _child(args.child, args.workdir, args.format, args.steps, args.result)
    summary = {"save": _run_child(args, "save", "torch")}
    print(json.dumps(summary["save"], default=str), flush=True)
    ok = True
    for fmt in FORMATS:
        r = _run_child(args, "rl", fmt)
        summary[fmt] = r
        print(f"--- {fmt}: Megatron-LM load_checkpoint -> iteration {r['loaded'].get('iteration')}, "
              f"{r['loaded'].get('tensors')} tensors, exact={r['loaded'].get('exact')}, "
              f"max|diff|={r['loaded'].get('max_abs_diff')}, dtypes={r['loaded'].get('dtypes')}; "
              f"actor {r['actor_dtypes']}, decode={r['decode_path']}, reused groups={r['reused_megatron_groups']}")
        for s in r["steps"]:
            print(f"    [{fmt}] GRPO step {s['step']}: reward={s['reward_mean']:.4f} loss={s['actor_loss']:.4f} "
                  f"kl={s['kl']:.5f} entropy={s['entropy']:.4f}")
        ok = ok and bool(r["loaded"].get("exact")) and len(r["steps"]) == args.steps
    # the example as a user runs it: Megatron-LM flags + --rl-config, from the torch_dist checkpoint
    example = [sys.executable, str(REPO / "examples" / "megatron_lm" / "rl_gpt.py"), "--rl-config", str(TEMPLATE),
               *[f"--rl-set={o}" for o in grpo_overrides(args.workdir, "example", 1)],
               *megatron_argv("rl", args.workdir, "torch_dist")[1:]]
    print(f"=== examples/megatron_lm/rl_gpt.py: {' '.join(example[2:])}", flush=True)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    summary["example_rc"] = subprocess.run(example, env=env).returncode
    metrics = os.path.join(args.workdir, "run_example", "metrics.jsonl")
    summary["example_steps"] = sum(1 for _ in open(metrics)) if os.path.exists(metrics) else 0
    print(f"--- example: exit {summary['example_rc']}, {summary['example_steps']} step(s) in {metrics}")
    ok = ok and summary["example_rc"] == 0 and summary["example_steps"] == 1
    summary["ok"] = ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print("OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
