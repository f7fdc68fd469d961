"""Label uploads on a local datastore as the clients send them (``lib/labels.py``; docs/monailabel.md, "Serving from a
PACS", "Labels into the PACS"): ``.bin`` (MONAI Label's OHIF client: raw voxels of the image) and Slicer ``.seg.nrrd``
(segments named) are written on the image's grid in the image's format; a volume's label values are the model's
classes; everything refused leaves the datastore and the temporary folder as they were.
"""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

import nibabel as nib  # noqa: E402
from PIL import Image  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (_quiet_app: an autouse fixture used by name)
    AFFINE,
    IMAGE_2D_SHAPE,
    NAME_2D,
    NAME_3D,
    VOLUME_SHAPE,
    _app,
    _make_bundles,
    _quiet_app,
    _write_studies,
)
from .test_monailabel_dicomweb import _write_slicer_seg  # noqa: E402
from .test_monailabel_scoring import _client, settings_saved  # noqa: E402,F401  (a fixture used by name)


@pytest.fixture
def local(tmp_path, settings_saved, monkeypatch):
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies)
    app = _app(bundles, studies, models=f"{NAME_3D},{NAME_2D}")
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return _client(app, bundles, studies), studies, folder


def _save(client, image: str, name: str, content: bytes):
    return client.put("/datastore/label", params={"image": image, "tag": "final"},
                      files={"label": (name, content), "params": (None, json.dumps({}))})  # fmt: skip


def _volume_label() -> np.ndarray:
    label = np.zeros(VOLUME_SHAPE, np.uint8)
    label[5:20, 4:30, 1:5] = 5  # liver
    label[25:35, 10:20, 2:4] = 1  # spleen
    return label


def test_a_bin_volume_label_takes_the_image_grid(local):
    client, studies, tmp = local
    label = _volume_label()
    r = _save(client, "ct_a", "label.bin", label.tobytes(order="F"))
    assert r.status_code == 200, r.text
    stored = nib.load(str(studies / "labels" / "final" / "ct_a.nii.gz"))
    np.testing.assert_array_equal(np.asarray(stored.dataobj), label)
    np.testing.assert_allclose(stored.affine, AFFINE, atol=1e-5)
    assert not any(tmp.iterdir())


def test_a_slicer_segmentation_maps_its_segments_by_name(local, tmp_path):
    client, studies, _ = local
    label = _volume_label()
    seg = _write_slicer_seg(label, tmp_path / "label.seg.nrrd", {5: "Liver", 1: "spleen"})  # Slicer's 1, 2
    r = _save(client, "ct_a", "label.seg.nrrd", seg.read_bytes())
    assert r.status_code == 200, r.text
    stored = np.asarray(nib.load(str(studies / "labels" / "final" / "ct_a.nii.gz")).dataobj)
    np.testing.assert_array_equal(stored, label)


def test_a_bin_2d_label_becomes_a_png(local):
    client, studies, _ = local
    mask = np.zeros(IMAGE_2D_SHAPE, np.uint8)  # (H, W)
    mask[10:40, 20:70] = 1
    r = _save(client, "img_a", "label.bin", mask.T.tobytes(order="F"))  # (W, H) as MONAI reads the PNG
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.asarray(Image.open(studies / "labels" / "final" / "img_a.png")), mask)


@pytest.mark.parametrize(
    "image, name, make, status, message",
    [
        ("ct_a", "nine.nii.gz", lambda p: _nifti(np.where(_volume_label() == 5, 9, 0), p), 422, "values [9]"),
        ("ct_a", "short.bin", lambda p: _volume_label()[:, :, 1:].tobytes(order="F"), 422, "the .bin label holds"),
        ("ct_a", "big.bin", lambda p: b"\x00" * (np.prod(VOLUME_SHAPE) + 1), 422, "the .bin label holds"),
        ("ct_a", "t.seg.nrrd", lambda p: _write_slicer_seg(_volume_label(), p, {5: "tumour"}).read_bytes(), 422,
         "segment 'tumour' is not a class of the model"),
        ("ct_a", "float.nii.gz", lambda p: _nifti(_volume_label() * 0.5, p), 422, "not integers"),
        ("img_a", "short.bin", lambda p: b"\x01" * 10, 422, "the .bin label holds 10 bytes"),
        ("no_such", "label.bin", lambda p: b"\x01", 404, "image not found"),
    ],
)  # fmt: skip
def test_a_wrong_label_is_refused(local, tmp_path, image, name, make, status, message):
    client, studies, tmp = local
    r = _save(client, image, name, make(tmp_path / name))
    assert r.status_code == status and message in r.json()["detail"], r.text
    assert not (studies / "labels" / "final").exists() or not any((studies / "labels" / "final").iterdir())
    assert not any(tmp.iterdir())


def test_2d_masks_keep_their_values(local):
    """A 2D mask may be 0/255: the 2D bundle thresholds it (no class check for 2D images)."""
    client, studies, _ = local
    mask = np.zeros(IMAGE_2D_SHAPE, np.uint8)
    mask[5:30, 5:30] = 255
    path = studies.parent / "mask.png"
    Image.fromarray(mask).save(path)
    assert _save(client, "img_a", "mask.png", path.read_bytes()).status_code == 200


def _nifti(array: np.ndarray, path) -> bytes:
    nib.save(nib.Nifti1Image(np.asarray(array, np.float32), AFFINE), str(path))
    return path.read_bytes()
