import pytest
import torch

from tests.arch.tiny_hf import ARCHS, make_tiny_hf


@pytest.fixture(scope="module")
def parallel():
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    yield


@pytest.mark.parametrize("arch", ARCHS)
def test_imported_megatron_logits_match_transformers(arch, tmp_path, parallel):
    from verl_bridge.arch import detect_architecture, hf_model_provider

    hf_model = make_tiny_hf(arch, tmp_path)
    model = hf_model_provider(tmp_path)(True, True)
    model.eval()
    tokens = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(12).unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        ours = model(tokens, pos, None)[..., :100]
        theirs = hf_model(input_ids=tokens).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert detect_architecture(model) == arch
