"""Tests of the MAE masked-patch reconstruction loss (mixed-domain MAE Stage-1 variant)."""

from __future__ import annotations

import pytest
import torch
from parameterized import parameterized

from spectraflow_monai.losses import MAELoss, patchify, unpatchify

P = 7


def _inputs(seed: int = 0, batch: int = 2, size: int = 14):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, size, size, generator=g)
    n = (size // P) ** 2
    pred = torch.randn(batch, n, P * P * 3, generator=g)
    mask = torch.zeros(batch, n)
    mask[:, : n - 1] = 1.0
    mask = mask[:, torch.randperm(n, generator=g)]
    return images, pred, mask


def test_patchify_layout_and_inverse():
    images = torch.arange(2 * 3 * 14 * 28, dtype=torch.float32).reshape(2, 3, 14, 28)
    patches = patchify(images, P)
    assert patches.shape == (2, 2 * 4, P * P * 3)
    # patch (row 1, column 2) in raster order, values ordered (row, column, channel) as in MAE
    expected = images[1, :, P : 2 * P, 2 * P : 3 * P].permute(1, 2, 0).reshape(-1)
    torch.testing.assert_close(patches[1, 1 * 4 + 2], expected)
    torch.testing.assert_close(unpatchify(patches, P, (2, 4), channels=3), images)


def test_only_masked_patches_count():
    images, pred, mask = _inputs()
    loss = MAELoss(patch_size=P, norm_pix_loss=False)
    target = patchify(images, P)
    # a perfect prediction of the masked patches gives 0 whatever the visible ones hold
    perfect = torch.where(mask[..., None] > 0, target, pred)
    assert float(loss(perfect, images, mask)) == 0.0
    # the gradient reaches the masked patches only
    pred = pred.clone().requires_grad_(True)
    loss(pred, images, mask).backward()
    grad_norm = pred.grad.abs().sum(dim=-1)
    assert bool((grad_norm[mask == 0] == 0).all()) and bool((grad_norm[mask == 1] > 0).all())


def test_reductions_match_mae_formula():
    images, pred, mask = _inputs(seed=1)
    target = patchify(images, P)
    mean = target.mean(-1, keepdim=True)
    var = target.var(-1, keepdim=True)
    target = (target - mean) / (var + 1e-6) ** 0.5
    err = ((pred - target) ** 2).mean(-1)
    reference = (err * mask).sum() / mask.sum()
    torch.testing.assert_close(MAELoss(P)(pred, images, mask), reference)
    per_sample = MAELoss(P, reduction="none")(pred, images, mask)
    assert per_sample.shape == (2,)
    torch.testing.assert_close(per_sample, (err * mask).sum(1) / mask.sum(1))
    torch.testing.assert_close(MAELoss(P, reduction="sum")(pred, images, mask), per_sample.sum())


def test_norm_pix_targets_and_constant_patches():
    images = torch.randn(1, 3, 14, 14)
    images[:, :, :P, :P] = 1.0  # a constant patch, as inside a binary mask
    target = MAELoss(P).target(images)
    torch.testing.assert_close(target[0, 0], torch.zeros(P * P * 3))
    torch.testing.assert_close(target[0, 1:].mean(-1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(target[0, 1:].std(-1), torch.ones(3), atol=1e-3, rtol=0)
    torch.testing.assert_close(MAELoss(P, norm_pix_loss=False).target(images), patchify(images, P))


def test_half_precision_prediction_gives_float32():
    images, pred, mask = _inputs(seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = MAELoss(P)(pred.bfloat16(), images, mask)
    assert out.dtype == torch.float32 and torch.isfinite(out)


@parameterized.expand(
    [
        ({"patch_size": 0}, "patch_size"),
        ({"patch_size": 7.0}, "patch_size"),
        ({"eps": 0.0}, "eps"),
        ({"reduction": "max"}, "reduction"),
    ]
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MAELoss(**kwargs)


def test_invalid_inputs():
    images, pred, mask = _inputs()
    loss = MAELoss(P)
    with pytest.raises(ValueError, match="pred"):
        loss(pred[:, :-1], images, mask)
    with pytest.raises(ValueError, match="mask"):
        loss(pred, images, mask[:, :-1])
    no_masked = mask.clone()
    no_masked[0] = 0
    with pytest.raises(ValueError, match="masked patch"):
        loss(pred, images, no_masked)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        patchify(torch.zeros(1, 3, 15, 14), P)


def test_check_mask_reads_back_only_when_asked():
    """check_mask=True refuses a sample without masked patches; check_mask=False skips the check (no read-back)."""
    images = torch.randn(2, 3, 28, 28)
    pred = torch.randn(2, 4, 14 * 14 * 3)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="masked patch"):
        MAELoss(patch_size=14)(pred, images, mask)
    per_sample = MAELoss(patch_size=14, reduction="none", check_mask=False)(pred, images, mask)
    assert torch.isfinite(per_sample[0]) and not torch.isfinite(per_sample[1])
