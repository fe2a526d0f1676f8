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


# the reference is loaded but neither frozen explicitly nor trained, and its KL term is written in a form
# the recogniser does not map (a library divergence under another name): kl.coef is left out, never 0.0
UNMAPPED_REFERENCE = """
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

def reward_fn(response_text, ground_truth):
    return 1.0

def main():
    actor = AutoModelForCausalLM.from_pretrained("acme/lm-small")
    anchor = AutoModelForCausalLM.from_pretrained("acme/lm-small")
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-6)
    for it in range(20):
        seqs = actor.generate(prompts(), max_new_tokens=32, num_return_sequences=4)
        r = torch.tensor([reward_fn(t, None) for t in decode(seqs)]).view(-1, 4)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
        with torch.no_grad():
            base = anchor(seqs).logits.log_softmax(-1)
        cur = actor(seqs).logits.log_softmax(-1)
        reg = F.kl_div(base, cur, log_target=True, reduction="batchmean")
        pg = -(cur.gather(-1, seqs[..., None]).squeeze(-1).sum(-1) * adv).mean()
        loss = pg + 0.1 * reg
        opt.zero_grad()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
"""


def test_an_untrained_second_model_with_an_unmapped_kl_leaves_the_coef_out():
    r = recognizer(UNMAPPED_REFERENCE)
    assert "algorithm.kl.coef" not in r.a.config, (r.a.config, r.a.warnings)
    assert any("algorithm.kl.coef is left out" in w and "anchor" in w for w in r.a.warnings), r.a.warnings
