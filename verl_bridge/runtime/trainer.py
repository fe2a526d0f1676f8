"""``MegatronTrainer``: one SPMD runtime for PPO, GRPO, RLOO and REINFORCE++ on megatron-core.

One step (every rank runs the same code; TP ranks hold identical samples, DP ranks different ones):

    prompts ─▶ native rollout (actor's own Megatron model, KV cache) ─▶ responses
    responses ─▶ reward function ─▶ scores
    actor / reference / critic forward (forward_backward_func, forward_only) ─▶ old log-probs,
        reference log-probs, values
    KL (in the reward or in the loss) ─▶ advantages (gae | grpo | rloo | reinforce_plus_plus)
    actor (+ critic) updates: ppo_epochs x mini-batches x micro-batches, gradient clipping
    metrics ─▶ console + metrics.jsonl

Algorithm choices are strategy lookups in :mod:`verl_bridge.algorithms` registries; there is one
``train`` loop for all of them.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from verl_bridge import algorithms as A
from verl_bridge.config import Config, dump_config, load_config
from verl_bridge.runtime.batch import Experience, model_inputs, response_slice
from verl_bridge.runtime.logprobs import token_entropy, token_log_probs
from verl_bridge.runtime.metrics import MetricsLogger, info

ADVANTAGE_FOR_ALGORITHM = {"ppo": "gae", "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_plus_plus"}


@dataclass
class Roles:
    actor: torch.nn.Module
    actor_optimizer: Any
    reference: Optional[torch.nn.Module]
    critic: Optional[torch.nn.Module]
    critic_optimizer: Any


def _mean_over_dp(values: dict[str, float]) -> dict[str, float]:
    from verl_bridge.parallel import data_parallel_group, data_parallel_world_size

    dp = data_parallel_world_size()
    if dp == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, group=data_parallel_group())
    return {k: float(v) / dp for k, v in zip(keys, t.tolist())}


def _sum_over_dp(x: float) -> float:
    from verl_bridge.parallel import data_parallel_group, data_parallel_world_size

    if data_parallel_world_size() == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, group=data_parallel_group())
    return float(t.item())


class MegatronTrainer:
    """Train a Megatron actor with PPO-family RL from a validated :class:`Config`.

    ``config`` may be a Config, a YAML path or a dict; ``overrides`` are ``key=value`` strings.
    ``bridge`` (a :class:`verl_bridge.MegatronBridge`) supplies the user's hooks when given as
    Python callables instead of ``"module:function"`` strings.
    """

    def __init__(self, config: Config | str | dict, overrides: Optional[list[str]] = None, *,
                 bridge=None, reward_fn: Optional[Callable[[str, str], float]] = None):
        if not isinstance(config, Config) or overrides:
            config = load_config(config, overrides)
        self.config = config
        self.bridge = bridge
        self._reward_fn = reward_fn
        self.step = 0
        self.history: list[dict] = []
        self.placement = None  # verl_bridge.placement.runtime.Placement when the reward is placed

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        from verl_bridge.bridge import MegatronBridge
        from verl_bridge.parallel import seed_everything

        cfg = self.config
        if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("trainer.device='cuda' but CUDA is not available on this machine; use auto or cpu")
        if self.bridge is None:
            self.bridge = MegatronBridge.from_config(cfg)
        self.layout = self.bridge.initialize()
        self.device = self.layout.device
        seed_everything(cfg.trainer.seed)
        self.tokenizer, self.task = self.bridge.tokenizer_and_task()
        self.reward_fn = self._reward_fn or self.bridge.reward_fn(self.task)
        from verl_bridge.placement.runtime import Placement

        self.placement = Placement.from_trainer(self)  # None: every role colocated, reward a function
        if self.placement is not None and self.placement.is_reward_rank:
            return  # a separate reward group builds only its scorer
        self.roles = self.bridge.build_roles()
        self.is_logger = dist.get_rank() == 0
        run_dir = cfg.trainer.output_dir
        if self.is_logger and run_dir:
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as f:
                f.write(dump_config(cfg))
        a = cfg.algorithm
        self.kl_ctl = A.build_kl_controller(a.kl.coef, a.kl.target, a.kl.horizon)
        self.logger = MetricsLogger(run_dir, cfg.trainer.total_steps, self.is_logger, cfg.trainer.progress_bar,
                                    cfg.trainer.log_every)
        lay = self.layout
        if self.is_logger:
            info(f"MegatronTrainer initialized with TP={lay.tp_size}, PP={lay.pp_size}, "
                 f"SP={cfg.trainer.args.sequence_parallel}")
            info(f"world={lay.world_size} dp={lay.dp_size} device={self.device.type} "
                 f"algorithm={a.name} advantages={ADVANTAGE_FOR_ALGORITHM[a.name]} "
                 f"critic={'yes' if self.roles.critic is not None else 'no'} "
                 f"reference={'yes' if self.roles.reference is not None else 'no'} rollout={cfg.rollout.engine}")
        from verl_bridge.rollout.native import NativeEngine

        if cfg.rollout.engine == "vllm":  # GPU only: a readable error without vLLM or CUDA
            from verl_bridge.rollout.vllm_engine import build_vllm_engine

            self.engine = build_vllm_engine(cfg, self.roles.actor, self.layout)
        elif cfg.rollout.engine != "native":
            raise RuntimeError(f"rollout.engine={cfg.rollout.engine!r} is not available in this build; use native")
        else:
            self.engine = NativeEngine(self.roles.actor, self.device, compile=cfg.rollout.compile_decode)

    # ------------------------------------------------------------------ helpers
    def _forward(self, model, batches: list[Experience], loss_fn, forward_only: bool) -> list[dict]:
        from verl_bridge.runtime.schedule import cpu_forward_backward_no_pipelining, get_forward_backward_func

        # a replicated non-megatron module (the HF critic) runs the plain loop on any device and PP size
        fb = (cpu_forward_backward_no_pipelining if getattr(model, "runs_outside_megatron_schedule", False)
              else get_forward_backward_func(self.layout.pp_size))

        def forward_step(data_iterator, module):
            mb = next(data_iterator)
            ids, pos, mask = model_inputs(mb.input_ids, mb.attention_mask)
            out = module(ids, pos, mask)
            return out, partial(loss_fn, mb)

        seq = batches[0].input_ids.shape[1]
        return fb(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                  num_microbatches=len(batches), seq_length=seq, micro_batch_size=batches[0].size,
                  forward_only=forward_only)

    def _logits(self, output: torch.Tensor, mb: Experience) -> torch.Tensor:
        logits = response_slice(output, mb.prompt_len, mb.response_ids.shape[1])
        t = self.config.rollout.temperature
        return logits.float() / t if t and t != 1.0 else logits.float()

    def _compute_log_probs(self, model, exp: Experience, with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        def loss_fn(mb, output):
            logits = self._logits(output, mb)
            lp = token_log_probs(logits, mb.response_ids)
            out = {"log_probs": lp.detach()}
            if with_entropy:
                out["entropy"] = token_entropy(logits).detach()
            return torch.zeros(()), out

        mbs = exp.micro_batches(self.config.algorithm.micro_batch_size)
        with torch.no_grad():
            res = self._forward(model, mbs, loss_fn, forward_only=True)
        lp = torch.cat([r["log_probs"] for r in res])
        ent = torch.cat([r["entropy"] for r in res]) if with_entropy else None
        return lp, ent

    def _compute_values(self, exp: Experience) -> torch.Tensor:
        def loss_fn(mb, output):
            v = response_slice(output, mb.prompt_len, mb.response_ids.shape[1]).squeeze(-1).float()
            return torch.zeros(()), {"values": v.detach()}

        with torch.no_grad():
            res = self._forward(self.roles.critic, exp.micro_batches(self.config.algorithm.micro_batch_size),
                                loss_fn, forward_only=True)
        return torch.cat([r["values"] for r in res])

    # ------------------------------------------------------------------ one step
    def _prompts_for_step(self, step: int) -> tuple[list[list[int]], list[str], list[str]]:
        cfg = self.config
        rng = random.Random(cfg.trainer.seed * 1_000_003 + step)
        samples = self.bridge.sample_prompts(self.task, rng, cfg.data.rollout_batch_size)
        per_rank = cfg.data.rollout_batch_size // self.layout.dp_size
        mine = samples[self.layout.dp_rank * per_rank:(self.layout.dp_rank + 1) * per_rank]
        g = cfg.algorithm.group_size
        prompts = [p for p, _ in mine for _ in range(g)]
        truths = [t for _, t in mine for _ in range(g)]
        ids = [self.tokenizer.encode(p)[-cfg.data.max_prompt_length:] for p in prompts]
        return ids, prompts, truths

    def rollout(self, step: int) -> Experience:
        from verl_bridge.rollout.base import SamplingParams

        cfg = self.config
        if self.placement is not None:  # a reward model, or a separate reward group (verl_bridge.placement)
            return self.placement.rollout(step)
        ids, _, truths = self._prompts_for_step(step)
        params = SamplingParams(
            max_new_tokens=cfg.data.max_response_length, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
            eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id,
        )
        seed = (cfg.trainer.seed * 7919 + step) * 131 + self.layout.dp_rank
        batch = self.engine.generate(ids, params, seed=seed)
        texts = [self.tokenizer.decode(r[m.bool()].tolist()) for r, m in zip(batch.response_ids, batch.response_mask)]
        scores = torch.tensor([float(self.reward_fn(t, gt)) for t, gt in zip(texts, truths)], dtype=torch.float32)
        return Experience(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, prompt_len=batch.prompt_ids.shape[1],
            response_ids=batch.response_ids, response_mask=batch.response_mask.float(), scores=scores.to(self.device),
        )

    def make_experience(self, exp: Experience) -> dict[str, float]:
        cfg, a = self.config, self.config.algorithm
        mask = exp.response_mask
        old_lp, entropy = self._compute_log_probs(self.roles.actor, exp, with_entropy=True)
        exp.tensors["old_log_probs"] = old_lp
        stats: dict[str, float] = {"entropy": float(A.masked_mean(entropy, mask))}
        if self.roles.critic is not None:
            exp.tensors["values"] = self._compute_values(exp)
        coef = self.kl_ctl.value
        if self.roles.reference is not None:
            ref = self.roles.reference
            offload = cfg.model.reference is not None and cfg.model.reference.args.offload
            if offload:
                ref.to(self.device)
            ref_lp, _ = self._compute_log_probs(ref, exp)
            if offload:
                ref.to("cpu")
            exp.tensors["ref_log_probs"] = ref_lp
            # one pass gives the KL metric and, when KL sits in the reward, the penalised rewards
            reward_coef = coef if a.kl.placement == "reward" else 0.0
            token_rewards, kl_mean = A.apply_kl_to_rewards(exp.scores, old_lp, ref_lp, mask, reward_coef,
                                                           a.kl.estimator)
        else:
            token_rewards, kl_mean = A.scores_to_token_rewards(exp.scores, mask), 0.0
        est = ADVANTAGE_FOR_ALGORITHM[a.name]
        adv, ret = A.ADVANTAGE_ESTIMATORS[est](
            token_rewards=token_rewards, values=exp.tensors.get("values"), scores=exp.scores, mask=mask,
            gamma=a.gamma, lam=a.lam, group_size=a.group_size, norm_by_std=a.norm_adv_by_std,
        )
        if a.whiten_advantages and est == "gae":
            adv = A.masked_whiten(adv, mask)
        exp.tensors["advantages"] = adv
        exp.tensors["returns"] = ret
        stats["kl"] = kl_mean
        stats["kl_coef"] = coef
        return stats

    def _actor_loss(self, mb: Experience, output: torch.Tensor):
        a = self.config.algorithm
        mask = mb.response_mask
        logits = self._logits(output, mb)
        lp = token_log_probs(logits, mb.response_ids)
        low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
        high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
        pg_loss, st = A.ppo_policy_loss(lp, mb.tensors["old_log_probs"], mb.tensors["advantages"], mask,
                                        clip_ratio_low=low, clip_ratio_high=high, dual_clip_c=a.dual_clip_c,
                                        loss_agg_mode=a.loss_agg_mode)
        loss = pg_loss
        if a.entropy_coef > 0:
            ent = token_entropy(logits)
            loss = loss - a.entropy_coef * A.aggregate_loss(ent, mask, a.loss_agg_mode)
        if a.kl.placement == "loss" and "ref_log_probs" in mb.tensors and self.kl_ctl.value > 0:
            kl = A.kl_penalty(lp, mb.tensors["ref_log_probs"], a.kl.estimator)
            loss = loss + self.kl_ctl.value * A.aggregate_loss(kl, mask, a.loss_agg_mode)
        return loss, {"actor_loss": float(loss.detach()), "pg_loss": float(pg_loss.detach()), **st}

    def _critic_loss(self, mb: Experience, output: torch.Tensor):
        a = self.config.algorithm
        v = response_slice(output, mb.prompt_len, mb.response_ids.shape[1]).squeeze(-1).float()
        loss, st = A.value_loss(v, mb.tensors["values"], mb.tensors["returns"], mb.response_mask,
                                clip_range=a.value_clip, loss_agg_mode=a.loss_agg_mode)
        loss = a.vf_coef * loss
        return loss, {"critic_loss": float(loss.detach()), **st}

    def _update(self, model, optimizer, exp: Experience, loss_fn, step: int) -> dict[str, float]:
        a = self.config.algorithm
        dp = self.layout.dp_size
        mini = (a.mini_batch_size or exp.size * dp) // dp
        gen = torch.Generator().manual_seed(self.config.trainer.seed + step)
        sums: dict[str, float] = {}
        count = 0
        grad_norms = []
        model.train()
        for _epoch in range(a.ppo_epochs):
            order = torch.randperm(exp.size, generator=gen)
            for start in range(0, exp.size, mini):
                part = exp.select(order[start:start + mini].to(exp.input_ids.device))
                optimizer.zero_grad()
                res = self._forward(model, part.micro_batches(a.micro_batch_size), loss_fn, forward_only=False)
                ok, norm = optimizer.step()
                grad_norms.append(norm)
                for r in res:
                    for k, v in r.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
                    count += 1
        out = {k: v / max(count, 1) for k, v in sums.items()}
        out["grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        return out

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        exp = self.rollout(step)
        t_rollout = time.perf_counter() - t0
        stats = self.make_experience(exp)
        t1 = time.perf_counter()
        actor_stats = self._update(self.roles.actor, self.roles.actor_optimizer, exp, self._actor_loss, step)
        metrics = {**stats, **actor_stats}
        if self.roles.critic is not None:
            critic_stats = self._update(self.roles.critic, self.roles.critic_optimizer, exp, self._critic_loss, step)
            metrics["critic_loss"] = critic_stats.pop("critic_loss")
            metrics["vf_clipfrac"] = critic_stats.get("vf_clipfrac", 0.0)
            metrics["critic_grad_norm"] = critic_stats.get("grad_norm", 0.0)
        self.engine.sync_weights()
        if self.config.rollout.verify_sync and self.config.rollout.engine == "native":  # rollout/verify.py
            from verl_bridge.rollout.verify import resolve_threshold, verify_native_engine
            verify_native_engine(self.roles.actor, engine=self.engine,
                                 threshold=resolve_threshold(self.config.rollout.verify_threshold, self.roles.actor))
        t_train = time.perf_counter() - t1
        mask = exp.response_mask
        metrics["reward_mean"] = float(exp.scores.mean())
        metrics["response_length"] = float(mask.sum(dim=1).mean())
        metrics = _mean_over_dp(metrics)
        tokens = _sum_over_dp(float(exp.attention_mask.sum()))
        elapsed = time.perf_counter() - t0
        metrics.update(throughput_tokens_per_s=tokens / elapsed, time_rollout_s=t_rollout,
                       time_train_s=t_train, time_step_s=elapsed)
        if self.placement is not None:  # time_rollout_s (generation), time_reward_s, time_reward_wait_s
            metrics.update(self.placement.timings)
        self.kl_ctl.update(metrics["kl"], n_steps=exp.size * self.layout.dp_size)
        return metrics

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict]:
        """Run ``trainer.total_steps`` steps; returns the per-step metrics (also in metrics.jsonl)."""
        self.setup()
        if self.placement is not None and self.placement.is_reward_rank:
            return self.placement.serve()  # scores micro-batches until the actor ranks stop it
        from verl_bridge.checkpoint.trainer_state import resume_trainer, save_trainer_checkpoint
        from verl_bridge.runtime.evaluation import evaluate, should_evaluate

        resumed = resume_trainer(self)
        if resumed is not None:
            self.step = resumed
            self.logger.truncate_after(resumed)
            if self.is_logger:
                info(f"resumed from step {resumed}")
        else:
            self.logger.reset()
        total = self.config.trainer.total_steps
        try:
            if self.step == 0 and should_evaluate(self.config, 0):  # eval-only record at step 0
                e = evaluate(self, 0)
                self.history.append({"step": 0, **e})
                self.logger.log(0, e)
            while self.step < total:
                self.step += 1
                m = self.train_step(self.step)
                if should_evaluate(self.config, self.step):
                    m.update(evaluate(self, self.step))
                for k in ("actor_loss", "reward_mean", "kl", "entropy"):
                    if not math.isfinite(m.get(k, 0.0)):
                        raise FloatingPointError(f"step {self.step}: {k} is {m[k]} (not finite); lower optim.actor.lr")
                self.history.append({"step": self.step, **m})
                self.logger.log(self.step, m)
                every = self.config.trainer.save_every
                if self.config.trainer.output_dir and ((every and self.step % every == 0)):
                    save_trainer_checkpoint(self, self.step)
        finally:
            self.logger.close()
            if self.placement is not None:
                self.placement.close()
        return self.history
