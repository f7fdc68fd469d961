"""Tests of the Keras-style L2 parameter groups (Zhou et al.'s ``kernel_regularizer=l2(1e-4)`` under Adam)."""

from __future__ import annotations

import pytest
import torch
from parameterized import parameterized

from spectraflow_monai.networks import UNetPlusPlus
from spectraflow_monai.optimizers import kernel_l2_parameter_groups


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.ReLU(), torch.nn.BatchNorm2d(3),
        torch.nn.ConvTranspose2d(3, 2, 2, stride=2), torch.nn.Conv2d(2, 1, 1),
    )  # fmt: skip


class TestKernelL2ParameterGroups:
    def test_groups(self):
        net = _net()
        net[4].weight.requires_grad_(False)  # frozen: left out
        groups = kernel_l2_parameter_groups(net, 1e-4)
        assert [g["weight_decay"] for g in groups] == [2e-4, 0.0]
        assert [id(p) for p in groups[0]["params"]] == [id(net[0].weight)]  # not the transposed convolution's
        others = {id(p) for p in groups[1]["params"]}
        assert others == {id(net[0].bias), id(net[2].weight), id(net[2].bias), id(net[3].weight), id(net[3].bias),
                          id(net[4].bias)}  # fmt: skip

    def test_adam_step_is_the_keras_l2_penalty(self):
        """Adam over the groups takes the step of Adam without decay on ``loss + l2 * sum(kernel ** 2)``."""
        l2, x = 0.05, torch.randn(2, 2, 4, 4)
        steps = []
        for grouped in (True, False):
            net = _net()
            params = kernel_l2_parameter_groups(net, l2) if grouped else net.parameters()
            opt = torch.optim.Adam(params, lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                loss = net(x).square().mean()
                if not grouped:
                    loss = loss + l2 * sum(m.weight.square().sum() for m in (net[0], net[4]))
                loss.backward()
                opt.step()
            steps.append([p.detach().clone() for p in net.parameters()])
        for a, b in zip(*steps):
            torch.testing.assert_close(a, b)

    def test_unetpp_literal_kernels(self):
        net = UNetPlusPlus(features=(4, 8, 16, 32, 64, 4), norm=None, dropout=0.5)
        kernels, rest = kernel_l2_parameter_groups(net)
        assert kernels["weight_decay"] == 2e-4 and rest["weight_decay"] == 0.0
        # 15 nodes of two 3x3 convolutions and the four 1x1 heads; biases and the 10 transposed convolutions apart
        assert len(kernels["params"]) == 2 * 15 + 4 and all(p.ndim == 4 for p in kernels["params"])
        assert len(rest["params"]) == 2 * 15 + 4 + 2 * 10
        assert sum(len(g["params"]) for g in (kernels, rest)) == len(list(net.parameters()))

    def test_no_kernels_one_group(self):
        groups = kernel_l2_parameter_groups(torch.nn.Linear(2, 2))
        assert len(groups) == 1 and groups[0]["weight_decay"] == 0.0

    @parameterized.expand([[-1e-4], [float("nan")], ["1e-4"], [True]])
    def test_bad_l2(self, l2):
        with pytest.raises(ValueError, match="l2"):
            kernel_l2_parameter_groups(_net(), l2)
