import pytest
import torch
from monai.networks.nets import BasicUNetPlusPlus
from parameterized import parameterized

from spectraflow_monai.networks import UNetPlusPlus
from spectraflow_monai.networks.nets.unetpp import MONAI_UNETPP_FEATURES, ZHOU_UNETPP_FEATURES

SMALL = (4, 4, 8, 8, 16, 4)


def _norms(net):
    return {type(m).__name__ for m in net.modules() if "Norm" in type(m).__name__}


class TestUNetPlusPlus:
    @parameterized.expand([[(32, 32), 1, 1], [(64, 48), 2, 3]])
    def test_shape_is_one_tensor(self, size, batch, out_channels):
        net = UNetPlusPlus(out_channels=out_channels, features=SMALL).eval()
        with torch.no_grad():
            out = net(torch.randn(batch, 3, *size))
        assert isinstance(out, torch.Tensor) and out.shape == (batch, out_channels, *size)

    @parameterized.expand([
        ["zhou", {}, 9_119_332, {"BatchNorm2d"}, torch.nn.ReLU],
        ["monai", {"features": MONAI_UNETPP_FEATURES, "norm": ("instance", {"affine": True}),
                   "act": ("LeakyReLU", {"negative_slope": 0.1, "inplace": True})}, 2_410_756, {"InstanceNorm2d"},
         torch.nn.LeakyReLU],
    ])  # fmt: skip
    def test_defaults_are_zhou_et_al_and_monai_a_variant(self, _, kwargs, parameters, norms, act):
        """Zhou et al.'s U-Net++: widths 32-512, batch norm, ReLU (9.12 M parameters); MONAI's defaults: 2.41 M,
        instance norm, LeakyReLU."""
        net = UNetPlusPlus(**kwargs)
        assert sum(p.numel() for p in net.parameters()) == parameters
        assert _norms(net) == norms
        assert {type(m) for m in net.modules() if isinstance(m, (torch.nn.ReLU, torch.nn.LeakyReLU))} == {act}
        assert ZHOU_UNETPP_FEATURES == (32, 64, 128, 256, 512, 32)

    def test_equals_monai_final_head(self):
        torch.manual_seed(0)
        ours = UNetPlusPlus(out_channels=2, features=SMALL).eval()
        monai_net = BasicUNetPlusPlus(spatial_dims=2, in_channels=3, out_channels=2, features=SMALL, norm="batch",
                                      act="relu").eval()  # fmt: skip
        monai_net.load_state_dict(ours.state_dict())
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), monai_net(x)[-1])

    @parameterized.expand([[True], [False]])
    def test_deep_supervision_heads_in_training_final_head_at_evaluation(self, deep_supervision):
        torch.manual_seed(0)
        net = UNetPlusPlus(out_channels=2, features=SMALL, deep_supervision=deep_supervision)
        x = torch.randn(2, 3, 32, 32)
        out = net.train()(x)
        if deep_supervision:
            assert isinstance(out, list) and len(out) == 4 and all(o.shape == (2, 2, 32, 32) for o in out)
        else:
            assert isinstance(out, torch.Tensor) and out.shape == (2, 2, 32, 32)
        net.eval()
        with torch.no_grad():
            final = net(x)
            assert isinstance(final, torch.Tensor)
            torch.testing.assert_close(final, BasicUNetPlusPlus.forward(net, x)[-1])

    @parameterized.expand([
        [{"deep_supervision": 1}, "deep_supervision"],
        [{"features": (32, 64, 128)}, "features"],
        [{"features": (32, 64, 128, 256, 0, 32)}, "features"],
    ])  # fmt: skip
    def test_bad_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            UNetPlusPlus(**kwargs)

    def test_spatial_size_multiple_of_16(self):
        with pytest.raises(ValueError, match="multiples of 16"):
            UNetPlusPlus(features=SMALL)(torch.randn(1, 3, 30, 32))
