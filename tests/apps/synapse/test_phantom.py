"""Tests of the synthetic Synapse-like CT phantom."""

from __future__ import annotations

import sys

import nibabel as nib
import numpy as np
import pytest

from spectraflow_monai.apps.synapse import BTCV_TO_SYNAPSE, generate_synthetic_ct, main, synthetic_ct_volume

TINY = (32, 32, 8)
ORGAN_IDS = set(BTCV_TO_SYNAPSE)  # BTCV ids of the 8 Synapse organs


def _read(root, sub, case):
    img = nib.load(str(root / "RawData" / "Training" / sub / f"{sub}{case}.nii.gz"))
    return np.asanyarray(img.dataobj), img


def test_volume_is_deterministic_per_case_and_seed():
    a_img, a_lbl = synthetic_ct_volume(5, shape=TINY, seed=0)
    b_img, b_lbl = synthetic_ct_volume("0005", shape=TINY, seed=0)
    np.testing.assert_array_equal(a_img, b_img)
    np.testing.assert_array_equal(a_lbl, b_lbl)
    c_img, _ = synthetic_ct_volume(5, shape=TINY, seed=1)
    d_img, _ = synthetic_ct_volume(6, shape=TINY, seed=0)
    assert not np.array_equal(a_img, c_img)
    assert not np.array_equal(a_img, d_img)
    assert a_img.dtype == np.int16 and a_lbl.dtype == np.uint8 and a_img.shape == TINY


def test_default_phantom_labels_intensities_and_anatomy():
    image, label = synthetic_ct_volume(5)
    ids = set(np.unique(label).tolist())
    assert ORGAN_IDS <= ids  # every Synapse organ is present
    assert {5, 9} <= ids  # esophagus and IVC: distractors that map to background
    assert ids <= set(range(14))
    assert abs(float(image[0, 0].mean()) + 1000) < 10  # air outside the body
    for btcv_id, hu in ((6, 60), (2, 150), (8, 200)):  # liver, right kidney (contrast), aorta
        assert abs(float(image[label == btcv_id].mean()) - hu) < 10
    # RAS+: the first axis points to the subject's right, the second anteriorly
    centroid = {i: np.argwhere(label == i).mean(0) for i in (1, 2, 3, 6, 7)}
    assert centroid[6][0] > centroid[1][0]  # liver right of spleen
    assert centroid[2][0] > centroid[3][0]  # right kidney right of left kidney
    assert centroid[2][1] < centroid[7][1]  # kidneys posterior to the stomach
    assert (label == 6).sum() == max((label == i).sum() for i in ORGAN_IDS)  # liver is the largest organ


def test_raw_layout_files_affine_and_determinism(tmp_path):
    info = generate_synthetic_ct(tmp_path / "a", cases=[5, 1], shape=TINY, spacing=(0.8, 0.8, 2.5))
    generate_synthetic_ct(tmp_path / "b", cases=[5, 1], shape=TINY, spacing=(0.8, 0.8, 2.5))
    assert info["cases"] == ["0005", "0001"] and info["train_cases"] == ["0005"] and info["test_cases"] == ["0001"]
    assert len(info["files"]) == 4
    for case in ("0005", "0001"):
        img_a, nii = _read(tmp_path / "a", "img", case)
        img_b, _ = _read(tmp_path / "b", "img", case)
        lbl_a, lnii = _read(tmp_path / "a", "label", case)
        np.testing.assert_array_equal(img_a, img_b)
        np.testing.assert_allclose(nii.header.get_zooms()[:3], (0.8, 0.8, 2.5), rtol=1e-6)
        np.testing.assert_allclose(np.diag(nii.affine)[:3], (0.8, 0.8, 2.5), rtol=1e-6)
        np.testing.assert_allclose(lnii.affine, nii.affine)
        assert nib.aff2axcodes(nii.affine) == ("R", "A", "S")
        assert img_a.shape == TINY and lbl_a.shape == TINY and lbl_a.max() <= 13
        expected_img, expected_lbl = synthetic_ct_volume(case, shape=TINY)
        np.testing.assert_array_equal(img_a, expected_img)
        np.testing.assert_array_equal(lbl_a, expected_lbl)


def test_transunet_layout(tmp_path):
    h5py = pytest.importorskip("h5py")
    info = generate_synthetic_ct(tmp_path, cases=[5, 6, 1], shape=TINY, layout="transunet")
    npz = sorted((tmp_path / "train_npz").glob("*.npz"))
    assert len(npz) == 2 * TINY[2]
    assert not (tmp_path / "RawData").exists()
    image, label = synthetic_ct_volume(5, shape=TINY)
    with np.load(tmp_path / "train_npz" / "case0005_slice003.npz") as f:
        np.testing.assert_allclose(f["image"], np.clip((image[..., 3] + 125.0) / 400.0, 0, 1), atol=1e-6)
        lut = np.zeros(14, np.uint8)
        for k, v in BTCV_TO_SYNAPSE.items():
            lut[k] = v
        np.testing.assert_array_equal(f["label"], lut[label[..., 3]])
    with h5py.File(tmp_path / "test_vol_h5" / "case0001.npy.h5", "r") as f:
        assert f["image"].shape == (TINY[2], TINY[0], TINY[1]) and f["label"].shape == f["image"].shape
        assert 0.0 <= f["image"][()].min() and f["image"][()].max() <= 1.0 and f["label"][()].max() <= 8
    assert len(info["files"]) == 2 * TINY[2] + 1


def test_transunet_layout_without_h5py_warns(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py -> ImportError
    with pytest.warns(UserWarning, match="h5py"):
        generate_synthetic_ct(tmp_path, cases=[5, 1], shape=TINY, layout="both")
    assert not (tmp_path / "test_vol_h5").exists()
    assert (tmp_path / "RawData" / "Training" / "img" / "img0001.nii.gz").is_file()
    assert len(list((tmp_path / "train_npz").glob("*.npz"))) == TINY[2]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"layout": "nnunet"}, "layout"),
        ({"shape": (32, 32)}, "shape"),
        ({"shape": (4, 32, 8)}, "shape"),
        ({"spacing": (1.0, 0.0, 1.0)}, "spacing"),
        ({"cases": [5, "0005"]}, "cases"),
        ({"cases": ["abc"]}, "case id"),
        ({"spacing": (1.0, float("inf"), 1.0)}, "spacing must be three positive finite numbers"),
        ({"noise_std": float("nan")}, "noise_std must be a finite number >= 0, got nan"),
        ({"noise_std": float("inf")}, "noise_std must be a finite number >= 0, got inf"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_synthetic_ct(tmp_path, **{"shape": TINY, **kwargs})


def test_cli(tmp_path, capsys):
    main(["--root", str(tmp_path), "--cases", "7", "--shape", "16", "16", "4"])
    assert (tmp_path / "RawData" / "Training" / "label" / "label0007.nii.gz").is_file()
    assert '"num_files": 2' in capsys.readouterr().out
