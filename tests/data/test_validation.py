import os

import numpy as np
import pytest
from PIL import Image

from spectraflow_monai.data.validation import (
    DatasetError,
    check_binary_mask,
    check_image_readable,
    check_pairs,
    list_images,
    validate_datalist,
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
    with pytest.raises(DatasetError, match=r"12 bad file\(s\) \(and 2 more problems\)"):
        validate_datalist(bad, "split Z")


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
