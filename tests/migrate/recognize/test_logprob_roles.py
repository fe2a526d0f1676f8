"""logprob_roles.py: a frozen reference model vs the policy before the update."""

from .helpers import GRPO, recognizer


def test_frozen_through_parameters_loop():
    src = GRPO.replace("    ref.requires_grad_(False)\n", "    for p in ref.parameters():\n        p.requires_grad_(False)\n")
    r = recognizer(src)
    assert r.models()["ref"] == "ref" and r.models()["model"] == "old"
    assert r.a.status == "migrate"


def test_kl_against_the_old_policy_is_refused():
    r = recognizer(GRPO.replace("kl = new - ref_lp", "kl = new - old"))
    assert r.a.status == "refuse" and any("old policy" in x for x in r.a.reasons)


def test_megatron_reference_with_discarded_optimizer():
    r = recognizer("""
        from megatron.training.training import setup_model_and_optimizer
        def model_provider(pre_process=True, post_process=True):
            return None
        def main():
            model, optimizer, sched = setup_model_and_optimizer(model_provider, None)
            ref_model, _, _ = setup_model_and_optimizer(model_provider, None)
        """, run=False)
    assert r.models() == {"model": "old", "ref_model": "ref"}
