"""Tests of the Stage-1 trainers' option objects: defaults, the checks of __post_init__, immutability."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from spectraflow_monai.engines import DispersiveConfig, EMAConfig, GradientConfig, MAEConfig, MeanFlowConfig
from spectraflow_monai.losses import DispersiveLoss


@pytest.mark.parametrize(
    "config, expected",
    [
        (DispersiveConfig(), {"weight": 0.4, "loss": None}),
        (EMAConfig(), {"decay": 0.999, "encoder": None}),
        (GradientConfig(), {"accumulation_steps": 1, "distributed": None, "bucket_mb": 25.0}),
        (MeanFlowConfig(), {"loss": None, "latent_norm": True, "condition_on_domain": None}),
        (MAEConfig(), {"loss": None, "mask_ratio": 0.75}),
    ],
)
def test_defaults_are_the_papers(config, expected):
    assert dataclasses.asdict(config) == expected


@pytest.mark.parametrize(
    "build",
    [
        lambda: DispersiveConfig(weight=0, loss=DispersiveLoss()),
        lambda: DispersiveConfig(weight=np.float32(1.5)),
        lambda: EMAConfig(decay=0.5, encoder=torch.nn.Linear(2, 2)),
        lambda: GradientConfig(accumulation_steps=np.int64(4), distributed=False, bucket_mb=0.5),
        lambda: MeanFlowConfig(loss=lambda *a, **k: None, latent_norm=False, condition_on_domain=True),
        lambda: MAEConfig(mask_ratio=0.5),
    ],
)
def test_valid_values_are_kept(build):
    build()


@pytest.mark.parametrize(
    "config, kwargs, match",
    [
        (DispersiveConfig, {"weight": -0.1}, r"weight must be a finite number >= 0, got -0.1\."),
        (DispersiveConfig, {"weight": float("nan")}, r"weight .*got nan\."),
        (DispersiveConfig, {"weight": float("inf")}, r"weight .*got inf\."),
        (DispersiveConfig, {"weight": True}, r"weight .*got True\."),
        (DispersiveConfig, {"weight": "0.4"}, r"weight .*got '0.4'\."),
        (DispersiveConfig, {"loss": "dispersive"}, r"loss must be callable or None, got str\."),
        (EMAConfig, {"decay": 1.0}, r"decay must be a number in \(0, 1\), got 1.0\."),
        (EMAConfig, {"decay": 0}, r"decay .*got 0\."),
        (EMAConfig, {"decay": None}, r"decay .*got None\."),
        (EMAConfig, {"encoder": {"weight": 1}}, r"encoder must be an nn.Module or None, got dict\."),
        (GradientConfig, {"accumulation_steps": 0}, r"accumulation_steps must be a positive int, got 0\."),
        (GradientConfig, {"accumulation_steps": 1.5}, r"accumulation_steps .*got 1.5\."),
        (GradientConfig, {"accumulation_steps": True}, r"accumulation_steps .*got True\."),
        (GradientConfig, {"distributed": "yes"}, r"distributed must be None, True or False, got 'yes'\."),
        (GradientConfig, {"bucket_mb": 0}, r"bucket_mb must be a finite number > 0, got 0\."),
        (GradientConfig, {"bucket_mb": float("inf")}, r"bucket_mb .*got inf\."),
        (MeanFlowConfig, {"loss": 0.5}, r"loss must be callable or None, got float\."),
        (MeanFlowConfig, {"latent_norm": "true"}, r"latent_norm must be True or False, got 'true'\."),
        (MeanFlowConfig, {"condition_on_domain": 1}, r"condition_on_domain must be None, True or False, got 1\."),
        (MAEConfig, {"mask_ratio": 1.0}, r"mask_ratio must be a number in \(0, 1\), got 1.0\."),
        (MAEConfig, {"mask_ratio": 0}, r"mask_ratio .*got 0\."),
        (MAEConfig, {"loss": "mse"}, r"loss must be callable or None, got str\."),
    ],
)
def test_bad_values_are_named(config, kwargs, match):
    """One line naming the object, the argument and the value."""
    with pytest.raises(ValueError, match=rf"^{config.__name__}: {match}$"):
        config(**kwargs)


@pytest.mark.parametrize("config", [DispersiveConfig(), EMAConfig(), GradientConfig(), MeanFlowConfig(), MAEConfig()])
def test_configs_are_frozen(config):
    field = dataclasses.fields(config)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, field, getattr(config, field))
