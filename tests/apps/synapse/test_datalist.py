"""Tests of the own-data source of the Synapse bundle: Decathlon datalist JSON, hold-out, label maps, class names."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from spectraflow_monai.apps.synapse import (
    case_fraction,
    extract_slices,
    generate_synthetic_ct,
    holdout_split,
    nifti_case_id,
    read_decathlon_datalist,
    resolve_label_map,
    synapse_class_names,
    synapse_inference_datalist,
)
from spectraflow_monai.data import DatasetError, apply_label_map, check_class_names, check_label_map
from spectraflow_monai.apps.synapse import MapLabelsd
from spectraflow_monai.utils.errors import SettingError
from tests.apps.synapse.sources import source_datalist, synapse_source

SHAPE, AFFINE = (16, 16, 4), np.diag([1.0, 1.0, 2.0, 1.0])
MAP = {0: 0, 3: 1, 7: 2}


def _pair(root: Path, name: str, values=(0, 3, 7), label_shape=SHAPE) -> dict:
    lab = np.zeros(label_shape, np.uint8)
    lab[2:6, 2:6, :2] = values[1]
    lab[8:12, 8:12, 2:] = values[2]
    img = np.where(lab[: SHAPE[0], : SHAPE[1], : SHAPE[2]] > 0, 100.0, -50.0) if label_shape == SHAPE else None
    img = np.full(SHAPE, -50.0) if img is None else img
    for folder, arr in (("imagesTr", img.astype(np.float32)), ("labelsTr", lab)):
        os.makedirs(root / folder, exist_ok=True)
        nib.save(nib.Nifti1Image(arr, AFFINE), str(root / folder / f"{name}.nii.gz"))
    return {"image": f"imagesTr/{name}.nii.gz", "label": f"labelsTr/{name}.nii.gz"}


def _dataset(root: Path, n: int = 5, validation: int = 0, test: int = 1, **extra) -> Path:
    items = [_pair(root, f"vol_{i}") for i in range(n)]
    spec: dict = {"training": items[: n - validation - test], **extra}
    if validation:
        spec["validation"] = items[n - validation - test : n - test]
    if test:
        spec["test"] = items[n - test :]
    (root / "dataset.json").write_text(json.dumps(spec))
    return root / "dataset.json"


# ---------------------------------------------------------------- reading the JSON
def test_read_resolves_paths_like_monai(tmp_path):
    path = _dataset(tmp_path, n=3)
    lists = read_decathlon_datalist(path)  # base: the JSON's folder
    assert [e["case"] for e in lists["training"]] == ["vol_0", "vol_1"] and lists["validation"] is None
    assert lists["training"][0]["image"] == str(tmp_path / "imagesTr" / "vol_0.nii.gz")
    assert lists["test"][0]["label"] == str(tmp_path / "labelsTr" / "vol_2.nii.gz")
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.replace(path, other / "dataset.json")
    lists = read_decathlon_datalist(other / "dataset.json", dataset_dir=tmp_path)  # base: dataset_dir
    assert lists["training"][1]["label"] == str(tmp_path / "labelsTr" / "vol_1.nii.gz")


def test_bare_test_paths_and_case_ids(tmp_path):
    path = _dataset(tmp_path, n=3, test=0)
    spec = json.loads(path.read_text())
    spec["test"] = ["imagesTr/vol_1.nii.gz"]
    path.write_text(json.dumps(spec))
    test = read_decathlon_datalist(path)["test"]
    assert test == [{"image": str(tmp_path / "imagesTr/vol_1.nii.gz"), "case": "vol_1"}]
    assert nifti_case_id("/a/ct_01.nii.gz") == "ct_01" and nifti_case_id("b.NII") == "b"


@pytest.mark.parametrize(
    "problem, match",
    [
        ("no_json", r"datalist '.*absent\.json' does not exist"),
        ("json_is_dir", r"is not a file"),
        ("dir_is_file", r"dataset_dir '.*dataset\.json' is a file, not a folder"),
        ("dir_missing", r"dataset_dir '.*nowhere' .* does not exist"),
        ("bad_json", r"is not a readable JSON file"),
        ("no_training", r"has no 'training' list"),
        ("empty_training", r"the 'training' list is empty"),
        ("empty_validation", r"the 'validation' list is empty"),
        ("no_label", r"training\[0\] has no 'label' path"),
        ("missing_file", r"training\[1\] label '.*gone\.nii\.gz' does not exist"),
        ("duplicate", r"case ids .* must be unique .* vol_0: \['.*a/imagesTr/vol_0\.nii\.gz', '.*b/imagesTr/vol_0\."),
    ],
)
def test_bad_datalists_are_named(tmp_path, problem, match):
    path = _dataset(tmp_path, n=3)
    spec = json.loads(path.read_text())
    base = None
    if problem == "no_json":
        path = tmp_path / "absent.json"
    elif problem == "json_is_dir":
        path = tmp_path / "imagesTr"
    elif problem == "dir_is_file":
        base = path
    elif problem == "dir_missing":
        base = tmp_path / "nowhere"
    elif problem == "bad_json":
        path.write_text("{training: ")
    elif problem == "no_training":
        path.write_text(json.dumps({"test": spec["test"]}))
    elif problem in ("empty_training", "empty_validation"):
        path.write_text(json.dumps({**spec, problem.split("_")[1]: []}))
    elif problem == "no_label":
        path.write_text(json.dumps({**spec, "training": [{"image": spec["training"][0]["image"]}]}))
    elif problem == "missing_file":
        spec["training"][1]["label"] = "labelsTr/gone.nii.gz"
        path.write_text(json.dumps(spec))
    elif problem == "duplicate":
        dup = [{k: f"{sub}/{v}" for k, v in _pair(tmp_path / sub, "vol_0").items()} for sub in ("a", "b")]
        path.write_text(json.dumps({"training": dup}))
    with pytest.raises(DatasetError, match=match):
        read_decathlon_datalist(path, base)


# ---------------------------------------------------------------- splits
def test_holdout_split_is_seeded_and_order_free():
    entries = [{"case": f"c{i}"} for i in range(10)]
    kept, held = holdout_split(entries, 0.2, seed=0)
    assert len(held) == 2 and len(kept) == 8 and {e["case"] for e in kept} | {e["case"] for e in held} == {
        e["case"] for e in entries
    }
    kept_r, held_r = holdout_split(entries[::-1], 0.2, seed=0)
    assert sorted(e["case"] for e in held_r) == sorted(e["case"] for e in held)
    assert holdout_split(entries, 0.2, seed=1)[1] != held or holdout_split(entries, 0.2, seed=2)[1] != held
    assert len(holdout_split(entries[:2], 0.01)[1]) == 1 and len(holdout_split(entries[:2], 0.99)[0]) == 1
    with pytest.raises(DatasetError, match="at least 2"):
        holdout_split(entries[:1], 0.2)
    with pytest.raises(SettingError, match="val_fraction"):
        holdout_split(entries, 1.0)


def test_splits_without_validation_list(tmp_path, caplog):
    path = _dataset(tmp_path, n=6, test=1)  # 5 training volumes -> 1 held out
    kw = {"data_list_file_path": str(path), "num_classes": 3, "label_map": MAP}
    with caplog.at_level(logging.INFO):
        train = source_datalist("synthetic", None, "train", **kw)
        val = source_datalist("synthetic", None, "val", **kw)
    assert "the dataset setting 'synthetic' is not used" in caplog.text
    assert "has no 'validation' list: 1 of 5 training volume(s) held out" in caplog.text
    assert len(train) == 4 and len(val) == 1 and not {e["case"] for e in train} & {e["case"] for e in val}
    assert {e["case"] for e in train + val} == {f"vol_{i}" for i in range(5)}
    assert [e["case"] for e in source_datalist("x", None, "test", **kw)] == ["vol_5"]
    # the same hold-out on every call (seeded), another with another seed or fraction
    assert source_datalist("synthetic", None, "val", **kw) == val
    assert len(source_datalist("synthetic", None, "val", **kw, val_fraction=0.4)) == 2
    # explicit validation cases instead of the fraction
    assert [e["case"] for e in source_datalist("x", None, "val", cases=["vol_2"], **kw)] == ["vol_2"]
    train = source_datalist("x", None, "train", exclude_cases=["vol_2"], **kw)
    assert [e["case"] for e in train] == ["vol_0", "vol_1", "vol_3", "vol_4"]
    with pytest.raises(DatasetError, match=r"case\(s\) \['vol_9'\] are not in its training list"):
        source_datalist("x", None, "val", cases=["vol_9"], **kw)


def test_splits_with_validation_list_and_unlabelled_test(tmp_path, caplog):
    path = _dataset(tmp_path, n=5, validation=2, test=0)
    spec = json.loads(path.read_text())
    spec["test"] = [spec["training"][0]["image"]]  # images only: evaluation falls back to the validation list
    path.write_text(json.dumps(spec))
    kw = {"data_list_file_path": str(path), "num_classes": 3}
    assert [e["case"] for e in source_datalist("x", None, "train", **kw)] == ["vol_0", "vol_1", "vol_2"]
    assert [e["case"] for e in source_datalist("x", None, "val", **kw)] == ["vol_3", "vol_4"]
    with caplog.at_level(logging.INFO):
        test = source_datalist("x", None, "test", **kw)
    assert [e["case"] for e in test] == ["vol_3", "vol_4"] and "without labels" in caplog.text
    assert synapse_inference_datalist(None, data_list_file_path=str(path)) == [
        {"image": str(tmp_path / "imagesTr" / "vol_0.nii.gz")}
    ]


def test_inference_datalist_sources(tmp_path):
    path = _dataset(tmp_path, n=3, test=0)
    with pytest.raises(DatasetError, match="has no 'test' list"):
        synapse_inference_datalist(None, data_list_file_path=str(path))
    files = synapse_inference_datalist(tmp_path / "imagesTr")
    assert [Path(f["image"]).name for f in files] == ["vol_0.nii.gz", "vol_1.nii.gz", "vol_2.nii.gz"]
    with pytest.raises(DatasetError, match="no image matches"):
        synapse_inference_datalist(tmp_path / "imagesTr", "*.mha")
    with pytest.raises(DatasetError, match="not a folder"):
        synapse_inference_datalist(path)


def test_data_fraction_keeps_nested_cases(tmp_path):
    entries = [{"case": f"c{i}", "slice": k} for i in range(10) for k in range(2)]
    small, large = case_fraction(entries, 0.2, seed=0), case_fraction(entries, 0.5, seed=0)
    assert len(small) == 4 and len(large) == 10 and all(e in large for e in small)  # whole cases, nested
    assert case_fraction(entries, 0.01)  # at least one case
    with pytest.raises(SettingError, match="data_fraction"):
        case_fraction(entries, 0.0)
    path = _dataset(tmp_path, n=6, test=1)
    train = source_datalist("x", None, "train", data_list_file_path=str(path), num_classes=3, label_map=MAP,
                                   data_fraction=0.5)  # fmt: skip
    assert len(train) == 2  # half of the 4 training volumes left after the hold-out


# ---------------------------------------------------------------- label maps, slice cache
def test_label_map_checks_and_application():
    assert check_label_map({"0": 0, "3": 1, 7: 2.0}, 3) == MAP
    assert check_label_map([[0, 0], [3, 1]], 3) == {0: 0, 3: 1}
    for bad, match in [({3: 3}, "class indices must be ints in 0..2"), ({}, "non-empty mapping"),
                       ({"a": 1}, "keys must be integer"), ("{3: 1}", "non-empty mapping")]:  # fmt: skip
        with pytest.raises(SettingError, match=match):
            check_label_map(bad, 3)
    label = np.array([[0, 3], [7, 7]], np.int16)
    np.testing.assert_array_equal(apply_label_map(label, MAP), [[0, 1], [2, 2]])
    with pytest.raises(ValueError, match=r"label 'f\.nii\.gz' holds value\(s\) \[7\] that the label map"):
        apply_label_map(label, {0: 0, 3: 1}, where="'f.nii.gz'")
    np.testing.assert_array_equal(apply_label_map(label, {0: 0, 3: 1}, "background"), [[0, 1], [0, 0]])
    with pytest.raises(ValueError, match="non-integral"):
        apply_label_map(np.array([0.5, 3.0]), MAP)
    assert apply_label_map(torch.tensor([3, 7]), MAP).tolist() == [1, 2]
    assert resolve_label_map(None, "d.json", 3) == {0: 0, 1: 1, 2: 2} and resolve_label_map(None, None, 9) is None


def test_map_labels_transform_names_the_file():
    t = MetaTensor(torch.tensor([[0.0, 3.0, 9.0]]), meta={"filename_or_obj": "/d/lab_1.nii.gz"})
    with pytest.raises(ValueError, match=r"'/d/lab_1\.nii\.gz' holds value\(s\) \[9\]"):
        MapLabelsd(label_map=MAP, num_classes=3)({"label": t})
    out = MapLabelsd(label_map=MAP, num_classes=3, unmapped="background")({"label": t})["label"]
    assert isinstance(out, MetaTensor) and out.tolist() == [[0.0, 1.0, 0.0]] and out.dtype == t.dtype
    assert MapLabelsd()({"label": torch.tensor([6, 11])})["label"].tolist() == [5, 8]  # None: the BTCV map


def test_slice_cache_keys_on_the_label_map(tmp_path):
    path = _dataset(tmp_path / "d", n=2, test=0)
    entries = read_decathlon_datalist(path)["training"][:1]
    first = extract_slices(entries, tmp_path / "c", label_map=MAP, progress=False)
    with np.load(first[0]["image"]) as npz:
        assert set(np.unique(npz["label"])) == {0, 1}
    index = json.loads((tmp_path / "c" / "index.json").read_text())
    assert index["volumes"]["vol_0"]["params"]["label_map"] == [[0, 0], [3, 1], [7, 2]]
    extract_slices(entries, tmp_path / "c", label_map={0: 0, 3: 2, 7: 1}, progress=False)  # another map: re-read
    with np.load(first[0]["image"]) as npz:
        assert set(np.unique(npz["label"])) == {0, 2}
    with pytest.raises(DatasetError, match=r"case vol_0 .*vol_0\.nii\.gz.* value\(s\) \[7\]"):
        extract_slices(entries, tmp_path / "c2", label_map={0: 0, 3: 1}, progress=False)


def test_preset_with_a_label_map(tmp_path):
    root = tmp_path / "raw"
    generate_synthetic_ct(root, cases=[5], shape=(24, 24, 4))
    slices = source_datalist("btcv", root, "train", cases=[5], slices=True, cache_dir=str(tmp_path / "c"),
                             label_map={i: int(i == 6) for i in range(14)}, num_classes=2)  # fmt: skip  (liver only)
    labels = np.concatenate([np.load(s["label"])["label"].ravel() for s in slices])
    assert set(np.unique(labels)) == {0, 1}
    generate_synthetic_ct(root, cases=[6, 7], shape=(24, 24, 4))
    volumes = source_datalist("btcv", root, "train", cases=[5, 6, 7], data_fraction=0.7)  # low-data: 2 of 3 cases
    assert len(volumes) == 2 and volumes == source_datalist("btcv", root, "train", cases=[5, 6, 7], data_fraction=0.7)
    assert len(source_datalist("btcv", root, "val", cases=[5, 6, 7], data_fraction=0.7)) == 3  # train split only
    with pytest.raises(SettingError, match="does not apply to dataset 'transunet'"):
        synapse_source("transunet", root, label_map={0: 0}, num_classes=2)


# ---------------------------------------------------------------- settings and class names
def test_class_names():
    assert synapse_class_names(9)[1:3] == ["spleen", "right_kidney"]
    assert synapse_class_names(9, "own.json") == ["background", *(f"class_{i}" for i in range(1, 9))]
    assert check_class_names(["bg", "a", "b"], 3) == ["a", "b"] and check_class_names(["a", "b"], 3) == ["a", "b"]
    with pytest.raises(SettingError, match="class_names must list 3 distinct names"):
        check_class_names(["a", "a"], 3)


def test_a_datalist_json_is_checked_when_the_source_is_built(tmp_path):
    """The settings that need the files (a JSON that is no file, a dataset_dir that is a file) are checked when the
    data source is built, the bundle's check_settings, before any datalist is read."""
    path = _dataset(tmp_path, n=2, test=0)
    with pytest.raises(DatasetError, match="does not exist"):
        synapse_source(data_list_file_path=str(tmp_path / "nonexistent.json"))
    with pytest.raises(DatasetError, match="is not a file"):
        synapse_source(data_list_file_path=str(tmp_path))
    with pytest.raises(DatasetError, match="is a file, not a folder"):
        synapse_source(data_list_file_path=str(path), dataset_dir=str(path))
    with pytest.raises(DatasetError, match="is a file, not a folder"):
        synapse_source("btcv", str(path))
    source = synapse_source(data_list_file_path=str(path), num_classes=3, label_map=MAP)
    assert source.label_map == MAP and source.data_list_file_path == str(path) and source.dataset_dir is None
    assert source.class_names == ("background", "class_1", "class_2")
