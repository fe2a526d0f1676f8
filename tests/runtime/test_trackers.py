"""trainer.loggers: TensorBoard, wandb and MLflow through the libraries themselves, no network.

Each is read back with its own reader: TensorBoard's EventAccumulator, MLflow's client on the
local file store, and wandb's offline run directory (its ``run-*.wandb`` transaction log, decoded
with wandb's own protobuf ``Record``; wandb >= 0.2x ships no Python reader of it, so the record
framing, LevelDB's log format behind a ``:W&B`` header, is read here).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_bridge.config import ConfigError, load_config
from verl_bridge.runtime.metrics import MetricsLogger

REPO = Path(__file__).resolve().parents[2]
ROWS = [{"actor_loss": -0.1 * s, "reward_mean": 0.25 * s, "kl": 0.01 * s, "entropy": 2.0, "critic_loss": 0.3,
         "throughput_tokens_per_s": 100.0 * s, "eval/reward_mean": 0.5, "eval/response_length": 4.0, "note": "text is skipped"} for s in (1, 2)]


def _log(tmp_path, loggers, *extra):
    out = tmp_path / "run"
    cfg = load_config(REPO / "templates" / "quickstart.yaml", [
        f"trainer.output_dir={out}", f"trainer.loggers=[{','.join(loggers)}]", "trainer.project=ux-tests",
        "trainer.experiment_name=exp-1", *extra])
    logger = MetricsLogger(str(out), 2, True, False, 1, config=cfg)
    for step, row in enumerate(ROWS, start=1):
        logger.log(step, row)
    logger.close()
    return out


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _log(tmp_path, ["jsonl", "tensorboard"])  # no console: no step lines
    assert "Training step" not in capsys.readouterr().out
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    ea = EventAccumulator(str(out / "tensorboard"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5)]
    assert [e.value for e in ea.Scalars("eval/reward_mean")] == [0.5, 0.5]
    assert "note" not in ea.Tags()["scalars"]
    text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "project: ux-tests" in text and "total_steps: 40" in text  # the resolved config


def test_mlflow_local_file_store_holds_metrics_params_and_config(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = _log(tmp_path, ["mlflow"])
    assert not (out / "metrics.jsonl").exists()  # jsonl not configured
    client = MlflowClient(tracking_uri="file:" + str(out / "mlruns"))
    exp = client.get_experiment_by_name("ux-tests")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "exp-1" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward_mean")] == [(1, 0.25),
                                                                                                      (2, 0.5)]
    assert run.data.params["trainer.total_steps"] == "40" and run.data.params["algorithm.name"] == "ppo"
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path)))
    assert "experiment_name: exp-1" in config.read_text()


def _wandb_records(path: str) -> list:
    """wandb's offline transaction log: ':W&B' + 2-byte magic + version, then LevelDB log records
    (32 KiB blocks; 7-byte header crc32c/length/type; FULL=1, FIRST=2, MIDDLE=3, LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, block, buf, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
    return records


def test_wandb_offline_run_directory_holds_config_and_history(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    out = _log(tmp_path, ["console", "wandb"])
    import wandb

    wandb.teardown()  # finish() returns before wandb's service has written the whole log out; teardown waits
    (run_dir,) = glob.glob(str(out / "wandb" / "offline-run-*"))
    (log,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    history, config, names = [], {}, []
    for rec in _wandb_records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "run":
            names.append((rec.run.project, rec.run.display_name))
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
    assert ("ux-tests", "exp-1") in names
    assert [(h["_step"], h["reward_mean"]) for h in history] == [(1, 0.25), (2, 0.5)]
    assert config["trainer"]["total_steps"] == 40 and config["trainer"]["experiment_name"] == "exp-1"


def test_a_tracker_whose_package_is_missing_is_a_validation_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees when it is not installed
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "templates" / "quickstart.yaml", ["trainer.loggers=[console,wandb,neptune]"])
    msg = str(e.value)
    assert "trainer.loggers: 'wandb' needs the wandb package" in msg and "pip install 'verl-bridge[wandb]'" in msg
    assert "'neptune' is not a tracker; allowed: console, jsonl, tensorboard, wandb, mlflow" in msg
    assert load_config(REPO / "templates" / "quickstart.yaml").trainer.loggers == ["console", "jsonl"]


def test_the_extras_named_in_the_error_exist_in_pyproject():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    from verl_bridge.runtime.trackers import NEEDS

    for name, (module, extra) in NEEDS.items():
        assert extra in extras, f"pip install 'verl-bridge[{extra}]' is printed but pyproject has no such extra"
        assert any(dep.startswith(("tensorboard", "wandb", "mlflow")) for dep in extras[extra])


@pytest.mark.slow
def test_quickstart_with_tensorboard_writes_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "train", "templates/quickstart.yaml",
                        "trainer.total_steps=2", "trainer.log_every=1", f"trainer.output_dir={out}",
                        "data.rollout_batch_size=32", "algorithm.mini_batch_size=32", "algorithm.micro_batch_size=32",
                        "algorithm.ppo_epochs=1", "trainer.loggers=[console,jsonl,tensorboard]"],
                       capture_output=True, text=True, cwd=REPO, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ea = EventAccumulator(str(out / "tensorboard"))
    ea.Reload()
    assert [(e.step, round(e.value, 6)) for e in ea.Scalars("reward_mean")] == \
        [(row["step"], round(row["reward_mean"], 6)) for row in rows]
    assert len(rows) == 2 and "[INFO] Training step 2:" in r.stdout
