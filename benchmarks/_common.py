"""Shared pieces of the benchmark scripts: the model shape, a tokenizer, timing, the JSON contract.

Result files follow DESIGN.md: ``benchmarks/results/<name>-<device>.json`` holding
``{"name", "device", "when", "config", "results", "baseline", "ratio"}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path

import torch

# BENCH_RESULTS_DIR redirects the JSONs (the CPU smoke tests write to a temporary folder, never over the
# committed CUDA results)
RESULTS = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).resolve().parent / "results")

# Qwen2-0.5B's shape (random weights): the reference model for every benchmark.
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                 rms_norm_eps=1e-6, tie_word_embeddings=True,
                 rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"})
# the same architecture, small enough for a 2-core CPU
QWEN2_TINY = dict(QWEN2_05B, vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, repeat: int = 1) -> float:
    """Best wall time of ``repeat`` calls (seconds), synchronising the device around each."""
    best = float("inf")
    for _ in range(repeat):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best


# data-sheet HBM bandwidth of the GPUs these benchmarks ran on (bytes/s), by a substring of
# torch.cuda.get_device_name(): the roofline's "spec" line; others get only the measured-copy line
SPEC_BANDWIDTH = (("H200", 4.8e12), ("H100 80GB HBM3", 3.35e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12),
                  ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12))


def spec_bandwidth(dev: torch.device) -> float | None:
    """The data-sheet memory bandwidth of ``dev`` (bytes/s), or None for a GPU not in SPEC_BANDWIDTH."""
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    return next((bw for key, bw in SPEC_BANDWIDTH if key in name), None)


def copy_bandwidth(dev: torch.device, nbytes: int) -> float:
    """Bytes copied per second by one device-to-device ``copy_`` of ``nbytes`` (each byte counted once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = timed(lambda: dst.copy_(src), dev, repeat=10)
    return nbytes / t


def matmul_tflops(dev: torch.device, n: int, dtype=torch.bfloat16) -> float:
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        a @ b
    reps = 10
    t = timed(lambda: [a @ b for _ in range(reps)], dev)
    return 2 * n ** 3 * reps / t / 1e12


def make_tokenizer(vocab_size: int, out_dir: str):
    """A word-level fast tokenizer over ``w0..w{V-1}`` (no download): one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for i in range(3, vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.padding_side = "left"
    fast.save_pretrained(out_dir)
    return fast


def make_hf_model(shape: dict, out_dir: str, dtype=torch.bfloat16, seed: int = 0):
    """A random-weight Qwen2 of ``shape`` saved to ``out_dir`` (with a tokenizer); returns the model."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**shape, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg).to(dtype)
    model.save_pretrained(out_dir)
    make_tokenizer(shape["vocab_size"], out_dir)
    return model


def megatron_model(hf_dir: str, dtype: torch.dtype, dev: torch.device):
    """The megatron-core GPTModel of ``hf_dir`` built the way the trainer builds it.

    ``MegatronBridge`` builds with the precision flags of ``trainer.precision`` and then casts the whole
    model as Megatron-LM's ``get_model()`` does (``Float16Module``), so the benchmarks measure the same
    model the trainer runs (before this, a raw bf16 build kept fp32 norms and the fast decoder refused it).
    """
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.common.precision import cast_like_float16_module
    from verl_bridge.models.tiny import precision_kwargs

    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    over = dict(precision_kwargs(precision), use_cpu_initialization=dev.type == "cpu") if precision != "fp32" else {}
    model = hf_model_provider(hf_dir, **over)(True, True)
    return cast_like_float16_module(model, precision).to(dev).eval()


def random_workload(vocab_size: int, B: int, P: int, R: int, seed: int):
    """``B`` random prompts of ``P`` token ids and sampling at temperature 1 with EOS disabled (every
    row makes ``R`` tokens): the decode benchmarks' workload."""
    from verl_bridge.rollout.base import SamplingParams

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab_size, (B, P), generator=g).tolist()
    return prompts, SamplingParams(max_new_tokens=R, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=None,
                                   pad_token_id=0)


def nvidia_smi() -> dict:
    """Clocks, power and utilisation as ``nvidia-smi`` reports them now ({} where it is not there)."""
    import subprocess

    fields = ["clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.draw", "power.limit",
              "temperature.gpu", "utilization.gpu", "driver_version"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    return dict(zip(fields, (v.strip() for v in out.split(","))))


def environment() -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["nvidia_smi"] = nvidia_smi()
        # the load this run ran under: the bf16 matmul rate measured now, beside the numbers it qualifies
        env["bf16_matmul_tflops_measured"] = round(matmul_tflops(torch.device("cuda"), 8192), 1)
    for mod in ("transformers", "megatron.core", "trl"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            env[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001 - optional
            pass
    return env


def write_result(name: str, dev: torch.device, config: dict, results: dict, baseline: dict, ratio) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"name": name, "device": dev.type,
           "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "config": config, "results": results, "baseline": baseline, "ratio": ratio,
           "environment": environment()}
    path = RESULTS / f"{name}-{dev.type}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    os.replace(tmp, path)
    extra = os.environ.get("BENCH_OUT")  # the device tool copies results back from here
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        (Path(extra) / path.name).write_text(path.read_text())
    print(json.dumps({"name": name, "ratio": ratio, "results": results, "baseline": baseline}, indent=None))
    return path
