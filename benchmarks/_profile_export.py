"""Where a weight-export sync spends its time: exporter alone, consumer variants, torch.profiler tables.

Device diagnostics behind the weight_export numbers (CUDA only; writes nothing). It showed that a
``torch._foreach_copy_`` whose sources mix dtypes falls back to one copy per tensor, which is why
the exporter groups its copies by source dtype and casts the fp32 norm weights on the way out.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/_profile_export.py
"""
import sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import _common as C

from verl_bridge.distributed import init_model_parallel, seed_everything
from verl_bridge.resharding.export import WeightExporter

dev = C.device()
init_model_parallel(1, 1); seed_everything(0)
tmp = tempfile.mkdtemp()
shape = C.QWEN2_05B
hf = C.make_hf_model(shape, tmp, dtype=torch.bfloat16)
expected = {k: v.to(dev) for k, v in hf.state_dict().items()}; del hf
mc = C.megatron_model(tmp, torch.bfloat16, dev)
ex = WeightExporter(mc, bucket_bytes=256 << 20, vocab_size=shape["vocab_size"])
dst = {n: torch.empty_like(t) for n, t in expected.items() if n != "lm_head.weight"}

def walltime(fn, rep=10):
    best = 1e9; cpu = 1e9
    for _ in range(rep):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        best = min(best, t2 - t0); cpu = min(cpu, t1 - t0)
    return f"wall {best*1e3:.3f} ms  cpu(launch) {cpu*1e3:.3f} ms"

def exp_only():
    for b in ex.iter_buckets(): pass
print("exporter only       ", walltime(exp_only))
print("  local key         ", walltime(lambda: ex._cached_local()))
from verl_bridge.resharding.export import _parallel_state
print("  parallel_state    ", walltime(lambda: _parallel_state()))
buckets = [[(n, t.clone()) for n, t in b] for b in ex.iter_buckets()]
flat = [x for b in buckets for x in b]
print("consumer foreach/bkt", walltime(lambda: [torch._foreach_copy_([dst[n] for n, _ in b], [t for _, t in b]) for b in buckets]))
print("consumer foreach all", walltime(lambda: torch._foreach_copy_([dst[n] for n, _ in flat], [t for _, t in flat])))
print("consumer per tensor ", walltime(lambda: [dst[n].copy_(t) for n, t in flat]))
big = [(n, t) for n, t in flat if t.numel() * 2 >= (1 << 20)]; small = [(n, t) for n, t in flat if t.numel() * 2 < (1 << 20)]
print(f"  big {len(big)} small {len(small)}")
print("consumer big copy_+small foreach", walltime(lambda: ([dst[n].copy_(t) for n, t in big], torch._foreach_copy_([dst[n] for n, _ in small], [t for _, t in small]))))
print("consumer foreach flat1D all", walltime(lambda: torch._foreach_copy_([dst[n].view(-1) for n, _ in flat], [t.view(-1) for _, t in flat])))
print("consumer foreach small only", walltime(lambda: torch._foreach_copy_([dst[n] for n, _ in small], [t for _, t in small])))
print("consumer foreach big only", walltime(lambda: torch._foreach_copy_([dst[n] for n, _ in big], [t for _, t in big])))
print("consumer copy_ big only", walltime(lambda: [dst[n].copy_(t) for n, t in big]))
print("embed copy_ alone   ", walltime(lambda: dst["model.embed_tokens.weight"].copy_(flat[0][1])))
print("embed foreach alone ", walltime(lambda: torch._foreach_copy_([dst["model.embed_tokens.weight"]], [flat[0][1]])))
def full_batched():
    for b in ex.iter_buckets():
        torch._foreach_copy_([dst[n] for n, _ in b], [t for _, t in b])
print("export+foreach      ", walltime(full_batched))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3): full_batched()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3): torch._foreach_copy_([dst[n] for n, _ in flat], [t for _, t in flat])
    torch.cuda.synchronize()
print("CONSUMER-ONLY foreach all"); print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=8))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
