"""Volumes and labels of every kind the bundles read: NIfTI, NRRD, 3D Slicer segmentations (by segment name)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nrrd", reason="NRRD files need pynrrd (the label extra)")

import nrrd  # noqa: E402

from spectraflow_monai.apps.synapse import SYNAPSE_ORGANS  # noqa: E402
from spectraflow_monai.data.volumes import (  # noqa: E402
    VolumeReader,
    canonical_volume,
    check_label_grid,
    read_label_volume,
    volume_format,
    volume_header,
    volume_name,
)
from spectraflow_monai.utils.errors import DatasetError  # noqa: E402
from tests.data.volume_files import (  # noqa: E402
    DIAGONAL,
    ROTATED,
    organ_segments,
    phantom,
    write_nifti,
    write_nrrd,
    write_seg_nrrd,
)

SHAPE = (24, 20, 6)
LIVER = SYNAPSE_ORGANS.index("liver")


def _write(kind, folder, label, affine):
    if kind == "nii.gz":
        return write_nifti(folder / "label.nii.gz", label, affine)
    if kind == "nrrd":
        return write_nrrd(folder / "label.nrrd", label, affine)
    return write_seg_nrrd(folder / "label.seg.nrrd", label, affine, organ_segments(label))


@pytest.mark.parametrize("affine", [DIAGONAL, ROTATED], ids=["diagonal", "rotated"])
@pytest.mark.parametrize("kind", ["nii.gz", "nrrd", "seg.nrrd"])
def test_every_label_kind_reads_the_same_classes_and_geometry(tmp_path, kind, affine):
    """A label written as NIfTI, NRRD or a 3D Slicer segmentation (segments in reverse class order, so that the
    stored values are not the classes) reads back as the same classes on the same grid."""
    _, label = phantom(SHAPE)
    path = _write(kind, tmp_path, label, affine)
    array, read_affine = read_label_volume(path, SYNAPSE_ORGANS)
    np.testing.assert_array_equal(array, label)
    np.testing.assert_allclose(read_affine, affine, atol=1e-5)
    np.testing.assert_allclose(volume_header(path).affine, affine, atol=1e-5)
    assert volume_header(path).shape == SHAPE


@pytest.mark.parametrize("space", ["left-posterior-superior", "right-anterior-superior", None])
def test_nrrd_geometry_is_monais(tmp_path, space):
    """The header-only affine of an NRRD file is MONAI's NrrdReader's (LPS assumed when no space is given)."""
    from monai.data import NrrdReader

    header = {"space directions": np.array([[0.0, 0.8, 0.0], [0.7, 0.0, 0.0], [0.0, 0.0, -2.5]]),
              "space origin": np.array([1.0, 2.0, 3.0])}  # fmt: skip
    header.update({"space": space} if space else {"space dimension": 3})
    path = str(tmp_path / "a.nrrd")
    nrrd.write(path, np.zeros((5, 4, 3), np.uint8), header)
    reader = NrrdReader()
    _, meta = reader.get_data(reader.read(path))
    np.testing.assert_allclose(volume_header(path).affine, meta["affine"])


def test_segments_map_by_name_not_by_number(tmp_path):
    """Segments numbered in another order (liver first, named as 3D Slicer users name them) keep their classes;
    ``values`` give the value each class is written as (here the BTCV ids of a label map's source side)."""
    _, label = phantom(SHAPE)
    segments = {"Liver": LIVER, "Right Kidney": 2, "spleen": 1}
    label = np.where(np.isin(label, list(segments.values())), label, 0).astype(np.uint8)
    path = write_seg_nrrd(tmp_path / "a.seg.nrrd", label, DIAGONAL, segments)
    stored, _ = nrrd.read(path)
    assert int(stored[label == LIVER][0]) == 1  # the liver is segment number 1 in the file
    array, _ = read_label_volume(path, SYNAPSE_ORGANS)
    np.testing.assert_array_equal(array, label)
    btcv = [0, 1, 2, 3, 4, 6, 7, 8, 11]
    array, _ = read_label_volume(path, SYNAPSE_ORGANS, values=btcv)
    assert set(np.unique(array[label == LIVER])) == {6}


def test_a_segment_the_model_does_not_know_is_refused_naming_it(tmp_path):
    _, label = phantom(SHAPE)
    path = write_seg_nrrd(tmp_path / "a.seg.nrrd", label, DIAGONAL, {"liver": LIVER, "tumour": 1})
    with pytest.raises(DatasetError) as info:
        read_label_volume(path, SYNAPSE_ORGANS, case="0007")
    text = str(info.value)
    assert text.startswith("case 0007: segmentation") and "segment 'tumour' is not a class of the model" in text
    assert "liver" in text and path in text


def test_segmentation_problems_are_named(tmp_path):
    _, label = phantom(SHAPE)
    # voxels no segment names
    path = write_seg_nrrd(tmp_path / "a.seg.nrrd", label, DIAGONAL, {"liver": LIVER})
    data, header = nrrd.read(path)
    data[0, 0, 0] = 7
    nrrd.write(path, data, header)
    with pytest.raises(DatasetError, match=r"holds the value\(s\) \[7\] that no segment of its header names"):
        read_label_volume(path, SYNAPSE_ORGANS)
    # two layers (overlapping segments)
    layered = str(tmp_path / "b.seg.nrrd")
    header.update({"kinds": ["list", "domain", "domain", "domain"], "space directions": np.vstack(
        [np.full(3, np.nan), np.diag([-0.8, -0.8, 2.5])])})  # fmt: skip
    nrrd.write(layered, np.stack([data, data]), header)
    with pytest.raises(DatasetError, match="holds 2 layers"):
        read_label_volume(layered, SYNAPSE_ORGANS)
    # a segmentation read without class names
    with pytest.raises(DatasetError, match="no class names were given"):
        read_label_volume(path)


def test_a_label_off_the_image_grid_is_one_line_naming_both_files(tmp_path):
    image, label = phantom(SHAPE)
    img = write_nifti(tmp_path / "img.nii.gz", image, DIAGONAL)
    small = write_nrrd(tmp_path / "small.nrrd", label[:, :, :4], DIAGONAL)
    moved = write_nrrd(tmp_path / "moved.nrrd", label, ROTATED)
    with pytest.raises(DatasetError) as info:
        check_label_grid(volume_header(img), volume_header(small, "label"), case="0001")
    text = str(info.value)
    assert "\n" not in text and img in text and small in text and "(24, 20, 4)" in text and "(24, 20, 6)" in text
    with pytest.raises(DatasetError, match="different affines"):
        check_label_grid(volume_header(img), volume_header(moved, "label"))


def test_names_formats_and_reader_arguments(tmp_path):
    assert volume_name("/d/ct_01.nii.gz") == "ct_01" and volume_name("a.seg.nrrd") == "a"
    (tmp_path / "1.2.840.5").mkdir()
    assert volume_name(tmp_path / "1.2.840.5") == "1.2.840.5" and volume_format(tmp_path / "1.2.840.5") == "dicom"
    assert volume_format("x.NII") == "nifti" and volume_format("x.seg.nrrd") == "nrrd"
    with pytest.raises(DatasetError, match="is not a volume this bundle reads"):
        volume_format("x.png")
    assert not VolumeReader().verify_suffix("x.png") and VolumeReader().verify_suffix(["a.nii.gz", "b.nrrd"])
    with pytest.raises(ValueError, match="kind must be 'image' or 'label'"):
        VolumeReader("mask")
    with pytest.raises(ValueError, match="one value per class"):
        VolumeReader("label", class_names=["a", "b"], values=[0])
    with pytest.raises(DatasetError, match="does not exist"):
        volume_header(tmp_path / "missing.nrrd", "label", case="0002")


def test_canonical_volume_is_nibabels(tmp_path):
    import nibabel as nib

    image, _ = phantom(SHAPE)
    img = nib.Nifti1Image(image, ROTATED)
    ref = nib.as_closest_canonical(img)
    array, affine = canonical_volume(image, ROTATED)
    np.testing.assert_array_equal(array, np.asanyarray(ref.dataobj))
    np.testing.assert_allclose(affine, ref.affine)


def test_missing_pynrrd_is_named(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "nrrd", None)
    (tmp_path / "a.nrrd").write_text("NRRD0004\n")
    with pytest.raises(ImportError, match=r"needs pynrrd: pip install 'spectraflow_monai\[label\]'"):
        volume_header(tmp_path / "a.nrrd")
