"""Safe writes and scale: read-only files, symlinks, file modes, one failing file of a directory run,
the JSON report always printing, Python's line numbers for syntax errors, a 20,000-line file."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time

from verl_bridge.cli import main as cli_main
from verl_bridge.migrate import engine
from verl_bridge.migrate.engine import migrate_source

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _copy(dst_dir, name):
    dst = dst_dir / f"{name}.py"
    shutil.copy(os.path.join(FIX, f"{name}.py"), dst)
    return dst


def _after(name) -> bytes:
    with open(os.path.join(FIX, "after", f"{name}.py"), "rb") as fh:
        return fh.read()


def _json(args, capsys):
    rc = cli_main(["migrate", "--report", "json", *args])
    return rc, json.loads(capsys.readouterr().out)["files"]


def test_read_only_file_is_refused_not_replaced(tmp_path, capsys):
    p = _copy(tmp_path, "grpo_k3")
    before = p.read_bytes()
    p.chmod(0o444)
    rc, files = _json(["--write", str(p)], capsys)
    assert rc == 2 and files[0]["status"] == "error"
    assert "read-only (mode 0444)" in files[0]["reasons"][0] and "chmod u+w" in files[0]["reasons"][0]
    assert p.read_bytes() == before and stat.S_IMODE(p.stat().st_mode) == 0o444
    assert sorted(os.listdir(tmp_path)) == ["grpo_k3.py"]  # no YAML, no temp file


def test_symlink_is_written_through_to_its_target(tmp_path, capsys):
    real_dir, link_dir = tmp_path / "real", tmp_path / "link"
    real_dir.mkdir()
    link_dir.mkdir()
    target = _copy(real_dir, "grpo_k3")
    link = link_dir / "grpo_k3.py"
    link.symlink_to(target)
    rc, files = _json(["--write", str(link)], capsys)
    assert rc == 0 and files[0]["status"] == "migrated"
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == _after("grpo_k3")
    assert (link_dir / "grpo_k3.yaml").exists()  # next to the path the user gave (what __file__ will be)


def test_mode_is_kept_and_new_yaml_gets_the_umask_mode(tmp_path, capsys):
    p = _copy(tmp_path, "grpo_k3")
    p.chmod(0o750)
    rc, _ = _json(["--write", str(p)], capsys)
    assert rc == 0
    assert stat.S_IMODE(p.stat().st_mode) == 0o750
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "grpo_k3.yaml").stat().st_mode) == 0o666 & ~umask


def test_directory_run_reports_a_failing_file_and_goes_on(tmp_path, capsys, monkeypatch):
    a = _copy(tmp_path, "cleanrl_dataclass")
    b = _copy(tmp_path, "grpo_k3")
    a_before = a.read_bytes()
    real_write = engine.atomic_write

    def failing(path, data):
        if os.path.basename(path) == "cleanrl_dataclass.py":
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(engine, "atomic_write", failing)
    rc, files = _json(["--write", str(tmp_path)], capsys)
    by = {os.path.basename(f["path"]): f for f in files}
    assert rc == 2
    assert by["cleanrl_dataclass.py"]["status"] == "error"
    assert "No space left on device" in by["cleanrl_dataclass.py"]["reasons"][-1]
    assert a.read_bytes() == a_before and not (tmp_path / "cleanrl_dataclass.yaml").exists()  # YAML rolled back
    assert by["grpo_k3.py"]["status"] == "migrated" and b.read_bytes() == _after("grpo_k3")


def test_json_report_always_prints(tmp_path, capsys, monkeypatch):
    _copy(tmp_path, "grpo_k3")
    _copy(tmp_path, "kl_old_policy")

    def boom(path, **kw):
        if path.endswith("grpo_k3.py"):
            raise RuntimeError("unexpected")
        return real(path, **kw)

    real = engine.migrate_file
    monkeypatch.setattr(engine, "migrate_file", boom)
    rc, files = _json([str(tmp_path)], capsys)
    assert rc == 2
    statuses = {os.path.basename(f["path"]): f["status"] for f in files}
    assert statuses == {"grpo_k3.py": "error", "kl_old_policy.py": "refused"}
    assert "RuntimeError: unexpected" in files[0]["reasons"][0] or "RuntimeError: unexpected" in files[1]["reasons"][0]


def test_syntax_error_line_numbers_are_pythons():
    src = b"import torch\n\n\ndef main():\n    x = (1,\n    y = 2\n    return x\n"
    try:
        compile(src, "bad.py", "exec")
    except SyntaxError as exc:
        expected = exc.lineno
    res = migrate_source(src, "bad.py")
    assert res.status == "error"
    assert res.reasons[0].startswith(f"bad.py:{expected}: cannot parse")


def _big_source(n_lines: int) -> str:
    with open(os.path.join(FIX, "grpo_k3.py")) as fh:
        head = fh.read().split('if __name__ == "__main__":')[0]
    parts, lines, i = [head], head.count("\n"), 0
    while lines < n_lines - 12:
        parts.append(f"\n\ndef helper_{i}(x, scale={i % 7 + 1}):\n    y = x * scale + {i}\n    for k in range(3):\n"
                     f"        y = y + k * 0.5\n    if y > {i}:\n        return y - 1\n    return y\n")
        lines += 9
        i += 1
    # one very deep expression: 2,500 terms (a recursive walk would hit Python's recursion limit)
    parts.append("\n\nTOTAL = " + " + ".join(str(j) for j in range(2500)) + "\n")
    parts.append('\n\nif __name__ == "__main__":\n    main()\n')
    return "".join(parts)


def test_twenty_thousand_lines_in_under_ten_seconds():
    src = _big_source(20_000).encode()
    assert src.count(b"\n") >= 20_000
    start = time.process_time()
    res = migrate_source(src, "big_ppo.py", "big_ppo.yaml")
    took = time.process_time() - start
    assert res.status == "migrated", res.reasons
    assert res.config["algorithm.group_size"] == 8 and res.provenance["algorithm.group_size"].startswith("big_ppo.py:")
    assert took < 10, f"{took:.1f} s of CPU"
