"""Tests for spectraflow_monai.networks.weights and spectraflow_monai.apps.encoder_init: which weights an encoder starts
from, decided by explicit settings.

The weight-selection matrix: the Stage-1 export, a DINOv2 file in the official facebookresearch layout and in timm's
layout, timm's hub (offline: a message saying how to pass a file or opt into random init; reachable: mocked), random
initialisation with its warning when blocks are frozen, and a missing Stage-1 export (an error, never a fallback).
"""

from __future__ import annotations

import logging
import os

import pytest
import timm
import torch

from spectraflow_monai.handlers import save_encoder_export
from spectraflow_monai.networks import DINOv2Encoder, SpectraFlowNet
from spectraflow_monai.networks import weights
from spectraflow_monai.apps.encoder_init import initialize_encoder, resolve_encoder_init, resolve_encoder_start
from spectraflow_monai.utils import SettingError
from tests.networks.encoders.test_dinov2 import _official_layout, _timm_model

NAME = "vit_small_patch14_dinov2"
KW = {"img_size": 28, "model_kwargs": {"depth": 2}}
LOGGER = "spectraflow_monai.networks.encoders.dinov2"
WARNING = "RANDOM ENCODER WEIGHTS WITH FROZEN BLOCKS"


def _net(**kwargs) -> SpectraFlowNet:
    return SpectraFlowNet(encoder=NAME, img_size=28, encoder_kwargs={"depth": 2}, **kwargs)


def _assert_holds(encoder: DINOv2Encoder, source: torch.nn.Module, keys=("blocks.0.attn.qkv.weight", "norm.weight")):
    state = encoder.vit.state_dict()
    for key in keys:
        torch.testing.assert_close(state[key], source.state_dict()[key], rtol=0, atol=0, msg=key)


def _messages(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


# ---------------------------------------------------------------- the matrix
def test_stage1_export(tmp_path, caplog):
    trained = DINOv2Encoder(NAME, trainable_blocks="all", **KW)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.5)
    export = save_encoder_export(trained, tmp_path / "models" / "encoder_stage1.pt")
    net = _net()
    caplog.set_level(logging.INFO, logger=LOGGER)
    # pretrained_weights is not consulted: encoder_init decides
    source = initialize_encoder(net, "stage1", pretrained_weights="timm", stage1_export=str(export))
    assert source == str(export)
    _assert_holds(net.encoder, trained.vit)
    (line,) = _messages(caplog)
    assert line.startswith(f"encoder weights: stage1 ({export})") and "tensors" in line
    assert not _messages(caplog, logging.WARNING)


def test_official_file(tmp_path, caplog):
    src = _timm_model(NAME, depth=2, seed=1)
    path = tmp_path / "dinov2_vits14_pretrain.pth"
    torch.save(_official_layout(src), path)
    net = _net()
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert initialize_encoder(net, "pretrained", pretrained_weights=str(path)) == str(path)
    _assert_holds(net.encoder, src)
    assert net.encoder.vit.pos_embed.shape == (1, 1 + 2 * 2, 384)  # the 37x37 grid resized to the 28-px grid
    assert any(m.startswith(f"encoder weights: pretrained_weights=file ({path})") for m in _messages(caplog))


def test_timm_layout_file(tmp_path, caplog):
    src = _timm_model(NAME, img_size=28, depth=2, seed=2)
    path = tmp_path / "timm_state.pt"
    torch.save(src.state_dict(), path)
    encoder = DINOv2Encoder(NAME, trainable_blocks=1, **KW)
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert encoder.load_pretrained(path) == str(path)
    _assert_holds(encoder, src)
    (line,) = _messages(caplog)
    assert line == f"encoder weights: file ({path}): {len(src.state_dict())} tensors loaded into {NAME}"


def test_missing_file_is_named(tmp_path):
    absent = tmp_path / "absent.pth"
    with pytest.raises(FileNotFoundError, match=str(absent)):
        initialize_encoder(_net(), "pretrained", pretrained_weights=str(absent))


@pytest.mark.parametrize("failure", ["offline_mode", "any_error"])
def test_timm_offline_says_how_to_go_on(monkeypatch, tmp_path, failure):
    if failure == "offline_mode":  # huggingface_hub's own offline mode: fails at once, whatever it raises
        import huggingface_hub.constants

        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"), raising=False)
    else:  # the hub client itself fails (the connection probe passed)
        import timm.models

        from spectraflow_monai.networks import weights as utils

        def unreachable(*args, **kwargs):
            raise ConnectionError("Name or service not known")

        monkeypatch.setattr(utils, "_hub_unreachable", lambda *a, **k: None)
        monkeypatch.setattr(timm.models, "load_state_dict_from_hf", unreachable)
    net = _net()
    before = {k: v.clone() for k, v in net.encoder.vit.state_dict().items()}
    with pytest.raises(SettingError) as info:
        initialize_encoder(net, "pretrained", pretrained_weights="timm")
    text = str(info.value)
    assert f"could not download the DINOv2 weights of '{NAME}'" in text
    assert "timm/vit_small_patch14_dinov2.lvd142m" in text  # where it looked
    assert "pretrained_weights: /path/dinov2_vits14_pretrain.pth" in text  # how to pass a local file
    assert "pretrained_weights none" in text  # how to opt into random initialisation
    assert "Nothing was trained" in text
    if failure == "any_error":
        assert "ConnectionError: Name or service not known" in text
    # nothing was half-loaded
    for key, value in net.encoder.vit.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_timm_offline_fails_fast_without_the_hub_client(monkeypatch, tmp_path):
    """No internet: one short connection attempt, then the message (not the hub client's minute of retries)."""
    import socket

    import huggingface_hub.constants
    import timm.models

    from spectraflow_monai.networks import weights as utils

    for name in utils._PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"), raising=False)
    attempts = []

    def no_route(address, timeout=None, *args, **kwargs):
        attempts.append((address, timeout))
        raise OSError("[Errno -2] Name or service not known")

    def client(*args, **kwargs):
        raise AssertionError("the hub client must not be called when the hub cannot be reached")

    monkeypatch.setattr(socket, "create_connection", no_route)
    monkeypatch.setattr(timm.models, "load_state_dict_from_hf", client)
    with pytest.raises(SettingError) as info:
        initialize_encoder(_net(), "pretrained", pretrained_weights="timm")
    assert len(attempts) == 1 and attempts[0][1] == utils.HUB_PROBE_TIMEOUT
    text = str(info.value)
    assert "could not be reached within 5 s" in text and "Name or service not known" in text
    assert "pretrained_weights none" in text and "Nothing was trained" in text


def test_timm_hub_probe_skipped_behind_a_proxy(monkeypatch):
    import socket

    import huggingface_hub.constants

    from spectraflow_monai.networks import weights as utils

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False, raising=False)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("no direct probe behind a proxy"))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert utils._hub_unreachable() is None


def test_timm_hub_weights_are_loaded_when_reachable(monkeypatch, caplog):
    import timm.models

    from spectraflow_monai.networks import weights as utils

    monkeypatch.setattr(utils, "_hub_unreachable", lambda *a, **k: None)  # this machine may have no internet

    hub = timm.create_model(NAME, pretrained=False, img_size=518, depth=2, num_classes=0)  # the hub's 37x37 grid
    calls = []

    def download(hub_id, *args, **kwargs):
        calls.append((hub_id, kwargs.get("weights_only")))
        return {k: v.clone() for k, v in hub.state_dict().items()}

    monkeypatch.setattr(timm.models, "load_state_dict_from_hf", download)
    encoder = DINOv2Encoder(NAME, trainable_blocks=1, **KW)
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert encoder.load_pretrained("timm") == "timm"
    assert calls == [("timm/vit_small_patch14_dinov2.lvd142m", True)]
    _assert_holds(encoder, hub)
    assert encoder.vit.pos_embed.shape == (1, 1 + 2 * 2, 384)
    assert any(m.startswith("encoder weights: timm (hf-hub timm/vit_small_patch14_dinov2.lvd142m)") for m in
               _messages(caplog))  # fmt: skip


@pytest.mark.parametrize(
    "encoder_init, pretrained_weights", [("random", "timm"), ("pretrained", "none"), ("pretrained", None)]
)
def test_random_init_with_frozen_blocks_warns(caplog, encoder_init, pretrained_weights):
    net = _net(trainable_blocks=1)
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert initialize_encoder(net, encoder_init, pretrained_weights=pretrained_weights) is None
    (info,) = _messages(caplog)
    assert info.startswith("encoder weights: ") and "random initialisation" in info
    (warning,) = _messages(caplog, logging.WARNING)
    assert WARNING in warning and "trainable_blocks=1" in warning and "random features" in warning
    assert "trainable_blocks all" in warning


def test_random_init_of_a_fully_trained_encoder_does_not_warn(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert initialize_encoder(_net(trainable_blocks="all"), "random") is None
    assert _messages(caplog) and not _messages(caplog, logging.WARNING)


def test_missing_stage1_export_is_an_error_not_a_fallback(tmp_path):
    export = tmp_path / "models" / "encoder_stage1.pt"
    official = tmp_path / "dinov2.pth"
    official.write_bytes(b"")  # exists, but a fallback to it would fail on reading it
    with pytest.raises(SettingError) as info:
        initialize_encoder(_net(), "stage1", pretrained_weights=str(official), stage1_export=str(export))
    text = str(info.value)
    assert str(export) in text  # the missing file
    assert "configs/train_stage1.yaml" in text  # way 1: run Stage-1
    assert "--stage2_settings#encoder_init pretrained" in text  # way 2: start from pretrained_weights
    with pytest.raises(SettingError, match="<not set>"):
        resolve_encoder_init("stage1", None, "timm")


@pytest.mark.parametrize("value", ["stage2", "", None, 1])
def test_unknown_encoder_init_is_named(value):
    with pytest.raises(SettingError, match=r"encoder_init must be one of \['auto', 'stage1', 'pretrained', 'rand"):
        resolve_encoder_init(value, None, None)


def test_resolve_encoder_init():
    assert resolve_encoder_init("pretrained", None, "timm") == "timm"
    assert resolve_encoder_init("pretrained", None, " None ") is None
    assert resolve_encoder_init("pretrained", None, "/w/dinov2.pth") == "/w/dinov2.pth"
    assert resolve_encoder_init("random", None, "timm") is None
    with pytest.raises(SettingError, match="pretrained_weights must be"):
        resolve_encoder_init("pretrained", None, 3)


def test_auto_starts_from_the_stage1_export_when_there_is_one(tmp_path, caplog):
    """encoder_init auto: the Stage-1 export when it exists, else pretrained_weights, and the log says which;
    stage1 keeps meaning the export (an error when it is missing)."""
    export = tmp_path / "models" / "encoder_stage1.pt"
    caplog.set_level(logging.INFO, logger="spectraflow_monai.apps.encoder_init")
    assert resolve_encoder_start("auto", export) == "pretrained" and "no Stage-1 export at" in caplog.text
    # falling back is a visible choice: a WARNING naming the paper's row that now trains
    fallback = [r for r in caplog.records if "no Stage-1 export at" in r.getMessage()]
    assert fallback[0].levelno == logging.WARNING and "the paper's 'no Stage-1' row" in fallback[0].getMessage()
    assert resolve_encoder_init("auto", export, "none") is None  # pretrained_weights none: random weights
    net = _net(trainable_blocks="all")
    assert initialize_encoder(net, "AUTO", pretrained_weights="none", stage1_export=export) is None
    save_encoder_export(_net().encoder, export)
    caplog.clear()
    assert resolve_encoder_start(" auto", export) == "stage1" and str(export) in caplog.text
    assert resolve_encoder_init("auto", export, "timm") == str(export)
    assert [resolve_encoder_start(v, None) for v in ("stage1", "pretrained", "random")] == [
        "stage1", "pretrained", "random",
    ]  # fmt: skip


# ---------------------------------------------------------------- the networks build the architecture only
def test_networks_build_the_architecture_only(monkeypatch):
    create = timm.create_model
    flags = []
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: flags.append(k["pretrained"]) or create(*a, **k))
    monkeypatch.setattr(DINOv2Encoder, "load_pretrained", lambda *a, **k: pytest.fail("weights were loaded"))
    _net()
    DINOv2Encoder(NAME, **KW)
    assert flags == [False, False]


def test_constructor_argument_goes_through_the_loader(monkeypatch, tmp_path):
    # pretrained= remains a Python convenience: one call to the encoder's load_pretrained once the encoder (and its
    # freezing) is built, also for "timm" (timm.create_model never downloads)
    calls = []
    record = lambda enc, source, label=None: calls.append((enc.trainable_blocks, source))  # noqa: E731
    monkeypatch.setattr(DINOv2Encoder, "load_pretrained", record)
    create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: k["pretrained"] and pytest.fail() or create(*a, **k))
    net = _net(pretrained="timm", trainable_blocks=1)
    assert calls == [(1, "timm")] and isinstance(net.encoder, DINOv2Encoder)
    DINOv2Encoder(NAME, pretrained=os.fspath(tmp_path / "w.pth"), **KW)
    assert calls[-1][1] == os.fspath(tmp_path / "w.pth")


# ---------------------------------------------------------------- the encoder asks for its weights
def test_the_network_and_its_encoder_load_through_one_method(tmp_path, caplog):
    """``SpectraFlowNet.load_pretrained`` hands the source to its encoder's ``load_pretrained``, which reads the file
    with the weights module (a plain timm ``VisionTransformer`` is all that module sees)."""
    src = _timm_model(NAME, img_size=28, depth=2, seed=3)
    path = tmp_path / "timm_state.pt"
    torch.save(src.state_dict(), path)
    net = _net()
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert net.load_pretrained(path, label="mine") == str(path)
    _assert_holds(net.encoder, src)
    (line,) = _messages(caplog)
    assert line == f"encoder weights: mine ({path}): {len(src.state_dict())} tensors loaded into {NAME}"
    vit = _timm_model(NAME, img_size=28, depth=2, seed=4)
    assert weights.load_dinov2_state_dict(vit, path) == len(src.state_dict())
    torch.testing.assert_close(vit.state_dict()["norm.weight"], src.state_dict()["norm.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_object_that_only_looks_like_an_encoder_is_refused(wrapped):
    """No duck typing: a module with an encoder's attributes is not an encoder; a DataParallel-wrapped network is."""

    class LookAlike(torch.nn.Module):
        model_name, trainable_blocks = NAME, "all"

        def load_weights(self, path):
            pytest.fail("a look-alike was loaded into")

    with pytest.raises(ValueError, match="expected a DINOv2Encoder or a network with one as .encoder, got LookAlike"):
        initialize_encoder(torch.nn.DataParallel(LookAlike()) if wrapped else LookAlike(), "random")
    net = _net(trainable_blocks="all")
    assert initialize_encoder(torch.nn.DataParallel(net) if wrapped else net, "random") is None
