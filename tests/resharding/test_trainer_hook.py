"""The trainer runs the native engine's sync check after every weight sync (and not when disabled)."""

import pytest

from tests.dist_utils import run_distributed


def _run(rank, world_size, out):
    import verl_bridge.rollout.verify as verify
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    reports = {}
    real = verify.verify_native_engine
    for flag in ("true", "false"):
        calls = reports.setdefault(flag, [])

        def spy(model, **kw):
            calls.append(real(model, **kw))
            return calls[-1]

        verify.verify_native_engine = spy
        cfg = load_config("templates/quickstart.yaml", [
            f"trainer.output_dir={out}/{flag}", "trainer.total_steps=2", "data.rollout_batch_size=8",
            "algorithm.mini_batch_size=8", "algorithm.micro_batch_size=8", "trainer.progress_bar=false",
            f"rollout.verify_sync={flag}"], world_size=world_size)
        MegatronTrainer(cfg).train()
    verify.verify_native_engine = real
    return reports


@pytest.mark.slow  # two short training runs in a spawned process
def test_trainer_verifies_every_sync(tmp_path):
    reports = run_distributed(_run, 1, str(tmp_path))[0]
    assert len(reports["true"]) == 2  # one check per step
    for r in reports["true"]:
        assert r.ok and r.tokens > 0 and r.max_abs_diff <= 1e-3, r
    assert reports["false"] == []
