"""HF -> Megatron (TP=2, PP=2, legacy and torch_dist) -> HF reproduces every tensor bit for bit."""

import pytest
import torch
from safetensors.torch import load_file

from tests.arch.tiny_hf import ARCHS, make_tiny_hf


@pytest.mark.parametrize("fmt", ["legacy", "torch_dist"])
@pytest.mark.parametrize("arch", ARCHS)
def test_roundtrip_bit_exact(arch, fmt, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl_bridge.checkpoint.hf import export_hf, import_hf

    src, meg, back = tmp_path / "hf", tmp_path / "meg", tmp_path / "back"
    make_tiny_hf(arch, src)
    import_hf(src, meg, tp=2, pp=2, fmt=fmt)
    if fmt == "legacy":
        assert (meg / "iter_0000000" / "mp_rank_01_001" / "model_optim_rng.pt").is_file()
    else:
        assert (meg / "iter_0000000" / "metadata.json").is_file()
    assert (meg / "latest_checkpointed_iteration.txt").read_text().strip() == "0"
    export_hf(meg, back)
    a, b = load_file(str(src / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    reloaded = AutoModelForCausalLM.from_pretrained(str(back))  # transformers loads the export
    assert type(reloaded).__name__.lower().startswith(arch)
