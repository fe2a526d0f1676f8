"""Hugging Face hub ids for ``model_name_or_path``: a local directory, or an id resolved through
``huggingface_hub``'s own cache.

Order, for ``model.<role>.args.model_name_or_path`` (with the optional ``model.<role>.args.revision``):

1. a local directory (next to the config first, then the working directory) is used as it is;
2. otherwise a string shaped like a hub id (``Qwen/Qwen2.5-0.5B-Instruct``, ``gpt2``) is looked up in
   the hub cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: the
   ``models--ORG--NAME/{blobs,refs,snapshots}`` layout ``huggingface_hub`` writes);
3. not cached and ``HF_HUB_OFFLINE`` unset: ``huggingface_hub.snapshot_download`` fetches the
   config, tokenizer and safetensors files into that cache.

``verl-bridge train`` resolves every id once, in the launching process, before ``torchrun`` starts
(:func:`prefetch`): an id that cannot be had is an error naming the id, the cache searched and the
command that pre-downloads it, and the ranks then all read the shared cache. Under a user's own
``torchrun``, ranks that miss the cache download concurrently; ``huggingface_hub`` locks each file,
so one process fetches it and the others wait for it.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from typing import Optional

# the files a model needs here: config, tokenizer, weights (safetensors only: no pickles)
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
_TRUE = {"1", "on", "yes", "true"}


class HubError(ValueError):
    """A model id that cannot be had; the message names the id, the cache and the fix."""


def is_hub_id(path: str) -> bool:
    """``ORG/NAME`` or ``NAME``, as the hub spells repository ids (no ``..``, ``--``, leading ``.``/``/``)."""
    return (isinstance(path, str) and len(path) <= 96 and bool(_HUB_ID.match(path))
            and ".." not in path and "--" not in path and not path.endswith(".git"))


def local_candidates(path: str, source_dir: Optional[str]) -> list[str]:
    """Where a relative directory is looked for: next to the config, then the working directory."""
    if os.path.isabs(path):
        return [path]
    out = [os.path.join(source_dir, path)] if source_dir else []
    return out + [os.path.abspath(path)]


def cache_dir() -> str:
    """The hub cache ``huggingface_hub`` uses, read from the environment now (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return os.path.expanduser(os.environ["HUGGINGFACE_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def offline() -> bool:
    return (os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
            or os.environ.get("TRANSFORMERS_OFFLINE", "").strip().lower() in _TRUE)


def _cli_tool() -> str:
    try:
        scripts = {e.name for e in metadata.distribution("huggingface_hub").entry_points
                   if e.group == "console_scripts"}
    except metadata.PackageNotFoundError:
        scripts = set()
    return "hf" if "hf" in scripts or not scripts else "huggingface-cli"


def login_command() -> str:
    return "hf auth login" if _cli_tool() == "hf" else "huggingface-cli login"


def download_command(repo_id: str, revision: Optional[str] = None) -> str:
    """The installed huggingface_hub's CLI line that pre-downloads *repo_id*: ``hf download`` (>= 0.34)
    or ``huggingface-cli download`` (older)."""
    return f"{_cli_tool()} download {repo_id}" + (f" --revision {revision}" if revision else "")


def cached(repo_id: str, revision: Optional[str] = None) -> Optional[str]:
    """The cached snapshot directory of *repo_id* at *revision* (default main), or None. No network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, revision=revision, cache_dir=cache_dir(), local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None


def _where(key: str, path: str, source_dir: Optional[str], revision: Optional[str]) -> str:
    rev = f" (revision {revision})" if revision else ""
    dirs = " or ".join(local_candidates(path, source_dir))
    return (f"{key}={path!r}{rev}: not a local directory ({dirs}) and not in the Hugging Face hub cache "
            f"{cache_dir()}")


def _fix(path: str, revision: Optional[str]) -> str:
    return (f"pre-download it with `{download_command(path, revision)}` (it fills the same cache; set HF_HUB_CACHE "
            "or HF_HOME to use another), or set the key to a local Hugging Face model directory")


def resolve(path: Optional[str], source_dir: Optional[str], revision: Optional[str] = None, *,
            download: bool = True, refresh: bool = False, key: str = "model_name_or_path") -> Optional[str]:
    """A local directory for *path*: the directory itself, or the hub cache's snapshot of the id
    (downloaded when *download* and not offline). A cached snapshot is used without asking the hub,
    unless *refresh* (the launcher's :func:`prefetch`: a moved branch is fetched; an unreachable hub
    falls back to the cache). Raises :class:`HubError` when neither can be had."""
    if not path:
        return path
    for candidate in local_candidates(path, source_dir):
        if os.path.isdir(candidate):
            return candidate if candidate != os.path.abspath(path) else path
    if not is_hub_id(path):
        raise HubError(f"{key}={path!r}: directory not found ({' or '.join(local_candidates(path, source_dir))}); "
                       "expected a local Hugging Face model directory or a hub id such as ORG/NAME")
    have = cached(path, revision)
    if have is not None and not (download and refresh):
        return have
    if not download or offline():
        if have is not None:
            return have
        why = "HF_HUB_OFFLINE is set" if offline() else "downloading is off here"
        raise HubError(f"{_where(key, path, source_dir, revision)}, and {why}; {_fix(path, revision)}")
    from huggingface_hub import snapshot_download
    from huggingface_hub import errors as E

    try:
        return snapshot_download(path, revision=revision, cache_dir=cache_dir(), allow_patterns=ALLOW_PATTERNS)
    except E.GatedRepoError:
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        problem = f"is gated: accept its terms at {endpoint}/{path} and log in (`{login_command()}`, or set HF_TOKEN)"
    except E.RevisionNotFoundError:
        problem = f"has no revision {revision!r}"
    except E.RepositoryNotFoundError:
        problem = f"does not exist on the hub, or is private and no token is set (`{login_command()}`, or set HF_TOKEN)"
    except (E.LocalEntryNotFoundError, E.HfHubHTTPError, OSError) as exc:
        if have is not None:  # the hub is unreachable; the cached snapshot stands
            return have
        problem = f"could not be downloaded ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    raise HubError(f"{_where(key, path, source_dir, revision)}, and {problem}; {_fix(path, revision)}")


def model_keys(cfg) -> list[tuple[str, str, Optional[str]]]:
    """(dotted key, model_name_or_path, revision) of every role that names a model by path or id."""
    out = []
    for role in ("actor", "critic", "reward"):  # the reference is the actor's frozen copy
        r = getattr(cfg.model, role, None)
        args = getattr(r, "args", None)
        if args is not None and args.model_name_or_path:
            out.append((f"model.{role}.args.model_name_or_path", args.model_name_or_path, args.revision))
    return out


def check_one(key: str, path: Optional[str], source_dir: Optional[str], revision: Optional[str] = None) -> Optional[str]:
    """Validation of one key (no download): a path that is neither a local directory, nor a hub id,
    nor (offline) in the cache is a problem. Online, an uncached id is left to :func:`prefetch`."""
    if not path or any(os.path.isdir(c) for c in local_candidates(path, source_dir)):
        return None
    if not is_hub_id(path):
        return (f"{key}={path!r}: directory not found; expected a local Hugging Face model directory "
                "or a hub id such as ORG/NAME")
    if offline():
        try:
            resolve(path, source_dir, revision, download=False, key=key)
        except HubError as exc:
            return str(exc)
    return None


def prefetch(cfg, echo=print) -> list[str]:
    """Resolve every hub id of *cfg* now (downloading what is missing); returns the problems."""
    problems = []
    for key, path, revision in model_keys(cfg):
        if any(os.path.isdir(c) for c in local_candidates(path, cfg.source_dir)):
            continue
        try:
            where = resolve(path, cfg.source_dir, revision, download=True, refresh=True, key=key)
        except HubError as exc:
            problems.append(str(exc))
            continue
        echo(f"[INFO] {key}={path}: {where}")
    return problems
