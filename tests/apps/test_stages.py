"""Tests of spectraflow_monai.apps.stages beside the bundle runs (tests/bundles): what the programs refuse."""

from __future__ import annotations

import pytest
from monai.transforms import Compose

from spectraflow_monai.apps.stages import Stage1Program
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import DataSettings, ModelSettings, RunSettings, Stage1Settings


@pytest.mark.parametrize("name, kwargs", [("unet", {"channels": [4, 8], "strides": [2]}), ("unetpp", None)])
def test_stage1_refuses_an_architecture_without_an_encoder(name, kwargs):
    model = ModelSettings(architecture=name, network_kwargs=kwargs, image_size=32)
    with pytest.raises(SettingError, match=f"architecture '{name}' has no encoder: Stage-1 pretrains"):
        Stage1Program(Stage1Settings(), model, DataSettings(), RunSettings(device="cpu"), [], Compose([]))
