"""Label efficiency (SpectraFlow paper, Fig. 4): Dice and HD95 with 10 / 20 / 50 / 100 % of the training images.

SpectraFlow (Chen et al.) trains on random subsets of the ISIC-2016 training set and compares the full method with the
same network fine-tuned from the official DINOv2 weights without Stage-1 and with baselines it does not name. Here
every arm is a run of the 2D bundle at ``data_fraction`` f (the seeded, nested subsets of
:func:`spectraflow_monai.data.low_data_subset`): ``spectraflow`` (Stage-1 on the masks and images of the same subset,
then Stage-2 from its export: ``encoder_init stage1``, a missing export stops the arm), ``no_stage1`` (Stage-2 from
``pretrained_weights``: ``encoder_init pretrained``, the paper's "no Stage-1" row) and ``baseline`` (the bundle's
MONAI UNet by default), each evaluated on the whole test split; each row states where its encoder started.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectraflow_monai.experiments.runner import (
    EXPERIMENT_METRICS,
    METRIC_HEADERS,
    SCALES,
    ExperimentRunner,
    experiment_settings,
    experiment_title,
    metric_cells,
    settings_text,
    write_csv,
)
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.visualize.utils import save_figure

__all__ = ["LOW_DATA_DATASET", "LOW_DATA_SCALES", "LOW_DATA_TITLE", "low_data_markdown", "run_low_data"]

#: the data set of the paper's Fig. 4 (a bundle ``dataset``).
LOW_DATA_DATASET = "isic2016"
LOW_DATA_TITLE = "Label efficiency (paper Fig. 4)"

#: bundle overrides and fractions of each scale (``paper``: the bundle's own settings).
LOW_DATA_SCALES: dict[str, dict[str, Any]] = {
    "small": {"overrides": SCALES["small"], "fractions": (0.1, 0.2, 0.5, 1.0)},
    "paper": {"overrides": SCALES["paper"], "fractions": (0.1, 0.2, 0.5, 1.0)},
}


def run_low_data(
    output: str | os.PathLike,
    data: Mapping[str, Any],
    scale: str = "small",
    fractions: Sequence[float] | None = None,
    baseline_config: str = "unet_baseline.yaml",
    overrides: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Train and evaluate the three arms at every fraction; write ``low_data.csv``, ``low_data.png``, ``low_data.md``.

    Args:
        output: the experiment folder.
        data: the data settings of the bundle (``dataset``, ``dataset_dir``, ``data_list_file_path``, ...).
        scale: ``"small"`` or ``"paper"`` (:data:`LOW_DATA_SCALES`). Defaults to ``"small"``.
        fractions: training fractions in (0, 1] (default: the scale's 0.1, 0.2, 0.5, 1.0).
        baseline_config: a config of the bundle (or a path) merged over ``train.yaml`` for the baseline.
        overrides: more bundle overrides of every step (they win over the scale's).

    Returns:
        One row per fraction and arm, with where its encoder started (``encoder_start``, from its ``model.json``).
    """
    if scale not in LOW_DATA_SCALES:
        raise ValueError(f"scale must be one of {list(LOW_DATA_SCALES)}, got {scale!r}.")
    preset = LOW_DATA_SCALES[scale]
    fractions = tuple(preset["fractions"] if fractions is None else fractions)
    if not fractions or any(isinstance(f, bool) or not 0.0 < float(f) <= 1.0 for f in fractions):
        raise ValueError(f"fractions must be numbers in (0, 1], got {list(fractions)!r}.")
    common = experiment_settings(data, preset["overrides"], overrides)
    runner = ExperimentRunner(output, "low_data", common)
    rows: list[dict[str, Any]] = []
    for fraction in fractions:
        pct = f"{round(100 * float(fraction))}pct"
        sub = {"data_fraction": float(fraction)}
        arms = {
            "spectraflow": (["train.yaml"], {**sub, "encoder_init": "stage1"}),  # requires its Stage-1 export
            "no_stage1": (["train.yaml"], {**sub, "encoder_init": "pretrained"}),
            "baseline": (["train.yaml", baseline_config], sub),
        }
        runner.step(f"spectraflow_{pct}", "stage1", ["train.yaml", "train_stage1.yaml"], sub)
        for arm, (configs, settings) in arms.items():
            run = f"{arm}_{pct}"
            runner.step(run, "stage2", configs, settings)
            scores = runner.evaluate(run, configs, "clean", settings)
            start = runner.encoder_start(run)
            rows.append({"fraction": float(fraction), "model": arm, "encoder_start": start, **scores})
    out = Path(output)
    write_csv(out / "low_data.csv", rows)
    _plot(out / "low_data.png", rows, experiment_title(LOW_DATA_TITLE, common))
    write_text_atomic(out / "low_data.md", low_data_markdown(rows, scale, common))
    return rows


def _plot(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """mDSC against the training fraction, one line per arm."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 3.2))
    ax = fig.subplots()
    for model in dict.fromkeys(r["model"] for r in rows):
        pts = sorted((100 * r["fraction"], 100 * r["mDSC"]) for r in rows if r["model"] == model)
        ax.plot(*zip(*pts), marker="o", label=model)
    ax.set_xlabel("training images (%)")
    ax.set_ylabel("mDSC (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def low_data_markdown(rows: Sequence[Mapping[str, Any]], scale: str, settings: Mapping[str, Any]) -> str:
    """The report section: mDSC, mIoU and HD95 per training fraction and arm, with where its encoder started."""
    lines = [
        f"## {experiment_title(LOW_DATA_TITLE, settings)}",
        "",
        settings_text(scale, settings),
        "",
        "| training images | model | encoder start | "
        + " | ".join(METRIC_HEADERS[m] for m in EXPERIMENT_METRICS) + " |",
        "| ---: | --- | --- |" + " ---: |" * len(EXPERIMENT_METRICS),
    ]
    for r in rows:
        start = r.get("encoder_start", "not recorded")
        lines.append(f"| {100 * r['fraction']:.0f} % | {r['model']} | {start} | " + " | ".join(metric_cells(r)) + " |")
    return "\n".join([*lines, "", "![low data](low_data.png)", ""])
