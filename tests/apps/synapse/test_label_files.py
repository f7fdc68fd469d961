"""The Synapse data path reads labels as NIfTI, NRRD and 3D Slicer segmentations, and images as DICOM series:
the datalist JSON (header checks, slice cache) and VolumeSlices (MONAI Label's training pairs) give the same slices
for every kind; a segmentation's segments go to their classes by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nrrd", reason="NRRD labels need pynrrd (the label extra)")

from spectraflow_monai.apps.synapse import (  # noqa: E402
    BTCV_TO_SYNAPSE,
    SYNAPSE_ORGANS,
    VolumeSlices,
    load_slice_npz,
)
from spectraflow_monai.utils.errors import DatasetError  # noqa: E402
from tests.apps.synapse.sources import source_datalist, synapse_source  # noqa: E402
from tests.data import volume_files as vf  # noqa: E402

DIAGONAL, ROTATED, phantom, write_nifti, write_nrrd = vf.DIAGONAL, vf.ROTATED, vf.phantom, vf.write_nifti, vf.write_nrrd

SHAPE = (24, 20, 6)
LIVER = SYNAPSE_ORGANS.index("liver")
BTCV_OF_CLASS = {c: b for b, c in BTCV_TO_SYNAPSE.items()}


def _label_file(folder: Path, name: str, label: np.ndarray, affine, kind: str) -> str:
    if kind == "nii.gz":
        return write_nifti(folder / f"{name}.nii.gz", label, affine)
    if kind == "nrrd":
        return write_nrrd(folder / f"{name}.nrrd", label, affine)
    return vf.write_seg_nrrd(folder / f"{name}.seg.nrrd", label, affine, vf.organ_segments(label))


def _image(folder: Path, name: str, image: np.ndarray, affine, kind: str) -> str:
    if kind == "dicom":
        pytest.importorskip("pydicom", reason="DICOM series need pydicom (the label extra)")
        vf.write_series(folder / name, image, affine)
        return str(folder / name)
    return write_nifti(folder / f"{name}.nii.gz", image, affine)


def _dataset(root: Path, label_kind: str, image_kind: str = "nii.gz", affine=ROTATED, label_map=None) -> Path:
    """Three phantom cases (two train, one validation) in a datalist JSON; labels of ``label_kind`` in the classes,
    or (``label_map`` BTCV) in BTCV ids where the file stores values (NIfTI, NRRD)."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    (root / "lab").mkdir(exist_ok=True)
    items = []
    for case in (5, 6, 7):
        image, label = phantom(SHAPE, case)
        stored = label
        if label_map is not None and label_kind != "seg.nrrd":
            stored = np.vectorize(lambda c: BTCV_OF_CLASS.get(int(c), 0))(label).astype(np.uint8)
        items.append({
            "image": _image(root / "img", f"ct{case}", image, affine, image_kind),
            "label": _label_file(root / "lab", f"ct{case}", stored, affine, label_kind),
        })  # fmt: skip
    path = root / "dataset.json"
    path.write_text(json.dumps({"training": items[:2], "validation": items[2:]}))
    return path


def _slices(path: Path, cache: Path, split: str = "train", label_map=None) -> list[tuple[str, np.ndarray, np.ndarray]]:
    entries = source_datalist("synthetic", None, split=split, slices=True, cache_dir=str(cache),
                              data_list_file_path=str(path), label_map=label_map,
                              class_names=list(SYNAPSE_ORGANS))  # fmt: skip
    out = []
    for e in entries:
        npz = load_slice_npz(e["image"])
        out.append((f"{e['case']}/{e['slice']}", npz["image"], npz["label"]))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    return _slices(_dataset(root, "nii.gz"), root / "cache")


@pytest.mark.parametrize("label_kind", ["nrrd", "seg.nrrd"])
@pytest.mark.parametrize("image_kind", ["nii.gz", "dicom"])
def test_every_kind_of_label_and_image_gives_the_same_slices(tmp_path, reference, label_kind, image_kind):
    """NIfTI / NRRD / 3D Slicer segmentation labels (segments in reverse class order), NIfTI images or DICOM series:
    the same cached slices, image and label, as the NIfTI pair."""
    slices = _slices(_dataset(tmp_path, label_kind, image_kind), tmp_path / "cache")
    assert [s[0] for s in slices] == [s[0] for s in reference] and len(slices) == 2 * SHAPE[2]
    for (name, image, label), (_, ref_image, ref_label) in zip(slices, reference):
        np.testing.assert_array_equal(label, ref_label, err_msg=name)
        np.testing.assert_allclose(image, ref_image, atol=1e-6, err_msg=name)
    assert any((label == LIVER).any() for _, _, label in slices)


def test_a_segmentation_keeps_its_classes_through_a_label_map(tmp_path, reference):
    """With a label map (here BTCV ids -> classes, the JSON's labels in BTCV ids), a segmentation's segments are
    read as the source values of their classes, so the map gives the classes back: the liver stays class 5."""
    btcv = {0: 0, **BTCV_TO_SYNAPSE}
    for kind in ("nii.gz", "seg.nrrd"):
        slices = _slices(_dataset(tmp_path / kind, kind, label_map=btcv), tmp_path / kind / "cache", label_map=btcv)
        for (name, _, label), (_, _, ref_label) in zip(slices, reference):
            np.testing.assert_array_equal(label, ref_label, err_msg=f"{kind} {name}")


def test_an_unknown_segment_stops_the_datalist_naming_it(tmp_path):
    path = _dataset(tmp_path, "nii.gz")
    _, label = phantom(SHAPE, 6)
    bad = vf.write_seg_nrrd(tmp_path / "lab" / "bad.seg.nrrd", label, ROTATED, {"liver": LIVER, "tumour": 1})
    spec = json.loads(path.read_text())
    spec["training"][1]["label"] = bad
    path.write_text(json.dumps(spec))
    with pytest.raises(DatasetError) as info:
        _slices(path, tmp_path / "cache")
    assert "segment 'tumour' is not a class of the model" in str(info.value) and bad in str(info.value)


def test_a_label_of_another_size_names_both_files(tmp_path):
    path = _dataset(tmp_path, "nii.gz")
    _, label = phantom((24, 20, 5), 6)
    small = write_nrrd(tmp_path / "lab" / "small.nrrd", label, ROTATED)
    spec = json.loads(path.read_text())
    spec["training"][1]["label"] = small
    path.write_text(json.dumps(spec))
    with pytest.raises(DatasetError) as info:
        source_datalist("synthetic", None, data_list_file_path=str(path))  # header checks
    text = str(info.value)
    assert small in text and spec["training"][1]["image"] in text and "(24, 20, 5)" in text and "\n" not in text


@pytest.mark.parametrize("kind", ["nii.gz", "nrrd", "seg.nrrd"])
def test_volume_slices_read_every_label_kind(tmp_path, kind):
    """MONAI Label's training pairs (VolumeSlices): a segmentation's liver is class 5 whatever its number in the
    file; image names that hold dots (series UIDs) stay distinct cases."""
    items, shape = [], (28, 28, 6)  # the model's slice size: the cached slices keep the labels as they are
    for case, uid in ((5, "1.2.826.0.1.5"), (6, "1.2.826.0.1.6")):
        image, label = phantom(shape, case)
        items.append({"image": write_nifti(tmp_path / f"{uid}.nii.gz", image, DIAGONAL),
                      "label": _label_file(tmp_path, f"{uid}_label", label, DIAGONAL, kind)})  # fmt: skip
    sliced = VolumeSlices(synapse_source(cache_dir=str(tmp_path / "cache")))(items)
    assert sorted({e["case"] for e in sliced}) == ["1.2.826.0.1.5", "1.2.826.0.1.6"]
    _, label = phantom(shape, 5)
    first = [load_slice_npz(e["label"])["label"] for e in sliced if e["case"] == "1.2.826.0.1.5"]
    np.testing.assert_array_equal(np.stack(first, axis=-1), label)
