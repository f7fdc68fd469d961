"""Own data in the ``spectraflow_2d_segmentation`` bundle: folder pairs, a Decathlon datalist JSON, label maps.

Each source is made in the test (a few 28x28 files), trained for one epoch (a 2-block random encoder), evaluated and
used for inference through ``monai.bundle.run`` with the bundle's own configs. Bad inputs stop the run before
training with a message naming the file, and leave what was written before untouched.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from spectraflow_monai.utils.errors import DataError, find_input_error
from tests.bundles.helpers import load_weights, parse_config, run_bundle

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "bundles" / "spectraflow_2d_segmentation" / "configs"
TRAIN, EVALUATE, INFERENCE = (str(CONFIGS / f"{n}.yaml") for n in ("train", "evaluate", "inference"))
META = str(CONFIGS / "metadata.json")
SIZE = 28
NET = {"image_size": SIZE, "encoder_kwargs": {"depth": 2}}
RUN = {
    **NET,
    "num_workers": 0,
    "progress_bar": False,
    "pretrained_weights": "none",
    "encoder_init": "random",
    "max_epochs": 1,
    "batch_size": 2,
    "val_batch_size": 2,
}


def _scene(i: int, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """A bright square (class 1) and, for 3 classes, a dark bar (class 2) on noise; returns (grey 0..1, labels)."""
    rng = np.random.default_rng(i)
    img = rng.uniform(0.3, 0.5, (SIZE, SIZE))
    lab = np.zeros((SIZE, SIZE), dtype=np.uint8)
    r, c = 3 + i % 6, 4 + (2 * i) % 8
    img[r : r + 9, c : c + 9], lab[r : r + 9, c : c + 9] = 0.95, 1
    if classes > 2:
        img[20:24, 2:26], lab[20:24, 2:26] = 0.05, 2
    return img, lab


def _folder_pairs(root: Path, n: int = 6) -> Path:
    """images/ as TIFFs (16-bit planar RGB that Pillow cannot open, 8-bit grey), masks/ as <id>_mask.png 0/255 or a
    GIF (palette 0/1)."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        img, lab = _scene(i)
        if i % 2:
            rgb = (np.stack([img] * 3) * 65535).astype(np.uint16)  # (3, H, W)
            tifffile.imwrite(root / "images" / f"case{i}.tif", rgb, planarconfig="separate", photometric="rgb")
        else:
            tifffile.imwrite(root / "images" / f"case{i}.tiff", (img * 255).astype(np.uint8))
        if i == 3:
            Image.fromarray(lab).convert("P").save(root / "masks" / f"case{i}_mask.gif")
        else:
            Image.fromarray(lab * 255).save(root / "masks" / f"case{i}_mask.png")
    return root


def _images(data: Path) -> list[Path]:
    return sorted((data / "images").iterdir())


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _train_evaluate_infer(root: Path, source: dict, infer_files: list[Path]) -> dict:
    common = {"bundle_root": str(root), **RUN, **source}
    run_bundle(TRAIN, META, **common)
    model = load_weights(root / "models" / "model.pt")
    run_bundle([TRAIN, EVALUATE], META, **common)
    in_dir = root / "infer_in"
    in_dir.mkdir()
    for f in infer_files:
        (in_dir / f.name).write_bytes(f.read_bytes())
    infer = {k: v for k, v in source.items() if k == "label_classes"}
    run_bundle(INFERENCE, META, bundle_root=str(root), input_dir=str(in_dir), output_dir=str(root / "pred"), **NET,
               **infer)  # fmt: skip
    return {"model": model, "rows": _rows(root / "eval" / "metrics.csv"), "pred": sorted((root / "pred").iterdir())}


def test_folder_pairs_with_tiff_images_and_suffixed_masks(tmp_path, caplog):
    data = _folder_pairs(tmp_path / "data")
    caplog.set_level("INFO")
    out = _train_evaluate_infer(tmp_path / "b", {"dataset": "folder", "dataset_dir": str(data)},
                                sorted((data / "images").iterdir())[:2])  # fmt: skip
    held = [r["name"] for r in out["rows"]]
    assert len(held) == 1 and held[0].startswith("case")  # round(0.2 * 6) = 1 image held out, seed 0
    assert f"held out for validation (val_fraction 0.2, seed 0): {held}" in caplog.text
    assert [p.name for p in out["pred"]] == ["case0_seg.png", "case1_seg.png"]
    for p in out["pred"]:
        mask = np.asarray(Image.open(p))
        assert mask.shape == (SIZE, SIZE) and set(np.unique(mask).tolist()) <= {0, 255}


def test_decathlon_datalist_json(tmp_path):
    data = _folder_pairs(tmp_path / "data", n=7)
    items = [{"image": f"images/{p.name}", "label": f"masks/{p.stem}_mask.png"} for p in _images(data)]
    items = [it if "case3" not in it["image"] else dict(it, label="masks/case3_mask.gif") for it in items]
    js = tmp_path / "lists" / "datalist.json"
    js.parent.mkdir()
    js.write_text(json.dumps({"training": items[:4], "validation": items[4:6], "test": items[6:]}))
    source = {"data_list_file_path": str(js), "dataset_dir": str(data)}
    out = _train_evaluate_infer(tmp_path / "b", source, [data / "images" / "case6.tiff"])
    assert [r["name"] for r in out["rows"]] == ["case6"]  # evaluation scores the test list
    assert [p.name for p in out["pred"]] == ["case6_seg.png"]
    # inference.yaml segments the JSON's `test` list when data_list_file_path is given (input_dir is not read)
    pred_json = tmp_path / "pred_json"
    run_bundle(INFERENCE, META, bundle_root=str(tmp_path / "b"), output_dir=str(pred_json), **NET, **source)
    assert sorted(p.name for p in pred_json.iterdir()) == ["case6_seg.png"]


def test_multi_class_label_maps(tmp_path):
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    for i in range(6):
        img, lab = _scene(i, classes=3)
        Image.fromarray((np.stack([img] * 3, -1) * 255).astype(np.uint8)).save(data / "images" / f"s{i}.png")
        Image.fromarray(lab).save(data / "masks" / f"s{i}.png")  # values 0, 1, 2
    classes = ["background", "square", "bar"]
    source = {"dataset": "folder", "dataset_dir": str(data), "label_classes": classes}
    out = _train_evaluate_infer(tmp_path / "b", source, [data / "images" / "s0.png"])
    heads = [v for k, v in out["model"].items() if v.ndim == 4 and v.shape[0] == 3]
    assert heads, "a 3-channel output layer"
    assert {r["class"] for r in out["rows"]} == {"square", "bar"}  # per class, background excluded
    pred = np.asarray(Image.open(out["pred"][0]))
    assert pred.shape == (SIZE, SIZE) and set(np.unique(pred).tolist()) <= {0, 1, 2}
    saved = np.asarray(Image.open(next((tmp_path / "b" / "eval" / "predictions").iterdir())))
    assert set(np.unique(saved).tolist()) <= {0, 1, 2}


def test_slicer_segmentations_as_masks(tmp_path):
    """Masks saved by 3D Slicer (``<id>.seg.nrrd``, one slice, segments numbered against the class order) train,
    evaluate and score per class: each segment is its class by name."""
    nrrd = pytest.importorskip("nrrd", reason="NRRD masks need pynrrd (the label extra)")
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    classes = ["background", "square", "bar"]
    for i in range(6):
        img, lab = _scene(i, classes=3)
        Image.fromarray((np.stack([img] * 3, -1) * 255).astype(np.uint8)).save(data / "images" / f"s{i}.png")
        stored = np.where(lab == 2, 1, np.where(lab == 1, 2, 0)).astype(np.uint8)  # bar = segment 1, square = 2
        header = {"space": "left-posterior-superior", "space directions": np.eye(3), "space origin": np.zeros(3),
                  "Segment0_Name": "Bar", "Segment0_LabelValue": "1", "Segment0_Layer": "0",
                  "Segment1_Name": "square", "Segment1_LabelValue": "2", "Segment1_Layer": "0"}  # fmt: skip
        nrrd.write(str(data / "masks" / f"s{i}.seg.nrrd"), np.ascontiguousarray(stored.T)[:, :, None], header)
    source = {"dataset": "folder", "dataset_dir": str(data), "label_classes": classes}
    parser = parse_config(TRAIN, bundle_root=str(tmp_path / "b"), **RUN, **source)
    entry = parser.get_parsed_content("train#datalist")[0]
    from monai.transforms import Compose

    loaded = Compose(parser.get_parsed_content("load_transforms")[:4])(dict(entry))  # read, label classes
    _, lab = _scene(int(entry["name"][1:]), classes=3)
    np.testing.assert_array_equal(np.asarray(loaded["label"][0]).T, lab)  # (W, H) as the bundle reads PNGs
    out = _train_evaluate_infer(tmp_path / "b", source, [data / "images" / "s0.png"])
    assert {r["class"] for r in out["rows"]} == {"square", "bar"}


@pytest.mark.parametrize("problem", ["missing", "size", "unreadable", "values", "classes", "empty", "dir_is_file"])
def test_bad_input_stops_before_training_and_keeps_outputs(tmp_path, problem):
    data = _folder_pairs(tmp_path / "data", n=4)
    root = tmp_path / "b"
    (root / "models").mkdir(parents=True)
    (root / "models" / "model.pt").write_bytes(b"earlier model")
    items = [{"image": f"images/{p.name}", "label": f"masks/{p.stem}_mask.png"} for p in _images(data)]
    items[3]["label"] = "masks/case3_mask.gif"
    settings, named = {"dataset_dir": str(data)}, None
    if problem == "missing":
        items[1]["label"], named = "masks/nope.png", str(data / "masks" / "nope.png")
    elif problem == "size":
        Image.fromarray(np.zeros((SIZE, SIZE + 3), np.uint8)).save(data / "masks" / "case2_mask.png")
        named = str(data / "masks" / "case2_mask.png")
    elif problem == "unreadable":
        (data / "images" / "case0.tiff").write_bytes(b"II*\x00 not a tiff")
        named = str(data / "images" / "case0.tiff")
    elif problem == "values":
        Image.fromarray(np.full((SIZE, SIZE), 128, np.uint8)).save(data / "masks" / "case2_mask.png")
        named = str(data / "masks" / "case2_mask.png")
    elif problem == "classes":
        settings["label_classes"] = {0: 0, 255: 1}
        named = str(data / "masks" / "case3_mask.gif")  # palette 0/1: the value 1 is not a class
    elif problem == "dir_is_file":
        settings["dataset_dir"] = named = str(data / "images" / "case0.tiff")
    js = tmp_path / "datalist.json"
    lists = {"training": [] if problem == "empty" else items}
    js.write_text(json.dumps(lists))
    named = named or str(js)
    with pytest.raises(Exception) as info:
        run_bundle(TRAIN, META, bundle_root=str(root), data_list_file_path=str(js), **RUN, **settings)
    error = find_input_error(info.value)
    assert isinstance(error, DataError) and named in str(error), str(error)
    assert (root / "models" / "model.pt").read_bytes() == b"earlier model"


@pytest.mark.parametrize(
    "classes",
    [{"background": 255, "membrane": 0}, {255: 0, 0: 1}],
    ids=["names_foreground_value_0", "values_foreground_value_0"],
)
def test_two_class_label_map_with_foreground_value_0(tmp_path, classes):
    """An EM-style stack: membrane (the foreground) stored as 0 on a 255 background; 2 classes trained as a label
    map (2 channels, softmax) are evaluated per image and inferred."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    for i in range(6):
        img, lab = _scene(i)
        Image.fromarray((img * 255).astype(np.uint8)).save(data / "images" / f"em{i}.png")
        Image.fromarray(np.where(lab == 1, 0, 255).astype(np.uint8)).save(data / "masks" / f"em{i}.png")
    source = {"dataset": "folder", "dataset_dir": str(data), "label_classes": classes}
    out = _train_evaluate_infer(tmp_path / "b", source, [data / "images" / "em0.png"])
    heads = [v for k, v in out["model"].items() if v.ndim == 4 and v.shape[0] == 2]
    assert heads, "a 2-channel output layer"
    assert len(out["rows"]) == 1 and float(out["rows"][0]["dice"]) >= 0.0
    assert out["rows"][0]["class"] == ("membrane" if "membrane" in classes else "class_1")
    pred = np.asarray(Image.open(out["pred"][0]))
    assert pred.shape == (SIZE, SIZE) and set(np.unique(pred).tolist()) <= {0, 255}  # the source values
    saved = np.asarray(Image.open(next((tmp_path / "b" / "eval" / "predictions").iterdir())))
    assert set(np.unique(saved).tolist()) <= {0, 255}


@pytest.mark.parametrize("dataset_dir", [None, "other"], ids=["json_folder", "dataset_dir_given"])
def test_datalist_json_paths_resolve_against_its_folder(tmp_path, dataset_dir):
    """A datalist JSON with relative paths and no --dataset_dir: the paths start at the JSON's own folder (as in the
    Synapse bundle); a given dataset_dir is their base instead."""
    data = _folder_pairs(tmp_path / "own", n=4)
    items = [{"image": f"images/{p.name}", "label": f"masks/{p.stem}_mask.png"} for p in _images(data)]
    items = [it if "case3" not in it["image"] else dict(it, label="masks/case3_mask.gif") for it in items]
    js = data / "dataset.json"
    js.write_text(json.dumps({"training": items[:3], "validation": items[3:]}))
    settings = {"bundle_root": str(tmp_path / "b"), **NET, "data_list_file_path": str(js)}
    if dataset_dir is not None:
        other = tmp_path / dataset_dir
        (other / "images").mkdir(parents=True)
        (other / "masks").mkdir()
        for it in items:
            for f in it.values():
                (other / f).write_bytes((data / f).read_bytes())
        settings["dataset_dir"] = str(other)
    parser = parse_config(TRAIN, **settings)
    base = tmp_path / (dataset_dir or "own")
    train = parser.get_parsed_content("data_source").datalist("train")
    assert [e["image"] for e in train] == [str(base / it["image"]) for it in items[:3]]
    assert parser.get_parsed_content("dataset_dir") == str(base)


def test_scores_at_original_size_inside_the_field_of_view(tmp_path):
    """Evaluation of a datalist whose test entries carry a field-of-view mask (``"fov"``, relative path): only the
    pixels inside it are scored; ``score_at_original_size`` scores each image at its own size (52x40 here) instead
    of image_size."""
    data = tmp_path / "data"
    for sub in ("images", "masks", "fov"):
        (data / sub).mkdir(parents=True)
    items = []
    for i in range(6):
        img, lab = np.full((40, 52), 0.4), np.zeros((40, 52), np.uint8)
        img[8 + i : 24 + i, 6:30], lab[8 + i : 24 + i, 6:30] = 0.9, 255
        fov = np.zeros((40, 52), np.uint8)
        fov[:, :20] = 255  # the left part is the field of view
        Image.fromarray((img * 255).astype(np.uint8)).save(data / "images" / f"r{i}.png")
        Image.fromarray(lab).save(data / "masks" / f"r{i}.png")
        Image.fromarray(fov).save(data / "fov" / f"r{i}.png")
        items.append({"image": f"images/r{i}.png", "label": f"masks/r{i}.png", "fov": f"fov/r{i}.png"})
    js = data / "dataset.json"
    js.write_text(json.dumps({"training": items[:4], "test": items[4:]}))
    common = {"bundle_root": str(tmp_path / "b"), **RUN, "data_list_file_path": str(js)}
    run_bundle(TRAIN, META, **common)
    gt_inside = {f"r{i}": int(((np.asarray(Image.open(data / "masks" / f"r{i}.png")) > 0)[:, :20]).sum()) for i in (4, 5)}
    run_bundle([TRAIN, EVALUATE], META, **common, score_at_original_size=True)
    rows = _rows(tmp_path / "b" / "eval" / "metrics.csv")
    assert {r["name"]: int(r["gt_area"]) for r in rows} == gt_inside  # original size, inside the field of view
    run_bundle([TRAIN, EVALUATE], META, **common)
    rows = _rows(tmp_path / "b" / "eval" / "metrics.csv")
    areas = {r["name"]: int(r["gt_area"]) for r in rows}
    scale = SIZE * SIZE / (40 * 52)  # at 28x28 (image_size), inside the field of view (the whole square: ~1.7x)
    assert all(abs(areas[n] - gt_inside[n] * scale) < 0.2 * gt_inside[n] * scale for n in areas), (areas, gt_inside)
