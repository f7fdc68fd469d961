"""The MONAI Label app's routes in process (FastAPI's TestClient on MONAI Label's own application), as careless and
hostile clients use them (docs/monailabel.md, "Serving safely"):

- a refused upload leaves nothing in the temporary folder (counted around each request);
- a model upload (``PUT /model/<name>``) that does not fit the served network is a 422 naming why, the served model
  stays; a fitting one replaces it atomically, the previous one kept one step back; after ``DELETE /model`` an
  inference is a 404;
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
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

import torch  # noqa: E402
from PIL import Image  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (_quiet_app: an autouse fixture used by name)
    NAME_2D,
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
             "MONAI_LABEL_SESSION_PATH")  # fmt: skip
    saved = {k: getattr(settings, k) for k in names}
    settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD = False
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


def _bad_weights(served: Path) -> list[tuple[str, bytes, str]]:
    def saved(obj) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    whole = served.read_bytes()
    return [
        ("random bytes", os.urandom(4096), "not a weights-only PyTorch checkpoint"),
        ("zero bytes", b"", "not a weights-only PyTorch checkpoint"),
        ("half a file", whole[: len(whole) // 2], "not a weights-only PyTorch checkpoint"),
        ("another network", saved(torch.nn.Conv2d(3, 8, 3).state_dict()), "does not fit the served network"),
        ("pickled code", saved({"model": _Payload()}), "not a weights-only PyTorch checkpoint"),
        ("a list", saved([torch.zeros(1)]), "not a state dict"),
    ]


def test_model_upload_is_checked_before_it_replaces_anything(http):
    client, app, _ = http
    served = Path(app.bundles[NAME_2D]) / "models" / "model.pt"
    original = _sha(served)
    for name, data, reason in _bad_weights(served):
        r = client.put(f"/model/{NAME_2D}", files={"file": ("model.pt", data)})
        assert r.status_code == 422 and reason in r.json()["detail"], (name, r.text)
        assert _sha(served) == original, name
    r = client.put(f"/model/{NAME_2D}", files={"file": ("model.txt", served.read_bytes())})
    assert r.status_code == 415, r.text
    # a model that fits replaces the served one; the previous one is kept one step back
    state = _weights(app)
    state["decoder.head.conv.bias"] = state["decoder.head.conv.bias"] + 1.0
    buffer = io.BytesIO()
    torch.save(state, buffer)
    r = client.put(f"/model/{NAME_2D}", files={"file": ("new.pt", buffer.getvalue())})
    assert r.status_code == 200 and r.json()["checksum"], r.text
    assert torch.equal(_weights(app)["decoder.head.conv.bias"], state["decoder.head.conv.bias"])
    assert _sha(served.with_name("model.pt.previous")) == original
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    assert client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form).status_code == 200
    # DELETE sets it aside: inference is a 404 naming why; an upload serves again
    assert client.delete(f"/model/{NAME_2D}").status_code == 200
    r = client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form)
    assert r.status_code == 404 and "was deleted" in r.json()["detail"], r.text
    assert client.delete(f"/model/{NAME_2D}").status_code == 404
    r = client.put(f"/model/{NAME_2D}", files={"file": ("model.pt", buffer.getvalue())})
    assert r.status_code == 200, r.text
    assert client.post(f"/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form).status_code == 200


def test_a_bundle_without_weights_is_served_once_weights_are_uploaded(http, tmp_path):
    served_app = http[1]
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,), weights=False)
    app = _app(bundles, studies, models=NAME_2D)
    assert NAME_2D not in app.info()["models"]
    upload = tmp_path / "upload.pt"
    torch.save(_weights(served_app), upload)
    assert app.replace_model(NAME_2D, str(upload))["checksum"]
    assert NAME_2D in app.info()["models"] and not upload.exists()
    assert app.infer({"model": NAME_2D, "image": "img_a", "device": "cpu"})["file"].endswith(".png")


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
    (tmp_path / "store" / "broken" / "meta.info").write_text("{not json")
    os.utime(tmp_path / "store" / "broken", (time.time() - 120, time.time() - 120))
    with pytest.raises(HTTPException):
        store.add_session(str(tmp_path / "j.png"), -1)
    assert store.remove_expired() == 2
    assert sorted(os.listdir(tmp_path / "store")) == [kept]


# ---------------------------------------------------------------- 5. stopped runs
def test_stopped_runs_leave_no_folder_at_the_next_start_or_run(tmp_path):
    import subprocess

    studies, bundles = _studies_and_bundles(tmp_path)
    runs = bundles / "monailabel_app" / "model" / NAME_2D / "runs"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid: a process that has ended

    def run_folder(pid: int, n: int) -> Path:
        folder = runs / f"20260101-000000-{pid}-{n}"
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "checkpoints" / "checkpoint_epoch=1.pt").write_bytes(b"x" * 1000)
        return folder

    stopped, other_server = run_folder(child.pid, 0), run_folder(os.getppid(), 0)
    app = _app(bundles, studies, models=NAME_2D)  # a restart after a kill
    assert not stopped.exists() and other_server.exists()
    stopped = run_folder(child.pid, 1)  # a run stopped by DELETE /train while the server runs
    task = app._trainers[NAME_2D]
    run_dir = Path(task.new_run({}))
    try:
        assert not stopped.exists() and other_server.exists() and run_dir.is_dir()
        assert Path(task._request_overrides["log_dir"]).parent == runs.parent / "logs"
    finally:
        sys.modules[type(task).__module__]._ACTIVE_RUNS.discard(run_dir.name)


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
