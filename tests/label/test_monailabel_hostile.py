"""The MONAI Label app attacked over HTTP as a hostile client would (docs/monailabel.md, "Serving safely").

One server (``python -m monailabel.main start_server`` on 127.0.0.1, the 2D bundle with a tiny network, its own
session folder) serves the module:

- **no request names code**: a ``sitecustomize.py`` uploaded into a session is not kept under that name, and no task
  request may name the folder a task runs from (``bundle_path``) or its GPUs: scoring (both routes), batch inference
  and training answer 422, and no file of the session is ever imported (a marker it would write stays absent); an
  inference request naming what the bundle's inference reads or writes (``inference_settings``, by field, at its id,
  as an object or an expression) writes nothing where it points nor in the served bundle's output folder;
- **the server is the only writer of its record**: 300 label saves with infos and 120 image-info saves, sent from
  eight threads while forced scoring runs score the unlabelled images, are all kept, and so are all the scores;
- **one scoring run at a time**: eight concurrent forced requests start one run (the others 429), ``GET /info/``
  answers while it runs, ``?run_sync=true`` is 422 and ``DELETE /scoring/`` stops it;
- **task bodies**: ``force`` is a JSON boolean, NaN / Infinity and bodies over 64 KB are refused, and the status
  routes keep answering afterwards;
- **a model and its record travel together**: weights alone are 422 naming the record, a pair whose record was
  written for other weights is 422, a pair trained with another normalisation is served with its own (the masks
  change), a ``model.pt`` replaced on disk behind the server's back is 503 naming why, and ``DELETE /model`` is not
  undone by a task process;
- **look-alike names**: the server's start and each model upload prune model backups (``kept_model_backups 0``: a
  replaced pair is not kept) without touching a link named like a backup (to another run's folder or file outside
  ``models/``) or a user's file named like one;
- **re-uploads and the proxy**: an image uploaded again at another size (with labels) or extension is 409, an info
  over 64 KB is 413, ``/proxy/dicom/...`` on a local datastore is 404;
- **a second process changes the studies folder** (a server of its own): ``labels/`` removed while the server runs
  leaves its file watcher following the folder (an image copied in afterwards is listed, its label saved).
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")
requests = pytest.importorskip("requests")

from PIL import Image  # noqa: E402

from .test_monailabel_app import NAME_2D, NET, SIZE, _studies_and_bundles, running_server  # noqa: E402
from .test_monailabel_server import CONF  # noqa: E402

UNLABELLED = 120  # images the scoring runs score while the saves arrive
LABELLED = 150  # images that receive two labels each (300 label saves)
TIMEOUT = 60


def _png_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("monailabel_hostile")
    studies, bundles = _studies_and_bundles(root)
    rng = np.random.default_rng(11)
    for i in range(UNLABELLED):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(studies / f"u{i:03d}.png")
    for i in range(LABELLED):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(studies / f"a{i:03d}.png")
    sessions = root / "sessions"
    marker = root / "imported.txt"
    # look-alikes in the served copy's models/ before the first start: a link to another run, a user's own file
    outside = root / "other_run"
    outside.mkdir()
    for name in ("checkpoint_final.pt", "run_record.json", "model.pt"):
        (outside / name).write_bytes(b"another run's")
    models = bundles / "monailabel_app" / "model" / NAME_2D / "models"
    models.mkdir(parents=True)
    os.symlink(outside, models / "model.pt.bak-20200101-000000")
    (models / "model.pt.bak-20200102-000000").write_bytes(b"a user's own file")
    saved = {k: os.environ.get(k) for k in ("MONAI_LABEL_SESSION_PATH", "MONAI_LABEL_AUTO_UPDATE_SCORING")}
    os.environ["MONAI_LABEL_SESSION_PATH"] = str(sessions)
    os.environ["MONAI_LABEL_AUTO_UPDATE_SCORING"] = "false"  # the tests start the runs they check
    conf = {**CONF, "scoring_batch_size": "1", "kept_model_backups": "0"}
    try:
        with running_server(root, studies, bundles, conf) as (base, log):
            yield SimpleNamespace(root=root, studies=studies, bundles=bundles, base=base, log=log,
                                  sessions=sessions, marker=marker, outside=outside, models=models,
                                  conf=conf)  # fmt: skip
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        shutil.rmtree(root, ignore_errors=True)


def _wait_scoring(server, deadline: float = 300.0) -> dict:
    end = time.monotonic() + deadline
    while True:
        status = requests.get(f"{server.base}/scoring/", timeout=TIMEOUT).json()
        if status.get("status") not in ("RUNNING", "SUBMITTED"):
            return status
        assert time.monotonic() < end, f"scoring still running after {deadline} s: {status}"
        time.sleep(0.2)


# ---------------------------------------------------------------- no request names code
def test_no_session_file_can_be_imported_by_a_task(server):
    payload = f"open({str(server.marker)!r}, 'w').write('imported')\n".encode()
    image = _png_bytes(np.zeros((24, 24, 3), np.uint8))
    files = [("files", ("sitecustomize.py", payload, "text/x-python")), ("files", ("image.png", image, "image/png"))]
    r = requests.put(f"{server.base}/session/", files=files, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    session_id = r.json()["session_id"]
    kept = sorted(p.name for p in server.sessions.rglob("*") if p.is_file())
    assert kept and not any(name.endswith((".py", ".pyc", ".so", ".pth")) for name in kept), kept
    folders = {str(p) for p in server.sessions.rglob("*") if p.is_dir()} | {str(server.sessions / session_id)}
    names = [*sorted(folders), os.path.relpath(sorted(folders)[0], server.root), "."]
    for folder in names:
        for route, body in (
            ("/scoring/uncertainty", {"bundle_path": folder}),
            ("/scoring/uncertainty", {"gpus": "0"}),
            ("/scoring/", {"uncertainty": {"bundle_path": folder}}),
            ("/scoring/", {"bundle_path": folder}),
            (f"/batch/infer/{NAME_2D}", {"bundle_path": folder, "device": "cpu"}),
            (f"/train/{NAME_2D}", {"bundle_path": folder, "max_epochs": 1}),
        ):
            r = requests.post(f"{server.base}{route}", json=body, timeout=TIMEOUT)
            assert r.status_code == 422, (route, body, r.status_code, r.text)
    # a real run (in the server process) and a batch inference task process: nothing of the session is imported
    r = requests.post(f"{server.base}/scoring/uncertainty", json={"force": True}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert _wait_scoring(server)["status"] == "DONE"
    # (the labelled images: none yet, so the task process starts, finds nothing to infer and ends; a module on the
    # session's path would have run at its start)
    r = requests.post(f"{server.base}/batch/infer/{NAME_2D}", params={"images": "labeled"},
                      json={"device": "cpu"}, timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == 200, r.text
    end = time.monotonic() + 300
    while (status := requests.get(f"{server.base}/batch/infer/", timeout=TIMEOUT).json()).get("status") in (
        "SUBMITTED", "RUNNING"
    ):  # fmt: skip
        assert time.monotonic() < end
        time.sleep(0.5)
    assert status.get("status") == "DONE", status
    assert not server.marker.exists()


# ---------------------------------------------------------------- the server is the only writer of its record
def test_saves_during_forced_scoring_are_all_kept(server):
    rng = np.random.default_rng(5)
    masks = {f"a{i:03d}": _png_bytes((rng.random((24, 24)) > 0.5).astype(np.uint8)) for i in range(LABELLED)}
    stop = threading.Event()
    runs = []

    def keep_scoring():  # forced runs back to back while the saves arrive
        while not stop.is_set():
            r = requests.post(f"{server.base}/scoring/uncertainty", json={"force": True}, timeout=TIMEOUT)
            if r.status_code == 200:
                runs.append(r.json()["id"])
            time.sleep(0.05)

    def save_label(i: int, tag: str) -> int:
        image = f"a{i:03d}"
        r = requests.put(
            f"{server.base}/datastore/label", params={"image": image, "tag": tag},
            data={"params": json.dumps({"annotator": f"{tag}-{i}"})},
            files={"label": (f"{image}.png", masks[image], "image/png")}, timeout=TIMEOUT,
        )  # fmt: skip
        return r.status_code

    def save_note(i: int) -> int:
        r = requests.put(f"{server.base}/datastore/image/info", params={"image": f"u{i:03d}"},
                         data={"info": json.dumps({"note": f"note-{i}"})}, timeout=TIMEOUT)  # fmt: skip
        return r.status_code

    scorer = threading.Thread(target=keep_scoring)
    scorer.start()
    try:
        time.sleep(0.5)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            jobs = [pool.submit(save_label, i, tag) for tag in ("final", "review") for i in range(LABELLED)]
            jobs += [pool.submit(save_note, i) for i in range(UNLABELLED)]
            codes = [job.result() for job in jobs]
    finally:
        stop.set()
        scorer.join()
    assert codes.count(200) == len(codes), {c: codes.count(c) for c in set(codes)}
    assert runs, "no scoring run started during the saves"
    _wait_scoring(server)
    # one more run scores what the last forced run left (images it had not reached when the saves ended)
    r = requests.post(f"{server.base}/scoring/uncertainty", json={}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert _wait_scoring(server)["status"] == "DONE"

    listing = requests.get(f"{server.base}/datastore/", params={"output": "all"}, timeout=TIMEOUT).json()
    objects = listing["objects"]
    for i in range(LABELLED):
        labels = objects[f"a{i:03d}"]["labels"]
        for tag in ("final", "review"):
            assert labels[tag]["info"].get("annotator") == f"{tag}-{i}", (i, tag, labels)
    for i in range(UNLABELLED):
        info = objects[f"u{i:03d}"]["image"]["info"]
        assert info.get("note") == f"note-{i}", info
        assert isinstance(info.get("uncertainty_tta_entropy"), float), info
    on_disk = json.loads((server.studies / "datastore_v2.json").read_text())
    assert on_disk["objects"]["u000"]["image"]["info"]["note"] == "note-0"
    assert on_disk["objects"]["a000"]["labels"]["final"]["info"]["annotator"] == "final-0"


# ---------------------------------------------------------------- one scoring run at a time
def test_one_scoring_run_at_a_time_and_the_server_keeps_answering(server):
    _wait_scoring(server)

    def post() -> int:
        return requests.post(f"{server.base}/scoring/uncertainty", json={"force": True}, timeout=TIMEOUT).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: post(), range(8)))
    assert codes.count(200) == 1 and codes.count(429) == 7, codes
    started = time.monotonic()
    assert requests.get(f"{server.base}/info/", timeout=TIMEOUT).status_code == 200
    assert time.monotonic() - started < 10.0
    running = requests.get(f"{server.base}/scoring/", params={"check_if_running": True}, timeout=TIMEOUT)
    if running.status_code == 200:  # still running: stop it
        stopped = requests.delete(f"{server.base}/scoring/", timeout=TIMEOUT).json()
        assert stopped["status"] == "STOPPED"
    assert _wait_scoring(server)["status"] in ("DONE", "STOPPED")
    r = requests.post(f"{server.base}/scoring/uncertainty", params={"run_sync": True}, json={}, timeout=TIMEOUT)
    assert r.status_code == 422 and "run_sync" in r.text


@pytest.mark.parametrize(
    "route, body, status",
    [
        ("/scoring/uncertainty", '{"force": "false"}', 422),
        ("/scoring/uncertainty", '{"force": 1}', 422),
        ("/scoring/uncertainty", '{"force": NaN}', 422),
        ("/scoring/uncertainty", '{"client_id": Infinity}', 422),
        ("/scoring/uncertainty", json.dumps({"client_id": "x" * 200_000}), 413),
        ("/scoring/uncertainty", '{"model": "x"}', 422),
        ("/scoring/", '{"uncertainty": {"force": "true"}}', 422),
        (f"/train/{NAME_2D}", '{"max_epochs": NaN}', 422),
        (f"/train/{NAME_2D}", json.dumps({"max_epochs": 1, "x": "y" * 200_000}), 413),
        (f"/batch/infer/{NAME_2D}", '{"device": "cpu", "timeout": Infinity}', 422),
    ],
)
def test_task_bodies_are_checked_and_status_routes_keep_answering(server, route, body, status):
    r = requests.post(f"{server.base}{route}", data=body, headers={"Content-Type": "application/json"},
                      timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == status, r.text
    assert len(r.text) < 2000
    for status_route in ("/scoring/", "/train/", "/batch/infer/"):
        answer = requests.get(f"{server.base}{status_route}", params={"all": True}, timeout=TIMEOUT)
        assert answer.status_code in (200, 404), (status_route, answer.status_code, answer.text[:500])


def _train_tasks(server) -> int:
    """How many training tasks the server lists (all of them, finished ones too)."""
    r = requests.get(f"{server.base}/train/", params={"all": True}, timeout=TIMEOUT)
    tasks = r.json() if r.status_code == 200 else []
    return len(tasks) if isinstance(tasks, list) else 1


@pytest.mark.parametrize(
    "body",
    [
        {"image_size": 112},  # a setting by its field name (the server translates --conf overrides, not requests)
        {"model_settings#image_size": 112},  # a setting at its id
        {"model_settings": {"_target_": "os.system", "command": "touch pwned"}},  # a settings object replaced
        {"run_settings#model_path": "/tmp/elsewhere/model.pt"},  # where the run's model would be written
        {"run_settings#log_dir": "../../outside"},  # where the run's logs would be written
        {"model_path": "/tmp/elsewhere/model.pt"},
        {"stage2_settings#pretrained_weights": "/etc/passwd"},  # a file the encoder would be loaded from
        {"data_settings#data_list_file_path": "/etc/passwd"},  # a datalist the run would read
    ],
)
def test_a_training_request_cannot_name_a_bundle_setting(server, body):
    """Bundle settings are server settings (--conf overrides): a request naming one, by its field, at its id or as a
    whole settings object, is 422 before any run starts; no task is submitted and nothing is written."""
    before = _train_tasks(server)
    r = requests.post(f"{server.base}/train/{NAME_2D}", json={"max_epochs": 1, **body}, timeout=TIMEOUT)
    assert r.status_code == 422, (body, r.status_code, r.text)
    assert "server settings" in r.text, r.text
    assert _train_tasks(server) == before  # no training task was submitted
    assert not (server.root / "pwned").exists() and not Path("/tmp/elsewhere").exists()


@pytest.mark.parametrize(
    "options",
    [
        {"output_dir": "@elsewhere"},  # what inference writes, by its field name
        {"inference_settings#output_dir": "@elsewhere"},  # at its id
        {"inference_settings#input_dir": "/etc", "inference_settings#input_pattern": "*"},  # what it would read
        {"inference_settings#output_ext": ".py"},
        {"inference_settings": {"_target_": "os.system", "command": "touch pwned"}},  # the object replaced
        {"inference_settings": "$__import__('os').system('touch pwned')"},
    ],
)
def test_an_inference_request_cannot_name_what_inference_reads_or_writes(server, options):
    """``inference_settings`` (inputs, output folder, mask format) are the bundle's, read by ``configs/inference.yaml``
    runs; through the server the label comes back in the response and nothing is written beside it: a request naming
    one of them (by its field, at its id, or as a whole object or expression) is answered as any inference request is,
    and no file appears where it points, in the served bundle's own output folder, or from evaluated code."""
    elsewhere = server.root / "elsewhere"
    values = {k: str(elsewhere) if v == "@elsewhere" else v for k, v in options.items()}
    form = {"params": (None, json.dumps({"device": "cpu", **values}))}
    r = requests.post(f"{server.base}/infer/{NAME_2D}", params={"image": "u000", "output": "image"}, files=form,
                      timeout=TIMEOUT)  # fmt: skip
    assert r.status_code in (200, 422), (options, r.status_code, r.text)
    if r.status_code == 200:  # the label map itself, at the image's size
        assert np.asarray(Image.open(io.BytesIO(r.content))).shape == (24, 24)
    served = server.models.parent
    assert not elsewhere.exists() and not (served / "predictions").exists()
    assert not (server.root / "pwned").exists() and not (served / "pwned").exists() and not Path("pwned").exists()
    assert not any(p.suffix == ".py" for p in served.rglob("*_seg.py"))


def test_session_keeps_image_and_dicom_names_only(server):
    files = [("files", (name, b"\x00" * 16, "application/octet-stream"))
             for name in ("1.2.3.dcm", "IM0001", "evil.py", "lib.so", "x.pth", ".hidden.png")]  # fmt: skip
    r = requests.put(f"{server.base}/session/", files=files, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    folder = server.sessions / r.json()["session_id"]
    own = ("meta.info", ".spectraflow_session")
    kept = sorted(p.name for p in folder.rglob("*") if p.is_file() and p.name not in own)
    assert "1.2.3.dcm" in kept and not any(n.endswith((".py", ".so", ".pth")) or n.startswith(".") for n in kept)


# ---------------------------------------------------------------- look-alike names
def test_the_start_prunes_no_look_alike_backup(server):
    link = server.models / "model.pt.bak-20200101-000000"
    assert link.is_symlink() and sorted(p.name for p in server.outside.iterdir()) == [
        "checkpoint_final.pt", "model.pt", "run_record.json"]  # fmt: skip
    assert (server.models / "model.pt.bak-20200102-000000").read_bytes() == b"a user's own file"


# ---------------------------------------------------------------- a model and its record travel together
def _infer(server) -> requests.Response:
    return requests.post(f"{server.base}/infer/{NAME_2D}", params={"image": "img_a", "output": "image"},
                         files={"params": (None, json.dumps({"device": "cpu"}))}, timeout=TIMEOUT)  # fmt: skip


_LOOK_ALIKES = {"model.pt.bak-20200101-000000", "model.pt.bak-20200102-000000"}  # the fixture's link and file


def _backups(server) -> set[str]:
    """What is named like a backup of the served pair in models/ (the look-alikes with kept_model_backups 0)."""
    return {p.name for p in server.models.glob("model.*.bak-*")}


def _pair(weights: dict, settings: dict) -> bytes:
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model.pt"
        torch.save(weights, model)
        write_model_settings(model, ModelSettings.from_dict(settings))
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            zf.write(model, "model.pt")
            zf.write(model.with_name("model.json"), "model.json")
        return buffer.getvalue()


def test_a_model_is_served_with_its_own_record(server):
    served = server.models / "model.pt"
    weights = torch.load(served, weights_only=True)
    settings = {**NET, **SIZE[NAME_2D]}
    before = _infer(server)
    assert before.status_code == 200, before.text
    r = requests.put(f"{server.base}/model/{NAME_2D}", files={"file": ("model.pt", served.read_bytes())},
                     timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == 422 and "model.json" in r.json()["detail"], r.text
    foreign = _pair({k: v * 0.5 if v.is_floating_point() else v for k, v in weights.items()}, settings)
    with zipfile.ZipFile(io.BytesIO(foreign)) as zf:  # the record of those weights beside these
        record = zf.read("model.json")
    mixed = io.BytesIO()
    with zipfile.ZipFile(mixed, "w") as zf:
        zf.writestr("model.pt", served.read_bytes())
        zf.writestr("model.json", record)
    r = requests.put(f"{server.base}/model/{NAME_2D}", files={"file": ("m.zip", mixed.getvalue())}, timeout=TIMEOUT)
    assert r.status_code == 422 and "written for another" in r.json()["detail"], r.text
    # the same weights trained under another normalisation: served with it, so the mask changes
    other = _pair(weights, {**settings, "image_mean": [0.1, 0.1, 0.1], "image_std": [0.05, 0.05, 0.05]})
    r = requests.put(f"{server.base}/model/{NAME_2D}", files={"file": ("m.zip", other)}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    after = _infer(server)
    assert after.status_code == 200 and after.content != before.content
    assert json.loads((server.models / "model.json").read_text())["model"]["image_mean"] == [0.1, 0.1, 0.1]
    # a model.pt replaced on disk behind the server's back: 503 naming why, never a bare 500
    served.write_bytes(served.read_bytes()[:1000])
    r = _infer(server)
    assert r.status_code == 503 and "written for another" in r.json()["detail"], r.text
    assert str(server.root) not in r.text
    r = requests.put(f"{server.base}/model/{NAME_2D}", files={"file": ("m.zip", other)}, timeout=TIMEOUT)
    assert r.status_code == 200 and _infer(server).status_code == 200


def test_a_deleted_model_stays_deleted(server):
    pair = (server.models / "model.pt").read_bytes(), (server.models / "model.json").read_bytes()
    assert requests.delete(f"{server.base}/model/{NAME_2D}", timeout=TIMEOUT).status_code == 200
    # (kept_model_backups 0: the pair is not kept aside; only the look-alikes are named like backups)
    assert not (server.models / "model.pt").exists() and not (server.models / "model.json").exists()
    assert _backups(server) == _LOOK_ALIKES
    # a task process builds the app again, as MONAI Label starts one (its `info` method: the app and nothing else)
    env = dict(os.environ, MONAI_LABEL_APP_CONF=json.dumps(server.conf), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "monailabel.interfaces.utils.app", "-a", str(server.bundles / "monailabel_app"),
           "-s", str(server.studies), "-m", "info"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=server.root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _infer(server).status_code == 404
    assert not (server.models / "model.pt").exists()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("model.pt", pair[0])
        zf.writestr("model.json", pair[1])
    r = requests.put(f"{server.base}/model/{NAME_2D}", files={"file": ("m.zip", buffer.getvalue())}, timeout=TIMEOUT)
    assert r.status_code == 200 and _infer(server).status_code == 200


def test_uploads_beyond_the_bound_leave_look_alikes_alone(server):
    """kept_model_backups 0: each upload keeps no backup of the pair it replaced, and a user's file and a link named
    like backups of model.pt and model.json (to another run's files outside models/) stay as they were."""
    os.symlink(server.outside / "run_record.json", server.models / "model.json.bak-20200101-000000")
    (server.models / "model.json.bak-20200102-000000").write_bytes(b"a user's own record")
    look_alikes = _LOOK_ALIKES | {"model.json.bak-20200101-000000", "model.json.bak-20200102-000000"}
    weights = torch.load(server.models / "model.pt", weights_only=True)
    for i in range(3):
        pair = _pair({k: v + i if v.is_floating_point() else v for k, v in weights.items()}, {**NET, **SIZE[NAME_2D]})
        r = requests.put(f"{server.base}/model/{NAME_2D}", files={"file": ("m.zip", pair)}, timeout=TIMEOUT)
        assert r.status_code == 200 and _infer(server).status_code == 200, r.text
        assert _backups(server) == look_alikes, i
    assert (server.models / "model.pt.bak-20200101-000000").is_symlink()
    assert (server.models / "model.json.bak-20200101-000000").is_symlink()
    assert sorted(p.name for p in server.outside.iterdir()) == ["checkpoint_final.pt", "model.pt", "run_record.json"]
    assert all(p.read_bytes() == b"another run's" for p in server.outside.iterdir())
    assert (server.models / "model.pt.bak-20200102-000000").read_bytes() == b"a user's own file"
    assert (server.models / "model.json.bak-20200102-000000").read_bytes() == b"a user's own record"
    ledger = json.loads((server.models / ".spectraflow-set-aside.json").read_text())
    assert ledger["versions"] == []  # every backup it recorded is removed, nothing else was recorded


# ---------------------------------------------------------------- re-uploads, info size, the proxy
def test_re_uploads_infos_and_the_proxy(server):
    def put_image(name: str, shape: tuple[int, int], image_id: str = "re") -> requests.Response:
        data = io.BytesIO()
        Image.fromarray(np.zeros((*shape, 3), np.uint8)).save(data, format="PNG" if name.endswith("png") else "TIFF")
        return requests.put(f"{server.base}/datastore/image", params={"image": image_id},
                            files={"file": (name, data.getvalue())}, timeout=TIMEOUT)  # fmt: skip

    assert put_image("re.png", (20, 20)).status_code == 200
    assert put_image("re.png", (24, 24)).status_code == 200  # no labels yet: another size is fine
    r = requests.put(f"{server.base}/datastore/label", params={"image": "re", "tag": "final"},
                     files={"label": ("re.png", _png_bytes(np.ones((24, 24), np.uint8)))}, timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == 200, r.text
    r = put_image("re.png", (32, 32))
    assert r.status_code == 409 and "misaligned" in r.json()["detail"], r.text
    r = put_image("re.tif", (24, 24))
    assert r.status_code == 409 and "two files" in r.json()["detail"], r.text
    assert sorted(p.name for p in server.studies.glob("re.*")) == ["re.png"]
    big = json.dumps({"note": "x" * 40_000})
    assert requests.put(f"{server.base}/datastore/image/info", params={"image": "re"}, data={"info": big},
                        timeout=TIMEOUT).status_code == 200  # fmt: skip
    r = requests.put(f"{server.base}/datastore/image/info", params={"image": "re"},
                     data={"info": json.dumps({"more": "y" * 40_000})}, timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == 413, r.text
    for path in ("/proxy/dicom/x", "/proxy/dicom/qido/studies", "/proxy/dicom/wado/studies/1"):
        r = requests.get(f"{server.base}{path}", timeout=TIMEOUT)
        assert r.status_code == 404 and "local folder" in r.text, (path, r.status_code, r.text[:200])


# ---------------------------------------------------------------- a second process changes the studies folder
def test_the_server_follows_its_studies_after_another_process_removes_labels(tmp_path):
    """Another process removes ``labels/`` (with a saved label in it) while the server runs: the datastore's file
    watcher logs that it could not follow that change and goes on, the server keeps answering, an image that process
    copies in afterwards is listed, and a label saved for it over HTTP is kept (own server, not the module's)."""
    studies, bundles = _studies_and_bundles(tmp_path)
    with running_server(tmp_path, studies, bundles, CONF) as (base, log):
        r = requests.put(f"{base}/datastore/label", params={"image": "img_a", "tag": "final"},
                         files={"label": ("img_a.png", _png_bytes(np.ones((70, 90), np.uint8)))},
                         timeout=TIMEOUT)  # fmt: skip
        assert r.status_code == 200, r.text
        subprocess.run(["rm", "-rf", str(studies / "labels")], check=True)  # the other process

        def until(done, what: str) -> None:
            deadline = time.monotonic() + TIMEOUT
            while not done():
                assert time.monotonic() < deadline, f"{what}:\n{log.read_text()[-3000:]}"
                time.sleep(0.2)

        until(lambda: "did not follow a change in its studies folder" in log.read_text(), "no warning logged")
        assert requests.get(f"{base}/info/", timeout=TIMEOUT).status_code == 200
        subprocess.run(["cp", str(studies / "img_a.png"), str(studies / "late.png")], check=True)

        def listed() -> set[str]:
            return set(requests.get(f"{base}/datastore/", params={"output": "all"}, timeout=TIMEOUT).json()["objects"])

        until(lambda: "late" in listed(), "the image copied in afterwards is not listed")
        r = requests.put(f"{base}/datastore/label", params={"image": "late", "tag": "final"},
                         files={"label": ("late.png", _png_bytes(np.ones((70, 90), np.uint8)))},
                         timeout=TIMEOUT)  # fmt: skip
        assert r.status_code == 200, r.text
        assert (studies / "labels" / "final" / "late.png").is_file()
        assert "late" in requests.get(f"{base}/datastore/", params={"output": "all"},
                                      timeout=TIMEOUT).json()["objects"]  # fmt: skip
        assert "Traceback" not in log.read_text().split("did not follow a change")[-1]
