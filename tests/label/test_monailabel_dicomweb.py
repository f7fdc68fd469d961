"""The MONAI Label app on a real PACS (docs/monailabel.md, "Serving from a PACS").

Orthanc with its DICOMweb plugin runs on loopback (``tests/label/pacs.py``) holding two patients' phantom CT series
(64 x 56 x 12 voxels, known spacing and origin). The app serves the Synapse bundle with a tiny network:

- in process (MONAI Label's FastAPI application through ``TestClient``, a per-test temporary folder): DICOM SEG with
  the class names (``output=dicom_seg`` without ``label_info``, with one in class order, refused with a contradicting
  one), labels saved as ``.nii.gz``, ``.nii``, ``.nrrd``, ``.seg.nrrd`` and ``.bin`` (each read back from the PACS by
  segment label), wrong sizes, values and names (4xx, no SEG written), unknown series (404), the QIDO filter through the
  OHIF proxy, hostile ``label_info`` and proxy queries, the bounded cache, scoring bounded to
  ``scoring_max_series``, a SEG with a segment that is no class (422 naming it), nothing left in the temporary folder;
- a started server (``python -m monailabel.main start_server``), offline (no dcmqi on ``PATH``, every non-loopback
  connection refused): it starts, and Orthanc's request log shows no WADO-RS retrieve after start-up, listings,
  next samples and automatic scoring, until a request names a series;
- a fresh server on a PACS whose labels exist only as SEG trains (queued, ``DONE``, ``model.pt`` changes) with the
  classes intact (a liver stays 5 although its segment number is 2).

Skipped where Orthanc (Debian ``orthanc``, ``orthanc-dicomweb``) or MONAI Label is not installed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")
requests = pytest.importorskip("requests")

from .pacs import ORIGIN, SERIES_SHAPE, SPACING, requires_orthanc, running_orthanc  # noqa: E402
from .test_monailabel_app import (  # noqa: E402,F401  (_quiet_app: an autouse fixture used by name)
    NAME_3D,
    NET,
    ORGANS,
    SIZE,
    TRAIN,
    _make_bundles,
    _quiet_app,
    _served,
    app_main,
    running_server,
)

pytestmark = requires_orthanc

CLASSES = {v: k for k, v in ORGANS.items()}  # 1 spleen ... 8 pancreas
KEPT = (1, 5, 6, 8)  # spleen, liver, stomach, pancreas: segment numbers 1..4 in the SEG, class values 1, 5, 6, 8
CONF = {
    "models": NAME_3D,
    "overrides": json.dumps(NET),
    f"overrides.{NAME_3D}": json.dumps({**SIZE[NAME_3D], **TRAIN}),
    "pretrained_weights": "none",
    "encoder_init": "pretrained",
    "scoring_max_series": "1",
}
TRAIN_TIMEOUT = 420.0


# ---------------------------------------------------------------- helpers
def _subset(label: np.ndarray) -> np.ndarray:
    """The label with only the classes :data:`KEPT` (the others background)."""
    return np.where(np.isin(label, KEPT), label, 0).astype(np.uint8)


def _reference():
    """A SimpleITK image on the phantom series' grid."""
    import SimpleITK as sitk

    ref = sitk.Image(list(SERIES_SHAPE), sitk.sitkUInt8)
    ref.SetSpacing(SPACING)
    ref.SetOrigin(ORIGIN)
    return ref


def _write_label(array: np.ndarray, path: Path) -> Path:
    """``array`` ``(x, y, z)`` on the series' grid, written by SimpleITK (NIfTI or NRRD by the name)."""
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(np.ascontiguousarray(np.transpose(array.astype(np.uint8))))
    image.SetSpacing(SPACING)
    image.SetOrigin(ORIGIN)
    sitk.WriteImage(image, str(path), True)
    return path


def _write_slicer_seg(array: np.ndarray, path: Path, names: dict[int, str]) -> Path:
    """A Slicer segmentation file: the values renumbered 1..n in the order of ``names``, named in its header."""
    import nrrd

    renumbered = np.zeros(array.shape, np.uint8)
    header = {"space": "left-posterior-superior", "space directions": np.diag(SPACING),
              "space origin": np.array(ORIGIN)}  # fmt: skip
    for i, (value, name) in enumerate(names.items()):
        renumbered[array == value] = i + 1
        header.update({f"Segment{i}_Name": name, f"Segment{i}_LabelValue": str(i + 1), f"Segment{i}_Layer": "0",
                       f"Segment{i}_ID": f"Segment_{i + 1}"})  # fmt: skip
    nrrd.write(str(path), renumbered, header, index_order="F")
    return path


def _masks_by_name(seg: bytes) -> dict[str, np.ndarray]:
    """The segments of a SEG by segment label, each a boolean mask ``(x, y, z)`` on the series' grid (pydicom-seg,
    independent of the app)."""
    import pydicom
    import pydicom_seg
    import SimpleITK as sitk

    ds = pydicom.dcmread(io.BytesIO(seg))
    result = pydicom_seg.SegmentReader().read(ds)
    labels = {int(s.SegmentNumber): str(s.SegmentLabel) for s in ds.SegmentSequence}
    masks = {}
    for number in result.available_segments:
        image = sitk.Resample(result.segment_image(number), _reference(), sitk.Transform(), sitk.sitkNearestNeighbor)
        masks[labels[number]] = np.transpose(sitk.GetArrayFromImage(image)) > 0
    return masks


def _assert_seg_is(seg: bytes, label: np.ndarray) -> None:
    """The SEG holds one segment per class of ``label``, named after the class, covering exactly its voxels."""
    masks = _masks_by_name(seg)
    present = sorted(int(v) for v in np.unique(label) if v)
    assert sorted(masks) == sorted(CLASSES[v] for v in present), (sorted(masks), present)
    for value in present:
        np.testing.assert_array_equal(masks[CLASSES[value]], label == value, err_msg=CLASSES[value])


def _temp_files(folder: Path, before: set[str] | None = None, deadline: float = 10.0) -> list[str]:
    """What the temporary folder holds (beyond ``before``) once the requests' clean-ups ran (polled up to
    ``deadline`` s)."""
    end = time.monotonic() + deadline
    while True:
        found = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if str(p.relative_to(folder))
                       not in (before or set()))  # fmt: skip
        if not found or time.monotonic() > end:
            return found
        time.sleep(0.2)


def _cache_root(cache: Path) -> Path:
    (root,) = [p for p in cache.iterdir() if p.is_dir()]
    return root


# ---------------------------------------------------------------- in process: MONAI Label's application
@pytest.fixture(scope="module")
def pacs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pacs")
    with running_orthanc(root / "orthanc") as running:
        yield running
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def served(pacs, tmp_path_factory):
    """The app on the PACS in process (its cache in a folder of its own), and a ``TestClient`` of MONAI Label's
    application serving it."""
    from fastapi.testclient import TestClient
    from monailabel.app import app as fastapi_app
    from monailabel.config import settings
    from monailabel.interfaces.utils import app as app_utils

    root = tmp_path_factory.mktemp("pacs_app")
    bundles = _make_bundles(root, root, names=(NAME_3D,))
    names = ("MONAI_LABEL_APP_DIR", "MONAI_LABEL_STUDIES", "MONAI_LABEL_DATASTORE_AUTO_RELOAD",
             "MONAI_LABEL_AUTO_UPDATE_SCORING", "MONAI_LABEL_DICOMWEB_CACHE_PATH")  # fmt: skip
    saved = {k: getattr(settings, k) for k in names}
    settings.MONAI_LABEL_DICOMWEB_CACHE_PATH = str(root / "cache")
    settings.MONAI_LABEL_AUTO_UPDATE_SCORING = False
    try:
        app = app_main.SpectraFlowApp(app_dir=str(bundles / "monailabel_app"), studies=pacs.dicomweb, conf=dict(CONF))
        settings.MONAI_LABEL_APP_DIR, settings.MONAI_LABEL_STUDIES = str(bundles / "monailabel_app"), pacs.dicomweb
        app_utils.apps.clear()
        app_utils.apps[f"{settings.MONAI_LABEL_APP_DIR}{settings.MONAI_LABEL_STUDIES}"] = app
        app.server_mode(True)
        yield SimpleNamespace(app=app, client=TestClient(fastapi_app, raise_server_exceptions=False), root=root,
                              bundles=bundles, cache=root / "cache")  # fmt: skip
    finally:
        app_utils.apps.clear()
        for key, value in saved.items():
            setattr(settings, key, value)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def temp_folder(tmp_path, monkeypatch):
    """The system temporary folder of this test: an empty folder of its own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _uid(pacs, patient: str) -> str:
    return pacs.series[patient].series_uid


def _newest_seg(pacs) -> bytes:
    return pacs.seg_files()[-1] if pacs.seg_files() else b""


def _newest_seg_of(pacs, image_uid: str) -> bytes:
    """The newest SEG (by its content date and time) that labels series ``image_uid``."""
    import pydicom

    segs = []
    for seg in pacs.seg_files():
        ds = pydicom.dcmread(io.BytesIO(seg))
        if ds.ReferencedSeriesSequence[0].SeriesInstanceUID == image_uid:
            segs.append(((str(ds.ContentDate), str(ds.ContentTime)), seg))
    return max(segs)[1]


def _save(client, uid: str, name: str, content: bytes, params: dict | None = None):
    return client.put(
        "/datastore/label", params={"image": uid, "tag": "final"},
        files={"label": (name, content), "params": (None, json.dumps(params or {}))}, timeout=120,
    )  # fmt: skip


def test_dicom_seg_names_the_classes_present(served, pacs, temp_folder):
    client, uid = served.client, _uid(pacs, "PAT-A")
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    r = client.post(f"/infer/{NAME_3D}", params={"image": uid, "output": "image"}, files=form)
    assert r.status_code == 200, r.text
    (temp_folder.parent / "label.nii.gz").write_bytes(r.content)
    from monai.transforms import LoadImage

    label = LoadImage(image_only=True)(str(temp_folder.parent / "label.nii.gz"))
    assert tuple(label.shape) == SERIES_SHAPE  # on the series' grid
    np.testing.assert_allclose(np.diag(np.asarray(label.affine))[:3], [-SPACING[0], -SPACING[1], SPACING[2]])
    label = np.asarray(label).astype(np.uint8)
    assert len(np.unique(label)) >= 2

    # without label_info: the classes present, by name (MONAI Label answered 404)
    r = client.post(f"/infer/{NAME_3D}", params={"image": uid, "output": "dicom_seg"}, files=form)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/dicom"
    _assert_seg_is(r.content, label)
    # label_info as a client builds it from /info/ (every class, in class order): the same names
    in_order = [{"name": n} for n in ORGANS]
    for info in (in_order, [{"name": "Right Kidney", "idx": 2}, {"name": "liver", "idx": 5}]):
        form = {"params": (None, json.dumps({"device": "cpu", "label_info": info}))}
        r = client.post(f"/infer/{NAME_3D}", params={"image": uid, "output": "dicom_seg"}, files=form)
        assert r.status_code == 200, r.text
        _assert_seg_is(r.content, label)
    assert pacs.retrieved_series() == {uid}  # only the series the requests named
    assert _temp_files(temp_folder) == []  # the label files and SEGs are gone
    assert not any((_cache_root(served.cache) / ".work").iterdir())


@pytest.mark.parametrize(
    "label_info, message",
    [
        ([{"name": "liver"}], "label_info[0] names 'liver' at position 0 (class order), but value 1 is 'spleen'"),
        ([{"name": n} for n in [*ORGANS, "tumour"]], "label_info lists 9 entries; the model has 8 classes"),
        ([{"name": "spleen", "idx": 9}], "label_info[0]'s idx 9 is no class value"),
        ([{"name": "spleen", "idx": True}], "label_info[0]'s idx True is no class value"),
        ([{"name": "spleen", "idx": "1"}], "label_info[0]'s idx '1' is no class value"),
        ([{"name": "x" * 5000}], "longer than 256 characters"),
        ([{"label": "spleen"}], "label_info[0] must be an object with a 'name'"),
        (["spleen"], "label_info[0] must be an object with a 'name'"),
        ({"name": "spleen"}, "label_info must be a list"),
        ("spleen", "label_info must be a list"),
    ],
)
def test_a_label_info_against_the_classes_is_refused(served, pacs, label_info, message):
    segs = len(pacs.seg_series())
    form = {"params": (None, json.dumps({"device": "cpu", "label_info": label_info}))}
    r = served.client.post(f"/infer/{NAME_3D}", params={"image": _uid(pacs, "PAT-A"), "output": "dicom_seg"},
                           files=form)  # fmt: skip
    assert r.status_code == 422 and message in r.json()["detail"], r.text
    r = _save(served.client, _uid(pacs, "PAT-B"), "l.nii.gz", b"unread", {"label_info": label_info})
    assert r.status_code == 422 and message in r.json()["detail"], r.text
    assert len(pacs.seg_series()) == segs  # nothing stored


def test_labels_as_the_clients_send_them_become_seg_with_class_names(served, pacs, temp_folder, tmp_path):
    """Each format becomes a new SEG series whose segments are the classes present, by name; read back from the PACS
    by segment label, each covers exactly its class (liver 5 is segment 2 of 4)."""
    uid = _uid(pacs, "PAT-B")
    truth = _subset(pacs.series["PAT-B"].label)
    files = {
        "label.nii.gz": _write_label(truth, tmp_path / "label.nii.gz").read_bytes(),
        "label.nii": _write_label(truth, tmp_path / "label.nii").read_bytes(),
        "label.nrrd": _write_label(truth, tmp_path / "label.nrrd").read_bytes(),
        # Slicer numbers its segments 1..4: the names carry the classes
        "label.seg.nrrd": _write_slicer_seg(truth, tmp_path / "label.seg.nrrd",
                                            {5: "Liver", 1: "spleen", 8: "pancreas", 6: "stomach"}).read_bytes(),
        "label.bin": truth.tobytes(order="F"),  # MONAI Label's OHIF client: the raw voxels
    }  # fmt: skip
    for name, content in files.items():
        segs = len(pacs.seg_series())
        r = _save(served.client, uid, name, content, {"label_info": [{"name": n} for n in ORGANS]})
        assert r.status_code == 200, (name, r.text)
        assert len(pacs.seg_series()) == segs + 1, name  # one new SEG series per save
        _assert_seg_is(_newest_seg_of(pacs, uid), truth)
    assert _temp_files(temp_folder) == []
    assert not any((_cache_root(served.cache) / ".work").iterdir())
    assert uid in served.client.get("/datastore/", params={"output": "all"}).json()["objects"]


@pytest.mark.parametrize(
    "name, make, status, message",
    [
        ("short.nii.gz", lambda t, p: _write_label(t[:, :, :-1], p).read_bytes(), 422, "differs from the size"),
        ("short.bin", lambda t, p: t[:, :, :-1].tobytes(order="F"), 422, "the .bin label holds"),
        ("nine.nii.gz", lambda t, p: _write_label(np.where(t == 5, 9, t), p).read_bytes(), 422, "values [9]"),
        ("empty.nii.gz", lambda t, p: _write_label(np.zeros_like(t), p).read_bytes(), 422, "all background"),
        ("tumour.seg.nrrd", lambda t, p: _write_slicer_seg(t, p, {5: "liver", 1: "tumour"}).read_bytes(), 422,
         "segment 'tumour' is not a class of the model"),
        ("noise.nii.gz", lambda t, p: b"not an image", 415, "not a readable label map"),
        ("photo.jpg", lambda t, p: b"\xff\xd8", 415, "must be a file whose name ends with"),
    ],
)  # fmt: skip
def test_a_wrong_label_is_refused_before_any_seg(served, pacs, temp_folder, tmp_path, name, make, status, message):
    truth = _subset(pacs.series["PAT-B"].label)
    segs = len(pacs.seg_series())
    r = _save(served.client, _uid(pacs, "PAT-B"), name, make(truth, tmp_path / name))
    assert r.status_code == status and message in r.json()["detail"], r.text
    assert len(pacs.seg_series()) == segs
    assert _temp_files(temp_folder) == []


@pytest.mark.parametrize("image", ["1.2.3.4.5", "1.2.826.0.1.3680043.10.1189.999"])
def test_an_unknown_series_is_404(served, pacs, image):
    client, segs = served.client, len(pacs.seg_series())
    form = {"params": (None, json.dumps({"device": "cpu"}))}
    for output in ("image", "dicom_seg"):
        r = client.post(f"/infer/{NAME_3D}", params={"image": image, "output": output}, files=form)
        assert r.status_code == 404, r.text
    assert _save(client, image, "l.nii.gz", b"x").status_code == 404
    assert client.get("/datastore/image", params={"image": image}).status_code == 404
    for path in ("../x", "a/b", "..", "1.2:3"):
        assert _save(client, path, "l.nii.gz", b"x").status_code in (400, 404)
    assert len(pacs.seg_series()) == segs
    assert image not in pacs.retrieved_series()


def test_images_and_labels_are_not_changed_through_the_server(served, pacs):
    client = served.client
    r = client.put("/datastore/image", params={"image": "x"}, files={"file": ("x.nii.gz", b"x")})
    assert r.status_code == 422 and "PACS" in r.json()["detail"], r.text
    r = client.delete("/datastore/label", params={"id": _uid(pacs, "PAT-A"), "tag": "final"})
    assert r.status_code == 422, r.text
    r = client.post(f"/infer/{NAME_3D}", params={"output": "dicom_seg"}, files={"file": ("x.nii.gz", b"x")})
    assert r.status_code == 422 and "series instance UID" in r.json()["detail"], r.text


def test_the_proxy_forwards_the_qido_filter(served, pacs):
    """OHIF's study list and Studies panel: one patient's studies, not the PACS's."""
    client = served.client
    every = client.get("/proxy/dicom/qido/studies")
    assert every.status_code == 200 and len(every.json()) == 2, every.text
    for patient in ("PAT-A", "PAT-B"):
        r = client.get("/proxy/dicom/qido/studies", params={"PatientID": patient})
        assert r.status_code == 200, r.text
        assert [s["00100020"]["Value"] for s in r.json()] == [[patient]]  # the filter reached Orthanc
        r = client.get("/proxy/dicom/qido/studies", params={"00100020": f"*{patient[1:]}*"})  # OHIF's study list
        assert r.status_code == 200 and [s["00100020"]["Value"] for s in r.json()] == [[patient]], r.text
    study = pacs.series["PAT-A"].study_uid
    r = client.get("/proxy/dicom/qido/series", params={"StudyInstanceUID": study, "Modality": "CT"})
    assert r.status_code == 200 and [s["0020000D"]["Value"] for s in r.json()] == [[study]], r.text
    r = client.get(f"/proxy/dicom/qido/studies/{study}/series", params={"limit": "1"})
    assert r.status_code == 200 and len(r.json()) == 1, r.text


@pytest.mark.parametrize(
    "path, params, status",
    [
        ("studies", {"PatientID": "PAT-A\r\nX-Injected: 1"}, 200),  # re-encoded: no header, no study
        ("studies", {"PatientID": "PAT-A#frag"}, 200),
        ("studies", {"PatientID": "PAT-A&PatientID=PAT-B"}, 200),  # one value, not two parameters
        ("studies", {"q": "x" * 5000}, 414),
        ("studies/../../system", {}, 404),  # the client resolves it: /proxy/dicom/system, inside the DICOMweb root
        ("studies/%2e%2e/%2e%2e/system", {}, 400),  # sent as it is: refused
    ],
)
def test_hostile_proxy_queries(served, pacs, path, params, status):
    outside = len(pacs.requests_of("GET /system"))
    r = served.client.get(f"/proxy/dicom/qido/{path}", params=params)
    assert r.status_code == status, r.text
    assert "X-Injected" not in r.headers
    if status == 200 and r.content:
        assert r.json() == []  # no study matches the literal value
    assert len(pacs.requests_of("GET /system")) == outside  # nothing outside the DICOMweb root was asked


def test_the_proxy_target_keeps_the_query_re_encoded(tmp_path):
    from monailabel.config import settings

    import lib.uploads as uploads

    saved = settings.MONAI_LABEL_STUDIES
    settings.MONAI_LABEL_STUDIES = str(tmp_path)
    try:
        metadata = ("wado", "studies/x/metadata?a=b+c")
        assert uploads.proxy_target("qido", "studies/x/metadata", [("a", "b c")]) == metadata
        assert uploads.proxy_target("qido", "studies", []) == ("qido", "studies")
        wildcards = [("00100020", "*A?*"), ("includefield", "00081030,00080060")]  # unescaped: Orthanc matches them
        target = "studies?00100020=*A?*&includefield=00081030,00080060"
        assert uploads.proxy_target("qido", "studies", wildcards) == ("qido", target)
    finally:
        settings.MONAI_LABEL_STUDIES = saved


def test_scoring_retrieves_at_most_scoring_max_series(served, pacs):
    app, client = served.app, served.client
    before = pacs.retrieved_series()
    unlabelled = app.datastore().get_unlabeled_images()
    assert app._scoring_methods["uncertainty"].pending(app.datastore()) == len(unlabelled)
    assert pacs.retrieved_series() == before  # counted from the record and QIDO-RS
    r = client.post("/scoring/uncertainty")
    assert r.status_code == 200, r.text
    app.scoring_runs.wait(300)
    status = client.get("/scoring/").json()
    assert status["status"] == "DONE" and status["result"]["scored"] == 1, status  # --conf scoring_max_series 1
    assert len(pacs.retrieved_series() - before) <= 1
    # the automatic runs (after a next sample, a training) do not start on a PACS
    r = client.post("/activelearning/random")
    assert r.status_code == 200 and r.json()["id"] in {s.series_uid for s in pacs.series.values()}, r.text
    assert app.async_scoring(None) == {}


def _write_seg(series, path: Path, names: dict[int, str]) -> Path:
    """The SEG of the series' label (the classes :data:`KEPT`), its segments named by ``names`` (``{value: name}``)."""
    from monai.transforms import LoadImage

    from spectraflow_monai.data.dicom_seg import write_dicom_seg

    label = LoadImage(image_only=True)(str(_write_label(_subset(series.label), path.with_suffix(".nii.gz"))))
    class_names = ["background", *(names.get(v, f"class {v}") for v in range(1, max(names) + 1))]
    return Path(write_dicom_seg(label, series.files[0].parent, class_names, path, series_description="another tool"))


def test_a_seg_segment_that_is_no_class_is_refused_by_name(pacs, tmp_path):
    """Training reads a SEG back by its segment labels; a segment the bundle does not know is refused, naming it."""
    from monailabel.config import settings

    with running_orthanc(tmp_path / "orthanc", patients=("PAT-C",)) as own:
        series = own.series["PAT-C"]
        seg = _write_seg(series, tmp_path / "seg.dcm", {1: "spleen", 5: "tumour", 6: "stomach", 8: "pancreas"})
        own.upload([seg])
        bundles = _make_bundles(tmp_path, tmp_path, names=(NAME_3D,))
        saved = settings.MONAI_LABEL_DICOMWEB_CACHE_PATH
        settings.MONAI_LABEL_DICOMWEB_CACHE_PATH = str(tmp_path / "cache")
        try:
            app = app_main.SpectraFlowApp(app_dir=str(bundles / "monailabel_app"), studies=own.dicomweb,
                                          conf=dict(CONF))  # fmt: skip
            with pytest.raises(Exception) as raised:
                app.check_train_data({"model": NAME_3D})
        finally:
            settings.MONAI_LABEL_DICOMWEB_CACHE_PATH = saved
    assert raised.value.status_code == 422
    assert "segment 2 'tumour' is not a class of the model" in raised.value.detail, raised.value.detail
    assert "/" not in raised.value.detail.split("'tumour'")[0], raised.value.detail  # the SEG by its UID, no path


def test_the_cache_keeps_at_most_max_series_without_a_label(tmp_path, monkeypatch):
    import lib.dicomweb as dicomweb
    from monailabel.datastore.dicom import DICOMwebClientX

    monkeypatch.setattr(dicomweb, "RECENT_SECONDS", 0.0)
    with running_orthanc(tmp_path / "orthanc") as pacs:
        store = dicomweb.CheckedDICOMWebDatastore(DICOMwebClientX(url=pacs.dicomweb), {"Modality": "CT"}, CLASSES,
                                                  cache_path=str(tmp_path / "cache"), max_series=1)  # fmt: skip
        a, b = _uid(pacs, "PAT-A"), _uid(pacs, "PAT-B")
        store.update_image_info(a, {"note": 1})  # a series never fetched keeps its info
        assert pacs.retrieves() == []
        first = store.get_image_uri(a)
        assert os.path.isfile(first) and store.get_image_info(a)["note"] == 1
        store.get_image_uri(b)
        assert not os.path.exists(first) and not os.path.isdir(store.series_dir(a))  # the least recently used went
        assert os.path.isfile(store.get_image_uri(b))
        assert store.get_image_info(a)["note"] == 1  # its record stays
        assert os.path.isfile(store.get_image_uri(a))  # retrieved again on request
        assert [p.split("/series/")[1] for p in pacs.retrieves()] == [a, b, a]
        # the folders of requests of processes that ended are removed when a process starts; a running one's stay
        ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        for name in (f"{int(ended.stdout)}-x", f"{os.getpid()}-y", "junk"):
            (Path(store.work) / name).mkdir()
        dicomweb.CheckedDICOMWebDatastore(DICOMwebClientX(url=pacs.dicomweb), {}, CLASSES, str(tmp_path / "cache"))
        assert sorted(os.listdir(store.work)) == [f"{os.getpid()}-y"]
        with pytest.raises(ValueError, match="max_series must be an integer >= 1"):
            dicomweb.CheckedDICOMWebDatastore(DICOMwebClientX(url=pacs.dicomweb), {}, CLASSES, None, max_series=0)


def test_only_the_server_writes_the_caches_record(pacs, tmp_path):
    """A task process (a training) loads the cache's record at its start; were it to write the record from that copy,
    what the server wrote meanwhile (scores, infos) would be gone from the file. Only the server's datastore writes."""
    import lib.dicomweb as dicomweb
    from monailabel.datastore.dicom import DICOMwebClientX

    def store():
        return dicomweb.CheckedDICOMWebDatastore(DICOMwebClientX(url=pacs.dicomweb), {"Modality": "CT"}, CLASSES,
                                                 cache_path=str(tmp_path / "cache"))  # fmt: skip

    server, task = store(), store()  # the task process started before the server's write below
    server.writes_record = True
    uid = _uid(pacs, "PAT-A")
    server.update_image_info(uid, {"note": "the annotator's"})
    task.update_image_info(uid, {"uncertainty_tta_entropy": 0.5})  # kept in the task process's memory only
    assert task.get_image_info(uid)["uncertainty_tta_entropy"] == 0.5
    record = json.loads((_cache_root(tmp_path / "cache") / "datastore_v2.json").read_text())
    assert record["objects"][uid]["image"]["info"]["note"] == "the annotator's"
    assert "uncertainty_tta_entropy" not in record["objects"][uid]["image"]["info"]


def test_the_start_clean_up_of_work_folders_never_follows_a_link(pacs, tmp_path):
    """A link in the cache's ``.work/`` named like a folder of an ended process (to another run's files outside the
    cache) is not followed: its target keeps every file, and the link itself is left."""
    import lib.dicomweb as dicomweb
    from monailabel.datastore.dicom import DICOMwebClientX

    outside = tmp_path / "another_run"
    outside.mkdir()
    (outside / "model.pt").write_bytes(b"another run's")
    store = dicomweb.CheckedDICOMWebDatastore(DICOMwebClientX(url=pacs.dicomweb), {}, CLASSES, str(tmp_path / "cache"))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    link = Path(store.work) / f"{int(ended.stdout)}-link"
    os.symlink(outside, link)
    inner = Path(store.work) / f"{int(ended.stdout)}-folder"
    inner.mkdir()
    os.symlink(outside, inner / "elsewhere")  # a link inside a folder of an ended process
    dicomweb.CheckedDICOMWebDatastore(DICOMwebClientX(url=pacs.dicomweb), {}, CLASSES, str(tmp_path / "cache"))
    assert (outside / "model.pt").read_bytes() == b"another run's"
    assert link.is_symlink() and not inner.exists()


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"dicomweb_cache_series": "0"}, "--conf dicomweb_cache_series must be an integer >= 1"),
        ({"dicomweb_cache_series": "many"}, "--conf dicomweb_cache_series must be an integer >= 1"),
        ({"scoring_max_series": "0"}, "max_series must be an integer >= 1"),
        ({"scoring_max_series": "1e9x"}, "--conf scoring_max_series must be a number"),
    ],
)
def test_bad_pacs_settings_stop_the_app(pacs, tmp_path, conf, message):
    bundles = _make_bundles(tmp_path, tmp_path, names=(NAME_3D,), weights=False)
    with pytest.raises(ValueError, match=message):
        app_main.SpectraFlowApp(app_dir=str(bundles / "monailabel_app"), studies=pacs.dicomweb,
                                conf={**CONF, **conf})  # fmt: skip


# ---------------------------------------------------------------- a started server, offline
def _offline_env(root: Path) -> dict[str, str]:
    """No dcmqi on PATH (the app finds the wheel's), every connection but loopback refused, a temporary folder and a
    cache of the test's own."""
    venv_bin = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and os.path.realpath(p) != os.path.realpath(venv_bin)
            and not os.path.isfile(os.path.join(p, "itkimage2segimage"))]  # fmt: skip
    for folder in ("tmp", "cache", "sessions"):
        (root / folder).mkdir(exist_ok=True)
    dead = "http://127.0.0.1:9"
    return {"PATH": os.pathsep.join(path), "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead,
            "https_proxy": dead, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "TMPDIR": str(root / "tmp"), "MONAI_LABEL_DICOMWEB_CACHE_PATH": str(root / "cache"),
            "MONAI_LABEL_SESSION_PATH": str(root / "sessions")}  # fmt: skip


def test_a_server_starts_offline_and_retrieves_nothing_nobody_asked_for(tmp_path):
    with running_orthanc(tmp_path / "orthanc") as pacs:
        bundles = _make_bundles(tmp_path, tmp_path, names=(NAME_3D,))
        env = _offline_env(tmp_path)
        with running_server(tmp_path, pacs.dicomweb, bundles, CONF, env=env) as (base, log):
            assert not (bundles / "monailabel_app" / "bin" / "itkimage2segimage").exists()  # nothing downloaded
            assert "dcmqi for MONAI Label:" in log.read_text()
            # MONAI Label's start writes its logging configuration there, once; requests add nothing
            started = set(os.listdir(tmp_path / "tmp"))
            uids = {s.series_uid for s in pacs.series.values()}
            info = requests.get(f"{base}/info/", timeout=60).json()
            assert NAME_3D in info["models"] and info["datastore"]["total"] == 2
            listing = requests.get(f"{base}/datastore/", params={"output": "all"}, timeout=60).json()
            assert set(listing["objects"]) == uids
            for strategy in ("random", "first", "uncertainty"):
                r = requests.post(f"{base}/activelearning/{strategy}", timeout=60)
                assert r.status_code == 200 and r.json()["id"] in uids, r.text
            time.sleep(2.0)  # automatic scoring would have started by now
            assert pacs.retrieves() == [], pacs.retrieves()  # start-up, listings, next samples: nothing retrieved
            assert "uncertainty: not started by itself on a PACS" in log.read_text()
            # a request names a series: that one, and nothing else
            uid = pacs.series["PAT-B"].series_uid
            r = requests.post(f"{base}/infer/{NAME_3D}", params={"image": uid, "output": "dicom_seg"},
                              files={"params": (None, json.dumps({"device": "cpu"}))}, timeout=300)  # fmt: skip
            assert r.status_code == 200 and r.headers["content-type"] == "application/dicom", r.text
            truth = _subset(pacs.series["PAT-B"].label)
            r = requests.put(f"{base}/datastore/label", params={"image": uid, "tag": "final"},
                             files={"label": ("label.bin", truth.tobytes(order="F"))}, timeout=300)  # fmt: skip
            assert r.status_code == 200, r.text
            assert pacs.retrieved_series() == {uid}
            _assert_seg_is(_newest_seg(pacs), truth)
            assert _temp_files(tmp_path / "tmp", started) == []  # the requests left nothing in the server's tmp


@pytest.mark.slow  # a queued training in MONAI Label's task process: ~1 min on 2 busy cores
def test_a_fresh_server_trains_from_the_segs_in_the_pacs(tmp_path):
    """The labels exist only as SEG (written with the class names, spleen, liver, stomach, pancreas = segments
    1..4): a fresh server trains (``DONE``, a new ``model.pt``) on class values 1, 5, 6, 8."""
    with running_orthanc(tmp_path / "orthanc") as pacs:
        for patient, series in pacs.series.items():
            pacs.upload([_write_seg(series, tmp_path / f"{patient}.dcm", CLASSES)])
        bundles = _make_bundles(tmp_path, tmp_path, names=(NAME_3D,))
        model = _served(bundles, NAME_3D) / "models" / "model.pt"
        with running_server(tmp_path, pacs.dicomweb, bundles, CONF, env=_offline_env(tmp_path)) as (base, _):
            started = set(os.listdir(tmp_path / "tmp"))
            before = model.read_bytes()
            request = {"max_epochs": 1, "device": "cpu", "val_split": 0.5, "multi_gpu": False}
            r = requests.post(f"{base}/train/{NAME_3D}", json=request, timeout=300)
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + TRAIN_TIMEOUT
            while True:
                status = requests.get(f"{base}/train/", timeout=60).json()
                if status["status"] not in ("SUBMITTED", "RUNNING"):
                    break
                assert time.monotonic() < deadline, "training did not end"
                time.sleep(2.0)
            assert status["status"] == "DONE", "\n".join(status.get("details") or [])
            assert model.read_bytes() != before  # the run's model serves
            root = _cache_root(tmp_path / "cache")
            import nibabel as nib

            for series in pacs.series.values():  # the classes intact: a liver is 5, not its segment number 2
                label = np.asarray(nib.load(str(root / "labels" / "final" / f"{series.series_uid}.nii.gz")).dataobj)
                np.testing.assert_array_equal(label, _subset(series.label))
            assert _temp_files(tmp_path / "tmp", started) == []
