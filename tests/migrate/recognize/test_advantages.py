"""advantages.py: GAE with done masks and two assignment targets, group normalisation by data flow."""

from .helpers import GRPO, recognizer

GAE = """
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def main(gamma=0.99, gae_lambda=0.95):
    model = model_provider()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for step in range(5):
        out = model.generate(prompts())
        values = critic(out)
        lastgaelam = 0
        for t in reversed(range(8)):
            nextnonterminal = 1.0 - dones[t]
            delta = rewards[t] + gamma * values[t + 1] * nextnonterminal - values[t]
            adv[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        ratio = torch.exp(lp(model, out) - old)
        loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * adv).mean()
        v_loss = ((values - adv) ** 2).mean()
        (loss + 0.5 * v_loss).backward()
        opt.step()

if __name__ == "__main__":
    main()
"""


def test_gae_lambda_not_mistaken_for_one():
    r = recognizer(GAE)
    assert r.a.config["algorithm.gamma"] == 0.99 and r.a.config["algorithm.lam"] == 0.95


def test_gamma_times_lambda_precomputed_proves_nothing():
    src = GAE.replace("delta + gamma * gae_lambda * nextnonterminal", "delta + gl * nextnonterminal").replace(
        "    lastgaelam = 0\n", "    lastgaelam = 0\n        gl = gamma * gae_lambda\n")
    r = recognizer(src)
    assert "algorithm.lam" not in r.a.config


def test_group_normalisation_found_whatever_the_tensor_is_called():
    r = recognizer(GRPO.replace("g = r.view", "zz = r.view").replace("(g - g.mean", "(zz - zz.mean").replace(
        "(g.std", "(zz.std"))
    assert r.a.config["algorithm.name"] == "grpo" and r.a.config["algorithm.group_size"] == 4


def test_mean_over_the_batch_is_not_group_normalisation():
    r = recognizer(GRPO.replace("g.mean(dim=1, keepdim=True)", "g.mean()").replace("g.std(dim=1, keepdim=True)",
                                                                                      "g.std()"))
    assert r.a.status == "refuse" and any("advantages" in x for x in r.a.reasons)


def test_whitening_through_a_helper():
    src = GAE.replace("        ratio = torch.exp", "        adv = normalise(adv)\n        ratio = torch.exp") + \
        "\n\ndef normalise(x):\n    return (x - x.mean()) / (x.std() + 1e-8)\n"
    r = recognizer(src)
    assert r.a.config["algorithm.whiten_advantages"] is True
    assert r.a.provenance["algorithm.whiten_advantages"] == "t.py:18"  # adv = normalise(adv)
