"""DICOM SEG written from a label on its series (segments named by class) and read back by segment label, onto the
series, a volume file on its grid, or from a SEG that another tool (dcmqi) wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

pytest.importorskip("pydicom", reason="DICOM SEG needs pydicom (the label extra)")
pytest.importorskip("pydicom_seg", reason="DICOM SEG needs pydicom-seg (the label extra)")

import pydicom  # noqa: E402
import pydicom_seg  # noqa: E402

from spectraflow_monai.apps.synapse import SYNAPSE_ORGANS  # noqa: E402
from spectraflow_monai.data.dicom import check_dicom_series  # noqa: E402
from spectraflow_monai.data.dicom_seg import read_dicom_seg, seg_segment_labels, write_dicom_seg  # noqa: E402
from spectraflow_monai.data.volumes import canonical_volume  # noqa: E402
from spectraflow_monai.utils.errors import DataError, DatasetError  # noqa: E402
from tests.data.volume_files import (  # noqa: E402
    DIAGONAL,
    ROTATED,
    in_series_order,
    phantom,
    write_nifti,
    write_nrrd,
    write_series,
)

SHAPE = (24, 20, 6)
LIVER = SYNAPSE_ORGANS.index("liver")


def _series(tmp_path, affine=ROTATED, reverse=True):
    image, label = phantom(SHAPE)
    write_series(tmp_path / "series", image, affine, reverse=reverse)
    return check_dicom_series(tmp_path / "series"), in_series_order(label, reverse)


@pytest.mark.parametrize("affine", [DIAGONAL, ROTATED], ids=["diagonal", "rotated"])
@pytest.mark.parametrize("reverse", [False, True], ids=["instances_up", "instances_down"])
def test_a_seg_names_the_classes_present_holds_the_label_and_references_the_series(tmp_path, affine, reverse):
    series, label = _series(tmp_path, affine, reverse)
    label = np.where(np.isin(label, [1, LIVER, 8]), label, 0).astype(np.uint8)  # spleen, liver, pancreas
    path = write_dicom_seg(label, series.folder, SYNAPSE_ORGANS, tmp_path / "out" / "case_seg.dcm")
    ds = pydicom.dcmread(path)
    assert ds.Modality == "SEG" and ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.4"
    # one segment per class present, numbered 1..n, labelled with the class name
    assert seg_segment_labels(ds) == {1: "spleen", 2: "liver", 3: "pancreas"}
    liver = next(s for s in ds.SegmentSequence if s.SegmentLabel == "liver")
    assert liver.SegmentedPropertyTypeCodeSequence[0].CodeValue == "10200004"
    # it references the series and its slices
    assert ds.ReferencedSeriesSequence[0].SeriesInstanceUID == series.series_uid
    assert ds.StudyInstanceUID == series.study_uid
    slices = {pydicom.dcmread(f, stop_before_pixels=True).SOPInstanceUID for f in series.files}
    referenced = {r.ReferencedSOPInstanceUID for r in ds.ReferencedSeriesSequence[0].ReferencedInstanceSequence}
    assert referenced and referenced <= slices
    # the pixel data, read with pydicom-seg, on the series' grid
    result = pydicom_seg.SegmentReader().read(ds)
    assert sorted(result.available_segments) == [1, 2, 3]
    back, back_affine = read_dicom_seg(path, SYNAPSE_ORGANS, series=series.folder)
    np.testing.assert_array_equal(back, label)
    np.testing.assert_allclose(back_affine, series.affine, atol=1e-4)


def test_a_label_with_its_own_affine_is_put_on_the_series_grid(tmp_path):
    """A label in another axis order (RAS canonical, as a MetaTensor carries it) is written on the series' grid."""
    from monai.data import MetaTensor

    series, label = _series(tmp_path)
    canonical, affine = canonical_volume(label, series.affine)
    assert canonical.shape != label.shape or not np.array_equal(canonical, label)
    tensor = MetaTensor(canonical[None], affine=affine)
    path = write_dicom_seg(tensor, series, SYNAPSE_ORGANS, tmp_path / "a.dcm")
    np.testing.assert_array_equal(read_dicom_seg(path, SYNAPSE_ORGANS, series=series)[0], label)


def test_reading_back_goes_by_segment_label_not_number(tmp_path):
    """Spleen and liver only: the liver is segment 2 in the SEG, and comes back as class 5 (liver), not 2; with
    ``values`` as the value of a label map's source side."""
    series, label = _series(tmp_path)
    label = np.where(np.isin(label, [1, LIVER]), label, 0).astype(np.uint8)
    path = write_dicom_seg(label, series, SYNAPSE_ORGANS, tmp_path / "a.dcm")
    assert seg_segment_labels(path) == {1: "spleen", 2: "liver"}
    back, _ = read_dicom_seg(path, SYNAPSE_ORGANS, series=series)
    assert set(np.unique(back[label == LIVER])) == {LIVER}
    back, _ = read_dicom_seg(path, SYNAPSE_ORGANS, series=series, values=[0, 1, 2, 3, 4, 6, 7, 8, 11])
    assert set(np.unique(back[label == LIVER])) == {6}
    with pytest.raises(DatasetError, match="segment 2 'liver' is not a class of the model"):
        read_dicom_seg(path, ["background", "spleen", "kidney"], series=series)


@pytest.mark.parametrize("kind", ["nifti", "nrrd"])
def test_reading_back_onto_a_volume_file_takes_its_voxel_order(tmp_path, kind):
    """The grid may be a volume file on the series' grid in another voxel order (the series converted to NIfTI, as
    the MONAI Label app keeps it): the classes come back in that file's order, with its affine."""
    pytest.importorskip("nrrd", reason="NRRD needs pynrrd (the label extra)")
    series, label = _series(tmp_path)
    label = np.where(np.isin(label, [1, LIVER]), label, 0).astype(np.uint8)
    path = write_dicom_seg(label, series, SYNAPSE_ORGANS, tmp_path / "a.dcm")
    canonical, affine = canonical_volume(label, series.affine)
    assert canonical.shape != label.shape
    write, name = (write_nifti, "grid.nii.gz") if kind == "nifti" else (write_nrrd, "grid.nrrd")
    grid = write(tmp_path / name, np.zeros(canonical.shape, np.int16), affine)
    back, back_affine = read_dicom_seg(path, SYNAPSE_ORGANS, series=grid)
    np.testing.assert_array_equal(back, canonical)
    np.testing.assert_allclose(back_affine, affine, atol=1e-4)


def _dcmqi_tool() -> str:
    tool = shutil.which("itkimage2segimage")
    if tool is None:
        dcmqi = pytest.importorskip("dcmqi", reason="dcmqi (itkimage2segimage) is not installed (the label extra)")
        tool = os.path.join(os.path.dirname(dcmqi.__file__), "bin", "itkimage2segimage")
    if not os.path.isfile(tool):
        pytest.skip("dcmqi's itkimage2segimage is not installed (the label extra)")
    return tool


def test_a_seg_of_another_tool_reads_back_by_segment_label(tmp_path):
    """A SEG written by dcmqi (MONAI Label's and 3D Slicer's converter) with its own spelling of the names: the liver,
    segment 2 there, comes back as the liver class (5)."""
    series, label = _series(tmp_path, DIAGONAL, reverse=False)
    label = np.where(np.isin(label, [1, LIVER]), label, 0).astype(np.uint8)
    nifti = write_nifti(tmp_path / "label.nii.gz", label, series.affine)
    code = {"CodeValue": "91723000", "CodingSchemeDesignator": "SCT", "CodeMeaning": "Anatomical Structure"}
    segments = [{"labelID": value, "SegmentLabel": name, "SegmentDescription": name, "SegmentAlgorithmType": "MANUAL",
                 "SegmentedPropertyCategoryCodeSequence": code, "SegmentedPropertyTypeCodeSequence": code,
                 "recommendedDisplayRGBValue": [200, 100, 50]} for value, name in ((LIVER, "Liver"), (1, "SPLEEN"))]
    meta = {"ContentCreatorName": "tool", "ClinicalTrialSeriesID": "1", "ClinicalTrialTimePointID": "1",
            "SeriesDescription": "another tool", "SeriesNumber": "301", "InstanceNumber": "1",
            "segmentAttributes": [segments], "ContentLabel": "SEGMENTATION", "ContentDescription": "tool",
            "ClinicalTrialCoordinatingCenterName": "tool", "BodyPartExamined": ""}  # fmt: skip
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "dcmqi.dcm"
    done = subprocess.run([_dcmqi_tool(), "--inputImageList", nifti, "--inputDICOMDirectory", str(series.folder),
                           "--outputDICOM", str(out), "--inputMetadata", str(tmp_path / "meta.json")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and out.is_file(), done.stdout + done.stderr
    assert seg_segment_labels(out) == {1: "SPLEEN", 2: "Liver"}  # dcmqi numbers the segments 1, 2, ...
    back, _ = read_dicom_seg(out, SYNAPSE_ORGANS, series=series)
    np.testing.assert_array_equal(back, label)


def test_refused_labels_name_the_file(tmp_path):
    series, label = _series(tmp_path)
    out = str(tmp_path / "a.dcm")
    with pytest.raises(DataError, match=r"has shape \(24, 20, 5\) but the series"):
        write_dicom_seg(label[..., :5], series, SYNAPSE_ORGANS, out)
    with pytest.raises(DataError, match=r"holds values \[9\] that are no class"):
        write_dicom_seg(np.where(label > 0, 9, 0), series, SYNAPSE_ORGANS, out)
    with pytest.raises(DataError, match="holds no class but background"):
        write_dicom_seg(np.zeros_like(label), series, SYNAPSE_ORGANS, out)
    moved = np.asarray(series.affine).copy()
    moved[0, 3] += 5.0
    with pytest.raises(DataError, match="is not on the grid of the series"):
        write_dicom_seg(label, series, SYNAPSE_ORGANS, out, affine=moved)
    with pytest.raises(DatasetError, match="is not a DICOM SEG"):
        read_dicom_seg(series.files[0], SYNAPSE_ORGANS)


def test_missing_pydicom_seg_is_named(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "pydicom_seg", None)
    with pytest.raises(ImportError, match=r"needs pydicom-seg: pip install 'spectraflow_monai\[label\]'"):
        write_dicom_seg(np.zeros((2, 2, 2)), tmp_path, SYNAPSE_ORGANS, tmp_path / "a.dcm")
