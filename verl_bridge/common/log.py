"""The console's ``[INFO]`` / ``[WARN]`` lines, for every layer (``verl_bridge.runtime.metrics``
re-exports them)."""


def info(msg: str) -> None:
    print(f"[INFO] {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"[WARN] {msg}", flush=True)
