"""The rollout producer: one sequence for training, evaluation and placed rewards.

    prompts ─▶ token ids (last ``data.max_prompt_length``) ─▶ SamplingParams + seed
            ─▶ engine.generate ─▶ responses ─▶ reward source ─▶ scores ─▶ Experience

A *reward source* turns generations into scores:

* :class:`FunctionReward`: decode each response, call ``reward_fn(text, ground_truth)``;
* :class:`verl_bridge.placement.runtime.Placement`: a reward model on these ranks, or a reward
  group on its own ranks that scores each micro-batch while the next one is generated.

``score(batch, truths)`` scores one finished batch (evaluation); ``generate_and_score`` is the
training path and may pipeline. A source's ``timings`` (``time_rollout_s``, ``time_reward_s``,
``time_reward_wait_s``) describe its last ``generate_and_score``; :class:`FunctionReward` has none.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import torch

from verl_bridge.rewards.checked import checked_reward
from verl_bridge.rollout.base import RolloutBatch, SamplingParams
from verl_bridge.common.batch import Experience

EVAL_SEED_OFFSET = 1_000_000  # evaluation streams never meet a training step's


def rollout_seed(seed: int, step: int, dp_rank: int, *, evaluation: bool = False) -> int:
    """The sampling seed of ``step`` on DP rank ``dp_rank`` (TP ranks of one group share it)."""
    return (seed * 7919 + (EVAL_SEED_OFFSET if evaluation else 0) + step) * 131 + dp_rank


class RewardSource(Protocol):
    timings: dict[str, float]

    def score(self, batch: RolloutBatch, truths: list) -> torch.Tensor: ...

    def generate_and_score(self, engine, ids: list[list[int]], truths: list, params: SamplingParams,
                           seed: int) -> tuple[RolloutBatch, torch.Tensor]: ...


def decode_responses(tokenizer, batch: RolloutBatch) -> list[str]:
    return [tokenizer.decode(r[m.bool()].tolist()) for r, m in zip(batch.response_ids, batch.response_mask)]


class FunctionReward:
    """``reward_fn(response_text, ground_truth) -> float`` on the decoded responses."""

    def __init__(self, reward_fn: Callable[[str, str], float], tokenizer):
        self.reward_fn = checked_reward(reward_fn)  # named, time-limited, finite values (rewards/checked.py)
        self.tokenizer = tokenizer
        self.timings: dict[str, float] = {}

    def score(self, batch: RolloutBatch, truths: list) -> torch.Tensor:
        # float64: .tolist() gives back exactly the floats the function returned
        texts = decode_responses(self.tokenizer, batch)
        return torch.tensor(self.reward_fn.score(texts, truths), dtype=torch.float64)

    def generate_and_score(self, engine, ids, truths, params, seed):
        batch = engine.generate(ids, params, seed=seed)
        return batch, self.score(batch, truths)


class RolloutProducer:
    """Prompts in, scored :class:`Experience` out; ``data`` / ``rollout`` are the config's sections."""

    def __init__(self, engine, tokenizer, reward: RewardSource, *, data, rollout, device: torch.device):
        self.engine = engine
        self.tokenizer = tokenizer
        self.reward = reward
        self.data = data
        self.rollout = rollout
        self.device = device

    def encode(self, prompts: list[str]) -> list[list[int]]:
        return [self.tokenizer.encode(p)[-self.data.max_prompt_length:] for p in prompts]

    def sampling_params(self, temperature: float) -> SamplingParams:
        tok = self.tokenizer
        return SamplingParams(
            max_new_tokens=self.data.max_response_length, temperature=temperature,
            top_p=self.rollout.top_p, top_k=self.rollout.top_k,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )

    def generate(self, prompts: list[str], truths: list, *, temperature: float, seed: int,
                 pipelined: bool = True) -> tuple[RolloutBatch, torch.Tensor]:
        """Generate and score; ``pipelined=False`` scores the finished batch in one call (evaluation)."""
        ids = self.encode(prompts)
        params = self.sampling_params(temperature)
        if pipelined:
            return self.reward.generate_and_score(self.engine, ids, truths, params, seed)
        batch = self.engine.generate(ids, params, seed=seed)
        return batch, self.reward.score(batch, truths)

    def produce(self, prompts: list[str], truths: list, *, seed: int,
                temperature: Optional[float] = None) -> Experience:
        """The training rollout: an :class:`Experience` with fp32 scores on the trainer's device."""
        t = self.rollout.temperature if temperature is None else temperature
        batch, scores = self.generate(prompts, truths, temperature=t, seed=seed)
        exp = Experience(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, prompt_len=batch.prompt_ids.shape[1],
            response_ids=batch.response_ids, response_mask=batch.response_mask.float(),
            scores=scores.to(device=self.device, dtype=torch.float32),
        )
        if batch.log_probs is not None:  # the engine's log-probs of its samples: mismatch metrics, TIS
            exp.tensors["rollout_log_probs"] = batch.log_probs.to(device=self.device, dtype=torch.float32)
        if getattr(batch, "routed_experts", None) is not None:  # routing replay (runtime/routing_replay.py)
            exp.tensors["routed_experts"] = batch.routed_experts.to(device=self.device)
        return exp
