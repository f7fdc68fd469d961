import math

import pytest
import torch
from ignite.engine import Engine
from monai.handlers import from_engine

from spectraflow_monai.handlers import FrequencyBandErrorHandler
from spectraflow_monai.metrics import (
    DEFAULT_BAND_EDGES,
    FrequencyBandError,
    compute_frequency_band_error,
    frequency_band_masks,
    radial_frequency,
)


def disk(radius, size=32, center=None):
    c = (size / 2 - 0.5, size / 2 - 0.5) if center is None else center
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return (((yy - c[0]) ** 2 + (xx - c[1]) ** 2) <= radius**2).float()[None]


def checkerboard(size=32):
    return ((torch.arange(size)[:, None] + torch.arange(size)[None, :]) % 2).float()[None]


def test_identical_masks_give_zero_in_every_band():
    gt = disk(8)[None]
    out = compute_frequency_band_error(gt.clone(), gt)
    assert out.shape == (1, 1, 3) and out.dtype == torch.float32
    assert torch.all(out == 0)
    fraction = compute_frequency_band_error(gt.clone(), gt, mode="fraction")
    assert torch.isnan(fraction).all()  # no error: the share is undefined and left out of the mean


def test_offset_blob_puts_the_energy_in_the_low_band():
    # the prediction adds a smooth blob the ground truth lacks: a low-frequency error
    gt = torch.zeros(1, 1, 64, 64)
    pred = disk(12, size=64)[None]
    out = compute_frequency_band_error(pred, gt, mode="fraction")[0, 0]
    assert out[0] > 0.75 and out[0] > out[1] > out[2]


def test_checkerboard_error_lies_in_the_highest_band():
    # e = +-1 alternating: all the energy at (fy, fx) = (0.5, 0.5), the corner beyond the axis Nyquist frequency
    pred, gt = checkerboard(16)[None], 1 - checkerboard(16)[None]
    out = compute_frequency_band_error(pred, gt)[0, 0]
    assert out[:-1].abs().max() < 1e-6
    assert out[-1].item() == pytest.approx(16 * 16)  # every pixel wrong
    # a row-wise alternation at the axis Nyquist frequency r = 0.5 also lands in the highest band
    stripes = (torch.arange(16) % 2).float()[:, None].expand(16, 16)[None, None]
    fraction = compute_frequency_band_error(stripes, 1 - stripes, mode="fraction")[0, 0]
    assert fraction.tolist() == pytest.approx([0.0, 0.0, 1.0], abs=1e-6)


@pytest.mark.parametrize("shape", [(2, 1, 16, 20), (1, 3, 15, 17), (2, 2, 6, 8, 10)])
@pytest.mark.parametrize("edges", [DEFAULT_BAND_EDGES, (0.0, 0.1, 0.2, 0.3, 0.5), (0.0, 0.5)])
def test_parseval_bands_add_up_to_the_error(shape, edges):
    torch.manual_seed(0)
    pred, gt = (torch.rand(shape) > 0.5).float(), (torch.rand(shape) > 0.5).float()
    energy = compute_frequency_band_error(pred, gt, band_edges=edges)
    assert energy.shape == (*shape[:2], len(edges) - 1)
    errors = ((pred - gt) ** 2).sum(dim=tuple(range(2, len(shape))))
    torch.testing.assert_close(energy.sum(-1), errors, rtol=1e-5, atol=1e-4)
    n = math.prod(shape[2:])
    mean = compute_frequency_band_error(pred, gt, band_edges=edges, mode="mean")
    torch.testing.assert_close(mean, energy / n, rtol=1e-5, atol=1e-6)
    fraction = compute_frequency_band_error(pred, gt, band_edges=edges, mode="fraction")
    torch.testing.assert_close(fraction.sum(-1), torch.ones_like(errors), rtol=1e-5, atol=1e-5)


def test_band_masks_partition_the_spectrum_and_edges_are_half_open():
    masks = frequency_band_masks((20, 20))
    assert masks.shape == (3, 20, 20)
    assert torch.all(masks.sum(0) == 1)  # every bin in exactly one band, corners included
    r = radial_frequency((20, 20))
    assert r.max().item() == pytest.approx(math.sqrt(0.5))
    # fy = 0.05 exactly (1/20): in the mid band, not the low one
    assert not masks[0][1, 0] and masks[1][1, 0]
    # a last edge below 0.5 closes the last band: the bins above it belong to no band
    partial = frequency_band_masks((20, 20), (0.0, 0.1, 0.25))
    assert partial[-1][5, 0]  # r = 0.25 is in
    assert not partial.any(0)[6, 0]  # r = 0.3 is out


def test_include_background_and_list_input():
    gt = torch.cat([1 - disk(6), disk(6)])[None]
    pred = torch.cat([1 - disk(7), disk(7)])[None]
    both = compute_frequency_band_error(pred, gt)
    fg = compute_frequency_band_error(pred, gt, include_background=False)
    assert both.shape == (1, 2, 3) and fg.shape == (1, 1, 3)
    torch.testing.assert_close(fg[0, 0], both[0, 1])
    torch.testing.assert_close(both[0, 0], both[0, 1])  # the background error is the negated foreground error
    metric = FrequencyBandError(include_background=False, reduction="none")
    values = metric([pred[0], pred[0]], [gt[0], gt[0]])  # decollated lists, as MONAI engines give
    assert values.shape == (2, 1, 3)


def test_metric_reduction_band_and_not_nans():
    gt = torch.zeros(2, 1, 32, 32)
    pred = torch.stack([disk(6), torch.zeros(1, 32, 32)])
    metric = FrequencyBandError(mode="fraction", get_not_nans=True)
    metric(pred, gt)
    value, not_nans = metric.aggregate()
    assert value.shape == (3,) and not_nans.tolist() == [1.0, 1.0, 1.0]  # the image without error is left out
    torch.testing.assert_close(value, compute_frequency_band_error(pred[:1], gt[:1], mode="fraction")[0, 0])
    high = FrequencyBandError(band=-1)
    high(pred, gt)
    expected = compute_frequency_band_error(pred, gt)[:, 0, -1].mean()
    torch.testing.assert_close(high.aggregate(), expected)
    high.reset()
    high(pred, gt)
    assert high.aggregate(reduction="none").shape == (2, 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"band_edges": (0.0, 0.2, 0.1)}, "increasing"),
        ({"band_edges": (0.0, 0.1, 0.1, 0.5)}, "increasing"),
        ({"band_edges": (0.0, 0.6)}, r"\[0, 0.5\]"),
        ({"band_edges": (-0.1, 0.2)}, r"\[0, 0.5\]"),
        ({"band_edges": (0.1,)}, "at least two"),
        ({"band_edges": "low"}, "band_edges"),
        ({"mode": "power"}, "mode"),
        ({"band": 3}, "band"),
    ],
)
def test_ill_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FrequencyBandError(**kwargs)
    if "band" not in kwargs:
        with pytest.raises(ValueError, match=match):
            compute_frequency_band_error(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4), **kwargs)


def test_ill_shapes_raise():
    with pytest.raises(ValueError, match="shape"):
        compute_frequency_band_error(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 5))
    with pytest.raises(ValueError, match="shape"):
        compute_frequency_band_error(torch.zeros(4, 4), torch.zeros(4, 4))


def test_handler_runs_in_an_engine():
    gt = disk(6)[None]
    batches = [
        {"pred": torch.cat([disk(7)[None], checkerboard()[None]]), "label": torch.cat([gt, 1 - checkerboard()[None]])}
    ]
    engine = Engine(lambda e, batch: batch)
    FrequencyBandErrorHandler(output_transform=from_engine(["pred", "label"])).attach(engine, "val_high_band_error")
    FrequencyBandErrorHandler(band=0, output_transform=from_engine(["pred", "label"])).attach(engine, "val_low")
    engine.run(batches, max_epochs=1)
    expected = compute_frequency_band_error(batches[0]["pred"], batches[0]["label"])
    assert isinstance(engine.state.metrics["val_high_band_error"], float)
    assert engine.state.metrics["val_high_band_error"] == pytest.approx(expected[:, 0, -1].mean().item())
    assert engine.state.metrics["val_low"] == pytest.approx(expected[:, 0, 0].mean().item())
    assert engine.state.metric_details["val_high_band_error"].shape == (2, 1, 3)
    with pytest.raises(ValueError, match="band"):
        FrequencyBandErrorHandler(band=None)
