"""``verl-bridge plan`` and the memory lines of ``train --dry-run``."""

import json
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tests.planning.test_memory import KV, STAGE0, STAGE1, TOTAL

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = str(REPO / "templates" / "megatron_ppo.yaml")


def test_seed_layout_is_printed_by_the_console_command():
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "plan", "templates/megatron_ppo.yaml",
                        "--nproc-per-node", "4", "--device-memory-gb", "80"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "parallelism     TP=2 PP=2 DP=1 SP=True" in out
    assert "opt-1.3b: 24 layers, hidden 2048, 32 heads (32 kv), ffn 8192, vocab 50272, max pos 2048" in out
    assert "1.316 B params" in out
    assert "PP stage 0 (first):" in out and "PP stage 1 (last):" in out
    assert re.search(rf"^ +actor +{STAGE0 * 18 / 2 ** 30:.2f} GiB +\(params {STAGE0 * 2 / 2 ** 30:.2f} GiB", out, re.M)
    assert re.search(rf"^ +kv cache +{KV / 2 ** 30:.2f} GiB +\(rollout\)", out, re.M)
    assert f"refit           {TOTAL * 2 / 2 ** 30:.2f} GiB per sync" in out
    assert "measured:" in out  # no --bandwidth-gbps: a local copy is timed, and the line says so
    assert "of 80.00 GiB: fits" in out and "fits            peak" in out


def _plan(*args):
    from verl_bridge.commands.plan import plan

    return CliRunner().invoke(plan, [TEMPLATE, "--nproc-per-node", "4", "--bandwidth-gbps", "800", *args])


def test_json_report():
    r = _plan("--device-memory-gb", "80", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["fits"] is True and rep["world_size"] == 4
    first, last = rep["memory"]["ranks"]
    assert first["roles"]["actor"]["params"] == STAGE0 * 2 and last["roles"]["actor"]["params"] == STAGE1 * 2
    assert first["kv_cache"] == KV
    assert rep["memory"]["model_shape"]["total_params"] == TOTAL
    assert rep["refit"]["bytes_per_sync"] == TOTAL * 2 and rep["refit"]["bandwidth_source"] == "given: 800 Gbit/s"
    assert rep["refit"]["seconds"] == TOTAL * 2 / 100e9
    assert any("TP=2 PP=2" in line for line in rep["parallel_plan"])


def test_over_memory_exits_1_with_remedies_and_bad_input_exits_2(tmp_path):
    r = _plan("--device-memory-gb", "40", "data.rollout_batch_size=512", "data.max_response_length=1024")
    assert r.exit_code == 1, r.output
    assert "DOES NOT FIT" in r.output
    for remedy in ("samples per TPxPP group fit", "max_prompt_length + max_response_length <=",
                   "model.reference.args.offload: true saves"):
        assert remedy in r.output
    r = _plan("--device-memory-gb", "80", "trainer.args.tp_size=3")
    assert r.exit_code == 2 and "tp_size=3 does not divide world size 4" in r.output
    r = _plan("model.actor.args.model_name_or_path=null", "model.actor.args.model_provider=mine:provider")
    assert r.exit_code == 2 and "--model-shape" in r.output
    r = _plan("--model-shape", "llama-2-7b", "--device-memory-gb", "200")
    assert r.exit_code == 0 and "llama-2-7b: 32 layers" in r.output
    r = _plan("--model-shape", "gpt-17")
    assert r.exit_code == 2 and "not a built-in shape" in r.output


def test_train_dry_run_appends_the_memory_estimate(tmp_path):
    from verl_bridge.commands.train import train

    r = CliRunner().invoke(train, [TEMPLATE, "--nproc-per-node", "4", "--dry-run",
                                   f"data.train_files={tmp_path / 'p.jsonl'}"])
    assert r.exit_code == 2 and "file not found" in r.output  # train still checks paths
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "opt-1.3b").mkdir()
    r = CliRunner().invoke(train, [TEMPLATE, "--nproc-per-node", "4", "--dry-run",
                                   f"data.train_files={tmp_path / 'p.jsonl'}",
                                   f"model.actor.args.model_name_or_path={tmp_path / 'opt-1.3b'}",
                                   f"model.critic.args.model_name_or_path={tmp_path / 'opt-1.3b'}"])
    assert r.exit_code == 0, r.output
    assert "model shape     opt-1.3b" in r.output and "PP stage 0 (first):" in r.output
    assert "verl-bridge plan CONFIG" in r.output
    r = CliRunner().invoke(train, [str(REPO / "templates" / "grpo.yaml"), "--dry-run"])
    assert r.exit_code == 0 and "model shape     tiny: 2 layers" in r.output
