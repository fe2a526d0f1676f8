"""Hub ids in ``model_name_or_path``: resolved from a real hub cache layout, offline (HF_HUB_OFFLINE=1).

The cache is built here from a tiny model saved locally (tests/data/hub_cache.py: blobs, snapshots,
refs, as huggingface_hub writes them); nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verl_bridge.config import ConfigError, load_config
from verl_bridge.data import hub

from tests.data.hub_cache import add_to_cache

REPO = Path(__file__).resolve().parents[2]
ID = "tiny-org/tiny-llama"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.arch.tiny_hf import make_tiny_hf

    out = tmp_path_factory.mktemp("tiny_llama")
    make_tiny_hf("llama", out)
    return out


@pytest.fixture()
def cache(tmp_path, model_dir, monkeypatch):
    cache = tmp_path / "hub"
    main = add_to_cache(cache, ID, model_dir)
    v1 = add_to_cache(cache, ID, model_dir, ref="v1", commit="1" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, main, v1


def test_hub_id_resolves_to_its_cached_snapshot_offline(cache):
    from transformers import AutoConfig

    path, main, v1 = cache
    got = hub.resolve(ID, source_dir=None)
    assert Path(got) == main
    assert AutoConfig.from_pretrained(got).model_type == "llama"
    assert Path(hub.resolve(ID, None, revision="v1")) == v1
    assert Path(hub.resolve(ID, None, revision="1" * 40)) == v1  # a commit works as a revision too


def test_hf_home_is_honoured(tmp_path, model_dir, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = add_to_cache(tmp_path / "home" / "hub", ID, model_dir)
    assert hub.cache_dir() == str(tmp_path / "home" / "hub")
    assert Path(hub.resolve(ID, None)) == snap


def test_missing_id_offline_names_id_cache_and_download_command(cache):
    path, _, _ = cache
    with pytest.raises(hub.HubError) as e:
        hub.resolve("tiny-org/not-there", None, key="model.actor.args.model_name_or_path")
    msg = str(e.value)
    assert "model.actor.args.model_name_or_path='tiny-org/not-there'" in msg
    assert str(path) in msg and "HF_HUB_OFFLINE is set" in msg
    assert f"`{hub.download_command('tiny-org/not-there')}`" in msg
    with pytest.raises(hub.HubError, match="revision v9"):
        hub.resolve(ID, None, revision="v9")


def test_printed_download_command_exists_and_fills_the_same_cache(cache):
    """The command the error prints is the installed huggingface_hub's: run it (offline it answers from
    the same cache, which shows the form and the cache it uses are right)."""
    _, main, _ = cache
    cmd = hub.download_command(ID).split()
    exe = Path(sys.executable).parent / cmd[0]
    assert exe.exists(), f"{cmd[0]} is not installed next to {sys.executable}"
    r = subprocess.run([str(exe), *cmd[1:]], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr
    assert str(main) in r.stdout
    login = hub.login_command().split()  # printed for gated / private repos: the subcommand exists
    r = subprocess.run([str(Path(sys.executable).parent / login[0]), *login[1:], "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "token" in r.stdout.lower(), r.stdout + r.stderr


def test_local_directories_work_as_before(tmp_path, model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg_dir = tmp_path / "cfg"
    shutil.copytree(model_dir, cfg_dir / "models" / "tiny")
    assert hub.resolve("models/tiny", str(cfg_dir)) == str(cfg_dir / "models" / "tiny")  # next to the config
    monkeypatch.chdir(cfg_dir)
    assert hub.resolve("models/tiny", str(tmp_path)) == "models/tiny"  # then the working directory, unchanged
    assert hub.resolve(str(model_dir), None) == str(model_dir)
    with pytest.raises(hub.HubError, match="directory not found"):
        hub.resolve("./nope/x", None)  # not a hub id: a plain missing directory


def test_config_validation_accepts_cached_ids_and_lists_missing_ones(cache):
    cfg = load_config(REPO / "templates" / "grpo.yaml", ["model.actor.args.preset=null",
                                                          f"model.actor.args.model_name_or_path={ID}"])
    assert cfg.model.actor.args.model_name_or_path == ID  # the id stays in the config as written
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "templates" / "quickstart.yaml", [
            "model.actor.args.preset=null", "model.actor.args.model_name_or_path=tiny-org/missing",
            "model.critic.type=huggingface", "model.critic.args.preset=null",
            "model.critic.args.model_name_or_path=tiny-org/missing-critic"])
    assert "model.actor.args.model_name_or_path='tiny-org/missing'" in str(e.value)
    assert "model.critic.args.model_name_or_path='tiny-org/missing-critic'" in str(e.value)


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "verl_bridge.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)


def test_cli_refuses_an_unreachable_id_before_torchrun(tmp_path, monkeypatch):
    """Online but the hub unreachable (a closed local port as HF_ENDPOINT): the launcher's fetch fails
    before torchrun starts, naming the id, the cache and the command."""
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT="http://127.0.0.1:9",
               HF_HUB_ETAG_TIMEOUT="2", HF_HUB_DOWNLOAD_TIMEOUT="2")
    env.pop("HF_HUB_OFFLINE", None)
    r = _cli("train", "templates/grpo.yaml", "--nproc-per-node", "2", "model.actor.args.preset=null",
             "model.actor.args.model_name_or_path=tiny-org/elsewhere", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "model.actor.args.model_name_or_path='tiny-org/elsewhere'" in r.stderr
    assert str(tmp_path / "hub") in r.stderr and "hf download tiny-org/elsewhere" in r.stderr
    assert "torch.distributed" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_train_an_actor_named_by_hub_id_from_an_offline_cache(cache, tmp_path):
    path, main, _ = cache
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = _cli("train", "templates/grpo.yaml", "model.actor.args.preset=null",
             f"model.actor.args.model_name_or_path={ID}", f"trainer.output_dir={tmp_path / 'run'}",
             "trainer.total_steps=2", "trainer.log_every=1", "data.rollout_batch_size=4", "algorithm.group_size=4",
             "algorithm.mini_batch_size=16", "algorithm.micro_batch_size=8", "trainer.progress_bar=false", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[INFO] model.actor.args.model_name_or_path={ID}: {main}" in r.stdout
    assert "[INFO] Training step 2:" in r.stdout
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2


class _Hub:
    """A local HTTP server answering every request as the hub answers for a gated or a missing repo
    (status + X-Error-Code header, which huggingface_hub turns into GatedRepoError /
    RepositoryNotFoundError)."""

    def __init__(self, status: int, code: str):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", f"{code} (test hub)")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.mark.parametrize("status,code,expect", [(403, "GatedRepo", "is gated: accept its terms"),
                                                 (404, "RepoNotFound", "does not exist on the hub")])
def test_gated_and_missing_repos_are_named_with_the_fix(tmp_path, status, code, expect):
    hub_server = _Hub(status, code)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub_server.url, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_DISABLE_TELEMETRY="1")
        code_ = ("from verl_bridge.data import hub\n"
                 "try:\n    hub.resolve('tiny-org/locked', None, download=True, key='k')\n"
                 "except hub.HubError as e:\n    print(e)\n")
        r = subprocess.run([sys.executable, "-c", code_], capture_output=True, text=True, cwd=REPO, env=env,
                           timeout=120)
    finally:
        hub_server.close()
    assert expect in r.stdout, r.stdout + r.stderr
    assert "k='tiny-org/locked'" in r.stdout and str(tmp_path / "hub") in r.stdout
    assert "hf download tiny-org/locked" in r.stdout
