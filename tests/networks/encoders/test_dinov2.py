"""Tests for spectraflow_monai.networks.encoders.dinov2 (DINOv2Encoder)."""

from __future__ import annotations

import math
import re

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from spectraflow_monai.networks import DINOv2Encoder, EncoderFeatures

SMALL = {"depth": 3}
# depth-12 ViT-S built without timm's (slow, CPU) weight init: only the shapes matter there
REAL = {"weight_init": "skip"}


def _timm_model(name: str, img_size: int = 224, depth: int = 3, seed: int = 0) -> torch.nn.Module:
    """A timm DINOv2 ViT with perturbed weights, so that every block (and LayerScale) visibly changes features."""
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, img_size=img_size, dynamic_img_size=True, depth=depth,
                              num_classes=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _official_layout(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Write a timm DINOv2 model in the facebookresearch layout of the 518-px checkpoints (37x37 grid + cls)."""
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    dim = model.embed_dim
    grid = model.patch_embed.grid_size
    if model.reg_token is not None:  # timm: no_embed_class, pos_embed only over patches
        pos_patch = sd.pop("pos_embed")
        pos_cls = torch.randn(1, 1, dim)
        sd["register_tokens"] = sd.pop("reg_token")
        sd["cls_token"] = sd["cls_token"] - pos_cls  # the official cls position is added back by the conversion
    else:
        pos = sd.pop("pos_embed")
        pos_cls, pos_patch = pos[:, :1], pos[:, 1:]
    pos_patch = resample_abs_pos_embed(pos_patch, new_size=(37, 37), old_size=grid, num_prefix_tokens=0)
    sd["pos_embed"] = torch.cat([pos_cls, pos_patch], dim=1)
    sd["mask_token"] = torch.zeros(1, dim)
    return sd


def _dinov2_pos_encoding(pos_embed: torch.Tensor, grid: tuple[int, int], offset: float, antialias: bool):
    """Reference of facebookresearch/dinov2 ``interpolate_pos_encoding``: class position kept, the M x M patch grid
    as (1, D, M, M) bicubic-interpolated with scale_factor (g + offset) / M (offset != 0) or to the size (offset 0)."""
    cls_pos, patch_pos = pos_embed[:, :1], pos_embed[:, 1:].float()
    m, dim = int(math.sqrt(patch_pos.shape[1])), patch_pos.shape[-1]
    kwargs = {"scale_factor": ((grid[0] + offset) / m, (grid[1] + offset) / m)} if offset else {"size": grid}
    patch_pos = F.interpolate(
        patch_pos.reshape(1, m, m, dim).permute(0, 3, 1, 2), mode="bicubic", antialias=antialias, **kwargs
    )
    assert tuple(patch_pos.shape[-2:]) == grid
    return torch.cat([cls_pos, patch_pos.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def _official_settings(name: str) -> tuple[float, bool]:
    """(interpolate_offset, interpolate_antialias) of the official hub models (dinov2/hub/backbones.py)."""
    return (0.0, True) if "reg4" in name else (0.1, False)


def _timm_features(model: torch.nn.Module, x: torch.Tensor, skip_index: int) -> EncoderFeatures:
    """Reference features from timm's own forward_features / forward_intermediates."""
    b, _, hh, ww = x.shape
    h, w = hh // 14, ww // 14
    tokens = model.forward_features(x)[:, model.num_prefix_tokens :]
    final = tokens.reshape(b, h, w, -1).permute(0, 3, 1, 2)
    depth = len(model.blocks)
    skip, penult = model.forward_intermediates(
        x, indices=[skip_index, depth - 2], norm=False, output_fmt="NCHW", intermediates_only=True
    )
    return EncoderFeatures(final=final, skip=skip, pooled=penult.mean(dim=(2, 3)))


def _assert_features_close(a: EncoderFeatures, b: EncoderFeatures) -> None:
    for name in EncoderFeatures._fields:
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-4, atol=1e-4, msg=name)


# ---------------------------------------------------------------- shapes
@pytest.mark.parametrize(
    "name, kwargs, shape, channels",
    [
        ("vit_small_patch14_dinov2", SMALL, (1, 3, 28, 28), 384),
        ("vit_small_patch14_dinov2", SMALL, (4, 3, 56, 42), 384),
        ("vit_small_patch14_dinov2", SMALL, (2, 3, 224, 168), 384),
        ("vit_small_patch14_reg4_dinov2", SMALL, (1, 3, 42, 56), 384),
        ("vit_small_patch14_reg4_dinov2", SMALL, (4, 3, 28, 28), 384),
        ("vit_base_patch14_dinov2", {"depth": 2, "weight_init": "skip"}, (2, 3, 28, 42), 768),
        ("vit_base_patch14_reg4_dinov2", {"depth": 2, "weight_init": "skip"}, (1, 3, 42, 28), 768),
        ("vit_small_patch14_dinov2", REAL, (1, 3, 224, 224), 384),
        ("vit_small_patch14_dinov2", REAL, (1, 3, 448, 448), 384),
        ("vit_small_patch14_reg4_dinov2", REAL, (1, 3, 224, 224), 384),
    ],
)
def test_shapes(name, kwargs, shape, channels):
    enc = DINOv2Encoder(name, model_kwargs=kwargs).eval()
    if kwargs.get("weight_init") == "skip":  # skipped init leaves uninitialised memory: fill it cheaply
        with torch.no_grad():
            for p in enc.parameters():
                p.normal_(0.0, 0.02)
    assert enc.out_channels == enc.embed_dim == channels and enc.patch_size == 14
    with torch.no_grad():
        out = enc(torch.randn(shape))
    assert isinstance(out, EncoderFeatures)
    b, _, hh, ww = shape
    assert out.final.shape == (b, channels, hh // 14, ww // 14)
    assert out.skip.shape == (b, channels, hh // 14, ww // 14)
    assert out.pooled.shape == (b, channels)
    assert torch.isfinite(out.final).all()


def test_real_depth_defaults():
    enc = DINOv2Encoder(model_kwargs=REAL)
    assert enc.depth == 12 and enc.skip_index == 5 and enc.vit.num_prefix_tokens == 1
    assert enc.vit.pos_embed.shape == (1, 16 * 16 + 1, 384)  # img_size=224 -> 16x16 grid
    reg = DINOv2Encoder("vit_small_patch14_reg4_dinov2", model_kwargs={"depth": 2, "weight_init": "skip"})
    assert reg.vit.num_prefix_tokens == 5 and reg.skip_index == 0 and reg.depth == 2


def test_features_match_timm_reference():
    """final/skip/pooled equal timm's forward_features and forward_intermediates on the same weights."""
    model = _timm_model("vit_small_patch14_reg4_dinov2", depth=4)
    enc = DINOv2Encoder("vit_small_patch14_reg4_dinov2", model_kwargs={"depth": 4}, skip_index=1).eval()
    enc.vit.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 56, 42)
    with torch.no_grad():
        _assert_features_close(enc(x), _timm_features(model, x, skip_index=1))
        # the three outputs really are different stages (not the same tensor)
        out = enc(x)
        assert not torch.allclose(out.final, out.skip)


# ---------------------------------------------------------------- ill arguments
def test_bad_input_size():
    enc = DINOv2Encoder(model_kwargs={"depth": 2})
    with pytest.raises(ValueError, match=r"\(30, 28\).*patch size 14"):
        enc(torch.randn(1, 3, 30, 28))
    with pytest.raises(ValueError, match=r"\(28, 29\).*patch size 14"):
        enc(torch.randn(1, 3, 28, 29))
    with pytest.raises(ValueError, match=r"\(1, 1, 28, 28\)"):
        enc(torch.randn(1, 1, 28, 28))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"model_name": "vit_small_patch16_224"}, r"model_name.*vit_small_patch14_dinov2.*got 'vit_small_patch16_224'"),
        ({"skip_index": 2}, r"skip_index.*got 2"),
        ({"skip_index": -1}, r"skip_index.*got -1"),
        ({"trainable_blocks": 4}, r"trainable_blocks.*got 4"),
        ({"trainable_blocks": -2}, r"trainable_blocks.*got -2"),
        ({"trainable_blocks": "last"}, r"trainable_blocks.*'last'"),
        ({"trainable_blocks": 1.5}, r"trainable_blocks.*1\.5"),
        ({"img_size": 230}, r"img_size.*230"),
        ({"img_size": 0}, r"img_size.*0"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        DINOv2Encoder(**{"model_kwargs": {"depth": 3}, **kwargs})


def test_unknown_name_lists_supported():
    with pytest.raises(ValueError) as err:
        DINOv2Encoder("dinov3")
    msg = str(err.value)
    assert "'dinov3'" in msg
    for name in DINOv2Encoder.SUPPORTED_MODELS:
        assert name in msg


def test_timm_download_failure_is_explained(monkeypatch):
    # the network is built without weights (timm never downloads); pretrained="timm" goes through
    # the encoder's load_pretrained, whose download (spectraflow_monai.networks.weights.load_timm_weights) fails here
    import timm.models

    from spectraflow_monai.utils import SettingError

    from spectraflow_monai.networks import weights as utils

    def offline(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(utils, "_hub_unreachable", lambda *a, **k: None)  # the hub client itself fails here
    monkeypatch.setattr(timm.models, "load_state_dict_from_hf", offline)
    with pytest.raises(SettingError, match=r"(?s)vit_small_patch14_dinov2.*no network.*pretrained='/path/file'"):
        DINOv2Encoder(pretrained="timm", img_size=28, model_kwargs={"depth": 2})


@pytest.mark.parametrize("word", ["null", "None", " none ", ""])
def test_command_line_words_for_no_weights(monkeypatch, word):
    # a bundle override such as --pretrained_weights null arrives as a string: random init, never a file lookup
    calls = []
    create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda *a, **k: calls.append(k["pretrained"]) or create(*a, **k))
    monkeypatch.setattr(DINOv2Encoder, "load_weights", lambda *a, **k: pytest.fail("tried to load a weight file"))
    enc = DINOv2Encoder(pretrained=word, img_size=28, model_kwargs={"depth": 2})
    assert calls == [False] and enc.depth == 2


# ---------------------------------------------------------------- freezing
def _expected_trainable(enc: DINOv2Encoder, mode) -> set[str]:
    names = {n for n, _ in enc.vit.named_parameters()}
    if mode in (0, "frozen"):
        return set()
    if mode in (-1, "all"):
        return names
    last = {f"blocks.{i}." for i in range(enc.depth - mode, enc.depth)}
    return {n for n in names if n.startswith("norm.") or any(n.startswith(p) for p in last)}


@pytest.mark.parametrize("mode", [0, "frozen", 1, 2, 3, -1, "all"])
def test_freezing_and_gradient_flow(mode):
    enc = DINOv2Encoder("vit_small_patch14_reg4_dinov2", model_kwargs=SMALL, trainable_blocks=mode)
    expected = _expected_trainable(enc, mode)
    trainable = {n for n, p in enc.vit.named_parameters() if p.requires_grad}
    assert trainable == expected
    assert len(enc.trainable_parameters()) == len(expected)
    assert enc.trainable_blocks == mode
    if mode == 1:  # the paper's Stage-2 setting: exactly the last block + final norm
        assert expected and all(n.startswith(("blocks.2.", "norm.")) for n in expected)

    out = enc(torch.randn(2, 3, 28, 28))
    if not expected:
        assert not (out.final.requires_grad or out.skip.requires_grad or out.pooled.requires_grad)
        return
    loss = out.final.square().mean()
    for t in (out.skip, out.pooled):
        if t.requires_grad:
            loss = loss + t.square().mean()
    loss.backward()
    with_grad = {n for n, p in enc.vit.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad == expected


def test_set_trainable_blocks_switches():
    enc = DINOv2Encoder(model_kwargs=SMALL, trainable_blocks="all")
    enc.set_trainable_blocks(0)
    assert enc.trainable_parameters() == []
    enc.set_trainable_blocks(1)
    assert {n for n, p in enc.vit.named_parameters() if p.requires_grad} == _expected_trainable(enc, 1)
    with pytest.raises(ValueError, match="got True"):
        enc.set_trainable_blocks(True)


def test_partial_freezing_is_exact():
    """The frozen-prefix no_grad path gives the same outputs and last-block gradients as a fully trainable pass."""
    enc = DINOv2Encoder(model_kwargs={"depth": 4}, trainable_blocks=1)
    enc.vit.load_state_dict(_timm_model("vit_small_patch14_dinov2", depth=4).state_dict())
    x = torch.randn(2, 3, 28, 42)
    out = enc(x)
    assert not out.skip.requires_grad and out.final.requires_grad
    out.final.sum().backward()
    grads = {n: p.grad.clone() for n, p in enc.vit.named_parameters() if p.requires_grad}
    enc.zero_grad(set_to_none=True)

    enc.set_trainable_blocks("all")
    ref = enc(x)
    ref.final.sum().backward()
    _assert_features_close(out, EncoderFeatures(*(t.detach() for t in ref)))
    for n, g in grads.items():
        torch.testing.assert_close(g, dict(enc.vit.named_parameters())[n].grad, rtol=1e-4, atol=1e-5, msg=n)

    # an input that requires grad still receives it through the frozen blocks
    enc.set_trainable_blocks(1)
    xg = x.clone().requires_grad_(True)
    enc(xg).final.sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0


def test_no_grad_context_respected():
    enc = DINOv2Encoder(model_kwargs={"depth": 2}, trainable_blocks="all")
    with torch.no_grad():
        out = enc(torch.randn(1, 3, 28, 28))
    assert not out.final.requires_grad


# ---------------------------------------------------------------- weights
@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_official_checkpoint_matches_timm_loading(tmp_path, name):
    src = _timm_model(name, depth=3, seed=1)
    path = tmp_path / "dinov2_official.pth"
    official = _official_layout(src)
    assert official["pos_embed"].shape == (1, 37 * 37 + 1, 384)
    torch.save(official, path)

    enc = DINOv2Encoder(name, pretrained=path, model_kwargs=SMALL).eval()
    # reference: timm's loading of the same file with the grid already resized by the official DINOv2 rule
    resized = dict(official, pos_embed=_dinov2_pos_encoding(official["pos_embed"], (16, 16), *_official_settings(name)))
    ref_path = tmp_path / "dinov2_official_16x16.pth"
    torch.save(resized, ref_path)
    ref = timm.create_model(
        name, pretrained=True, img_size=224, dynamic_img_size=True, num_classes=0, depth=3,
        pretrained_cfg_overlay=dict(file=str(ref_path)),
    ).eval()
    x = torch.randn(2, 3, 56, 42)
    with torch.no_grad():
        _assert_features_close(enc(x), _timm_features(ref, x, enc.skip_index))
    # the non-positional weights are the source's, the class token is restored for the register layout
    loaded = enc.vit.state_dict()
    torch.testing.assert_close(loaded["blocks.1.attn.qkv.weight"], src.state_dict()["blocks.1.attn.qkv.weight"])
    torch.testing.assert_close(loaded["cls_token"], src.state_dict()["cls_token"])
    assert loaded["pos_embed"].shape == src.state_dict()["pos_embed"].shape


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
@pytest.mark.parametrize("img_size", [224, 98])
def test_official_position_grid_resized_as_dinov2(tmp_path, name, img_size):
    """The 37x37 grid is resized as the official interpolate_pos_encoding (not timm's antialiased resample)."""
    official = _official_layout(_timm_model(name, depth=2, seed=3))
    path = tmp_path / "official.pth"
    torch.save(official, path)
    enc = DINOv2Encoder(name, pretrained=path, img_size=img_size, model_kwargs={"depth": 2})
    grid = (img_size // 14, img_size // 14)
    expected = _dinov2_pos_encoding(official["pos_embed"], grid, *_official_settings(name))
    timm_rule = resample_abs_pos_embed(official["pos_embed"], new_size=grid, num_prefix_tokens=1)
    # without registers the official rule (offset 0.1, no antialiasing) differs from timm's antialiased resample;
    # with registers it is the same computation (antialiased bicubic to the size)
    assert torch.allclose(expected, timm_rule, atol=1e-4) == ("reg4" in name)
    if "reg4" in name:  # timm's no_embed_class layout: the class position moves into cls_token
        torch.testing.assert_close(enc.vit.pos_embed, expected[:, 1:], rtol=0, atol=0)
        torch.testing.assert_close(enc.vit.cls_token, official["cls_token"] + expected[:, :1], rtol=0, atol=0)
    else:
        torch.testing.assert_close(enc.vit.pos_embed, expected, rtol=0, atol=0)


def _wrapped(sd, how):
    if how == "plain":
        return sd
    if how == "module_model":
        return {"model": {f"module.{k}": v for k, v in sd.items()}}
    if how == "state_dict_encoder_vit":
        return {"state_dict": {f"encoder.vit.{k}": v for k, v in sd.items()}, "epoch": 3}
    if how == "encoder":
        return {"encoder": {f"vit.{k}": v for k, v in sd.items()}, "head": {"w": torch.zeros(1)}}
    raise ValueError(how)


@pytest.mark.parametrize("how", ["plain", "module_model", "state_dict_encoder_vit", "encoder"])
def test_timm_layout_checkpoint(tmp_path, how):
    src = _timm_model("vit_small_patch14_reg4_dinov2", depth=3, seed=2)
    path = tmp_path / f"{how}.pt"
    torch.save(_wrapped(src.state_dict(), how), path)
    enc = DINOv2Encoder("vit_small_patch14_reg4_dinov2", model_kwargs=SMALL).eval()
    enc.load_weights(str(path))
    for k, v in src.state_dict().items():
        torch.testing.assert_close(enc.vit.state_dict()[k], v, msg=k)
    x = torch.randn(1, 3, 28, 42)
    with torch.no_grad():
        _assert_features_close(enc(x), _timm_features(src, x, enc.skip_index))


def test_timm_layout_other_img_size(tmp_path):
    """A 224-px timm checkpoint loads into a 448-px encoder (pos_embed resampled from 16x16 to 32x32)."""
    src = _timm_model("vit_small_patch14_dinov2", depth=2)
    path = tmp_path / "w.pt"
    torch.save(src.state_dict(), path)
    enc = DINOv2Encoder(pretrained=path, img_size=448, model_kwargs={"depth": 2})
    assert enc.vit.pos_embed.shape == (1, 32 * 32 + 1, 384)


def _bad_file(tmp_path, sd, name):
    path = tmp_path / name
    torch.save(sd, path)
    return path


def test_bad_checkpoints(tmp_path):
    sd = _timm_model("vit_small_patch14_dinov2", depth=3).state_dict()
    enc = DINOv2Encoder(model_kwargs=SMALL)

    missing = _bad_file(tmp_path, {k: v for k, v in sd.items() if k != "blocks.1.norm1.weight"}, "missing.pt")
    with pytest.raises(ValueError, match=r"missing\.pt.*1 missing key\(s\) \['blocks\.1\.norm1\.weight'\]"):
        enc.load_weights(missing)

    extra = _bad_file(tmp_path, {**sd, "blocks.0.attn.extra": torch.zeros(2)}, "extra.pt")
    with pytest.raises(ValueError, match=r"extra\.pt.*1 unexpected key\(s\) \['blocks\.0\.attn\.extra'\]"):
        enc.load_weights(extra)

    deeper = _bad_file(tmp_path, _timm_model("vit_small_patch14_dinov2", depth=5).state_dict(), "deeper.pt")
    with pytest.raises(ValueError, match=r"deeper\.pt.*unexpected.*blocks\.3\."):
        enc.load_weights(deeper)

    shape = _bad_file(tmp_path, {**sd, "norm.weight": torch.ones(10)}, "shape.pt")
    with pytest.raises(ValueError, match=r"shape\.pt.*'norm\.weight'.*\(10,\).*\(384,\)"):
        enc.load_weights(shape)

    # another model's weights (ViT-B into ViT-S) are a setting's mistake: SettingError, one `error:` line in a run
    from spectraflow_monai.utils import SettingError

    base = _bad_file(tmp_path, _timm_model("vit_base_patch14_dinov2", depth=3).state_dict(), "vit_b.pt")
    with pytest.raises(SettingError, match=r"vit_b\.pt.*shape mismatch"):
        enc.load_weights(base)

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"garbage\.pt"):
        enc.load_weights(garbage)

    not_sd = _bad_file(tmp_path, {"epoch": 3, "lr": 0.1}, "not_sd.pt")
    with pytest.raises(ValueError, match=r"not_sd\.pt.*state dict"):
        enc.load_weights(not_sd)

    absent = tmp_path / "absent.pth"
    with pytest.raises(FileNotFoundError, match=re.escape(str(absent))):
        DINOv2Encoder(pretrained=absent, model_kwargs=SMALL)


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_feature_taps_equal_timm_forward_intermediates(name):
    """The encoder's own block loop (kept for the no-grad frozen prefix) taps what timm's forward_intermediates does."""
    enc = DINOv2Encoder(name, img_size=56, skip_index=1, model_kwargs={"depth": 4}).eval()
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        feats = enc(x)
        raw = enc.vit.forward_intermediates(x, indices=[1, 2, 3], norm=False, intermediates_only=True)
        normed = enc.vit.forward_intermediates(x, indices=[3], norm=True, intermediates_only=True)
    torch.testing.assert_close(feats.skip, raw[0])
    torch.testing.assert_close(feats.pooled, raw[1].mean(dim=(2, 3)))
    torch.testing.assert_close(feats.final, normed[0])
