"""clip_loss.py: symmetric and asymmetric ratio clips, value clip, loss coefficients."""

from .helpers import GRPO, recognizer


def test_asymmetric_clip():
    r = recognizer(GRPO.replace("torch.clamp(ratio, 1 - 0.2, 1 + 0.2)", "ratio.clamp(1 - 0.2, 1 + 0.28)"))
    assert r.a.config["algorithm.clip_ratio_low"] == 0.2 and r.a.config["algorithm.clip_ratio_high"] == 0.28


def test_no_clipped_ratio_is_a_refusal_with_the_edit():
    r = recognizer(GRPO.replace("torch.clamp(ratio, 1 - 0.2, 1 + 0.2)", "ratio"))
    assert r.a.status == "refuse"
    assert any("t.py:" in x and "clipped ratio" in x for x in r.a.reasons)


def test_entropy_coefficient():
    r = recognizer(GRPO.replace("loss = (pg + 0.05 * kl).mean()", "loss = (pg + 0.05 * kl).mean() - 0.01 * entropy"))
    assert r.a.config["algorithm.entropy_coef"] == 0.01
