"""Tests of the Synapse bundle's config components: the settings it derives (layout, validation cases, slice cache,
non-finite replacements, spacing), the evaluation pieces chosen by layout (volume loading, postprocessing, writer,
volume metrics) and the checked inference datalist. Each one replaces a config expression; the values are those the
expressions gave."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.bundle import ConfigParser
from monai.transforms import Compose, Identityd

from spectraflow_monai.apps.synapse import (
    LAYOUTS,
    ORGAN_DISPLAY_NAMES,
    PAPER_ORGAN_ORDER,
    SYNAPSE_ORGANS,
    SYNAPSE_TEST_CASES,
    SYNAPSE_TRAIN_CASES,
    default_val_cases,
    VolumeInferenceSettings,
    prediction_writer,
    series_seg_writer,
    slice_cache_dir,
    slice_nonfinite_value,
    synapse_inference_datalist,
    synapse_layout,
    volume_loading,
    volume_metrics_handler,
    volume_nonfinite_value,
    volume_postprocessing,
)
from spectraflow_monai.data import DatasetError
from spectraflow_monai.handlers import SPACING_UNITS_KEY, VolumeMetricsHandler
from spectraflow_monai.transforms import SaveLabelValuesd
from spectraflow_monai.utils.errors import SettingError

JSON = "/data/own/dataset.json"


# ---------------------------------------------------------------- derived settings
@pytest.mark.parametrize(
    "dataset, data_list_file_path, expected",
    [
        ("synthetic", None, "raw"),
        ("btcv", None, "raw"),
        ("transunet", None, "transunet"),
        ("TransUNet", None, "transunet"),
        ("transunet", JSON, "raw"),  # a datalist JSON lists NIfTI volumes, whatever `dataset` says
        ("anything", JSON, "raw"),
    ],
)
def test_synapse_layout(dataset, data_list_file_path, expected):
    assert synapse_layout(dataset, data_list_file_path) == expected
    assert expected in LAYOUTS


@pytest.mark.parametrize("fn", [synapse_layout, default_val_cases])
@pytest.mark.parametrize("dataset", ["kvasir", None, 3])
def test_derived_settings_name_a_bad_dataset(fn, dataset):
    expected = r"dataset must be one of \['synthetic', 'btcv', 'transunet'\], got " + re.escape(repr(dataset))
    with pytest.raises(SettingError, match=expected):
        fn(dataset)


@pytest.mark.parametrize(
    "dataset, data_list_file_path, expected",
    [("synthetic", None, [40]), ("btcv", None, [39, 40]), ("transunet", None, [39, 40]), ("btcv", JSON, None)],
)
def test_default_val_cases(dataset, data_list_file_path, expected):
    cases = default_val_cases(dataset, data_list_file_path)
    assert cases == expected
    if cases is not None:  # held-out training cases, never test cases, and a new list each call
        assert set(cases) < set(SYNAPSE_TRAIN_CASES) and not set(cases) & set(SYNAPSE_TEST_CASES)
        cases.append(1)
        assert default_val_cases(dataset, data_list_file_path) == expected


@pytest.mark.parametrize(
    "bundle_root, dataset, image_size, data_list_file_path, expected",
    [
        (".", "synthetic", 224, None, os.path.join(".", "cache", "synthetic_224")),
        ("/b", "btcv", 56, None, os.path.join("/b", "cache", "btcv_56")),
        ("/b", "synthetic", 28, JSON, os.path.join("/b", "cache", "datalist_dataset_28")),
        (Path("/b"), "btcv", 28, Path("/d/own.v2.json"), os.path.join("/b", "cache", "datalist_own_28")),
    ],
)
def test_slice_cache_dir(bundle_root, dataset, image_size, data_list_file_path, expected):
    assert slice_cache_dir(bundle_root, dataset, image_size, data_list_file_path) == expected


@pytest.mark.parametrize(
    "args, match",
    [
        ((None, "btcv", 224), "bundle_root must be a folder path, got None"),
        ((".", None, 224), "dataset must be the name of a data set, got None"),
        ((".", "", 224), "dataset must be the name of a data set, got ''"),
    ],
)
def test_slice_cache_dir_names_a_bad_setting(args, match):
    with pytest.raises(SettingError, match=match):
        slice_cache_dir(*args)


@pytest.mark.parametrize(
    "nonfinite_value, layout, hu_window, expected",
    [
        (None, "raw", [-125.0, 275.0], -125.0),  # black after windowing: the window's lower bound in HU
        (None, "raw", (-1000, 400), -1000.0),
        (None, "transunet", None, 0.0),  # TransUNet's volumes are in [0, 1] already
        (-500.0, "raw", [-125.0, 275.0], -500.0),
        (0.25, "transunet", None, 0.25),
    ],
)
def test_volume_nonfinite_value(nonfinite_value, layout, hu_window, expected):
    assert volume_nonfinite_value(nonfinite_value, layout, hu_window) == expected


@pytest.mark.parametrize(
    "nonfinite_value, layout, expected",
    [(None, "raw", 0.0), (-500.0, "raw", 0.0), (None, "transunet", 0.0), (0.25, "transunet", 0.25)],
)
def test_slice_nonfinite_value(nonfinite_value, layout, expected):
    # the slice cache of NIfTI volumes is windowed (and checked) already: 0; train_npz slices: the value given
    assert slice_nonfinite_value(nonfinite_value, layout) == expected


@pytest.mark.parametrize(
    "call",
    [
        lambda layout: volume_nonfinite_value(None, layout, [-125, 275]),
        lambda layout: slice_nonfinite_value(None, layout),
        lambda layout: volume_loading({"raw": [], "transunet": []}, layout),
    ],
)
@pytest.mark.parametrize("layout", ["h5", None, "RAW"])
def test_layout_users_name_a_bad_layout(call, layout):
    with pytest.raises(SettingError, match=rf"layout must be one of \['raw', 'transunet'\], got {layout!r}"):
        call(layout)


@pytest.mark.parametrize("hu_window", [None, "abc", [1.0]])
def test_volume_nonfinite_value_needs_a_window_in_hu(hu_window):
    with pytest.raises(SettingError, match=r"hu_window must be \[a_min, a_max\].*got " + re.escape(repr(hu_window))):
        volume_nonfinite_value(None, "raw", hu_window)
    assert volume_nonfinite_value(3.0, "raw", hu_window) == 3.0  # not needed when a value is given


# ---------------------------------------------------------------- evaluation pieces
@pytest.mark.parametrize("layout", LAYOUTS)
def test_volume_loading_picks_the_layout(layout):
    loading = {name: [Identityd(keys=name)] for name in LAYOUTS}
    composed = volume_loading(loading, layout)
    assert isinstance(composed, Compose) and composed.transforms == tuple(loading[layout])


def test_volume_loading_names_a_missing_entry():
    expected = r"volume_loading has no entry for the layout 'transunet' \(entries: \['raw'\]\)"
    with pytest.raises(SettingError, match=expected):
        volume_loading({"raw": []}, "transunet")


@pytest.mark.parametrize("save", [True, False])
def test_volume_postprocessing(save):
    steps, writer = [Identityd(keys="pred"), Identityd(keys="pred")], Identityd(keys="pred")
    composed = volume_postprocessing(steps, writer, save)
    assert list(composed.transforms) == steps + ([writer] if save else [])


@pytest.mark.parametrize(
    "writer, save, match",
    [
        (None, True, "save_predictions is true but no prediction writer was given"),
        (Identityd(keys="pred"), "false", "save_predictions must be true or false, got 'false'"),
    ],
)
def test_volume_postprocessing_names_a_bad_setting(writer, save, match):
    with pytest.raises(SettingError, match=match):
        volume_postprocessing([], writer, save)


@pytest.mark.parametrize("values", [None, [0, 3, 7]])
def test_prediction_writer_writes_uint8_nifti_with_the_values(tmp_path, values):
    writer = prediction_writer(str(tmp_path), values, print_log=False)
    assert isinstance(writer, SaveLabelValuesd)
    pred = torch.zeros(1, 6, 5, 4)
    pred[0, 1:3, 1:3, 1:3], pred[0, 4, 4, 3] = 1, 2
    from monai.data import MetaTensor

    meta = {"filename_or_obj": "/in/img0001.nii.gz", "affine": torch.diag(torch.tensor([0.8, 0.8, 2.5, 1.0]))}
    writer({"pred": MetaTensor(pred, affine=meta["affine"], meta=meta)})
    out = nib.load(str(tmp_path / "img0001_seg.nii.gz"))
    assert os.listdir(tmp_path) == ["img0001_seg.nii.gz"] and out.get_data_dtype() == np.uint8
    data = np.asarray(out.dataobj)
    expected = pred[0].numpy().astype(np.uint8) if values is None else np.asarray(values, np.uint8)[pred[0].long()]
    np.testing.assert_array_equal(data, expected)
    np.testing.assert_allclose(out.affine, np.diag([0.8, 0.8, 2.5, 1.0]))


@pytest.mark.parametrize("output_dir", [None, "", 3])
def test_prediction_writer_names_a_bad_folder(output_dir):
    with pytest.raises(SettingError, match=rf"output_dir must be a folder path, got {output_dir!r}"):
        prediction_writer(output_dir)


def test_series_seg_writer_reads_the_inference_settings(tmp_path):
    from spectraflow_monai.apps.synapse import SaveDicomSegd

    names = ["background", *SYNAPSE_ORGANS]
    nifti = VolumeInferenceSettings(input_dir=str(tmp_path), output_dir=str(tmp_path / "out"))
    assert isinstance(series_seg_writer(nifti, names), Identityd)  # nifti: the label NIfTI only
    seg = series_seg_writer(nifti.replace(output_format="dicom_seg"), names)
    assert isinstance(seg, SaveDicomSegd) and seg.output_dir == str(tmp_path / "out") and seg.class_names == names
    with pytest.raises(SettingError, match="settings must be a VolumeInferenceSettings, got dict"):
        series_seg_writer({"output_format": "dicom_seg"}, names)


def test_volume_metrics_handler(tmp_path):
    handler = volume_metrics_handler(str(tmp_path), 9, list(SYNAPSE_ORGANS))
    assert isinstance(handler, VolumeMetricsHandler) and handler.spacing == "meta"
    assert handler.table_args == (9, list(SYNAPSE_ORGANS), list(PAPER_ORGAN_ORDER), dict(ORGAN_DISPLAY_NAMES))
    other = volume_metrics_handler(str(tmp_path), 3, ["background", "a", "b"], order="class")
    assert other.table_args[2] == "class"
    from monai.data import MetaTensor

    # each label's spacing from its affine (a NIfTI volume's, in mm); TransUNet's h5 volumes carry no geometry and
    # say so (LoadSynapseH5d): unit spacing, HD95 in voxels, as TransUNet scores them
    nifti = MetaTensor(torch.zeros(1, 4, 4, 2), affine=torch.diag(torch.tensor([0.8, 0.7, 2.5, 1.0])))
    assert handler._spacing(nifti, "0001") == pytest.approx((0.8, 0.7, 2.5))
    assert handler._spacing(MetaTensor(torch.zeros(1, 4, 4, 2)), "0002") == pytest.approx((1.0, 1.0, 1.0))
    h5 = MetaTensor(torch.zeros(1, 4, 4, 2), meta={SPACING_UNITS_KEY: "voxels"})
    assert handler._spacing(h5, "0003") is None


# ---------------------------------------------------------------- the checked inference datalist
def _volume(path: Path, shape=(8, 8, 3)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.zeros(shape, np.int16), np.eye(4)), str(path))
    return str(path)


def test_inference_datalist_checks_every_volume(tmp_path):
    a, b = _volume(tmp_path / "ct" / "a.nii.gz"), _volume(tmp_path / "ct" / "b.nii")
    expected = [{"image": a}, {"image": b}]
    assert synapse_inference_datalist(str(tmp_path / "ct"), check_volumes=True, require_any=True) == expected
    flat = _volume(tmp_path / "ct" / "c.nii.gz", shape=(8, 8))
    assert len(synapse_inference_datalist(str(tmp_path / "ct"))) == 3  # unchecked: listed
    with pytest.raises(DatasetError, match=rf"{flat}.* is 2D or not a volume"):
        synapse_inference_datalist(str(tmp_path / "ct"), check_volumes=True)


def test_inference_datalist_requires_a_volume(tmp_path, monkeypatch):
    import spectraflow_monai.apps.synapse.datalist as datalist

    (tmp_path / "ct").mkdir()
    with pytest.raises(DatasetError, match=r"no image matches '\*\.nii\*' in .*ct"):
        synapse_inference_datalist(str(tmp_path / "ct"), require_any=True)
    # a JSON's empty `test` list (read_decathlon_datalist refuses one; a stand-in reader gives it here)
    monkeypatch.setattr(datalist, "read_decathlon_datalist", lambda *args: {"training": [], "test": []})
    json_path = str(tmp_path / "own.json")
    assert synapse_inference_datalist(None, data_list_file_path=json_path) == []
    with pytest.raises(FileNotFoundError, match=r"no volume to segment in the 'test' list of .*own\.json"):
        synapse_inference_datalist(None, data_list_file_path=json_path, require_any=True)


# ---------------------------------------------------------------- as config components (no pydoc.locate pitfall)
def test_components_resolve_from_a_config(tmp_path):
    config = {
        "dataset": "transunet",
        "data_list_file_path": None,
        "layout": {"_target_": "spectraflow_monai.apps.synapse.synapse_layout", "dataset": "@dataset",
                   "data_list_file_path": "@data_list_file_path"},  # fmt: skip
        "val_cases": {"_target_": "spectraflow_monai.apps.synapse.default_val_cases", "dataset": "@dataset"},
        "cache_dir": {"_target_": "spectraflow_monai.apps.synapse.slice_cache_dir", "bundle_root": str(tmp_path),
                      "dataset": "@dataset", "image_size": 56},  # fmt: skip
        "volume": {"_target_": "spectraflow_monai.apps.synapse.volume_nonfinite_value", "nonfinite_value": None,
                   "layout": "@layout", "hu_window": [-125, 275]},  # fmt: skip
        "slice": {"_target_": "spectraflow_monai.apps.synapse.slice_nonfinite_value", "nonfinite_value": 0.5,
                  "layout": "@layout"},  # fmt: skip
    }
    parser = ConfigParser(config)
    assert parser.get_parsed_content("layout") == "transunet"
    assert parser.get_parsed_content("val_cases") == [39, 40]
    assert parser.get_parsed_content("cache_dir") == os.path.join(str(tmp_path), "cache", "transunet_56")
    assert parser.get_parsed_content("volume") == 0.0 and parser.get_parsed_content("slice") == 0.5
