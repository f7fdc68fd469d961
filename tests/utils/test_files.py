import os
import stat

import pytest
import torch

from spectraflow_monai.utils import atomic_path, atomic_torch_save, require_file, require_items, write_text_atomic


def test_atomic_path_replaces_and_keeps_suffix(tmp_path):
    dest = tmp_path / "sub" / "volume.nii.gz"
    with atomic_path(dest) as tmp:
        assert tmp.endswith(".nii.gz") and os.path.dirname(tmp) == str(dest.parent)
        with open(tmp, "w") as f:
            f.write("new")
    assert dest.read_text() == "new"
    assert os.listdir(dest.parent) == ["volume.nii.gz"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o666 & ~mask


def test_atomic_path_failure_keeps_old_file(tmp_path):
    dest = tmp_path / "a.txt"
    dest.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(dest) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("interrupted")
    assert dest.read_text() == "old"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_atomic_path_rejects_directory(tmp_path):
    with pytest.raises(ValueError, match="directory"):
        with atomic_path(tmp_path):
            pass


def test_write_text_and_torch_save(tmp_path):
    write_text_atomic(tmp_path / "x.md", "| a |\n")
    assert (tmp_path / "x.md").read_text() == "| a |\n"
    atomic_torch_save({"w": torch.ones(2)}, tmp_path / "m.pt")
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True)["w"], torch.ones(2))


def test_require(tmp_path):
    f = tmp_path / "model.pt"
    with pytest.raises(FileNotFoundError, match="model.pt.*train first"):
        require_file(f, "train first")
    f.write_bytes(b"")
    assert require_file(f) == str(f)
    assert require_items([1], "none") == [1]
    with pytest.raises(FileNotFoundError, match="no image matches"):
        require_items([], "no image matches '*.png' in 'dir'")
