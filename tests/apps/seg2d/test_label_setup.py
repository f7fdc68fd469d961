"""The 2D bundle's config entry points built from its label setup: augmentation, postprocessing, prediction writer,
metric suite handler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.transforms import Identityd

from spectraflow_monai.apps.seg2d import (
    LabelSetup,
    metric_suite_handler,
    postprocessing,
    prediction_writer,
    train_augmentation,
)
from spectraflow_monai.handlers import MetricSuiteHandler
from spectraflow_monai.utils import SettingError

INVERTED = {"background": 255, "membrane": 0}  # an EM stack whose foreground is value 0


class _Source:
    def __init__(self, name):
        self.name = name


def test_train_augmentation_adds_the_sources_colour_jitter():
    geometric, jitter = [Identityd("image")], [Identityd("label")]
    aug = train_augmentation(geometric, {"kvasir": jitter, "folder": []}, _Source("kvasir"))
    assert aug == [*geometric, *jitter]
    assert train_augmentation(geometric, {"folder": []}, _Source("folder")) == geometric
    with pytest.raises(SettingError, match="no entry for the data source 'glas'.*--colour_augmentation#glas"):
        train_augmentation(geometric, {"kvasir": jitter}, _Source("glas"))


@pytest.mark.parametrize(
    "classes, logits, expected",
    [
        (None, torch.tensor([[[-2.0, 3.0]]]), [[[0.0, 1.0]]]),  # sigmoid + 0.5
        (INVERTED, torch.tensor([[[2.0, -1.0]], [[0.0, 4.0]]]), [[[0, 1]]]),  # argmax class indices
    ],
)
def test_postprocessing_then_the_extra_transforms(classes, logits, expected):
    seen = []
    post = postprocessing(LabelSetup.read(classes), then=[lambda d: seen.append(d["pred"]) or d])
    out = post({"pred": logits})
    assert np.array_equal(np.asarray(out["pred"]), np.asarray(expected, dtype=np.float32)) and len(seen) == 1


@pytest.mark.parametrize("classes, values, scale", [(None, None, 255), (INVERTED, [255, 0], None)])
def test_prediction_writer_saves_the_source_values(tmp_path, classes, values, scale):
    writer = prediction_writer(LabelSetup.read(classes), str(tmp_path), output_ext=".png", print_log=False)
    assert writer.values == values and writer.saver.output_ext == ".png"
    assert writer.saver.init_kwargs["scale"] == scale and writer.saver.folder_layout.postfix == "seg"
    # the class indices instead of the source values (--prediction_writer#values '$None')
    assert prediction_writer(LabelSetup.read(classes), str(tmp_path), values=None).values is None


@pytest.mark.parametrize("classes, per_class", [(None, False), (INVERTED, True)])
def test_metric_suite_handler_per_class_for_label_maps(tmp_path, classes, per_class):
    handler = metric_suite_handler(LabelSetup.read(classes), str(tmp_path), original_size=True)
    assert isinstance(handler, MetricSuiteHandler) and handler.original_size
    assert (handler.suite.num_classes is not None) is per_class


@pytest.mark.parametrize("value", ["maybe", 2, None])
def test_metric_suite_handler_names_a_bad_original_size_setting(tmp_path, value):
    with pytest.raises(SettingError, match=f"score_at_original_size must be true or false, got {value!r}"):
        metric_suite_handler(LabelSetup.read(None), str(tmp_path), original_size=value)
