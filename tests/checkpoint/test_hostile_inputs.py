"""Hostile files the other checkpoint tests do not cover: each is refused with a message naming the
file and the problem, never loaded silently, never a raw traceback, and never changes the process."""

import pathlib
import pickle

import pytest

from verl_bridge.checkpoint.safe_load import CheckpointError


def _metadata(relative_path: str) -> bytes:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    md = Metadata(state_dict_metadata={}, storage_data={MetadataIndex("w"): _StorageInfo(relative_path, 0, 8)})
    return pickle.dumps(md)


def test_metadata_build_on_allowlisted_class_is_refused_and_changes_nothing(tmp_path):
    """pickle BUILD with slot state on the *class* pathlib.PosixPath would setattr on it for the whole
    process (here: PosixPath.__truediv__ = list) before the type check refuses the file."""
    from verl_bridge.checkpoint.safe_torch_dist import read_metadata

    before = pathlib.PosixPath.__dict__.get("__truediv__", pathlib.PurePath.__truediv__)
    path = tmp_path / ".metadata"
    path.write_bytes(b"\x80\x04cpathlib\nPosixPath\nN}S'__truediv__'\ncbuiltins\nlist\ns\x86b.")
    try:
        with pytest.raises(CheckpointError) as exc:
            read_metadata(path)
        assert "pathlib.PosixPath" in str(exc.value) and str(path) in str(exc.value)
    finally:
        patched = pathlib.PosixPath.__dict__.get("__truediv__")
        if patched is list:  # undo the damage so the rest of the session works
            del pathlib.PosixPath.__truediv__
    assert patched is not list, "the pickle rewrote pathlib.PosixPath.__truediv__"
    assert pathlib.PosixPath.__truediv__ is before


def test_metadata_build_on_allowlisted_function_is_refused(tmp_path):
    import torch.serialization

    from verl_bridge.checkpoint.safe_torch_dist import read_metadata

    had = dict(getattr(torch.serialization._get_layout, "__dict__", {}))
    path = tmp_path / ".metadata"
    path.write_bytes(b"\x80\x04ctorch.serialization\n_get_layout\n}S'cache'\n}S'torch.strided'\nS'evil'\nssb.")
    with pytest.raises(CheckpointError):
        read_metadata(path)
    assert torch.serialization._get_layout.__dict__ == had


def test_clean_metadata_still_reads(tmp_path):
    from verl_bridge.checkpoint.safe_torch_dist import read_metadata

    path = tmp_path / ".metadata"
    path.write_bytes(_metadata("__0_0.distcp"))
    md = read_metadata(path)
    assert [i.relative_path for i in md.storage_data.values()] == ["__0_0.distcp"]


@pytest.mark.parametrize("rel", ["../../secret.bin", "/etc/passwd", "..", "sub/../../x"])
def test_metadata_data_file_outside_the_directory_is_refused(rel, tmp_path):
    from verl_bridge.checkpoint.safe_torch_dist import read_metadata

    path = tmp_path / ".metadata"
    path.write_bytes(_metadata(rel))
    with pytest.raises(CheckpointError) as exc:
        read_metadata(path)
    assert repr(rel) in str(exc.value) and "outside" in str(exc.value) and str(path) in str(exc.value)


# ---- `verl-bridge convert` on malformed, hostile or unwritable input: exit 2, one paragraph, DST untouched

import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402

import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402

LEGACY = "iter_0000000/mp_rank_00/model_optim_rng.pt"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.arch.tiny_hf import make_tiny_hf
    from verl_bridge.checkpoint.hf import import_hf

    root = tmp_path_factory.mktemp("hostile")
    make_tiny_hf("llama", root / "hf")
    import_hf(root / "hf", root / "leg")
    import_hf(root / "hf", root / "leg_tp2", tp=2)
    return root


def _convert(src, dst, to):
    from verl_bridge.commands.convert import convert

    r = CliRunner().invoke(convert, [str(src), str(dst), "--to", to])
    assert r.exception is None or isinstance(r.exception, SystemExit), f"raw exception: {r.exception!r}\n{r.output}"
    assert "Traceback" not in r.output, r.output
    return r


def _edit_legacy(d, fn):
    from verl_bridge.checkpoint.manifest import write_manifest

    p = d / LEGACY
    state = torch.load(p, weights_only=False)  # our own test file
    torch.save(fn(state), p)
    write_manifest(p.parent.parent)


def _set_arg(name, value):
    def fn(s):
        setattr(s["args"], name, value)
        return s
    return fn


def _first_qkv(value):
    def fn(s):
        s["model"][next(k for k in s["model"] if k.endswith("linear_qkv.weight"))] = value
        return s
    return fn


MALFORMED = {
    "args is None": (lambda s: {**s, "args": None}, "no Megatron-LM 'args'"),
    "model is a list": (lambda s: {**s, "model": [1, 2]}, "no 'model' state dict"),
    "num_layers is a string": (_set_arg("num_layers", "two"), "args.num_layers='two'"),
    "num_attention_heads is 0": (_set_arg("num_attention_heads", 0), "args.num_attention_heads=0"),
    "a weight is a string": (_first_qkv("hello"), "not tensors"),
    "file holds a list": (lambda s: [s], "holds a list"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_convert_malformed_legacy_checkpoint_is_one_paragraph(case, tiny, tmp_path):
    src = tmp_path / "leg"
    shutil.copytree(tiny / "leg", src)
    fn, words = MALFORMED[case]
    _edit_legacy(src, fn)
    r = _convert(src, tmp_path / "out", "hf")
    assert r.exit_code == 2 and words in r.output and str(src / LEGACY) in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_convert_missing_tp_rank_is_named(tiny, tmp_path):
    from verl_bridge.checkpoint.manifest import write_manifest

    src = tmp_path / "leg"
    shutil.copytree(tiny / "leg_tp2", src)
    shutil.rmtree(src / "iter_0000000" / "mp_rank_00")
    write_manifest(src / "iter_0000000")
    r = _convert(src, tmp_path / "out", "hf")
    assert r.exit_code == 2 and "incomplete" in r.output and "mp_rank_00/model_optim_rng.pt" in r.output, r.output


@pytest.mark.parametrize("entry", ["a string", "../../../../etc/hostname", "/etc/hostname"])
def test_manifest_entries_that_are_not_files_inside_are_corruption(entry, tiny, tmp_path):
    from verl_bridge.checkpoint.manifest import MANIFEST, verify_manifest
    from verl_bridge.checkpoint.safe_load import CorruptCheckpointError

    src = tmp_path / "leg"
    shutil.copytree(tiny / "leg", src)
    m = src / "iter_0000000" / MANIFEST
    j = json.loads(m.read_text())
    if entry == "a string":
        j["files"] = {k: "x" for k in j["files"]}
    else:
        j["files"][entry] = {"size": 1, "sha256": "0" * 64}
    m.write_text(json.dumps(j))
    with pytest.raises(CorruptCheckpointError) as exc:
        verify_manifest(src / "iter_0000000")
    assert str(m) in str(exc.value)


@pytest.mark.parametrize("index", [{"weight_map": {"w": "../outside.safetensors"}},
                                   {"weight_map": {"w": "/tmp/outside.safetensors"}},
                                   {"weight_map": [1]}, {}])
def test_convert_safetensors_index_outside_or_malformed_is_refused(index, tiny, tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(tiny / "hf", src)
    os.replace(src / "model.safetensors", tmp_path / "outside.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    r = _convert(src, tmp_path / "out", "megatron")
    assert r.exit_code == 2 and "model.safetensors.index.json" in r.output, r.output
    assert ("outside" if "weight_map" in index and isinstance(index["weight_map"], dict) else "weight_map") in r.output
    assert not (tmp_path / "out").exists()


def test_convert_disk_full_while_importing_leaves_nothing(tiny, tmp_path, monkeypatch):
    def fill_then_enospc(obj, f, *a, **k):
        with open(f, "wb") as out:
            out.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", fill_then_enospc)
    r = _convert(tiny / "hf", tmp_path / "out", "megatron")
    assert r.exit_code == 2 and "no space left on device" in r.output, r.output
    assert not (tmp_path / "out").exists(), sorted(map(str, (tmp_path / "out").rglob("*")))


def test_convert_disk_full_while_exporting_keeps_the_old_dst(tiny, tmp_path, monkeypatch):
    import safetensors.torch

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old weights")

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.torch, "save_file", enospc)
    r = _convert(tiny / "leg", out, "hf")
    assert r.exit_code == 2 and "No space left on device" in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == b"old weights"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_numpy_object_array_is_a_refusal_not_corruption(tmp_path):
    """An object ndarray (elements are arbitrary pickles) is refused as a type outside the allowlist,
    not reported as 'truncated or corrupted' with torch's advice to retry with weights_only=False."""
    import io

    import numpy as np

    from verl_bridge.checkpoint.safe_load import CorruptCheckpointError, safe_load
    from verl_bridge.checkpoint.safe_torch_dist import load_bytes_item

    path = tmp_path / "model_optim_rng.pt"
    torch.save({"model": {}, "rng_state": [{"np_rng_state": np.array([1, "a"], dtype=object)}]}, path)
    with pytest.raises(CheckpointError) as exc:
        safe_load(path)
    assert not isinstance(exc.value, CorruptCheckpointError), str(exc.value)
    assert "ObjectDType" in str(exc.value) and "allowlist" in str(exc.value) and str(path) in str(exc.value)
    buf = io.BytesIO(path.read_bytes())
    with pytest.raises(CheckpointError) as exc:
        load_bytes_item(buf, "x.distcp (byte item 'rng_state')")
    assert not isinstance(exc.value, CorruptCheckpointError) and "ObjectDType" in str(exc.value)


def test_export_into_a_dir_with_other_weights_is_refused_and_nothing_deleted(tiny, tmp_path):
    """A re-export next to the shards + index of an earlier sharded save made a mixed directory in
    which verl-bridge's own reader (the index wins) silently loaded the OLD weights."""
    from safetensors.torch import save_file

    out = tmp_path / "out"
    out.mkdir()
    save_file({"old": torch.zeros(2)}, str(out / "model-00001-of-00001.safetensors"))
    index = json.dumps({"weight_map": {"old": "model-00001-of-00001.safetensors"}})
    (out / "model.safetensors.index.json").write_text(index)
    r = _convert(tiny / "leg", out, "hf")
    assert r.exit_code == 2 and "already holds other weights" in r.output and "model.safetensors.index.json" in r.output
    assert sorted(p.name for p in out.iterdir()) == ["model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    assert (out / "model.safetensors.index.json").read_text() == index


def test_export_over_its_own_previous_export_still_works(tiny, tmp_path):
    out = tmp_path / "out"
    assert _convert(tiny / "leg", out, "hf").exit_code == 0
    assert _convert(tiny / "leg", out, "hf").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("layers", [10**9, 3, 1])
def test_convert_config_layer_count_that_the_weights_do_not_hold_is_refused_at_once(layers, tiny, tmp_path):
    """num_hidden_layers=10**9 made convert enumerate (and try to build) a billion layers: a hang.
    The two-layer weights are checked against the count before anything is built."""
    src = tmp_path / "hf"
    shutil.copytree(tiny / "hf", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (src / "config.json").write_text(json.dumps(cfg))
    r = _convert(src, tmp_path / "out", "megatron")
    assert r.exit_code == 2 and f"num_hidden_layers={layers}" in r.output and "layers 0..1" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_model_provider_refuses_more_layers_than_the_weights_hold(tiny, tmp_path):
    from verl_bridge.arch import hf_model_provider

    src = tmp_path / "hf"
    shutil.copytree(tiny / "hf", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = 10**9
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_hidden_layers=1000000000"):
        hf_model_provider(src)(True, True)


def test_resaving_an_iteration_never_leaves_it_missing(tmp_path, monkeypatch):
    """Re-saving iteration 1 (a convert into the same DST, a stop-save of a step already saved):
    a kill between "move the old one aside" and "rename the new one in" left no iter_0000001 at all
    (the data sat in iter_0000001.tmp-old, which nothing reads). Simulated: every os.rename after the
    first raises, as if the process died there."""
    from verl_bridge.checkpoint import megatron as mckpt
    from verl_bridge.checkpoint.megatron import load, save, validate_iteration

    save(tmp_path, 1, {"model": {"w": torch.zeros(2)}})
    tmp = mckpt.write(tmp_path, 1, {"model": {"w": torch.ones(2)}})
    real, calls = os.rename, []

    def dies_after_first(src, dst, *a, **k):
        calls.append((src, dst))
        if len(calls) > 1:
            raise KeyboardInterrupt("killed between the renames")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", dies_after_first)
    try:
        mckpt.publish(tmp_path, tmp, 1)
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    validate_iteration(tmp_path, 1)
    assert load(tmp_path, 1)["model"]["w"].tolist() in ([0.0, 0.0], [1.0, 1.0])


def test_convert_tensor_that_contradicts_args_names_the_tensor(tiny, tmp_path):
    src = tmp_path / "leg"
    shutil.copytree(tiny / "leg", src)
    _edit_legacy(src, _first_qkv(torch.zeros(3, 3)))
    r = _convert(src, tmp_path / "out", "hf")
    assert r.exit_code == 2 and "linear_qkv.weight of shape (3, 3)" in r.output and "Nothing was written" in r.output, r.output
    assert not (tmp_path / "out").exists()
