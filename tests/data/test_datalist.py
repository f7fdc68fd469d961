"""Tests of :mod:`spectraflow_monai.data.datalist` (one contract for presets, datalist JSON, folder pairs) and of
:mod:`spectraflow_monai.data.label_mode` (binary masks or named classes)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from PIL import Image

from spectraflow_monai.apps.seg2d import build_datalist, canonical_source_name
from spectraflow_monai.apps.seg2d import label_setup
from spectraflow_monai.data import DatasetError, decathlon_datalist, folder_datalist, holdout, inference_files, label_mode
from spectraflow_monai.transforms import LabelClassesd
from spectraflow_monai.utils.errors import DataError, SettingError


def _pair(root, name, mask_name, value=255, size=(8, 8)):
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(exist_ok=True)
    Image.fromarray(np.full((*size, 3), 90, np.uint8)).save(root / "images" / f"{name}.png")
    mask = np.zeros(size, np.uint8)
    mask[2:5, 2:5] = value
    Image.fromarray(mask).save(root / "masks" / mask_name)


def _folder(root, n=5, suffix="_mask"):
    for i in range(n):
        _pair(root, f"im{i}", f"im{i}{suffix}.png")
    return root


def test_folder_pairs_by_stem_and_suffix(tmp_path):
    _pair(tmp_path, "a", "a.png")
    _pair(tmp_path, "b", "b_anno.png")
    _pair(tmp_path, "c", "c_segmentation.png", value=1)  # a 0/1 mask
    entries = folder_datalist(tmp_path, "all")
    assert [(e["name"], e["label"].rsplit("/", 1)[-1]) for e in entries] == [
        ("a", "a.png"), ("b", "b_anno.png"), ("c", "c_segmentation.png")
    ]  # fmt: skip
    assert [e["label_threshold"] for e in entries] == [128, 128, 1]
    with pytest.raises(DatasetError, match="without an image") as e:
        folder_datalist(tmp_path, "all", mask_suffix="_anno")
    assert "a.png" in str(e.value)
    _pair(tmp_path, "a", "a_mask.png")
    with pytest.raises(DatasetError, match="two masks"):
        folder_datalist(tmp_path, "all")


def test_folder_holdout_is_seeded_logged_and_nested_with_fraction(tmp_path, caplog):
    _folder(tmp_path, n=10)
    caplog.set_level(logging.INFO)
    val = [e["name"] for e in folder_datalist(tmp_path, "val", seed=3, val_fraction=0.3)]
    train = [e["name"] for e in folder_datalist(tmp_path, "train", seed=3, val_fraction=0.3)]
    assert len(val) == 3 and sorted(train + val) == [f"im{i}" for i in range(10)]
    assert f"held out for validation (val_fraction 0.3, seed 3): {val}" in caplog.text
    assert val == [e["name"] for e in folder_datalist(tmp_path, "val", seed=3, val_fraction=0.3)]
    assert val != [e["name"] for e in folder_datalist(tmp_path, "val", seed=4, val_fraction=0.3)]
    small = [e["name"] for e in folder_datalist(tmp_path, "train", fraction=0.5, seed=3, val_fraction=0.3)]
    assert set(small) <= set(train) and len(small) == 3  # round(0.5 * 7), halves rounded down
    assert [e["name"] for e in folder_datalist(tmp_path, "test", seed=3, val_fraction=0.3)] == val


def test_folder_split_files(tmp_path):
    _folder(tmp_path, n=4)
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "train.txt").write_text("im0\nim1\nim2\n")
    (tmp_path / "splits" / "val.txt").write_text("im3.png\n")
    assert [e["name"] for e in folder_datalist(tmp_path, "val")] == ["im3"]
    assert [e["name"] for e in folder_datalist(tmp_path, "train")] == ["im0", "im1", "im2"]
    (tmp_path / "splits" / "val.txt").write_text("im9\n")
    with pytest.raises(DatasetError, match="im9"):
        folder_datalist(tmp_path, "val")


def test_decathlon_json_resolves_paths_like_monai(tmp_path):
    data = _folder(tmp_path / "data", n=4)
    items = [{"image": f"images/im{i}.png", "label": f"masks/im{i}_mask.png", "extra": i} for i in range(4)]
    js = tmp_path / "lists" / "d.json"
    js.parent.mkdir()
    js.write_text(json.dumps({"training": items[:3], "validation": items[3:]}))
    train = decathlon_datalist(js, data, "train")
    assert [e["name"] for e in train] == ["im0", "im1", "im2"] and train[0]["extra"] == 0
    assert train[0]["image"] == str(data / "images" / "im0.png")
    assert [e["name"] for e in decathlon_datalist(js, data, "test")] == ["im3"]  # no test list: validation
    (data / "d.json").write_text(js.read_text())  # dataset_dir None: relative to the JSON's folder
    assert len(build_datalist("datalist", None, "val", data_list_file_path=str(data / "d.json"))) == 1
    js.write_text(json.dumps({"training": items}))  # no validation list: the seeded hold-out
    assert len(decathlon_datalist(js, data, "val")) == 1 and len(decathlon_datalist(js, data, "train")) == 3


@pytest.mark.parametrize(
    "content, match",
    [
        ({"training": [{"image": "images/im0.png", "label": "masks/gone.png"}]}, "gone.png' does not exist"),
        ({"training": []}, "'training' list is empty"),
        ({"validation": []}, "'training' list"),
        ({"training": [{"image": "images/im0.png"}]}, "'image' and 'label'"),
        ("not json", "not a readable JSON"),
    ],
)
def test_decathlon_json_problems_name_the_file(tmp_path, content, match):
    data = _folder(tmp_path / "data", n=2)
    js = tmp_path / "d.json"
    js.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DatasetError, match=match) as e:
        decathlon_datalist(js, data, "train")
    assert str(js) in str(e.value)


def test_bad_sources_and_settings(tmp_path):
    data = _folder(tmp_path / "data", n=3)
    js = tmp_path / "d.json"
    js.write_text(json.dumps({"training": [{"image": "images/im0.png", "label": "masks/im0_mask.png"}] * 2}))
    with pytest.raises(DatasetError, match="is a file, not a folder"):
        folder_datalist(data / "images" / "im0.png")
    with pytest.raises(DatasetError, match="share the name"):
        decathlon_datalist(js, data)
    for call in (
        lambda: build_datalist("datalist", data),
        lambda: build_datalist("folder", data, "holdout"),
        lambda: build_datalist("folder", data, val_fraction=1.0),
        lambda: build_datalist("folder", data, split_dir="x"),
        lambda: build_datalist("kvasir", data, label_classes=["bg", "polyp"]),
        lambda: build_datalist("folder", data, label_threshold=128),
        lambda: build_datalist("brats", data),
    ):
        with pytest.raises(SettingError):
            call()
    with pytest.raises(DatasetError, match="from 1 training image"):
        holdout([{"name": "a"}], 0.2)
    assert canonical_source_name("Kvasir-SEG") == "kvasir" and canonical_source_name("folder") == "folder"
    assert canonical_source_name("synthetic", str(js)) == "datalist"


def test_presets_keep_their_contract(tmp_path):
    entries = build_datalist("synthetic", tmp_path, "val", generate=True, num_train=2, num_val=2, size=16)
    assert len(entries) == 2 and set(entries[0]) == {"image", "label", "name", "label_threshold"}
    assert [e["name"] for e in build_datalist("synthetic", tmp_path, "test")] == [e["name"] for e in entries]


def test_non_zero_threshold_and_binary_value_check(tmp_path):
    _folder(tmp_path, n=3)
    instances = np.array([[0, 3], [7, 0]], np.uint8).repeat(4, 0).repeat(4, 1)
    Image.fromarray(instances).save(tmp_path / "masks" / "im1_mask.png")
    with pytest.raises(DatasetError, match="im1_mask.png"):
        folder_datalist(tmp_path, "all")
    entries = folder_datalist(tmp_path, "all", label_threshold=1)  # instance maps: foreground = non-zero
    assert {e["label_threshold"] for e in entries} == {1}


@pytest.mark.parametrize(
    "classes, names, mapping",
    [
        (["bg", "polyp", "tool"], ["bg", "polyp", "tool"], {0: 0, 1: 1, 2: 2}),
        ({0: 0, 128: 1, 255: 2}, ["background", "class_1", "class_2"], {0: 0, 128: 1, 255: 2}),
        ({"bg": 0, "polyp": [100, 101], "tool": 255}, ["bg", "polyp", "tool"], {0: 0, 100: 1, 101: 1, 255: 2}),
    ],
)
def test_label_classes_forms(classes, names, mapping):
    mode = label_mode(classes)
    assert mode.class_names == names and mode.label_map == mapping and mode.num_classes == 3
    setup = label_setup(classes)  # what the 2D bundle builds from the same setting
    assert setup.class_names == names and setup.label_map == mapping and setup.out_channels == 3
    assert (setup.softmax, setup.sigmoid, setup.to_onehot_y, setup.include_background) == (True, False, True, False)
    binary = label_setup("null")
    assert binary.binary and binary.out_channels == 1 and binary.sigmoid and binary.include_background and binary.save_scale == 255


@pytest.mark.parametrize("bad", [["only"], "polyp", {0: 0, 5: 2}, ["a", "a"], {"bg": 0, "x": 0}, {"bg": "x"}])
def test_bad_label_classes(bad):
    with pytest.raises(SettingError, match="label_classes"):
        label_mode(bad)
    with pytest.raises(SettingError, match="label_classes"):
        label_setup(bad)


def test_label_classes_transform_and_mask_check(tmp_path):
    mode = label_mode({0: 0, 128: 1, 255: 2})
    label = MetaTensor(torch.tensor([[[0.0, 128.0], [255.0, 0.0]]]), meta={"filename_or_obj": "/d/m.png"})
    out = mode.label_transform("label")({"label": label})["label"]
    assert out.tolist() == [[[0.0, 1.0], [2.0, 0.0]]]
    with pytest.raises(DataError, match=r"'/d/m.png' holds value\(s\) \[7\]"):
        LabelClassesd("label", mode.label_map)({"label": MetaTensor(label + 7 * (label == 0), meta=label.meta)})
    colour = MetaTensor(torch.stack([label[0], label[0] * 0, label[0]]), meta=label.meta)
    with pytest.raises(DataError, match="colour image"):
        mode.label_transform("label")({"label": colour})
    _folder(tmp_path, n=3)  # masks 0/255: 255 is class 2, fine; then a value outside the classes
    assert len(folder_datalist(tmp_path, "all", label_classes={0: 0, 128: 1, 255: 2})) == 3
    Image.fromarray(np.full((8, 8), 9, np.uint8)).save(tmp_path / "masks" / "im2_mask.png")
    with pytest.raises(DatasetError, match=r"im2_mask.png' holds value\(s\) \[9\]"):
        folder_datalist(tmp_path, "all", label_classes={0: 0, 128: 1, 255: 2})


@pytest.mark.parametrize("entry", ["images/a.png", {"image": "images/a.png"}, {"image": "images/a.png", "label": "x"}])
def test_inference_files_reads_the_test_list(tmp_path, entry):
    js = tmp_path / "d.json"
    js.write_text(json.dumps({"training": [], "test": [entry]}))
    assert inference_files(None, data_list_file_path=js) == [str(tmp_path / "images" / "a.png")]
    assert inference_files(None, data_list_file_path=js, dataset_dir="/base") == ["/base/images/a.png"]


@pytest.mark.parametrize(
    "content,match",
    [
        ({"training": []}, "no 'test' list"),
        ({"test": [3]}, "must be a path"),
        ("[", "not valid JSON"),
        (None, "not a file"),
    ],
)
def test_inference_files_names_a_bad_datalist(tmp_path, content, match):
    js = tmp_path / "d.json"
    if content is not None:
        js.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DatasetError, match=match):
        inference_files(None, data_list_file_path=js)


def test_inference_files_globs_images_of_a_folder(tmp_path):
    for name in ("b.png", "a.tif", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [os.path.basename(f) for f in inference_files(tmp_path)] == ["a.tif", "b.png"]
    with pytest.raises(DatasetError, match="not a folder"):
        inference_files(tmp_path / "missing")
    assert inference_files(tmp_path, "*.jpg") == []
    expected = r"no image matches '\*\.jpg' in .*--inference_settings#input_dir and #input_pattern"
    with pytest.raises(FileNotFoundError, match=expected):
        inference_files(tmp_path, "*.jpg", require_any=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("source", ["folder_pattern", "json_groups"])
def test_grouped_holdout_keeps_each_video_in_one_split(tmp_path, seed, source):
    """Frames of one video (CVC-style ids ``v<video>_f<frame>``) are never split between training and validation:
    a folder with ``group_pattern``, or a JSON whose entries carry a ``group`` field."""
    data = tmp_path / "data"
    names = [f"v{v}_f{f}" for v in range(5) for f in range(4)]
    for n in names:
        _pair(data, n, f"{n}_mask.png")
    if source == "folder_pattern":
        kw = {"group_pattern": r"^(v\d+)_"}
        train = folder_datalist(data, "train", seed=seed, **kw)
        val = folder_datalist(data, "val", seed=seed, **kw)
    else:
        items = [{"image": f"images/{n}.png", "label": f"masks/{n}_mask.png", "group": n.split("_")[0]} for n in names]
        (data / "d.json").write_text(json.dumps({"training": items}))
        train, val = (decathlon_datalist(data / "d.json", None, s, seed=seed) for s in ("train", "val"))
    video = {e["name"].split("_")[0] for e in train}, {e["name"].split("_")[0] for e in val}
    assert not video[0] & video[1] and len(video[1]) == 1  # round(0.2 * 5 groups) = 1 whole video held out
    assert len(train) + len(val) == 20 and len(val) == 4
    with pytest.raises(DatasetError, match="does not match the image id"):
        folder_datalist(data, "val", group_pattern=r"^patient(\d+)")
    with pytest.raises(SettingError, match="group_pattern"):
        folder_datalist(data, "val", group_pattern="(")


@pytest.mark.parametrize("relative", [True, False])
def test_decathlon_json_fov_paths_start_at_dataset_dir(tmp_path, monkeypatch, relative):
    """A JSON entry's ``fov`` is joined to ``dataset_dir`` once, whether that folder is given relative or absolute."""
    monkeypatch.chdir(tmp_path)
    data = _folder(tmp_path / "data", n=2)
    (data / "fov").mkdir()
    Image.fromarray(np.full((8, 8), 255, np.uint8)).save(data / "fov" / "im0.png")
    items = [{"image": f"images/im{i}.png", "label": f"masks/im{i}_mask.png"} for i in range(2)]
    items[0]["fov"] = "fov/im0.png"
    js = tmp_path / "d.json"
    js.write_text(json.dumps({"training": items[:1], "validation": items[1:]}))
    entries = decathlon_datalist(js, "data" if relative else str(data), "train")
    assert entries[0]["fov"] == str(data / "fov" / "im0.png")
    items[0]["fov"] = "fov/gone.png"
    js.write_text(json.dumps({"training": items[:1], "validation": items[1:]}))
    with pytest.raises(DatasetError, match="gone.png' does not exist"):
        decathlon_datalist(js, "data" if relative else str(data), "train")


def test_folder_field_of_view_masks_are_paired_like_masks(tmp_path):
    """``<dataset_dir>/fov/<id>_mask.png`` (DRIVE-style) gives the entry's ``fov``; images without one have none."""
    data = _folder(tmp_path / "data", n=3)
    (data / "fov").mkdir()
    for i in (0, 1):
        Image.fromarray(np.full((8, 8), 255, np.uint8)).save(data / "fov" / f"im{i}_mask.png")
    entries = {e["name"]: e for e in folder_datalist(data, "all")}
    assert entries["im0"]["fov"] == str(data / "fov" / "im0_mask.png") and "fov" not in entries["im2"]
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(data / "fov" / "other.png")
    with pytest.raises(DatasetError, match="other.png"):
        folder_datalist(data, "all")
