"""kl.py: placement, coefficient (also through a controller or a local module), estimator."""

import pytest

from .helpers import GRPO, expr, recognizer


@pytest.mark.parametrize("code,est", [
    ("new - ref_lp", "k1"),
    ("0.5 * (new - ref_lp) ** 2", "k2"),
    ("torch.exp(ref_lp - new) - (ref_lp - new) - 1", "k3"),
])
def test_estimator(code, est):
    r = recognizer(GRPO.replace("kl = new - ref_lp", f"kl = {code}"))
    assert r.a.config["algorithm.kl.estimator"] == est
    assert r.a.config["algorithm.kl.placement"] == "loss" and r.a.config["algorithm.kl.coef"] == 0.05


def test_kl_in_rewards_with_adaptive_controller():
    src = GRPO.replace("        kl = new - ref_lp\n        loss = (pg + 0.05 * kl).mean()\n",
                       "        loss = pg.mean()\n").replace(
        "        r = torch.tensor(", "        ctl = AdaptiveKLController(0.1, 6.0, 10000)\n"
        "        kl = lp(model, out) - lp(ref, out)\n        r0 = torch.tensor(").replace(
        "        g = r.view(-1, 4)", "        r = r0 - ctl.value * kl\n        g = r.view(-1, 4)")
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.kl.placement"] == "reward"
    assert (r.a.config["algorithm.kl.coef"], r.a.config["algorithm.kl.target"], r.a.config["algorithm.kl.horizon"]) \
        == (0.1, 6.0, 10000)


def test_kl_weight_from_a_local_module(tmp_path):
    src = GRPO.replace("        kl = new - ref_lp\n        loss = (pg + 0.05 * kl).mean()\n",
                       "        loss = penalised(pg, new, ref_lp)\n").replace("import torch\n",
                                                                            "import torch\nfrom losses import penalised\n")
    r = recognizer(src, tmp_path, {"losses.py": """
        BETA = 0.003
        def penalised(pg, logp, ref_logp):
            kl = logp - ref_logp
            return (pg + BETA * kl).mean()
        """})
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["algorithm.kl.coef"] == 0.003
    assert r.a.provenance["algorithm.kl.coef"] == "losses.py:2"


def test_coefficient_is_a_magnitude():
    r = recognizer(GRPO)
    assert r.kl_coef_value(expr(r, "0.05"), None).value == 0.05
