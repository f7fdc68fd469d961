from __future__ import annotations

import os
import time

import pytest
import torch

from spectraflow_monai.utils import SettingError
from spectraflow_monai.utils.checkpoint import (
    SET_ASIDE_KEPT,
    NonFiniteStateError,
    check_finite_state,
    latest_checkpoint,
    resume_checkpoint,
    set_aside,
)


def test_check_finite_state_names_the_tensor():
    check_finite_state({"a": torch.ones(2), "best": float("inf"), "step": 3})  # numbers are bookkeeping
    with pytest.raises(NonFiniteStateError, match=r"model.pt.*'model.b'"):
        check_finite_state({"model": {"a": torch.ones(2), "b": torch.tensor([0.0, float("nan")])}}, "model.pt")


def _touch(path, when=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    if when is not None:
        os.utime(path, ns=(when, when))
    return path


def test_latest_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    now = time.time_ns()
    _touch(tmp_path / "checkpoint_epoch=2.pt", now - 10**9)
    _touch(tmp_path / "checkpoint_epoch=10.pt", now)
    _touch(tmp_path / "other.pt", now + 10**9)
    assert latest_checkpoint(tmp_path).name == "checkpoint_epoch=10.pt"
    _touch(tmp_path / "checkpoint_final.pt", now - 2 * 10**9)  # older: an earlier end
    assert latest_checkpoint(tmp_path).name == "checkpoint_epoch=10.pt"
    _touch(tmp_path / "checkpoint_final.pt", now + 10**9)
    assert latest_checkpoint(tmp_path).name == "checkpoint_final.pt"


@pytest.mark.parametrize("resume", [True, "true", "True"])
def test_resume_continues_from_the_newest_checkpoint(tmp_path, resume):
    ckpt = _touch(tmp_path / "stage2" / "checkpoint_epoch=3.pt")
    model = _touch(tmp_path / "model.pt")
    assert resume_checkpoint(tmp_path / "stage2", resume, protect=[model]) == str(ckpt)
    assert model.is_file() and ckpt.is_file()


@pytest.mark.parametrize("resume", [False, "false", 0])
def test_starting_over_keeps_earlier_results_aside(tmp_path, resume, caplog):
    _touch(tmp_path / "stage2" / "checkpoint_epoch=3.pt")
    model = _touch(tmp_path / "model.pt")
    with caplog.at_level("WARNING"):
        assert resume_checkpoint(tmp_path / "stage2", resume, protect=[model]) is None
    # the checkpoints move aside; model.pt is copied aside and stays readable (a fine-tune may start from it)
    assert model.is_file() and not (tmp_path / "stage2").exists()
    kept = sorted(p.name.split(".bak-")[0] for p in tmp_path.iterdir() if ".bak-" in p.name)
    assert kept == ["model.pt", "stage2"]
    assert "model.pt" in caplog.text and ".bak-" in caplog.text


def test_fresh_start_without_checkpoint_keeps_model_pt_aside(tmp_path):
    model = _touch(tmp_path / "model.pt")
    assert resume_checkpoint(tmp_path / "stage2", True, protect=[model]) is None
    assert sorted(p.name.split(".bak-")[0] + (".bak" if ".bak-" in p.name else "") for p in tmp_path.iterdir()) == [
        "model.pt",
        "model.pt.bak",
    ]
    assert model.read_bytes() == next(tmp_path.glob("model.pt.bak-*")).read_bytes()


def test_explicit_resume_from(tmp_path):
    ckpt = _touch(tmp_path / "elsewhere.pt")
    assert resume_checkpoint(tmp_path / "stage1", False, resume_from=ckpt) == str(ckpt)
    with pytest.raises(SettingError, match="resume_from"):
        resume_checkpoint(tmp_path / "stage1", True, resume_from=tmp_path / "missing.pt")


def test_bad_resume_value():
    with pytest.raises(SettingError, match="resume must be true or false, got 'maybe'"):
        resume_checkpoint("unused", "maybe")


def test_what_is_set_aside_stays_bounded(tmp_path, caplog):
    """Repeated starts keep the newest SET_ASIDE_KEPT versions of a file and of a run folder; an older folder loses
    only the files a run writes, and stays when someone else's file is in it; other names are never touched."""
    model, run = _touch(tmp_path / "model.pt"), tmp_path / "stage2"
    (tmp_path / "model.pt.bak-mine").write_bytes(b"a user's copy")  # not a name set_aside makes
    stamps = [f"20260101-00000{i}" for i in range(SET_ASIDE_KEPT + 2)]
    for i, stamp in enumerate(stamps):
        set_aside(model, stamp, copy=True)
        _touch(run / "checkpoint_epoch=1.pt")
        _touch(run / "run_record.json")
        _touch(run / f"run_record.json.bak-{stamp}")  # an earlier record the run set aside
        if i == 0:
            _touch(run / "notes.txt")  # someone else's file in the first run folder
        set_aside(run, stamp)
    kept = sorted(p.name for p in tmp_path.glob("model.pt.bak-2*"))
    assert kept == [f"model.pt.bak-{s}" for s in stamps[-SET_ASIDE_KEPT:]]
    assert (tmp_path / "model.pt.bak-mine").is_file() and model.is_file()
    folders = sorted(p.name for p in tmp_path.glob("stage2.bak-*"))
    assert folders == [f"stage2.bak-{stamps[0]}"] + [f"stage2.bak-{s}" for s in stamps[-SET_ASIDE_KEPT:]]
    assert [p.name for p in (tmp_path / f"stage2.bak-{stamps[0]}").iterdir()] == ["notes.txt"]
    assert "holds files a run did not write there" in caplog.text
