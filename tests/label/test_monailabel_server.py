"""The MONAI Label app over HTTP, driven as its users drive it (docs/monailabel.md, "Serving safely").

One server (``monailabel start_server`` on 127.0.0.1, the 2D bundle with a tiny network) serves the whole module:

- an annotator's round trip with MONAI Label's own Python client (``monailabel.client.MONAILabelClient``): upload
  images, save labels, start a queued training (``run_sync=false``, MONAI Label's default, run in its task
  subprocess), poll it to ``DONE``, save new labels, train again, check that a new model is served, infer;
- the attacks of a stranger who can reach the port: a label ``tag`` or an image id that leaves the studies folder
  (once a way to overwrite the bundle's ``configs/train.yaml`` and run code at the next training), other datastore
  routes with path ids, an inference ``model_filename`` naming a server file, and answers that show server paths.

Every test waits with a deadline and every request has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")
requests = pytest.importorskip("requests")

from monailabel.client import MONAILabelClient  # noqa: E402
from monailabel.client.client import MONAILabelClientException  # noqa: E402
from PIL import Image  # noqa: E402

from spectraflow_monai.apps.seg2d.synthetic import synthesize_pair  # noqa: E402

from .test_monailabel_app import (  # noqa: E402
    NAME_2D,
    NET,
    SIZE,
    TRAIN,
    _served,
    _studies_and_bundles,
    running_server,
)

TRAIN_TIMEOUT = 300.0  # seconds for one queued training of one epoch on two 56x56 images (CPU)
CONF = {
    "models": NAME_2D,
    "overrides": json.dumps(NET),
    f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN}),
    # no hub here: the encoder starts random, then models/model.pt (fine-tuning) is loaded over it
    "pretrained_weights": "none",
    "encoder_init": "pretrained",
}
TRAIN_REQUEST = {"max_epochs": 1, "device": "cpu", "val_split": 0.5, "multi_gpu": False}
PAIRS = ("p0", "p1", "p2", "p3")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("monailabel_server")
    studies, bundles = _studies_and_bundles(root)
    (root / "files").mkdir()
    with running_server(root, studies, bundles, CONF) as (base, log):
        yield SimpleNamespace(
            root=root, studies=studies, bundles=bundles, base=base, log=log,
            client=MONAILabelClient(base, tmpdir=str(root / "files")),
        )  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)


def _status_of(exc: MONAILabelClientException) -> int:
    match = re.match(r"Status: (\d+)", exc.msg)
    return int(match.group(1)) if match else -1


def _png(path: Path, array: np.ndarray) -> str:
    Image.fromarray(array).save(path)
    return str(path)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_server_path(text: str, server) -> None:
    for path in (str(server.root), os.path.realpath(tempfile.gettempdir()) + os.sep, str(server.bundles)):
        assert path not in text, text


def _served_model(bundles: Path) -> Path:
    """The model.pt the server serves: its own copy's, or the installed bundle's where there is no copy."""
    copy = _served(bundles, NAME_2D) / "models" / "model.pt"
    return copy if copy.is_file() else bundles / NAME_2D / "models" / "model.pt"


def _train(server) -> dict:
    """A queued training (MONAI Label's default ``run_sync=false``) polled with the client until it ends."""
    task = server.client.train_start(NAME_2D, dict(TRAIN_REQUEST))
    assert task.get("status") in ("SUBMITTED", "RUNNING"), task
    deadline = time.monotonic() + TRAIN_TIMEOUT
    while True:
        status = server.client.train_status()
        if status["id"] == task["id"] and status["status"] not in ("SUBMITTED", "RUNNING"):
            return status
        assert time.monotonic() < deadline, f"training still {status['status']} after {TRAIN_TIMEOUT} s"
        time.sleep(1.0)


# ---------------------------------------------------------------- the annotator's round trip
@pytest.mark.slow  # two queued trainings, each in MONAI Label's task subprocess: ~35 s on 2 busy cores
def test_annotate_train_and_serve_with_the_monai_label_client(server):
    client, files = server.client, server.root / "files"
    served_model = _served_model(server.bundles)
    installed = (server.bundles / NAME_2D / "models" / "model.pt").read_bytes()
    rng = np.random.default_rng(3)
    for image_id in PAIRS:
        image, mask = synthesize_pair(rng, 56)
        assert client.upload_image(_png(files / f"{image_id}.png", image), image_id=image_id)["image"] == image_id
        saved = client.save_label(image_id, _png(files / f"{image_id}_label.png", (mask > 0).astype(np.uint8)))
        assert saved["label"] == image_id
    labelled = {k for k, v in client.datastore()["objects"].items() if "final" in v["labels"]}
    assert set(PAIRS) <= labelled

    models = [_sha(served_model)]
    status = _train(server)
    assert status["status"] == "DONE", "\n".join(status.get("details") or [])
    models.append(_sha(served_model))
    assert models[1] != models[0]  # the run's best model serves now
    _no_server_path(json.dumps(status), server)  # the status shows neither the bundle folder nor log paths
    label_file, result = client.infer(NAME_2D, "p0", {"device": "cpu"})
    assert np.asarray(Image.open(label_file)).shape == (56, 56) and result["label_names"] == {"foreground": 1}

    # the annotator corrects the labels; the next training learns from them as a new run
    for image_id in PAIRS:
        image = np.asarray(Image.open(server.studies / f"{image_id}.png"))
        corrected = np.zeros(image.shape[:2], np.uint8)
        corrected[8:40, 12:44] = 1
        client.save_label(image_id, _png(files / f"{image_id}_corrected.png", corrected))
    status = _train(server)
    assert status["status"] == "DONE", "\n".join(status.get("details") or [])
    models.append(_sha(served_model))
    assert models[2] not in models[:2]  # a new model again, not the earlier one kept
    log = server.log.read_text(errors="replace")
    assert log.count("starting from fine-tuning from models/model.pt") == 2, log[-3000:]
    assert log.count("now serves as models/model.pt (it replaced the previous one)") == 2, log[-3000:]
    label_file, _ = client.infer(NAME_2D, "p1", {"device": "cpu"})
    assert set(np.unique(np.asarray(Image.open(label_file))).tolist()) <= {0, 1}
    # the installed bundle is untouched: the server trains and serves its own copy
    assert served_model == _served(server.bundles, NAME_2D) / "models" / "model.pt"
    assert (server.bundles / NAME_2D / "models" / "model.pt").read_bytes() == installed


# ---------------------------------------------------------------- attacks
def test_label_tag_cannot_write_into_a_bundle(server, tmp_path):
    """A label saved with a tag that leads to a bundle's configs/ would replace train.yaml with a config that runs
    code at the next training; every such tag is refused and nothing is written."""
    client = server.client
    image, _ = synthesize_pair(np.random.default_rng(4), 56)
    client.upload_image(_png(tmp_path / "train.png", image), image_id="train")
    marker = tmp_path / "marker"
    payload = tmp_path / "evil" / "train.yaml"
    payload.parent.mkdir()
    payload.write_text(f"imports:\n  - \"$__import__('pathlib').Path({str(marker)!r}).touch()\"\n")
    labels = server.studies / "labels"
    # the installed bundle, and the server's own copy of it where there is one
    targets = [t / "configs" for t in (server.bundles / NAME_2D, _served(server.bundles, NAME_2D)) if t.is_dir()]
    before = {t: (t / "train.yaml").read_bytes() for t in targets}
    for target in targets:
        for tag in (os.path.relpath(target, labels), str(target)):
            with pytest.raises(MONAILabelClientException) as info:
                client.save_label("train", str(payload), tag=tag)
            assert _status_of(info.value) == 400, info.value.msg
    for target in targets:
        assert (target / "train.yaml").read_bytes() == before[target]
    assert not marker.exists()


@pytest.mark.parametrize("how", ["relative", "absolute", "filename"])
def test_image_upload_cannot_leave_the_studies_folder(server, how):
    outside = server.root / f"outside_{how}"
    image, _ = synthesize_pair(np.random.default_rng(5), 56)
    data = _png(server.root / "files" / f"upload_{how}.png", image)
    query = {"relative": os.path.relpath(outside, server.studies), "absolute": str(outside), "filename": None}[how]
    name = ".." if how == "filename" else "upload.png"  # without ?image=, MONAI Label takes the id from the name
    listing = sorted(os.listdir(server.root))
    with open(data, "rb") as f:
        r = requests.put(
            f"{server.base}/datastore/image", params={"image": query} if query else {},
            files={"file": (name, f.read()), "params": (None, "{}")}, timeout=60,
        )  # fmt: skip
    assert r.status_code == 400, r.text
    assert sorted(os.listdir(server.root)) == listing and not outside.with_suffix(".png").exists()


_BAD_IDS = ["../studies/img_a", "/etc/passwd", "..", "", "a/b"]
_ROUTES = [  # (method, path, query with {} where the bad id goes, form)
    ("GET", "/datastore/image", {"image": "{}"}, None),
    ("HEAD", "/datastore/image", {"image": "{}"}, None),
    ("GET", "/datastore/image/info", {"image": "{}"}, None),
    ("PUT", "/datastore/image/info", {"image": "{}"}, {"info": (None, "{}")}),
    ("DELETE", "/datastore/image", {"id": "{}"}, None),
    ("GET", "/datastore/label", {"label": "{}", "tag": "final"}, None),
    ("GET", "/datastore/label", {"label": "img_a", "tag": "{}"}, None),
    ("GET", "/datastore/label/info", {"label": "img_a", "tag": "{}"}, None),
    ("PUT", "/datastore/label/info", {"label": "{}", "tag": "final"}, {"info": (None, "{}")}),
    ("DELETE", "/datastore/label", {"id": "img_a", "tag": "{}"}, None),
    ("PUT", "/datastore/label", {"image": "{}"}, "label"),
]


@pytest.mark.parametrize("route", range(len(_ROUTES)), ids=[f"{m} {p} {q}" for m, p, q, _ in _ROUTES])
def test_every_datastore_route_takes_plain_ids_only(server, route):
    method, path, query, form = _ROUTES[route]
    if form == "label":
        form = {"label": ("x.png", (server.studies / "img_a.png").read_bytes()), "params": (None, "{}")}
    for bad in _BAD_IDS:
        params = {k: (bad if v == "{}" else v) for k, v in query.items()}
        r = requests.request(method, f"{server.base}{path}", params=params, files=form, timeout=60)
        assert r.status_code == 400, (bad, r.status_code, r.text)
    assert (server.studies / "img_a.png").is_file()  # nothing was removed


def test_model_filename_names_only_files_of_models(server):
    """MONAI Label joins ``model_filename`` to the models folder unchecked: a server file answered 500, a missing
    one 200 with the default model. Every name that is not a file of models/ gets one and the same answer."""
    served = _served(server.bundles, NAME_2D) / "models" / "model.pt"
    names = ["/etc/passwd", "../../../../../../etc/passwd", "missing.pt", "../models/model.pt", str(served),
             str(server.bundles / NAME_2D / "models" / "model.pt"), "", ["/etc/passwd"]]  # fmt: skip
    answers = []
    for name in names:
        form = {"params": (None, json.dumps({"device": "cpu", "model_filename": name}))}
        r = requests.post(
            f"{server.base}/infer/{NAME_2D}", params={"image": "img_a", "output": "json"}, files=form, timeout=120
        )
        answers.append((r.status_code, r.content))
    # "" is the default (model.pt)
    assert answers[names.index("")][0] == 200
    refused = [a for n, a in zip(names, answers) if n != ""]
    assert refused == [refused[0]] * len(refused), refused
    assert refused[0][0] == 422 and b"model.pt" in refused[0][1]
    _no_server_path(refused[0][1].decode(), server)
    form = {"params": (None, json.dumps({"device": "cpu", "model_filename": "model.pt"}))}
    r = requests.post(f"{server.base}/infer/{NAME_2D}", params={"image": "img_a"}, files=form, timeout=120)
    assert r.status_code == 200, r.text


def test_answers_show_no_server_path(server):
    base = server.base
    # a file that is not an image: inference (415) and the datastore (415)
    r = requests.post(
        f"{base}/infer/{NAME_2D}", params={"output": "image"},
        files={"file": ("notes.png", b"not an image"), "params": (None, json.dumps({"device": "cpu"}))}, timeout=60,
    )  # fmt: skip
    assert r.status_code == 415, r.text
    _no_server_path(r.text, server)
    r = requests.put(
        f"{base}/datastore/image", params={"image": "notes"},
        files={"file": ("notes.png", b"not an image"), "params": (None, "{}")}, timeout=60,
    )  # fmt: skip
    assert r.status_code == 415, r.text
    _no_server_path(r.text, server)
    # what the datastore shows: ids and names, not where the files lie
    for params in ({"output": "all"}, {"output": "train"}, {"output": "stats"}):
        r = requests.get(f"{base}/datastore/", params=params, timeout=60)
        assert r.status_code == 200, r.text
        _no_server_path(r.text, server)
    r = requests.get(f"{base}/datastore/image/info", params={"image": "img_a"}, timeout=60)
    assert r.status_code == 200 and r.json()["name"] == "img_a.png", r.text
    _no_server_path(r.text, server)
    # an inference's JSON result
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    for output in ("json", "all"):
        r = requests.post(
            f"{base}/infer/{NAME_2D}", params={"image": "img_a", "output": output}, files=form, timeout=120
        )
        assert r.status_code == 200, r.text
        _no_server_path(r.text if output == "json" else r.content.decode("latin-1"), server)


def test_sessions_take_plain_ids_and_no_archives(server, tmp_path):
    """MONAI Label joins session ids into paths of its session folder (and removes that folder), unpacks uploaded
    archives with ``shutil.unpack_archive`` (tar members may point anywhere) and answers with server paths."""
    base = server.base
    with open(server.studies / "img_a.png", "rb") as f:
        data = f.read()
    r = requests.put(f"{base}/session/", files={"files": ("img_a.png", data)}, timeout=60)
    assert r.status_code == 200, r.text
    _no_server_path(r.text, server)
    session_id = r.json()["session_id"]
    r = requests.get(f"{base}/session/{session_id}", timeout=60)
    assert r.status_code == 200 and r.json()["image"] == "img_a.png", r.text
    _no_server_path(r.text, server)
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    r = requests.post(f"{base}/infer/{NAME_2D}", params={"session_id": session_id}, files=form, timeout=120)
    assert r.status_code == 200, r.text
    for bad, statuses in (("%2E%2E", (400,)), ("%2E%2E%2Fx", (400, 404))):  # "../x" does not match the route
        for method in ("GET", "DELETE"):
            r = requests.request(method, f"{base}/session/{bad}", timeout=60)
            assert r.status_code in statuses, (method, bad, r.status_code, r.text)
    r = requests.post(f"{base}/infer/{NAME_2D}", params={"session_id": "../x"}, files=form, timeout=60)
    assert r.status_code == 404, r.text
    archive = shutil.make_archive(str(tmp_path / "study"), "tar", root_dir=server.studies, base_dir="img_a.png")
    with open(archive, "rb") as f:
        r = requests.put(f"{base}/session/", params={"uncompress": "true"}, files={"files": ("study.tar", f.read())},
                         timeout=60)  # fmt: skip
    assert r.status_code == 422 and "uncompress" in r.text, r.text
    assert requests.delete(f"{base}/session/{session_id}", timeout=60).status_code == 200
