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
