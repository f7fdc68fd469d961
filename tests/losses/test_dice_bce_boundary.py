"""Tests for spectraflow_monai.losses.dice_bce_boundary (SpectraFlow Stage-2 loss, eq. 7)."""

from __future__ import annotations

import pytest
import torch
from monai.losses import BoundaryLoss, DiceCELoss

from spectraflow_monai.losses import DiceBCEBoundaryLoss


def _binary_case(batch: int = 2, size: int = 16):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, 1, size, size, generator=g)
    target = torch.zeros(batch, 1, size, size)
    target[0, 0, 4:10, 3:12] = 1
    target[1, 0, 8:15, 2:6] = 1
    return logits, target


def _multiclass_case(batch: int = 2, classes: int = 4, size: int = 16):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(batch, classes, size, size, generator=g)
    target = torch.zeros(batch, 1, size, size, dtype=torch.long)
    target[:, 0, 2:7, 2:9] = 1
    target[0, 0, 9:14, 5:12] = 2
    target[1, 0, 10:15, 10:15] = 3
    return logits, target


@pytest.mark.parametrize("beta", [0.01, 0.5])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_binary_equals_monai_components(beta, reduction):
    logits, target = _binary_case()
    loss = DiceBCEBoundaryLoss(beta=beta, reduction=reduction)(logits, target)
    dice_ce = DiceCELoss(sigmoid=True, reduction=reduction)(logits, target)
    bd = BoundaryLoss(sigmoid=True, reduction=reduction)(logits, target)
    assert bd.abs() > 1e-3  # the boundary term really contributes
    torch.testing.assert_close(loss, dice_ce + beta * bd)


@pytest.mark.parametrize("to_onehot_y", [False, True])
def test_multilabel_sigmoid_uses_bce_on_every_channel(to_onehot_y):
    # hand-computed: soft Dice per (b, c) on sigmoid probabilities + mean binary cross entropy over all elements
    logits, classes = _multiclass_case(classes=4)
    onehot = torch.nn.functional.one_hot(classes[:, 0].long(), 4).permute(0, 3, 1, 2).float()
    probs = torch.sigmoid(logits)
    inter = (probs * onehot).sum((2, 3))
    dice = 1 - (2 * inter + 1e-5) / (probs.sum((2, 3)) + onehot.sum((2, 3)) + 1e-5)
    bce = -(onehot * torch.log(probs) + (1 - onehot) * torch.log(1 - probs)).mean()
    target = classes if to_onehot_y else onehot
    loss = DiceBCEBoundaryLoss(beta=0.0, lambda_dice=0.7, lambda_ce=0.3, to_onehot_y=to_onehot_y)(logits, target)
    torch.testing.assert_close(loss, 0.7 * dice.mean() + 0.3 * bce)
    softmax_ce = torch.nn.functional.cross_entropy(logits, onehot)
    assert not torch.allclose(loss, 0.7 * dice.mean() + 0.3 * softmax_ce)


@pytest.mark.parametrize("include_background", [True, False])
def test_multiclass_equals_monai_components(include_background):
    logits, target = _multiclass_case()
    kw = {"softmax": True, "to_onehot_y": True, "include_background": include_background}
    loss = DiceBCEBoundaryLoss(sigmoid=False, beta=0.1, lambda_dice=0.5, lambda_ce=0.5, **kw)(logits, target)
    dice_ce = DiceCELoss(lambda_dice=0.5, lambda_ce=0.5, **kw)(logits, target)
    bd = BoundaryLoss(**kw)(logits, target)
    torch.testing.assert_close(loss, dice_ce + 0.1 * bd)
    # a one-hot target without to_onehot_y gives the same value
    onehot = torch.nn.functional.one_hot(target[:, 0], 4).permute(0, 3, 1, 2).float()
    loss_oh = DiceBCEBoundaryLoss(
        sigmoid=False, softmax=True, include_background=include_background, beta=0.1, lambda_dice=0.5, lambda_ce=0.5
    )(logits, onehot)
    torch.testing.assert_close(loss_oh, loss)


def test_beta_zero_is_dice_ce_only():
    logits, target = _binary_case()
    torch.testing.assert_close(DiceBCEBoundaryLoss(beta=0.0)(logits, target), DiceCELoss(sigmoid=True)(logits, target))


def test_ramp_schedule():
    loss = DiceBCEBoundaryLoss(beta=0.01, beta_max=0.11, ramp_epochs=10)
    assert loss.beta == pytest.approx(0.01)
    expected = {0: 0.01, 1: 0.02, 5: 0.06, 10: 0.11, 25: 0.11, -3: 0.01}
    for epoch, beta in expected.items():
        loss.set_epoch(epoch)
        assert loss.beta == pytest.approx(beta)
    # the value used by forward follows the schedule
    logits, target = _binary_case()
    loss.set_epoch(5)
    bd = BoundaryLoss(sigmoid=True)(logits, target)
    torch.testing.assert_close(loss(logits, target), DiceCELoss(sigmoid=True)(logits, target) + 0.06 * bd)
    # without beta_max, set_epoch keeps beta constant
    const = DiceBCEBoundaryLoss(beta=0.03)
    const.set_epoch(50)
    assert const.beta == pytest.approx(0.03)


def test_ramp_through_handler_on_ignite_engine():
    from ignite.engine import Engine

    from spectraflow_monai.handlers import BoundaryWeightRamp

    loss = DiceBCEBoundaryLoss(beta=0.0, beta_max=1.0, ramp_epochs=4)
    assert not hasattr(loss, "attach")  # the loss never attaches itself to a trainer: the handler ramps beta
    seen = []
    engine = Engine(lambda e, b: seen.append(loss.beta))
    BoundaryWeightRamp(loss).attach(engine)
    engine.run([0], max_epochs=6)
    assert seen == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])


@pytest.mark.parametrize("case", ["binary", "multiclass"])
def test_gradient_finite(case):
    if case == "binary":
        logits, target = _binary_case()
        loss_fn = DiceBCEBoundaryLoss(beta=0.1)
    else:
        logits, target = _multiclass_case()
        loss_fn = DiceBCEBoundaryLoss(sigmoid=False, softmax=True, to_onehot_y=True, beta=0.1)
    logits.requires_grad_(True)
    loss_fn(logits, target).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sigmoid": True, "softmax": True}, "sigmoid.*softmax"),
        ({"sigmoid": False, "softmax": False}, "sigmoid=False, softmax=False"),
        ({"lambda_dice": -1.0}, "lambda_dice.*-1.0"),
        ({"lambda_ce": -0.5}, "lambda_ce.*-0.5"),
        ({"beta": -0.1}, "beta.*-0.1"),
        ({"beta": 0.1, "beta_max": 0.05, "ramp_epochs": 3}, "beta_max.*0.05"),
        ({"beta_max": 0.1, "ramp_epochs": -1}, "ramp_epochs.*-1"),
        ({"beta_max": 0.1, "ramp_epochs": 0}, "ramp_epochs"),
        ({"reduction": "none"}, "reduction.*'none'"),
    ],
)
def test_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiceBCEBoundaryLoss(**kwargs)


def test_bad_shapes():
    loss = DiceBCEBoundaryLoss()
    with pytest.raises(ValueError, match=r"input shape \(2, 1, 16, 16\) and target shape \(2, 1, 8, 8\)"):
        loss(torch.randn(2, 1, 16, 16), torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"target shape \(2, 16, 16\)"):
        loss(torch.randn(2, 1, 16, 16), torch.zeros(2, 16, 16))
    with pytest.raises(ValueError, match=r"got shape \(2, 16\)"):
        loss(torch.randn(2, 16), torch.zeros(2, 16))
    with pytest.raises(ValueError, match="2 channel.*input has 3"):
        DiceBCEBoundaryLoss(sigmoid=False, softmax=True)(torch.randn(2, 3, 8, 8), torch.zeros(2, 2, 8, 8))
    with pytest.raises(ValueError, match="to_onehot_y=True for a class-index target"):
        DiceBCEBoundaryLoss(sigmoid=False, softmax=True)(torch.randn(2, 3, 8, 8), torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match="to_onehot_y=True expects a class-index target"):
        DiceBCEBoundaryLoss(sigmoid=False, softmax=True, to_onehot_y=True)(
            torch.randn(2, 3, 8, 8), torch.zeros(2, 3, 8, 8)
        )


@pytest.mark.parametrize("multiclass", [False, True])
def test_half_precision_logits_computed_in_float32(multiclass):
    """bfloat16 logits (a network under autocast) give the float32 loss of the same values, also under autocast."""
    if multiclass:
        loss = DiceBCEBoundaryLoss(sigmoid=False, softmax=True, to_onehot_y=True, beta=0.5)
        logits, target = _multiclass_case(size=24)
    else:
        loss = DiceBCEBoundaryLoss(beta=0.5)
        logits, target = _binary_case(size=24)
    logits = (logits * 3).bfloat16()
    reference = loss(logits.float(), target)
    out = loss(logits, target)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_ac = loss(logits, target)
    assert out_ac.dtype == torch.float32
    torch.testing.assert_close(out_ac, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "scipy", "auto"])
@pytest.mark.parametrize("case", ["binary", "multiclass", "binary3d"])
def test_distance_backends_give_todays_loss(backend, case):
    """Every distance backend gives the loss of MONAI's BoundaryLoss (scipy maps) within rtol 1e-6 / atol 1e-6."""
    if case == "binary":
        logits, target = _binary_case()
        kw = {"beta": 0.1}
        ref_bd = BoundaryLoss(sigmoid=True)(logits, target)
    elif case == "binary3d":
        g = torch.Generator().manual_seed(3)
        logits = torch.randn(2, 1, 8, 9, 10, generator=g)
        target = torch.zeros(2, 1, 8, 9, 10)
        target[0, 0, 2:6, 3:7, 1:8] = 1
        kw = {"beta": 0.1}
        ref_bd = BoundaryLoss(sigmoid=True)(logits, target)
    else:
        logits, target = _multiclass_case()
        kw = {"sigmoid": False, "softmax": True, "to_onehot_y": True, "include_background": False, "beta": 0.1}
        ref_bd = BoundaryLoss(softmax=True, to_onehot_y=True, include_background=False)(logits, target)
    loss = DiceBCEBoundaryLoss(distance_backend=backend, **kw)
    value = loss(logits, target)
    torch.testing.assert_close(loss.last_terms["boundary"], ref_bd, rtol=1e-6, atol=1e-6)
    reference = DiceBCEBoundaryLoss(distance_backend="scipy", **kw)(logits, target)
    torch.testing.assert_close(value, reference, rtol=1e-6, atol=1e-6)


def test_distance_backend_auto_resolution_and_errors():
    from spectraflow_monai.losses import SignedDistanceBoundaryLoss, cucim_available

    bd = SignedDistanceBoundaryLoss(sigmoid=True)
    assert bd.backend_for(torch.zeros(1, 1, 4, 4)) == "scipy"
    assert bd.backend_for(torch.zeros(1, 1, 4, 4, device="meta")) == "torch"
    with pytest.raises(ValueError, match="distance_backend"):
        DiceBCEBoundaryLoss(distance_backend="numpy")
    with pytest.raises(ValueError, match="max_elements"):
        SignedDistanceBoundaryLoss(max_elements=0)
    if not cucim_available():
        with pytest.raises(ValueError, match="cuCIM"):
            DiceBCEBoundaryLoss(distance_backend="cucim")


def test_torch_distance_backend_takes_metatensors():
    """MONAI's collated batches are MetaTensors: the torch distance maps take them (and give the same loss)."""
    from monai.data import MetaTensor

    logits, target = _binary_case()
    meta = MetaTensor(target)
    want = DiceBCEBoundaryLoss(beta=0.1, distance_backend="scipy")(logits, target)
    got = DiceBCEBoundaryLoss(beta=0.1, distance_backend="torch")(MetaTensor(logits), meta)
    torch.testing.assert_close(torch.as_tensor(got), want, rtol=1e-6, atol=1e-6)
