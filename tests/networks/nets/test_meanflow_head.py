"""Tests for spectraflow_monai.networks.nets.meanflow_head."""

from __future__ import annotations

import unittest

import torch
from parameterized import parameterized

from spectraflow_monai.losses.meanflow import math_sdpa
from spectraflow_monai.networks.nets import MeanFlowHead
from spectraflow_monai.networks.nets.meanflow_head import timestep_embedding

SMALL = {"hidden_channels": 16, "num_blocks": 2, "num_heads": 2, "time_embed_dim": 16}


def _perturbed(head: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Move the head off its adaLN-zero initialisation so that every input matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return head


SHAPE_CASES = [
    [True, 2, (2, 8, 4, 4)],
    [False, 2, (3, 8, 4, 6)],
    [True, 0, (1, 8, 3, 5)],
    [False, 0, (2, 8, 2, 2)],
]

BAD_ARGS = [
    [{"in_channels": 0}, "in_channels"],
    [{"hidden_channels": 18}, "hidden_channels"],
    [{"num_blocks": 0}, "num_blocks"],
    [{"num_heads": 0}, "num_heads"],
    [{"hidden_channels": 16, "num_heads": 3}, "num_heads=3"],
    [{"num_domains": -1}, "num_domains"],
    [{"time_embed_dim": 7}, "time_embed_dim"],
    [{"mlp_ratio": 0.0}, "mlp_ratio"],
]


class TestMeanFlowHead(unittest.TestCase):
    @parameterized.expand(SHAPE_CASES)
    def test_shape_and_zero_init(self, use_attention, num_domains, shape):
        head = MeanFlowHead(8, use_attention=use_attention, num_domains=num_domains, **SMALL)
        z = torch.randn(shape)
        b = shape[0]
        out = head(z, torch.rand(b), torch.zeros(b))
        self.assertEqual(out.shape, z.shape)
        # adaLN-zero: the output projection starts at zero
        self.assertEqual(float(out.abs().max()), 0.0)
        out = _perturbed(head)(z, torch.rand(b), torch.zeros(b))
        self.assertEqual(out.shape, z.shape)
        self.assertTrue(torch.isfinite(out).all())
        self.assertGreater(float(out.abs().mean()), 0.0)

    @parameterized.expand([[True], [False]])
    def test_conditioning_changes_output(self, use_attention):
        torch.manual_seed(0)
        head = _perturbed(MeanFlowHead(8, use_attention=use_attention, num_domains=2, **SMALL)).eval()
        z = torch.randn(2, 8, 4, 4)
        t, s = torch.tensor([0.7, 0.4]), torch.tensor([0.2, 0.4])
        out_img = head(z, t, s, domain=torch.tensor([0, 0]))
        out_mask = head(z, t, s, domain=torch.tensor([1, 1]))
        self.assertGreater(float((out_img - out_mask).abs().max()), 1e-4)
        # None means image; a scalar domain broadcasts
        torch.testing.assert_close(head(z, t, s), out_img)
        torch.testing.assert_close(head(z, t, s, domain=1), out_mask)
        # per-row domain: row 0 image, row 1 mask
        mixed = head(z, t, s, domain=torch.tensor([0, 1]))
        torch.testing.assert_close(mixed[0], out_img[0])
        torch.testing.assert_close(mixed[1], out_mask[1])
        # the time and the interval t - s both matter
        self.assertGreater(float((head(z, t + 0.1, s + 0.1) - out_img).abs().max()), 1e-4)
        self.assertGreater(float((head(z, t, s - 0.1) - out_img).abs().max()), 1e-4)
        # scalar and (B, 1, 1, 1) times are accepted
        torch.testing.assert_close(head(z, t.view(2, 1, 1, 1), s.view(2, 1, 1, 1)), out_img)
        torch.testing.assert_close(head(z, 0.5, 0.5)[0], head(z[:1], torch.tensor([0.5]), torch.tensor([0.5]))[0])

    def test_attention_mixes_tokens(self):
        head = _perturbed(MeanFlowHead(8, num_domains=2, **SMALL))
        z = torch.randn(1, 8, 4, 4)
        z2 = z.clone()
        z2[..., 3, 3] += 1.0  # change one token only
        t, s = torch.tensor([0.5]), torch.tensor([0.1])
        diff = (head(z, t, s) - head(z2, t, s))[..., 0, 0]
        self.assertGreater(float(diff.abs().max()), 1e-5)

    @parameterized.expand(BAD_ARGS)
    def test_bad_args(self, kwargs, name):
        args = {"in_channels": 8, **SMALL, **kwargs}
        with self.assertRaisesRegex(ValueError, name):
            MeanFlowHead(**args)

    def test_domain_embedding_is_off_by_default(self):
        # the paper's head (eqs. 1-3) conditions on t and s only; the domain embedding is an extension
        head = MeanFlowHead(8, **SMALL)
        self.assertEqual(head.num_domains, 0)
        self.assertIsNone(head.domain_embed)
        self.assertIsNotNone(MeanFlowHead(8, num_domains=2, **SMALL).domain_embed)

    def test_bad_inputs(self):
        head = MeanFlowHead(8, num_domains=2, **SMALL)
        z = torch.randn(2, 8, 4, 4)
        t = torch.rand(2)
        with self.assertRaisesRegex(ValueError, r"domain values must be in \[0, 2\)"):
            head(z, t, t, domain=torch.tensor([0, 2]))
        with self.assertRaisesRegex(ValueError, r"got values in \[-1, 0\]"):
            head(z, t, t, domain=torch.tensor([-1, 0]))
        with self.assertRaisesRegex(ValueError, "integers"):
            head(z, t, t, domain=torch.tensor([0.0, 1.0]))
        with self.assertRaisesRegex(ValueError, "2 entries"):
            head(z, t, t, domain=torch.tensor([0, 1, 1]))
        with self.assertRaisesRegex(ValueError, r"z must have shape \(B, 8, h, w\)"):
            head(torch.randn(2, 7, 4, 4), t, t)
        with self.assertRaisesRegex(ValueError, r"z must have shape"):
            head(torch.randn(2, 8, 4), t, t)
        with self.assertRaisesRegex(ValueError, r"t must be a scalar or have shape \(2,\)"):
            head(z, torch.rand(3), t)
        with self.assertRaisesRegex(ValueError, "num_domains=0"):
            MeanFlowHead(8, num_domains=0, **SMALL)(z, t, t, domain=torch.tensor([0, 1]))

    @parameterized.expand([[True], [False]])
    def test_no_batchnorm_or_dropout(self, use_attention):
        head = MeanFlowHead(384, use_attention=use_attention)
        banned = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.dropout._DropoutNd)
        self.assertFalse(any(isinstance(m, banned) for m in head.modules()))
        self.assertEqual(len(list(head.buffers())), 0)

    @parameterized.expand([[True], [False]])
    def test_jvp_matches_finite_differences(self, use_attention):
        head = _perturbed(MeanFlowHead(8, use_attention=use_attention, num_domains=2, **SMALL)).double()
        g = torch.Generator().manual_seed(1)
        z = torch.randn(2, 8, 3, 3, generator=g, dtype=torch.float64)
        v = torch.randn(2, 8, 3, 3, generator=g, dtype=torch.float64)
        t = torch.tensor([0.8, 0.5], dtype=torch.float64)
        s = torch.tensor([0.3, 0.5], dtype=torch.float64)
        dom = torch.tensor([0, 1])

        def fn(a, b, c):
            return head(a, b, c, domain=dom)

        with torch.no_grad(), math_sdpa():
            out, tangent = torch.func.jvp(fn, (z, t, s), (v, torch.ones_like(t), torch.zeros_like(s)))
            d = 1e-6
            fd = (fn(z + d * v, t + d, s) - fn(z - d * v, t - d, s)) / (2 * d)
        torch.testing.assert_close(out, fn(z, t, s))
        torch.testing.assert_close(tangent, fd, rtol=1e-6, atol=1e-7)
        self.assertGreater(float(tangent.abs().max()), 1e-3)

    def test_timestep_embedding(self):
        t = torch.tensor([0.0, 0.5, 1.0])
        emb = timestep_embedding(t, 6)
        freqs = torch.tensor([1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3)])
        expected = torch.cat([torch.cos(t[:, None] * freqs), torch.sin(t[:, None] * freqs)], dim=1)
        torch.testing.assert_close(emb, expected)


if __name__ == "__main__":
    unittest.main()
