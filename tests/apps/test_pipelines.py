"""The model pipeline: network and preprocessing built from the model settings (and read from a model's record)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectraflow_monai.apps.pipelines import (
    CTSlicePipeline,
    Image2DPipeline,
    ModelPipeline,
    model_pipeline,
    pipeline_step,
)
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.run_record import write_model_settings
from spectraflow_monai.utils.settings import ModelSettings
from tests.bundles.helpers import config_paths, parse_config

TINY = {"encoder_kwargs": {"depth": 2}, "image_size": 28}
CT = {**TINY, "num_classes": 3, "out_channels": 3, "hu_window": [-100.0, 200.0], "nonfinite": "error"}


def test_the_settings_choose_the_pipeline():
    assert isinstance(model_pipeline(ModelSettings(**TINY)), Image2DPipeline)
    assert isinstance(model_pipeline(ModelSettings(**CT)), CTSlicePipeline)
    with pytest.raises(ValueError, match="settings must be a ModelSettings"):
        Image2DPipeline({"image_size": 28})


@pytest.mark.parametrize(
    "settings, step, keys, expected",
    [
        (TINY, "resize", "image", (3, 28, 28)),
        (CT, "resize", "image", (1, 28, 28)),
    ],
)
def test_resize_follows_image_size(settings, step, keys, expected):
    pipeline = model_pipeline(ModelSettings(**settings))
    data = {"image": torch.rand(expected[0], 40, 50)}
    assert tuple(pipeline.step(step, keys=keys)(data)["image"].shape) == expected


def test_normalize_and_window_follow_the_settings():
    pipeline = model_pipeline(ModelSettings(**{**CT, "image_mean": [0.5] * 3, "image_std": [0.25] * 3}))
    image = torch.tensor([[[-100.0, 50.0, 200.0]]])
    windowed = pipeline.step("window")({"image": image})["image"]
    np.testing.assert_allclose(np.asarray(windowed), [[[0.0, 0.5, 1.0]]], atol=1e-6)
    repeated = pipeline.step("repeat_channels")({"image": windowed})["image"]
    normalized = pipeline.step("normalize")({"image": repeated})["image"]
    np.testing.assert_allclose(np.asarray(normalized)[:, 0], [[-2.0, 0.0, 2.0]] * 3, atol=1e-5)


@pytest.mark.parametrize(
    "step, given, setting",
    [
        ("resize", {"spatial_size": [112, 112]}, "--model_settings#image_size"),
        ("normalize", {"subtrahend": [0.5, 0.5, 0.5]}, "--model_settings#image_mean"),
        ("normalize", {"divisor": [0.5, 0.5, 0.5]}, "--model_settings#image_std"),
    ],
)
def test_an_argument_a_setting_decides_is_refused(step, given, setting):
    with pytest.raises(SettingError, match=setting):
        pipeline_step(model_pipeline(ModelSettings(**TINY)), step, **given)


def test_an_unknown_step_is_named():
    with pytest.raises(SettingError, match="no preprocessing step 'window'"):
        model_pipeline(ModelSettings(**TINY)).step("window")


def test_from_record_reads_the_record_and_refuses_a_contradiction(tmp_path):
    settings = ModelSettings(**{**TINY, "image_mean": [0.4, 0.4, 0.4]})
    network = model_pipeline(settings).network()
    model_file = tmp_path / "model.pt"
    torch.save(network.state_dict(), model_file)
    write_model_settings(model_file, settings)
    pipeline = ModelPipeline.from_record(model_file, given={"image_size": None, "fusion": None})
    assert pipeline.settings == settings and pipeline.model_file == str(model_file)
    with pytest.raises(SettingError, match="image_size: 28 in the record, 56 given"):
        ModelPipeline.from_record(model_file, given={"image_size": 56})


@pytest.mark.parametrize(
    "bundle, override, setting",
    [
        ("spectraflow_2d_segmentation", {"load_transforms#4#spatial_size": [112, 112]}, "--model_settings#image_size"),
        ("spectraflow_2d_segmentation", {"normalize_transforms#0#subtrahend": [0.5, 0.5, 0.5]}, "--model_settings#image_mean"),
        ("spectraflow_synapse_segmentation", {"load_transforms#2#spatial_size": [112, 112]}, "--model_settings#image_size"),
        ("spectraflow_synapse_segmentation", {"normalize_transforms#1#divisor": [0.5, 0.5, 0.5]}, "--model_settings#image_std"),
    ],
)
def test_a_preprocessing_key_overridden_in_a_bundle_is_refused(bundle, override, setting, tmp_path):
    """The training transforms are the model's pipeline: a key set on one of them is refused naming the setting,
    so that models/model.json always describes the preprocessing that trained."""
    parser = parse_config(config_paths(bundle)["train"], bundle_root=str(tmp_path), encoder_kwargs={"depth": 2},
                          image_size=28, **override)
    name = next(iter(override)).split("#")[0]
    with pytest.raises(Exception) as raised:
        parser.get_parsed_content(name)
    text = "".join(str(e) for e in _chain(raised.value))
    assert setting in text and "models/model.json" in text


def _chain(error: BaseException):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def test_an_argument_no_step_takes_is_refused_naming_the_step_options():
    with pytest.raises(SettingError, match=r"step 'resize': mode='nearest'.*takes \['volume'\] besides keys"):
        model_pipeline(ModelSettings(**CT)).step("resize", mode="nearest")
