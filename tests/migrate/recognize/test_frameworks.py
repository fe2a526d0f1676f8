"""frameworks.py: TRL legacy defaults, framework entry points named, gym refused."""

import pytest

from .helpers import recognizer

TRL = """
import torch
from trl import PPOConfig, PPOTrainer

def main():
    config = PPOConfig(model_name="./m", learning_rate=1e-5, {extra})
    trainer = PPOTrainer(config, model, None, tok)
    for batch in trainer.dataloader:
        responses = trainer.generate(batch["input_ids"], max_new_tokens=16)
        trainer.step(batch["input_ids"], responses, [torch.tensor(1.0)])

if __name__ == "__main__":
    main()
"""


def test_trl_defaults_with_provenance():
    r = recognizer(TRL.format(extra="ppo_epochs=2"))
    a = r.a
    assert a.config["algorithm.ppo_epochs"] == 2 and a.provenance["algorithm.ppo_epochs"] == "t.py:6"
    assert a.config["algorithm.kl.coef"] == 0.2 and a.provenance["algorithm.kl.coef"].startswith("trl<=0.11 PPOConfig")
    assert a.config["algorithm.kl.target"] == 6 and a.config["algorithm.vf_coef"] == 0.1
    assert a.defaults_used["algorithm.kl.coef"]["value"] == 0.2


def test_target_kl_is_early_stopping_not_the_adaptive_target():
    r = recognizer(TRL.format(extra="adap_kl_ctrl=False, early_stopping=True, target_kl=0.1"))
    assert "algorithm.kl.target" not in r.a.config
    assert any("early_stopping" in w for w in r.a.warnings)


def test_unsupported_kl_penalty_is_refused():
    r = recognizer(TRL.format(extra='kl_penalty="full"'))
    assert r.a.status == "refuse" and any("kl_penalty='full'" in x for x in r.a.reasons)


@pytest.mark.parametrize("src,name", [
    ("import trlx\ntrlx.train(reward_fn=f, prompts=p)\n", "trlx.train()"),
    ("from megatron.training import pretrain\npretrain(a, b, c, d)\n", "Megatron-LM's pretrain()"),
    ("from nemo_aligner.algorithms.ppo import PPOTrainer\nPPOTrainer(cfg=c).fit()\n", "NeMo-Aligner"),
])
def test_framework_entry_points_are_named(src, name):
    r = recognizer(src)
    assert r.a.status == "refuse" and any(name in x and "t.py:2" in x for x in r.a.reasons), r.a.reasons


def test_gym_is_not_an_llm_loop():
    r = recognizer("import gym\nenv = gym.make('CartPole-v1')\n")
    assert any("not an LLM loop" in x and "t.py:1" in x for x in r.a.reasons)


ASYNC_GEN = """
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM


def sampler(queue, device):
    lm = AutoModelForCausalLM.from_pretrained("./ckpt/lm")
    while True:
        out = lm.generate(next_prompts(), max_new_tokens=64)
        queue.put(score_and_pack(out))


def main():
    lm = AutoModelForCausalLM.from_pretrained("./ckpt/lm")
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-6)
    queue = mp.Queue()
    worker = mp.Process(target=sampler, args=(queue, 3))
    worker.start()
    for step in range(1000):
        batch = queue.get()
        ratio = torch.exp(lp(lm, batch) - batch["old"])
        loss = -torch.min(ratio * batch["adv"], torch.clamp(ratio, 0.8, 1.2) * batch["adv"]).mean()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
"""


def test_generation_in_another_process_is_refused_with_the_reason():
    r = recognizer(ASYNC_GEN)
    assert r.a.status == "refuse"
    assert any("generated in another process" in x and "sampler()" in x for x in r.a.reasons), r.a.reasons
