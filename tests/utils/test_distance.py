"""Tests for spectraflow_monai.utils.distance: the torch exact EDT against scipy, and the boundary loss's maps.

Tolerance: the squared distances are exact (integers in float32, or products of the spacing); the distances differ from
scipy's float64 ones by the float32 rounding of the square root, so they are compared with ``rtol=1e-6, atol=1e-5``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.losses import BoundaryLoss
from scipy import ndimage

from spectraflow_monai.utils.distance import (
    euclidean_distance_transform,
    signed_distance_map,
    squared_distance_transform,
)

RTOL, ATOL = 1e-6, 1e-5


def _random_masks(shape, density, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) < density


def _scipy_edt(mask: np.ndarray, sampling=None) -> np.ndarray:
    return ndimage.distance_transform_edt(mask, sampling=sampling)


@pytest.mark.parametrize(
    "shape, density, seed",
    [((4, 32, 32), 0.9, 0), ((3, 17, 41), 0.95, 1), ((2, 64, 48), 0.99, 2), ((2, 9, 10, 11), 0.9, 3)],
)
def test_edt_matches_scipy_random(shape, density, seed):
    masks = _random_masks(shape, density, seed)
    spatial = len(shape) - 1
    got = euclidean_distance_transform(masks, spatial_dims=spatial).numpy()
    for i in range(shape[0]):
        np.testing.assert_allclose(got[i], _scipy_edt(masks[i].numpy()), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("sampling", [(1.0, 2.5), (0.8, 0.8), 1.5])
def test_edt_matches_scipy_sampling(sampling):
    masks = _random_masks((2, 20, 30), 0.9, 4)
    got = euclidean_distance_transform(masks, spatial_dims=2, sampling=sampling).numpy()
    for i in range(2):
        np.testing.assert_allclose(got[i], _scipy_edt(masks[i].numpy(), sampling), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "name",
    ["single_zero", "single_one", "corner_zero", "non_square_line", "half"],
)
def test_edt_edge_cases(name):
    mask = torch.ones(13, 29, dtype=torch.bool)
    if name == "single_zero":
        mask[6, 14] = False
    elif name == "single_one":
        mask[:] = False
        mask[3, 5] = True
    elif name == "corner_zero":
        mask[-1, -1] = False
    elif name == "non_square_line":
        mask[:, 7] = False
    else:
        mask[:, :10] = False
    got = euclidean_distance_transform(mask[None], spatial_dims=2)[0].numpy()
    np.testing.assert_allclose(got, _scipy_edt(mask.numpy()), rtol=RTOL, atol=ATOL)


def test_edt_no_zero_is_inf_and_all_zero_is_zero():
    assert torch.isinf(squared_distance_transform(torch.ones(1, 5, 6), spatial_dims=2)).all()
    assert (squared_distance_transform(torch.zeros(1, 5, 6), spatial_dims=2) == 0).all()


def test_edt_chunking_gives_the_same_result():
    masks = _random_masks((3, 24, 24), 0.9, 5)
    full = squared_distance_transform(masks, spatial_dims=2)
    chunked = squared_distance_transform(masks, spatial_dims=2, max_elements=1)
    assert torch.equal(full, chunked)


@pytest.mark.parametrize(
    "kwargs",
    [{"spatial_dims": 0}, {"spatial_dims": 4}, {"sampling": (1.0,)}, {"sampling": (1.0, -1.0)}, {"max_elements": 0}],
)
def test_edt_ill_arguments(kwargs):
    with pytest.raises(ValueError):
        squared_distance_transform(torch.ones(2, 4, 4), **kwargs)


def _targets(shape, seed):
    """Blobby one-hot-like targets plus the edge cases: empty, full, a single pixel."""
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=g) > 0.7).float()
    t = torch.nn.functional.max_pool2d(t.flatten(0, 1)[:, None], 3, 1, 1)[:, 0].reshape(shape) if len(shape) == 4 else t
    t[0, 0] = 0  # empty
    t[-1, -1] = 1  # full
    if shape[0] > 1 and shape[1] > 1:
        t[0, 1] = 0
        t[(0, 1) + (2,) * (len(shape) - 2)] = 1  # a single pixel
    return t


@pytest.mark.parametrize("shape", [(3, 2, 24, 24), (2, 3, 16, 37), (2, 2, 8, 9, 10)])
def test_signed_distance_map_equals_monai(shape):
    target = _targets(shape, 6)
    expected = BoundaryLoss().compute_distance_map(target)
    got = signed_distance_map(target)
    assert got.dtype == torch.float32 and got.shape == target.shape
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


def test_signed_distance_map_shape_error():
    with pytest.raises(ValueError, match="target must be"):
        signed_distance_map(torch.zeros(4, 4, 4))
