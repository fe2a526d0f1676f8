"""trainer.args.compile_layers: megatron-core TransformerLayers under torch.compile (inductor, here on
CPU) give the eager logits and gradients, in one graph shared by all layers with no graph breaks;
the swap keeps state_dict keys, and another compiled model computes with its own weights; auto leaves CPU, TP>1, MoE and other core attentions eager."""

import pytest
import torch

QUICKSTART = "templates/quickstart.yaml"


def _model(seed=0):
    from megatron.core import parallel_state as mpu

    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.distributed import seed_everything
    from verl_bridge.models.tiny import tiny_model_provider

    seed_everything(seed)
    args = ModelArgs(num_layers=3, hidden_size=32, num_attention_heads=4, num_query_groups=2)
    return tiny_model_provider(args, 32, 64)(mpu.is_pipeline_first_stage(), mpu.is_pipeline_last_stage())


def _fwd_bwd(model, ids):
    pos = torch.arange(ids.shape[1])[None].expand_as(ids)
    model.zero_grad(set_to_none=True)
    logits = model(ids, pos, None)
    (logits.float().log_softmax(-1)[..., 0].mean()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_layers_match_eager_in_one_graph_without_breaks():
    import torch._dynamo
    from torch._dynamo.utils import counters

    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.models.compile import compile_layers, is_compiled, transformer_layers

    init_model_parallel(1, 1)
    eager, comp = _model(), _model()
    comp.load_state_dict(eager.state_dict())
    keys = list(comp.state_dict())
    torch._dynamo.reset()
    counters.clear()
    n, why = compile_layers(comp, True, torch.device("cpu"))
    assert n == 3 and "3 transformer layers compiled" in why
    assert all(is_compiled(layer) for layer in transformer_layers(comp))
    assert list(comp.state_dict()) == keys  # no _orig_mod. prefixes: checkpoints and exports unchanged
    assert compile_layers(comp, True, torch.device("cpu"))[0] == 0  # idempotent
    g = torch.Generator().manual_seed(0)
    for shape in ((2, 11), (3, 7), (1, 9)):  # the update's micro-batches change shape
        ids = torch.randint(1, 32, shape, generator=g)
        lo_e, gr_e = _fwd_bwd(eager, ids)
        lo_c, gr_c = _fwd_bwd(comp, ids)
        assert (lo_e - lo_c).abs().max() <= 1e-5
        for name, ge in gr_e.items():
            assert ge.abs().max() > 0, name
            assert torch.allclose(ge, gr_c[name], atol=1e-6, rtol=1e-4), (name, (ge - gr_c[name]).abs().max())
    # the layers really ran compiled: dynamo captured frames, never split a graph (megatron's per-call
    # warnings.warn would, unless ignored), and the graphs do not multiply by layer: 3 layers x 3 shapes
    # gave 4 (the first shape static, then one dynamic-shape graph, each with its backward)
    assert counters["stats"]["calls_captured"] > 0
    assert dict(counters["graph_break"]) == {}
    assert 1 <= counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])

    # another model (a frozen reference is built anew and loaded) shares the compiled graph but computes
    # with its own weights: the parameters are graph inputs, not constants baked into the graph
    other_eager, other = _model(seed=1), _model(seed=1)
    compile_layers(other, True, torch.device("cpu"))
    ids = torch.randint(1, 32, (2, 11), generator=g)
    with torch.no_grad():
        pos = torch.arange(11)[None].expand_as(ids)
        out = other(ids, pos, None)
        assert (out - other_eager(ids, pos, None)).abs().max() <= 1e-5
        assert not torch.allclose(out, comp(ids, pos, None), atol=1e-3)


def test_auto_compiles_the_portable_spec_on_cuda_at_tp1_only():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.models.compile import auto_reason, compile_layers

    init_model_parallel(1, 1)
    model = _model()
    cuda = torch.device("cuda")  # a device name only: nothing runs on it
    assert "hidden_size=32 < 512" in auto_reason(model, cuda, 1)
    import verl_bridge.models.compile as mc

    mc.AUTO_MIN_HIDDEN, was = 32, mc.AUTO_MIN_HIDDEN
    try:
        _auto_cases(model, cuda)
    finally:
        mc.AUTO_MIN_HIDDEN = was


def _auto_cases(model, cuda):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from verl_bridge.models.compile import auto_reason, compile_layers

    assert auto_reason(model, cuda, 1) is None
    assert "not on CUDA" in auto_reason(model, torch.device("cpu"), 1)
    assert "tensor_model_parallel_size=2" in auto_reason(model, cuda, 2)
    assert compile_layers(model, None, torch.device("cpu")) == (0, "compile_layers auto: eager (not on CUDA)")
    assert compile_layers(model, False, cuda)[0] == 0
    local = GPTModel(config=model.config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=32,
                     max_sequence_length=64)
    assert "DotProductAttention core attention" in auto_reason(local, cuda, 1)


def test_a_failing_compiler_falls_back_to_eager_once_with_the_reason(monkeypatch, caplog):
    import verl_bridge.models.compile as mc
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    for name, fresh in (("_SUBCLASSES", {}), ("_COMPILED_FORWARD", {}), ("_WORKED", set()), ("_GAVE_UP", {})):
        monkeypatch.setattr(mc, name, fresh)
    calls = []

    def broken_compile(fn, **_):
        def run(*a, **k):
            calls.append(1)
            raise RuntimeError("InductorError: no working C compiler\nsecond line")
        return run

    monkeypatch.setattr(mc.torch, "compile", broken_compile)
    eager, comp = _model(), _model()
    comp.load_state_dict(eager.state_dict())
    assert mc.compile_layers(comp, True, torch.device("cpu"))[0] == 3
    ids = torch.randint(1, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    with caplog.at_level("WARNING", logger="verl_bridge.models.compile"):
        lo_e, gr_e = _fwd_bwd(eager, ids)
        lo_c, gr_c = _fwd_bwd(comp, ids)
        _fwd_bwd(comp, ids)
    assert torch.equal(lo_e, lo_c) and all(torch.equal(g, gr_c[n]) for n, g in gr_e.items())
    assert len(calls) == 1  # tried once; every later call (other layers, later steps) runs eager
    warned = [r.getMessage() for r in caplog.records if "compile_layers" in r.getMessage()]
    assert len(warned) == 1 and "no working C compiler" in warned[0] and "compile_layers: false" in warned[0]
    assert "second line" not in warned[0]


@pytest.mark.parametrize("value, ok", [("true", True), ("false", True), ("null", True), ("sometimes", False)])
def test_compile_layers_config_key(value, ok):
    from verl_bridge.config import load_config

    if ok:
        cfg = load_config(QUICKSTART, [f"trainer.args.compile_layers={value}", "trainer.output_dir=null"])
        assert cfg.trainer.args.compile_layers == {"true": True, "false": False, "null": None}[value]
    else:
        with pytest.raises(Exception, match="compile_layers"):
            load_config(QUICKSTART, [f"trainer.args.compile_layers={value}", "trainer.output_dir=null"])
