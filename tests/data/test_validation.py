import os
import re

import numpy as np
import pytest
from PIL import Image

from spectraflow_monai.data.validation import (
    DatasetError,
    InputCheck,
    binary_mask_threshold,
    check_binary_mask,
    check_image_readable,
    check_pairs,
    list_images,
    validate_datalist,
)
from spectraflow_monai.utils.errors import DataError

# the real Kvasir-SEG copy: $SPECTRAFLOW_KVASIR_DIR, else shared/data/kvasir-seg beside the repository
KVASIR_REAL = os.environ.get(
    "SPECTRAFLOW_KVASIR_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "kvasir-seg"),
)


def save(arr, path, **kw):
    Image.fromarray(arr).save(path, **kw)
    return str(path)


def test_dataset_error_is_value_error():
    assert issubclass(DatasetError, ValueError)


def test_readable_and_truncated_jpeg(tmp_path):
    rng = np.random.default_rng(0)
    good = save(rng.integers(0, 256, (32, 24, 3), dtype=np.uint8), tmp_path / "good.jpg")
    assert check_image_readable(good) == (24, 32)
    data = open(good, "rb").read()
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(data[:-100])  # headers intact, end of the scan and EOI marker missing
    with pytest.raises(DatasetError, match="truncated JPEG") as e:
        check_image_readable(truncated)
    assert str(truncated) in str(e.value)
    png = save(rng.integers(0, 256, (16, 16), dtype=np.uint8), tmp_path / "m.png")
    raw = open(png, "rb").read()
    (tmp_path / "cut.png").write_bytes(raw[:-20])
    with pytest.raises(DatasetError, match="cut.png"):
        check_image_readable(tmp_path / "cut.png")
    with pytest.raises(DatasetError, match="missing.png"):
        check_image_readable(tmp_path / "missing.png")


def test_binary_mask_rules(tmp_path):
    m = np.zeros((20, 20), dtype=np.uint8)
    m[5:15, 5:15] = 255
    check_binary_mask(save(m, tmp_path / "ok.png"))
    m[0, :3] = 128  # 3 / 400 = 0.75 % mid-grey: tolerated
    check_binary_mask(save(m, tmp_path / "few_grey.png"))
    m[1, :3] = 100  # 1.5 %: rejected
    with pytest.raises(DatasetError, match="not a binary mask.*grey_ish.png.*1.5% mid-grey"):
        check_binary_mask(save(m, tmp_path / "grey_ish.png"))
    check_binary_mask(tmp_path / "grey_ish.png", max_grey_fraction=0.02)
    labels = np.arange(400, dtype=np.uint8).reshape(20, 20) % 60  # instance map: not grey-checked
    check_binary_mask(save(labels, tmp_path / "labels.bmp"), label_threshold=1)
    colour = np.zeros((20, 20, 3), dtype=np.uint8)
    colour[..., 0] = 200
    for threshold in (128, 1):
        with pytest.raises(DatasetError, match="colour image"):
            check_binary_mask(save(colour, tmp_path / "colour.png"), label_threshold=threshold)
    with pytest.raises(DatasetError, match="unreadable mask"):
        check_binary_mask(tmp_path / "nothing.png")


def test_validate_datalist_sizes_and_reporting(tmp_path):
    img = save(np.zeros((10, 12, 3), dtype=np.uint8), tmp_path / "img.png")
    mask = save(np.zeros((10, 10), dtype=np.uint8), tmp_path / "mask.png")
    entry = {"image": img, "label": mask, "name": "x", "label_threshold": 128}
    with pytest.raises(DatasetError, match="12x10 but its mask .*mask.png.* is 10x10"):
        validate_datalist([entry], "split X")
    validate_datalist([entry], "split X", check_images=False)
    with pytest.raises(DatasetError, match="empty split: no images in split Y"):
        validate_datalist([], "split Y")
    bad = [{"image": str(tmp_path / f"no{i}.png"), "label": mask} for i in range(12)]
    with pytest.raises(DatasetError, match=r"split Z: 12 bad file\(s\):") as info:
        validate_datalist(bad, "split Z")
    assert all(str(tmp_path / f"no{i}.png") in str(info.value) for i in range(12))  # the full message: every one


def test_many_bad_masks_end_in_a_short_line_naming_the_first_few_and_the_count(tmp_path):
    from spectraflow_monai.utils.errors import error_summary

    img = save(np.zeros((10, 10, 3), dtype=np.uint8), tmp_path / "img.png")
    grey = np.tile(np.arange(0, 250, 25, dtype=np.uint8), (10, 1))  # a grey ramp, not a binary mask
    masks = [save(grey, tmp_path / f"mask_with_a_rather_long_name_{i:03d}.png") for i in range(40)]
    with pytest.raises(DatasetError) as info:
        validate_datalist([{"image": img, "label": m, "label_threshold": 128} for m in masks], "kvasir (train split)")
    line = error_summary(info.value)
    assert line.startswith("error: kvasir (train split): 40 bad file(s): ") and len(line) < 1000, (len(line), line)
    assert all(masks[i] in line for i in range(3)) and masks[3] not in line, line
    assert line.endswith("; and 37 more (the full message lists every one)"), line



def test_list_images_and_pairs(tmp_path):
    for n in ("a.jpg", "b.png", "c_anno.bmp", "notes.txt", ".hidden.png"):
        (tmp_path / n).write_bytes(b"")
    assert list_images(tmp_path) == {
        k: str(tmp_path / v) for k, v in (("a", "a.jpg"), ("b", "b.png"), ("c_anno", "c_anno.bmp"))
    }
    assert list_images(tmp_path, suffix="_anno") == {"c": str(tmp_path / "c_anno.bmp")}
    (tmp_path / "a.png").write_bytes(b"")
    with pytest.raises(DatasetError, match="share the id 'a'"):
        list_images(tmp_path)
    check_pairs({"a": "i/a"}, {"a": "m/a"}, "p")
    with pytest.raises(DatasetError, match=r"p: 1 image\(s\) without a mask: i/b"):
        check_pairs({"a": "i/a", "b": "i/b"}, {"a": "m/a"}, "p")
    many = {f"k{i}": f"m/k{i}" for i in range(13)}
    with pytest.raises(DatasetError, match="and 3 more"):
        check_pairs({}, many, "p")
    assert os.path.isdir(tmp_path)


# ------------------------------------------------------------------ mask values, full decoding, non-finite pixels
def test_zero_one_mask_is_read_as_binary(tmp_path):
    m = np.zeros((16, 16), dtype=np.uint8)
    m[4:12, 4:12] = 1
    mask = save(m, tmp_path / "m01.png")
    assert check_binary_mask(mask) == 1
    assert check_binary_mask(save(m * 255, tmp_path / "m255.png")) == 128
    img = save(np.zeros((16, 16, 3), dtype=np.uint8), tmp_path / "img.png")
    entries = [{"image": img, "label": mask, "name": "x", "label_threshold": 128}]
    validate_datalist(entries, "split")
    assert entries[0]["label_threshold"] == 1  # its foreground is 1, not >= 128


def test_jpeg_noise_around_0_and_255_is_binary(tmp_path):
    m = np.zeros((64, 64), dtype=np.uint8)
    yy, xx = np.mgrid[:64, :64]
    m[(yy - 30) ** 2 + (xx - 33) ** 2 < 300] = 255  # a round edge: JPEG ringing around it
    path = save(np.stack([m] * 3, -1), tmp_path / "m.jpg", quality=90)
    values = np.unique(np.asarray(Image.open(path).convert("L")))
    assert len(values) > 2  # noisy
    assert check_binary_mask(path) == 128
    assert binary_mask_threshold(np.asarray(Image.open(path).convert("L")), path) == 128


@pytest.mark.parametrize(
    "values, shown",
    [((0, 1, 2), "{0, 1, 2}"), ((0, 128, 255), "{0, 128, 255}"), ((0, 3, 7), "{0, 3, 7}"), ((0, 60, 90), "60")],
)
def test_other_value_sets_name_the_file_and_values(tmp_path, values, shown):
    m = np.zeros((12, 12), dtype=np.uint8)
    m[:4], m[4:8] = values[1], values[2]
    path = save(m, tmp_path / "labels.png")
    with pytest.raises(DataError, match="not a binary mask") as e:
        check_binary_mask(path)
    assert path in str(e.value) and shown in str(e.value)
    assert isinstance(e.value, DatasetError)
    img = save(np.zeros((12, 12, 3), dtype=np.uint8), tmp_path / "img.png")
    with pytest.raises(DatasetError, match=re.escape(shown)):
        validate_datalist([{"image": img, "label": path, "label_threshold": 128}], "split")
    assert check_binary_mask(path, label_threshold=1) == 1  # a label map (GlaS) keeps its threshold


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "JPEG", "PNG"])
def test_truncated_file_of_any_format_is_named(tmp_path, fmt):
    rng = np.random.default_rng(0)
    path = tmp_path / f"cut.{fmt.lower()}"
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(path, format=fmt)
    path.write_bytes(path.read_bytes()[:-300])
    with pytest.raises(DatasetError, match="unreadable image") as e:
        check_image_readable(path)
    assert str(path) in str(e.value)


def test_float_tiff_with_nan_or_inf_is_named(tmp_path):
    ok = tmp_path / "ok.tiff"
    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(ok)
    assert check_image_readable(ok) == (8, 8)
    arr = np.full((8, 8), 0.5, dtype=np.float32)
    arr[0, 0], arr[1, 1], arr[2, 2] = np.nan, np.nan, np.inf
    bad = tmp_path / "bad.tiff"
    Image.fromarray(arr).save(bad)
    with pytest.raises(DatasetError, match="2 NaN and 1 infinite") as e:
        check_image_readable(bad)
    assert str(bad) in str(e.value)
    mask = save(np.zeros((8, 8), dtype=np.uint8), tmp_path / "m.png")
    with pytest.raises(DatasetError, match="bad.tiff.*NaN"):
        validate_datalist([{"image": str(bad), "label": mask, "label_threshold": 128}], "split")


def test_input_check_keeps_readable_files_and_lists_the_others(tmp_path):
    rng = np.random.default_rng(0)
    good = [save(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8), tmp_path / f"{n}.png") for n in "ac"]
    cut = tmp_path / "b.bmp"
    Image.fromarray(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)).save(cut)
    cut.write_bytes(cut.read_bytes()[:-100])
    check = InputCheck([good[0], cut, good[1]])
    assert check.good == good and check.datalist == [{"image": p} for p in good]
    with pytest.raises(DataError, match=r"1 of 3 input image\(s\) could not be read") as e:
        check.raise_failures()
    assert str(cut) in str(e.value)
    InputCheck(good).raise_failures()  # nothing to report
    assert InputCheck([good[0], cut], require_readable=True).good == [good[0]]  # one readable: go on
    with pytest.raises(DataError, match=r"1 of 1 input image\(s\) could not be read"):
        InputCheck([cut], require_readable=True)  # none readable: stop before any work


@pytest.mark.skipif(not os.path.isdir(KVASIR_REAL), reason="real Kvasir-SEG not available")
def test_real_kvasir_masks_are_0_255_masks():
    masks = sorted(os.listdir(os.path.join(KVASIR_REAL, "Kvasir-SEG", "masks")))[::10]  # every 10th: 100 masks
    for name in masks:
        assert check_binary_mask(os.path.join(KVASIR_REAL, "Kvasir-SEG", "masks", name)) == 128, name
