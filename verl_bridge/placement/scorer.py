"""Reward scorers: ``scorer(input_ids, attention_mask, prompt_len, truths) -> fp32 scores [B]``.

* :class:`ModelScorer` (``model.reward.type: model``): a frozen megatron GPTModel whose output
  layer is a scalar head (:func:`verl_bridge.common.roles.to_critic`); the score of a sequence
  is the head's value at its last non-pad token. The model comes from ``model.reward.args``
  (``preset``, ``model_provider`` or ``model_name_or_path``, like the actor), optionally with
  ``load_path`` weights; without them its weights (head included) are drawn from
  ``trainer.seed``, the same on every rank, so a reward model built on any group is the same
  model. ``args.offload`` keeps it on CPU between uses. ``args.path`` may instead name a
  ``"module:function"`` that returns a scorer ``f(input_ids, attention_mask) -> scores``.
* :class:`FunctionScorer` (``type: function``): decodes each response and calls the reward
  function, for an expensive reward function run on its own ranks.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from verl_bridge.rewards.checked import checked_reward
from verl_bridge.common.batch import model_inputs

REWARD_SEED_OFFSET = 7_777_777  # the reward model's weights: trainer.seed + this


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token (prompts left-padded, responses right-padded)."""
    pos = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * (pos + 1)).argmax(dim=1)


class ModelScorer:
    def __init__(self, model: torch.nn.Module, device: torch.device, offload: bool = False):
        self.model = model
        self.device = device
        self.offload = offload

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int = 0,
                 truths: Optional[list[str]] = None) -> torch.Tensor:
        ids = input_ids.to(self.device)
        am = attention_mask.to(self.device)
        if self.offload:
            self.model.to(self.device)
        ids, pos, mask = model_inputs(ids, am)
        values = self.model(ids, pos, mask)  # [B, S, 1]
        if self.offload:
            self.model.to("cpu")
        rows = torch.arange(ids.shape[0], device=ids.device)
        return values[rows, last_token_index(am), 0].float().cpu()


class CallableScorer:
    """A user scorer from ``model.reward.args.path``: ``f(input_ids, attention_mask) -> scores``."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, input_ids, attention_mask, prompt_len=0, truths=None) -> torch.Tensor:
        return torch.as_tensor(self.fn(input_ids, attention_mask), dtype=torch.float32).reshape(-1).cpu()


class FunctionScorer:
    """``reward_fn(response_text, ground_truth)`` on the decoded responses (the group's TP rank 0 only)."""

    def __init__(self, reward_fn: Callable[[str, str], float], tokenizer):
        self.reward_fn = checked_reward(reward_fn)  # named, time-limited, finite values (rewards/checked.py)
        self.tokenizer = tokenizer

    def __call__(self, input_ids, attention_mask, prompt_len, truths) -> torch.Tensor:
        if truths is None:  # TP ranks > 0 of the reward group: rank 0 answers
            return torch.zeros(input_ids.shape[0], dtype=torch.float32)
        resp, m = input_ids[:, prompt_len:], attention_mask[:, prompt_len:]
        texts = [self.tokenizer.decode(r[k.bool()].tolist()) for r, k in zip(resp, m)]
        return torch.tensor(self.reward_fn.score(texts, truths), dtype=torch.float32)


def _provider(bridge, args):
    cfg = bridge.config
    if args.model_provider:
        from verl_bridge.rewards.loading import resolve_callable

        return resolve_callable(args.model_provider, cfg.source_dir, what="model.reward.args.model_provider")
    if args.preset == "tiny":
        from verl_bridge.models.tiny import tiny_model_provider

        vocab, length = bridge.vocab_and_length()
        return tiny_model_provider(args, vocab, length, cfg.trainer.precision, tp_size=bridge.layout.tp_size)
    if args.model_name_or_path:
        from verl_bridge.arch import hf_model_provider

        from verl_bridge.data.files import local_dir

        return hf_model_provider(local_dir(args.model_name_or_path, cfg.source_dir, args.revision))
    raise RuntimeError("model.reward (type model): set args.preset, args.model_provider, args.model_name_or_path "
                       "or args.path")


def build_reward_model(bridge) -> torch.nn.Module:
    """The frozen reward GPTModel on this rank (the caller's TP group shards it)."""
    from verl_bridge.common.hooks import call_model_provider
    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.common.roles import to_critic

    cfg = bridge.config
    args = cfg.model.reward.args
    fn = _provider(bridge, args)
    # seeded and isolated: the same weights on every group, and the actor's RNG stream is untouched
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.trainer.seed + REWARD_SEED_OFFSET)
        model = call_model_provider(fn, True, True, vp_stage=None, model_builder=bridge.model_builder)
        if isinstance(model, (list, tuple)):
            model = model[0]
        model = to_critic(make_cpu_safe(model.to(bridge.layout.device)))
        head = model.output_layer
        with torch.no_grad():
            head.weight.normal_(0.0, 1.0 / model.config.hidden_size ** 0.5)
    if args.load_path:
        from verl_bridge.checkpoint import load_model_weights

        load_model_weights(model, args.load_path)
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    if args.offload:
        model.to("cpu")
    return model


def build_scorer(config, *, bridge, device: torch.device, reward_fn: Optional[Callable], tokenizer) -> Callable:
    """The reward scorer for ``config``, built on the calling rank's group."""
    r = config.model.reward
    if r.type == "model":
        if r.args.path:
            from verl_bridge.rewards.loading import resolve_callable

            return CallableScorer(resolve_callable(r.args.path, config.source_dir, what="model.reward.args.path")())
        return ModelScorer(build_reward_model(bridge), device, offload=r.args.offload)
    return FunctionScorer(reward_fn, tokenizer)
