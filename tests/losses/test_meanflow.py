"""Tests for spectraflow_monai.losses.meanflow."""

from __future__ import annotations

import math
import unittest

import torch
from parameterized import parameterized

from spectraflow_monai.losses import MeanFlowLoss, meanflow_target
from spectraflow_monai.networks.nets import MeanFlowHead

SMALL = {"hidden_channels": 16, "num_blocks": 1, "num_heads": 2, "time_embed_dim": 16}


def _bview(x: torch.Tensor, ndim: int) -> torch.Tensor:
    return x.reshape(-1, *([1] * (ndim - 1)))


class LinearHead(torch.nn.Module):
    """u = A·z (over channels) + b·t + c·s, whose MeanFlow target is v - (t - s)·(A·v + b)."""

    def __init__(self, channels: int, dtype=torch.float64, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(channels, channels, generator=g, dtype=dtype))
        self.b = torch.nn.Parameter(torch.randn(channels, generator=g, dtype=dtype))
        self.c = torch.nn.Parameter(torch.randn(channels, generator=g, dtype=dtype))

    def apply_a(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ij,bj...->bi...", self.a, x)

    def forward(self, z, t, s):
        shape = (1, -1) + (1,) * (z.ndim - 2)
        return self.apply_a(z) + self.b.view(shape) * _bview(t, z.ndim) + self.c.view(shape) * _bview(s, z.ndim)


class TanhHead(torch.nn.Module):
    """A per-pixel tanh MLP over channels with t and s inputs (nonlinear in z, t and s)."""

    def __init__(self, channels: int, hidden: int = 12, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.nn.Parameter(torch.randn(hidden, channels, generator=g, dtype=torch.float64) * 0.7)
        self.wt = torch.nn.Parameter(torch.randn(hidden, generator=g, dtype=torch.float64))
        self.ws = torch.nn.Parameter(torch.randn(hidden, generator=g, dtype=torch.float64))
        self.w2 = torch.nn.Parameter(torch.randn(channels, hidden, generator=g, dtype=torch.float64) * 0.7)

    def forward(self, z, t, s):
        h = torch.einsum("kc,bcxy->bkxy", self.w1, z)
        tt, ss = _bview(t, 4), _bview(s, 4)
        h = torch.tanh(h + self.wt.view(1, -1, 1, 1) * tt + self.ws.view(1, -1, 1, 1) * ss * tt)
        return torch.einsum("ck,bkxy->bcxy", self.w2, h) * (1 + ss**2)


def _perturbed_head(channels: int = 8, seed: int = 0, **kwargs) -> MeanFlowHead:
    torch.manual_seed(seed)
    head = MeanFlowHead(channels, **{"num_domains": 2, **SMALL, **kwargs})  # the domain-conditioned extension
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return head


def _inputs(shape=(4, 8, 4, 4), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g, dtype=dtype)
    v = torch.randn(shape, generator=g, dtype=dtype)
    t = torch.tensor([0.9, 0.6, 0.3, 0.5], dtype=dtype)[: shape[0]]
    s = torch.tensor([0.1, 0.6, 0.2, 0.0], dtype=dtype)[: shape[0]]
    return z, v, t, s


class TestMeanFlowTarget(unittest.TestCase):
    @parameterized.expand([[(4, 8, 4, 4), torch.float64], [(3, 5, 2, 3), torch.float32], [(4, 6), torch.float64]])
    def test_closed_form_linear_head(self, shape, dtype):
        head = LinearHead(shape[1], dtype=dtype)
        z, v, t, s = _inputs(shape, dtype)
        target = meanflow_target(head, z, t, s, v)
        shape_c = (1, -1) + (1,) * (len(shape) - 2)
        expected = v - _bview(t - s, len(shape)) * (head.apply_a(v) + head.b.view(shape_c))
        self.assertEqual(target.dtype, dtype)
        torch.testing.assert_close(target, expected.detach())
        # rows with s == t get the plain velocity v
        torch.testing.assert_close(target[1], v[1])

    def test_finite_differences_tanh_head(self):
        head = TanhHead(8)
        z, v, t, s = _inputs()
        target = meanflow_target(head, z, t, s, v)
        d = 1e-6
        with torch.no_grad():
            dudt = (head(z + d * v, t + d, s) - head(z - d * v, t - d, s)) / (2 * d)
        expected = v - _bview(t - s, 4) * dudt
        torch.testing.assert_close(target, expected, rtol=1e-7, atol=1e-8)
        self.assertGreater(float((target - v).abs().max()), 1e-2)  # the correction is not negligible

    def test_meanflow_head_math_backend_and_autocast(self):
        head = _perturbed_head(use_attention=True)
        z, v, t, s = _inputs(dtype=torch.float32)
        dom = torch.tensor([0, 1, 1, 0])

        def u_fn(a, b, c):
            return head(a, b, c, domain=dom)

        target = meanflow_target(u_fn, z, t, s, v)
        self.assertEqual(target.dtype, torch.float32)
        # finite differences in float64 on a copy of the head
        head64 = _perturbed_head(use_attention=True).double()
        z64, v64, t64, s64 = (x.double() for x in (z, v, t, s))
        d = 1e-6
        with torch.no_grad():
            fd = (head64(z64 + d * v64, t64 + d, s64, domain=dom) - head64(z64 - d * v64, t64 - d, s64, domain=dom)) / (
                2 * d
            )
        torch.testing.assert_close(target.double(), v64 - _bview(t64 - s64, 4) * fd, rtol=1e-4, atol=1e-4)
        # autocast is disabled inside the JVP: bfloat16 inputs and an active autocast give the float32 result
        with torch.autocast("cpu", dtype=torch.bfloat16):
            target_ac = meanflow_target(u_fn, z, t, s, v)
            target_bf = meanflow_target(u_fn, z.bfloat16(), t, s, v.bfloat16())
        self.assertEqual(target_ac.dtype, torch.float32)
        torch.testing.assert_close(target_ac, target)
        self.assertEqual(target_bf.dtype, torch.float32)
        torch.testing.assert_close(target_bf, target, rtol=0.05, atol=0.05)

    def test_bad_inputs(self):
        head = LinearHead(8)
        z, v, t, s = _inputs()
        with self.assertRaisesRegex(ValueError, r"v must have the shape of z_t \(4, 8, 4, 4\), got \(4, 8, 4\)"):
            meanflow_target(head, z, t, s, v[..., 0])
        with self.assertRaisesRegex(ValueError, r"t and s must have shape \(4,\)"):
            meanflow_target(head, z, t.view(4, 1), s, v)


class TestMeanFlowLoss(unittest.TestCase):
    def test_gradients_reach_head_and_z0_not_target(self):
        head = _perturbed_head()
        g = torch.Generator().manual_seed(3)
        z0 = torch.randn(4, 8, 4, 4, generator=g).requires_grad_(True)
        noise = torch.randn(4, 8, 4, 4, generator=g)
        t, s = torch.tensor([0.9, 0.6, 0.3, 0.5]), torch.tensor([0.1, 0.6, 0.2, 0.0])
        dom = torch.tensor([0, 1, 0, 1])
        loss_fn = MeanFlowLoss(adaptive_p=0.0, reduction="sum")
        loss = loss_fn(head, z0, noise=noise, t=t, s=s, domain=dom)
        self.assertTrue(loss.requires_grad)
        loss.backward()
        self.assertGreater(float(z0.grad.abs().sum()), 0.0)
        for name in ("out_proj.weight", "in_proj.weight", "t_embedder.mlp.0.weight", "domain_embed.weight"):
            self.assertGreater(float(dict(head.named_parameters())[name].grad.abs().sum()), 0.0, name)

        # the gradient equals that of ||u(z_t) - sg(target)||², i.e. the target carries no gradient
        z0b = z0.detach().clone().requires_grad_(True)
        tb = t.view(-1, 1, 1, 1)
        z_t = (1 - tb) * z0b + tb * noise
        target = meanflow_target(lambda a, b, c: head(a, b, c, domain=dom), z_t, t, s, noise - z0b)
        self.assertFalse(target.requires_grad)
        manual = (head(z_t, t, s, domain=dom) - target).pow(2).sum()
        torch.testing.assert_close(loss.detach(), manual.detach())
        (grad_manual,) = torch.autograd.grad(manual, z0b)
        torch.testing.assert_close(z0.grad, grad_manual)

    def test_half_precision_latent_path_in_float32(self):
        """A bfloat16 latent (an encoder under autocast) gives the float32 noise, path, target and loss of the same
        values; under CPU bfloat16 autocast only the head's own arithmetic changes."""
        head = _perturbed_head()
        g = torch.Generator().manual_seed(6)
        z0 = torch.randn(4, 8, 4, 4, generator=g).bfloat16()
        t, s = torch.tensor([0.9, 0.6, 0.3, 0.5]), torch.tensor([0.1, 0.6, 0.2, 0.0])
        dom = torch.tensor([0, 1, 0, 1])
        loss_fn = MeanFlowLoss(reduction="none")
        torch.manual_seed(7)
        reference = loss_fn.compute(head, z0.float(), t=t, s=s, domain=dom)
        torch.manual_seed(7)  # the same noise draw
        out = loss_fn.compute(head, z0, t=t, s=s, domain=dom)
        self.assertEqual(out["loss"].dtype, torch.float32)
        torch.testing.assert_close(out["loss"], reference["loss"], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out["mse"], reference["mse"], rtol=1e-6, atol=1e-6)
        z_grad = z0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.manual_seed(7)
            out_ac = loss_fn.compute(head, z_grad, t=t, s=s, domain=dom)
        self.assertEqual(out_ac["loss"].dtype, torch.float32)
        self.assertTrue(torch.isfinite(out_ac["loss"]).all())
        torch.testing.assert_close(out_ac["loss"], reference["loss"], rtol=0.1, atol=0.1)
        out_ac["loss"].sum().backward()
        self.assertEqual(z_grad.grad.dtype, torch.bfloat16)
        self.assertGreater(float(z_grad.grad.abs().sum()), 0.0)

    @parameterized.expand([[1.0, 1e-2], [0.5, 1e-3], [0.0, 1e-2], [0.75, 1.0]])
    def test_adaptive_weight(self, p, c):
        head = _perturbed_head()
        g = torch.Generator().manual_seed(4)
        z0 = torch.randn(4, 8, 4, 4, generator=g)
        noise = torch.randn(4, 8, 4, 4, generator=g)
        t, s = torch.tensor([0.9, 0.6, 0.3, 0.5]), torch.tensor([0.1, 0.6, 0.2, 0.0])
        raw_fn = MeanFlowLoss(adaptive_p=0.0, reduction="none")
        weighted_fn = MeanFlowLoss(adaptive_p=p, adaptive_c=c, reduction="none")

        z_a = z0.clone().requires_grad_(True)
        raw = raw_fn(head, z_a, noise=noise, t=t, s=s)
        z_b = z0.clone().requires_grad_(True)
        weighted = weighted_fn(head, z_b, noise=noise, t=t, s=s)
        self.assertEqual(tuple(weighted.shape), (4,))
        scale = (raw.detach() + c) ** p
        torch.testing.assert_close(weighted, raw.detach() / scale)
        (g_raw,) = torch.autograd.grad(raw[2], z_a)
        (g_w,) = torch.autograd.grad(weighted[2], z_b)
        torch.testing.assert_close(g_w, g_raw / scale[2])
        if p > 0:
            self.assertFalse(torch.allclose(g_w, g_raw))

    def test_reductions_and_compute(self):
        head = _perturbed_head()
        g = torch.Generator().manual_seed(5)
        z0 = torch.randn(4, 8, 4, 4, generator=g)
        noise = torch.randn(4, 8, 4, 4, generator=g)
        t, s = torch.tensor([0.9, 0.6, 0.3, 0.5]), torch.tensor([0.1, 0.6, 0.2, 0.0])
        per = MeanFlowLoss(reduction="none")(head, z0, noise=noise, t=t, s=s)
        torch.testing.assert_close(MeanFlowLoss(reduction="mean")(head, z0, noise=noise, t=t, s=s), per.mean())
        torch.testing.assert_close(MeanFlowLoss(reduction="sum")(head, z0, noise=noise, t=t, s=s), per.sum())
        out = MeanFlowLoss(adaptive_p=0.0, reduction="sum").compute(head, z0, noise=noise, t=t, s=s)
        self.assertEqual(set(out), {"loss", "mse"})
        self.assertFalse(out["mse"].requires_grad)
        torch.testing.assert_close(out["mse"], out["loss"].detach() / z0.numel())
        # p = 1: each weighted term is L / (L + c) < 1
        self.assertTrue(bool((per < 1).all()) and bool((per > 0.9).all()))

    def test_zero_head_gives_velocity_error(self):
        """A head that outputs zeros has target v (its JVP is 0), so L_i = ||v_i||² = ||ε - z0||²."""
        z0 = torch.randn(3, 5)
        noise = torch.randn(3, 5)
        out = MeanFlowLoss(adaptive_p=0.0, reduction="none")(lambda z, t, s: 0 * z, z0, noise=noise)
        torch.testing.assert_close(out, (noise - z0).pow(2).sum(1))

    def test_sampled_noise_and_times(self):
        head = _perturbed_head()
        z0 = torch.randn(4, 8, 4, 4, requires_grad=True)
        loss = MeanFlowLoss()(head, z0, domain=torch.tensor([0, 1, 0, 1]))
        self.assertEqual(loss.ndim, 0)
        self.assertTrue(torch.isfinite(loss))
        loss.backward()
        self.assertTrue(torch.isfinite(z0.grad).all())

    @parameterized.expand(
        [
            [{"time_std": 0.0}, "time_std"],
            [{"ratio_unequal": 1.5}, "ratio_unequal"],
            [{"ratio_unequal": -0.1}, "ratio_unequal"],
            [{"adaptive_p": -1.0}, "adaptive_p"],
            [{"adaptive_c": 0.0}, "adaptive_c"],
            [{"time_mean": float("nan")}, "time_mean"],
            [{"reduction": "max"}, "max"],
        ]
    )
    def test_bad_args(self, kwargs, name):
        with self.assertRaisesRegex(ValueError, name):
            MeanFlowLoss(**kwargs)

    def test_bad_inputs(self):
        head = LinearHead(8, dtype=torch.float32)
        loss_fn = MeanFlowLoss()
        z0 = torch.randn(4, 8, 4, 4)
        with self.assertRaisesRegex(ValueError, r"z0 must have shape \(B, ...\) with at least 2 dims, got \(4,\)"):
            loss_fn(head, torch.randn(4))
        with self.assertRaisesRegex(ValueError, r"noise must have the shape of z0 \(4, 8, 4, 4\), got \(4, 8, 4, 3\)"):
            loss_fn(head, z0, noise=torch.randn(4, 8, 4, 3))
        with self.assertRaisesRegex(ValueError, "given together"):
            loss_fn(head, z0, t=torch.rand(4))
        with self.assertRaisesRegex(ValueError, r"t and s must have shape \(4,\)"):
            loss_fn(head, z0, t=torch.rand(3), s=torch.zeros(3))
        with self.assertRaisesRegex(ValueError, "t must be >= s"):
            loss_fn(head, z0, t=torch.zeros(4), s=torch.full((4,), 0.5))
        with self.assertRaisesRegex(ValueError, "head output"):
            loss_fn(lambda z, t, s: z[:, :2], z0)


class TestTimeSampling(unittest.TestCase):
    @parameterized.expand([[0.25, 8, 2], [0.5, 8, 4], [1.0, 6, 6], [0.0, 8, 0], [0.75, 4, 3]])
    def test_exact_fraction(self, ratio, batch, n_unequal):
        loss_fn = MeanFlowLoss(ratio_unequal=ratio)
        g = torch.Generator().manual_seed(0)
        rows_unequal = torch.zeros(batch)
        for _ in range(20):
            t, s = loss_fn.sample_times(batch, device="cpu", generator=g)
            self.assertEqual(t.shape, (batch,))
            self.assertEqual(s.shape, (batch,))
            self.assertTrue(bool((t >= s).all()))
            self.assertTrue(bool(((s > 0) & (t < 1)).all()))
            self.assertEqual(int((t != s).sum()), n_unequal)
            rows_unequal += (t != s).float()
        if 0 < n_unequal < batch:  # a random subset of rows, not always the same ones
            self.assertGreater(int((rows_unequal > 0).sum()), n_unequal)

    def test_stochastic_rounding(self):
        loss_fn = MeanFlowLoss(ratio_unequal=0.25)
        g = torch.Generator().manual_seed(1)
        counts = [int((torch.ne(*loss_fn.sample_times(3, generator=g))).sum()) for _ in range(400)]
        self.assertTrue(set(counts) <= {0, 1})
        self.assertAlmostEqual(sum(counts) / len(counts), 0.75, delta=0.1)

    def test_distribution_and_reproducibility(self):
        loss_fn = MeanFlowLoss(time_mean=0.5, time_std=1e-4, ratio_unequal=1.0)
        t, s = loss_fn.sample_times(16, dtype=torch.float64)
        self.assertEqual(t.dtype, torch.float64)
        expected = 1 / (1 + math.exp(-0.5))
        torch.testing.assert_close(t, torch.full_like(t, expected), rtol=0, atol=1e-3)
        torch.testing.assert_close(s, torch.full_like(s, expected), rtol=0, atol=1e-3)
        a = MeanFlowLoss().sample_times(8, generator=torch.Generator().manual_seed(7))
        b = MeanFlowLoss().sample_times(8, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(a, b)
        with self.assertRaisesRegex(ValueError, "batch_size"):
            loss_fn.sample_times(0)


class TestMeanFlowTraining(unittest.TestCase):
    def test_loss_decreases(self):
        torch.manual_seed(0)
        # a tiny fixed "dataset" of latents (two structured patterns plus jitter) with fixed noise and times, so
        # the self-distilled regression has a reachable optimum and the MSE must fall clearly
        base = torch.randn(2, 4, 4, 4)
        data = torch.cat([base[i % 2 : i % 2 + 1] + 0.05 * torch.randn(1, 4, 4, 4) for i in range(8)])
        noise = torch.randn_like(data)
        loss_fn = MeanFlowLoss()
        t, s = loss_fn.sample_times(8)
        self.assertEqual(int((t != s).sum()), 2)
        head = MeanFlowHead(4, hidden_channels=16, num_blocks=1, num_heads=2, time_embed_dim=16, num_domains=0)
        opt = torch.optim.Adam(head.parameters(), lr=3e-3)
        mses = []
        for _ in range(60):
            out = loss_fn.compute(head, data, noise=noise, t=t, s=s)
            opt.zero_grad()
            out["loss"].backward()
            opt.step()
            mses.append(float(out["mse"]))
        first, last = sum(mses[:10]) / 10, sum(mses[-10:]) / 10
        self.assertLess(last, 0.6 * first, (first, last))

if __name__ == "__main__":
    unittest.main()
