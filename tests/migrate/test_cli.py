"""The CLI contract: dry run by default, --write atomic, exit codes, JSON report, untouched refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from click.testing import CliRunner

from verl_bridge.cli import main as cli_main

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _copy(tmp_path, name):
    dst = tmp_path / f"{name}.py"
    shutil.copy(os.path.join(FIX, f"{name}.py"), dst)
    return dst


def _run(args, capsys):
    rc = cli_main(["migrate", *args])
    return rc, capsys.readouterr().out


def test_dry_run_changes_nothing(tmp_path, capsys):
    p = _copy(tmp_path, "grpo_k3")
    before = p.read_bytes()
    rc, out = _run([str(p)], capsys)
    assert rc == 0
    assert "+    MegatronTrainer(config).train()" in out and "clip_ratio_high: 0.28" in out
    assert p.read_bytes() == before and not (tmp_path / "grpo_k3.yaml").exists()


def test_write_then_unchanged(tmp_path, capsys):
    p = _copy(tmp_path, "grpo_k3")
    rc, _ = _run(["--write", str(p)], capsys)
    assert rc == 0
    assert p.read_bytes() == open(os.path.join(FIX, "after", "grpo_k3.py"), "rb").read()
    assert (tmp_path / "grpo_k3.yaml").exists()
    after = p.read_bytes()
    rc, out = _run(["--write", "--report", "json", str(p)], capsys)
    assert rc == 0 and json.loads(out)["files"][0]["status"] == "unchanged"
    assert p.read_bytes() == after
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".verl-bridge-")]


def test_refused_and_error_untouched(tmp_path, capsys):
    refused = _copy(tmp_path, "kl_old_policy")
    broken = _copy(tmp_path, "merge_conflict")
    originals = {refused: refused.read_bytes(), broken: broken.read_bytes()}
    rc, out = _run(["--write", "--report", "json", str(refused)], capsys)
    assert rc == 1
    rep = json.loads(out)["files"][0]
    assert set(rep) == {"path", "status", "reasons", "warnings", "config", "provenance", "defaults_used", "unmapped", "to_fill"}
    assert rep["status"] == "refused" and rep["reasons"]
    rc, out = _run(["--write", "--report", "json", str(refused), str(broken)], capsys)
    assert rc == 2
    assert [f["status"] for f in json.loads(out)["files"]] == ["refused", "error"]
    for p, data in originals.items():
        assert p.read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["kl_old_policy.py", "merge_conflict.py"]


def test_out_dir_and_config_out(tmp_path, capsys):
    p = _copy(tmp_path, "cleanrl_dataclass")
    before = p.read_bytes()
    out_dir = tmp_path / "new"
    cfg = tmp_path / "configs" / "ppo.yaml"
    rc, _ = _run(["--write", "--out", str(out_dir), "--config-out", str(cfg), str(p)], capsys)
    assert rc == 0 and p.read_bytes() == before
    code = (out_dir / "cleanrl_dataclass.py").read_text()
    assert '"../configs/ppo.yaml"' in code and cfg.exists()


def test_config_out_needs_one_file(tmp_path, capsys):
    a, b = _copy(tmp_path, "grpo_k3"), _copy(tmp_path, "cleanrl_dataclass")
    assert cli_main(["migrate", "--config-out", str(tmp_path / "x.yaml"), str(a), str(b)]) == 2


def test_help_imports_no_torch():
    code = ("import sys; from verl_bridge.cli import main; rc = main(['migrate', '--help']); "
            "assert 'torch' not in sys.modules and 'megatron' not in sys.modules, 'heavy import'; ")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "--config-out" in r.stdout


def test_libcst_tool_entry(tmp_path):
    """The codemod also runs through ``python -m libcst.tool codemod``."""
    p = _copy(tmp_path, "grpo_k3")
    (tmp_path / ".libcst.codemod.yaml").write_text(
        "generated_code_marker: '@generated'\nformatter: []\nblacklist_patterns: []\n"
        "modules: ['verl_bridge.codemods']\nrepo_root: '.'\n")
    r = subprocess.run([sys.executable, "-m", "libcst.tool", "codemod", "--no-format",
                        "migrate_ppo_loop.MigratePPOLoopCommand", "-j", "1", str(p)], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert p.read_bytes() == open(os.path.join(FIX, "after", "grpo_k3.py"), "rb").read()
    assert (tmp_path / "grpo_k3.yaml").exists()


def test_required_flag_is_a_placeholder_that_validate_names(tmp_path, capsys):
    """A model the script takes from a flag with no default migrates: the report lists it under
    to_fill with the flag's name, the YAML holds a placeholder, and `verl-bridge validate` refuses
    the placeholder by key and flag until it is given (the printed fix, key=VALUE, then passes)."""
    p = _copy(tmp_path, "medqa_required_model")
    rc, out = _run(["--write", "--report", "json", str(p)], capsys)
    rep = json.loads(out)["files"][0]
    assert rc == 0 and rep["status"] == "migrated", rep["reasons"]
    assert "model.actor.args.model_name_or_path" not in rep["config"]
    fill = rep["to_fill"]["model.actor.args.model_name_or_path"]
    assert fill["flag"] == "--base_ckpt" and fill["placeholder"] == "<fill: --base_ckpt>"
    yml = str(tmp_path / "medqa_required_model.yaml")
    assert "'<fill: --base_ckpt>'" in open(yml).read()
    rc = cli_main(["validate", yml])
    err = capsys.readouterr()
    text = err.out + err.err
    assert rc == 2, text
    assert "model.actor.args.model_name_or_path: placeholder '<fill: --base_ckpt>'" in text
    assert "pass model.actor.args.model_name_or_path=VALUE" in text
    # the printed fix: give the value (a hub id is accepted as it is)
    assert cli_main(["validate", yml, "model.actor.args.model_name_or_path=acme/notes-7b"]) == 0
