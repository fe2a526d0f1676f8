"""``MegatronTrainer``: one SPMD runtime for PPO, GRPO, RLOO and REINFORCE++ on megatron-core.

One step (every rank runs the same code; TP ranks hold identical samples, DP ranks different ones):

    prompts (data/prompts.py) ─▶ rollout producer (rollout/producer.py): generate, decode, score
    ─▶ make experience (runtime/experience.py): old log-probs, reference log-probs, values, KL,
       advantages (the algorithm's estimator)
    ─▶ update (runtime/update.py): ppo_epochs x mini-batches x micro-batches, actor then critic
    ─▶ weights to the rollout engine ─▶ metrics ─▶ console + metrics.jsonl

This module only orchestrates: setup builds the pieces from the config and the bridge, and the
loop passes a :class:`~verl_bridge.common.state.TrainerState` (never the trainer) to the
experience, update and checkpoint code. ``algorithm.name`` is looked up once in
:data:`verl_bridge.algorithms.registry.ALGORITHMS`, the registry the config validator reads.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from verl_bridge import algorithms as A
from verl_bridge.algorithms.registry import ALGORITHMS
from verl_bridge.checkpoint.layout import atomic_write_text
from verl_bridge.config import Config, dump_config, load_config
from verl_bridge.data.prompts import PromptSource, eval_samples
from verl_bridge.data.reward import reward_function
from verl_bridge.data.tokenizer import builtin_task, load_tokenizer
from verl_bridge.distributed.layout import ParallelLayout
from verl_bridge.rollout.producer import FunctionReward, RolloutProducer, rollout_seed
from verl_bridge.common.batch import Experience
from verl_bridge.runtime.experience import make_experience
from verl_bridge.runtime.metrics import MetricsLogger, info
from verl_bridge.common.roles import Roles
from verl_bridge.common.state import TrainerState
from verl_bridge.runtime.update import update


def _mean_over_dp(values: dict[str, float], layout: ParallelLayout) -> dict[str, float]:
    dp = layout.dp_size
    if dp == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, group=layout.dp_group)
    return {k: float(v) / dp for k, v in zip(keys, t.tolist())}


def _sum_over_dp(x: float, layout: ParallelLayout) -> float:
    if layout.dp_size == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, group=layout.dp_group)
    return float(t.item())


class MegatronTrainer:
    """Train a Megatron actor with PPO-family RL from a validated :class:`Config`.

    ``config`` may be a Config, a YAML path or a dict; ``overrides`` are ``key=value`` strings.
    ``bridge`` (a :class:`verl_bridge.MegatronBridge`) supplies the user's hooks when given as
    Python callables instead of ``"module:function"`` strings.

    After :meth:`setup`: ``state`` (:class:`TrainerState`), ``producer``
    (:class:`~verl_bridge.rollout.producer.RolloutProducer`), ``prompts``
    (:class:`~verl_bridge.data.prompts.PromptSource`), ``engine``, ``tokenizer``, ``placement``.
    """

    def __init__(self, config: Config | str | dict, overrides: Optional[list[str]] = None, *,
                 bridge=None, reward_fn: Optional[Callable[[str, str], float]] = None):
        if bridge is not None and bridge.supplies_model:
            config = bridge.adopt_config(config, overrides)  # the bridge's model: a YAML preset is cleared
        elif not isinstance(config, Config) or overrides:
            config = load_config(config, overrides)
        if bridge is not None:
            bridge.config = config
        self.config = config
        self.bridge = bridge
        self.reward_fn = reward_fn
        self.spec = ALGORITHMS[config.algorithm.name]
        self.state: Optional[TrainerState] = None
        self.history: list[dict] = []
        self.placement = None  # verl_bridge.placement.runtime.Placement when the reward is placed
        self.producer: Optional[RolloutProducer] = None
        self._eval_prompts: Optional[list[tuple[str, str]]] = None

    @property
    def step(self) -> int:
        """The last finished step (0 before training)."""
        return self.state.step if self.state is not None else 0

    @property
    def roles(self) -> Roles:
        return self.state.roles

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        from verl_bridge.bridge import MegatronBridge
        from verl_bridge.distributed import seed_everything
        from verl_bridge.placement.runtime import Placement
        from verl_bridge.placement.scorer import build_scorer

        cfg = self.config
        if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("trainer.device='cuda' but CUDA is not available on this machine; use auto or cpu")
        if self.bridge is None:
            self.bridge = MegatronBridge.from_config(cfg)
        from verl_bridge.distributed.watchdog import set_collective_timeout

        set_collective_timeout(cfg.trainer.collective_timeout_s)  # for the groups initialize() creates
        self.layout = self.bridge.initialize()
        self._claim_run_dir()
        self.device = self.layout.device
        if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # torchrun's rule for N > 1 ranks, applied to one as well: on CPU the ranks share the cores, and
            # for the small models that train there OpenMP threads cost more than they give (the quickstart:
            # 9 s of CPU with one thread, 68 s with two on a loaded 2-core machine). OMP_NUM_THREADS overrides.
            torch.set_num_threads(1)
        seed_everything(cfg.trainer.seed)
        self.task = builtin_task(cfg)
        self.tokenizer = self.bridge.tokenizer or load_tokenizer(cfg, self.task)
        if self.reward_fn is not None:  # a Python reward_fn: checked like a configured one (rewards/checked.py)
            from verl_bridge.rewards.checked import checked_reward

            self.reward_fn = checked_reward(self.reward_fn, timeout_s=cfg.model.reward.args.timeout_s)
        else:
            self.reward_fn = reward_function(cfg, self.task)
        self.prompts = PromptSource(cfg, self.task)

        def scorer():
            return build_scorer(cfg, bridge=self.bridge, device=self.device, reward_fn=self.reward_fn,
                                tokenizer=self.tokenizer)

        self.placement = Placement.from_config(cfg, self.layout, scorer)  # None: every role colocated, reward a function
        if self.placement is not None and self.placement.is_reward_rank:
            return  # a separate reward group builds only its scorer
        roles = self.bridge.build_roles()
        self.is_logger = dist.get_rank() == 0
        run_dir = cfg.trainer.output_dir
        if self.is_logger and run_dir:
            os.makedirs(run_dir, exist_ok=True)
            atomic_write_text(os.path.join(run_dir, "config.yaml"), dump_config(cfg))  # replaces a symlink
        a = cfg.algorithm
        kl_ctl = A.build_kl_controller(a.kl.coef, a.kl.target, a.kl.horizon)
        self.state = TrainerState(config=cfg, layout=self.layout, roles=roles, kl_ctl=kl_ctl)
        self.logger = MetricsLogger(run_dir, cfg.trainer.total_steps, self.is_logger, cfg.trainer.progress_bar,
                                    cfg.trainer.log_every, config=cfg)
        lay = self.layout
        if self.is_logger:
            info(f"MegatronTrainer initialized with TP={lay.tp_size}, PP={lay.pp_size}, "
                 f"SP={cfg.trainer.args.sequence_parallel}")
            threads = f" threads={torch.get_num_threads()}" if self.device.type == "cpu" else ""
            info(f"world={lay.world_size} dp={lay.dp_size} device={self.device.type}{threads} "
                 f"algorithm={a.name} advantages={self.spec.advantage} "
                 f"critic={'yes' if roles.critic is not None else 'no'} "
                 f"reference={'yes' if roles.reference is not None else 'no'} rollout={cfg.rollout.engine}")
        self.engine = self._build_engine(roles)
        reward = self.placement if self.placement is not None else FunctionReward(self.reward_fn, self.tokenizer)
        self.producer = RolloutProducer(self.engine, self.tokenizer, reward, data=cfg.data, rollout=cfg.rollout,
                                        device=self.device)

    def _build_engine(self, roles: Roles):
        cfg = self.config
        if cfg.rollout.engine == "vllm":  # GPU only: a readable error without vLLM or CUDA
            from verl_bridge.rollout.vllm_engine import build_vllm_engine

            return build_vllm_engine(cfg, roles.actor, self.layout)
        if cfg.rollout.engine != "native":
            raise RuntimeError(f"rollout.engine={cfg.rollout.engine!r} is not available in this build; use native")
        from verl_bridge.rollout.native import NativeEngine

        if self.layout.pp_size > 1:  # generation replicas resharded from the pipeline (rollout/replica.py)
            from verl_bridge.rollout.replica import start_replicas

            return start_replicas(self.bridge, roles.actor, self.layout, cfg, self.is_logger)
        from verl_bridge.rollout.replica import actor_world_size, check_rollout_workers, log_rollout_workers

        # PP=1: the rollout workers are the data-parallel ranks' TP groups, each with its own actor
        n_actor = actor_world_size(self.layout)
        check_rollout_workers(cfg.data.num_rollout_workers, n_actor, self.layout.tp_size)
        if self.is_logger:
            log_rollout_workers(n_actor, self.layout.tp_size)
        engine = NativeEngine(roles.actor, self.device, compile=cfg.rollout.compile_decode, decode=cfg.rollout.decode,
                              memory_fraction=cfg.rollout.gpu_memory_utilization)
        if cfg.algorithm.moe_routing_replay:  # R3: the rollout records megatron's routing (runtime/routing_replay.py)
            from verl_bridge.common.routing_replay import check_model

            check_model(roles.actor)
            engine.record_routing = True
        if self.is_logger:
            info(f"rollout: native engine, {engine.path} decode path"
                 + (f" ({engine.fast_reason})" if engine.fast is None else ""))
        return engine

    def _claim_run_dir(self) -> None:
        """Rank 0 locks ``trainer.output_dir`` and checks it holds no other run (runtime/run_dir.py);
        every rank gets the same answer, so a refusal stops them all before anything is written."""
        t = self.config.trainer
        if not t.output_dir:
            return
        from verl_bridge.runtime.run_dir import RunDirError, claim_run_dir

        problem = None
        if dist.get_rank() == 0:
            try:
                self._run_lock = claim_run_dir(t.output_dir, resume=t.resume, overwrite=t.overwrite,
                                               break_stale=t.break_stale_lock)
            except RunDirError as exc:
                problem = str(exc)
        if dist.get_world_size() > 1:
            box = [problem]
            dist.broadcast_object_list(box, src=0)
            problem = box[0]
        if problem is not None:
            raise RunDirError(problem)

    def _release_run_dir(self) -> None:
        lock = getattr(self, "_run_lock", None)
        if lock is not None:
            lock.release()
            self._run_lock = None

    # ------------------------------------------------------------------ one step
    def rollout(self, step: int) -> Experience:
        """This rank's scored rollout of ``step``."""
        lay = self.layout
        prompts, truths = self.prompts.for_step(step, lay.dp_rank, lay.dp_size)
        return self.producer.produce(prompts, truths, seed=rollout_seed(self.config.trainer.seed, step, lay.dp_rank))

    def eval_prompts(self) -> list[tuple[str, str]]:
        """The held-out prompts of every evaluation (read once)."""
        if self._eval_prompts is None:
            self._eval_prompts = eval_samples(self.config, self.task)
        return self._eval_prompts

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/*`` metrics of the actor as it is now (:mod:`verl_bridge.runtime.evaluation`)."""
        from verl_bridge.runtime.evaluation import evaluate

        return evaluate(self.producer, self.eval_prompts(), step, config=self.config, layout=self.layout)

    def train_step(self, step: int) -> dict[str, float]:
        state = self.state
        t0 = time.perf_counter()
        exp = self.rollout(step)
        t_rollout = time.perf_counter() - t0
        stats = make_experience(exp, state, self.spec)
        t1 = time.perf_counter()
        metrics = {**stats, **update(exp, state, self.spec, step)}
        t_update = time.perf_counter() - t1
        self.engine.sync_weights()
        if self.config.rollout.verify_sync and self.config.rollout.engine == "native":  # rollout/verify.py
            from verl_bridge.rollout.verify import resolve_threshold, verify_native_engine
            threshold = resolve_threshold(self.config.rollout.verify_threshold, state.roles.actor)
            if self.layout.pp_size > 1:  # every generation replica against the pipelined training forward
                from verl_bridge.runtime.experience import sequence_log_probs

                pp = self.layout.pp_size
                self.engine.verify(lambda ids: sequence_log_probs(state.roles.actor, ids, pp_size=pp),
                                   threshold=threshold)
            else:
                verify_native_engine(state.roles.actor, engine=self.engine, threshold=threshold)
        t_train = time.perf_counter() - t1
        mask = exp.response_mask
        metrics["reward_mean"] = float(exp.scores.mean())
        metrics["response_length"] = float(mask.sum(dim=1).mean())
        metrics = _mean_over_dp(metrics, self.layout)
        tokens = _sum_over_dp(float(exp.attention_mask.sum()), self.layout)
        elapsed = time.perf_counter() - t0
        # time_train_s: update + weight sync + sync check (as before); time_experience_s: old/ref
        # log-probs, values, advantages; time_update_s: the optimizer steps alone (what MFU is of)
        metrics.update(throughput_tokens_per_s=tokens / elapsed, time_rollout_s=t_rollout,
                       time_train_s=t_train, time_step_s=elapsed, time_experience_s=t1 - t0 - t_rollout,
                       time_update_s=t_update)
        # a placed reward's timings: time_rollout_s (generation), time_reward_s, time_reward_wait_s
        metrics.update(self.producer.reward.timings)
        state.kl_ctl.update(metrics["kl"], n_steps=exp.size * self.layout.dp_size)
        return metrics

    # ------------------------------------------------------------------ loop
    def _saves_checkpoints(self) -> bool:
        """``trainer.output_dir`` is set and no separate reward group runs (it cannot save yet; the
        validator refuses ``save_every`` with one, and the end of such a run is not saved either)."""
        if not self.config.trainer.output_dir:
            return False
        return self.placement is None or getattr(self.placement, "roles", None) is None

    def train(self) -> list[dict]:
        """Run ``trainer.total_steps`` steps; returns the per-step metrics (also in metrics.jsonl).

        SIGTERM / SIGINT stop it at the next step boundary on every rank, after saving the last finished
        step: :class:`~verl_bridge.runtime.stop.Stopped` is raised (exit code 143 / 130 from the CLI)."""
        from verl_bridge.runtime.stop import StopSignals

        with StopSignals() as signals:
            try:
                self.setup()
                if self.placement is not None and self.placement.is_reward_rank:
                    return self.placement.serve()  # scores micro-batches until the actor ranks stop it
                return self._loop(signals)
            except RuntimeError as exc:
                from verl_bridge.distributed.watchdog import explain_timeout, is_timeout

                if is_timeout(exc) and dist.is_initialized() and dist.get_world_size() > 1:
                    raise explain_timeout(exc, dist.get_rank(), dist.get_world_size()) from exc
                raise
            finally:
                self._release_run_dir()

    def _stop_groups(self) -> tuple:
        """Groups whose product covers the training ranks (a placed reward group does not take part)."""
        from verl_bridge.distributed import model_parallel_state

        mps = model_parallel_state()
        pp = mps.pp_group if mps is not None and mps.pp_size > 1 else None
        groups = tuple(g for g in (self.layout.tp_group, self.layout.dp_group, pp) if g is not None)
        return groups if self.placement is not None else ()  # no placement: the whole world, one reduction

    def _loop(self, signals) -> list[dict]:
        from verl_bridge.checkpoint.trainer_state import resume_trainer, save_trainer_checkpoint
        from verl_bridge.runtime.evaluation import should_evaluate
        from verl_bridge.runtime.stop import Stopped

        state = self.state
        resumed = resume_trainer(state)
        if resumed is not None:
            state.step = resumed
            # the engine's weights were filled before the checkpoint was loaded into the actor: at
            # PP>1 (generation replicas) or with vLLM they are a copy, and would roll out the initial model
            self.engine.sync_weights()
            self.logger.truncate_after(resumed)
            if self.is_logger:
                info(f"resumed from step {resumed}")
        else:
            self.logger.reset()
        total = self.config.trainer.total_steps
        groups = self._stop_groups()
        device = self.device if self.device.type == "cuda" else None
        try:
            if state.step == 0 and should_evaluate(self.config, 0):  # eval-only record at step 0
                e = self.evaluate(0)
                self.history.append({"step": 0, **e})
                self.logger.log(0, e)
            first = state.step  # a resumed run starts after its checkpoint
            saved = first
            every, saves = self.config.trainer.save_every, self._saves_checkpoints()
            while state.step < total:
                state.step += 1
                m = self.train_step(state.step)
                if should_evaluate(self.config, state.step):
                    m.update(self.evaluate(state.step))
                for k in ("actor_loss", "reward_mean", "kl", "entropy"):
                    if not math.isfinite(m.get(k, 0.0)):
                        raise FloatingPointError(f"step {state.step}: {k} is {m[k]} (not finite); "
                                                 "lower optim.actor.lr")
                self.history.append({"step": state.step, **m})
                self.logger.log(state.step, m)
                if saves and every and state.step % every == 0:
                    save_trainer_checkpoint(state, state.step)
                    saved = state.step
                signum = signals.agreed(groups, device)  # every rank: the same answer at the same step
                if signum is not None:
                    raise self._stop(signum, saves, saved, Stopped)
            # trainer.save_every: 0 means "only at the end"; with N, the end is saved too when it is not
            # a multiple of N (as Megatron-LM's train() does)
            if saves and state.step > first and not (every and state.step % every == 0):
                save_trainer_checkpoint(state, state.step)
        finally:
            self.logger.close()
            if self.placement is not None:
                self.placement.close()
        return self.history

    def _stop(self, signum: int, saves: bool, saved: int, stopped_cls):
        """Save the last finished step (unless just saved) and build the :class:`Stopped` to raise."""
        import signal as _signal

        from verl_bridge.checkpoint.trainer_state import save_trainer_checkpoint

        step, name = self.state.step, _signal.Signals(signum).name
        if saves and saved != step:
            save_trainer_checkpoint(self.state, step)
        if saves:
            msg = (f"stopped by {name} after step {step}; checkpoint of step {step} saved in "
                   f"{self.config.trainer.output_dir}/checkpoints. Resume with the same command plus "
                   "trainer.resume=auto")
        else:
            msg = f"stopped by {name} after step {step}; no trainer.output_dir, so nothing was saved"
        if self.is_logger:
            info(msg)
        return stopped_cls(signum, step, saves, msg)
