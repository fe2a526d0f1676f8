"""``migrate --write`` never replaces a file it did not write: an existing ``<script>.yaml``, any
existing ``--config-out`` file, or an existing ``--out DIR/<script>.py`` is refused (exit 1, the
diff and the reason printed, every file byte-identical) unless ``--force``."""

from __future__ import annotations

import json
import os
import shutil

from verl_bridge.cli import main as cli_main

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _copy(dst_dir, name="grpo_k3"):
    dst = dst_dir / f"{name}.py"
    shutil.copy(os.path.join(FIX, f"{name}.py"), dst)
    return dst


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_existing_script_yaml_is_refused_then_forced(tmp_path, capsys):
    script = _copy(tmp_path)
    (tmp_path / "grpo_k3.yaml").write_text("# my own notes, not a verl-bridge config\n")
    before = _snapshot(tmp_path)
    rc = cli_main(["migrate", "--write", str(script)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "REFUSED (target exists; nothing written)" in out
    assert "+++ b/" in out and "MegatronTrainer" in out  # the diff is shown
    assert f"{tmp_path / 'grpo_k3.yaml'} already exists" in out and "--force" in out
    assert _snapshot(tmp_path) == before  # nothing touched, no temp files
    rc = cli_main(["migrate", "--write", "--force", str(script)])
    capsys.readouterr()
    assert rc == 0
    assert "my own notes" not in (tmp_path / "grpo_k3.yaml").read_text()
    assert "Written by `verl-bridge migrate`" in (tmp_path / "grpo_k3.yaml").read_text()
    assert script.read_bytes() != before["grpo_k3.py"]


def test_config_out_existing_file_is_refused_in_json(tmp_path, capsys):
    script = _copy(tmp_path)
    precious = tmp_path / "precious.txt"
    precious.write_text("do not lose me\n")
    before = _snapshot(tmp_path)
    rc = cli_main(["migrate", "--write", "--report", "json", "--config-out", str(precious), str(script)])
    files = json.loads(capsys.readouterr().out)["files"]
    assert rc == 1 and files[0]["status"] == "refused"
    assert any("precious.txt already exists" in r and "--force" in r for r in files[0]["reasons"])
    assert _snapshot(tmp_path) == before


def test_out_dir_existing_copy_is_refused(tmp_path, capsys):
    script = _copy(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "grpo_k3.py").write_text("print('someone else')\n")
    before = _snapshot(tmp_path)
    rc = cli_main(["migrate", "--write", "--out", str(out), str(script)])
    assert rc == 1 and "already exists" in capsys.readouterr().out
    assert _snapshot(tmp_path) == before


def test_second_write_is_idempotent_not_refused(tmp_path, capsys):
    script = _copy(tmp_path)
    assert cli_main(["migrate", "--write", str(script)]) == 0
    capsys.readouterr()
    after = _snapshot(tmp_path)
    assert cli_main(["migrate", "--write", str(script)]) == 0  # already migrated: unchanged, nothing to refuse
    assert "unchanged" in capsys.readouterr().out
    assert _snapshot(tmp_path) == after
