"""Tests of :mod:`spectraflow_monai.data.readers`: every 2D format users have, read by one MONAI ``ImageReader``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tifffile
import torch
from monai.transforms import Compose, EnsureChannelFirstd, LoadImage, LoadImaged, Resized, ScaleIntensityRanged
from PIL import Image

from spectraflow_monai.data import Image2DReader, read_2d
from spectraflow_monai.data.validation import DatasetError, check_image_readable, validate_datalist
from spectraflow_monai.utils.errors import DataError

KVASIR_REAL = os.environ.get(
    "SPECTRAFLOW_KVASIR_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "kvasir-seg"),
)
RNG = np.random.default_rng(0)
GREY8 = RNG.integers(0, 256, (5, 7), dtype=np.uint8)
RGB8 = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)
GREY16 = RNG.integers(0, 65536, (5, 7), dtype=np.uint16)
RGB16 = RNG.integers(0, 65536, (5, 7, 3), dtype=np.uint16)


def _load(path, kind="image"):
    return LoadImage(reader=Image2DReader(kind), image_only=True, ensure_channel_first=True)(str(path))


def _expect(x, hwc):  # (H, W, C) expected -> (C, W, H), the PILReader layout after EnsureChannelFirst
    return np.moveaxis(np.asarray(hwc, dtype=np.float32), (0, 1, 2), (2, 1, 0))


def _write(kind, path):
    if kind == "png_rgb":
        Image.fromarray(RGB8).save(path)
        return RGB8 / 255.0
    if kind == "jpeg_grey":
        Image.fromarray(GREY8).save(path, quality=100)
        return np.repeat(np.asarray(Image.open(path))[..., None], 3, -1) / 255.0
    if kind == "bmp_rgb":
        Image.fromarray(RGB8).save(path)
        return RGB8 / 255.0
    if kind == "png_grey16":
        Image.fromarray(GREY16).save(path)
        return np.repeat(GREY16[..., None], 3, -1) / 65535.0
    if kind == "png_rgba":
        Image.fromarray(np.concatenate([RGB8, np.full((5, 7, 1), 7, np.uint8)], -1)).save(path)
        return RGB8 / 255.0
    if kind == "gif_grey":
        Image.fromarray(GREY8).convert("P").save(path)
        return np.repeat(np.asarray(Image.open(path).convert("L"))[..., None], 3, -1) / 255.0
    if kind == "tiff_rgb16":  # Pillow would read it as 8-bit
        tifffile.imwrite(path, RGB16, photometric="rgb")
        return RGB16 / 65535.0
    if kind == "tiff_rgb16_planar":  # Pillow cannot open it
        tifffile.imwrite(path, np.moveaxis(RGB16, -1, 0), photometric="rgb", planarconfig="separate")
        return RGB16 / 65535.0
    if kind == "tiff_float16":  # Pillow cannot open it; floats are taken as stored
        values = RNG.random((5, 7)).astype(np.float16)
        tifffile.imwrite(path, values)
        return np.repeat(values.astype(np.float32)[..., None], 3, -1)
    raise AssertionError(kind)


EXT = {"png": ".png", "jpeg": ".jpg", "bmp": ".bmp", "gif": ".gif", "tiff": ".tif"}


@pytest.mark.parametrize(
    "kind",
    ["png_rgb", "jpeg_grey", "bmp_rgb", "png_grey16", "png_rgba", "gif_grey", "tiff_rgb16", "tiff_rgb16_planar",
     "tiff_float16"],
)  # fmt: skip
def test_images_become_rgb_float_in_unit_range(tmp_path, kind):
    path = tmp_path / f"x{EXT[kind.split('_')[0]]}"
    expected = _write(kind, path)
    x = _load(path)
    assert x.shape == (3, 7, 5) and x.dtype == torch.float32
    np.testing.assert_allclose(x.numpy(), _expect(x, expected), rtol=0, atol=1e-6)


def test_layout_matches_pil_reader(tmp_path):
    Image.fromarray(RGB8).save(tmp_path / "a.png")
    ours = _load(tmp_path / "a.png")
    pil = LoadImage(reader="PILReader", image_only=True, ensure_channel_first=True)(str(tmp_path / "a.png"))
    torch.testing.assert_close(ours.as_tensor(), pil.as_tensor() / 255.0)


def test_labels_keep_stored_values(tmp_path):
    labels16 = np.array([[0, 3, 1000], [65535, 0, 3]], dtype=np.uint16)
    Image.fromarray(labels16).save(tmp_path / "l16.png")
    np.testing.assert_array_equal(_load(tmp_path / "l16.png", "label")[0].numpy().T, labels16)
    indices = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.uint8)
    gif = Image.fromarray(indices, mode="P")
    gif.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * 759)  # a colour palette: its indices are the labels
    gif.save(tmp_path / "c.gif")
    np.testing.assert_array_equal(read_2d(tmp_path / "c.gif", "label"), indices)
    tifffile.imwrite(tmp_path / "planar.tif", np.stack([indices * 255] * 3), photometric="rgb", planarconfig="separate")
    assert read_2d(tmp_path / "planar.tif", "label").shape == (2, 3, 3)


def test_unreadable_and_non_finite_files_are_named(tmp_path):
    bad = tmp_path / "bad.tif"
    bad.write_bytes(b"II*\x00 broken")
    with pytest.raises(DataError, match="unreadable image") as e:
        read_2d(bad)
    assert str(bad) in str(e.value)
    nan = np.ones((4, 4), np.float16)
    nan[1, 1] = np.nan
    tifffile.imwrite(tmp_path / "nan.tif", nan)
    with pytest.raises(DataError, match="non-finite") as e:
        _load(tmp_path / "nan.tif")
    assert str(tmp_path / "nan.tif") in str(e.value)
    with pytest.raises(ValueError, match="kind"):
        Image2DReader("mask")


def test_validation_reads_tiffs_pillow_cannot(tmp_path):
    img, mask = tmp_path / "a.tif", tmp_path / "a_mask.tif"
    tifffile.imwrite(img, np.moveaxis(RGB16, -1, 0), photometric="rgb", planarconfig="separate")
    tifffile.imwrite(mask, np.stack([(GREY8 > 128).astype(np.uint8) * 255] * 3), photometric="rgb",
                     planarconfig="separate")  # fmt: skip
    assert check_image_readable(img) == (7, 5)
    entries = [{"image": str(img), "label": str(mask), "name": "a", "label_threshold": 128}]
    validate_datalist(entries, "test")
    tifffile.imwrite(mask, np.full((5, 7), 100, np.uint16))
    with pytest.raises(DatasetError, match="not a binary mask"):
        validate_datalist(entries, "test")


@pytest.mark.skipif(not os.path.isdir(KVASIR_REAL), reason="real Kvasir-SEG not available")
def test_real_kvasir_reads_as_before():
    """Kvasir-SEG (8-bit JPEG images and masks): the reader gives the old PILReader + /255 pipeline's values."""
    from spectraflow_monai.apps.seg2d import kvasir_seg_datalist
    from spectraflow_monai.transforms import BinarizeLabeld

    entries = kvasir_seg_datalist(KVASIR_REAL, "val", fraction=0.03, check_images=False, check_masks=False)
    old = Compose([
        LoadImaged(["image", "label"], reader="PILReader", image_only=True), EnsureChannelFirstd(["image", "label"]),
        BinarizeLabeld("label", check_values=True), Resized(["image", "label"], (224, 224), mode=["area", "nearest"]),
        ScaleIntensityRanged("image", 0.0, 255.0, 0.0, 1.0, clip=True),
    ])  # fmt: skip
    new = Compose([
        LoadImaged("image", reader=Image2DReader("image"), image_only=True),
        LoadImaged("label", reader=Image2DReader("label"), image_only=True), EnsureChannelFirstd(["image", "label"]),
        BinarizeLabeld("label", check_values=True), Resized(["image", "label"], (224, 224), mode=["area", "nearest"]),
    ])  # fmt: skip
    for entry in entries[:3]:
        a, b = old(dict(entry)), new(dict(entry))
        torch.testing.assert_close(b["image"].as_tensor(), a["image"].as_tensor(), rtol=0, atol=1e-6)
        assert torch.equal(b["label"].as_tensor(), a["label"].as_tensor())
