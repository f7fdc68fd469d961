"""What the MONAI Label app accepts from a client (docs/monailabel.md, "Serving safely"), in process.

Training requests may set only the documented options (a value that MONAI's config parser would evaluate is refused
with HTTP 422 naming the option, and nothing runs); an image that is not a datastore id is answered exactly like an
unknown id; 2D label maps are PNG files with the documented values whatever the input's format. The HTTP side of the
same checks is in ``test_monailabel_app.test_server_end_to_end``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

from PIL import Image  # noqa: E402

from spectraflow_monai.utils.checkpoint import SET_ASIDE_LEDGER, set_aside  # noqa: E402
from tests.utils.test_checkpoint import HOSTILE, check_removes_only_what_it_made  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (fixtures used by name)
    IMAGE_2D_SHAPE,
    NAME_2D,
    NAME_3D,
    REPO,
    SIZE,
    TRAIN,
    _app,
    _make_bundles,
    _quiet_app,
    _status,
    _write_2d_pairs,
    _write_studies,
    app,
    app_main,
    served,
)

_PAYLOAD = "$__import__('pathlib').Path({!r}).touch() or 1"


def _bad_train_options(marker: str) -> list[tuple[dict, str]]:
    payload = _PAYLOAD.format(marker)
    return [
        ({"max_epochs": payload}, "max_epochs"),
        ({"device": payload}, "device"),
        ({"val_split": payload}, "val_split"),
        ({"tracking": "mlflow", "tracking_uri": payload}, "tracking"),
        ({"tracking_uri": payload}, "tracking_uri"),
        ({"train#trainer#max_epochs": 1}, "train#trainer#max_epochs"),
        ({"max_epochs": {"_target_": "os.system", "command": f"touch {marker}"}}, "max_epochs"),
        ({"max_epochs": "@network_def"}, "max_epochs"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"max_epochs": True}, "max_epochs"),
        ({"max_epochs": 1.5}, "max_epochs"),
        ({"val_split": 1.0}, "val_split"),
        ({"gpus": "0;touch x"}, "gpus"),
        ({"model_filename": "../../../model.pt"}, "model_filename"),
        ({"run_id": "initialize"}, "run_id"),
        ({"bundle_path": "/tmp"}, "bundle_path"),
        ({"dataset": "CacheDataset"}, "dataset"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_train_options(""))), ids=[n for _, n in _bad_train_options("")])
def test_train_refuses_options_it_does_not_document(app, tmp_path, case):
    from fastapi import HTTPException

    marker = tmp_path / "marker"
    options, named = _bad_train_options(str(marker))[case]
    with pytest.raises(HTTPException) as info:
        app.train({"model": NAME_2D, "device": "cpu", "multi_gpu": False, **options})
    status, detail = _status(info)
    assert status == 422 and f"train option {named!r}" in detail, detail
    assert not marker.exists()  # the payload never ran


def test_train_payload_never_runs(tmp_path):
    # a datastore with labelled pairs: MONAI Label's own task would build the trainer and evaluate the payload
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    _write_2d_pairs(studies, 3)
    app = _app(bundles, studies, models=NAME_2D, **{f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN})})
    marker = tmp_path / "marker"
    request = {"model": NAME_2D, "device": "cpu", "multi_gpu": False, "val_split": 0.34}
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as info:
        app.train({**request, "max_epochs": _PAYLOAD.format(str(marker))})
    status, detail = _status(info)
    assert status == 422 and "train option 'max_epochs'" in detail
    assert not marker.exists()
    with pytest.raises(ValueError, match="train option 'max_epochs'"):  # the task itself refuses it too
        app._trainers[NAME_2D]({**request, "max_epochs": _PAYLOAD.format(str(marker))}, app.datastore())
    assert not marker.exists()


def test_train_accepts_what_monai_label_clients_send(app):
    task = app._trainers[NAME_2D]
    request = {
        "model": NAME_2D, "bundle_path": task.bundle_path, "device": ["cpu"], "pretrained": True, "max_epochs": 3,
        "val_split": 0.2, "multi_gpu": True, "gpus": "all", "tracking": ["None", "mlflow"], "tracking_uri": "",
        "tracking_experiment_name": "", "run_id": "", "model_filename": ["model.pt"],
    }  # fmt: skip
    checked = app.check_train_request(request)
    assert checked == {
        "model": NAME_2D, "device": "cpu", "pretrained": True, "max_epochs": 3, "val_split": 0.2, "multi_gpu": True,
        "gpus": "all", "tracking": "None", "model_filename": "model.pt",
    }  # fmt: skip
    # MONAI Label's deprecated POST /train/ also passes each model's options under its name
    assert app.check_train_request({**request, NAME_3D: {"max_epochs": 2}}) == checked


def test_train_accepts_what_monai_label_adds(app):
    """A queued training (``run_sync=false``) reaches the app from MONAI Label's task subprocess with ``local_rank``
    added, ``gpus`` set to ``all`` and the server's ``bundle_path``; MONAI Label's client adds ``client_id``. Once
    refused (the task ended ERROR), they are accepted and none of them reaches the bundle."""
    task = app._trainers[NAME_2D]
    request = {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "local_rank": 0, "gpus": "all",
               "bundle_path": task.bundle_path, "client_id": None}  # fmt: skip
    assert app.check_train_request(request) == {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "gpus": "all"}
    assert app.check_train_request({**request, "client_id": "slicer-1"})["model"] == NAME_2D
    from fastapi import HTTPException

    for bad in ({"local_rank": "$0"}, {"local_rank": -1}, {"client_id": "$x"}):
        with pytest.raises(HTTPException) as info:
            app.check_train_request({**request, **bad})
        assert _status(info)[0] == 422


def test_server_runs_its_own_copy_of_each_bundle(tmp_path):
    """Configs are never read from a folder a request could write to: the app serves and trains a copy of each
    bundle whose configs are the installed ones at every start; the copy's model.pt (the trained one) stays."""
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    app = _app(bundles, studies, models=NAME_2D)
    copy = Path(app.bundles[NAME_2D])
    assert copy == bundles / "monailabel_app" / "model" / NAME_2D
    assert Path(app._trainers[NAME_2D].bundle_path) == copy and Path(app._infers[NAME_2D].bundle_path) == copy
    installed = bundles / NAME_2D / "configs"
    assert sorted(p.name for p in (copy / "configs").iterdir()) == sorted(p.name for p in installed.iterdir())
    # the copy's configs/train.yaml is the whole Stage-2 run, as in the repository
    assert app._trainers[NAME_2D].config_files == [str(copy / "configs" / "train.yaml")]
    assert app._trainers[NAME_2D].bundle_config["train#trainer#_target_"] == (
        "spectraflow_monai.apps.stages.stage2_trainer"
    )
    # the copy is changed behind the server's back; the next start restores its configs
    (copy / "configs" / "train.yaml").write_text("imports: ['$print(1)']\n")
    (copy / "configs" / "extra.yaml").write_text("x: 1\n")
    (copy / "configs" / "train_stage1.yaml").write_text("imports: ['$print(2)']\n")
    (copy / "models" / "model.pt").write_bytes((copy / "models" / "model.pt").read_bytes())  # "trained"
    trained = (copy / "models" / "model.pt").stat().st_mtime_ns
    _app(bundles, studies, models=NAME_2D)
    assert (copy / "configs" / "train.yaml").read_bytes() == (installed / "train.yaml").read_bytes()
    assert (copy / "configs" / "train_stage1.yaml").read_bytes() == (installed / "train_stage1.yaml").read_bytes()
    assert not (copy / "configs" / "extra.yaml").exists()
    assert (copy / "models" / "model.pt").stat().st_mtime_ns == trained


@pytest.mark.parametrize("where", ["inside", "holding"])
def test_model_dir_apart_from_the_studies(tmp_path, where):
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    model_dir = studies / "model" if where == "inside" else tmp_path
    with pytest.raises(ValueError, match="--conf model_dir .* and the studies folder .* overlap"):
        _app(bundles, studies, models=NAME_2D, model_dir=str(model_dir))


@pytest.mark.parametrize(
    "value, plain", [("img_a", True), ("case 0001.2", True), ("", False), ("..", False), ("a/../b", False),
                     ("/etc/passwd", False), ("a\\b", False), ("C:x", False), ("x..y", False), (" a", False),
                     ("a\nb", False), ("x" * 256, False), (None, False)],
)  # fmt: skip
def test_plain_ids(value, plain):
    from fastapi import HTTPException

    if plain:
        assert app_main.check_id(value) == value
    else:
        with pytest.raises(HTTPException) as info:
            app_main.check_id(value)
        with pytest.raises(HTTPException) as reference:
            app_main.check_id("a/b")
        assert _status(info) == _status(reference) and _status(info)[0] == 400  # one answer, not naming the value


@pytest.mark.parametrize("tag, ok", [("final", True), ("original", True), ("review_2", True), ("", False),
                                     ("../x", False), ("/abs", False), ("-x", False), ("a.b", False)])  # fmt: skip
def test_label_tags(app, tmp_path, tag, ok):
    from fastapi import HTTPException

    label = tmp_path / "label.png"
    Image.fromarray(np.zeros((70, 90), np.uint8)).save(label)
    store = app.datastore()
    if ok:
        assert store.save_label("img_a", str(label), tag, {}) == "img_a"
        store.remove_label("img_a", tag)
        return
    with pytest.raises(HTTPException) as info:
        store.save_label("img_a", str(label), tag, {})
    assert _status(info)[0] == 400


def test_training_can_be_disabled(served):
    from fastapi import HTTPException

    app = _app(served["bundles"], served["studies"], skip_trainers="true")
    assert app.info()["trainers"] == {}
    with pytest.raises(HTTPException) as info:
        app.train({"model": NAME_2D, "max_epochs": 1})
    status, detail = _status(info)
    assert status == 404 and "training is disabled" in detail


def test_server_side_paths_are_answered_as_unknown_ids(app, served, tmp_path):
    from fastapi import HTTPException

    junk = tmp_path / "junk.png"
    junk.write_bytes(b"\x00" * 64)
    existing = served["studies"] / "img_a.png"
    images = [
        "no_such_image",  # an id that is not in the datastore: the reference answer
        str(existing),  # an absolute path of an image
        str(junk),  # an absolute path of a file that is not an image
        os.path.relpath(existing),  # a path with '../' (relative to the working folder)
        str(tmp_path / "missing.png"),  # a path that does not exist
        "../studies/img_a",
    ]
    assert images[3].startswith("..")
    answers = []
    for image in images:
        with pytest.raises(HTTPException) as info:
            app.infer({"model": NAME_2D, "image": image, "device": "cpu"})
        answers.append(_status(info))
    assert answers == [answers[0]] * len(images)
    assert answers[0][0] == 404 and "no_such_image" not in answers[0][1]


def test_infer_2d_jpeg_input_gives_a_png_label_map(app):
    result = app.infer({"model": NAME_2D, "image": "img_j", "device": "cpu"})
    assert result["file"].endswith(".png")
    with Image.open(result["file"]) as f:
        assert f.format == "PNG"
        label = np.asarray(f)
    assert label.shape == IMAGE_2D_SHAPE and label.dtype == np.uint8
    assert set(np.unique(label).tolist()) == {0, 1}  # the documented values: 0 background, 1 foreground


# ----------------------------------------- model backups: the app removes only the backups the bundle runs made
@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_prune_backups_removes_only_what_runs_made(tmp_path, case):
    """The served copy's models/ pruning (at start and after each training run) is set_aside's own: links named
    like backups (to another run's folder outside models/, to a file), a user's own files and folders named like
    backups, backups replaced since, and ledger entries naming paths outside models/ are left alone and not counted;
    of the backups the runs made, the newest ``kept_model_backups`` stay."""
    served_lib = sys.modules[app_main.served_copy.__module__]
    check_removes_only_what_it_made(tmp_path, case, keep=1, prune=lambda models: served_lib.prune_backups(models, 1))


def test_served_copy_leaves_a_users_folder_named_like_a_backup(tmp_path):
    """A user's folder named like a backup (run files, a subfolder, a link to another run) is not removed, even
    with ``kept_model_backups`` 0; the installed bundle's backups and their ledger are not copied."""
    served_lib = sys.modules[app_main.served_copy.__module__]
    installed, copy = tmp_path / "installed", tmp_path / "model" / NAME_2D
    (installed / "configs").mkdir(parents=True)
    (installed / "configs" / "inference.yaml").write_text("x: 1\n")
    (installed / "models").mkdir()
    (installed / "models" / "model.pt").write_bytes(b"weights")
    set_aside(installed / "models" / "model.pt", "20260101-000000", copy=True)
    other_run = tmp_path / "other_run"
    other_run.mkdir()
    (other_run / "checkpoint_final.pt").write_bytes(b"another run's checkpoint")
    users = copy / "models" / "stage2.bak-20200101-000000"
    (users / "sub").mkdir(parents=True)
    for name in ("checkpoint_epoch=1.pt", "run_record.json", "sub/notes.txt"):
        (users / name).write_text("the user's")
    os.symlink(other_run, users / "elsewhere")
    (copy / "models" / "model.pt.bak-20200101-000000").write_text("the user's")
    served_lib.served_copy(str(installed), str(copy), keep_backups=0)
    assert sorted(os.listdir(copy / "models")) == [served_lib.COPIED_LEDGER, "model.pt", "model.pt.bak-20200101-000000",
                                                   users.name]  # fmt: skip
    assert sorted(str(p.relative_to(users)) for p in users.rglob("*")) == [
        "checkpoint_epoch=1.pt", "elsewhere", "run_record.json", "sub", "sub/notes.txt"]  # fmt: skip
    assert (other_run / "checkpoint_final.pt").read_bytes() == b"another run's checkpoint"
    # the runs in the served copy set model.pt aside: those backups (only) are pruned to kept_model_backups
    made = [set_aside(copy / "models" / "model.pt", f"2026010{i}-000000", copy=True).name for i in range(3)]
    served_lib.served_copy(str(installed), str(copy), keep_backups=1)
    assert sorted(os.listdir(copy / "models")) == sorted(
        [served_lib.COPIED_LEDGER, SET_ASIDE_LEDGER, "model.pt", "model.pt.bak-20200101-000000", users.name,
         made[-1]])  # fmt: skip
    assert (users / "checkpoint_epoch=1.pt").read_text() == "the user's"


# ----------------------------------------- the served pair: kept aside with one stamp, bounded by kept_model_backups
def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}


def _new(tmp_path: Path, i: int) -> tuple[str, str]:
    (tmp_path / "new").mkdir(exist_ok=True)
    (tmp_path / "new" / "model.pt").write_bytes(f"weights {i}".encode())
    (tmp_path / "new" / "model.json").write_bytes(f"record {i}".encode())
    return str(tmp_path / "new" / "model.pt"), str(tmp_path / "new" / "model.json")


def _served_pair(tmp_path: Path) -> tuple[Any, Path, Path]:
    """``lib.served``, and a served copy's ``models/`` holding a pair (``weights 0``, ``record 0``) and its model."""
    models = tmp_path / "copy" / "models"
    models.mkdir(parents=True)
    (models / "model.pt").write_bytes(b"weights 0")
    (models / "model.json").write_bytes(b"record 0")
    return sys.modules[app_main.served_copy.__module__], models, models / "model.pt"


def test_the_replaced_pair_is_kept_with_one_stamp_and_bounded(tmp_path, monkeypatch):
    """replace_served_pair keeps the replaced model.pt and model.json aside with the same stamp (a stamp free for
    both: a user's file already holding it is left alone), recorded and pruned to ``keep`` with the folder's other
    backups; set_aside_served_model renames the pair so."""
    served_lib, models, model = _served_pair(tmp_path)
    (models / "model.json.bak-20260101-000000").write_bytes(b"a user's own record")
    monkeypatch.setattr(served_lib, "time", SimpleNamespace(strftime=lambda *_: "20260101-000000"))
    for i in range(1, 4):
        aside = served_lib.replace_served_pair(*_new(tmp_path, i), str(model), keep=1)
        stamp = aside.stamp
        assert stamp == f"20260101-000000-{i}"  # (within one second: numbered, the later pair sorts last)
        assert aside.kept == (("model.pt", f"model.pt.bak-{stamp}"), ("model.json", f"model.json.bak-{stamp}"))
        assert _files(models) == {
            "model.json": f"record {i}".encode(), f"model.json.bak-{stamp}": f"record {i - 1}".encode(),
            "model.json.bak-20260101-000000": b"a user's own record",
            "model.pt": f"weights {i}".encode(), f"model.pt.bak-{stamp}": f"weights {i - 1}".encode()}  # fmt: skip
    assert served_lib.set_aside_served_model(str(model), keep=1).stamp == "20260101-000000-4"
    assert _files(models) == {"model.json.bak-20260101-000000": b"a user's own record",
                              "model.json.bak-20260101-000000-4": b"record 3",
                              "model.pt.bak-20260101-000000-4": b"weights 3"}  # fmt: skip
    assert served_lib.set_aside_served_model(str(model), keep=1) is None
    assert served_lib.kept_text(None) == ""
    assert served_lib.kept_text(aside) == (
        f"the replaced models/model.pt and models/model.json are kept as models/model.pt.bak-{stamp} and "
        f"models/model.json.bak-{stamp}"
    )


def test_with_no_backup_kept_the_replaced_pair_goes_only_once_the_new_one_is_in_place(tmp_path, monkeypatch):
    """kept_model_backups 0: the replaced pair is pruned after the new pair is in place, and stays when the
    replacement fails; a link at models/model.pt is renamed aside (never followed, recorded or removed)."""
    served_lib, models, model = _served_pair(tmp_path)
    seen, prune = [], served_lib.prune_backups

    def pruning(folder, keep):
        seen.append(_files(models))
        return prune(folder, keep)

    monkeypatch.setattr(served_lib, "prune_backups", pruning)
    aside = served_lib.replace_served_pair(*_new(tmp_path, 1), str(model), keep=0)
    stamp = aside.stamp
    assert aside.kept == () and aside.removed == ("model.pt", "model.json")
    assert served_lib.kept_text(aside) == (
        "the replaced models/model.pt and models/model.json are not kept (--conf kept_model_backups 0)"
    )
    assert seen == [{"model.json": b"record 1", f"model.json.bak-{stamp}": b"record 0", "model.pt": b"weights 1",
                     f"model.pt.bak-{stamp}": b"weights 0"}]  # fmt: skip
    assert _files(models) == {"model.json": b"record 1", "model.pt": b"weights 1"}
    with pytest.raises(OSError):  # the new model is missing: the replacement stops and nothing is pruned
        served_lib.replace_served_pair(str(tmp_path / "missing.pt"), _new(tmp_path, 2)[1], str(model), keep=0)
    kept = {name: data for name, data in _files(models).items() if ".bak-" in name}
    assert sorted(kept.values()) == [b"record 1", b"weights 1"] and len({n.split(".bak-")[1] for n in kept}) == 1
    assert model.read_bytes() == b"weights 1"
    # a link at models/model.pt: renamed aside, its target untouched, never recorded nor removed
    for name in kept:
        os.remove(models / name)
    (tmp_path / "elsewhere.pt").write_bytes(b"someone else's")
    os.remove(model)
    os.symlink(tmp_path / "elsewhere.pt", model)
    aside = served_lib.replace_served_pair(*_new(tmp_path, 3), str(model), keep=0)
    link = models / f"model.pt.bak-{aside.stamp}"
    assert served_lib.kept_text(aside) == (  # the link is never removed, the record's backup is
        f"the replaced models/model.pt is kept as models/{link.name}; the replaced models/model.json is not kept "
        "(--conf kept_model_backups 0)"
    )
    assert link.is_symlink() and model.read_bytes() == b"weights 3" and not model.is_symlink()
    served_lib.replace_served_pair(*_new(tmp_path, 4), str(model), keep=0)
    assert [p.name for p in models.glob("model.*.bak-*")] == [link.name] and link.is_symlink()
    assert (tmp_path / "elsewhere.pt").read_bytes() == b"someone else's"


def _run_without_record(served_lib: Any, tmp_path: Path, model: Path, keep: int) -> Any:
    """A training run that wrote no model.json: its model replaces models/model.pt alone."""
    return served_lib.replace_served_model(_new(tmp_path, 1)[0], str(model), keep)


def _served_without_record(served_lib: Any, tmp_path: Path, model: Path, keep: int) -> Any:
    """An upload (or a run) of a whole pair over a served model whose record is missing."""
    os.remove(model.with_name("model.json"))
    return served_lib.replace_served_pair(*_new(tmp_path, 1), str(model), keep)


def _deleted_without_record(served_lib: Any, tmp_path: Path, model: Path, keep: int) -> Any:
    """DELETE /model of a served model whose record is missing."""
    os.remove(model.with_name("model.json"))
    return served_lib.set_aside_served_model(str(model), keep)


@pytest.mark.parametrize("keep", [1, 0])
@pytest.mark.parametrize(
    "how, what",
    [(_run_without_record, "replaced"), (_served_without_record, "replaced"), (_deleted_without_record, "deleted")],
)
def test_the_log_names_only_the_files_set_aside(tmp_path, caplog, how, what, keep):
    """With no record to keep aside (the run wrote none, or the served copy has none), the line that reports the
    replacement or DELETE names model.pt's backup alone, never a model.json.bak-<time> that does not exist; and
    set_aside's own "starting over" warning is not logged (the app's line says what happened)."""
    served_lib, models, model = _served_pair(tmp_path)
    with caplog.at_level("INFO"):
        aside = how(served_lib, tmp_path, model, keep)
    backup = f"model.pt.bak-{aside.stamp}"
    assert sorted(p.name for p in models.glob("*.bak-*")) == ([backup] if keep else [])
    text = served_lib.kept_text(aside, what)
    if keep:
        assert text == f"the {what} models/model.pt is kept as models/{backup}"
    else:
        assert text == f"the {what} models/model.pt is not kept (--conf kept_model_backups 0)"
    assert "model.json" not in text and "starting over" not in caplog.text


def test_the_file_watcher_outlives_a_removed_label_folder(tmp_path, caplog):
    """``labels`` removed while the server runs: the watcher's refresh fails on the missing folder, logs it,
    and goes on following the studies folder (an exception would end its thread: new images would never appear)."""
    import logging
    import shutil
    import time

    from lib.datastore import CheckedLocalDatastore

    studies = tmp_path / "studies"
    _write_2d_pairs(studies, 2)
    store = CheckedLocalDatastore(str(studies), extensions=("*.png",), auto_reload=True)
    try:
        assert sorted(store.list_images()) == ["s0", "s1"] and store._observer.is_alive()

        def until(done) -> bool:
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline and not done():
                time.sleep(0.1)
            return done()

        with caplog.at_level(logging.WARNING):
            shutil.rmtree(studies / "labels")  # its files' delete events refresh without the folder
            assert until(lambda: "did not follow a change in its studies folder" in caplog.text), caplog.text
        assert store._observer.is_alive()
        (studies / "labels" / "final").mkdir(parents=True)
        shutil.copy(studies / "s0.png", studies / "s2.png")  # the watcher still follows the folder
        assert until(lambda: "s2" in store.list_images()), store.list_images()
    finally:
        store._observer.stop()
        store._observer.join(timeout=10)
