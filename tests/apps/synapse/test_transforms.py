"""Tests of the CT window, BTCV label mapping and npz slice loading transforms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import DataLoader, Dataset, MetaTensor
from monai.transforms import Compose, RepeatChanneld

from spectraflow_monai.apps.synapse import (
    CTWindow,
    CTWindowd,
    LoadSynapseSliced,
    MapBTCVLabels,
    MapBTCVLabelsd,
    load_slice_npz,
)

HU = [-1000.0, -125.0, 75.0, 175.0, 275.0, 1000.0]
WINDOWED = [0.0, 0.0, 0.5, 0.75, 1.0, 1.0]  # (x + 125) / 400, clipped


@pytest.mark.parametrize("as_type", [np.asarray, torch.as_tensor, lambda x: MetaTensor(torch.as_tensor(x))])
def test_ct_window_values(as_type):
    out = CTWindow()(as_type(np.array(HU, dtype=np.float32)[None]))
    np.testing.assert_allclose(np.asarray(out)[0], WINDOWED, atol=1e-7)
    assert out.dtype in (np.float32, torch.float32)


def test_ct_window_custom_and_dict():
    np.testing.assert_allclose(CTWindow(a_min=0, a_max=100)(np.array([-5.0, 25.0, 200.0])), [0.0, 0.25, 1.0])
    d = CTWindowd("image")({"image": np.array(HU, dtype=np.float32), "label": np.array([3])})
    np.testing.assert_allclose(d["image"], WINDOWED, atol=1e-7)
    np.testing.assert_array_equal(d["label"], [3])


@pytest.mark.parametrize("a_min, a_max", [(275, -125), (10, 10), (float("nan"), 1.0)])
def test_ct_window_rejects(a_min, a_max):
    with pytest.raises(ValueError, match="a_max must be greater than a_min"):
        CTWindow(a_min, a_max)
    with pytest.raises(ValueError, match="a_max must be greater than a_min"):
        CTWindowd("image", a_min, a_max)


def test_map_btcv_labels_keeps_type_and_meta():
    lab = MetaTensor(torch.arange(14.0).reshape(1, 14), meta={"filename_or_obj": "label0001.nii.gz"})
    out = MapBTCVLabels()(lab)
    assert isinstance(out, MetaTensor) and out.meta["filename_or_obj"] == "label0001.nii.gz"
    assert out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy()[0], [0, 1, 2, 3, 4, 0, 5, 6, 7, 0, 0, 8, 0, 0])
    d = MapBTCVLabelsd()({"image": np.array([11]), "label": np.array([11, 9], dtype=np.uint8)})
    np.testing.assert_array_equal(d["label"], [8, 0])
    np.testing.assert_array_equal(d["image"], [11])
    assert d["label"].dtype == np.uint8


def test_map_btcv_labels_error_names_file():
    lab = MetaTensor(torch.tensor([[0.0, 13.0, 21.0]]), meta={"filename_or_obj": "/data/label0003.nii.gz"})
    with pytest.raises(ValueError, match=r"label0003\.nii\.gz.*\[21\.0\]"):
        MapBTCVLabels()(lab)


@pytest.fixture
def slice_files(tmp_path):
    paths = []
    for k in range(2):
        path = tmp_path / f"case0005_slice{k:03d}.npz"
        image = np.full((6, 7), 0.25 * (k + 1), dtype=np.float32)
        label = np.zeros((6, 7), dtype=np.uint8)
        label[1:3, 2:4] = 5 + k
        np.savez(path, image=image, label=label)
        paths.append(str(path))
    return paths


def test_load_synapse_sliced(slice_files):
    d = LoadSynapseSliced()({"image": slice_files[1], "label": slice_files[1]})
    for key in ("image", "label"):
        assert isinstance(d[key], MetaTensor) and d[key].shape == (1, 6, 7) and d[key].dtype == torch.float32
        assert d[key].meta["case"] == "0005" and d[key].meta["slice"] == 1
        assert d[key].meta["filename_or_obj"] == slice_files[1]
    np.testing.assert_allclose(d["image"].numpy(), 0.5)
    assert d["label"].sum().item() == 4 * 6
    # case / slice from the data dictionary take precedence; dtype None keeps the stored type
    d = LoadSynapseSliced(keys="label", dtype=None)({"label": slice_files[0], "case": "0040", "slice": 9})
    assert d["label"].dtype == torch.uint8 and d["label"].meta["case"] == "0040" and d["label"].meta["slice"] == 9


def test_load_synapse_sliced_fields_mapping(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, ct=np.ones((4, 4), np.float32), seg=np.ones((1, 4, 4), np.uint8))
    d = LoadSynapseSliced(fields={"image": "ct", "label": "seg"})({"image": str(path), "label": str(path)})
    assert d["image"].shape == d["label"].shape == (1, 4, 4)
    assert "case" not in d["image"].meta  # name does not follow caseXXXX_sliceNNN


def test_load_synapse_sliced_errors(tmp_path, slice_files):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        LoadSynapseSliced()({"image": str(tmp_path / "missing.npz"), "label": str(tmp_path / "missing.npz")})
    with pytest.raises(ValueError, match=r"has no array \['seg'\]"):
        LoadSynapseSliced(keys="label", fields={"label": "seg"})({"label": slice_files[0]})
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_slice_npz(bad)
    vol = tmp_path / "vol.npz"
    np.savez(vol, image=np.zeros((3, 4, 4)), label=np.zeros((3, 4, 4)))
    with pytest.raises(ValueError, match=r"must have shape \(H, W\) or \(1, H, W\)"):
        LoadSynapseSliced()({"image": str(vol), "label": str(vol)})
    with pytest.raises(ValueError, match="must be a path"):
        LoadSynapseSliced(keys="image")({"image": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="fields must be a mapping"):
        LoadSynapseSliced(fields=["image"])


def test_pipeline_with_dataloader(slice_files):
    transform = Compose([LoadSynapseSliced(), RepeatChanneld("image", repeats=3)])
    data = [{"image": p, "label": p} for p in slice_files]
    batch = next(iter(DataLoader(Dataset(data, transform), batch_size=2)))
    assert batch["image"].shape == (2, 3, 6, 7) and batch["label"].shape == (2, 1, 6, 7)
    assert list(batch["image"].meta["slice"]) == [0, 1]
    assert list(batch["image"].meta["case"]) == ["0005", "0005"]


def test_bad_slices_and_labels_end_in_one_error_line(tmp_path):
    """An npz without ``label`` and BTCV labels outside 0..13 are data errors: the bundles' excepthook ends the run
    with one ``error:`` line naming the file (not MONAI's ``Failed to evaluate ConfigExpression``)."""
    from spectraflow_monai.apps.synapse import map_btcv_labels
    from spectraflow_monai.utils.errors import error_summary

    path = tmp_path / "case0005_slice000.npz"
    np.savez(path, image=np.ones((4, 4), np.float32))
    with pytest.raises(ValueError) as exc:
        load_slice_npz(path)
    assert (error_summary(exc.value) or "").startswith("error:") and "case0005_slice000.npz" in error_summary(exc.value)
    with pytest.raises(ValueError) as exc:
        map_btcv_labels(np.array([0, 3, 14]), case="0007")
    assert (error_summary(exc.value) or "").startswith("error:") and "0..13" in error_summary(exc.value)
