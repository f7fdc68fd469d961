import math

import pytest
import torch
from ignite.engine import Engine
from monai.handlers import HausdorffDistance, from_engine

from spectraflow_monai.handlers import HD95EmptyAsDiagonal
from spectraflow_monai.metrics import HD95EmptyAsDiagonalMetric, hd95_monai, image_diagonal


def square(r0, r1, c0, c1, size=(10, 12)):
    m = torch.zeros(1, *size)
    m[0, r0:r1, c0:c1] = 1
    return m


def test_image_diagonal():
    assert image_diagonal((10, 12)) == pytest.approx(math.sqrt(244))
    assert image_diagonal((4, 6, 8), spacing=(2.0, 1.0, 0.5)) == pytest.approx(math.sqrt(64 + 36 + 16))
    with pytest.raises(ValueError, match="spacing"):
        image_diagonal((4, 6), spacing=(1.0, 2.0, 3.0))


def test_metric_values():
    gt, hit, empty = square(2, 8, 2, 8), square(3, 9, 3, 9), torch.zeros(1, 10, 12)
    metric = HD95EmptyAsDiagonalMetric(definition="monai")
    values = metric(torch.stack([hit, empty, hit]), torch.stack([gt, gt, empty]))
    assert values.shape == (3, 1)
    assert values[0, 0].item() == pytest.approx(hd95_monai(hit[0], gt[0]))
    assert values[1, 0].item() == pytest.approx(math.sqrt(10**2 + 12**2))  # missed: the image diagonal
    assert math.isnan(values[2, 0].item())  # empty ground truth: undefined
    expected = (hd95_monai(hit[0], gt[0]) + math.sqrt(244)) / 2
    assert metric.aggregate().item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="definition"):
        HD95EmptyAsDiagonalMetric(definition="max")


def test_validation_handler_counts_missed_images_where_monai_drops_them():
    gt = square(2, 8, 2, 8)
    batches = [[{"pred": gt.clone(), "label": gt}, {"pred": torch.zeros_like(gt), "label": gt}]]
    engine = Engine(lambda e, batch: batch)
    transform = from_engine(["pred", "label"])
    HD95EmptyAsDiagonal(include_background=True, output_transform=transform).attach(engine, "val_hd95_diag")
    HausdorffDistance(include_background=True, percentile=95, output_transform=transform).attach(engine, "val_hd95")
    engine.run(batches, max_epochs=1)
    assert engine.state.metrics["val_hd95"] == 0.0  # MONAI leaves the missed image out
    assert engine.state.metrics["val_hd95_diag"] == pytest.approx(math.sqrt(244) / 2)
    assert engine.state.metric_details["val_hd95_diag"].shape == (2, 1)
