"""Experiment trackers: ``trainer.loggers: [console, jsonl, tensorboard, wandb, mlflow]``.

``console`` and ``jsonl`` are :class:`verl_bridge.runtime.metrics.MetricsLogger`'s own (the
``[INFO] Training step`` lines, ``<output_dir>/metrics.jsonl``); the others are the libraries
themselves, each an optional extra, used on the logging rank only:

=============  ==========================  ==================================================
tracker        extra                       where it writes
=============  ==========================  ==================================================
tensorboard    ``verl-bridge[tensorboard]`` ``torch.utils.tensorboard.SummaryWriter`` into
                                            ``<output_dir>/tensorboard``
wandb          ``verl-bridge[wandb]``       ``wandb.init(project=trainer.project,
                                            name=trainer.experiment_name)``; ``WANDB_MODE``,
                                            ``WANDB_DIR`` etc. as wandb reads them
mlflow         ``verl-bridge[mlflow]``      ``MLFLOW_TRACKING_URI`` if set, else a file store
                                            in ``<output_dir>/mlruns``; experiment
                                            ``trainer.project``, run ``trainer.experiment_name``
=============  ==========================  ==================================================

Each logs the resolved config as the run's config (TensorBoard: a text summary ``config``;
wandb: ``wandb.config``; MLflow: params by dotted key plus the artifact ``config.yaml``) and every
numeric metric of every step at that step.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Optional

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
# tracker -> (module it needs, extra that installs it)
NEEDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def check(loggers, output_dir) -> list[str]:
    """Validation of ``trainer.loggers``: known names, installed packages, a run directory where needed."""
    if not isinstance(loggers, (list, tuple)):
        return [f"trainer.loggers={loggers!r}: expected a list of {', '.join(LOGGERS)}"]
    problems = []
    for name in loggers:
        if name not in LOGGERS:
            problems.append(f"trainer.loggers: {name!r} is not a tracker; allowed: {', '.join(LOGGERS)}")
        elif name in NEEDS and not _installed(NEEDS[name][0]):
            module, extra = NEEDS[name]
            problems.append(f"trainer.loggers: {name!r} needs the {module} package, which is not installed; "
                            f"pip install 'verl-bridge[{extra}]' (or drop {name} from trainer.loggers)")
        elif name == "tensorboard" and not output_dir:
            problems.append(f"trainer.loggers: {name!r} writes under trainer.output_dir, which is null; "
                            f"set trainer.output_dir or drop {name}")
    return problems


def _installed(module: str) -> bool:
    """Importable, without importing it (``sys.modules[name] = None`` blocks an import, as Python does)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1} (the config's dotted keys)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def scalars(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def experiment_name(trainer_cfg) -> str:
    if trainer_cfg.experiment_name:
        return trainer_cfg.experiment_name
    return os.path.basename(os.path.normpath(trainer_cfg.output_dir)) if trainer_cfg.output_dir else "run"


class TensorBoardTracker:
    def __init__(self, cfg, config_dict: dict, config_text: str):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.path.join(cfg.trainer.output_dir, "tensorboard")
        self.writer = SummaryWriter(log_dir=self.log_dir)
        self.writer.add_text("config", "```yaml\n" + config_text + "```", global_step=0)

    def log(self, step: int, metrics: dict) -> None:
        for k, v in scalars(metrics).items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, cfg, config_dict: dict, config_text: str):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=cfg.trainer.project, name=experiment_name(cfg.trainer), config=config_dict,
                              dir=os.environ.get("WANDB_DIR") or cfg.trainer.output_dir or None)

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowTracker:
    def __init__(self, cfg, config_dict: dict, config_text: str):
        import mlflow

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI") and cfg.trainer.output_dir:
            # no server or database named: a file store in the run directory (mlflow >= 3 asks for the opt-in)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri("file:" + os.path.abspath(os.path.join(cfg.trainer.output_dir, "mlruns")))
        mlflow.set_experiment(cfg.trainer.project)
        self.run = mlflow.start_run(run_name=experiment_name(cfg.trainer))
        params = {k: ("" if v is None else str(v))[:500] for k, v in flatten(config_dict).items()}
        mlflow.log_params(params)
        mlflow.log_text(config_text, "config.yaml")

    def log(self, step: int, metrics: dict) -> None:
        self.mlflow.log_metrics(scalars(metrics), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MLflowTracker}


def build_trackers(cfg, config_text: str) -> list:
    """The configured library trackers (not console/jsonl), started with the resolved config
    (*config_text*: its YAML, as written to ``<output_dir>/config.yaml``)."""
    names = [n for n in cfg.trainer.loggers if n in TRACKERS]
    return [TRACKERS[n](cfg, cfg.to_dict(), config_text) for n in names]
