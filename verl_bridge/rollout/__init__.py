"""Rollout engines: ``native`` (the actor's own Megatron model with a KV cache) and ``vllm``.

An engine takes tokenised prompts and sampling parameters and returns responses; every TP rank
of a model-parallel group receives identical samples.
"""

from verl_bridge.rollout.base import RolloutBatch, SamplingParams  # noqa: F401
