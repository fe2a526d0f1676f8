"""clip_loss.py: symmetric and asymmetric ratio clips, value clip, loss coefficients."""

from .helpers import GRPO, recognizer


def test_asymmetric_clip():
    r = recognizer(GRPO.replace("torch.clamp(ratio, 1 - 0.2, 1 + 0.2)", "ratio.clamp(1 - 0.2, 1 + 0.28)"))
    assert r.a.config["algorithm.clip_ratio_low"] == 0.2 and r.a.config["algorithm.clip_ratio_high"] == 0.28


def test_no_clipped_ratio_one_step_per_batch_is_one_ppo_epoch():
    r = recognizer(GRPO.replace("torch.clamp(ratio, 1 - 0.2, 1 + 0.2)", "ratio"))
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.ppo_epochs"] == 1 and "algorithm.clip_ratio" not in r.a.config
    assert any("clip range (clip_ratio) has no effect" in w for w in r.a.warnings)


def test_no_clipped_ratio_several_steps_per_batch_is_refused_naming_the_step():
    src = GRPO.replace("torch.clamp(ratio, 1 - 0.2, 1 + 0.2)", "ratio").replace(
        "        loss.backward()\n        opt.step()\n",
        "        for _ in range(3):\n            loss.backward()\n            opt.step()\n")
    r = recognizer(src)
    assert r.a.status == "refuse"
    assert any("`opt.step()` runs inside an inner loop" in x and "t.py:" in x for x in r.a.reasons), r.a.reasons


def test_entropy_coefficient():
    r = recognizer(GRPO.replace("loss = (pg + 0.05 * kl).mean()", "loss = (pg + 0.05 * kl).mean() - 0.01 * entropy"))
    assert r.a.config["algorithm.entropy_coef"] == 0.01
