"""Tests for spectraflow_monai.transforms.batched: batch-level random augmentation on the training device."""

from __future__ import annotations

import pytest
import torch
from monai.transforms import Affine, AdjustContrast, GaussianSmooth

from spectraflow_monai.transforms import (
    BatchCompose,
    NormalizeIntensityBatch,
    NormalizeIntensityBatchd,
    RandAdjustContrastBatch,
    RandAffineBatch,
    RandAffineBatchd,
    RandFlipBatch,
    RandFlipBatchd,
    RandGaussianSmoothBatch,
    RandRotate90Batch,
    RandRotate90Batchd,
    RandScaleIntensityBatch,
    RandShiftIntensityBatch,
)


def _batch(b=6, c=3, h=24, w=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.rand(b, c, h, w, generator=g)
    label = (torch.rand(b, 1, h, w, generator=g) > 0.6).float()
    return image, label


ARRAY_CASES = [
    (RandFlipBatch, {"spatial_axis": 0}),
    (RandFlipBatch, {"spatial_axis": 1}),
    (RandRotate90Batch, {}),
    (RandAffineBatch, {"rotate_range": 0.6, "scale_range": 0.1}),
    (RandAdjustContrastBatch, {"gamma": (0.7, 1.5)}),
    (RandScaleIntensityBatch, {"factors": 0.15}),
    (RandShiftIntensityBatch, {"offsets": 0.05, "channel_wise": True}),
    (RandGaussianSmoothBatch, {"sigma_x": (0.25, 1.0), "sigma_y": (0.25, 1.0)}),
]


@pytest.mark.parametrize("cls, kwargs", ARRAY_CASES)
def test_shape_dtype_and_prob_zero_is_identity(cls, kwargs):
    image, _ = _batch()
    t = cls(prob=0.0, **kwargs).set_random_state(0)
    out = t(image)
    assert out.shape == image.shape and out.dtype == image.dtype
    assert torch.equal(out, image)
    out1 = cls(prob=1.0, **kwargs).set_random_state(0)(image)
    assert out1.shape == image.shape and not torch.equal(out1, image)


@pytest.mark.parametrize("cls, kwargs", ARRAY_CASES)
def test_determinism_and_state_restore(cls, kwargs):
    image, _ = _batch()
    a, b = cls(prob=0.5, **kwargs).set_random_state(7), cls(prob=0.5, **kwargs).set_random_state(7)
    assert torch.equal(a(image), b(image))
    state = a.state_dict()
    first = a(image)
    c = cls(prob=0.5, **kwargs)
    c.load_state_dict(state)
    assert torch.equal(c(image), first)
    assert not torch.equal(a(image), first) or cls is RandFlipBatch  # the sequence moves on


def test_per_sample_probability():
    image = torch.arange(4.0).reshape(1, 1, 2, 2).expand(4000, 1, 2, 2).contiguous()
    out = RandFlipBatch(prob=0.3, spatial_axis=1).set_random_state(1)(image)
    frac = (out != image).flatten(1).any(1).float().mean().item()
    assert abs(frac - 0.3) < 0.03


def test_flip_and_rot90_prob_one_match_torch():
    image, _ = _batch()
    assert torch.equal(RandFlipBatch(1.0, spatial_axis=0)(image), image.flip(2))
    assert torch.equal(RandRotate90Batch(1.0, max_k=1)(image), torch.rot90(image, 1, dims=(2, 3)))


@pytest.mark.parametrize(
    "transform",
    [
        RandFlipBatchd(["image", "label"], prob=0.5, spatial_axis=0),
        RandRotate90Batchd(["image", "label"], prob=0.5),
        RandAffineBatchd(["image", "label"], prob=0.7, rotate_range=0.6, scale_range=0.1, mode="nearest"),
    ],
)
def test_image_and_label_stay_aligned(transform):
    image, label = _batch(b=16)
    image[:, :1] = label  # channel 0 carries the label: the same geometric transform keeps them equal
    out = transform.set_random_state(3)({"image": image, "label": label})
    assert torch.equal(out["image"][:, :1], out["label"])
    assert not torch.equal(out["label"], label)


def test_affine_modes_per_key_and_label_values():
    image, label = _batch(b=8)
    t = RandAffineBatchd(["image", "label"], prob=1.0, rotate_range=0.6, scale_range=0.1, mode=["bilinear", "nearest"])
    out = t.set_random_state(0)({"image": image, "label": label})
    assert set(out["label"].unique().tolist()) <= {0.0, 1.0}  # nearest: no new label values


@pytest.mark.parametrize("angle, scale", [(0.4, 1.08), (-0.55, 0.93), (0.0, 1.1)])
def test_affine_matches_monai(angle, scale):
    """A sample transformed with MONAI's Affine (same angle and scale of H) is the same image (non-square)."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.avg_pool2d(torch.rand(1, 2, 28, 36, generator=g), 3, 1, 1)
    t = RandAffineBatch(prob=1.0, rotate_range=(angle, angle), scale_range=((scale - 1, scale - 1),))
    ours = t(x)[0]
    ref = Affine(rotate_params=angle, scale_params=(scale, 1.0), padding_mode="zeros", image_only=True)(x[0])
    inner = (slice(None), slice(6, -6), slice(6, -6))
    torch.testing.assert_close(ours[inner], torch.as_tensor(ref)[inner], atol=1e-4, rtol=1e-4)


def test_colour_transforms_match_monai():
    image, _ = _batch(b=3)
    t = RandAdjustContrastBatch(prob=1.0, gamma=(0.7, 1.5)).set_random_state(0)
    flags, gamma = t.randomize(image)
    out = t(image, params=(flags, gamma))
    for i in range(3):
        torch.testing.assert_close(out[i], AdjustContrast(float(gamma[i]))(image[i]).as_tensor())
    s = RandGaussianSmoothBatch(prob=1.0, sigma_x=(0.5, 1.0), sigma_y=(0.5, 1.0)).set_random_state(0)
    flags, sx, sy = s.randomize(image)
    out = s(image, params=(flags, sx, sy))
    for i in range(3):
        ref = GaussianSmooth(sigma=(float(sx[i]), float(sy[i])))(image[i])
        torch.testing.assert_close(out[i], torch.as_tensor(ref), atol=2e-4, rtol=1e-3)


def test_normalize_and_compose_determinism():
    image, label = _batch()
    norm = NormalizeIntensityBatch((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    mean, std = torch.tensor([0.5, 0.4, 0.3]).reshape(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).reshape(1, 3, 1, 1)
    ref = (image - mean) / std
    torch.testing.assert_close(norm(image), ref)

    def pipeline():
        return BatchCompose(
            [
                RandFlipBatchd(["image", "label"], prob=0.5, spatial_axis=0),
                RandRotate90Batchd(["image", "label"], prob=0.5),
                RandAffineBatchd(["image", "label"], prob=0.3, rotate_range=0.6, scale_range=0.1,
                                 mode=["bilinear", "nearest"]),
                NormalizeIntensityBatchd("image", 0.5, 0.25),
            ]
        )

    a, b = pipeline().set_random_state(11), pipeline().set_random_state(11)
    oa, ob = a({"image": image, "label": label}), b({"image": image, "label": label})
    assert torch.equal(oa["image"], ob["image"]) and torch.equal(oa["label"], ob["label"])
    state = a.state_dict()
    nxt = a({"image": image, "label": label})
    c = pipeline()
    c.load_state_dict(state)
    assert torch.equal(c({"image": image, "label": label})["image"], nxt["image"])


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (RandFlipBatch, {"prob": 1.5}),
        (RandFlipBatch, {"spatial_axis": 2}),
        (RandRotate90Batch, {"max_k": 4}),
        (RandAffineBatch, {"mode": "bicubic"}),
        (RandAffineBatch, {"padding_mode": "wrap"}),
        (RandAffineBatch, {"scale_range": (0.1, 0.1, 0.1)}),
        (RandAffineBatch, {"scale_range": 1.5}),
        (RandAdjustContrastBatch, {"gamma": 0.3}),
        (RandScaleIntensityBatch, {"factors": (0.2, 0.1)}),
        (RandGaussianSmoothBatch, {"sigma_x": (0.0, 1.0)}),
        (NormalizeIntensityBatch, {"subtrahend": 0.0, "divisor": 0.0}),
    ],
)
def test_ill_arguments(cls, kwargs):
    with pytest.raises(ValueError):
        cls(**kwargs)


def test_call_errors():
    with pytest.raises(ValueError, match="square"):
        RandRotate90Batch(1.0)(torch.zeros(2, 1, 4, 6))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        RandFlipBatch(1.0)(torch.zeros(1, 4, 4))
    with pytest.raises(ValueError, match="missing"):
        RandFlipBatchd(["image", "label"], prob=1.0)({"image": torch.zeros(2, 1, 4, 4)})
    with pytest.raises(ValueError, match="seed"):
        RandFlipBatch().set_random_state(-1)
