"""configs.py: **kwargs dicts, LengthSampler, argparse groups, dataclasses, constants, self attributes."""

from .helpers import GRPO, recognizer


def test_generation_kwargs_dict_is_expanded():
    src = GRPO.replace("model.generate(prompts(), max_new_tokens=64)", "model.generate(prompts(), **gen_kwargs)").replace(
        "    opt = torch", '    gen_kwargs = {"max_new_tokens": 32, "top_p": 0.9, "do_sample": True}\n    opt = torch')
    r = recognizer(src)
    assert r.a.config["data.max_response_length"] == 32 and r.a.config["rollout.top_p"] == 0.9


def test_length_sampler_takes_the_longest_and_warns():
    src = GRPO.replace("model.generate(prompts(), max_new_tokens=64)",
                       "model.generate(prompts(), length_sampler=LengthSampler(4, 16))")
    r = recognizer(src)
    assert r.a.config["data.max_response_length"] == 15
    assert any("LengthSampler(4, 16)" in w for w in r.a.warnings)


def test_argparse_group_defaults_and_flags_without_default():
    src = GRPO.replace("    model = model_provider()\n", """    parser = argparse.ArgumentParser()
    grp = parser.add_argument_group("rl")
    grp.add_argument("--beta", type=float, default=0.001)
    grp.add_argument("--lr", type=float, required=True)
    args = parser.parse_args()
    model = model_provider()
""").replace("0.05 * kl", "args.beta * kl").replace("lr=1e-6", "lr=args.lr").replace("import torch", "import argparse\nimport torch")
    r = recognizer(src)
    assert r.a.config["algorithm.kl.coef"] == 0.001
    assert "optim.actor.lr" not in r.a.config and any("--lr" in w for w in r.a.warnings)


def test_self_attributes():
    r = recognizer("""
        import torch
        def model_provider(pre_process=True, post_process=True):
            return None
        class T:
            def __init__(self):
                self.clip = 0.3
            def loss(self, ratio, adv):
                return torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * adv
        """, run=False)
    clips = r.ratio_clips()
    assert r.p.ev(clips[0][4], clips[0][2]).value == 0.3


def test_deepspeed_config_dict():
    src = GRPO.replace("    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)\n",
                       '    ds = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-7, "weight_decay": 0.1}},\n'
                       '          "gradient_clipping": 0.5, "train_micro_batch_size_per_gpu": 2}\n'
                       "    model, opt, _, _ = deepspeed.initialize(model=model, config=ds)\n").replace(
        "import torch", "import deepspeed\nimport torch")
    r = recognizer(src)
    c = r.a.config
    assert (c["optim.actor.lr"], c["optim.actor.weight_decay"], c["optim.actor.clip_grad"]) == (3e-7, 0.1, 0.5)
    assert c["algorithm.micro_batch_size"] == 2
