"""Entry point under a user's own launcher: ``torchrun ... -m verl_bridge.train --config_file CONFIG [k=v ...]``."""

from __future__ import annotations

import argparse
import os
import sys
import traceback


def die_with_parent() -> None:
    """Linux: SIGTERM this rank when its parent (torchrun, or ``verl-bridge train``) dies, even by
    SIGKILL, so no rank trains on as an orphan; SIGTERM then stops it like a preemption."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def run(config_file: str, overrides: list[str]) -> int:
    """Exit codes: 0 done, 2 a bad config or an error, 143 / 130 stopped by SIGTERM / SIGINT after
    saving the last finished step (resume with ``trainer.resume=auto``)."""
    from verl_bridge.runtime import mcore_notices

    mcore_notices.install()  # before megatron-core is imported: its fallback notices become one [INFO] line
    from verl_bridge.config import ConfigError, load_config
    from verl_bridge.runtime.stop import Stopped
    from verl_bridge.runtime.trainer import MegatronTrainer

    try:
        cfg = load_config(config_file, overrides, require_model_source=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        MegatronTrainer(cfg).train()
    except Stopped as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted (a second signal: stopped at once, nothing saved for the step in flight; "
              "trainer.resume=auto continues from the last checkpoint)", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one readable paragraph, traceback on request
        rank = os.environ.get("RANK", "0")
        if os.environ.get("VERL_BRIDGE_DEBUG"):
            traceback.print_exc()
        print(f"error (rank {rank}): {type(exc).__name__}: {exc}\n"
              "Set VERL_BRIDGE_DEBUG=1 for the full traceback; `verl-bridge doctor` checks the environment.",
              file=sys.stderr)
        return 2
    finally:
        from verl_bridge.distributed import destroy

        try:
            destroy()
        except (RuntimeError, ValueError) as exc:  # a group broken by the error above: report, keep its exit code
            print(f"(while tearing down process groups: {type(exc).__name__}: {exc})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_bridge.train")
    parser.add_argument("--config_file", "--config-file", required=True)
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    ns = parser.parse_args(argv)
    die_with_parent()
    return run(ns.config_file, ns.overrides)


if __name__ == "__main__":
    sys.exit(main())
