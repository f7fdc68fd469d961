"""Tests of the NaN / infinite voxel checks (spectraflow_monai.transforms.finite)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.transforms import Compose, LoadImaged

from spectraflow_monai.transforms import CheckFinite, CheckFinited, check_finite, count_nonfinite
from spectraflow_monai.utils.errors import DataError


def _patched(as_type):
    x = np.full((1, 6, 6, 4), -100.0, np.float32)
    x[0, 1:3, 1:3, 1] = np.nan  # 4 NaN
    x[0, 5, 5, 3] = np.inf
    return as_type(x)


TYPES = [np.asarray, torch.as_tensor, lambda x: MetaTensor(torch.as_tensor(x), meta={"filename_or_obj": "ct.nii"})]


@pytest.mark.parametrize("as_type", TYPES)
def test_count_and_error(as_type):
    x = _patched(as_type)
    assert count_nonfinite(x) == (4, 1)
    expected = r"'scan\.nii\.gz' holds 5 non-finite voxel\(s\) \(4 NaN, 1 infinite\) out of 144"
    with pytest.raises(DataError, match=expected):
        CheckFinite()(x, "scan.nii.gz")


def test_error_names_the_metatensor_file():
    with pytest.raises(ValueError, match=r"'ct\.nii' holds 5 non-finite"):
        CheckFinite()(_patched(TYPES[2]))


@pytest.mark.parametrize("as_type", TYPES)
def test_replace_keeps_type_and_logs(as_type, caplog):
    x = _patched(as_type)
    with caplog.at_level(logging.WARNING, logger="spectraflow_monai.transforms.finite"):
        out = CheckFinite(mode="replace", value=-1000)(x, "scan.nii.gz")
    assert "'scan.nii.gz': replaced 5 non-finite voxel(s) (4 NaN, 1 infinite) out of 144 with -1000" in caplog.text
    assert type(out) is type(x) and count_nonfinite(out) == (0, 0)
    arr = np.asarray(out)
    assert (arr[0, 1:3, 1:3, 1] == -1000).all() and arr[0, 5, 5, 3] == -1000 and (arr[0, 0] == -100).all()
    assert count_nonfinite(x) == (4, 1)  # the input is left as it was
    if isinstance(x, MetaTensor):
        assert out.meta["filename_or_obj"] == "ct.nii"


def test_finite_and_integer_inputs_pass_unchanged():
    x = np.zeros((2, 3), np.float32)
    assert check_finite(x) is x
    y = torch.arange(6)
    assert CheckFinite()(y) is y and count_nonfinite(y) == (0, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "ignore"}, r"mode must be one of \['error', 'replace'\], got 'ignore'"),
        ({"mode": "replace", "value": float("nan")}, r"value must be a finite number, got nan"),
        ({"value": "air"}, r"value must be a finite number, got 'air'"),
        ({"value": True}, r"value must be a finite number, got True"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CheckFinite(**kwargs)
    with pytest.raises(ValueError, match=match):
        CheckFinited("image", **kwargs)


def test_dictionary_names_file_path_case_or_key():
    x = _patched(np.asarray)
    with pytest.raises(DataError, match=r"'ct\.nii' holds"):
        CheckFinited("image")({"image": _patched(TYPES[2])})
    with pytest.raises(DataError, match=r"'/data/a\.nii' holds"):
        CheckFinited("image")({"image": x, "image_path": "/data/a.nii"})
    with pytest.raises(DataError, match=r"'case 0005 \(image\)' holds"):
        CheckFinited("image")({"image": x, "case": "0005"})
    with pytest.raises(DataError, match=r"'image' holds"):
        CheckFinited("image")({"image": x, "label": x})
    out = CheckFinited(["image", "label"], mode="replace", value=0, allow_missing_keys=True)({"image": x})
    assert np.isfinite(out["image"]).all() and "label" not in out


def test_loaded_nifti_with_nan_patch_is_named(tmp_path):
    nib = pytest.importorskip("nibabel")
    data = np.zeros((8, 8, 4), np.float32)
    data[2:4, 2:4, 1:3] = np.nan
    path = str(tmp_path / "img0009.nii.gz")
    nib.save(nib.Nifti1Image(data, np.eye(4)), path)
    load = Compose([LoadImaged("image", image_only=True), CheckFinited("image")])
    with pytest.raises(Exception) as info:
        load({"image": path})
    chain, exc = [], info.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert any(path in t and "8 non-finite voxel(s) (8 NaN, 0 infinite)" in t for t in chain), chain
