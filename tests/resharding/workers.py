"""The one 4-process gloo run the resharding tests share (process spawn dominates their cost).

It walks TP=1, TP=2, PP=2 and TP=2 x PP=2 in turn (TP=1 / PP=2 with data-parallel replicas
beside them). For each layout and model every rank streams the megatron weights, compares every
tensor with the HF safetensors file the model was loaded from (in the worker), and reports the
bucket sizes and the measured peak memory. At PP=1 it also runs the sync-verification probe:
the stream is loaded into a ``transformers`` model, which is then scored against the megatron
actor, intact and deliberately corrupted.
"""

from __future__ import annotations

import contextlib
import itertools
import time

import torch

from tests.resharding.helpers import ARCHS, HF_VOCAB
from verl_bridge.arch import hf_model_provider

LAYOUTS = ((1, 1), (2, 1), (1, 2), (2, 2))
SMALL_BUCKET = 12 << 10


def _nbytes(t):
    return t.numel() * t.element_size()


def _export_check(exporter, ref):
    """Stream in buckets; compare every tensor with the reference file (in the worker)."""
    names, mismatched, bucket_sizes, given = [], [], [], []
    for bucket in exporter.iter_buckets():
        given.append(bucket)
        bucket_sizes.append([_nbytes(t) for _, t in bucket])
        for name, t in bucket:
            names.append(name)
            if name not in ref or ref[name].shape != t.shape or not torch.equal(ref[name], t):
                mismatched.append(name)
    # each list was emptied once the next bucket was asked for (the loop variable frees nothing)
    if any(given_list for given_list in given):
        mismatched.append("<a yielded bucket list was not emptied>")
    return names, mismatched, bucket_sizes


@contextlib.contextmanager
def cpu_tensor_cuda_noop():
    """megatron-core moves a PP>1 tied embedding copy to CUDA while building (to all-reduce it
    between first and last stage); on a CPU-only torch make ``Tensor.cuda`` a no-op meanwhile."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def build(hf_dir, pp_rank, pp):
    provider = hf_model_provider(hf_dir, pipeline_dtype=torch.float32)  # PP needs a pipeline dtype
    with cpu_tensor_cuda_noop():
        return provider(pre_process=pp_rank == 0, post_process=pp_rank == pp - 1)


def layouts_worker(rank, world_size, dirs):
    from megatron.core import parallel_state as mpu

    from verl_bridge.arch.hf import SafetensorsDir
    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.resharding import WeightExporter
    from verl_bridge.rollout.verify import tensor_checksums

    out = {}
    for tp, pp in LAYOUTS:
        init_model_parallel(tp, pp)
        pp_rank = mpu.get_pipeline_model_parallel_rank()
        for arch in ARCHS + ("deep_llama",):
            t0 = time.perf_counter()
            ref = SafetensorsDir(dirs[arch])
            model = build(dirs[arch], pp_rank, pp)
            res = {"expected": sorted(ref.keys())}
            if arch in ARCHS:
                exp = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=SMALL_BUCKET, checksum=True)
                res["hf_names"] = exp.hf_names()
                res["names"], res["mismatched"], res["buckets"] = _export_check(exp, ref)
                res["stats"] = exp.stats
                res["checksums_ok"] = exp.checksums == tensor_checksums({n: ref[n] for n in ref.keys()})
                # a second pass (one tensor at a time) streams the same thing again
                again = [(n, torch.equal(t, ref[n])) for n, t in exp.iter_tensors()]
                res["again"] = [n for n, _ in again]
                res["again_equal"] = all(ok for _, ok in again)
            else:
                for (cap_name, cap), coalesce in itertools.product((("one", 1), ("two_largest", None)), (True, False)):
                    exp = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=1, coalesce=coalesce)
                    largest = exp.largest_tensor_bytes()
                    exp.bucket_bytes = cap if cap is not None else 2 * largest
                    names, mismatched, buckets = _export_check(exp, ref)
                    res[(cap_name, coalesce)] = dict(names=names, mismatched=mismatched, buckets=buckets,
                                                     stats=exp.stats, largest=largest, cap=exp.bucket_bytes)
            res["seconds"] = time.perf_counter() - t0
            if (tp, pp) == (2, 1) and arch == "llama":
                out["te_names"] = _te_names_check(model, ref)
            if pp == 1 and arch in ARCHS:
                out[("verify", tp, arch)] = _verify_checks(model, dirs[arch])
            out[(tp, pp, arch)] = res
            if arch in ARCHS:
                _coalesced_checks(out, model, ref, arch, tp, pp)
            del model
        if (tp, pp) != (1, 1):  # OPT's layout too: learned positions, biases, an ungated MLP
            _coalesced_checks(out, build(dirs["opt"], pp_rank, pp), SafetensorsDir(dirs["opt"]), "opt", tp, pp)
        if (tp, pp) == (2, 2):  # cast on the way out
            ref = SafetensorsDir(dirs["llama"])
            model = build(dirs["llama"], pp_rank, pp)
            exp = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=SMALL_BUCKET, dtype=torch.bfloat16)
            got = list(exp.iter_tensors())
            out["bf16"] = dict(names=sorted(n for n, _ in got), expected=sorted(ref.keys()),
                               dtypes={t.dtype for _, t in got},
                               mismatched=[n for n, t in got if not torch.equal(t, ref[n].to(torch.bfloat16))])
        mpu.destroy_model_parallel()
    out["vpp"] = _vpp_check(dirs["deep_llama"])
    return out


def _coalesced_checks(out, model, ref, arch, tp, pp):
    """The coalesced general path against the per-tensor one and the HF file (see
    tests/resharding/test_export_coalesced.py) for each bucket cap, fp32 and bf16."""
    from tests.resharding.test_export_coalesced import CAPS, SMALL, _compare

    if (tp, pp) == (1, 1):
        return  # in-process in test_export_coalesced.py
    res = out.setdefault("coalesced", {})
    for cap in CAPS:
        for dtype in ((None, torch.bfloat16) if cap == SMALL else (None,)):
            problems, st, plan = _compare(model, ref, arch, bucket_bytes=cap, dtype=dtype)
            res[(tp, pp, arch, cap, str(dtype))] = dict(
                problems=problems[:5], buckets=st.buckets, peak=st.peak_extra_bytes,
                bcasts=sum(len(u.bcasts) for u in plan.units),
                gathers=sum(len(u.gathers) for u in plan.units), units=len(plan.units))


def _vpp_check(hf_dir, pp: int = 2, vpp: int = 2):
    """PP=2 with two virtual-pipeline chunks per stage (interleaved layers), TP=1."""
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.arch.hf import SafetensorsDir, hf_to_mcore_config, load_hf_weights
    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.resharding import WeightExporter

    mpu.initialize_model_parallel(1, pp, virtual_pipeline_model_parallel_size=vpp)
    pp_rank = mpu.get_pipeline_model_parallel_rank()
    tf, gpt, _ = hf_to_mcore_config(hf_dir)
    config = TransformerConfig(**tf, tensor_model_parallel_size=1, pipeline_model_parallel_size=pp,
                               virtual_pipeline_model_parallel_size=vpp, pipeline_dtype=torch.float32)
    chunks = []
    for v in range(vpp):
        with cpu_tensor_cuda_noop():
            m = GPTModel(config=config, pre_process=pp_rank == 0 and v == 0,
                         post_process=pp_rank == pp - 1 and v == vpp - 1, vp_stage=v, **gpt)
        m = make_cpu_safe(m)
        load_hf_weights(m, hf_dir)
        chunks.append(m)
    ref = SafetensorsDir(hf_dir)
    exp = WeightExporter(chunks, vocab_size=HF_VOCAB, bucket_bytes=SMALL_BUCKET)
    names, mismatched, _ = _export_check(exp, ref)
    layers = [[layer.layer_number - 1 for layer in c.decoder.layers] for c in chunks]
    mpu.destroy_model_parallel()
    return dict(names=sorted(names), expected=sorted(ref.keys()), mismatched=mismatched, layers=layers)




CORRUPT_NOISE = "model.layers.1.self_attn.q_proj.weight"
CORRUPT_SUBTLE = "model.layers.0.mlp.down_proj.weight"


def _verify_checks(model, hf_dir):
    """Load the stream into a transformers model bucket by bucket; probe intact and corrupted."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl_bridge.resharding import WeightExporter
    from verl_bridge.rollout.verify import (
        SyncVerificationError, hf_log_probs, probe_sync, tensor_checksums, verify_native_engine)

    res = {}
    exp = WeightExporter(model, vocab_size=HF_VOCAB, bucket_bytes=SMALL_BUCKET, checksum=True)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.fill_(float("nan"))  # whatever the stream does not fill stays NaN
    unexpected = []
    for bucket in exp.iter_buckets():
        unexpected += hf.load_state_dict(dict(bucket), strict=False).unexpected_keys
    res["unexpected"] = unexpected
    res["unfilled"] = [n for n, p in hf.named_parameters() if torch.isnan(p).any()]

    def receiver(ids):
        return hf_log_probs(hf, ids, HF_VOCAB)

    def run(**kw):
        try:
            return probe_sync(model, receiver, threshold=1e-4, vocab_size=HF_VOCAB, **kw), None
        except SyncVerificationError as e:
            return e.report, str(e)

    res["intact"] = run(sender_checksums=exp.checksums, receiver_checksums=tensor_checksums(hf.state_dict()))
    params = dict(hf.named_parameters())
    with torch.no_grad():  # a tiny change: log-probs stay within the threshold, checksums do not
        params[CORRUPT_SUBTLE].mul_(1.0001)
    res["subtle"] = run(sender_checksums=exp.checksums, receiver_checksums=tensor_checksums(hf.state_dict()))
    with torch.no_grad():
        params[CORRUPT_SUBTLE].div_(1.0001)
        gen = torch.Generator().manual_seed(7)  # the same corruption on every rank
        w = params[CORRUPT_NOISE]
        w.add_(torch.randn(w.shape, generator=gen))
    res["noise"] = run(sender_checksums=exp.checksums, receiver_checksums=tensor_checksums(hf.state_dict()))
    res["noise_no_checksums"] = run()
    res["native"] = verify_native_engine(model, threshold=1e-4, vocab_size=HF_VOCAB)
    return res


class _Renamed:
    """A GPTModel seen through different parameter names (what a Transformer Engine spec model has)."""

    def __init__(self, model, rename, extra=None):
        self.model, self.rename, self.extra = model, rename, extra or {}
        self.config, self.decoder, self.vocab_size = model.config, model.decoder, model.vocab_size
        self.share_embeddings_and_output_weights = model.share_embeddings_and_output_weights

    def state_dict(self, keep_vars=False):
        sd = {self.rename(k): v for k, v in self.model.state_dict(keep_vars=keep_vars).items()}
        return {**sd, **self.extra}


def _te_names_check(model, ref):
    from verl_bridge.resharding import WeightExporter

    def te(name):
        return (name.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight")
                .replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"))

    proxy = _Renamed(model, te)
    renamed = sum(1 for k in proxy.state_dict() if "layer_norm_weight" in k)
    names, mismatched, _ = _export_check(WeightExporter(proxy, arch="llama", vocab_size=HF_VOCAB), ref)
    odd = _Renamed(model, lambda n: n, {"decoder.layers.0.self_attention.mystery.weight": torch.zeros(2)})
    try:
        list(WeightExporter(odd, arch="llama", vocab_size=HF_VOCAB).iter_buckets())
        error = None
    except ValueError as e:
        error = str(e)
    return dict(renamed=renamed, names=sorted(names), expected=sorted(ref.keys()), mismatched=mismatched,
                error=error)
