"""Tests of the Synapse datalists, BTCV label mapping, volume checks and the axial slice cache."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from spectraflow_monai.apps.synapse import (
    BTCV_TO_SYNAPSE,
    SYNAPSE_ORGANS,
    SYNAPSE_TEST_CASES,
    SYNAPSE_TRAIN_CASES,
    check_volume_pair,
    extract_slices,
    format_case_id,
    generate_synthetic_ct,
    load_synapse_h5,
    map_btcv_labels,
    synapse_datalist,
    synthetic_ct_volume,
)
from spectraflow_monai.data import DatasetError
from spectraflow_monai.utils.errors import SettingError
from tests.apps.synapse.sources import source_datalist, synapse_source

TINY = (32, 32, 8)
CASES = [5, 6, 1]
LUT = np.array([0, 1, 2, 3, 4, 0, 5, 6, 7, 0, 0, 8, 0, 0])  # written out by hand from the TransUNet mapping


@pytest.fixture(scope="module")
def raw_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("synapse_raw")
    generate_synthetic_ct(root, cases=CASES, shape=TINY, spacing=(0.8, 0.8, 2.5))
    return root


@pytest.fixture(scope="module")
def tu_root(tmp_path_factory):
    pytest.importorskip("h5py")
    root = tmp_path_factory.mktemp("synapse_tu")
    generate_synthetic_ct(root, cases=CASES, shape=TINY, layout="transunet")
    return root


def _save_nifti(path, array, affine=None):
    nib.save(nib.Nifti1Image(array, np.eye(4) if affine is None else affine), str(path))
    return str(path)


def test_constants():
    assert len(SYNAPSE_TRAIN_CASES) == 18 and len(SYNAPSE_TEST_CASES) == 12
    assert set(SYNAPSE_TRAIN_CASES) | set(SYNAPSE_TEST_CASES) == set(range(1, 11)) | set(range(21, 41))
    assert BTCV_TO_SYNAPSE == {1: 1, 2: 2, 3: 3, 4: 4, 6: 5, 7: 6, 8: 7, 11: 8}
    assert SYNAPSE_ORGANS[5] == "liver" and SYNAPSE_ORGANS[8] == "pancreas" and len(SYNAPSE_ORGANS) == 9


@pytest.mark.parametrize("case, expected", [(5, "0005"), ("5", "0005"), ("0005", "0005"), ("case0038", "0038")])
def test_format_case_id(case, expected):
    assert format_case_id(case) == expected


@pytest.mark.parametrize("case", [-1, "abc", 1.5, True])
def test_format_case_id_rejects(case):
    with pytest.raises(ValueError, match="case id"):
        format_case_id(case)


def test_raw_datalist(raw_root):
    train = synapse_datalist(raw_root, "train", cases=[5, 6])
    assert [d["case"] for d in train] == ["0005", "0006"]
    assert train[0]["image"] == str(raw_root / "RawData" / "Training" / "img" / "img0005.nii.gz")
    assert train[0]["label"] == str(raw_root / "RawData" / "Training" / "label" / "label0005.nii.gz")
    test = synapse_datalist(raw_root, "test", layout="raw", cases=["0001"])
    assert test == [
        {
            "image": str(raw_root / "RawData/Training/img/img0001.nii.gz"),
            "label": str(raw_root / "RawData/Training/label/label0001.nii.gz"),
            "case": "0001",
        }
    ]


def test_missing_case_names_case_and_path(raw_root):
    with pytest.raises(DatasetError, match=r"case 0009: .*img0009\.nii\.gz"):
        synapse_datalist(raw_root, "train")  # the official list has 18 cases, the tree only 5 and 6
    with pytest.raises(ValueError, match="case 0002"):  # DatasetError is a ValueError
        synapse_datalist(raw_root, "test", cases=[1, 2])


def test_transunet_datalists(tu_root):
    train = synapse_datalist(tu_root, "train", cases=[5, 6])
    assert len(train) == 2 * TINY[2]
    assert [d["slice"] for d in train[: TINY[2]]] == list(range(TINY[2]))
    assert train[3] == {
        "image": str(tu_root / "train_npz" / "case0005_slice003.npz"),
        "label": str(tu_root / "train_npz" / "case0005_slice003.npz"),
        "case": "0005",
        "slice": 3,
    }
    test = synapse_datalist(tu_root, "test", layout="transunet", cases=[1])
    assert test == [
        {
            "image": str(tu_root / "test_vol_h5/case0001.npy.h5"),
            "label": str(tu_root / "test_vol_h5/case0001.npy.h5"),
            "case": "0001",
        }
    ]
    with pytest.raises(DatasetError, match=r"case 0007: .*case0007_slice\*\.npz"):
        synapse_datalist(tu_root, "train", cases=[5, 7])
    with pytest.raises(DatasetError, match=r"case 0002: .*case0002\.npy\.h5"):
        synapse_datalist(tu_root, "test", cases=[1, 2])


@pytest.mark.parametrize(
    "dataset, cases, exclude, expected",
    [
        ("synthetic", None, [6], ["0005"]),  # every case on disk of the split, minus the held-out one
        ("synthetic", [5, 6], "0005", ["0006"]),
        ("btcv", [5, 6], [6, 40], ["0005"]),  # an excluded id that is not in the list is ignored
        ("btcv", None, None, None),  # nothing excluded: TransUNet's 18 training cases, 16 of them missing here
    ],
)
def test_source_datalist_exclude_cases(raw_root, dataset, cases, exclude, expected):
    kwargs = dict(cases=cases, exclude_cases=exclude)
    if expected is None:
        with pytest.raises(DatasetError, match="case 0007"):
            source_datalist(dataset, raw_root, "train", **kwargs)
        return
    entries = source_datalist(dataset, raw_root, "train", **kwargs)
    assert [d["case"] for d in entries] == expected


def test_synthetic_phantom_is_generated_once_and_checked(tmp_path):
    root = tmp_path / "phantom"
    gen = {"cases": [5, 1], "shape": list(TINY)}
    assert [d["case"] for d in source_datalist("synthetic", root, "train", synthetic_size=gen)] == ["0005"]
    manifest = json.loads((root / "synthetic_ct.json").read_text())
    assert manifest == {"cases": ["0005", "0001"], "shape": list(TINY), "spacing": [0.8, 0.8, 2.5], "seed": 0,
                        "noise_std": 12.0}  # fmt: skip
    stamp = os.path.getmtime(root / "RawData" / "Training" / "img" / "img0005.nii.gz")
    assert len(source_datalist("synthetic", root, "test", synthetic_size=dict(gen))) == 1  # same request: reused
    assert os.path.getmtime(root / "RawData" / "Training" / "img" / "img0005.nii.gz") == stamp
    # another request on the same folder stops with both parameter sets instead of silently using the old phantom
    for other, key in (({"cases": [5, 6, 1]}, "cases"), ({"shape": [16, 16, 4]}, "shape"), ({"seed": 3}, "seed")):
        with pytest.raises(DatasetError, match=rf"{re.escape(str(root))}.*other parameters.*'{key}'.*dataset_dir"):
            source_datalist("synthetic", root, "train", synthetic_size={**gen, **other})
    with pytest.raises(ValueError, match="generate_synthetic_ct"):
        source_datalist("synthetic", root, "train", synthetic_size={**gen, "size": 3})
    # a phantom without manifest: the requested cases must be there
    os.remove(root / "synthetic_ct.json")
    assert len(source_datalist("synthetic", root, "train", synthetic_size={"cases": [5], "shape": [8, 8, 2]})) == 1
    with pytest.raises(DatasetError, match=r"'cases': \['0005', '0001'\]"):
        source_datalist("synthetic", root, "train", synthetic_size={"cases": [5, 6, 1]})


def test_source_datalist_exclude_every_case(raw_root):
    with pytest.raises(ValueError, match=r"no case of the train split is left after excluding \['0005', '0006'\]"):
        source_datalist("synthetic", raw_root, "train", exclude_cases=[5, 6])


def test_datalist_bad_arguments(tmp_path, raw_root):
    with pytest.raises(ValueError, match="split"):
        synapse_datalist(raw_root, "val")
    with pytest.raises(ValueError, match="layout"):
        synapse_datalist(raw_root, layout="nnunet")
    with pytest.raises(ValueError, match="duplicates"):
        synapse_datalist(raw_root, cases=[5, "0005"])
    with pytest.raises(DatasetError, match="not a directory"):
        synapse_datalist(tmp_path / "nowhere")
    with pytest.raises(DatasetError, match="RawData"):
        synapse_datalist(tmp_path)  # empty folder: no layout detected


def test_load_synapse_h5_matches_raw_volume(tu_root):
    vol = load_synapse_h5(tu_root / "test_vol_h5" / "case0001.npy.h5")
    image, label = synthetic_ct_volume(1, shape=TINY)
    assert vol["image"].shape == TINY  # (D, H, W) on disk -> (H, W, D)
    np.testing.assert_allclose(vol["image"], np.clip((image + 125.0) / 400.0, 0, 1), atol=1e-6)
    np.testing.assert_array_equal(vol["label"], LUT[label])
    with pytest.raises(DatasetError, match="does not exist"):
        load_synapse_h5(tu_root / "test_vol_h5" / "case0099.npy.h5")


def test_load_synapse_h5_without_h5py(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"pip install spectraflow_monai\[h5\]"):
        load_synapse_h5(tmp_path / "case0001.npy.h5")


# --------------------------------------------------------------------------------------------------- label mapping
def test_map_btcv_labels_every_id_numpy_and_torch():
    ids = np.arange(14, dtype=np.int16).reshape(2, 7)
    out = map_btcv_labels(ids)
    np.testing.assert_array_equal(out, LUT.reshape(2, 7))
    assert out.dtype == np.int16
    t = torch.arange(14, dtype=torch.float32)
    out_t = map_btcv_labels(t)
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.float32
    np.testing.assert_array_equal(out_t.numpy(), LUT)
    assert map_btcv_labels(np.array([6.0, 11.0]), dtype=np.uint8).dtype == np.uint8


@pytest.mark.parametrize(
    "label, bad",
    [
        (np.array([0, 3, 14, 20]), r"\[14, 20\]"),
        (np.array([-1, 2]), r"\[-1\]"),
        (np.array([1.0, 2.5]), r"\[2\.5\]"),
        (torch.tensor([0, 15]), r"\[15\]"),
        (torch.tensor([0.0, 0.5]), r"\[0\.5\]"),
    ],
)
def test_map_btcv_labels_rejects_out_of_range(label, bad):
    with pytest.raises(ValueError, match=rf"case 0007.*{bad}"):
        map_btcv_labels(label, case="0007")


# ------------------------------------------------------------------------------------------------- volume checks
def test_check_volume_pair_ok(raw_root):
    d = synapse_datalist(raw_root, cases=[5])[0]
    info = check_volume_pair(d["image"], d["label"], "0005")
    assert info["shape"] == TINY
    np.testing.assert_allclose(info["spacing"], (0.8, 0.8, 2.5), rtol=1e-6)


def test_check_volume_pair_errors(tmp_path):
    img = _save_nifti(tmp_path / "img.nii.gz", np.zeros((8, 8, 4), np.int16))
    small = _save_nifti(tmp_path / "small.nii.gz", np.zeros((8, 8, 3), np.uint8))
    shifted = _save_nifti(tmp_path / "shifted.nii.gz", np.zeros((8, 8, 4), np.uint8), np.diag([1.0, 1.0, 2.0, 1.0]))
    close = _save_nifti(tmp_path / "close.nii.gz", np.zeros((8, 8, 4), np.uint8), np.diag([1.0, 1.0, 1.0005, 1.0]))
    flat = _save_nifti(tmp_path / "flat.nii.gz", np.zeros((8, 8), np.int16))
    single = _save_nifti(tmp_path / "single.nii.gz", np.zeros((8, 8, 1), np.int16))
    corrupt = tmp_path / "corrupt.nii.gz"
    corrupt.write_bytes(b"not a nifti file")
    check_volume_pair(img, close, "0001")  # within the 1e-3 affine tolerance
    with pytest.raises(DatasetError, match=r"case 0001: label .*small\.nii\.gz.*shape \(8, 8, 3\).*\(8, 8, 4\)"):
        check_volume_pair(img, small, "0001")
    with pytest.raises(DatasetError, match=r"case 0001: .*different affines"):
        check_volume_pair(img, shifted, "0001")
    with pytest.raises(DatasetError, match=r"case 0002: image file .*flat\.nii\.gz.* is 2D"):
        check_volume_pair(flat, None, "0002")
    with pytest.raises(DatasetError, match=r"case 0002: label file .*single\.nii\.gz.* is 2D"):
        check_volume_pair(img, single, "0002")
    with pytest.raises(DatasetError, match=r"case 0003: image file .*corrupt\.nii\.gz.* not a readable NIfTI"):
        check_volume_pair(corrupt, None, "0003")
    with pytest.raises(DatasetError, match=r"case 0004: label file .*missing\.nii\.gz.* does not exist"):
        check_volume_pair(img, tmp_path / "missing.nii.gz", "0004")


# ----------------------------------------------------------------------------------------------------- slice cache
def test_extract_slices_values_and_cache_reuse(raw_root, tmp_path, monkeypatch):
    datalist = synapse_datalist(raw_root, cases=[5, 6])
    cache = tmp_path / "cache"
    slices = extract_slices(datalist, cache, progress=False)
    assert len(slices) == 2 * TINY[2]
    assert slices[0]["case"] == "0005" and slices[0]["slice"] == 0 and slices[-1]["slice"] == TINY[2] - 1
    assert slices[0]["image"] == slices[0]["label"] == str(cache / "case0005" / "case0005_slice000.npz")
    image, label = synthetic_ct_volume(6, shape=TINY)
    with np.load(slices[TINY[2] + 5]["image"]) as f:
        assert f["image"].shape == TINY[:2] and f["image"].dtype == np.float32 and f["label"].dtype == np.uint8
        np.testing.assert_allclose(f["image"], np.clip((image[..., 5] + 125.0) / 400.0, 0, 1), atol=1e-6)
        np.testing.assert_array_equal(f["label"], LUT[label[..., 5]])
    index = json.loads((cache / "index.json").read_text())
    assert set(index["volumes"]) == {"0005", "0006"}
    assert not [p for p in os.listdir(cache / "case0005") if not p.endswith(".npz")]  # no temporary files left

    def no_load(*args, **kwargs):
        raise AssertionError("a cached volume was read again")

    monkeypatch.setattr(nib, "load", no_load)
    assert extract_slices(datalist, cache, progress=False) == slices
    monkeypatch.undo()

    # touching one source re-extracts that volume only
    loaded = []
    real_load = nib.load
    monkeypatch.setattr(nib, "load", lambda p, *a, **k: loaded.append(os.fspath(p)) or real_load(p, *a, **k))
    st = os.stat(datalist[1]["image"])
    os.utime(datalist[1]["image"], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert extract_slices(datalist, cache, progress=False) == slices
    assert loaded and all("0006" in p for p in loaded)


def test_extract_slices_options(raw_root, tmp_path):
    datalist = [{"image": d["image"]} for d in synapse_datalist(raw_root, cases=[5])]  # no label, no case
    slices = extract_slices(datalist, tmp_path, spatial_size=(16, 20), image_dtype="float16", progress=False)
    assert len(slices) == TINY[2] and "label" not in slices[0] and slices[0]["case"] == "0005"
    with np.load(slices[0]["image"]) as f:
        assert f["image"].shape == (16, 20) and f["image"].dtype == np.float16 and "label" not in f.files


def test_extract_slices_reorients_to_ras(tmp_path):
    data = np.arange(4 * 5 * 3, dtype=np.int16).reshape(4, 5, 3) * 10 - 125
    label = np.zeros((4, 5, 3), np.uint8)
    label[0] = 6  # liver on the first row of the stored array
    flip = np.diag([-1.0, 1.0, 1.0, 1.0])  # first axis points to the left (LAS)
    entry = {
        "image": _save_nifti(tmp_path / "img0001.nii.gz", data, flip),
        "label": _save_nifti(tmp_path / "label0001.nii.gz", label, flip),
    }
    slices = extract_slices([entry], tmp_path / "cache", progress=False)
    with np.load(slices[1]["image"]) as f:
        np.testing.assert_allclose(f["image"], np.clip((data[::-1, :, 1] + 125.0) / 400.0, 0, 1), atol=1e-6)
        np.testing.assert_array_equal(f["label"][-1], 5)  # the flipped liver row, mapped 6 -> 5
        assert f["label"][:-1].max() == 0


def test_extract_slices_errors(raw_root, tmp_path):
    d = synapse_datalist(raw_root, cases=[5, 6])
    with pytest.raises(ValueError, match="two volumes with case id '0005'"):
        extract_slices([d[0], {**d[1], "case": "0005"}], tmp_path, progress=False)
    with pytest.raises(ValueError, match="window"):
        extract_slices(d, tmp_path, window=(275, -125), progress=False)
    with pytest.raises(ValueError, match="spatial_size"):
        extract_slices(d, tmp_path, spatial_size=(16,), progress=False)
    with pytest.raises(ValueError, match="image_dtype"):
        extract_slices(d, tmp_path, image_dtype="int8", progress=False)
    with pytest.raises(ValueError, match=r"datalist\[0\]"):
        extract_slices([{"label": "x"}], tmp_path, progress=False)
    bad = np.zeros(TINY, np.uint8)
    bad[0, 0, 0] = 14
    entry = {
        "image": d[0]["image"],
        "label": _save_nifti(tmp_path / "label0005.nii.gz", bad, nib.load(d[0]["image"]).affine),
    }
    with pytest.raises(ValueError, match=r"case 0005.*\[14\]"):
        extract_slices([entry], tmp_path / "c", progress=False)


def test_extract_slices_truncated_volume(raw_root, tmp_path):
    d = synapse_datalist(raw_root, cases=[5])[0]
    data = Path(d["image"]).read_bytes()
    truncated = tmp_path / "img0005.nii.gz"
    truncated.write_bytes(data[: len(data) // 2])  # header intact, data cut
    with pytest.raises(DatasetError, match=r"case 0005: cannot read the image data of .*img0005\.nii\.gz"):
        extract_slices([{**d, "image": str(truncated)}], tmp_path / "cache", progress=False)


# ------------------------------------------------------------------------------ slice cache index: paths confined
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "nested_dotdot", "symlink"])
def test_crafted_index_cannot_remove_files_outside_the_cache(raw_root, tmp_path, kind):
    datalist = synapse_datalist(raw_root, cases=[5])
    cache = tmp_path / "cache"
    extract_slices(datalist, cache, progress=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    entry = {
        "dotdot": "../victim.txt",
        "absolute": str(victim),
        "nested_dotdot": "case0005/../../victim.txt",
        "symlink": "case0005/link.txt",
    }[kind]
    if kind == "symlink":
        os.symlink(victim, cache / "case0005" / "link.txt")
    index_path = cache / "index.json"
    index = json.loads(index_path.read_text())
    index["volumes"]["0005"]["files"].append(entry)
    index["volumes"]["0005"]["source"] = {}  # a changed source: the volume is re-extracted, stale files removed
    index_path.write_text(json.dumps(index))
    with pytest.raises(DatasetError) as info:
        extract_slices(datalist, cache, progress=False)
    assert victim.read_text() == "keep me"
    message = str(info.value)
    assert str(index_path) in message and repr(entry) in message and "files[8]" in message, message


def test_index_without_file_list_is_refused(raw_root, tmp_path):
    datalist = synapse_datalist(raw_root, cases=[5])
    cache = tmp_path / "cache"
    extract_slices(datalist, cache, progress=False)
    index = json.loads((cache / "index.json").read_text())
    index["volumes"]["0005"]["files"] = "../victim.txt"
    (cache / "index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError, match=r"index\.json.*volumes\['0005'\]"):
        extract_slices(datalist, cache, progress=False)


@pytest.mark.parametrize("case", ["../x", "a/b", "..", "a\\b"])
def test_case_ids_must_be_plain_names(raw_root, tmp_path, case):
    d = synapse_datalist(raw_root, cases=[5])[0]
    with pytest.raises(ValueError, match=r"datalist\[0\] has the case id"):
        extract_slices([{**d, "case": case}], tmp_path / "cache", progress=False)
    assert not (tmp_path / "x").exists() and not (tmp_path / "cache" / "case..").exists()


@pytest.mark.parametrize("content", ["[1, 2]", "{not json"])
def test_bad_phantom_manifest_is_named(tmp_path, content):
    root = tmp_path / "phantom"
    generate_synthetic_ct(root, cases=[5], shape=(16, 16, 4))
    (root / "synthetic_ct.json").write_text(content)
    with pytest.raises(DatasetError, match=r"phantom manifest .*synthetic_ct\.json"):
        source_datalist("synthetic", root, "train", synthetic_size={"cases": [5], "shape": [16, 16, 4]})


# ----------------------------------------------------------------------------------------- non-finite CT voxels
def _nan_volume(raw_root, tmp_path, inf=False):
    """Case 5 of the phantom with a 2x2x2 NaN patch (and, with ``inf``, one +inf and one -inf voxel)."""
    d = synapse_datalist(raw_root, cases=[5])[0]
    src = nib.load(d["image"])
    data = src.get_fdata(dtype=np.float32)
    data[4:6, 4:6, 2:4] = np.nan
    if inf:
        data[0, 0, 0], data[1, 0, 0] = np.inf, -np.inf
    image = tmp_path / "img0005.nii.gz"
    nib.save(nib.Nifti1Image(data, src.affine), str(image))
    return {**d, "image": str(image)}


@pytest.mark.parametrize("inf", [False, True])
def test_extract_slices_names_a_volume_with_nan_voxels(raw_root, tmp_path, inf):
    entry = _nan_volume(raw_root, tmp_path, inf)
    count = 8 + 2 * inf
    pattern = rf"case 0005: .*img0005\.nii\.gz.* {count} non-finite voxel\(s\) \(8 NaN, {2 * inf} infinite\)"
    with pytest.raises(DatasetError, match=pattern):
        extract_slices([entry], tmp_path / "cache", progress=False)
    assert not list((tmp_path / "cache").glob("case0005/*.npz"))
    # the bundle entry point too, on a raw BTCV layout
    root = tmp_path / "btcv"
    (root / "RawData/Training/img").mkdir(parents=True)
    (root / "RawData/Training/label").mkdir(parents=True)
    os.replace(entry["image"], root / "RawData/Training/img/img0005.nii.gz")
    Path(root / "RawData/Training/label/label0005.nii.gz").write_bytes(Path(entry["label"]).read_bytes())
    with pytest.raises(DatasetError, match=pattern):
        source_datalist("btcv", root, "train", cases=[5], slices=True, cache_dir=str(tmp_path / "c2"))
    assert not list((tmp_path / "c2").glob("case0005/*.npz"))


def test_extract_slices_replaces_nan_voxels_when_asked(raw_root, tmp_path, caplog):
    entry = _nan_volume(raw_root, tmp_path, inf=True)
    with caplog.at_level("WARNING", logger="spectraflow_monai.transforms.finite"):
        slices = extract_slices([entry], tmp_path / "cache", nonfinite="replace", progress=False)
    assert any("img0005.nii.gz" in r.getMessage() and "replaced 10 non-finite voxel(s)" in r.getMessage()
               for r in caplog.records), caplog.text  # fmt: skip
    with np.load(slices[2]["image"]) as f:
        img = f["image"]
    assert np.isfinite(img).all()
    np.testing.assert_array_equal(img[4:6, 4:6], 0.0)  # replaced by the window's lower bound: black
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    assert index["volumes"]["0005"]["params"]["nonfinite"] == {"mode": "replace", "value": None}
    # an explicit value in HU (here the upper bound: white); a new value re-extracts the volume
    slices = extract_slices([entry], tmp_path / "cache", nonfinite="replace", nonfinite_value=275, progress=False)
    with np.load(slices[2]["image"]) as f:
        np.testing.assert_array_equal(f["image"][4:6, 4:6], 1.0)
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        extract_slices([entry], tmp_path / "cache", nonfinite="ignore", progress=False)
    with pytest.raises(ValueError, match="nonfinite_value must be a finite number"):
        extract_slices([entry], tmp_path / "cache", nonfinite="replace", nonfinite_value=float("nan"), progress=False)


def test_extract_slices_names_a_transunet_volume_with_nan(tu_root, tmp_path):
    import h5py

    h5 = tmp_path / "case0001.npy.h5"
    with h5py.File(tu_root / "test_vol_h5" / "case0001.npy.h5", "r") as f:
        image, label = f["image"][()], f["label"][()]
    image[1, 3:5, 3:5] = np.nan
    with h5py.File(h5, "w") as f:
        f.create_dataset("image", data=image)
        f.create_dataset("label", data=label)
    entry = {"image": str(h5), "label": str(h5), "case": "0001"}
    with pytest.raises(DatasetError, match=r"case 0001: .*case0001\.npy\.h5.* 4 non-finite voxel\(s\)"):
        extract_slices([entry], tmp_path / "cache", progress=False)
    slices = extract_slices([entry], tmp_path / "cache", nonfinite="replace", progress=False)
    with np.load(slices[1]["image"]) as f:
        np.testing.assert_array_equal(f["image"][3:5, 3:5], 0.0)


# ------------------------------------------------------------------------------------------- bundle settings
@pytest.mark.parametrize(
    "values, match",
    [
        ({"image_size": "abc"}, r"image_size must be a positive int multiple of 14 .*got 'abc'"),
        ({"image_size": 100}, r"image_size must be a positive int multiple of 14 .*got 100"),
        ({"dataset": "acdc"}, r"dataset must be one of .*got 'acdc'"),
        ({"num_classes": 1}, r"num_classes must be an int >= 2 .*got 1"),
        ({"hu_window": [275, -125]}, r"hu_window must be .*got \[275, -125\]"),
        ({"hu_window": "wide"}, r"hu_window must be .*got 'wide'"),
        ({"nonfinite": "ignore"}, r"nonfinite must be one of \['error', 'replace'\], got 'ignore'"),
        ({"nonfinite": "replace", "nonfinite_value": "air"}, r"nonfinite_value must be a number .*got 'air'"),
        ({"unmapped_labels": "ignore"}, r"unmapped_labels must be one of \['error', 'background'\], got 'ignore'"),
        ({"val_split": "train"}, r"val_split must be one of \['val', 'test'\], got 'train'"),
        ({"train_cases": []}, r"train_cases must be a non-empty list of case ids .*got \[\]"),
        ({"val_cases": [7, 7]}, r"val_cases lists a case twice: \[7, 7\]"),
        ({"test_cases": [1.5]}, r"test_cases must list case ids .*got 1\.5"),
        ({"synthetic_size": {"size": 3}}, r"synthetic_size holds \['size'\], which generate_synthetic_ct does not"),
        ({"synthetic_size": {"shape": [4, 4]}}, r"synthetic_size \{'shape': \[4, 4\]\}: shape must be"),
        ({"label_map": {3: 5}, "num_classes": 3}, "label_map maps 3 to 5"),
        ({"class_names": ["a"], "num_classes": 3}, "class_names must list 3 distinct names"),
        ({"dataset": "transunet", "label_map": {0: 0}, "num_classes": 2}, "does not apply to dataset 'transunet'"),
        ({"val_fraction": 1.5}, "val_fraction must be a number in"),
        ({"data_fraction": 0}, "data_fraction must be a number in"),
    ],
)
def test_the_settings_objects_name_a_bad_value(tmp_path, values, match):
    """Each Synapse data and CT setting is checked where its object is built (the data source last, for what needs
    the others), before anything is written."""
    values = dict(values)
    with pytest.raises(SettingError, match=match):
        synapse_source(values.pop("dataset", "synthetic"), str(tmp_path / "data"), **values)
    assert not any(tmp_path.iterdir())


def test_the_data_options_are_normalised_and_recorded_whole(tmp_path):
    from spectraflow_monai.apps.synapse import SynapseDataOptions, SynapseDataSource
    from spectraflow_monai.utils.settings import DataSettings

    options = SynapseDataOptions(train_cases=np.int64(5), val_cases=[7, "ct_02"], synthetic_size={"cases": (5, 1)})
    assert options.train_cases == [5] and options.val_cases == [7, "ct_02"]
    source = synapse_source("BTCV", str(tmp_path), unmapped_labels="background", hu_window=(-100, 200), val_split="test")
    assert source.dataset == "btcv" and source.hu_window == (-100.0, 200.0) and source.unmapped_labels == "background"
    assert source.cache_dir == os.path.join(".", "cache", "btcv_28") and source.spatial_size == [28, 28]
    assert source.synthetic_size is None  # a preset of files on disk generates nothing
    # the run record names the source by what it reads (its settings are recorded whole beside it)
    cache = os.path.join(".", "cache", "btcv_28")
    assert repr(source) == f"SynapseDataSource(dataset='btcv', dataset_dir={str(tmp_path)!r}, cache_dir={cache!r})"
    # the record holds the data options once, without the CT preprocessing (the model's); read back, the same source
    recorded = source.data.to_dict()
    assert recorded["data_options"] == {"unmapped_labels": "background", "train_cases": None, "val_cases": None,
                                        "test_cases": None, "val_split": "test", "synthetic_size": None}  # fmt: skip
    again = SynapseDataSource(DataSettings.from_dict(recorded), source.model, source.run)
    assert again.options == source.options
    # the data options of a record written when they held the CT preprocessing (now the model's) are refused, named
    old = {**recorded, "data_options": {**recorded["data_options"], "hu_window": [-125.0, 275.0], "nonfinite": "error"}}
    with pytest.raises(SettingError, match=r"data_options: unknown SynapseDataOptions \['hu_window', 'nonfinite'\]"):
        SynapseDataSource(DataSettings.from_dict(old), source.model, source.run)
