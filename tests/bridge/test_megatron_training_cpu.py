"""Megatron-LM's own ``megatron.training`` (shipped in the megatron-core >= 0.17 wheel) on the CPU.

What runs here, from the installed wheel (the .ci/mcore_019_tier.sh venv: 0.19.2), no CUDA faked:

* ``parse_and_validate_args()`` on a Megatron-LM command line (``--distributed-backend gloo``,
  ``--use-cpu-initialization``, the no-apex flags);
* ``initialize_megatron(allow_no_cuda=True)`` -- Megatron-LM's own switch for CPU-only use. On
  the CPU it neither sets up parallel_state (only when CUDA devices exist) nor asserts
  ``Megatron requires CUDA.``; the initializer below sets up parallel_state from the parsed
  args first, as ``initialize_megatron`` does on a GPU, and the bridge reuses those groups;
* ``core_transformer_config_from_args(get_args())`` feeding a provider; the GPT is built with
  verl-bridge's portable layer spec (the local spec's ``DotProductAttention`` takes its buffer
  from ``torch.cuda.current_device()``), and weights come from a checkpoint in Megatron-LM's
  layout, in both formats, loaded through the bridge exactly; then two GRPO steps.

What asserts or needs CUDA (checked below, so the README's list stays true):
``initialize_megatron()`` without ``allow_no_cuda`` (``AssertionError: Megatron requires
CUDA.``), ``save_checkpoint`` (``get_rng_state`` reads ``torch.cuda.get_rng_state()``) and
``load_checkpoint`` (``read_metadata`` puts the iteration in a ``device='cuda'`` tensor).
"""

import math
import sys
from pathlib import Path

import pytest
import torch

from tests.dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[2]
FORMATS = ("legacy", "torch_dist")

pytest.importorskip("megatron.training", reason="megatron.training ships in the megatron-core >= 0.17 wheel")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path; tests/gpu covers CUDA")]

MEGATRON_FLAGS = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--max-position-embeddings", "32", "--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute",
    "--transformer-impl", "local", "--tokenizer-type", "NullTokenizer", "--vocab-size", "16",
    "--make-vocab-size-divisible-by", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-4",
    "--train-iters", "1", "--seed", "1234", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--no-persist-layer-norm", "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion",
    "--use-cpu-initialization", "--distributed-backend", "gloo",
]


def initialize_on_cpu():
    """A Megatron-LM user's initialisation on a CPU-only machine (megatron-core >= 0.19 wheel)."""
    sys.path.insert(0, str(REPO / "examples" / "megatron_lm"))
    from rl_gpt import _skip_helper_compile_if_prebuilt
    from megatron.training import get_args, initialize_megatron
    from megatron.training.arguments import parse_and_validate_args

    from verl_bridge.distributed import init_model_parallel

    _skip_helper_compile_if_prebuilt()
    parse_and_validate_args()  # reads sys.argv
    args = get_args()
    # on a GPU initialize_megatron sets up parallel_state itself; without CUDA devices it skips that
    init_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    initialize_megatron(allow_no_cuda=True)


def cpu_model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """Megatron-LM's GPT from get_args(), with the CPU-capable (portable) layer spec."""
    sys.path.insert(0, str(REPO / "examples" / "megatron_lm"))
    from rl_gpt import gpt_model
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.models.spec import get_portable_gpt_layer_spec

    args = get_args()
    config = config or core_transformer_config_from_args(args)
    return make_cpu_safe(gpt_model(config, args, get_portable_gpt_layer_spec(args.normalization), pre_process,
                                   post_process, vp_stage))


def _cuda_error(fn) -> str:
    try:
        fn()
    except (AssertionError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _reset_megatron():
    """Megatron-LM's own reset between runs in one process (its globals, rerun state machine, parallel_state)."""
    from megatron.core import parallel_state as mpu
    from megatron.core.rerun_state_machine import destroy_rerun_state_machine
    from megatron.training.global_vars import unset_global_variables

    unset_global_variables()
    destroy_rerun_state_machine()
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()


def _argv(root, fmt):
    return ["pretrain_gpt.py", *MEGATRON_FLAGS, "--load", f"{root}/ckpt_{fmt}", "--finetune", "--no-load-optim",
            "--no-load-rng", "--ckpt-format", "torch" if fmt == "legacy" else fmt]


def _worker(rank, world_size, root):
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import megatron_lm_flow as flow
    from megatron.training import get_args, initialize_megatron
    from megatron.training.checkpointing import load_checkpoint as megatron_load_checkpoint
    from megatron.training.checkpointing import save_checkpoint as megatron_save_checkpoint

    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.checkpoint.megatron import save

    out = {}
    _reset_megatron()  # the worker's process group stays (gloo); parallel_state comes from Megatron-LM's args
    sys.argv = _argv(root, "legacy")
    out["plain_initialize"] = _cuda_error(initialize_megatron)  # the CUDA assert comes first
    initialize_on_cpu()
    args = get_args()
    out["args"] = {k: str(getattr(args, k)) for k in ("num_layers", "hidden_size", "padded_vocab_size",
                                                      "distributed_backend", "params_dtype")}
    # the pretrained checkpoint in Megatron-LM's layout, both formats (written by verl-bridge:
    # Megatron-LM's own save_checkpoint needs CUDA, checked next)
    pretrained = cpu_model_provider()
    reference = flow.tensor_state(pretrained)
    for fmt in FORMATS:
        save(f"{root}/ckpt_{fmt}", 10, {"model": pretrained, "args": args, "checkpoint_version": 3.0,
                                        "optimizer": None, "opt_param_scheduler": None}, fmt=fmt)
    out["save_checkpoint"] = _cuda_error(lambda: megatron_save_checkpoint(
        11, [cpu_model_provider()], None, None, num_floating_point_operations_so_far=0))
    out["load_checkpoint"] = _cuda_error(lambda: megatron_load_checkpoint([cpu_model_provider()], None, None))

    for fmt in FORMATS:  # a Megatron-LM user's run through the bridge, from each format
        _reset_megatron()
        sys.argv = _argv(root, fmt)
        loaded = {}

        def load_checkpoint(model, path):  # verl-bridge's reader of Megatron-LM's layout
            from verl_bridge.checkpoint import load_model_weights

            m = model[0] if isinstance(model, list) else model
            load_model_weights(m, path)
            if not loaded:
                loaded.update(flow.compare_weights(m, reference))

        bridge = MegatronBridge(cpu_model_provider, initialize_megatron=initialize_on_cpu,
                                load_checkpoint=load_checkpoint)
        overrides = flow.grpo_overrides(str(root), fmt, 2, device="cpu") + [
            "trainer.precision=fp32", f"model.actor.args.load_path={root}/ckpt_{fmt}", "data.rollout_batch_size=8",
            "algorithm.group_size=4", "algorithm.mini_batch_size=32", "algorithm.micro_batch_size=16"]
        steps, trainer = flow.run_grpo(bridge, str(flow.TEMPLATE), overrides)
        out[fmt] = {"loaded": loaded, "steps": steps, "reused_groups": bridge.reused_groups,
                    "ckpt_format": get_args().ckpt_format}
    return out


@pytest.fixture(scope="module")
def flow_result(tmp_path_factory):
    return run_distributed(_worker, 1, tmp_path_factory.mktemp("mlm"))[0]


def test_megatron_lm_args_are_parsed_on_cpu(flow_result):
    assert flow_result["args"] == {"num_layers": "2", "hidden_size": "64", "padded_vocab_size": "16",
                                   "distributed_backend": "gloo", "params_dtype": "torch.float32"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_megatron_lm_args_feed_the_bridge_and_checkpoint_loads_exactly(flow_result, fmt):
    r = flow_result[fmt]
    assert r["ckpt_format"] == ("torch" if fmt == "legacy" else fmt)
    assert r["reused_groups"] is True  # the bridge kept the parallel_state built from Megatron-LM's args
    assert r["loaded"]["exact"] and r["loaded"]["tensors"] > 10 and not r["loaded"]["missing"], r["loaded"]
    assert [s["step"] for s in r["steps"]] == [1, 2]
    assert all(math.isfinite(s["reward_mean"]) and math.isfinite(s["actor_loss"]) for s in r["steps"])


def test_what_needs_cuda_is_named(flow_result):
    """The README's list: these stop on the CPU, each at its CUDA call."""
    r = flow_result
    assert r["plain_initialize"] == "AssertionError: Megatron requires CUDA."
    for key in ("save_checkpoint", "load_checkpoint"):
        assert r[key].startswith("RuntimeError:") and ("NVIDIA driver" in r[key] or "CUDA" in r[key]), (key, r[key])
