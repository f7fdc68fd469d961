import pytest
import torch
import torch.nn as nn
from parameterized import parameterized

from spectraflow_monai.networks.blocks import DirectAttentionalFusion

CASES = [[8, 4, (2, 8, 5, 7)], [16, 2, (1, 16, 4, 4)], [3, 4, (3, 3, 6, 6)]]


class TestDirectAttentionalFusion:
    @parameterized.expand(CASES)
    def test_shapes(self, channels, reduction, shape):
        daf = DirectAttentionalFusion(channels, reduction=reduction, norm=None).eval()
        fused, gate = daf(torch.randn(shape), torch.randn(shape), return_gate=True)
        assert fused.shape == shape and gate.shape == shape
        assert float(gate.detach().min()) >= 0.0 and float(gate.detach().max()) <= 1.0

    def test_matches_equation_on_hand_made_tensors(self):
        # Replace both branches by known maps so M is known: local = f_sum, global = mean(f_sum) per channel.
        daf = DirectAttentionalFusion(2, reduction=1, norm=None)
        daf.local_branch = nn.Identity()
        daf.global_branch = nn.AdaptiveAvgPool2d(1)
        f_dec = torch.tensor([[[[1.0, -1.0], [0.0, 2.0]], [[0.5, 0.5], [0.5, 0.5]]]])
        f_skip = torch.tensor([[[[0.0, 1.0], [3.0, -2.0]], [[-0.5, 1.5], [0.0, 1.0]]]])
        f_sum = f_dec + f_skip
        m = torch.sigmoid(f_sum + f_sum.mean(dim=(2, 3), keepdim=True))
        expected = 2 * f_dec * m + 2 * f_skip * (1 - m)
        fused, gate = daf(f_dec, f_skip, return_gate=True)
        torch.testing.assert_close(gate, m)
        torch.testing.assert_close(fused, expected)
        # element check by hand for one position: f_sum[0,0,0,0] = 1, channel-0 mean of f_sum = 1.0
        m00 = 1 / (1 + torch.exp(torch.tensor(-2.0)))
        torch.testing.assert_close(fused[0, 0, 0, 0], 2 * 1.0 * m00 + 0.0)

    def test_gate_extremes(self):
        daf = DirectAttentionalFusion(4, reduction=2, norm=None)
        f_dec, f_skip = torch.randn(1, 4, 3, 3), torch.randn(1, 4, 3, 3)
        daf.gate = lambda a, b: torch.ones_like(a)
        torch.testing.assert_close(daf(f_dec, f_skip), 2 * f_dec)
        daf.gate = lambda a, b: torch.zeros_like(a)
        torch.testing.assert_close(daf(f_dec, f_skip), 2 * f_skip)

    def test_batch_norm_default_and_backward(self):
        daf = DirectAttentionalFusion(8)
        assert any(isinstance(m, nn.BatchNorm2d) for m in daf.modules())
        a = torch.randn(2, 8, 4, 4, requires_grad=True)
        daf(a, torch.randn(2, 8, 4, 4)).sum().backward()
        assert a.grad is not None and torch.isfinite(a.grad).all()

    @parameterized.expand([[0, 4], [-1, 4], [8, 0], [8, 1.5]])
    def test_bad_args(self, channels, reduction):
        with pytest.raises(ValueError, match="channels|reduction"):
            DirectAttentionalFusion(channels, reduction=reduction)

    def test_shape_mismatch(self):
        daf = DirectAttentionalFusion(4)
        with pytest.raises(ValueError, match=r"\(1, 4, 3, 4\)"):
            daf(torch.randn(1, 4, 3, 3), torch.randn(1, 4, 3, 4))
