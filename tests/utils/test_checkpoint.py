from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch

from spectraflow_monai.utils import SettingError
from spectraflow_monai.utils.checkpoint import (
    CONTINUE,
    NEW,
    RECORD_FILE,
    SET_ASIDE_KEPT,
    SET_ASIDE_LEDGER,
    NonFiniteStateError,
    RestartDecision,
    check_finite_state,
    is_set_aside_name,
    latest_checkpoint,
    prune_set_aside,
    resume_checkpoint,
    set_aside,
)
from spectraflow_monai.utils.run_record import decide_restart


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


def test_resume_continues_from_the_newest_checkpoint(tmp_path):
    ckpt = _touch(tmp_path / "stage2" / "checkpoint_epoch=3.pt")
    model = _touch(tmp_path / "model.pt")
    decision = decide_restart(tmp_path / "stage2", resume=True)
    assert (decision.action, decision.checkpoint) == (CONTINUE, str(ckpt))
    assert resume_checkpoint(decision, protect=[model]) == str(ckpt)
    assert model.is_file() and ckpt.is_file()


def test_starting_over_keeps_earlier_results_aside(tmp_path, caplog):
    _touch(tmp_path / "stage2" / "checkpoint_epoch=3.pt")
    model = _touch(tmp_path / "model.pt")
    decision = decide_restart(tmp_path / "stage2", resume=False)
    assert decision.action == NEW and decision.set_aside_earlier
    with caplog.at_level("WARNING"):
        assert resume_checkpoint(decision, protect=[model]) is None
    # the checkpoints move aside; model.pt is copied aside and stays readable (a fine-tune may start from it)
    assert model.is_file() and not (tmp_path / "stage2").exists()
    kept = sorted(p.name.split(".bak-")[0] for p in tmp_path.iterdir() if ".bak-" in p.name)
    assert kept == ["model.pt", "stage2"]
    assert "model.pt" in caplog.text and ".bak-" in caplog.text
    # one decision, one time: everything it kept aside carries its stamp
    assert {p.name.split(".bak-")[1] for p in tmp_path.iterdir() if ".bak-" in p.name} == {decision.stamp}


def test_fresh_start_without_checkpoint_keeps_model_pt_aside(tmp_path):
    model = _touch(tmp_path / "model.pt")
    assert resume_checkpoint(decide_restart(tmp_path / "stage2", resume=True), protect=[model]) is None
    names = sorted(p.name.split(".bak-")[0] + (".bak" if ".bak-" in p.name else "") for p in tmp_path.iterdir())
    assert names == [SET_ASIDE_LEDGER, "model.pt", "model.pt.bak"]
    assert model.read_bytes() == next(tmp_path.glob("model.pt.bak-*")).read_bytes()


def test_explicit_resume_from(tmp_path):
    ckpt = _touch(tmp_path / "elsewhere.pt")
    decision = decide_restart(tmp_path / "stage1", resume=False, resume_from=ckpt)
    assert resume_checkpoint(decision) == str(ckpt)
    with pytest.raises(SettingError, match="resume_from"):
        decide_restart(tmp_path / "stage1", resume=True, resume_from=tmp_path / "missing.pt")
    # a checkpoint inside the folder that --resume false would move away: refused before anything moves
    inside = _touch(tmp_path / "stage1" / "checkpoint_epoch=2.pt")
    with pytest.raises(SettingError, match="lies in"):
        decide_restart(tmp_path / "stage1", resume=False, resume_from=inside)
    assert inside.is_file()
    assert decide_restart(tmp_path / "stage1", resume=True, resume_from=inside).checkpoint == str(inside)


@pytest.mark.parametrize(
    "decision, error",
    [
        ("models/stage2", "decision must be a RestartDecision"),
        (None, "decision must be a RestartDecision"),
    ],
)
def test_resume_checkpoint_takes_a_decision(decision, error):
    with pytest.raises(ValueError, match=error):
        resume_checkpoint(decision)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"action": "refuse"}, "action must be 'continue' or 'new'"),
        ({"action": CONTINUE}, "checkpoint must be given with action 'continue' only"),
        ({"action": NEW, "checkpoint": "c.pt"}, "checkpoint must be given with action 'continue' only"),
    ],
)
def test_restart_decision_checks_its_fields(kwargs, error):
    with pytest.raises(ValueError, match=error):
        RestartDecision("run", **kwargs)


@pytest.mark.parametrize("resume", ["true", 1, None])
def test_the_decision_takes_resume_as_run_settings_made_it(resume):
    with pytest.raises(ValueError, match="resume must be a bool"):
        decide_restart("unused", resume=resume)


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


# ------------------------------------------- set-aside pruning removes only what set_aside made (hostile names)
_OLD = "20200101-000000"  # older than every version the tests make: pruning would pick it first
_MINE = "20251231-000000"  # a version set_aside makes before the others (the oldest of its own)


def _other_run(root):
    """Another run's folder outside the folder ``set_aside`` works in: checkpoints and its record."""
    for name in ("checkpoint_epoch=1.pt", "checkpoint_final.pt", RECORD_FILE):
        (root / "other_run").mkdir(parents=True, exist_ok=True)
        (root / "other_run" / name).write_bytes(b"another run's " + name.encode())
    return root / "other_run"


def _ledger(folder, versions):
    (folder / SET_ASIDE_LEDGER).write_text(json.dumps({"versions": versions}))


def _identity(path, kind):
    st = os.lstat(path)
    return {"name": path.name, "type": kind, "dev": st.st_dev, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


def _hostile_link_to_a_run(folder, outside):
    os.symlink(_other_run(outside), folder / f"stage2.bak-{_OLD}")
    os.symlink(_other_run(outside), folder / f"model.pt.bak-{_OLD}")
    return True


def _hostile_link_to_a_file(folder, outside):
    (outside / "model.pt").write_bytes(b"a model elsewhere")
    os.symlink(outside / "model.pt", folder / f"model.pt.bak-{_OLD}")
    return True


def _hostile_forged_ledger_for_links(folder, outside):
    """The links are listed in the ledger with the identity of what they point to."""
    run, model = _other_run(outside), outside / "model.pt"
    model.write_bytes(b"a model elsewhere")
    os.symlink(run, folder / f"stage2.bak-{_OLD}")
    os.symlink(model, folder / f"model.pt.bak-{_OLD}")
    _ledger(folder, [{**_identity(run, "dir"), "name": f"stage2.bak-{_OLD}"},
                     {**_identity(model, "file"), "name": f"model.pt.bak-{_OLD}"}])  # fmt: skip
    return True


def _hostile_users_own_versions(folder, outside):
    (folder / f"model.pt.bak-{_OLD}").write_bytes(b"a user's own copy")
    (folder / f"stage2.bak-{_OLD}").mkdir()
    (folder / f"stage2.bak-{_OLD}" / "checkpoint_epoch=1.pt").write_bytes(b"a user's own checkpoint")
    return True


def _hostile_replaced_versions(folder, outside):
    """Versions set_aside made, replaced afterwards by another file / folder of the same name."""
    model, run = folder / "model.pt", folder / "stage2"
    aside = set_aside(model, _OLD, copy=True)
    (folder / "new").write_bytes(b"a user's file")
    os.replace(folder / "new", aside)
    _touch(run / "checkpoint_epoch=1.pt")
    aside = set_aside(run, _OLD)
    shutil.rmtree(aside)
    _touch(aside / "checkpoint_epoch=1.pt")  # another folder of that name (its inode number may be the same)
    return True


def _hostile_ledger_naming_outside(folder, outside):
    """Entries that name things outside the folder, each with its true identity."""
    run, model = _other_run(outside), outside / f"model.pt.bak-{_OLD}"
    model.write_bytes(b"a model elsewhere")
    names = [f"../outside/model.pt.bak-{_OLD}", str(model), f"../outside/other_run/{RECORD_FILE}", str(run), "..",
             f"outside/model.pt.bak-{_OLD}", f"..\\model.pt.bak-{_OLD}"]  # fmt: skip
    _ledger(folder, [{**_identity(model, "file"), "name": name} for name in names]
            + [{**_identity(run, "dir"), "name": "../outside/other_run/../other_run"}])  # fmt: skip
    return True


def _hostile_ledger_not_json(folder, outside):
    (folder / SET_ASIDE_LEDGER).write_text("{not json")
    (folder / f"model.pt.bak-{_OLD}").write_bytes(b"a user's own copy")
    return True


def _hostile_ledger_of_wrong_types(folder, outside):
    (folder / f"model.pt.bak-{_OLD}").write_bytes(b"a user's own copy")
    good = _identity(folder / f"model.pt.bak-{_OLD}", "file")
    (folder / SET_ASIDE_LEDGER).write_text(json.dumps({"versions": [
        {**good, "dev": str(good["dev"])}, {**good, "ino": True}, {**good, "type": "link"}, {**good, "name": 7},
        [good["name"]], {**good, "name": "model.pt"}, {**good, "ino": -1}]}))  # fmt: skip
    return True


def _hostile_links_inside_a_version(folder, outside):
    """A run folder set aside with links in it named like run files: its own run file goes, the links stay."""
    run, other = folder / "stage2", _other_run(outside)
    _touch(run / "checkpoint_epoch=1.pt")
    for name in ("checkpoint_final.pt", RECORD_FILE):
        os.symlink(other / name, run / name)
    os.symlink(other, run / "checkpoint_epoch=2.pt")
    set_aside(run, _MINE)
    return True


def _hostile_ledger_is_a_link(folder, outside):
    """The ledger is a link to a file elsewhere: it is neither read nor written, nothing is recorded or removed."""
    (outside / "notes.json").write_text('{"versions": []}')
    os.symlink(outside / "notes.json", folder / SET_ASIDE_LEDGER)
    return False


HOSTILE = {
    "link to another run": _hostile_link_to_a_run,
    "link to a file": _hostile_link_to_a_file,
    "ledger lists links": _hostile_forged_ledger_for_links,
    "user's own versions": _hostile_users_own_versions,
    "replaced versions": _hostile_replaced_versions,
    "ledger names outside": _hostile_ledger_naming_outside,
    "ledger not json": _hostile_ledger_not_json,
    "ledger of wrong types": _hostile_ledger_of_wrong_types,
    "links inside a version": _hostile_links_inside_a_version,
    "ledger is a link": _hostile_ledger_is_a_link,
}


def _snapshot(root):
    """Every entry under ``root`` (links not followed) with its kind and contents."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                found[path] = ("link", os.readlink(path))
            elif os.path.isfile(path) and name != SET_ASIDE_LEDGER:
                with open(path, "rb") as f:
                    found[path] = ("file", f.read())
            elif os.path.isdir(path):
                found[path] = ("dir", None)
    return found


def check_removes_only_what_it_made(tmp_path, case, keep=SET_ASIDE_KEPT, prune=None):
    """Build the ``HOSTILE[case]`` names in ``tmp_path/models``, set ``model.pt`` and a run folder aside
    SET_ASIDE_KEPT + 2 times (then ``prune(folder)`` when given, which is to keep ``keep``) and check that nothing
    else changed (links and what they point to included) and that only the newest ``keep`` versions made are left."""
    folder, outside = tmp_path / "models", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    model = _touch(folder / "model.pt")
    bounded = HOSTILE[case](folder, outside)
    before = _snapshot(tmp_path)
    stamps = [f"20260101-00000{i}" for i in range(SET_ASIDE_KEPT + 2)]
    for stamp in stamps:
        set_aside(model, stamp, copy=True)
        _touch(folder / "stage2" / "checkpoint_epoch=1.pt")
        set_aside(folder / "stage2", stamp)
    removed = prune(folder) if prune is not None else []
    after = _snapshot(tmp_path)
    ours = tuple(str(folder / f"{name}.bak-{s}") for name in ("model.pt", "stage2") for s in [_MINE, *stamps])
    theirs = lambda found: {p: v for p, v in found.items() if not p.startswith(ours)}
    assert theirs(after) == theirs(before)  # nothing else touched, inside the folder or outside
    assert {p: v for p, v in before.items() if v[0] == "link"}.items() <= after.items()  # links kept, as they were
    made = {name: sorted(p.name for p in folder.glob(f"{name}.bak-2026*")) for name in ("model.pt", "stage2")}
    if bounded:
        assert made == {name: [f"{name}.bak-{s}" for s in stamps[-keep:]] for name in made}
        ledger = json.loads((folder / SET_ASIDE_LEDGER).read_text())["versions"]
        assert sorted(v["name"] for v in ledger) == sorted(made["model.pt"] + made["stage2"])
        if prune is not None:
            assert removed == sorted(f"{n}.bak-{s}" for n in made for s in stamps[-SET_ASIDE_KEPT:-keep])
    else:
        assert made == {name: [f"{name}.bak-{s}" for s in stamps] for name in made} and removed == []


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_set_aside_removes_only_what_it_made(tmp_path, case, caplog):
    """Whatever else is named like a set-aside version, or listed in the ledger, stays: links (never followed,
    outside the folder or inside a version), a user's files and folders, versions replaced since, entries naming
    paths outside the folder; none of it is counted among the kept versions, and what set_aside makes stays
    bounded."""
    with caplog.at_level("INFO"):
        check_removes_only_what_it_made(tmp_path, case)
    assert not [r.message for r in caplog.records if r.message.startswith("removed") and _OLD in r.message]
    if case == "links inside a version":  # its own run file removed, the links named like run files kept
        assert "holds files a run did not write there (checkpoint_epoch=2.pt, checkpoint_final.pt" in caplog.text
        assert sorted(os.listdir(tmp_path / "models" / f"stage2.bak-{_MINE}")) == [
            "checkpoint_epoch=2.pt", "checkpoint_final.pt", RECORD_FILE]  # fmt: skip


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_prune_set_aside_keeps_what_it_made_count(tmp_path, kind):
    """prune_set_aside: the newest ``keep`` recorded versions of each name stay (0 removes them all); a run folder
    loses its run files and ledger and is removed; look-alikes are not counted; a bad ``keep`` is refused."""
    path = tmp_path / ("model.pt" if kind == "file" else "stage2")
    (tmp_path / f"{path.name}.bak-{_OLD}").write_bytes(b"a user's own copy")
    made = []
    for i in range(4):
        if kind == "file":
            made.append(set_aside(_touch(path), f"20260101-00000{i}", copy=True).name)
        else:
            _touch(path / "checkpoint_epoch=1.pt")
            set_aside(_touch(path / RECORD_FILE), "20250101-000000")  # a record the run set aside, and its ledger
            made.append(set_aside(path, f"20260101-00000{i}").name)
    left = lambda: sorted(p.name for p in tmp_path.glob(f"{path.name}.bak-2026*"))
    assert left() == made[-SET_ASIDE_KEPT:]
    assert prune_set_aside(tmp_path, 1) == made[-SET_ASIDE_KEPT:-1]
    assert left() == made[-1:]
    assert prune_set_aside(tmp_path, 1, of="other") == [] and left() == made[-1:]
    assert prune_set_aside(tmp_path, 0, of=path.name) == made[-1:] and left() == []
    assert (tmp_path / f"{path.name}.bak-{_OLD}").read_bytes() == b"a user's own copy"
    assert prune_set_aside(tmp_path / "missing", 2) == []
    for keep in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"keep must be an integer >= 0, got {keep!r}"):
            prune_set_aside(tmp_path, keep)


def test_set_aside_keeps_what_it_is_told(tmp_path):
    """``keep``: how many versions set_aside leaves (None: it prunes nothing, the caller does); a bad one is refused
    before anything is set aside."""
    model = _touch(tmp_path / "model.pt")
    made = [set_aside(model, f"20260101-00000{i}", copy=True, keep=None).name for i in range(SET_ASIDE_KEPT + 1)]

    def left() -> list[str]:
        return sorted(p.name for p in tmp_path.glob("model.pt.bak-*"))

    recorded = [v["name"] for v in json.loads((tmp_path / SET_ASIDE_LEDGER).read_text())["versions"]]
    assert left() == made and recorded == made
    made.append(set_aside(model, "20260101-000009", copy=True, keep=1).name)
    assert left() == made[-1:]
    for keep in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"keep must be None or an integer >= 0, got {keep!r}"):
            set_aside(model, "20260102-000000", copy=True, keep=keep)
    assert left() == made[-1:]


@pytest.mark.parametrize("copy", [True, False])
def test_set_aside_says_starting_over_unless_the_caller_says_why(tmp_path, caplog, copy):
    """``log``: by default the version kept is logged in the words of a run that starts over; with False nothing
    is logged (the caller says why, e.g. a served model replaced by an upload), and the version is kept all the
    same."""
    model = tmp_path / "model.pt"
    with caplog.at_level("INFO"):
        first = set_aside(_touch(model), "20260101-000000", copy=copy)
        assert "starting over: kept" in caplog.text and first.name in caplog.text
        caplog.clear()
        second = set_aside(_touch(model), "20260101-000001", copy=copy, log=False)
    assert caplog.text == "" and second.is_file() and model.is_file() is copy


_NAMES = [(f"model.pt.bak-{_OLD}", True), (f"model.pt.bak-{_OLD}-12", True), ("model.pt.bak-mine", False),
          ("model.pt", False), (f".bak-{_OLD}", False), (f"model.pt.bak-{_OLD}.tmp", False)]  # fmt: skip


@pytest.mark.parametrize("name, plain", _NAMES)
def test_is_set_aside_name(name, plain):
    assert is_set_aside_name(name) is plain


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"versions": "model.pt.bak-20200101-000000"}', "null", ""])
def test_a_ledger_that_is_not_one_removes_nothing(tmp_path, text, caplog):
    (tmp_path / f"model.pt.bak-{_OLD}").write_bytes(b"a user's own copy")
    (tmp_path / SET_ASIDE_LEDGER).write_text(text)
    with caplog.at_level("WARNING"):
        assert prune_set_aside(tmp_path, 0) == []
    assert (tmp_path / f"model.pt.bak-{_OLD}").read_bytes() == b"a user's own copy"
    assert "is not a set-aside ledger" in caplog.text


def test_a_version_removed_by_hand_is_no_longer_counted(tmp_path):
    model = _touch(tmp_path / "model.pt")
    made = [set_aside(model, f"20260101-00000{i}", copy=True) for i in range(SET_ASIDE_KEPT)]
    made[-1].unlink()
    assert prune_set_aside(tmp_path, 1) == [made[0].name]
    assert [v["name"] for v in json.loads((tmp_path / SET_ASIDE_LEDGER).read_text())["versions"]] == [made[1].name]
