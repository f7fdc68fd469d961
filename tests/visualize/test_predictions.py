"""Tests of finding the predictions and the per-image Dice of an evaluation folder."""

from __future__ import annotations

import math
import os

import pytest

from spectraflow_monai.visualize.predictions import find_prediction, prediction_size, read_dice


def test_find_prediction_layouts(tmp_path):
    entry = {"image": str(tmp_path / "imgs" / "ISIC_01.jpg"), "label": "x", "name": "id7"}
    assert find_prediction(entry, tmp_path) is None
    os.makedirs(tmp_path / "ISIC_01")
    (tmp_path / "ISIC_01" / "ISIC_01_seg.png").write_bytes(b"")  # separate_folder=True layout, image stem
    assert find_prediction(entry, tmp_path) == str(tmp_path / "ISIC_01" / "ISIC_01_seg.png")
    (tmp_path / "id7_seg.png").write_bytes(b"")  # the datalist name wins
    assert find_prediction(entry, tmp_path) == str(tmp_path / "id7_seg.png")


@pytest.mark.parametrize(
    "header,row",
    [("name,IoU,DSC,recall,precision", "{n},0.5,{d},1,1"),
     ("name,class,gt_area,pred_area,iou,dice,recall,precision,hd95_monai", "{n},1,10,10,0.5,{d},1,1,nan")],
)
def test_read_dice_columns(tmp_path, header, row):
    p = tmp_path / "m.csv"
    p.write_text("\n".join([header, row.format(n="a", d=0.25), row.format(n="b", d="nan")]) + "\n")
    d = read_dice(p)
    assert d["a"] == 0.25 and math.isnan(d["b"])


def test_read_dice_averages_class_rows(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("name,class,dice\na,1,0.2\na,2,0.6\na,3,nan\n")
    assert read_dice(p) == {"a": pytest.approx(0.4)}


def test_prediction_size_reads_width_and_height(tmp_path):
    import numpy as np
    from PIL import Image

    Image.fromarray(np.zeros((48, 64), np.uint8)).save(tmp_path / "a_seg.png")  # 48 rows, 64 columns
    assert prediction_size(tmp_path / "a_seg.png") == (64, 48)
    (tmp_path / "b_seg.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="b_seg.png"):
        prediction_size(tmp_path / "b_seg.png")
