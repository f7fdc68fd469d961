"""Tests of spectraflow_monai.apps.workflow: the program steps both bundles call from their configs."""

from __future__ import annotations

import pytest
import torch
from monai.handlers import HausdorffDistance, MeanDice, MeanIoUHandler

from spectraflow_monai.apps.seg2d import label_setup
from spectraflow_monai.apps.workflow import prepare_run, segmentation_metrics, trainable_parameters
from spectraflow_monai.handlers import HD95EmptyAsDiagonal
from spectraflow_monai.utils import SettingError


@pytest.mark.parametrize("classes, background", [(None, True), (["background", "polyp", "tool"], False)])
def test_metrics_follow_the_label_setup(classes, background):
    setup = label_setup(classes)
    key = segmentation_metrics("val", label_setup=setup)
    assert list(key) == ["val_mean_dice"] and isinstance(key["val_mean_dice"], MeanDice)
    assert key["val_mean_dice"].metric_fn.include_background is background
    extra = segmentation_metrics("val", "additional", label_setup=setup)
    assert [type(m) for m in extra.values()] == [MeanIoUHandler, HausdorffDistance, HD95EmptyAsDiagonal]
    names = list(segmentation_metrics("train", "additional", hd95=False))
    assert names == ["train_mean_iou", "train_hd95_empty_as_diagonal"]
    with pytest.raises(ValueError, match="which"):
        segmentation_metrics("val", "other")


def test_prepare_run_checks_and_creates(tmp_path):
    prepare_run(0, [tmp_path / "a" / "b"], image_size=28)
    assert (tmp_path / "a" / "b").is_dir()
    with pytest.raises(SettingError, match="image_size"):
        prepare_run(0, image_size=30)


def test_trainable_parameters_leave_frozen_ones_out():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    net[0].requires_grad_(False)
    assert trainable_parameters(net) == list(net[1].parameters())
