"""The MONAI Label app's routes in process (FastAPI's TestClient on MONAI Label's own application), as careless and
hostile clients use them (docs/monailabel.md, "Serving safely"):

- a refused upload leaves nothing in the temporary folder (counted around each request);
- a model upload (``PUT /model/<name>``) that does not fit the served network is a 422 naming why, the served model
  stays; a fitting one replaces it atomically, the replaced pair kept aside as ``model.pt.bak-<time>`` and
  ``model.json.bak-<time>`` with one stamp, bounded by ``kept_model_backups`` (three uploads with 1 leave one pair,
  a user's look-alike file and link untouched); after ``DELETE /model`` an inference is a 404;
- the datastore's own names, non-image extensions and over-long file names are refused; unknown ids are 404;
- foreseeable refusals are 4xx with their reason, never a bare 500 (inference params, fp16 on a CPU server);
- a session's expiry is capped.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from spectraflow_monai.utils.checkpoint import SET_ASIDE_LEDGER, set_aside  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (_quiet_app: an autouse fixture used by name)
    NAME_2D,
    NET,
    SIZE,
    _Lines,
    _app,
    _make_bundles,
    _quiet_app,
    _studies_and_bundles,
    _write_studies,
    app_main,
)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    """(TestClient, app, root) for one app serving the 2D bundle; requests write temporary files to ``root/tmp``."""
    from fastapi.testclient import TestClient
    from monailabel.config import settings
    from monailabel.interfaces.utils import app as app_utils

    root = tmp_path_factory.mktemp("uploads")
    studies, bundles = _studies_and_bundles(root)
    names = ("MONAI_LABEL_APP_DIR", "MONAI_LABEL_STUDIES", "MONAI_LABEL_DATASTORE_AUTO_RELOAD",
             "MONAI_LABEL_SESSION_PATH", "MONAI_LABEL_AUTO_UPDATE_SCORING")  # fmt: skip
    saved = {k: getattr(settings, k) for k in names}
    settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD = False
    settings.MONAI_LABEL_AUTO_UPDATE_SCORING = False  # no background scoring process after a training here
    settings.MONAI_LABEL_SESSION_PATH = str(root / "sessions")
    app = _app(bundles, studies, models=NAME_2D)
    settings.MONAI_LABEL_APP_DIR, settings.MONAI_LABEL_STUDIES = str(bundles / "monailabel_app"), str(studies)
    app_utils.apps[f"{settings.MONAI_LABEL_APP_DIR}{settings.MONAI_LABEL_STUDIES}"] = app
    app.server_mode(True)  # what the server does at start: the request checks are installed
    from monailabel.app import app as fastapi_app

    (root / "tmp").mkdir()
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = str(root / "tmp")
    try:
        yield TestClient(fastapi_app, raise_server_exceptions=False), app, root
    finally:
        tempfile.tempdir = saved_tempdir
        app_utils.apps.clear()
        for key, value in saved.items():
            setattr(settings, key, value)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_bytes() -> bytes:
    return _png(np.random.default_rng(0).integers(0, 255, (56, 56, 3), dtype=np.uint8))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _temp_files(root: Path) -> list[str]:
    return sorted(os.listdir(root / "tmp"))


# ---------------------------------------------------------------- 1. refused uploads leave nothing behind
_REFUSED = [  # (name, method, route, query, files, expected status)
    ("label for an unknown image", "PUT", "/datastore/label", {"image": "nosuch"},
     {"label": ("l.png", "LABEL")}, 404),
    ("unreadable image", "PUT", "/datastore/image", {"image": "junk"}, {"file": ("junk.png", b"\x00" * 5000)}, 415),
    ("unreadable label", "PUT", "/datastore/label", {"image": "img_a"}, {"label": ("l.png", b"\x00" * 5000)}, 415),
    ("image that is JSON", "PUT", "/datastore/image", {"image": "x"}, {"file": ("x.json", b"{}")}, 415),
    ("unreadable inference upload", "POST", f"/infer/{NAME_2D}", {"output": "image"},
     {"file": ("notes.png", b"\x00" * 5000)}, 415),
    ("inference of an unknown model", "POST", "/infer/nosuch", {}, {"file": ("i.png", "IMAGE")}, 404),
    ("whole-slide inference", "POST", f"/infer/wsi_v2/{NAME_2D}", {}, {"file": ("i.png", "IMAGE")}, 422),
    ("weights for an unknown model", "PUT", "/model/nosuch", {}, {"file": ("m.pt", b"\x00" * 5000)}, 404),
    ("random bytes as weights", "PUT", f"/model/{NAME_2D}", {}, {"file": ("m.pt", os.urandom(5000))}, 422),
    ("session with a negative expiry", "PUT", "/session/", {"expiry": -1}, {"files": ("i.png", "IMAGE")}, 422),
]


@pytest.mark.parametrize("case", _REFUSED, ids=[c[0] for c in _REFUSED])
def test_refused_uploads_leave_no_temporary_file(http, case):
    client, _, root = http
    _, method, route, query, files, status = case
    files = {k: (n, _image_bytes() if d == "IMAGE" else _png(np.zeros((70, 90), np.uint8)) if d == "LABEL" else d)
             for k, (n, d) in files.items()}  # fmt: skip
    before = _temp_files(root)
    r = client.request(method, route, params=query, files=files)
    assert r.status_code == status, r.text
    assert str(root) not in r.text  # the reason, without server paths
    assert _temp_files(root) == before


def test_an_upload_over_the_size_limit_is_refused_before_it_is_copied(http, monkeypatch):
    client, app, root = http
    monkeypatch.setattr(app, "max_upload_bytes", 1000)
    before = _temp_files(root)
    r = client.put("/datastore/image", params={"image": "big"}, files={"file": ("big.png", _image_bytes())})
    assert r.status_code == 413 and "max_upload_mb" in r.json()["detail"], r.text
    assert _temp_files(root) == before and "big" not in app.datastore().list_images()


def test_accepted_uploads_leave_no_temporary_file(http):
    client, app, root = http
    before = _temp_files(root)
    r = client.put("/datastore/image", params={"image": "up_a"}, files={"file": ("a.png", _image_bytes())})
    assert r.status_code == 200 and r.json() == {"image": "up_a"}, r.text
    r = client.put("/datastore/label", params={"image": "up_a"},
                   files={"label": ("a.png", _png(np.ones((56, 56), np.uint8)))})  # fmt: skip
    assert r.status_code == 200, r.text
    form = {"file": ("a.png", _image_bytes()), "params": (None, json.dumps({"device": "cpu"}))}
    r = client.post(f"/infer/{NAME_2D}", params={"output": "image"}, files=form)
    assert r.status_code == 200, r.text
    assert _temp_files(root) == before


# ---------------------------------------------------------------- 2. model uploads
def _weights(app) -> dict:
    return torch.load(Path(app.bundles[NAME_2D]) / "models" / "model.pt", weights_only=True)


class _Payload:
    def __reduce__(self):
        return (os.system, ("true",))


def _bad_weights_of(state: dict) -> list[tuple[str, bytes, str]]:
    def saved(obj) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    whole = saved(state)
    return [
        ("random bytes", os.urandom(4096), "not a weights-only PyTorch checkpoint"),
        ("zero bytes", b"", "not a weights-only PyTorch checkpoint"),
        ("half a file", whole[: len(whole) // 2], "not a weights-only PyTorch checkpoint"),
        ("another network", saved(torch.nn.Conv2d(3, 8, 3).state_dict()), "does not fit the served network"),
        ("pickled code", saved({"model": _Payload()}), "not a weights-only PyTorch checkpoint"),
        ("a list", saved([torch.zeros(1)]), "not a state dict"),
    ]


#: the settings of the served test network (NET, SIZE): what its training would record in model.json
SERVED_SETTINGS = {**NET, **SIZE[NAME_2D]}


def _model_zip(weights: bytes | dict, settings: dict | None = None, edit=None, members=None) -> bytes:
    """A ZIP of ``model.pt`` (bytes, or a state dict saved) and the ``model.json`` training would write beside it
    (the settings, the digests); ``edit`` changes the record after it was written, ``members`` renames / adds."""
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model.pt"
        if isinstance(weights, dict):
            torch.save(weights, model)
        else:
            model.write_bytes(weights)
        write_model_settings(model, ModelSettings.from_dict(settings or SERVED_SETTINGS))
        record = json.loads(model.with_name("model.json").read_text())
        if edit is not None:
            edit(record)
        files = {"model.pt": model.read_bytes(), "model.json": json.dumps(record).encode()}
        if members is not None:
            files = members(files)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        return buffer.getvalue()


def _other_kind(record: dict) -> None:  # a CT model's record, its settings digest made to match
    from spectraflow_monai.utils.run_record import settings_digest

    record["model"]["hu_window"] = [-125, 275]
    record["settings_sha256"] = settings_digest(record["model"])


def _pair_cases(state: dict) -> list[tuple[str, bytes, str, int]]:
    """Model archives that must not be served: (what, ZIP, reason in the answer, status)."""
    other = {k: v + 1.0 if v.is_floating_point() else v for k, v in state.items()}
    saved = io.BytesIO()
    torch.save(other, saved)

    def foreign(files):  # the record of other weights beside these
        return {**files, "model.pt": _bytes(state)}

    return [
        ("the record of other weights", _model_zip(saved.getvalue(), members=foreign), "written for another", 422),
        ("an edited record", _model_zip(state, edit=lambda r: r["model"].update(image_mean=[0.5, 0.5, 0.5])),
         "edited after it was written", 422),
        ("a record without digests",
         _model_zip(state, edit=lambda r: (r.pop("model_sha256"), r.pop("settings_sha256"))), "holds no model_sha256",
         422),
        ("a Synapse record", _model_zip(state, edit=_other_kind), "describes a model of CT volumes", 422),
        ("weights without their record", _model_zip(state, members=lambda f: {"model.pt": f["model.pt"]}),
         "must hold exactly", 422),
        ("a path in the archive", _model_zip(state, members=lambda f: {"../model.pt": f["model.pt"],
                                                                       "model.json": f["model.json"]}),
         "must hold exactly", 422),
        ("an extra file", _model_zip(state, members=lambda f: {**f, "sitecustomize.py": b"x"}), "must hold exactly",
         422),
        ("not a ZIP", os.urandom(2048), "cannot be read as a ZIP", 422),
    ] + [(f"{what} as model.pt", _model_zip(data), reason, 422) for what, data, reason in _bad_weights_of(state)]


def _bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _backups(models: Path) -> set[str]:
    """The names of the backups of the served pair in ``models``."""
    return {p.name for p in models.glob("model.*.bak-*")}


def _new_pair(models: Path, before: set[str], record: bool = True) -> str:
    """The stamp of the one pair kept aside since ``before`` (:func:`_backups`): model.pt and model.json (unless the
    replaced model had no ``record``) with one stamp."""
    new = sorted(_backups(models) - before)
    stamps = {name.split(".bak-", 1)[1] for name in new}
    names = ["model.json", "model.pt"] if record else ["model.pt"]
    assert len(stamps) == 1 and new == [f"{name}.bak-{s}" for name in names for s in stamps], new
    return stamps.pop()


def test_model_upload_is_checked_before_it_replaces_anything(http):
    client, app, _ = http
    served = Path(app.bundles[NAME_2D]) / "models" / "model.pt"
    original = _sha(served)
    state = _weights(app)
    for name, data, reason, status in _pair_cases(state):
        r = client.put(f"/model/{NAME_2D}", files={"file": ("model.zip", data)})
        assert r.status_code == status and reason in r.json()["detail"], (name, r.text)
        assert _sha(served) == original, name
    for name in ("model.pt", "model.pth"):  # weights alone: refused, naming the record they need
        r = client.put(f"/model/{NAME_2D}", files={"file": (name, served.read_bytes())})
        assert r.status_code == 422 and "model.json" in r.json()["detail"], r.text
    r = client.put(f"/model/{NAME_2D}", files={"file": ("model.txt", served.read_bytes())})
    assert r.status_code == 415, r.text
    # a model that fits replaces the served one with its record; the replaced pair is kept aside with one stamp
    state["decoder.head.conv.bias"] = state["decoder.head.conv.bias"] + 1.0
    before = _backups(served.parent)
    assert not served.with_name("model.json").exists()  # (the bundle's initial model has no record)
    r = client.put(f"/model/{NAME_2D}", files={"file": ("new.zip", _model_zip(state))})
    assert r.status_code == 200 and r.json()["checksum"], r.text
    assert r.json()["model_sha256"] == _sha(served)
    assert json.loads(served.with_name("model.json").read_text())["model_sha256"] == _sha(served)
    assert torch.equal(_weights(app)["decoder.head.conv.bias"], state["decoder.head.conv.bias"])
    stamp = _new_pair(served.parent, before, record=False)
    assert _sha(served.with_name(f"model.pt.bak-{stamp}")) == original
    buffer = io.BytesIO(_model_zip(state))
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    assert client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form).status_code == 200
    # DELETE sets it aside (renamed, one stamp): inference is a 404 naming why; an upload serves again
    pair, before = (_sha(served), _sha(served.with_name("model.json"))), _backups(served.parent)
    assert client.delete(f"/model/{NAME_2D}").status_code == 200
    stamp = _new_pair(served.parent, before)
    assert (_sha(served.with_name(f"model.pt.bak-{stamp}")), _sha(served.with_name(f"model.json.bak-{stamp}"))) == pair
    assert not served.exists() and not served.with_name("model.json").exists()
    r = client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form)
    assert r.status_code == 404 and "was deleted" in r.json()["detail"], r.text
    assert client.delete(f"/model/{NAME_2D}").status_code == 404
    r = client.put(f"/model/{NAME_2D}", files={"file": ("model.zip", buffer.getvalue())})
    assert r.status_code == 200, r.text
    assert client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form).status_code == 200


def test_a_bundle_without_weights_is_served_once_weights_are_uploaded(http, tmp_path):
    served_app = http[1]
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,), weights=False)
    app = _app(bundles, studies, models=NAME_2D)
    assert NAME_2D not in app.info()["models"]
    upload = tmp_path / "upload.zip"
    upload.write_bytes(_model_zip(_weights(served_app)))
    assert app.replace_model(NAME_2D, str(upload))["checksum"]
    assert NAME_2D in app.info()["models"]
    assert app.infer({"model": NAME_2D, "image": "img_a", "device": "cpu"})["file"].endswith(".png")


def test_replaced_pairs_are_bounded_by_kept_model_backups(http, tmp_path):
    """Three uploads with kept_model_backups 1 leave one pair, the last one replaced (one stamp on both files); a
    user's file and a link named like backups are neither removed nor counted; DELETE keeps the deleted pair in its
    place. With 0 nothing is kept: the start removes the recorded pair, an upload keeps none."""
    served_app = http[1]
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    models = bundles / "monailabel_app" / "model" / NAME_2D / "models"
    models.mkdir(parents=True)
    (tmp_path / "elsewhere.pt").write_bytes(b"someone else's")
    os.symlink(tmp_path / "elsewhere.pt", models / "model.pt.bak-20200101-000000")
    (models / "model.json.bak-20200101-000000").write_bytes(b"a user's own file")
    look_alikes = {"model.pt.bak-20200101-000000", "model.json.bak-20200101-000000"}
    app = _app(bundles, studies, models=NAME_2D, kept_model_backups="1")
    state, upload = _weights(served_app), tmp_path / "upload.zip"
    upload.write_bytes(_model_zip(state))
    app.replace_model(NAME_2D, str(upload))  # (the bundle's initial model has no record: the first pair)
    for i in range(3):
        pair = _sha(models / "model.pt"), _sha(models / "model.json")
        state["decoder.head.conv.bias"] = state["decoder.head.conv.bias"] + 1.0
        upload.write_bytes(_model_zip(state))
        app.replace_model(NAME_2D, str(upload))
        stamp = _new_pair(models, look_alikes)
        assert (_sha(models / f"model.pt.bak-{stamp}"), _sha(models / f"model.json.bak-{stamp}")) == pair, i
    assert torch.equal(torch.load(models / "model.pt", weights_only=True)["decoder.head.conv.bias"],
                       state["decoder.head.conv.bias"])  # fmt: skip
    pair = _sha(models / "model.pt"), _sha(models / "model.json")
    app.delete_model(NAME_2D)
    stamp = _new_pair(models, look_alikes)
    assert (_sha(models / f"model.pt.bak-{stamp}"), _sha(models / f"model.json.bak-{stamp}")) == pair
    assert (models / "model.pt.bak-20200101-000000").is_symlink()
    assert (tmp_path / "elsewhere.pt").read_bytes() == b"someone else's"
    assert (models / "model.json.bak-20200101-000000").read_bytes() == b"a user's own file"
    app = _app(bundles, studies, models=NAME_2D, kept_model_backups="0")
    assert _backups(models) == look_alikes
    app.replace_model(NAME_2D, str(upload))
    assert _backups(models) == look_alikes and _sha(models / "model.pt") == pair[0]
    app.replace_model(NAME_2D, str(upload))
    assert _backups(models) == look_alikes and (tmp_path / "elsewhere.pt").read_bytes() == b"someone else's"


# ---------------------------------------------------------------- 3. the datastore's own names, extensions, lengths
@pytest.mark.parametrize(
    "query, filename, status",
    [({"image": "datastore_v2"}, "x.png", 400), ({"image": "datastore_v2"}, "x.json", 415),
     ({"image": ".lock"}, "a.png", 400), ({}, ".lock", 415), ({"image": "labels"}, "a.png", 400),
     ({"image": "labels"}, "x", 415), ({"image": ".hidden"}, "a.png", 400), ({"image": "x" * 255}, "a.png", 400),
     ({"image": "é" * 200}, "a.png", 400)],
)  # fmt: skip
def test_uploads_cannot_take_the_datastores_own_names(http, query, filename, status):
    client, app, root = http
    studies = root / "studies"
    listing, index = sorted(os.listdir(studies)), (studies / "datastore_v2.json").read_bytes()
    r = client.put("/datastore/image", params=query, files={"file": (filename, _image_bytes())})
    assert r.status_code == status, r.text
    assert sorted(os.listdir(studies)) == listing and (studies / "datastore_v2.json").read_bytes() == index


@pytest.mark.parametrize("filename", ["x.json", "x.yaml", "x", "x.jpg"])
def test_labels_are_lossless_image_files(http, filename):
    client, _, root = http
    r = client.put("/datastore/label", params={"image": "img_a"},
                   files={"label": (filename, _png(np.zeros((70, 90), np.uint8)))})  # fmt: skip
    assert r.status_code == 415, r.text
    assert not (root / "studies" / "labels" / "final" / f"img_a{Path(filename).suffix}").exists()


# ---------------------------------------------------------------- 4. unknown ids, reasons instead of 500s
@pytest.mark.parametrize(
    "method, route, query",
    [("GET", "/datastore/image/info", {"image": "nosuch"}),
     ("GET", "/datastore/label/info", {"label": "nosuch", "tag": "final"}),
     ("DELETE", "/datastore/label", {"id": "nosuch", "tag": "final"}),
     ("GET", "/datastore/label/info", {"label": "img_a", "tag": "final"}),
     ("DELETE", "/datastore/label", {"id": "img_a", "tag": "final"}), ("GET", "/datastore/image", {"image": "nosuch"}),
     ("DELETE", "/datastore/image", {"id": "nosuch"}), ("DELETE", "/model/nosuch", {}), ("GET", "/session/nosuch", {})],
)  # fmt: skip
def test_unknown_ids_are_404(http, method, route, query):
    client, _, _ = http
    assert client.request(method, route, params=query).status_code == 404


@pytest.mark.parametrize(
    "params, named",
    [('{"device": "$__import__(\'os\').getcwd()"}', "device"), ('{"result_dtype": "$1"}', "result_dtype"),
     ('{"result_dtype": "complex128"}', "result_dtype"), ('{"logging": 5}', "logging"), ("not json", "params"),
     ("[1, 2]", "params"), ('{"skip_writer": true}', "skip_writer"), ('{"extra": {"_target_": "os.system"}}', "extra")],
)  # fmt: skip
def test_inference_params_are_checked(http, params, named):
    client, _, _ = http
    r = client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files={"params": (None, params)})
    assert r.status_code == 422 and named in r.json()["detail"], r.text


def test_inference_outputs_and_inputs_the_models_cannot_give_or_take(http):
    client, _, _ = http
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    r = client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "dicom_seg"}, files=form)
    assert r.status_code == 422 and "DICOMweb" in r.json()["detail"], r.text
    r = client.post(f"/infer/{NAME_2D}", params={"image": "img_a"}, files={**form, "label": ("l.png", b"x")})
    assert r.status_code == 422 and "no label upload" in r.json()["detail"], r.text
    r = client.post(f"/infer/{NAME_2D}", params={"output": "json"}, files=form)
    assert r.status_code == 400 and "no image" in r.json()["detail"], r.text


def test_fp16_training_on_a_cpu_is_refused_with_its_reason(http):
    client, _, _ = http
    for body in ({"precision": "fp16", "device": "cpu"}, {"precision": ["fp16", "auto"], "device": "cpu"}):
        r = client.post(f"/train/{NAME_2D}", params={"run_sync": "true"}, json={"max_epochs": 1, **body})
        assert r.status_code == 422 and "'fp16' needs a CUDA device" in r.json()["detail"], r.text


# ---------------------------------------------------------------- 8. sessions
def test_session_expiry_is_capped(http):
    client, app, _ = http
    r = client.put("/session/", params={"expiry": 999999999999}, files={"files": ("i.png", _image_bytes())})
    assert r.status_code == 200, r.text
    assert r.json()["session_info"]["expiry"] <= app.sessions().expiry
    assert client.delete(f"/session/{r.json()['session_id']}").status_code == 200


def test_sessions_end_whatever_their_record_says(tmp_path):
    """A session in use (its last access refreshed) or recorded without an expiry ends at the latest
    MAX_SESSION_LIFETIME after its creation; a broken session folder is removed instead of stopping the clean-up."""
    import time

    from fastapi import HTTPException

    sessions = sys.modules[app_main.CappedSessions.__module__]
    store = app_main.CappedSessions(str(tmp_path / "store"), 3600)
    (tmp_path / "i.png").write_bytes(_image_bytes())
    old, _ = store.add_session(str(tmp_path / "i.png"), 999999999999)
    info = store.get_session(old)
    assert info.expiry == 3600
    info.create_ts = int(time.time()) - sessions.MAX_SESSION_LIFETIME - 10  # created long ago, used just now
    info.expiry = 0  # a record without expiry
    store._write_meta_info(old, info)
    (tmp_path / "j.png").write_bytes(_image_bytes())
    kept, _ = store.add_session(str(tmp_path / "j.png"))
    (tmp_path / "store" / "broken").mkdir()
    (tmp_path / "store" / "broken" / sessions.SESSION_MARKER).write_text("")  # a session folder of the app
    (tmp_path / "store" / "broken" / "meta.info").write_text("{not json")
    os.utime(tmp_path / "store" / "broken", (time.time() - 120, time.time() - 120))
    with pytest.raises(HTTPException):
        store.add_session(str(tmp_path / "j.png"), -1)
    assert store.remove_expired() == 2
    assert sorted(os.listdir(tmp_path / "store")) == [kept]


# ---------------------------------------------------------------- 5. stopped runs
def _run_folder(runs: Path, pid: int, n: int, owner: dict | None = None) -> Path:
    """A run folder as a training run writes it (its owner record, a checkpoint), for process ``pid``."""
    folder = runs / f"20260101-000000-{pid}-{n}"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint_epoch=1.pt").write_bytes(b"x" * 1000)
    if owner is not None:
        (folder / "owner.json").write_text(json.dumps(owner))
    return folder


def test_stopped_runs_leave_no_folder_at_the_next_start_or_run(tmp_path):
    import subprocess

    studies, bundles = _studies_and_bundles(tmp_path)
    runs = bundles / "monailabel_app" / "model" / NAME_2D / "runs"
    runs_lib = sys.modules["lib.runs"]  # (main.py imports its lib/ as "lib")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid: a process that has ended

    def run_folder(pid: int, n: int) -> Path:
        return _run_folder(runs, pid, n, runs_lib.run_owner(pid))

    stopped, other_server = run_folder(child.pid, 0), run_folder(os.getppid(), 0)
    app = _app(bundles, studies, models=NAME_2D)  # a restart after a kill
    assert not stopped.exists() and other_server.exists()
    stopped = run_folder(child.pid, 1)  # a run stopped by DELETE /train while the server runs
    task = app._trainers[NAME_2D]
    run_dir = Path(task.new_run({}))
    try:
        assert not stopped.exists() and other_server.exists() and run_dir.is_dir()
        assert Path(task._request_overrides["log_dir"]).parent == runs.parent / "logs"
        assert json.loads((run_dir / "owner.json").read_text()) == runs_lib.run_owner()
    finally:
        runs_lib.end_run(str(run_dir))
    assert not run_dir.exists()


# ---------------------------------------------------------------- 7. labels that are all background
def test_training_on_labels_that_are_all_background_is_refused(tmp_path):
    from fastapi import HTTPException

    studies, bundles = _studies_and_bundles(tmp_path)
    (studies / "labels" / "final").mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.zeros((56, 56, 3), np.uint8)).save(studies / f"e{i}.png")
        Image.fromarray(np.zeros((56, 56), np.uint8)).save(studies / "labels" / "final" / f"e{i}.png")
    request = {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False}
    unlabelled = _app(*_studies_and_bundles(tmp_path / "unlabelled")[::-1], models=NAME_2D)
    with pytest.raises(HTTPException) as info:
        unlabelled.train(dict(request))
    assert info.value.status_code == 422 and "no image has a label yet" in str(info.value.detail)
    app = _app(bundles, studies, models=NAME_2D)
    with pytest.raises(HTTPException) as info:
        app.train(dict(request))
    detail = str(info.value.detail)
    assert info.value.status_code == 422 and "background only" in detail and "allow_empty_masks" in detail
    assert str(studies) not in detail
    allowed = _app(bundles, studies, models=NAME_2D, allow_empty_masks="true")
    assert allowed.check_train_request(dict(request))["max_epochs"] == 1


# ---------------------------------------------------------------- 9. issue 36: what the session path holds
def test_session_clean_up_removes_only_the_apps_sessions(http, caplog):
    """The session path may hold other folders (the studies, a user's files): none is read, removed or served."""
    import logging
    import time

    client, app, root = http
    store = Path(app.sessions().store_path)
    foreign = {"user_home": "notes.txt", "studies_copy": "img.png"}
    for name, file in foreign.items():
        (store / name).mkdir(parents=True, exist_ok=True)
        (store / name / file).write_bytes(b"kept")
        os.utime(store / name, (time.time() - 3600, time.time() - 3600))
    (store / "user_home" / "meta.info").write_text("{not json")  # even one that looks like a broken session
    r = client.put("/session/", files={"files": ("i.png", _image_bytes())})
    assert r.status_code == 200, r.text
    session = r.json()["session_id"]
    info = app.sessions().get_session(session)
    info.last_access_ts = info.create_ts = int(time.time()) - 10 * app.sessions().expiry  # expired
    app.sessions()._write_meta_info(session, info)
    with caplog.at_level(logging.INFO):
        assert app.sessions().remove_expired() == 1
    assert not (store / session).exists() and f"session {session}: expired, removed" in caplog.text
    assert client.get("/session/user_home").status_code == 404
    assert client.delete("/session/studies_copy").status_code == 404
    for name, file in foreign.items():
        assert (store / name / file).read_bytes() == b"kept", name
    assert sorted(os.listdir(store)) == sorted(foreign)


# ---------------------------------------------------------------- 10. issue 36: the dataset ZIP, records, label sizes
def _labelled_upload(client, image_id: str, seed: int = 0) -> None:
    from spectraflow_monai.apps.seg2d.synthetic import synthesize_pair

    image, mask = synthesize_pair(np.random.default_rng(seed), 56)
    r = client.put("/datastore/image", params={"image": image_id}, files={"file": (f"{image_id}.png", _png(image))})
    assert r.status_code == 200, r.text
    r = client.put("/datastore/label", params={"image": image_id},
                   files={"label": (f"{image_id}.png", _png((mask > 0).astype(np.uint8)))})  # fmt: skip
    assert r.status_code == 200, r.text


def test_dataset_download_leaves_no_archive(http):
    import zipfile

    client, _, root = http
    _labelled_upload(client, "zip_a")
    before = _temp_files(root)
    r = client.get("/datastore/dataset")
    assert r.status_code == 200, r.text
    assert any(n.endswith("zip_a.png") for n in zipfile.ZipFile(io.BytesIO(r.content)).namelist())
    assert _temp_files(root) == before


@pytest.mark.parametrize(
    "route, query, field, text",
    [("/datastore/image/info", {"image": "img_a"}, "info", '{"score": NaN}'),
     ("/datastore/image/info", {"image": "img_a"}, "info", '{"score": 1e999}'),
     ("/datastore/image/info", {"image": "img_a"}, "info", "not json"),
     ("/datastore/label/info", {"label": "zip_a", "tag": "final"}, "info", '{"score": -Infinity}'),
     ("/datastore/updatelabelinfo", {"label": "zip_a", "tag": "final"}, "params", "{not json"),
     ("/datastore/image/info", {"image": "img_a"}, "info", '{"a": ' * 1000 + "1" + "}" * 1000)],
)  # fmt: skip
def test_records_hold_finite_json_only(http, route, query, field, text):
    client, _, root = http
    _labelled_upload(client, "zip_a")
    index = (root / "studies" / "datastore_v2.json").read_bytes()
    r = client.put(route, params=query, files={field: (None, text)})
    assert r.status_code == 422 and field.replace("params", "info") in r.json()["detail"], r.text
    assert (root / "studies" / "datastore_v2.json").read_bytes() == index
    assert client.get("/datastore/", params={"output": "all"}).status_code == 200


@pytest.mark.parametrize(
    "params", ['{"score": NaN}', '{"score": Infinity}', '{"score": 1e999}', "[" * 1000 + "]" * 1000,
               '{"a": ' * 1000 + "1" + "}" * 1000, '{"a": ' * 40 + "1" + "}" * 40],
)  # fmt: skip
def test_upload_params_hold_finite_shallow_json_only(http, params):
    client, app, root = http
    before = _temp_files(root)
    r = client.put("/datastore/image", params={"image": "rec_a"},
                   files={"file": ("a.png", _image_bytes()), "params": (None, params)})  # fmt: skip
    assert r.status_code == 422 and "params" in r.json()["detail"], r.text
    label = _png(np.zeros((70, 90), np.uint8))
    r = client.put("/datastore/label", params={"image": "img_a"},
                   files={"label": ("l.png", label), "params": (None, params)})  # fmt: skip
    assert r.status_code == 422 and "params" in r.json()["detail"], r.text
    r = client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files={"params": (None, params)})
    assert r.status_code == 422 and "params" in r.json()["detail"], r.text
    assert "rec_a" not in app.datastore().list_images() and _temp_files(root) == before
    assert client.get("/datastore/", params={"output": "all"}).status_code == 200


def test_records_saved_with_nan_before_are_answered(http):
    from monailabel.datastore.local import LocalDatastore

    client, app, _ = http
    LocalDatastore.update_image_info(app.datastore(), "img_a", {"old_score": float("nan")})  # as earlier versions did
    try:
        r = client.get("/datastore/", params={"output": "all"})
        assert r.status_code == 200 and r.json()["objects"]["img_a"]["image"]["info"]["old_score"] is None, r.text
        r = client.get("/datastore/image/info", params={"image": "img_a"})
        assert r.status_code == 200 and r.json()["old_score"] is None, r.text
    finally:
        LocalDatastore.update_image_info(app.datastore(), "img_a", {"old_score": None})


def test_a_label_has_its_images_size(http, tmp_path):
    import nibabel as nib

    client, _, root = http
    label = root / "studies" / "labels" / "final" / "img_a.png"
    before = label.read_bytes() if label.exists() else None
    nib.save(nib.Nifti1Image(np.zeros((90, 70, 4), np.uint8), np.eye(4)), str(tmp_path / "l.nii.gz"))
    for name, data, shapes in [
        ("l.png", _png(np.zeros((56, 56), np.uint8)), "[56, 56] differs from the size [90, 70]"),
        ("l.png", _png(np.zeros((90, 70), np.uint8)), "[70, 90] differs from the size [90, 70]"),
        ("l.nii.gz", (tmp_path / "l.nii.gz").read_bytes(), "[90, 70, 4] differs from the size [90, 70]"),
    ]:
        r = client.put("/datastore/label", params={"image": "img_a"}, files={"label": (name, data)})
        assert r.status_code == 422 and shapes in r.json()["detail"], (name, r.text)
        assert (label.read_bytes() if label.exists() else None) == before
    r = client.put("/datastore/label", params={"image": "img_a"},
                   files={"label": ("l.png", _png(np.zeros((70, 90), np.uint8)))})  # fmt: skip
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- 11. issue 36: model uploads that cannot serve
def _tampered(state: dict, how: str) -> dict:
    state = {k: v.clone() for k, v in state.items()}
    key = "decoder.head.conv.weight"
    if how == "sparse":
        state[key] = state[key].to_sparse()
    elif how == "meta":
        state[key] = torch.empty(state[key].shape, device="meta")
    elif how == "quantized":
        state[key] = torch.quantize_per_tensor(state[key], 0.1, 0, torch.qint8)
    elif how == "nan":
        state[key][0] = float("nan")
    elif how == "infinite":
        state[key][0] = float("inf")
    elif how == "bool":
        state[key] = state[key] > 0
    elif how == "all zero":
        state = {k: torch.zeros_like(v) for k, v in state.items()}
    return state


@pytest.mark.parametrize(
    "how, reason",
    [("sparse", "sparse, meta or quantized"), ("meta", "sparse, meta or quantized"),
     ("quantized", "sparse, meta or quantized"), ("nan", "NaN or infinite"), ("infinite", "NaN or infinite"),
     ("bool", "another number type"), ("all zero", "every weight is zero")],
)  # fmt: skip
def test_model_uploads_that_cannot_serve_are_refused(http, how, reason):
    client, app, _ = http
    served = Path(app.bundles[NAME_2D]) / "models" / "model.pt"
    original = _sha(served)
    r = client.put(f"/model/{NAME_2D}", files={"file": ("model.zip", _model_zip(_tampered(_weights(app), how)))})
    assert r.status_code == 422 and reason in r.json()["detail"], r.text
    assert _sha(served) == original
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    assert client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form).status_code == 200


# ---------------------------------------------------------------- 12. issue 36: no bare 500, no 200 for unknown names
@pytest.mark.parametrize(
    "route, named",
    [("/activelearning/nosuch", "strategy"), ("/scoring/nosuch", "scoring method"),
     ("/batch/infer/nosuch", "is not loaded")],
)  # fmt: skip
def test_unknown_task_names_are_404(http, route, named):
    client, _, _ = http
    r = client.post(route)
    assert r.status_code == 404 and named in r.json()["detail"], r.text


def test_batch_inference_runs_on_a_cpu_server(http, monkeypatch):
    client, app, _ = http
    _labelled_upload(client, "zip_a")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (as on a server without a GPU)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    r = client.post(f"/batch/infer/{NAME_2D}", params={"run_sync": "true", "images": "labeled"})
    assert r.status_code == 200 and "zip_a" in r.json(), r.text
    assert app.datastore().get_label_by_image_id("zip_a", "original")


def test_training_answers_show_no_server_folder(http, monkeypatch):
    """POST /train (queued) and DELETE /train answer MONAI Label's task record, without the bundle folder."""
    from monailabel.utils.async_tasks import task as task_module

    client, app, root = http
    _labelled_upload(client, "zip_a")
    _labelled_upload(client, "zip_b", seed=1)
    queued = []

    def queue(request, method, callback=None, debug=False):  # what MONAI Label records, without its subprocess
        queued.append({"id": "t1", "status": "SUBMITTED", "request": request})
        return queued[-1]

    monkeypatch.setattr(task_module, "run_background_task", queue)
    monkeypatch.setattr(task_module, "stop_background_task", lambda method: dict(queued[-1], status="STOPPED"))
    r = client.post(f"/train/{NAME_2D}", json={"max_epochs": 1, "val_split": 0.5})
    assert r.status_code == 200 and r.json()["status"] == "SUBMITTED", r.text
    assert queued[-1]["request"]["bundle_path"] == app.bundles[NAME_2D]  # what MONAI Label queues
    r2 = client.delete("/train/")
    for answer in (r, r2):
        assert answer.status_code == 200 and str(root) not in answer.text and "bundle_path" not in answer.text


# ---------------------------------------------------------------- 13. issue 36: runs, batch sizes and model backups
def test_a_run_of_another_pid_namespace_is_kept_while_its_heartbeat_lasts(tmp_path):
    import socket
    import time

    studies, bundles = _studies_and_bundles(tmp_path)
    runs = bundles / "monailabel_app" / "model" / NAME_2D / "runs"
    runs_lib = sys.modules["lib.runs"]  # (main.py imports its lib/ as "lib")
    # a server in a container: its PID means nothing here (no process 999999 here)
    elsewhere = {"host": socket.gethostname(), "pid_namespace": "pid:[1]", "pid": 999999}
    running = _run_folder(runs, 999999, 0, elsewhere)
    (running / "alive").write_text("")
    stopped = _run_folder(runs, 999999, 1, {**elsewhere, "host": "another-host"})
    (stopped / "alive").write_text("")
    old = time.time() - 24 * 3600  # a heartbeat a day old
    os.utime(stopped / "alive", (old, old))
    app = _app(bundles, studies, models=NAME_2D)
    assert running.is_dir() and not stopped.exists()
    assert runs_lib.RUN_STALE_AFTER < 24 * 3600
    run_dir = app._trainers[NAME_2D].new_run({})
    runs_lib.end_run(run_dir)
    assert running.is_dir()
    os.utime(running / "alive", (old, old))
    app._trainers[NAME_2D].new_run({})  # (the heartbeat of a run that has stopped: removed before the next run)
    assert not running.exists()
    for name in runs_lib.active_runs():
        runs_lib.end_run(str(runs / name))


def test_model_backups_are_bounded(tmp_path):
    """The backups the bundle runs made in the served copy (recorded by set_aside) are pruned to kept_model_backups
    per file; files only named like backups stay; the installed bundle's backups are not copied."""
    studies, bundles = _studies_and_bundles(tmp_path)
    installed = bundles / NAME_2D / "models"
    (installed / "model.pt.bak-20260101-000000").write_bytes(b"installed")
    copy = bundles / "monailabel_app" / "model" / NAME_2D / "models"
    copy.mkdir(parents=True)
    for name, stamps in [("model.pt", ["20260101-000000", "20260102-000000", "20260102-000000"]),
                         ("model.json", ["20260101-000000"])]:  # fmt: skip
        (copy / name).write_bytes(b"x")
        for stamp in stamps:  # (the second of a stamp is named ...-1)
            set_aside(copy / name, stamp, copy=True)
        os.remove(copy / name)
    for name in ["model.pt.bak-20250101-000000", "model.pt.bak-notes"]:  # a user's: not made by a run
        (copy / name).write_bytes(b"x")
    _app(bundles, studies, models=NAME_2D, kept_model_backups="1")
    assert sorted(os.listdir(copy)) == [".spectraflow-copied.json", SET_ASIDE_LEDGER, "model.json.bak-20260101-000000",
                                        "model.pt",
                                        "model.pt.bak-20250101-000000", "model.pt.bak-20260102-000000-1",
                                        "model.pt.bak-notes"]  # fmt: skip
    with pytest.raises(ValueError, match="kept_model_backups must be an integer >= 0, got 'two'"):
        _app(bundles, studies, models=NAME_2D, kept_model_backups="two")


def test_training_with_fewer_pairs_than_the_batch_size(http, monkeypatch):
    """The default batch size (8) with fewer training pairs once trained on no batch and answered a bare 500; the
    batch is now as large as the pairs there are (logged). A split that leaves no validation pair or fewer than two
    training pairs is a 422 naming it. The run's end keeps the replaced pair aside and prunes the model backups (two
    kept by default)."""
    import logging

    client, app, _ = http
    task = app._trainers[NAME_2D]
    settings = {"num_workers": 0, "progress_bar": False, "encoder_init": "pretrained", "pretrained_weights": "none"}
    for key, value in settings.items():  # (the batch size stays the bundle's 8)
        monkeypatch.setitem(task.overrides, key, value)
    for i in range(3):
        _labelled_upload(client, f"few_{i}", seed=10 + i)
    pairs = len(app.datastore().datalist())
    models = Path(app.bundles[NAME_2D]) / "models"
    for stamp in ("20260101-000000", "20260102-000000", "20260103-000000"):  # backups of earlier runs
        set_aside(models / "model.pt", stamp, copy=True)
    served = _sha(models / "model.pt")
    assert 3 <= pairs - 1 < 8
    val_split = 1.0 / pairs  # one validation pair, the others (fewer than the batch size 8) train
    lines, log = _Lines(), logging.getLogger("spectraflow_monai.apps.workflow")
    log.addHandler(lines)
    try:
        body = {"max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": val_split}
        r = client.post(f"/train/{NAME_2D}", params={"run_sync": "true"}, json=body)
    finally:
        log.removeHandler(lines)
    assert r.status_code == 200, r.text
    assert any(f"batch_size 8 is larger than the {pairs - 1} training samples" in line for line in lines.lines)
    assert _sha(models / "model.pt") != served  # the run trained and its best model serves
    kept = {p.name for p in models.glob("model.pt.bak-*")}  # the newest two: the last earlier one, the replaced pair
    assert len(kept) == 2 and "model.pt.bak-20260103-000000" in kept, kept
    (replaced,) = kept - {"model.pt.bak-20260103-000000"}
    assert _sha(models / replaced) == served and (models / replaced.replace("model.pt", "model.json")).is_file()
    for body, named in [({"val_split": 0.0}, "no validation pair"), ({"val_split": 0.99}, "training pair(s)")]:
        r = client.post(f"/train/{NAME_2D}", params={"run_sync": "true"}, json={"max_epochs": 1, **body})
        assert r.status_code == 422 and named in r.json()["detail"], r.text
