"""TP=2 over gloo: each rank loads its shard from the HF files; logits match transformers."""

import torch

from tests.arch.tiny_hf import ARCHS, make_tiny_hf
from tests.dist_utils import run_distributed


def _tp2_worker(rank, world_size, hf_dirs):
    from megatron.core import parallel_state as mpu

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(2, 1)
    out = {}
    tokens = torch.randint(2, 100, (2, 10), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(10).unsqueeze(0).expand(2, -1)
    for arch, hf_dir in hf_dirs.items():
        model = hf_model_provider(hf_dir)(True, True).eval()
        with torch.no_grad():
            logits = model(tokens, pos, None)  # vocab-parallel: this rank's half of the vocabulary
            parts = [torch.empty_like(logits) for _ in range(2)]
            torch.distributed.all_gather(parts, logits.contiguous(), group=mpu.get_tensor_model_parallel_group())
            full = torch.cat(parts, dim=-1)
        out[arch] = (model.embedding.word_embeddings.weight.shape[0], full[..., :100].clone())
    return out, tokens


def test_tp2_logits_match_transformers(tmp_path):
    hf_models, dirs = {}, {}
    for arch in ARCHS:
        dirs[arch] = str(tmp_path / arch)
        hf_models[arch] = make_tiny_hf(arch, dirs[arch])
    results = run_distributed(_tp2_worker, 2, dirs)
    for rank, (out, tokens) in enumerate(results):
        for arch in ARCHS:
            local_vocab, logits = out[arch]
            assert local_vocab == 128  # padded to 128 * TP = 256, half on each rank
            with torch.no_grad():
                ref = hf_models[arch](input_ids=tokens).logits
            assert (logits - ref).abs().max().item() <= 1e-4, (arch, rank)
