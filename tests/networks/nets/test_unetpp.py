import pytest
import torch
from monai.networks.nets import BasicUNetPlusPlus
from parameterized import parameterized

from spectraflow_monai.networks import UNetPlusPlus
from spectraflow_monai.networks.nets.unetpp import MONAI_UNETPP_FEATURES, ZHOU_UNETPP_FEATURES

SMALL = (4, 4, 8, 8, 16, 4)
#: Zhou et al.'s reference U-Net++ (no norm, dropout 0.5) at 3 -> 1 channels: their 9,041,601 at 1 -> 1, plus 2 x 9 x 32
#: weights of the first convolution for the two more input channels, plus MONAI's three side heads (33 each)
ZHOU_REFERENCE_3_CHANNELS = 9_041_601 + 2 * 9 * 32 + 3 * 33


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
        ["batch_norm", {}, 9_049_572, {"BatchNorm2d"}, torch.nn.ReLU, set()],
        ["zhou_literal", {"norm": None, "dropout": 0.5}, ZHOU_REFERENCE_3_CHANNELS, set(), torch.nn.ReLU, {0.5}],
        ["monai", {"features": MONAI_UNETPP_FEATURES, "norm": ("instance", {"affine": True}),
                   "act": ("LeakyReLU", {"negative_slope": 0.1, "inplace": True}), "halve_level0": False},
         2_410_756, {"InstanceNorm2d"}, torch.nn.LeakyReLU, set()],
    ])  # fmt: skip
    def test_defaults_are_zhou_et_al_and_monai_a_variant(self, _, kwargs, parameters, norms, act, dropouts):
        """Zhou et al.'s widths 32-512 and up-sampling with batch norm, ReLU (9.05 M parameters, the bundle's
        baseline) or as their reference code (no norm, dropout 0.5: 9.04 M); MONAI's defaults: 2.41 M, instance norm,
        LeakyReLU."""
        net = UNetPlusPlus(**kwargs)
        assert sum(p.numel() for p in net.parameters()) == parameters
        assert _norms(net) == norms
        assert {type(m) for m in net.modules() if isinstance(m, (torch.nn.ReLU, torch.nn.LeakyReLU))} == {act}
        assert {m.p for m in net.modules() if isinstance(m, torch.nn.Dropout) and m.p} == dropouts  # MONAI keeps p=0
        assert ZHOU_UNETPP_FEATURES == (32, 64, 128, 256, 512, 32)

    def test_zhou_literal_has_the_reference_codes_parameters(self):
        """Zhou et al.'s Keras ``Nest_Net`` (DLMIA 2018 reference code, 1 -> 1 channels) has 9,041,601 parameters;
        MONAI builds the three 1x1 side heads (32 + 1 parameters each) also without deep supervision."""
        net = UNetPlusPlus(in_channels=1, norm=None, dropout=0.5)
        assert sum(p.numel() for p in net.parameters()) == 9_041_601 + 3 * 33
        # every 3x3 convolution is followed by dropout 0.5 and ReLU, no normalisation
        convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
        adns = [m for m in net.modules() if type(m).__name__ == "ADN"]
        assert len(convs) == len(adns) == 2 * 15  # 15 nodes X^{i,j} of two convolutions each
        assert all([type(c).__name__ for c in adn.children()] == ["Dropout", "ReLU"] for adn in adns)
        # the transposed convolutions halve the channels at every level, into the level-0 nodes too (64 -> 32)
        ups = {(m.in_channels, m.out_channels) for m in net.modules() if isinstance(m, torch.nn.ConvTranspose2d)}
        assert ups == {(64, 32), (128, 64), (256, 128), (512, 256)}
        assert {m.kernel_size for m in net.modules() if isinstance(m, torch.nn.ConvTranspose2d)} == {(2, 2)}

    @parameterized.expand([[True, 32], [False, 64]])
    def test_halve_level0(self, halve_level0, channels):
        net = UNetPlusPlus(halve_level0=halve_level0)
        assert all(getattr(net, f"upcat_0_{j}").upsample.deconv.out_channels == channels for j in range(1, 5))
        net = UNetPlusPlus(features=SMALL, halve_level0=halve_level0, norm=None, dropout=0.5).eval()
        with torch.no_grad():
            assert net(torch.randn(2, 3, 32, 32)).shape == (2, 1, 32, 32)

    def test_dropout_acts_in_training_only(self):
        torch.manual_seed(0)
        net = UNetPlusPlus(features=SMALL, norm=None, dropout=0.5)
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            assert not torch.equal(net.train()(x), net(x))  # two dropout masks
            torch.testing.assert_close(net.eval()(x), net(x))

    def test_equals_monai_final_head(self):
        torch.manual_seed(0)
        ours = UNetPlusPlus(out_channels=2, features=SMALL, halve_level0=False).eval()
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
        [{"halve_level0": "yes"}, "halve_level0"],
        [{"features": (32, 64, 128)}, "features"],
        [{"features": (32, 64, 128, 256, 0, 32)}, "features"],
    ])  # fmt: skip
    def test_bad_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            UNetPlusPlus(**kwargs)

    def test_spatial_size_multiple_of_16(self):
        with pytest.raises(ValueError, match="multiples of 16"):
            UNetPlusPlus(features=SMALL)(torch.randn(1, 3, 30, 32))
