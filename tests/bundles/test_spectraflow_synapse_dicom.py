"""The ``spectraflow_synapse_segmentation`` bundle on DICOM series and NRRD / 3D Slicer labels.

``configs/inference.yaml`` segments a folder of DICOM series (one sub-folder each) onto their own grids, writes a
DICOM SEG of each with ``output_format: dicom_seg``, and skips a bad series (two series in one folder, a missing
slice, another modality) in one line naming its folder while the others are written; ``configs/evaluate.yaml``
scores a DICOM series against a 3D Slicer segmentation. Tiny phantom volumes, a 56 x 56 input, a 2-block encoder, a
randomly initialised ``model.pt``.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

pytest.importorskip("pydicom", reason="DICOM series need pydicom (the label extra)")
pytest.importorskip("pydicom_seg", reason="DICOM SEG needs pydicom-seg (the label extra)")
pytest.importorskip("nrrd", reason="NRRD labels need pynrrd (the label extra)")

import pydicom  # noqa: E402

from spectraflow_monai.apps.synapse import SYNAPSE_ORGANS  # noqa: E402
from spectraflow_monai.data.dicom_seg import read_dicom_seg, seg_segment_labels  # noqa: E402
from spectraflow_monai.utils.errors import error_summary  # noqa: E402
from tests.bundles.helpers import error_text, parse_config, run_bundle  # noqa: E402
from tests.data.volume_files import (  # noqa: E402
    DIAGONAL,
    ROTATED,
    organ_segments,
    phantom,
    series_affine,
    write_nifti,
    write_seg_nrrd,
    write_series,
)

CONFIGS = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_synapse_segmentation" / "configs"
TRAIN, EVALUATE, INFERENCE = (str(CONFIGS / f"{n}.yaml") for n in ("train", "evaluate", "inference"))
META = str(CONFIGS / "metadata.json")
NET = {"image_size": 56, "encoder_kwargs": {"depth": 2}}
SHAPE = (32, 28, 6)
pytestmark = pytest.mark.xdist_group("spectraflow_synapse_bundle")


def _model(root: Path) -> None:
    """A random model.pt with its record (class names: the 8 organs), written model.pt first; seeded (some random
    networks predict background only, and a prediction without a class gets no SEG)."""
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    torch.manual_seed(0)
    net = parse_config(INFERENCE, bundle_root=str(root), **NET).get_parsed_content("network_def")
    (root / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), root / "models" / "model.pt")
    write_model_settings(root / "models" / "model.pt", ModelSettings(
        **NET, num_classes=9, out_channels=9, hu_window=(-125.0, 275.0), class_names=list(SYNAPSE_ORGANS),
        nonfinite="error"))  # fmt: skip


def test_inference_segments_dicom_series_onto_their_grids_and_writes_segs(tmp_path):
    root, inputs, out = tmp_path / "b", tmp_path / "ct", tmp_path / "out"
    image, _ = phantom(SHAPE)
    # good series: a swapped-and-flipped geometry with instance numbers running downwards, a plain one
    write_series(inputs / "1.2.826.0.1.10", image, ROTATED, reverse=True)
    write_series(inputs / "1.2.826.0.1.11", image, DIAGONAL)
    # bad series: two series in one folder, a missing slice, an MR series
    write_series(inputs / "mixed", image, DIAGONAL)
    for path in write_series(tmp_path / "second", image[..., :3], DIAGONAL):
        shutil.move(path, inputs / "mixed" / f"b_{os.path.basename(path)}")
    os.remove(write_series(inputs / "gap", image, DIAGONAL)[2])
    write_series(inputs / "mr", image, DIAGONAL, modality="MR")
    write_nifti(inputs / "plain.nii.gz", image, DIAGONAL)  # a NIfTI input: a label, no SEG
    _model(root)
    with pytest.raises(Exception) as info:
        run_bundle(INFERENCE, META, bundle_root=str(root), input_dir=str(inputs), output_dir=str(out),
                   output_format="dicom_seg", **NET)  # fmt: skip
    line, text = error_summary(info.value), error_text(info.value)
    assert line.startswith("error: 3 of 6 input volume(s) could not be read; the outputs of the other 3"), line
    for folder, why in (("mixed", "mixes 2 series"), ("gap", "a slice is missing"), ("mr", "modality MR, not CT")):
        assert f"DICOM series {str(inputs / folder)!r}" in text and why in text, folder
    written = sorted(p.name for p in out.iterdir())
    assert written == ["1.2.826.0.1.10_seg.dcm", "1.2.826.0.1.10_seg.nii.gz", "1.2.826.0.1.11_seg.dcm",
                       "1.2.826.0.1.11_seg.nii.gz", "plain_seg.nii.gz"], written  # fmt: skip
    for name, affine, reverse in (("1.2.826.0.1.10", ROTATED, True), ("1.2.826.0.1.11", DIAGONAL, False)):
        label_file = nib.load(str(out / f"{name}_seg.nii.gz"))
        assert label_file.shape == SHAPE
        np.testing.assert_allclose(label_file.affine, series_affine(affine, SHAPE[2], reverse), atol=1e-4)
        label = np.asanyarray(label_file.dataobj)
        seg_path = out / f"{name}_seg.dcm"
        present = [int(v) for v in np.unique(label) if v]
        assert list(seg_segment_labels(seg_path).values()) == [SYNAPSE_ORGANS[c] for c in present]
        np.testing.assert_array_equal(read_dicom_seg(seg_path, SYNAPSE_ORGANS, series=inputs / name)[0], label)
        seg = pydicom.dcmread(seg_path, stop_before_pixels=True)
        uid = pydicom.dcmread(next((inputs / name).iterdir()), stop_before_pixels=True).SeriesInstanceUID
        assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == uid


def test_a_bad_output_format_is_named_before_any_volume_is_read(tmp_path):
    _model(tmp_path / "b")
    with pytest.raises(Exception) as info:
        run_bundle(INFERENCE, META, bundle_root=str(tmp_path / "b"), input_dir=str(tmp_path / "none"),
                   output_dir=str(tmp_path / "out"), output_format="seg", **NET)  # fmt: skip
    line = error_summary(info.value)
    assert "output_format must be one of ['nifti', 'dicom_seg'], got 'seg'" in line, line
    assert not (tmp_path / "out").exists()


def test_evaluation_scores_a_dicom_series_against_a_slicer_segmentation(tmp_path):
    """A datalist JSON whose test volume is a DICOM series and whose label is a 3D Slicer segmentation (segments in
    reverse class order) evaluates; the label is read by segment name on the series' grid."""
    root, data = tmp_path / "b", tmp_path / "data"
    items = []
    for case in (5, 6, 7):
        image, label = phantom(SHAPE, case)
        write_series(data / f"series_{case}", image, ROTATED, reverse=True)
        lab = write_seg_nrrd(data / f"series_{case}.seg.nrrd", label[..., ::-1], series_affine(ROTATED, 6, True),
                             organ_segments(label))  # fmt: skip
        items.append({"image": f"series_{case}", "label": os.path.basename(lab)})
    (data / "dataset.json").write_text(json.dumps({"training": items[:2], "test": items[2:]}))
    _model(root)
    parser = parse_config([TRAIN, EVALUATE], bundle_root=str(root), data_list_file_path=str(data / "dataset.json"),
                          **NET)  # fmt: skip
    entry = parser.get_parsed_content("evaluate#preprocessing")(parser.get_parsed_content("evaluate#datalist")[0])
    np.testing.assert_array_equal(entry["label"][0].numpy(), label[..., ::-1])  # the classes, in series order
    run_bundle([TRAIN, EVALUATE], META, bundle_root=str(root), data_list_file_path=str(data / "dataset.json"),
               num_workers=0, progress_bar=False, **NET)  # fmt: skip
    with open(root / "eval" / "synapse_per_case.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and {r["case"] for r in rows} == {"series_7"}, rows[:2]
    assert {r["organ"] for r in rows} >= {"liver", "spleen"}, rows
    prediction = nib.load(str(root / "eval" / "predictions" / "series_7_seg.nii.gz"))
    np.testing.assert_allclose(prediction.affine, series_affine(ROTATED, 6, True), atol=1e-4)
