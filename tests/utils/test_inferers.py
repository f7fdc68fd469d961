"""AxialSliceInferer: the logits of MONAI's SliceInferer for whole-slice windows, without its sliding-window cost."""

from __future__ import annotations

import pytest
import torch
from monai.data import MetaTensor
from monai.inferers import SliceInferer

from spectraflow_monai.utils.inferers import AxialSliceInferer


def _network() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Upsample(scale_factor=2)).eval()


@pytest.mark.parametrize("shape, sw_batch_size", [((1, 3, 8, 6, 7), 3), ((2, 3, 8, 8, 5), 16), ((1, 3, 4, 4, 1), 1)])
def test_logits_equal_slice_inferers(shape, sw_batch_size):
    net = _network()
    x = torch.randn(*shape)
    with torch.no_grad():
        got = AxialSliceInferer(sw_batch_size)(x, net)
        want = SliceInferer(roi_size=shape[2:4], spatial_dim=2, sw_batch_size=sw_batch_size)(x, net)
    assert got.shape == (shape[0], 4, 2 * shape[2], 2 * shape[3], shape[4])
    assert got.permute(0, 2, 3, 4, 1).is_contiguous()  # the classes innermost in memory, for the argmax over them
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.argmax(1), want.argmax(1), rtol=0, atol=0)


def test_metatensor_input_keeps_its_metadata():
    affine = torch.diag(torch.tensor([0.8, 0.7, 2.5, 1.0], dtype=torch.float64))
    x = MetaTensor(torch.randn(1, 3, 6, 6, 4), affine=affine, meta={"filename_or_obj": "ct.nii.gz"})
    with torch.no_grad():
        got = AxialSliceInferer(2)(x, _network())
        want = SliceInferer(roi_size=(6, 6), spatial_dim=2, sw_batch_size=2)(x, _network())
    assert isinstance(got, MetaTensor) and got.meta["filename_or_obj"] == "ct.nii.gz"
    torch.testing.assert_close(got.affine, want.affine)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "4"])
def test_bad_sw_batch_size_is_named(value):
    with pytest.raises(ValueError, match="sw_batch_size must be a positive integer"):
        AxialSliceInferer(value)


def test_inputs_must_be_volumes_with_slices():
    with pytest.raises(ValueError, match=r"inputs must be \(B, C, H, W, D\) volumes"):
        AxialSliceInferer()(torch.randn(1, 3, 4, 4), _network())
    with pytest.raises(ValueError, match="at least one slice"):
        AxialSliceInferer()(torch.randn(1, 3, 4, 4, 0), _network())
