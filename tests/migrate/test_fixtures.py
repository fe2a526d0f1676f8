"""The fixture corpus: status, extracted values, provenance, warnings and the exact rewrite.

Each ``fixtures/<name>.py`` is a script written for these tests; ``fixtures/after/<name>.py`` and
``.yaml`` hold the expected rewrite and config for the ones that migrate.
"""

from __future__ import annotations

import os

import libcst as cst
import pytest
import yaml
from libcst.codemod import CodemodContext, CodemodTest

from verl_bridge.codemods.migrate_ppo_loop import MigratePPOLoopCommand
from verl_bridge.migrate.engine import migrate_source
from verl_bridge.migrate.yamlout import nest

HERE = os.path.dirname(__file__)
FIX = os.path.join(HERE, "fixtures")

# name -> (status, expected config subset, provenance lines, substrings of reasons, substrings of warnings)
EXPECT = {
    "megatron_lm_ppo": ("migrated", {
        "algorithm.name": "ppo", "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.3,
        "algorithm.kl.coef": 0.02, "algorithm.kl.placement": "reward", "algorithm.kl.estimator": "k1",
        "algorithm.gamma": 0.99, "algorithm.lam": 0.95, "algorithm.vf_coef": 0.1, "algorithm.ppo_epochs": 4,
        "optim.actor.lr": 1e-6, "trainer.total_steps": 1000, "trainer.save_every": 50,
        "data.max_response_length": 128, "algorithm.micro_batch_size": 4,
        "model.actor.args.model_provider": "megatron_lm_ppo:model_provider"},
        {"algorithm.clip_ratio": 16, "optim.actor.lr": 64, "algorithm.kl.coef": 18},
        [], ["args.weight_decay", "reward", "initialize_megatron is imported"]),
    "mcore_ppo_names": ("migrated", {
        "algorithm.kl.coef": 0.1, "algorithm.clip_ratio": 0.2, "optim.actor.lr": 5e-6, "optim.critic.lr": 1e-5,
        "algorithm.gamma": 1.0, "algorithm.lam": 0.9, "algorithm.ppo_epochs": 2, "algorithm.mini_batch_size": 16,
        "algorithm.whiten_advantages": True, "trainer.args.tp_size": 2, "rollout.temperature": 0.7,
        "rollout.top_p": 0.9, "model.reward.args.path": "mcore_ppo_names:score"},
        {"algorithm.kl.coef": 5, "algorithm.clip_ratio": 7, "optim.actor.lr": 14}, [], []),
    "grpo_k3": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 8, "algorithm.clip_ratio_low": 0.2,
        "algorithm.clip_ratio_high": 0.28, "algorithm.kl.estimator": "k3", "algorithm.kl.placement": "loss",
        "algorithm.kl.coef": 0.04, "algorithm.ppo_epochs": 2, "trainer.total_steps": 500,
        "optim.actor.weight_decay": 0.1, "model.reward.args.path": "grpo_k3:accuracy_reward"},
        {"algorithm.ppo_epochs": 4, "trainer.total_steps": 5, "algorithm.group_size": 3}, [], []),
    "trl_dict_config": ("migrated", {
        "algorithm.kl.coef": 0.2, "algorithm.kl.target": 6, "algorithm.kl.horizon": 10000,
        "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.2, "algorithm.vf_coef": 0.1,
        "algorithm.ppo_epochs": 4, "optim.actor.lr": 1.41e-5, "model.actor.args.model_name_or_path": "models/gpt2-imdb",
        "model.reward.args.path": "trl_dict_config:reward_fn"},
        {"algorithm.kl.coef": 8}, [], ["total_steps is left out", "count samples per process"],
        # TRL's batch_size / mini_batch_size are per process: the global sizes depend on the launch
        {"absent": ["data.rollout_batch_size", "algorithm.mini_batch_size"]}),
    "trl_pipeline_reward": ("migrated", {
        "algorithm.kl.coef": 0.05, "algorithm.clip_ratio": 0.1, "trainer.total_steps": 100},
        {}, [], ["reward", "TODO"]),
    "deepspeed_chat": ("migrated", {
        "algorithm.kl.coef": 0.1, "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.2,
        "algorithm.gamma": 1.0, "algorithm.lam": 0.95},
        {"algorithm.kl.coef": 17}, [], ["reward clipping", "ptx", "EMA", "max_length"]),
    "kl_controller": ("migrated", {
        "algorithm.kl.coef": 0.05, "algorithm.kl.target": 6.0, "algorithm.kl.horizon": 10000,
        "optim.actor.lr": 3e-6, "algorithm.gamma": 0.99, "algorithm.lam": 0.9},
        {}, [], []),
    "cleanrl_dataclass": ("migrated", {
        "algorithm.clip_ratio": 0.15, "algorithm.vf_coef": 0.25, "algorithm.entropy_coef": 0.01,
        "algorithm.ppo_epochs": 3, "trainer.total_steps": 300, "algorithm.gamma": 0.97, "algorithm.lam": 0.92,
        "algorithm.kl.coef": 0.03, "optim.actor.lr": 2.5e-5, "optim.actor.clip_grad": 0.5},
        {"algorithm.clip_ratio": 9, "trainer.total_steps": 22}, [], ["early stopping on KL", "learning-rate anneal"]),
    "runtime_values": ("migrated", {"algorithm.clip_ratio": 0.2, "trainer.total_steps": 300, "algorithm.group_size": 8},
        {}, [], ["optim.actor.lr is left out", "world size"]),
    "reward_closure": ("migrated", {"optim.actor.lr": 3e-6, "algorithm.kl.coef": 0.0},
        {"optim.actor.lr": 16}, [], ["LR = 1e-05 is defined", "reward_of", "no KL penalty"]),
    "crlf_cells": ("migrated", {"algorithm.group_size": 4, "model.reward.args.path": "crlf_cells:reward_fn"}, {}, [], []),
    "hook_style": ("refused", {}, {}, ["no training loop of its own", "ppo_train"], []),
    "sft_mentions_ppo": ("refused", {}, {}, ["not an RL training loop"], []),
    "kl_old_policy": ("refused", {}, {}, ["old policy"], []),
    "module_level_loop": ("refused", {}, {}, ["cannot tell how advantages", "model_provider"], []),
    # no ratio is fine on-policy, but plain REINFORCE without a baseline matches no estimator
    "reinforce_no_clip": ("refused", {}, {}, ["cannot tell how advantages are computed"],
                          ["on-policy policy gradient", "clip range (clip_ratio) has no effect"]),
    # the loop is a method of a class in an imported local module, driven from module-level statements;
    # the model load and the trainer object go with the loop (an import of the script trains nothing)
    "class_project/run_grpo": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 6, "algorithm.clip_ratio": 0.15,
        "optim.actor.lr": 1e-6, "optim.actor.weight_decay": 0.05, "trainer.total_steps": 250,
        "data.max_response_length": 200, "model.actor.args.model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct"},
        {"algorithm.group_size": 12, "optim.actor.lr": 12},
        [], ["learner.py:20"], {"provenance": {"algorithm.clip_ratio": "learner.py:6",
                                               "trainer.total_steps": "learner.py:6"}, "block": True}),
    # PPO under the __main__ guard: GAE with a separate scalar-head critic, value-loss coefficient, a reward
    # helper that runs a model it is handed (a reward model: no reward path), LoRA and reward whitening warned
    "main_guard_critic_ppo": ("migrated", {
        "algorithm.name": "ppo", "algorithm.gamma": 0.99, "algorithm.lam": 0.9, "algorithm.clip_ratio": 0.1,
        "algorithm.vf_coef": 0.5, "algorithm.ppo_epochs": 2, "algorithm.whiten_advantages": True,
        "optim.actor.lr": 5e-6, "optim.critic.lr": 2e-5, "trainer.total_steps": 600},
        {"algorithm.gamma": 7, "algorithm.lam": 8, "algorithm.whiten_advantages": 39, "algorithm.vf_coef": 46},
        [], ["judge() (main_guard_critic_ppo.py:11) takes a model (clf)", "rewards are whitened",
             "LoRA/PEFT adapters"], {"absent": ["model.reward.args.path"], "block": True}),
    # leave-one-out baseline per prompt in a numpy loop, found by running the block; on-policy PG
    "onpolicy_loo_groups": ("migrated", {
        "algorithm.name": "rloo", "algorithm.ppo_epochs": 1, "algorithm.group_size": 6, "algorithm.kl.coef": 0.0,
        "optim.actor.lr": 3e-6, "trainer.total_steps": 400, "data.max_response_length": 96,
        "model.reward.args.path": "onpolicy_loo_groups:reward_fn"},
        {"algorithm.ppo_epochs": 35, "algorithm.name": 18}, [],
        ["identified by running the block at onpolicy_loo_groups.py:18", "leave-one-out baseline",
         "clip range (clip_ratio) has no effect"], {"absent": ["algorithm.clip_ratio"]}),
    "already_migrated": ("unchanged", {}, {}, [], []),
    "merge_conflict": ("error", {}, {}, ["merge-conflict"], []),
    # --- real-world shapes (written for these tests after studying public scripts; see README) ---
    # old TRL notebook, everything at module level; PPOConfig sets only model and lr: TRL's defaults
    "trl_legacy_module_level": ("migrated", {
        "algorithm.ppo_epochs": 4, "algorithm.kl.coef": 0.2, "algorithm.kl.target": 6,
        "algorithm.kl.horizon": 10000, "algorithm.vf_coef": 0.1, "algorithm.lam": 0.95, "algorithm.gamma": 1,
        "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.2, "optim.actor.lr": 1.41e-5,
        "data.max_response_length": 15, "rollout.top_p": 1.0,
        "model.actor.args.model_name_or_path": "./models/gpt2-imdb"},
        {"optim.actor.lr": 8, "data.max_response_length": 22},
        [], ["LengthSampler(4, 16)", "save_pretrained", "TODO"],
        {"defaults": {"algorithm.ppo_epochs": "trl<=0.11 PPOConfig default: ppo_epochs=4",
                      "algorithm.kl.coef": "init_kl_coef=0.2", "algorithm.kl.target": "target=6"},
         "unmapped": ["output_min_length=4"], "block": "module"}),
    "trl_hf_argparser": ("migrated", {
        "data.max_response_length": 32, "rollout.top_p": 0.9, "algorithm.ppo_epochs": 4,
        "algorithm.kl.coef": 0.2, "optim.actor.lr": 1e-5, "model.actor.args.model_name_or_path": "./models/sft-125m",
        "model.reward.args.path": "trl_hf_argparser:keyword_reward"},
        {"data.max_response_length": 27}, [], ["flags passed at launch override them"],
        {"defaults": {"optim.actor.lr": "learning_rate=1e-05"},
         "unmapped": ["ScriptArguments.reward_threshold=0.5", "ScriptArguments.max_prompt_tokens=64"]}),
    # trainer-class method loop, self.ppo_trainer, gradient accumulation, adap_kl_ctrl=False
    "trl_runner_class": ("migrated", {
        "algorithm.ppo_epochs": 2,
        "algorithm.kl.coef": 0.1, "optim.actor.lr": 5e-6,
        "data.max_response_length": 48, "model.actor.args.model_name_or_path": "./models/opt-350m-sft"},
        {"algorithm.kl.coef": 14, "model.actor.args.model_name_or_path": 31}, [], [],
        {"absent": ["algorithm.kl.target"], "block": "main"}),
    # Megatron-LM flags in an argument group through extra_args_provider; --beta is the KL weight
    "megatron_extra_args": ("migrated", {
        "algorithm.name": "grpo", "algorithm.kl.coef": 0.001, "algorithm.kl.estimator": "k3",
        "algorithm.kl.placement": "loss", "algorithm.group_size": 8, "algorithm.clip_ratio": 0.2,
        "trainer.total_steps": 400, "data.max_response_length": 256, "rollout.temperature": 0.9,
        "model.reward.args.path": "megatron_extra_args:verify_answer"},
        {"algorithm.kl.coef": 12, "algorithm.group_size": 11}, [], ["args.lr"],
        {"unmapped": ["--seed-offset=17"]}),
    # CleanRL-style GAE: two assignment targets, done masks; --gae-lambda 0.95 must not become 1.0
    "cleanrl_style_llm_gae": ("migrated", {
        "algorithm.name": "ppo", "algorithm.gamma": 0.99, "algorithm.lam": 0.95, "algorithm.clip_ratio": 0.2,
        "algorithm.vf_coef": 0.5, "algorithm.ppo_epochs": 4, "algorithm.kl.coef": 0.05,
        "algorithm.kl.placement": "reward", "trainer.total_steps": 250, "optim.actor.lr": 3e-6,
        "optim.critic.lr": 1e-5, "optim.actor.clip_grad": 1.0, "data.max_response_length": 53,
        "algorithm.whiten_advantages": False},
        {"algorithm.lam": 14, "algorithm.gamma": 13}, [], [], {"unmapped": ["--ent-coef=0.0"]}),
    # the loss and the advantages live in local modules of the same folder
    "local_project/train_grpo_local": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 12, "algorithm.clip_ratio": 0.2,
        "algorithm.kl.coef": 0.01, "algorithm.kl.estimator": "k3", "algorithm.kl.placement": "loss",
        "algorithm.mini_batch_size": 16, "optim.actor.lr": 5e-6, "data.max_response_length": 1024},
        {}, [], [], {"provenance": {"algorithm.kl.estimator": "grpo_loss.py:", "algorithm.name": "rl_utils.py:",
                                    "algorithm.kl.coef": "train_grpo_local.py:26"},
                     "unmapped": ["rollouts_per_step=32"]}),
    # DeepSpeed-Chat layout: main.py two folders below the package holding the trainer class (self.kl_ctl ...)
    "dschat_project/training/step3/main": ("migrated", {
        "algorithm.name": "ppo", "algorithm.kl.coef": 0.1, "algorithm.kl.placement": "reward",
        "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.2, "algorithm.gamma": 1.0, "algorithm.lam": 0.95,
        "algorithm.ppo_epochs": 1, "data.max_response_length": 256},
        {"algorithm.ppo_epochs": 15}, [], ["reward clipping at ../../dschat/rlhf/ppo_trainer.py:24"],
        {"provenance": {"algorithm.kl.coef": "../../dschat/rlhf/ppo_trainer.py:8"},
         "unmapped": ["--num-train-epochs=1"]}),
    # GRPO loop as a method of a trainer class; dataclass args copied onto self; asymmetric clip
    "trainer_method_grpo": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 4, "algorithm.kl.coef": 0.04,
        "algorithm.clip_ratio_low": 0.2, "algorithm.clip_ratio_high": 0.28, "trainer.total_steps": 120,
        "data.max_response_length": 96, "optim.actor.lr": 1e-6},
        {"algorithm.kl.coef": 12}, [], [], {"unmapped": ["GRPOArgs.logging_steps=10"], "block": "main"}),
    "dict_config_grpo": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 6, "algorithm.clip_ratio": 0.25,
        "algorithm.kl.coef": 0.02, "algorithm.kl.estimator": "k1", "trainer.total_steps": 300,
        "optim.actor.lr": 2e-6, "rollout.temperature": 0.8, "data.max_response_length": 200,
        "model.reward.args.path": "dict_config_grpo:exact_match"},
        {"algorithm.kl.coef": 20}, [], [], {"unmapped": ["cfg['prompts_per_step']=24", "cfg['warmup']=10"]}),
    "constants_deepspeed_grpo": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 8, "algorithm.kl.coef": 0.04,
        "algorithm.clip_ratio": 0.2, "trainer.total_steps": 1000, "trainer.save_every": 200,
        "data.max_response_length": 384, "optim.actor.lr": 1e-6, "algorithm.micro_batch_size": 2},
        {"algorithm.kl.coef": 7}, [], [], {"unmapped": ["Q_batch_size=4"]}),
    # TRL example generating per query; the length sampler is called per query into generation_kwargs
    "trl_per_query_sampler": ("migrated", {
        "data.max_response_length": 32, "algorithm.kl.coef": 0.1, "algorithm.kl.horizon": 5000,
        "algorithm.kl.target": 6,
        "model.reward.args.path": "trl_per_query_sampler:positivity"},
        {"data.max_response_length": 20, "algorithm.kl.horizon": 14}, [], ["LengthSampler(8, 33)"],
        {"defaults": {"algorithm.kl.target": "target=6", "algorithm.ppo_epochs": "ppo_epochs=4"}}),
    # tiny-GRPO style: per-prompt rollouts normalised on their own inside the loop over prompts
    "per_prompt_grpo": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 12, "algorithm.kl.coef": 0.01,
        "algorithm.kl.estimator": "k3", "algorithm.clip_ratio": 0.2, "optim.actor.lr": 5e-6,
        "data.max_response_length": 1024, "model.reward.args.path": "per_prompt_grpo:answer_reward"},
        {"algorithm.group_size": 35, "data.max_response_length": 47}, [], ["num_rollouts = 12"]),
    # framework entry points are refused and named; no substring guessing on function names
    "trlx_entry": ("refused", {}, {}, ["trlx.train()", "trlx_entry.py:14"], []),
    "openrlhf_ray_entry": ("refused", {}, {}, ["OpenRLHF", "PPORayActorGroup.fit()"], []),
    "megatron_pretrain_rl": ("refused", {}, {}, ["Megatron-LM's pretrain()", "megatron_pretrain_rl.py:38"], []),
    "nemo_aligner_fit": ("refused", {}, {}, ["NeMo-Aligner", "PPOTrainer.fit()"], []),
    "atari_ppo": ("refused", {}, {}, ["not an LLM loop", "gymnasium"], []),
    "sft_helper_names": ("refused", {}, {}, ["no PPO/GRPO training loop found"], []),
    # refusals that name the real blocker (issue 23), not a symptom such as "no clipped ratio"
    "tool_episodes_masks": ("refused", {}, {}, ["multi-turn tool-use episodes", "TextEnvironment",
                                                "tool_episodes_masks.py:14"], []),
    "replay_offpolicy": ("refused", {}, {}, ["off-policy training from a replay buffer", "`pool`",
                                             "replay_offpolicy.py:40"], []),
    "ray_actor_update": ("refused", {}, {}, ["Ray actor Learner", "ray_actor_update.py:7"], []),
    "pairwise_preference": ("refused", {}, {}, ["offline preference loss", "pairwise_preference.py:22"], []),
    "argmax_baseline": ("refused", {}, {}, ["greedy baseline", "`anchor`", "argmax_baseline.py:16"], []),
    # --- where values come from (issue 23) ---
    # hyphenated file name (a warning naming the module used), HfArgumentParser(OneClass)[0], an expression
    # default, the policy wrapped in a value head after loading (never the hub-id reward classifier), a
    # prompt LengthSampler slice, TRL's per-process batch sizes left out, torch Adam's weight decay 0
    "detox-wrapped-valuehead": ("migrated", {
        "algorithm.name": "ppo", "optim.actor.lr": 1e-5, "algorithm.ppo_epochs": 3, "algorithm.lam": 0.95,
        "model.actor.args.model_name_or_path": "acme/tiny-chat-1b", "data.max_prompt_length": 32,
        "data.max_response_length": 40, "rollout.top_k": 0, "rollout.top_p": 0.95, "trainer.save_every": 40,
        "optim.actor.weight_decay": 0.0},
        {"optim.actor.lr": 19, "model.actor.args.model_name_or_path": 18, "data.max_prompt_length": 48},
        [], ["not an importable module name", "module 'detox_wrapped_valuehead'", "count samples per process"],
        {"absent": ["data.rollout_batch_size", "algorithm.mini_batch_size", "algorithm.micro_batch_size"],
         "defaults": {"optim.actor.weight_decay": "torch.optim.Adam default", "algorithm.kl.coef": "trl<=0.11"},
         "unmapped": ["RunFlags.per_proc_batch=24"]}),
    # everything built inside main(): `config` is first an AutoConfig, then the PPOConfig (the assignment
    # that reaches PPOTrainer counts); the policy checkpoint flag has no default (to_fill, not a refusal);
    # steps=400 / batch_size=16 -> total_ppo_epochs 25 caps the enumerate loop; save interval None = off
    "medqa_required_model": ("migrated", {
        "algorithm.name": "ppo", "algorithm.kl.coef": 0.05, "trainer.total_steps": 25,
        "data.max_prompt_length": 384, "data.max_response_length": 96},
        {"algorithm.kl.coef": 18, "data.max_prompt_length": 20},
        [], ["comes from the command line (--base_ckpt", "trainer.total_steps=25 steps (`break`)"],
        {"absent": ["model.actor.args.model_name_or_path", "trainer.save_every", "algorithm.kl.target"]}),
    # nested tyro dataclasses (default_factory) through a parse helper returning a tuple; a field the helper
    # overwrites at run time is never its stale default (minibatch left out, in unmapped with its expression);
    # the optimizer branch the defaults take (the script's Adam subclass, not the dead weight_decay=0.5 one);
    # GenerationConfig handed to generate; one optimizer over policy + value head = critic lr; GAE roles by
    # name (discount / trace_decay); a reward helper that takes a model is not model.reward.args.path
    "tyro_shared_head_ppo": ("migrated", {
        "algorithm.name": "ppo", "algorithm.gamma": 0.99, "algorithm.lam": 0.9, "algorithm.clip_ratio": 0.15,
        "algorithm.value_clip": 0.3, "algorithm.vf_coef": 0.25, "algorithm.ppo_epochs": 3,
        "algorithm.kl.coef": 0.04, "optim.actor.lr": 2e-6, "optim.actor.eps": 1e-6, "optim.actor.weight_decay": 0.0,
        "optim.critic.lr": 2e-6, "rollout.temperature": 0.8, "data.max_response_length": 20, "rollout.top_k": 0,
        "trainer.total_steps": 300, "model.actor.args.model_name_or_path": "acme/pico-lm"},
        {"algorithm.lam": 20, "optim.actor.lr": 27, "algorithm.clip_ratio": 17},
        [], ["subclass of Adam", "policy and the value head", "takes a model (judge_model)",
             "shard_size is set at run time"],
        {"absent": ["algorithm.mini_batch_size", "model.reward.args.path", "data.rollout_batch_size"],
         "unmapped": ["algorithm.mini_batch_size=<run time: shard_size", "RunKnobs.shards=1"]}),
    # every value from a YAML file beside the script (--settings defaults to it), each with its own
    # file:line; an evaluation pass reuses the rollout helper with other counts / lengths / temperature:
    # the loop's own call decides; seed and evaluation interval from the loop's code
    "yaml_project/train_from_yaml": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 6, "algorithm.clip_ratio": 0.25,
        "algorithm.kl.coef": 0.02, "optim.actor.lr": 3e-6, "optim.actor.weight_decay": 0.05,
        "optim.actor.betas": [0.9, 0.98], "trainer.total_steps": 120, "trainer.seed": 2024,
        "trainer.eval_every": 15, "rollout.temperature": 0.9, "data.max_response_length": 200,
        "model.actor.args.model_name_or_path": "models/pico-instruct"},
        {}, [], [],
        {"provenance": {"optim.actor.lr": "hparams.yaml:5", "algorithm.group_size": "hparams.yaml:9",
                        "data.max_response_length": "hparams.yaml:11", "rollout.temperature": "hparams.yaml:12"}}),
    # --- what one step draws and how the update slices it, by behaviour (issue 23, round 2) ---
    # a DataLoader built by a helper that is called twice (train / eval batch sizes), handed to the loop
    # as a parameter; a Dataset over a list of this file: epochs x ceil(10 / 3) batches; the leave-one-out
    # block runs inline inside the epoch and batch loops (they only repeat it) with a constant group size 5
    "loader_epochs_rloo": ("migrated", {
        "algorithm.name": "rloo", "algorithm.group_size": 5, "data.rollout_batch_size": 3,
        "trainer.total_steps": 20, "algorithm.mini_batch_size": 15, "algorithm.ppo_epochs": 1,
        "optim.actor.lr": 2e-6, "rollout.temperature": 0.7, "data.max_response_length": 16},
        {"data.rollout_batch_size": 59, "trainer.total_steps": 39, "algorithm.group_size": 13}, [],
        ["5 epochs x 4 batches of 3 from a dataset of 10 prompts", "leave-one-out baseline (rloo)"]),
    # prompts drawn with next() in a comprehension; one optimizer step per prompt's group (blocks of a
    # view(P, G, width)), gradients accumulated over reshape(-1, slice, length) slices of the group
    "stream_groups_grpo": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 4, "data.rollout_batch_size": 2,
        "algorithm.mini_batch_size": 4, "algorithm.micro_batch_size": 2, "algorithm.clip_ratio": 0.2,
        "trainer.total_steps": 300, "optim.actor.lr": 3e-6},
        {}, [], []),
    # no ratio on DeepSpeed engines: engine.step() per micro-batch, but gradient_accumulation_steps is that
    # loop's count (N // m for range(0, N, m)): one update per rollout batch; the reference engine has no
    # optimizer (frozen); k3 on a log-ratio named `gap`, summed into a per-token term that the returned loss
    # reads (placement by flow, not by name); a fresh run from `first = 0` (resume branch warned); each rank
    # draws 64 // world_size // 8 prompts: n / W for W = 1, 2, 4, 8, so the whole step draws 8 (x 8 = 64)
    "deepspeed_accum_frozen_ref": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 8, "algorithm.kl.estimator": "k3",
        "algorithm.kl.placement": "loss", "algorithm.kl.coef": 0.02, "algorithm.ppo_epochs": 1,
        "trainer.total_steps": 600, "data.rollout_batch_size": 8, "algorithm.mini_batch_size": 64,
        "algorithm.micro_batch_size": 4, "optim.actor.clip_grad": 0.5, "optim.actor.lr": 2e-6},
        {"algorithm.kl.estimator": 37, "trainer.total_steps": 13}, [],
        ["trainer.total_steps counts a fresh run from first = 0", "runs once per rollout batch",
         "is a per-rank share of 8"]),
    # groups sampled until N with mixed rewards are kept (the rejection is dynamic sampling: warned), then
    # spent k groups per optimizer step; the advantage helper takes one group (a list of sample records)
    "filtered_groups_clip": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 5, "data.rollout_batch_size": 10,
        "algorithm.mini_batch_size": 10, "algorithm.clip_ratio_low": 0.2, "algorithm.clip_ratio_high": 0.3,
        "algorithm.norm_adv_by_std": True, "trainer.total_steps": 250},
        {"data.rollout_batch_size": 6, "algorithm.mini_batch_size": 8}, [],
        ["dynamic sampling", "collects 10 groups of 5 responses per step", "takes 2 groups of 5 responses"]),
    # GAMMA, LAM = 1.0, 0.95 (one tuple assignment: each name its element; an unresolved lambda factor is
    # left out, never 1.0); torch.clamp(ratio, 0.8, 1.2) on exp(new - old) is clip_ratio 0.2
    "ppo_tuple_consts_loader": ("migrated", {
        "algorithm.name": "ppo", "algorithm.gamma": 1.0, "algorithm.lam": 0.95, "algorithm.clip_ratio": 0.2,
        "algorithm.ppo_epochs": 2, "algorithm.mini_batch_size": 2, "data.rollout_batch_size": 4,
        "trainer.total_steps": 6, "algorithm.kl.coef": 0.1, "algorithm.kl.placement": "reward"},
        {"algorithm.lam": 7, "algorithm.clip_ratio": 42, "trainer.total_steps": 21}, [], []),
    # module level: `for p in reference.parameters(): p.requires_grad = False` freezes the reference; k3 in
    # `per_tok`, which flows into `loss` (placement by flow at module level, coef 0.04, never 0.0); the
    # advantage helper fills a list group by group with out.extend(...) (probed: population std)
    "module_numpy_groups_k3": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 4, "algorithm.kl.coef": 0.04,
        "algorithm.kl.estimator": "k3", "algorithm.kl.placement": "loss", "algorithm.clip_ratio": 0.2,
        "algorithm.ppo_epochs": 2, "trainer.total_steps": 200, "optim.actor.clip_grad": 1.0},
        {"algorithm.kl.coef": 13, "algorithm.name": 23}, [],
        ["identified by running the block at module_numpy_groups_k3.py:23"], {"block": True}),
}


def _read(name: str, sub: str = "") -> bytes:
    with open(os.path.join(FIX, sub, name), "rb") as fh:
        return fh.read()


def _migrate(name: str):
    """Migrate fixture *name* (``dir/file`` for a project folder) the way ``migrate_file`` does."""
    src = os.path.join(FIX, f"{name}.py")
    base = os.path.basename(name)
    return migrate_source(_read(f"{name}.py"), f"{base}.py", f"{base}.yaml",
                          source_dir=os.path.dirname(src), config_dir=os.path.dirname(src))


def test_corpus_is_large_enough():
    files = [f[:-3] for f in os.listdir(FIX) if f.endswith(".py")]
    files += ["local_project/train_grpo_local", "dschat_project/training/step3/main", "class_project/run_grpo",
              "yaml_project/train_from_yaml"]
    assert len(files) >= 25
    assert set(EXPECT) == set(files)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_fixture(name):
    status, config, lines, reasons, warnings, *extra = EXPECT[name]
    extra = extra[0] if extra else {}
    base = os.path.basename(name)
    res = _migrate(name)
    assert res.status == status, (res.reasons, res.warnings)
    for key, value in config.items():
        assert key in res.config, (key, res.config, res.warnings)
        assert res.config[key] == pytest.approx(value) if isinstance(value, float) else res.config[key] == value
        assert res.provenance[key].split(":")[0].endswith((".py", ".yaml")) or \
            res.provenance[key] == res.defaults_used.get(key, {}).get("from"), res.provenance[key]
    for key, line in lines.items():
        assert res.provenance[key] == f"{base}.py:{line}"
    for key, prefix in extra.get("provenance", {}).items():
        assert res.provenance[key].startswith(prefix), res.provenance[key]
    for key, source in extra.get("defaults", {}).items():
        assert source in res.defaults_used[key]["from"] and res.provenance[key] == res.defaults_used[key]["from"]
    for key in extra.get("absent", []):
        assert key not in res.config
    for u in extra.get("unmapped", []):
        assert any(x.startswith(u) for x in res.unmapped), res.unmapped
    for r in reasons:
        assert any(r in x for x in res.reasons), res.reasons
    for w in warnings:
        assert any(w in x for x in res.warnings), res.warnings
    if status == "migrated":
        assert res.new_source == _read(f"{base}.py", "after")
        assert res.yaml_text == _read(f"{base}.yaml", "after").decode()
        filled = {k: v["placeholder"] for k, v in res.to_fill.items()}  # the command line must give these
        assert yaml.safe_load(res.yaml_text) == nest({**res.config, **filled})
        if extra.get("block"):
            # the loop ran at module level / in the __main__ block: the trainer call sits under the guard,
            # so importing the script (MegatronTrainer does, for the reward function) trains nothing
            tree = cst.parse_module(res.new_source)
            guard = [st for st in tree.body if isinstance(st, cst.If) and "__main__" in tree.code_for_node(st.test)]
            assert len(guard) == 1 and "MegatronTrainer(config).train()" in tree.code_for_node(guard[0])
            assert "MegatronTrainer" not in "".join(tree.code_for_node(st) for st in tree.body if st is not guard[0]
                                                    and not isinstance(st, (cst.SimpleStatementLine,)))
        # idempotent: a second run reports unchanged
        again = migrate_source(res.new_source, f"{base}.py", f"{base}.yaml")
        assert again.status == "unchanged"
    else:
        assert res.new_source is None and not res.config


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECT.items() if e[0] == "migrated"))
def test_every_canonical_key_is_from_the_source_or_listed(name):
    """``defaults_used`` names each canonical key whose value does not come from a line of the script."""
    from verl_bridge.codemods.recognize.report import CANONICAL_KEYS

    res = _migrate(name)
    base = os.path.basename(name)
    for key in CANONICAL_KEYS:
        from_source = key in res.config and res.provenance[key].split(":")[0].endswith((".py", ".yaml", ".yml"))
        if key == "algorithm.clip_ratio" and "algorithm.clip_ratio_low" in res.config:
            continue
        assert from_source != (key in res.defaults_used), (key, res.provenance.get(key), res.defaults_used.get(key))
    for key, entry in res.defaults_used.items():
        assert set(entry) == {"value", "from"}
        if key in res.config:
            assert res.config[key] == entry["value"] and not res.provenance[key].startswith(f"{base}.py:")


def test_crlf_and_comments_kept():
    res = _migrate("crlf_cells")
    out = res.new_source
    assert b"\r\n" in out and b"\n" not in out.replace(b"\r\n", b"")
    for piece in ["# GRPO 训练脚本 — Скрипт обучения", "# %%", "@cached", "# модель", '"""Entraîner."""']:
        assert piece.encode() in out


def test_keyboard_interrupt_block_kept():
    res = _migrate("megatron_lm_ppo")
    code = res.new_source.decode()
    assert "try:\n        MegatronTrainer(config).train()\n    except KeyboardInterrupt:" in code
    assert "# save_checkpoint(iteration, model, optimizer, opt_param_scheduler, 0)" in code


class TestCodemod(CodemodTest):
    TRANSFORM = MigratePPOLoopCommand

    def test_noop_on_migrated(self):
        src = _read("already_migrated.py").decode()
        self.assertCodemod(src, src, context_override=CodemodContext(filename="already_migrated.py"))

    def test_refusal_skips(self):
        src = _read("hook_style.py").decode()
        self.assertCodemod(src, src, expected_skip=True, context_override=CodemodContext(filename="hook_style.py"))

    def test_before_after(self):
        before = _read("grpo_k3.py").decode()
        after = _read("grpo_k3.py", "after").decode()
        self.assertCodemod(before, after, context_override=CodemodContext(filename="grpo_k3.py"))


def test_output_parses_for_every_migrated_fixture():
    for name, (status, *_rest) in EXPECT.items():
        if status == "migrated":
            cst.parse_module(_read(f"{os.path.basename(name)}.py", "after"))
