import os
import re

import numpy as np
import pytest
import torch

from spectraflow_monai.utils import SettingError, check_image_size
from spectraflow_monai.utils.settings import RunSettings


@pytest.mark.parametrize("value", [224, 14, 56, np.int64(448)])
def test_valid_image_sizes(value):
    assert check_image_size(value) == int(value) and type(check_image_size(value)) is int


@pytest.mark.parametrize("value", ["abc", "224", 0, -14, 100, 224.0, True, None, [224]])
def test_invalid_image_size_names_setting_and_value(value):
    with pytest.raises(SettingError, match="image_size must be a positive int multiple of 14") as e:
        check_image_size(value)
    assert repr(value) in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="stage1_size"):
        check_image_size(value, name="stage1_size")


# RunSettings checks every field where it is built (nothing is left to the code that reads it)
@pytest.mark.parametrize(
    "field, value, error",
    [
        ("device", "gpu", "device must be a torch device"),
        ("device", 0.5, "device must be a torch device"),
        ("cache_device", "gpu", "cache_device must be one of"),
        ("distance_backend", "fast", "distance_backend must be one of"),
        ("resume", "maybe", "resume must be true or false, got 'maybe'"),
        ("resume", 2, "resume must be true or false"),
        ("resume_from", "/no/such/checkpoint.pt", "resume_from: '/no/such/checkpoint.pt' is not an existing"),
        ("resume_from", 3, "resume_from must be a path"),
        ("dataset_dir", 3, "dataset_dir must be a path, got 3"),
        ("cache_dir", "", "cache_dir must be a path, got ''"),
        ("log_dir", None, "log_dir must be a path"),
        ("precision", "fp8", "precision must be one of"),
        ("num_workers", -1, "num_workers must be an int"),
    ],
)
def test_run_settings_refuse_a_bad_value_naming_it(field, value, error):
    with pytest.raises(SettingError, match=re.escape(error)):
        RunSettings(**{field: value})


@pytest.mark.parametrize("value, expected", [(True, True), ("false", False), ("True", True), (0, False), ("no", False)])
def test_run_settings_make_resume_a_bool_once(value, expected):
    assert RunSettings(resume=value).resume is expected


def test_run_settings_read_paths_and_devices(tmp_path):
    checkpoint = tmp_path / "checkpoint_epoch=1.pt"
    checkpoint.write_bytes(b"x")
    run = RunSettings(device=torch.device("cpu"), resume_from=checkpoint, dataset_dir=tmp_path, cache_dir=tmp_path)
    assert run.resume_from == str(checkpoint) and run.dataset_dir == run.cache_dir == str(tmp_path)
    assert RunSettings(resume_from="").resume_from is None and RunSettings(device="cuda:1").device == "cuda:1"
    assert run.to_dict()["device"] == "cpu"


# ---------------------------------------------------------------- what an inference run segments and writes
def _inference_classes():
    from spectraflow_monai.apps.seg2d import ImageInferenceSettings
    from spectraflow_monai.apps.synapse import VolumeInferenceSettings

    return {"2d": ImageInferenceSettings, "synapse": VolumeInferenceSettings}


@pytest.mark.parametrize("bundle", ["2d", "synapse"])
@pytest.mark.parametrize(
    "values, error",
    [
        ({}, r"give input_dir \(a folder of inputs\) or data_list_file_path \(a datalist JSON\)"),
        ({"input_dir": ""}, "give input_dir"),
        ({"input_dir": 3}, "input_dir must be a path, got 3"),
        ({"input_dir": "/in", "input_pattern": ""}, "input_pattern must be a glob pattern such as '\\*.png', got ''"),
        ({"input_dir": "/in", "output_dir": ""}, "output_dir must be a path, got ''"),
        ({"data_list_file_path": "/d.json", "dataset_dir": ["/x"]}, r"dataset_dir must be a path, got \['/x'\]"),
    ],
)
def test_inference_settings_refuse_a_bad_value_naming_it(bundle, values, error):
    with pytest.raises(SettingError, match=error):
        _inference_classes()[bundle](**values)


@pytest.mark.parametrize(
    "bundle, values, error",
    [
        ("2d", {"output_ext": ".jpg"}, r"output_ext must be one of \['.png', '.tif', '.tiff'\], got '.jpg'"),
        ("synapse", {"output_format": "seg"}, r"output_format must be one of \['nifti', 'dicom_seg'\], got 'seg'"),
    ],
)
def test_inference_settings_of_each_bundle_check_their_outputs(bundle, values, error):
    with pytest.raises(SettingError, match=error):
        _inference_classes()[bundle](input_dir="/in", **values)


@pytest.mark.parametrize("bundle, name, expected", [("2d", "a.png", ["a.png"]), ("synapse", "a.nii.gz", ["a.nii.gz"])])
def test_inference_settings_list_their_inputs(tmp_path, bundle, name, expected):
    from PIL import Image

    if bundle == "2d":
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / name)
    else:
        import nibabel as nib

        nib.save(nib.Nifti1Image(np.zeros((4, 4, 3), np.int16), np.eye(4)), str(tmp_path / name))
    (tmp_path / "notes.txt").write_text("not an input")
    settings = _inference_classes()[bundle](input_dir=tmp_path, output_dir=tmp_path / "out")
    assert settings.input_dir == str(tmp_path) and settings.output_dir == str(tmp_path / "out")
    found = settings.inputs()
    assert [os.path.basename(f if isinstance(f, str) else f["image"]) for f in found] == expected
    with pytest.raises((FileNotFoundError, SettingError, ValueError), match="no image matches"):
        _inference_classes()[bundle](input_dir=tmp_path, input_pattern="*.zzz").inputs()
