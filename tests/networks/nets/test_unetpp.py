import pytest
import torch
from monai.networks.nets import BasicUNetPlusPlus
from parameterized import parameterized

from spectraflow_monai.networks import UNetPlusPlus

SMALL = (4, 4, 8, 8, 16, 4)


class TestUNetPlusPlus:
    @parameterized.expand([[(32, 32), 1, 1], [(64, 48), 2, 3]])
    def test_shape_is_one_tensor(self, size, batch, out_channels):
        net = UNetPlusPlus(out_channels=out_channels, features=SMALL).eval()
        with torch.no_grad():
            out = net(torch.randn(batch, 3, *size))
        assert isinstance(out, torch.Tensor) and out.shape == (batch, out_channels, *size)

    def test_equals_monai_final_head(self):
        torch.manual_seed(0)
        ours = UNetPlusPlus(out_channels=2, features=SMALL).eval()
        monai_net = BasicUNetPlusPlus(spatial_dims=2, in_channels=3, out_channels=2, features=SMALL).eval()
        monai_net.load_state_dict(ours.state_dict())
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), monai_net(x)[-1])

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="deep_supervision"):
            UNetPlusPlus(deep_supervision=True)
        with pytest.raises(ValueError, match="multiples of 16"):
            UNetPlusPlus(features=SMALL)(torch.randn(1, 3, 30, 32))
