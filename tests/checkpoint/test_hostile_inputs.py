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
