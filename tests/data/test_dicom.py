"""DICOM series as volumes: the geometry MONAI's reader gives a checked series, and one line per bad series."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("pydicom", reason="DICOM series need pydicom (the label extra)")

from spectraflow_monai.data.dicom import check_dicom_series, write_dicom_series  # noqa: E402
from spectraflow_monai.data.volumes import VolumeReader, read_volume, volume_header  # noqa: E402
from spectraflow_monai.utils.errors import DatasetError  # noqa: E402
from tests.data.volume_files import DIAGONAL, ROTATED, in_series_order, phantom, series_affine, write_series  # noqa: E402

SHAPE = (24, 20, 6)


@pytest.mark.parametrize("affine", [DIAGONAL, ROTATED], ids=["diagonal", "rotated"])
@pytest.mark.parametrize("reverse", [False, True], ids=["instances_up", "instances_down"])
def test_a_series_reads_back_with_its_geometry(tmp_path, affine, reverse):
    """The series' affine (check_dicom_series, header only) is the one MONAI's PydicomReader gives the volume, and
    both are the geometry it was written with (the slice axis flipped when instance numbers run downwards); the
    voxels are the HU values written."""
    image, _ = phantom(SHAPE)
    write_series(tmp_path / "s", image, affine, reverse=reverse)
    expected = series_affine(affine, SHAPE[2], reverse)
    series = check_dicom_series(tmp_path / "s")
    np.testing.assert_allclose(series.affine, expected, atol=1e-4)
    assert series.shape == SHAPE and series.modality == "CT"
    np.testing.assert_allclose(series.spacing, np.linalg.norm(affine[:3, :3], axis=0), rtol=1e-5)
    header = volume_header(tmp_path / "s")
    assert header.format == "dicom" and header.shape == SHAPE
    array, read_affine = read_volume(tmp_path / "s")
    np.testing.assert_allclose(read_affine, expected, atol=1e-4)
    np.testing.assert_array_equal(array, in_series_order(image, reverse).astype(np.float32))


def _mixed(folder, image):
    write_series(folder, image, DIAGONAL)
    write_series(folder / "other", image[..., :3], DIAGONAL)
    for name in os.listdir(folder / "other"):
        shutil.move(str(folder / "other" / name), str(folder / f"other_{name}"))


def _missing_slice(folder, image):
    files = write_series(folder, image, DIAGONAL)
    os.remove(files[3])


def _mr(folder, image):
    write_series(folder, image, DIAGONAL, modality="MR")


def _shuffled_numbers(folder, image):
    write_dicom_series(image, DIAGONAL, folder, instance_numbers=[1, 3, 2, 4, 5, 6])


def _empty(folder, image):
    folder.mkdir()
    (folder / "notes.txt").write_text("not dicom")


@pytest.mark.parametrize(
    "make, problem",
    [
        (_mixed, "mixes 2 series"),
        (_missing_slice, "uneven slice spacing (5 mm between"),
        (_mr, "has the modality MR, not CT"),
        (_shuffled_numbers, "InstanceNumber order does not follow the slice positions"),
        (_empty, "holds no DICOM file"),
    ],
    ids=["mixed", "missing_slice", "mr", "order", "empty"],
)
def test_a_bad_series_is_one_line_naming_the_folder(tmp_path, make, problem):
    image, _ = phantom(SHAPE)
    folder = tmp_path / "series_1"
    make(folder, image)
    with pytest.raises(DatasetError) as info:
        check_dicom_series(folder)
    text = str(info.value)
    assert "\n" not in text and f"DICOM series {str(folder)!r}" in text and problem in text, text
    reader = VolumeReader()
    with pytest.raises(DatasetError, match="DICOM series"):
        reader.get_data(reader.read(folder))


def test_check_dicom_series_takes_a_list_of_files_and_any_modality(tmp_path):
    image, _ = phantom(SHAPE)
    files = write_series(tmp_path / "s", image, DIAGONAL, modality="MR")
    assert check_dicom_series(files, modality=None).files == tuple(files)
    with pytest.raises(ValueError, match="modality must be None or one of"):
        check_dicom_series(files, modality="XA")


def test_missing_pydicom_is_named(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "pydicom", None)
    with pytest.raises(ImportError, match=r"needs pydicom: pip install 'spectraflow_monai\[label\]'"):
        check_dicom_series(tmp_path)
