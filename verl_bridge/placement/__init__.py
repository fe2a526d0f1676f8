"""Role placement: run the reward (a reward model or an expensive reward function) on its own ranks.

``model.reward.placement`` is ``colocated`` (the default: every role on every rank) or a mapping
``{ranks: N, tp_size: T}``: the last N ranks of the torchrun world score rewards, the actor keeps
the first ``world - N`` ranks with ``trainer.args.tp_size/pp_size``. Rollout ranks send finished
micro-batches through an asynchronous queue over torch.distributed (:mod:`.queue`) and generate
the next micro-batch while the previous one is scored.

* :mod:`.spec`    config parsing, validation and the ``--dry-run`` layout (no torch);
* :mod:`.groups`  splitting the world into role groups (megatron-core's parallel_state is global);
* :mod:`.scorer`  the frozen reward model (a GPTModel with a scalar head) or a reward function;
* :mod:`.queue`   the scoring queue (isend/irecv of a header + payload);
* :mod:`.runtime` what the trainer calls: micro-batched rollout with overlap, the reward-rank loop.
"""
