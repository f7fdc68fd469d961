"""Tests for spectraflow_monai.losses.dispersive (SpectraFlow appendix eqs. 17-22)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spectraflow_monai.losses import DispersiveLoss
from spectraflow_monai.losses import dispersive as dispersive_module

# 3 points in 2-D with squared distances d01 = 1, d02 = 4, d12 = 5
H3 = [[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]


def _h(values, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


@pytest.mark.parametrize(
    "tau, eps, expected",
    [
        (0.5, 0.0, math.log((math.exp(-2) + math.exp(-8) + math.exp(-10)) / 3)),
        (1.0, 0.0, math.log((math.exp(-1) + math.exp(-4) + math.exp(-5)) / 3)),
        (0.5, 1e-2, math.log((math.exp(-2) + math.exp(-8) + math.exp(-10)) / 3 + 1e-2)),
    ],
)
def test_infonce_l2_paper_form(tau, eps, expected):
    loss = DispersiveLoss("infonce_l2", tau=tau, eps=eps, normalize=None)(_h(H3))
    assert loss.shape == ()
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_infonce_cosine():
    h = _h([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])  # cos: 0, 1/sqrt2, 1/sqrt2
    tau, eps = 0.5, 1e-8
    c = 1 - 1 / math.sqrt(2)
    expected = math.log((math.exp(-1 / tau) + 2 * math.exp(-c / tau)) / 3 + eps)
    for normalize in (None, "dim", "l2"):  # scale invariant
        loss = DispersiveLoss("infonce_cosine", tau=tau, eps=eps, normalize=normalize)(h)
        assert loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("margin, expected", [(2.0, 1.0 / 3.0), (4.5, 12.5 / 3.0), (0.5, 0.0)])
def test_hinge(margin, expected):
    loss = DispersiveLoss("hinge", margin=margin, normalize=None)(_h(H3))
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_covariance_hand_value():
    # centred H = [[-1/3, -2/3], [2/3, -2/3], [-1/3, 4/3]] -> C01 = -1/3 -> loss 2/9
    loss = DispersiveLoss("covariance", normalize=None)(_h(H3))
    assert loss.item() == pytest.approx(2.0 / 9.0, rel=1e-12)


def test_covariance_gram_path_matches_numpy(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 5)) + rng.normal(size=(1, 5)) * 3
    c = np.cov(x, rowvar=False)
    expected = float((c**2).sum() - (np.diag(c) ** 2).sum())
    direct = DispersiveLoss("covariance", normalize=None)(_h(x)).item()
    monkeypatch.setattr(dispersive_module, "_COV_DIRECT_MAX_DIM", 0)
    gram = DispersiveLoss("covariance", normalize=None)(_h(x)).item()
    assert direct == pytest.approx(expected, rel=1e-10)
    assert gram == pytest.approx(expected, rel=1e-10)
    dim_scaled = DispersiveLoss("covariance", normalize="dim")(_h(x)).item()
    assert dim_scaled == pytest.approx(expected / 25.0, rel=1e-10)


def test_normalize_modes():
    h = _h(H3)
    # "dim": squared distances / D (D = 2)
    loss_dim = DispersiveLoss("infonce_l2", tau=1.0, eps=0.0, normalize="dim")(h)
    assert loss_dim.item() == pytest.approx(math.log((math.exp(-0.5) + math.exp(-2) + math.exp(-2.5)) / 3), rel=1e-12)
    # "l2": unit vectors first (the zero vector stays zero)
    h2 = _h([[3.0, 0.0], [0.0, 0.5], [1.0, 1.0]])
    u = h2.numpy() / np.linalg.norm(h2.numpy(), axis=1, keepdims=True)
    d = ((u[:, None] - u[None]) ** 2).sum(-1)[~np.eye(3, dtype=bool)]
    expected = math.log(np.exp(-d / 0.5).mean())
    loss_l2 = DispersiveLoss("infonce_l2", tau=0.5, eps=0.0, normalize="l2")(h2)
    assert loss_l2.item() == pytest.approx(expected, rel=1e-12)
    assert DispersiveLoss("hinge", margin=1.0, normalize="l2")(h2 * 7).item() == pytest.approx(
        DispersiveLoss("hinge", margin=1.0, normalize="l2")(h2).item(), rel=1e-12
    )


def test_large_common_component_is_accurate():
    # ViT-like features: a large shared vector plus small deviations (cancellation in |a|^2 + |b|^2 - 2ab)
    rng = np.random.default_rng(1)
    dev = rng.normal(size=(5, 16)) * 0.05
    x = 1000.0 + dev
    d = ((dev[:, None] - dev[None]) ** 2).sum(-1)[~np.eye(5, dtype=bool)]
    expected = math.log(np.exp(-d / 0.5).mean())
    loss = DispersiveLoss("infonce_l2", tau=0.5, eps=0.0, normalize=None)(torch.tensor(x, dtype=torch.float32))
    assert loss.item() == pytest.approx(expected, rel=1e-4)


def test_flattening_and_dtypes():
    torch.manual_seed(0)
    h = torch.randn(4, 2, 3)
    loss = DispersiveLoss()
    assert torch.allclose(loss(h), loss(h.reshape(4, 6)))
    out = loss(h.half())
    assert out.dtype == torch.float32 and torch.isfinite(out)
    for reduction in ("mean", "sum", "none"):
        assert torch.allclose(DispersiveLoss(reduction=reduction)(h), loss(h))


def test_gradient_matches_eq22_with_sign():
    # eps = 0: dL/dh_i = -(4 / tau) * sum_j w_ij (h_i - h_j), w = softmax of -d/tau over off-diagonal pairs
    torch.manual_seed(0)
    tau = 0.7
    h = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    DispersiveLoss("infonce_l2", tau=tau, eps=0.0, normalize=None)(h).backward()
    x = h.detach()
    diff = x[:, None] - x[None]
    d = (diff**2).sum(-1)
    off = ~torch.eye(5, dtype=torch.bool)
    w = torch.zeros_like(d)
    w[off] = torch.softmax(-d[off] / tau, dim=0)
    expected = -(4.0 / tau) * (w[..., None] * diff).sum(1)
    assert torch.allclose(h.grad, expected, atol=1e-12)


@pytest.mark.parametrize("variant", ["infonce_l2", "infonce_cosine", "hinge"])
def test_gradient_step_disperses_tight_cluster(variant):
    torch.manual_seed(0)
    center = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    h = (center + 0.01 * torch.randn(6, 4, dtype=torch.float64)).requires_grad_(True)
    DispersiveLoss(variant, tau=0.5, margin=1.0, normalize=None)(h).backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0
    new = h.detach() - 1e-3 * h.grad / h.grad.norm()
    off = ~torch.eye(6, dtype=torch.bool)
    if variant == "infonce_cosine":
        before = torch.cosine_similarity(h.detach()[:, None], h.detach()[None], dim=-1)[off]
        after = torch.cosine_similarity(new[:, None], new[None], dim=-1)[off]
        assert after.mean() < before.mean()
    else:
        before = torch.cdist(h.detach(), h.detach())[off]
        after = torch.cdist(new, new)[off]
        assert (after > before).all()


def test_coincident_points_have_finite_gradient():
    h = torch.ones(4, 8, requires_grad=True)
    for variant in ("infonce_l2", "hinge", "covariance"):
        h.grad = None
        DispersiveLoss(variant)(h).backward()
        assert torch.isfinite(h.grad).all()


def test_raw_vit_features_underflow_without_normalisation():
    torch.manual_seed(0)
    dim = 384
    common = torch.randn(dim)
    common = 50.0 * common / common.norm()
    dev = torch.randn(8, dim)
    dev = 10.0 * dev / dev.norm(dim=1, keepdim=True)  # ||h_i - h_j||^2 ~ 200: exp(-400) underflows
    h = (common + dev).requires_grad_(True)

    raw = DispersiveLoss("infonce_l2", tau=0.5, eps=1e-8, normalize=None)(h)
    raw.backward()
    assert raw.item() == pytest.approx(math.log(1e-8), rel=1e-6)
    assert torch.count_nonzero(h.grad) == 0

    h.grad = None
    scaled = DispersiveLoss("infonce_l2", tau=0.5, eps=1e-8, normalize="dim")(h)
    scaled.backward()
    assert scaled.item() > math.log(1e-8) + 1
    assert torch.isfinite(h.grad).all() and h.grad.abs().max() > 1e-4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"variant": "l1"}, "variant.*'l1'"),
        ({"tau": 0.0}, "tau.*0.0"),
        ({"tau": -1.0}, "tau.*-1.0"),
        ({"eps": -1e-3}, "eps.*-0.001"),
        ({"margin": 0.0}, "margin.*0.0"),
        ({"normalize": "batch"}, "normalize.*'batch'"),
        ({"reduction": "max"}, "reduction.*'max'"),
    ],
)
def test_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DispersiveLoss(**kwargs)


def test_bad_inputs():
    loss = DispersiveLoss()
    with pytest.raises(ValueError, match="B=1"):
        loss(torch.randn(1, 8))
    with pytest.raises(ValueError, match="shape"):
        loss(torch.randn(8))
    with pytest.raises(ValueError, match="floating point"):
        loss(torch.ones(4, 8, dtype=torch.int64))


@pytest.mark.parametrize("variant", ["infonce_l2", "infonce_cosine", "hinge", "covariance"])
@pytest.mark.parametrize("dim", [16, 3000])  # 3000: the Gram-matrix path of the covariance variant
def test_float32_under_cpu_bf16_autocast(variant, dim):
    """Autocast is off inside: the matrix products run in float32, not bfloat16, within an autocast region."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(6, dim, generator=g) + 2.0
    loss = DispersiveLoss(variant=variant, tau=0.5, margin=4.0)
    reference = loss(h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss(h)
        out_bf = loss(h.bfloat16())
    assert out.dtype == torch.float32 and out_bf.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_bf, loss(h.bfloat16().float()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["infonce_l2", "hinge"])
def test_dim_normalisation_is_the_raw_loss_with_scaled_tau_or_margin(variant):
    """normalize='dim' divides squared distances by D: for infonce_l2 that is eq. 5 with tau * D (so lambda weighs
    another loss than eq. 5 with the same tau), for hinge the raw loss with margin * D, divided by D^2."""
    torch.manual_seed(0)
    h = torch.randn(6, 384) * 0.1
    d = h.shape[1]
    if variant == "infonce_l2":
        scaled = DispersiveLoss(variant, tau=0.5, normalize="dim")(h)
        assert torch.allclose(scaled, DispersiveLoss(variant, tau=0.5 * d, normalize=None)(h), atol=1e-5)
        assert not torch.allclose(scaled, DispersiveLoss(variant, tau=0.5, normalize=None)(h), atol=1e-3)
    else:
        scaled = DispersiveLoss(variant, margin=2.0, normalize="dim")(h)
        raw = DispersiveLoss(variant, margin=2.0 * d, normalize=None)(h) / d**2
        assert torch.allclose(scaled, raw, rtol=1e-4)
