"""Recognise a hand-written PPO/GRPO loop and extract the hyperparameters it proves.

Everything is decided by how a value is *used*, never by the name of a function: the value inside
``torch.clamp(ratio, 1 - x, 1 + x)`` is the clip ratio, the factor multiplying a KL term that is
subtracted from the rewards is the KL coefficient, the ``lr`` that reaches ``torch.optim.AdamW`` is
the actor learning rate, and so on. One concern per module, each a mixin of :class:`Recognizer`:

=================  ==============================================================================
``loops``          loop discovery (module level, ``main()``, a trainer-class method), the entry
                   point, total steps, PPO epochs and minibatches
``batches``        prompts per step from the DataLoader / ``next()`` draws that feed the rollout
                   (through helpers and parameters), epochs x batches of a static dataset
``configs``        config sites: optimizers, sampling kwargs (``**generation_kwargs``,
                   ``LengthSampler``), parallel sizes, checkpoint interval, model hooks
``kl``             the KL penalty: placement (reward | loss), coefficient, controller, estimator
``advantages``     GAE (gamma, lambda), group-normalised rewards (GRPO), whitening
``clip_loss``      the clipped ratio, value clip and loss coefficients
``logprob_roles``  which model produced a log-prob tensor: the frozen reference or the policy
``reward``         the reward function
``probe``          the advantage estimator identified by running its extracted block on synthetic
                   rewards in a sandboxed subprocess (fallback: the static recognisers)
``loss_agg``       ``algorithm.loss_agg_mode`` found by running the statements that reduce the masked
                   loss to the value given to ``backward()`` on a ragged synthetic batch (sandboxed)
``policy_gradient`` an update with no ratio: on-policy (one optimizer step per rollout batch) is
                   one PPO epoch; several steps per batch are refused
``semantics``      warnings for what changes silently: LoRA/PEFT adapters, 4/8-bit loading, frozen or
                   shared layers, reward whitening
``refusals``       blockers named as such: Ray trainer actors, DPO-style preference losses, multi-turn
                   tool-use episodes, replay buffers across steps, a greedy-decoding baseline
``frameworks``     TRL's legacy ``PPOTrainer.step`` loop with its version's defaults, framework
                   entry points that own the loop, gym environments (not an LLM loop)
``report``         the canonical keys left at defaults and the hyperparameters with no mapping
=================  ==============================================================================

The result is an :class:`Analysis`: ``status`` (``migrate`` | ``refuse`` | ``unchanged``),
``reasons`` (every blocker, each with ``file:line`` and the edit that unblocks it), ``warnings``,
``config`` (dotted key -> value) and ``provenance`` (dotted key -> ``file:line``). Refusal is the
default whenever the structure is not certain. Local modules of the same project that the script
imports (``from loss import GRPOLoss``, ``import rl_utils``) are read statically, never executed.
"""

from __future__ import annotations

from .._static import Program
from .advantages import AdvantagesMixin
from .base import TRAINER_QNAMES, Analysis, RecognizerBase
from .batches import BatchesMixin, GroupBufferMixin, PerRankMixin, PerRankMixin
from .clip_loss import ClipLossMixin
from .configs import ConfigSitesMixin
from .frameworks import FrameworksMixin
from .kl import KLMixin
from .logprob_roles import LogProbRolesMixin
from .loss_agg import LossAggMixin
from .loops import LoopsMixin
from .models import ModelsMixin
from .prompts import PromptsMixin
from .values import ValuesMixin
from .report import ReportMixin
from .policy_gradient import PolicyGradientMixin
from .probe import ProbeMixin
from .refusals import RefusalsMixin
from .reward import RewardMixin
from .semantics import SemanticsMixin

__all__ = ["Analysis", "Recognizer", "analyze"]


class Recognizer(LoopsMixin, ModelsMixin, PromptsMixin, ValuesMixin, BatchesMixin, GroupBufferMixin, PerRankMixin, ConfigSitesMixin, KLMixin, AdvantagesMixin,
                 ClipLossMixin, LogProbRolesMixin, RewardMixin, RefusalsMixin, ProbeMixin, LossAggMixin, PolicyGradientMixin,
                 SemanticsMixin, FrameworksMixin, ReportMixin, RecognizerBase):
    def run(self) -> Analysis:
        a = self.a
        trainer_calls = [c for c, _ in self.calls if self.qn(c.func) & set(TRAINER_QNAMES)]
        main_loop = self.find_main_loop()
        if trainer_calls:
            if main_loop is not None:
                return a.refuse("the file already calls MegatronTrainer but still has its own training loop "
                                f"({self.loc(self.p.line(main_loop))}); finish the migration by hand")
            a.status = "unchanged"
            return a
        if self.refuse_non_llm():
            return a
        if self.refuse_blockers(main_loop):
            return a
        if main_loop is None:
            return self.refuse_no_loop()
        self.main_loop = main_loop
        self.loop_func = self.p.func_of(main_loop)
        trl = "trl_step" in self.reach(main_loop)
        if not trl and not self.ratio_clips():
            # no ratio: an on-policy policy gradient (one optimizer step per rollout batch) is PPO at one epoch
            self.check_on_policy()
        self.find_entry_point()
        if trl:
            self.extract_trl()
        else:
            self.extract_clip()
            self.extract_kl()
            self.extract_advantages()
            self.extract_loss_coefs()
            self.extract_loop_shape()
        self.extract_common(trl)
        if a.reasons:
            a.status = "refuse"
            return a
        self.finish_report()
        a.status = "migrate"
        return a

    def extract_common(self, trl: bool) -> None:
        self.extract_optimizers(trl)
        if not trl:
            self.extract_rollout()
        self.extract_parallel()
        self.extract_prompt_length()
        self.extract_run_values()  # values.py: seed, evaluation interval, prompts per step
        self.extract_batches()  # batches.py: prompts per step from the data the rollout draws; epochs x batches
        self.extract_group_buffer()  # batches.py: N groups collected per step, k groups per optimizer step
        self.on_policy_minibatch()  # policy_gradient.py: the whole batch per optimizer step
        self.extract_save()
        self.extract_hooks(trl)
        self.extract_reward()
        self.warn_semantics()
        if not trl:
            self.probe_loss_agg()
            self.probe_loss_aggregation()  # loss_agg.py: the general case, by behaviour
        self.unsupported()


def analyze(prog: Program, module_name: str) -> Analysis:
    return Recognizer(prog, module_name).run()
