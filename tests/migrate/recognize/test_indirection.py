"""Values reached through one level of indirection, as launcher scripts of larger projects write them:
a trainer class picked by a conditional expression (methods inherited from its base), the actor built by
a helper that receives the model class and name as parameters, an optimizer class held in a variable."""

from __future__ import annotations

from .helpers import recognizer

# the launcher: the trainer class is chosen by a flag, the engine builds the models and optimizers
LAUNCHER = """
import argparse
import torch
from transformers import AutoModelForCausalLM
from engine import Engine
from trainer import PPOBase, PPOWithPtx


def reward_fn(response_text, ground_truth):
    return 1.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy_path", type=str, required=True)
    parser.add_argument("--actor_lr", type=float, default=2e-6)
    parser.add_argument("--critic_lr", type=float, default=7e-6)
    parser.add_argument("--ptx_data", type=str, default=None)
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--max_answer_len", type=int, default=96)
    args = parser.parse_args()
    engine = Engine(args.policy_path, args)
    trainer_cls = PPOWithPtx if args.ptx_data else PPOBase
    trainer = trainer_cls(engine, args)
    for epoch in range(3):
        for batch in loader():
            exp = trainer.make_experience(batch)
            trainer.update(exp)


if __name__ == "__main__":
    main()
"""

ENGINE = """
import torch
from transformers import AutoModelForCausalLM, AutoModel
from deepspeed.ops.adam import FusedAdam, DeepSpeedCPUAdam


def build_model(model_class, name_or_path):
    return model_class.from_pretrained(name_or_path)


class Engine:
    def __init__(self, policy_path, args):
        self.args = args
        self.actor = build_model(AutoModelForCausalLM, policy_path)
        self.ref = build_model(AutoModelForCausalLM, policy_path)
        self.critic = build_model(AutoModel, policy_path)
        Opt = DeepSpeedCPUAdam if args.offload else FusedAdam
        actor_params = [p for p in self.actor.parameters()]
        self.actor_opt = Opt(actor_params, lr=args.actor_lr, betas=(0.9, 0.95))
        critic_params = [p for p in self.critic.parameters()]
        self.critic_opt = Opt(critic_params, lr=args.critic_lr, betas=(0.9, 0.95))
"""

TRAINER = """
import torch


class PPOBase:
    def __init__(self, engine, args):
        self.actor = engine.actor
        self.critic = engine.critic
        self.ref = engine.ref
        self.kl_ctl = 0.05
        self.cliprange = 0.2
        self.cliprange_value = 0.2
        self.gamma = 1.0
        self.lam = 0.95
        self.max_answer = args.max_answer_len

    def make_experience(self, prompts):
        total = self.max_answer + prompts.shape[1]
        seq = self.actor.generate(prompts, max_length=total)
        return {"seq": seq}

    def update(self, exp):
        logp = self.actor(exp["seq"])
        ref_logp = self.ref(exp["seq"])
        values = self.critic(exp["seq"])
        rewards = -self.kl_ctl * (logp - ref_logp)
        adv = gae(rewards, values, self.gamma, self.lam)
        ratio = torch.exp(logp - exp["old"])
        loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - self.cliprange, 1 + self.cliprange) * adv).mean()
        loss.backward()


def gae(rewards, values, gamma, lam):
    last = 0
    out = []
    for t in reversed(range(rewards.size(-1))):
        nv = values[:, t + 1] if t + 1 < rewards.size(-1) else 0.0
        delta = rewards[:, t] + gamma * nv - values[:, t]
        last = delta + gamma * lam * last
        out.append(last)
    return torch.stack(out[::-1], dim=1)


class PPOWithPtx(PPOBase):
    def train_ptx(self, batch):
        loss = self.actor(batch).loss
        loss.backward()
"""


def _run(tmp_path):
    return recognizer(LAUNCHER, tmp_path, {"engine.py": ENGINE, "trainer.py": TRAINER})


def test_trainer_class_chosen_by_a_conditional_and_inherited_methods(tmp_path):
    r = _run(tmp_path)
    # the loop calls make_experience (generates) and update (backward) of PPOBase, reached through
    # `trainer_cls = PPOWithPtx if args.ptx_data else PPOBase` (PPOWithPtx inherits them)
    assert r.find_main_loop() is not None
    assert r.p.class_named("trainer_cls", r.p.func_of(r.find_main_loop())) == "PPOBase"
    assert r.p.method_of("PPOWithPtx", "make_experience") is r.p.method_of("PPOBase", "make_experience")
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.clip_ratio"] == 0.2


def test_actor_built_by_a_helper_taking_class_and_name(tmp_path):
    r = _run(tmp_path)
    # build_model(AutoModelForCausalLM, policy_path) in Engine: the name is a required flag of the launcher
    assert r.a.to_fill["model.actor.args.model_name_or_path"]["flag"] == "--policy_path"


def test_optimizer_class_held_in_a_variable(tmp_path):
    r = _run(tmp_path)
    # Opt = DeepSpeedCPUAdam if args.offload else FusedAdam; the role shows in what the params were built from
    assert r.a.config["optim.actor.lr"] == 2e-6
    assert r.a.config["optim.critic.lr"] == 7e-6
    assert r.a.config["optim.actor.betas"] == [0.9, 0.95]


def test_max_length_as_a_budget_over_the_prompt(tmp_path):
    r = _run(tmp_path)
    # generate(prompts, max_length=self.max_answer + prompts.shape[1]): the response budget is max_answer,
    # read from the flag through the trainer's __init__ (reached through the conditional class alias)
    assert r.a.config["data.max_response_length"] == 96
    assert not any("counts prompt and response together" in w for w in r.a.warnings)


def test_max_length_without_the_prompt_term_is_left_out(tmp_path):
    src = TRAINER.replace("total = self.max_answer + prompts.shape[1]", "total = self.max_answer + 64")
    r = recognizer(LAUNCHER, tmp_path, {"engine.py": ENGINE, "trainer.py": src})
    assert "data.max_response_length" not in r.a.config
    assert any("counts prompt and response together" in w for w in r.a.warnings)
