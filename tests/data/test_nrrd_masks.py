"""The 2D bundle's masks as NRRD files and 3D Slicer segmentations: the folder and JSON datalists accept them, and
the bundle's loading gives the same masks as PNG files; segments go to the classes by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("nrrd", reason="NRRD masks need pynrrd (the label extra)")

import nrrd  # noqa: E402
from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged  # noqa: E402

from spectraflow_monai.data import DatasetError, Image2DReader, decathlon_datalist, folder_datalist  # noqa: E402
from spectraflow_monai.data.label_mode import label_mode  # noqa: E402

SIZE = (12, 16)  # (H, W)
CLASSES = {"background": 0, "polyp": 255, "tool": 100}


def _mask(i: int, values=(255, 100)) -> np.ndarray:
    mask = np.zeros(SIZE, np.uint8)
    mask[2 + i : 7 + i, 3:9] = values[0]
    mask[8:11, 10:14 - i] = values[1]
    return mask


def _write(path: Path, mask: np.ndarray, kind: str, segments: dict | None = None) -> Path:
    """``mask`` (H, W) as PNG, as a 2D NRRD, or as a 3D Slicer segmentation (one slice; segments listed in
    ``segments`` order {name: value in ``mask``}, stored as 1, 2, ...)."""
    if kind == "png":
        Image.fromarray(mask).save(path.with_suffix(".png"))
        return path.with_suffix(".png")
    if kind == "nrrd":
        out = path.with_suffix(".nrrd")
        nrrd.write(str(out), np.ascontiguousarray(mask.T))
        return out
    out = path.parent / f"{path.name}.seg.nrrd"
    stored = np.zeros(mask.shape, np.uint8)
    header = {"space": "left-posterior-superior", "space directions": np.diag([0.5, 0.5, 1.0]),
              "space origin": np.zeros(3), "kinds": ["domain"] * 3}  # fmt: skip
    for number, (name, value) in enumerate((segments or {}).items()):
        stored[mask == value] = number + 1
        header.update({f"Segment{number}_Name": name, f"Segment{number}_LabelValue": str(number + 1),
                       f"Segment{number}_Layer": "0"})  # fmt: skip
    nrrd.write(str(out), np.ascontiguousarray(stored.T)[:, :, None], header)
    return out


def _folder(root: Path, kind: str, binary: bool) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(4):
        rgb = np.random.RandomState(i).randint(0, 255, (*SIZE, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(root / "images" / f"case{i}.png")
        mask = _mask(i, (255, 255) if binary else (255, 100))
        segments = {"foreground": 255} if binary else {"tool": 100, "Polyp": 255}  # not in class order
        _write(root / "masks" / f"case{i}", mask, kind, segments)
    return root


def _loaded(entries, mode) -> list[np.ndarray]:
    load = Compose([LoadImaged("label", reader=Image2DReader("label", mode), image_only=True),
                    EnsureChannelFirstd("label"), mode.label_transform("label")])  # fmt: skip
    return [np.asarray(load(dict(e))["label"]) for e in entries]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "classes"])
@pytest.mark.parametrize("kind", ["nrrd", "seg.nrrd"])
def test_nrrd_masks_load_as_the_png_masks(tmp_path, kind, binary):
    mode = label_mode(None if binary else CLASSES)
    ref = folder_datalist(_folder(tmp_path / "png", "png", binary), split="all", label_classes=mode.label_classes)
    got = folder_datalist(_folder(tmp_path / kind, kind, binary), split="all", label_classes=mode.label_classes)
    assert [e["name"] for e in got] == [e["name"] for e in ref] == [f"case{i}" for i in range(4)]
    for a, b in zip(_loaded(got, mode), _loaded(ref, mode)):
        np.testing.assert_array_equal(a, b)
    assert any(a.max() > 0 for a in _loaded(got, mode))


def test_a_json_datalist_takes_a_segmentation(tmp_path):
    mode = label_mode(CLASSES)
    root = _folder(tmp_path, "seg.nrrd", binary=False)
    items = [{"image": f"images/case{i}.png", "label": f"masks/case{i}.seg.nrrd"} for i in range(4)]
    (root / "data.json").write_text(json.dumps({"training": items[:3], "validation": items[3:]}))
    entries = decathlon_datalist(root / "data.json", split="val", label_classes=CLASSES)
    assert set(np.unique(_loaded(entries, mode)[0])) == {0, 1, 2}


def test_an_unknown_segment_is_named(tmp_path):
    root = _folder(tmp_path, "png", binary=True)
    bad = _write(root / "masks" / "case1", _mask(1, (255, 255)), "seg.nrrd", {"lesion": 255})
    (root / "masks" / "case1.png").unlink()
    with pytest.raises(DatasetError) as info:
        folder_datalist(root, split="all")
    assert "segment 'lesion' is not a class of the model (classes: background, foreground)" in str(info.value)
    assert str(bad) in str(info.value)


def test_an_nrrd_mask_of_another_size_names_both_files(tmp_path):
    root = _folder(tmp_path, "png", binary=True)
    (root / "masks" / "case2.png").unlink()
    bad = _write(root / "masks" / "case2", np.zeros((10, 16), np.uint8), "nrrd")
    with pytest.raises(DatasetError) as info:
        folder_datalist(root, split="all")
    assert str(bad) in str(info.value) and str(root / "images" / "case2.png") in str(info.value)
    assert "16x12 but its mask" in str(info.value) and "is 16x10" in str(info.value)
