"""The registry of architectures: each name holds its network class, how its arguments come from the model settings,
its image-size rule, whether it has an encoder and its export support; an unknown name is one line listing the
registered ones, in the settings and in a record."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from spectraflow_monai.utils.architectures import (
    ARCHITECTURES,
    PATCH_SIZE,
    Architecture,
    architecture,
    pooling_multiple,
    stride_product,
)
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.run_record import ModelRecord, write_model_settings
from spectraflow_monai.utils.settings import ENCODER_FIELDS, ModelSettings

UNET_KWARGS = {"channels": [4, 8, 16], "strides": [2, 2]}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_entry_names_a_network_class_and_its_rules(name):
    entry = architecture(name)
    assert entry.name == name and entry.description
    module, _, cls = entry.network_class.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), cls), torch.nn.Module)
    assert entry.export is None  # export-onnx takes every architecture the bundles train
    assert isinstance(entry.size_multiple({}), int) and entry.size_multiple({}) >= 1


@pytest.mark.parametrize(
    "name, kwargs, multiple, has_encoder",
    [("spectraflow", None, PATCH_SIZE, True), ("unetpp", None, 16, False), ("unet", UNET_KWARGS, 4, False),
     ("unet", {"channels": [4, 8], "strides": [[2, 1]]}, 2, False)],
)  # fmt: skip
def test_the_settings_follow_their_architecture(name, kwargs, multiple, has_encoder):
    settings = ModelSettings(architecture=name, network_kwargs=kwargs, image_size=multiple * 4)
    assert settings.architecture_entry is ARCHITECTURES[name]
    assert (settings.size_multiple(), settings.has_encoder) == (multiple, has_encoder)
    # an architecture without an encoder reads no encoder field: recorded as null
    assert all((getattr(settings, f) is not None) == has_encoder for f in ENCODER_FIELDS if f != "encoder_kwargs")


@pytest.mark.parametrize("name", ["segresnet", "UNet", "", None, 3])
def test_an_unknown_architecture_is_one_line_listing_the_registered_ones(name):
    with pytest.raises(SettingError) as exc:
        ModelSettings(architecture=name)
    line = str(exc.value)
    assert "\n" not in line and f"got {name!r}" in line and str(list(ARCHITECTURES)) in line


def test_an_unknown_architecture_in_a_record_names_the_record(tmp_path):
    model = tmp_path / "model.pt"
    torch.save({}, model)
    write_model_settings(model, ModelSettings(architecture="unet", network_kwargs=UNET_KWARGS, image_size=32))
    record = json.loads((tmp_path / "model.json").read_text())
    record["model"]["architecture"] = "segresnet"  # a record of another version (the digest follows: no edit check)
    write_model_settings(model, record["model"])
    with pytest.raises(SettingError) as exc:
        ModelRecord(model)
    line = str(exc.value)
    assert "\n" not in line and line.startswith(str(tmp_path / "model.json")) and "got 'segresnet'" in line
    assert str(list(ARCHITECTURES)) in line
    with pytest.raises(SettingError, match=r"^models/model.json: architecture must be one of"):
        ModelSettings.from_dict({"architecture": "segresnet"}, source="models/model.json")


@pytest.mark.parametrize(
    "name, kwargs, message",
    [("spectraflow", {"features": [4]}, "architecture 'spectraflow' takes none"),
     ("unet", {"channels": [4, 8]}, r"must give \['strides'\] for architecture 'unet'"),
     ("unet", {**UNET_KWARGS, "in_channels": 1}, r"must not hold \['in_channels'\]"),
     ("unetpp", {"spatial_dims": 3}, r"must not hold \['spatial_dims'\]"),
     ("unetpp", [1, 2], "network_kwargs must be a mapping or null")],
)  # fmt: skip
def test_network_kwargs_the_architecture_does_not_take_are_refused(name, kwargs, message):
    with pytest.raises(SettingError, match=message):
        ModelSettings(architecture=name, network_kwargs=kwargs, image_size=64 if name != "spectraflow" else 56)


def test_the_arguments_come_from_the_settings():
    settings = ModelSettings(image_size=56, encoder_kwargs={"depth": 2}, fusion="add", out_channels=2)
    arguments = ARCHITECTURES["spectraflow"].arguments(settings, 3, 2, image_size=28, trainable_blocks=2)
    assert arguments == {"in_channels": 3, "out_channels": 2, "encoder": "vit_small_patch14_dinov2", "img_size": 28,
                         "encoder_kwargs": {"depth": 2}, "fusion": "add", "refine": "fdconv", "trainable_blocks": 2}
    unet = ModelSettings(architecture="unet", network_kwargs=UNET_KWARGS, image_size=32)
    # a training argument of another architecture (Stage-2's trainable_blocks) is not the UNet's
    arguments = ARCHITECTURES["unet"].arguments(unet, 3, 1, trainable_blocks=2)
    assert arguments == {"in_channels": 3, "out_channels": 1, "spatial_dims": 2, **UNET_KWARGS}


def test_size_rules():
    assert pooling_multiple(3)({}) == 8
    assert stride_product((2, 2))({}) == 4 and stride_product((2,))({"strides": [2, [2, 1], 3]}) == 12


def test_a_new_architecture_is_one_entry(monkeypatch):
    """Registering an entry is all it takes: the settings check its size and arguments, the record names it."""
    entry = Architecture(name="basicunet", network_class="monai.networks.nets.BasicUNet", description="BasicUNet",
                         fixed_arguments={"spatial_dims": 2}, size_multiple=pooling_multiple(4))  # fmt: skip
    monkeypatch.setitem(ARCHITECTURES, "basicunet", entry)
    settings = ModelSettings(architecture="basicunet", network_kwargs={"features": [4, 4, 8, 8, 16, 4]}, image_size=32)
    assert settings.to_dict()["architecture"] == "basicunet" and not settings.has_encoder
    with pytest.raises(SettingError, match="multiple of 16"):
        settings.replace(image_size=24)
