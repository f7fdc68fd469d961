"""Tests for spectraflow_monai.transforms.mixed_domain (SpectraFlow mixed-domain Stage-1 inputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import MetaTensor, list_data_collate
from monai.transforms import Compose

from spectraflow_monai.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MaskToImage,
    RandMixedDomain,
    RandMixedDomaind,
)

MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)[:, None, None]
STD = np.array(IMAGENET_STD, dtype=np.float32)[:, None, None]


def _mask(size: int = 8) -> np.ndarray:
    m = np.zeros((1, size, size), dtype=np.uint8)
    m[0, 2:5, 3:7] = 1
    return m


def _expected_render(mask01: np.ndarray) -> np.ndarray:
    x = np.repeat(mask01.astype(np.float32).reshape(1, *mask01.shape[-2:]), 3, axis=0)
    return (x - MEAN) / STD


# ---------------------------------------------------------------- MaskToImage
def test_mask_to_image_numpy_values():
    m = _mask()
    out = MaskToImage()(m)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (3, 8, 8)
    for c in range(3):
        assert out[c, 3, 4] == pytest.approx((1 - IMAGENET_MEAN[c]) / IMAGENET_STD[c], rel=1e-6)  # foreground
        assert out[c, 0, 0] == pytest.approx(-IMAGENET_MEAN[c] / IMAGENET_STD[c], rel=1e-6)  # background
    np.testing.assert_allclose(out, _expected_render(m), rtol=1e-6)


def test_mask_to_image_torch_2d_and_metatensor():
    m = torch.as_tensor(_mask()[0])  # (H, W)
    out = MaskToImage(channels=1, mean=None, std=None, foreground_value=255.0)(m)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (1, 8, 8)
    assert set(out.unique().tolist()) == {0.0, 255.0}
    mt = MetaTensor(torch.as_tensor(_mask()), meta={"filename_or_obj": "mask.png"})
    out_mt = MaskToImage()(mt)
    assert isinstance(out_mt, MetaTensor) and out_mt.meta["filename_or_obj"] == "mask.png"
    np.testing.assert_allclose(out_mt.numpy(), _expected_render(_mask()), rtol=1e-6)


def test_mask_to_image_label_maps():
    labels = np.array([[[0, 1, 2], [3, 4, 8]]], dtype=np.int64)  # Synapse-like label map
    binary = MaskToImage(channels=1, mean=None, std=None)(labels)
    np.testing.assert_array_equal(binary, (labels > 0).astype(np.float32))
    scaled = MaskToImage(channels=1, mean=None, std=None, binarize=False)(labels)
    np.testing.assert_allclose(scaled, labels / 8.0)
    fixed = MaskToImage(channels=1, mean=None, std=None, binarize=False, max_label=16)(labels)
    np.testing.assert_allclose(fixed, labels / 16.0)
    bool_mask = MaskToImage(channels=2, mean=0.5, std=0.5)(np.ones((4, 4), dtype=bool))
    np.testing.assert_allclose(bool_mask, np.ones((2, 4, 4)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"channels": 0}, "channels.*0"),
        ({"std": (0.2, 0.0, 0.2)}, "std must be > 0"),
        ({"mean": (0.5, 0.5)}, "mean has 2 values.*3 channel"),
        ({"mean": None}, "mean and std"),
        ({"mean": "abc"}, "mean"),
        ({"max_label": 0}, "max_label.*0"),
    ],
)
def test_mask_to_image_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MaskToImage(**kwargs)


def test_mask_to_image_bad_mask_shape():
    with pytest.raises(ValueError, match=r"\(2, 8, 8\)"):
        MaskToImage()(np.zeros((2, 8, 8)))


# ---------------------------------------------------------------- RandMixedDomain (array)
def test_array_ratio_honoured():
    t = RandMixedDomain(mask_ratio=0.3).set_random_state(seed=0)
    img, m = np.zeros((3, 4, 4), np.float32), np.ones((1, 4, 4), np.uint8)
    n = 2000
    flags = [int(t(img, m)[1]) for _ in range(n)]
    sigma = np.sqrt(n * 0.3 * 0.7)
    assert abs(sum(flags) - 0.3 * n) < 4 * sigma


@pytest.mark.parametrize("ratio, flag", [(0.0, 0), (1.0, 1)])
def test_array_extremes(ratio, flag):
    t = RandMixedDomain(mask_ratio=ratio).set_random_state(seed=3)
    img = torch.rand(3, 8, 8)
    for _ in range(50):
        out, domain = t(img, torch.as_tensor(_mask()))
        assert domain.dtype == torch.int64 and int(domain) == flag
        if flag:
            np.testing.assert_allclose(out.numpy(), _expected_render(_mask()), rtol=1e-6)
        else:
            assert out is img


def test_array_numpy_domain_type_and_channels():
    t = RandMixedDomain(mask_ratio=1.0, mean=0.5, std=0.25)
    out, domain = t(np.zeros((1, 8, 8), np.float32), _mask()[0])
    assert isinstance(domain, np.int64) and domain == 1
    assert out.shape == (1, 8, 8) and out.dtype == np.float32
    assert set(np.unique(out).tolist()) == {-2.0, 2.0}


def test_array_determinism():
    img, m = np.zeros((3, 4, 4), np.float32), np.ones((1, 4, 4), np.uint8)
    a = RandMixedDomain(0.5).set_random_state(seed=123)
    b = RandMixedDomain(0.5).set_random_state(seed=123)
    fa = [int(a(img, m)[1]) for _ in range(100)]
    fb = [int(b(img, m)[1]) for _ in range(100)]
    assert fa == fb and 0 < sum(fa) < 100


def test_array_bad_args():
    for ratio in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"mask_ratio.*{ratio}"):
            RandMixedDomain(mask_ratio=ratio)
    t = RandMixedDomain(mask_ratio=0.0)
    with pytest.raises(ValueError, match=r"\(3, 8, 8\).*\(1, 8, 6\)"):
        t(np.zeros((3, 8, 8)), np.zeros((1, 8, 6)))  # checked even when the image is kept
    with pytest.raises(ValueError, match="mean has 3 values.*1 channel"):
        RandMixedDomain(mask_ratio=1.0)(np.zeros((1, 8, 8)), np.zeros((1, 8, 8)))


# ---------------------------------------------------------------- RandMixedDomaind (dictionary)
def _sample(torch_backend: bool = True):
    img = np.random.default_rng(0).random((3, 8, 8)).astype(np.float32)
    if torch_backend:
        return {
            "image": MetaTensor(torch.as_tensor(img), meta={"filename_or_obj": "img.png"}),
            "label": MetaTensor(torch.as_tensor(_mask()), meta={"filename_or_obj": "mask.png"}),
        }
    return {"image": img, "label": _mask()}


def test_dict_mask_domain_and_key_removed():
    out = RandMixedDomaind(mask_ratio=1.0)(_sample())
    assert "label" not in out
    assert isinstance(out["image"], MetaTensor) and out["image"].dtype == torch.float32
    assert out["image"].meta["filename_or_obj"] == "img.png"
    np.testing.assert_allclose(out["image"].numpy(), _expected_render(_mask()), rtol=1e-6)
    assert out["domain"].dtype == torch.int64 and int(out["domain"]) == 1


def test_dict_image_domain_and_keep_mask():
    data = _sample(torch_backend=False)
    out = RandMixedDomaind(mask_ratio=0.0, drop_mask=False, domain_key="dom")(data)
    assert out["image"] is data["image"] and out["label"] is data["label"]
    assert isinstance(out["dom"], np.int64) and out["dom"] == 0
    assert "label" in data  # input dict not modified


def test_dict_ratio_determinism_and_collate():
    t = RandMixedDomaind(mask_ratio=0.25)
    t.set_random_state(seed=7)
    n = 2000
    flags = [int(t(_sample(False))["domain"]) for _ in range(n)]
    assert abs(sum(flags) - 0.25 * n) < 4 * np.sqrt(n * 0.25 * 0.75)
    pipeline = Compose([RandMixedDomaind(mask_ratio=0.5)])
    pipeline.set_random_state(seed=11)
    first = [int(pipeline(_sample())["domain"]) for _ in range(30)]
    pipeline.set_random_state(seed=11)
    second = [int(pipeline(_sample())["domain"]) for _ in range(30)]
    assert first == second
    batch = list_data_collate([pipeline(_sample()) for _ in range(4)])
    assert batch["image"].shape == (4, 3, 8, 8) and batch["domain"].shape == (4,)


def test_dict_multiclass_and_single_channel_image():
    labels = np.zeros((8, 8), np.int64)
    labels[1:3, 1:3], labels[5:7, 5:7] = 3, 8
    data = {"image": np.zeros((1, 8, 8), np.float32), "label": labels}
    out = RandMixedDomaind(mask_ratio=1.0, mean=None, std=None)(data)
    np.testing.assert_array_equal(out["image"], (labels > 0)[None].astype(np.float32))
    out = RandMixedDomaind(mask_ratio=1.0, mean=None, std=None, binarize=False, max_label=8)(data)
    np.testing.assert_allclose(out["image"], labels[None] / 8.0)


def test_dict_missing_mask():
    with pytest.raises(KeyError, match="label"):
        RandMixedDomaind(mask_ratio=1.0)({"image": np.zeros((3, 8, 8))})
    data = {"image": np.zeros((3, 8, 8))}
    out = RandMixedDomaind(mask_ratio=1.0, allow_missing_keys=True)(data)
    assert out["image"] is data["image"] and out["domain"] == 0


def test_dict_bad_args():
    for ratio in (-0.5, 2.0):
        with pytest.raises(ValueError, match="mask_ratio"):
            RandMixedDomaind(mask_ratio=ratio)
    with pytest.raises(ValueError, match="mask_key 'image'"):
        RandMixedDomaind(keys="image", mask_key="image")
    with pytest.raises(ValueError, match="domain_key 'label'"):
        RandMixedDomaind(domain_key="label")
    bad = {"image": np.zeros((3, 8, 8)), "label": np.zeros((1, 6, 8))}
    with pytest.raises(ValueError, match=r"'image' shape \(3, 8, 8\) vs 'label' shape \(1, 6, 8\)"):
        RandMixedDomaind(mask_ratio=0.5)(bad)
