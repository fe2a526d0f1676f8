"""End-to-end GRPO step: verl-bridge's MegatronTrainer vs TRL's GRPOTrainer, same model and batch.

Model: Qwen2-0.5B's shape, random weights, bf16, saved once as a local HF directory with a
word-level tokenizer (no downloads). Batch: 16 prompts x 4 generations = 64 sequences, prompt 128
tokens, up to 256 new tokens, temperature 1, no KL (no reference model on either side), one
optimizer step per batch, lr 1e-6; ours forms its micro-batches by a token budget that holds the
whole batch (``trainer.args.use_dynamic_bsz``; TRL's side runs the 64 sequences in one pass too). Reward: a rule on the text (identical function both sides).

Each side runs ``--steps`` steps in its own subprocess of this one script run (so neither
framework's process-group or allocator state leaks into the other); the first step is warm-up
(graph capture, compilation) and the median of the rest is reported. On CUDA ours runs twice:
with the trainer's defaults (the headline) and with ``rollout.compile_decode: true``. ``tokens/s`` = sequences x
(prompt + response) tokens / step time. ``ratio`` = ours / TRL. Also: MFU of our actor update,
6 N T + 12 L h S T FLOPs over ``time_update_s`` (the optimizer steps alone; ``mfu_over_train_s``
divides by ``time_train_s``, which adds the weight sync and the sync check), against the bf16
matmul rate measured here.

    python benchmarks/rl_step.py          # writes benchmarks/results/rl_step-<device>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import _common as C  # noqa: E402

PROMPTS, GROUP, P, R = 16, 4, 128, 256
SMALL = dict(PROMPTS=4, GROUP=2, P=8, R=8)


def reward(text: str, truth: str = "", **_) -> float:
    """Rule reward: fraction of words that are ``w`` + an even number (same for both sides)."""
    words = text.split()
    return sum(1 for w in words if w[1:].isdigit() and int(w[1:]) % 2 == 0) / max(len(words), 1)


def _workload(small: bool):
    return SMALL if small else dict(PROMPTS=PROMPTS, GROUP=GROUP, P=P, R=R)


def _write_prompts(path: Path, vocab: int, n: int, plen: int) -> None:
    g = torch.Generator().manual_seed(0)
    with open(path, "w") as f:
        for _ in range(n):
            ids = torch.randint(3, vocab, (plen,), generator=g).tolist()
            f.write(json.dumps({"prompt": " ".join(f"w{i}" for i in ids), "answer": ""}) + "\n")


def _merge(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        base[k] = _merge(dict(base.get(k) or {}), v) if isinstance(v, dict) else v
    return base


def run_ours(model_dir: str, small: bool, steps: int, compile_decode: bool = False, extra: dict | None = None) -> dict:
    from transformers import PreTrainedTokenizerFast

    from verl_bridge import MegatronBridge, MegatronTrainer
    from verl_bridge.config import load_config

    w = _workload(small)
    cuda = torch.cuda.is_available()
    cfg = {
        "trainer": {"total_steps": steps, "output_dir": None, "device": "cuda" if cuda else "cpu",
                    "precision": "bf16" if cuda else "fp32", "progress_bar": False, "seed": 1,
                    # verl's use_dynamic_bsz: micro-batches by a token budget; this one holds the whole
                    # batch (TRL's side also runs all 64 sequences in one pass). On the H100 it took the
                    # update from 0.52 s in 4 micro-batches of 16 rows to 0.34 s (kernel_profile.py)
                    "args": {"use_dynamic_bsz": True,
                             "max_tokens_per_micro_batch": w["PROMPTS"] * w["GROUP"] * (w["P"] + w["R"])}},
        "model": {"actor": {"type": "megatron", "args": {"model_name_or_path": model_dir}},
                  "reward": {"type": "function", "args": {"path": "benchmarks.rl_step:reward"}}},
        "data": {"rollout_batch_size": w["PROMPTS"], "max_prompt_length": w["P"], "max_response_length": w["R"],
                 "train_files": str(Path(model_dir) / "prompts.jsonl"), "task": None},
        "algorithm": {"name": "grpo", "group_size": w["GROUP"], "micro_batch_size": 16 if not small else 4,
                      "ppo_epochs": 1, "kl": {"coef": 0.0}},
        "optim": {"actor": {"lr": 1e-6}},
        "rollout": {"temperature": 1.0, "compile_decode": compile_decode},
    }
    config = load_config(_merge(cfg, extra or {}))
    config.source_dir = str(ROOT)
    # AutoTokenizer would pick Qwen2Tokenizer from config.json's model_type; load the saved one as is
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    trainer = MegatronTrainer(config, bridge=MegatronBridge(config=config, tokenizer=tok))
    hist = trainer.train()
    return {"history": hist}


def run_trl(model_dir: str, small: bool, steps: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    w = _workload(small)
    cuda = torch.cuda.is_available()
    rows = [json.loads(line) for line in open(Path(model_dir) / "prompts.jsonl")]
    ds = Dataset.from_list([{"prompt": r["prompt"]} for r in rows])
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if cuda else torch.float32)

    def trl_reward(completions, **_):
        return [reward(c) for c in completions]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

    n = w["PROMPTS"] * w["GROUP"]
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl_"), per_device_train_batch_size=n,
                      num_generations=w["GROUP"], max_completion_length=w["R"], learning_rate=1e-6,
                      bf16=cuda, logging_steps=1, report_to=[], max_steps=steps, beta=0.0, num_iterations=1,
                      gradient_accumulation_steps=1, temperature=1.0, save_strategy="no", use_vllm=False,
                      seed=1, use_cpu=not cuda)
    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Timer()])
    trainer.train()
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"step_times": times, "mean_completion_length": lengths}


def _child(side: str, model_dir: str, small: bool, steps: int, out: str) -> None:
    res = (run_trl(model_dir, small, steps) if side == "trl" else
           run_ours(model_dir, small, steps, compile_decode=side == "ours_compiled"))
    Path(out).write_text(json.dumps(res, default=float))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat ours and TRL this many times (fresh processes) and report each run's ratio")
    ap.add_argument("--sides", default=None,
                    help="comma-separated subset of ours,ours_compiled,trl (default: all three on CUDA; ours,trl on CPU)")
    ap.add_argument("--child", choices=["ours", "ours_compiled", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dev = C.device()
    small = args.small or dev.type == "cpu"
    if args.child:
        _child(args.child, args.model_dir, small, args.steps, args.out)
        return 0
    w = _workload(small)
    shape = C.QWEN2_TINY if small else C.QWEN2_05B
    model_dir = tempfile.mkdtemp(prefix="bench_rl_")
    C.make_hf_model(shape, model_dir, dtype=torch.float32 if dev.type == "cpu" else torch.bfloat16)
    _write_prompts(Path(model_dir) / "prompts.jsonl", shape["vocab_size"], 256, w["P"])
    seqs = w["PROMPTS"] * w["GROUP"]
    results, baseline = {}, {}
    side_out = {}

    def run_side(side: str, tag: str = ""):
        """One side in its own subprocess: (its JSON, wall seconds), or (None, stderr tail) on failure."""
        out = Path(model_dir) / f"{side}{tag}.json"
        cmd = [sys.executable, __file__, "--child", side, "--model-dir", model_dir, "--out", str(out),
               "--steps", str(args.steps)] + (["--small"] if small else [])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])},
            capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return None, proc.stderr[-1500:]
        return json.loads(out.read_text()), time.perf_counter() - t0

    # ours with the trainer's defaults, then with rollout.compile_decode (CUDA only), then TRL
    sides = ("ours", "ours_compiled", "trl") if dev.type == "cuda" else ("ours", "trl")
    if args.sides:
        asked = args.sides.split(",")
        if "ours" not in asked or not set(asked) <= {"ours", "ours_compiled", "trl"}:
            ap.error(f"--sides {args.sides!r}: a comma-separated subset of ours,ours_compiled,trl that includes ours")
        sides = tuple(x for x in sides if x in asked)
    for side in sides:
        res, info = run_side(side)
        if res is None:
            (baseline if side == "trl" else results)[
                "error_compile_decode" if side == "ours_compiled" else "error"] = info
            continue
        side_out[side] = res
        (baseline if side == "trl" else results)[
            "compile_decode_process_wall_s" if side == "ours_compiled" else "process_wall_s"] = info

    def medians(side: str) -> tuple[float, float, float, float, list]:
        """Median step, rollout, train (update + sync + check) and update-only seconds after the warm-up step."""
        hist = side_out[side]["history"][1:] or side_out[side]["history"]
        return (*(statistics.median(h[k] for h in hist)
                  for k in ("time_step_s", "time_rollout_s", "time_train_s", "time_update_s")), hist)

    if "ours" in side_out:
        step, roll, train, upd, hist = medians("ours")
        resp = statistics.mean(h["response_length"] for h in hist)
        results.update(step_s=step, rollout_s=roll, train_s=train, update_s=upd, mean_response_length=resp,
                       tokens_per_s=seqs * (w["P"] + w["R"]) / step,
                       reward_mean_by_step=[h["reward_mean"] for h in side_out["ours"]["history"]])
        if dev.type == "cuda":
            L, h, V, ffn = (shape[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size"))
            kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
            n_matmul = L * (h * (h + 2 * kv) + h * h + 3 * h * ffn) + V * h
            S = w["P"] + w["R"]
            flops = (6 * n_matmul + 12 * L * h * S) * seqs * S
            peak = C.matmul_tflops(dev, 8192)
            # MFU of the actor update (the optimizer steps, time_update_s); over time_train_s (which
            # also holds the weight sync and the sync check) as well, the figure reported before
            results.update(update_tflops=flops / upd / 1e12, matmul_peak_tflops=peak,
                           mfu=flops / upd / 1e12 / peak, mfu_over_train_s=flops / train / 1e12 / peak,
                           flops_formula="6*N*T + 12*L*h*S*T, N = matmul params")
    if "ours_compiled" in side_out:
        step, roll, _, _, _ = medians("ours_compiled")
        results.update(compile_decode_step_s=step, compile_decode_rollout_s=roll,
                       compile_decode_tokens_per_s=seqs * (w["P"] + w["R"]) / step)
    if "trl" in side_out:
        times = side_out["trl"]["step_times"]
        t = statistics.median(times[1:] or times)
        baseline.update(step_s=t, tokens_per_s=seqs * (w["P"] + w["R"]) / t, step_times=times,
                        mean_completion_length=side_out["trl"]["mean_completion_length"])
    ratio = (round(results["tokens_per_s"] / baseline["tokens_per_s"], 3)
             if "tokens_per_s" in results and "tokens_per_s" in baseline else None)
    if ratio is not None and args.runs > 1:
        # the goal asks for the ratio in each of several runs: ours and TRL again, fresh processes each
        runs = [{"ours_tokens_per_s": results["tokens_per_s"], "trl_tokens_per_s": baseline["tokens_per_s"],
                 "ratio": ratio}]
        for k in range(2, args.runs + 1):
            ours, _ = run_side("ours", f"_run{k}")
            trl, _ = run_side("trl", f"_run{k}")
            if ours is None or trl is None:
                runs.append({"error": "a side failed (stderr above)"})
                continue
            side_out["ours"], side_out["trl"] = ours, trl
            o = seqs * (w["P"] + w["R"]) / medians("ours")[0]
            tt = statistics.median(trl["step_times"][1:] or trl["step_times"])
            t_ = seqs * (w["P"] + w["R"]) / tt
            runs.append({"ours_tokens_per_s": o, "trl_tokens_per_s": t_, "ratio": round(o / t_, 3)})
        results["runs"] = runs
        results["ratio_min_over_runs"] = min(r.get("ratio", 0.0) for r in runs)
    cfg = {"model": "qwen2-0.5b-shape (random init)" if not small else "qwen2-tiny", "prompts": w["PROMPTS"],
           "group_size": w["GROUP"], "prompt_len": w["P"], "max_new_tokens": w["R"], "steps": args.steps,
           "algorithm": "grpo, kl 0, 1 epoch, 1 optimizer step/batch", "runs": args.runs,
           "ratio_definition": "ours / TRL tokens/s (the first run; results.runs holds each run's with --runs)"}
    C.write_result("rl_step", dev, cfg, results, baseline, ratio)
    return 0 if ratio is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
