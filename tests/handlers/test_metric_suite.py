import csv
import logging

import pytest
import torch
from ignite.engine import Engine
from monai.data import MetaTensor

from spectraflow_monai.handlers import MetricSuiteHandler, name_from_path
from spectraflow_monai.metrics import SegmentationMetricSuite


def square(r0, r1, c0, c1, size=10):
    m = torch.zeros(1, size, size)
    m[0, r0:r1, c0:c1] = 1
    return m


def decollated_batches():
    """Two iterations of decollated items, as a MONAI evaluator leaves them after post-transforms."""
    gt = square(2, 8, 2, 8)
    items = [
        ("/data/images/case_a.jpg", square(3, 9, 3, 9)),  # dice 25/36
        ("/data/images/case_b.nii.gz", square(2, 8, 2, 6)),  # dice 0.8
        ("/data/images/case_c.png", gt.clone()),  # dice 1
    ]
    batches = []
    for chunk in (items[:2], items[2:]):
        batch = [
            {"image": MetaTensor(torch.zeros(3, 10, 10), meta={"filename_or_obj": f}), "pred": p, "label": gt}
            for f, p in chunk
        ]
        batches.append(batch)
    return batches


def run(handler, batches, epochs=1):
    engine = Engine(lambda e, batch: batch)  # output = the (decollated) batch with pred and label
    handler.attach(engine)
    engine.run(batches, max_epochs=epochs)
    return engine


def test_handler_writes_reports_with_names(tmp_path, caplog):
    handler = MetricSuiteHandler(tmp_path / "eval", metric_prefix="suite_")
    with caplog.at_level(logging.INFO):
        engine = run(handler, decollated_batches(), epochs=2)  # the second epoch must not accumulate
    with open(tmp_path / "eval" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == ["case_a", "case_b", "case_c"]
    assert float(rows[1]["dice"]) == pytest.approx(0.8)
    md = (tmp_path / "eval" / "summary.md").read_text()
    assert "| mDSC (%) | " + f"{100 * (25 / 36 + 0.8 + 1) / 3:.2f} |" in md
    assert handler.last_summary["num_images"] == 3
    assert engine.state.metrics["suite_mDSC"] == pytest.approx((25 / 36 + 0.8 + 1) / 3)
    assert (tmp_path / "eval" / "summary.json").is_file()
    assert "HD95, pooled" in caplog.text


def test_handler_collated_batch_with_name_key(tmp_path):
    gt = torch.stack([square(2, 8, 2, 8)] * 2)
    batch = {"pred": gt.clone(), "label": gt, "name": ["x1", "x2"]}
    suite = SegmentationMetricSuite(hd95="pooled")
    handler = MetricSuiteHandler(tmp_path, suite=suite, name_key="name", json_name=None)
    run(handler, [batch])
    assert [r["name"] for r in suite.per_image()] == ["x1", "x2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "summary.md"]


def test_handler_without_names_numbers_images(tmp_path):
    gt = torch.stack([square(2, 8, 2, 8)] * 2)
    handler = MetricSuiteHandler(tmp_path, batch_transform=lambda b: None)
    run(handler, [{"pred": gt, "label": gt}] * 2)
    assert [r["name"] for r in handler.suite.per_image()] == [f"image_{i:05d}" for i in range(4)]


def test_handler_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="output_dir"):
        MetricSuiteHandler("")
    with pytest.raises(ValueError, match="suite"):
        MetricSuiteHandler(tmp_path, suite="dice")
    handler = MetricSuiteHandler(tmp_path, output_transform=lambda out: out["pred"])
    with pytest.raises(ValueError, match=r"\(pred, label\)"):
        run(handler, [{"pred": torch.ones(1, 1, 4, 4)}])


@pytest.mark.parametrize(
    "path, name", [("/a/b/case1.nii.gz", "case1"), ("x/ISIC_001.JPG", "ISIC_001"), ("id_7", "id_7"), (3, "3")]
)
def test_name_from_path(path, name):
    assert name_from_path(path) == name


def test_handler_reports_missed_structures(tmp_path):
    gt = square(2, 8, 2, 8)
    batch = [{"pred": gt.clone(), "label": gt}, {"pred": torch.zeros_like(gt), "label": gt}]  # second one missed
    handler = MetricSuiteHandler(tmp_path, metric_prefix="suite_")
    engine = run(handler, [batch])
    assert engine.state.metrics["suite_hd95_dropped"] == 1
    assert engine.state.metrics["suite_hd95_monai"] == 0.0
    diagonal = (10**2 + 10**2) ** 0.5
    assert engine.state.metrics["suite_hd95_monai_empty_as_diagonal"] == pytest.approx(diagonal / 2)
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[1]["hd95_monai"] == "nan" and float(rows[1]["hd95_pooled_empty_as_diagonal"]) == pytest.approx(
        diagonal, rel=1e-5
    )
