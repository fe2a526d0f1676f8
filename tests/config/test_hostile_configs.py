"""Malformed and hostile config files: each is exit 2 from ``verl-bridge train`` with the key or the
problem named, before anything starts (no process group, no run directory), never a traceback."""

import time

import pytest
from click.testing import CliRunner

from verl_bridge.commands.train import train
from verl_bridge.config import ConfigError, load_config

BASE = "model: {actor: {args: {preset: tiny}}}\ntrainer: {output_dir: %s}\n"


def _train(tmp_path, text: str | bytes, *overrides):
    cfg = tmp_path / "cfg.yaml"
    if isinstance(text, str):
        text = text.encode()
    cfg.write_bytes(text)
    t0 = time.perf_counter()
    r = CliRunner().invoke(train, [str(cfg), *overrides])
    elapsed = time.perf_counter() - t0
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    assert not (tmp_path / "run").exists(), "nothing may start (the run directory was created)"
    return r.output, elapsed


def _base(tmp_path) -> str:
    return BASE % (tmp_path / "run")


def test_non_utf8_file(tmp_path):
    out, _ = _train(tmp_path, _base(tmp_path).encode() + b"data: {task: \xff\xfe}\n")
    assert "not UTF-8" in out and "line 3" in out and "0xff" in out


def test_alias_bomb_is_refused_fast(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    text = "anchors:\n" + "".join(f"  {ln}\n" for ln in lines) + _base(tmp_path) + "data:\n  task: *a9\n"
    out, elapsed = _train(tmp_path, text)
    assert "aliases" in out and "alias bomb" in out
    assert elapsed < 10, elapsed


def test_alias_expansion_budget(tmp_path):
    # few aliases, each doubling: refused by the expanded-node budget, not the alias count
    lines = ['x0: &x0 [' + ",".join(["1"] * 400) + "]"]
    for i in range(1, 20):
        lines.append(f"x{i}: &x{i} [*x{i - 1}, *x{i - 1}]")
    with pytest.raises(ConfigError, match="expands to more than"):
        p = tmp_path / "c.yaml"
        p.write_text("\n".join(lines) + "\n")
        load_config(p)


def test_deep_nesting(tmp_path):
    out, elapsed = _train(tmp_path, _base(tmp_path) + "data: " + "[" * 20000 + "]" * 20000 + "\n")
    assert "nesting deeper than 64 levels" in out
    out, _ = _train(tmp_path, _base(tmp_path) + "data:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 2000)))
    assert "nesting deeper than 64 levels" in out


def test_duplicate_keys_name_key_and_lines(tmp_path):
    text = _base(tmp_path) + "trainer:\n  total_steps: 3\n"  # 'trainer' again: line 2 and line 3
    out, _ = _train(tmp_path, text)
    assert "duplicate key 'trainer' at lines 2 and 3" in out
    text = _base(tmp_path) + "algorithm:\n  gamma: 1.0\n  lam: 0.9\n  gamma: 0.5\n"
    out, _ = _train(tmp_path, text)
    assert "duplicate key 'algorithm.gamma' at lines 4 and 6" in out


@pytest.mark.parametrize("line,key,allowed", [
    ("trainer: {total_steps: 1000000000000000000000000000000}", "trainer.total_steps", "at most"),
    ("trainer: {total_steps: 100000000000}", "trainer.total_steps", "allowed [1, 10000000]"),
    ("data: {max_response_length: 1.0e+9}", "data.max_response_length", "allowed [1, 1048576]"),
    ("optim: {actor: {lr: 1e400}}", "optim.actor.lr", "finite number"),
    ("optim: {actor: {lr: .nan}}", "optim.actor.lr", "finite number"),
    ("optim: {critic: {lr: -.inf}}", "optim.critic.lr", "finite number"),
    ("optim: {actor: {lr: 5.0}}", "optim.actor.lr", "allowed (0.0, 1.0]"),
    ("algorithm: {group_size: 100000}", "algorithm.group_size", "allowed [1, 4096]"),
])
def test_absurd_values_name_key_and_range(tmp_path, line, key, allowed):
    if line.startswith("trainer"):  # one trainer section: the run directory goes into it
        text = f"model: {{actor: {{args: {{preset: tiny}}}}}}\n{line[:-1]}, output_dir: {tmp_path / 'run'}}}\n"
    else:
        text = _base(tmp_path) + line + "\n"
    out, _ = _train(tmp_path, text)
    assert key in out and allowed in out, out


def test_hostile_override(tmp_path):
    out, _ = _train(tmp_path, _base(tmp_path), "optim.actor.lr=.nan")
    assert "optim.actor.lr" in out and "finite number" in out


def test_legit_anchors_and_merge_keys_still_load(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: {actor: {args: {preset: tiny}}}\n"
                 "optim:\n  actor: &o {lr: 1.0e-3, clip_grad: 1.0}\n  critic:\n    <<: *o\n    lr: 3.0e-3\n")
    cfg = load_config(p)
    assert cfg.optim.critic.lr == 3e-3 and cfg.optim.critic.clip_grad == 1.0


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system", "!!python/name:os.system",
                                 "!!python/object/new:subprocess.Popen"])
def test_python_tags_are_refused_naming_the_tag_and_what_is_allowed(tmp_path, tag):
    marker = tmp_path / "pwned"
    text = _base(tmp_path) + f"algorithm: {{name: {tag} [\"touch {marker}\"]}}\n"
    out, _ = _train(tmp_path, text)
    assert not marker.exists()
    assert f"the YAML tag {tag.split(':')[0]}" in out and "is not allowed" in out and "plain YAML" in out, out
    assert "syntax error" not in out
