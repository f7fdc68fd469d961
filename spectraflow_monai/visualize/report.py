"""A Markdown report of one evaluation run: metric table, training curves and prediction overlays.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") reports per-image metrics averaged over each test set (Sec. "Datasets and Metrics") and shows
qualitative predictions next to the ground truth. The 2D bundle's evaluation writes, into one folder ``eval_dir``:

- ``metrics.csv`` (one row per image, or per image and class), ``summary.md`` and ``summary.json``
  (:class:`~spectraflow_monai.metrics.SegmentationMetricSuite`);
- ``predictions/<name>_seg.png``: binary predictions (0/255) at the network's input size (``image_size``), written
  by MONAI ``SaveImaged`` with the ``PILWriter`` (``predictions/<name>/<name>_seg.png`` when ``separate_folder=True``), found by
  :func:`find_prediction`.

Training writes TensorBoard event files with MONAI's ``TensorBoardStatsHandler`` (Stage-2 into ``logs/``, Stage-1
into ``logs/stage1/``). :func:`write_report` gathers all of it into ``eval_dir/report.md`` with two figures next to
it: ``curves.png`` (:func:`~spectraflow_monai.visualize.curves.plot_training_curves`, one panel per scalar tag) and
``overlays.png`` (:func:`~spectraflow_monai.visualize.overlays.plot_overlays`, images with the ground-truth contour
in green and the predicted contour in red). Every file is written atomically. The command line is
:mod:`spectraflow_monai.visualize.cli` (``spectraflow report``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from spectraflow_monai.metrics.segmentation import sort_sizes
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.visualize.curves import plot_training_curves
from spectraflow_monai.visualize.overlays import plot_overlays
from spectraflow_monai.visualize.predictions import check_datalist, find_prediction, pair_predictions, prediction_size
from spectraflow_monai.visualize.utils import list_names

__all__ = ["BETA_RAMP_NOTE", "STAGE1_CURVES_NOTE", "find_prediction", "write_report"]

#: why the Stage-2 total loss can rise while it trains well (the report adds it under the Stage-2 curves)
BETA_RAMP_NOTE = (
    "  - Stage-2 `train_loss` is Dice + BCE + β·boundary, and β (`boundary_beta`) ramps from `boundary_beta` to "
    "`boundary_beta_max` over `boundary_ramp_epochs` epochs (Chen et al., Sec. 4.2): the total can rise while every "
    "term falls. Read progress from `train_loss_dice`, `train_loss_bce`, `train_loss_boundary` and the validation "
    "metrics; `train_loss_boundary_weighted` is the β-weighted term inside the total."
)


#: which Stage-1 curves are drawn (the report adds it under a folder showing ``meanflow_error``)
STAGE1_CURVES_NOTE = (
    "  - Stage-1 draws the unweighted MeanFlow error `meanflow_error` and the dispersive loss `loss_dispersive`. The "
    "series that only repeat them are not drawn (the figure names them at its foot): `loss_meanflow_weighted`, the "
    "adaptively weighted L / (L + c)^p that is optimised, close to 1 by construction; `dispersive_weighted` "
    "(λ·`loss_dispersive`); the total `loss`."
)


def _overlay_scale_note(folder: str, size: int, sizes: Sequence[str]) -> str:
    """Where the overlays are drawn (``size``, beside the ``sizes`` of the predictions drawn) and (from
    ``summary.json``'s ``scoring``) how that differs from the scoring."""
    import json

    if list(sizes) == [f"{size}x{size}"]:
        note = (f"Drawn on the {size}x{size} resize of each image, the size of its prediction (the network's input), "
                "over the whole image.")
    else:
        shown = " .. ".join(dict.fromkeys((sizes[0], sizes[-1])))  # one size, or the smallest .. the largest
        note = (f"Drawn on the {size}x{size} resize of each image, over the whole image; the predictions ({shown}) "
                "are resized to it (nearest).")
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            scoring = str(json.load(f).get("scoring") or "")
    except (OSError, ValueError, AttributeError):
        return note
    if "original size" in scoring or "field-of-view mask for" in scoring:
        note += " The metrics were not scored that way (see the summary above): an overlay can differ from its scores."
    return note


def write_report(
    eval_dir: str | os.PathLike,
    datalist: Sequence[Mapping] | None = None,
    log_dirs: Mapping[str, str | os.PathLike] | None = None,
    title: str = "SpectraFlow report",
    extra_lines: Sequence[str] = (),
    num_images: int = 6,
    seed: int = 0,
    image_size: int | None = None,
    label_map: Mapping[int, int] | None = None,
) -> str:
    """Write ``eval_dir/report.md``: the ``summary.md`` metric table, training curves and prediction overlays.

    ``curves.png`` (:func:`plot_training_curves`, when ``log_dirs`` is given) and ``overlays.png``
    (:func:`plot_overlays` on ``eval_dir/predictions``, when ``datalist`` is given; best/median/worst Dice images
    when ``eval_dir/metrics.csv`` exists) are written next to the report and linked from it. Skipped log folders
    and the number of images without a prediction are stated in the report.

    Args:
        eval_dir: evaluation output folder holding ``summary.md`` (and ``metrics.csv``, ``summary.json``,
            ``predictions/``).
        datalist: the evaluated entries (see :func:`plot_overlays`); None: no overlays. Defaults to None.
        log_dirs: ``{label: TensorBoard folder}``, e.g. ``{"Stage-1": "logs/stage1", "Stage-2": "logs"}``; None: no
            curves. Defaults to None.
        title: report title. Defaults to ``"SpectraFlow report"``.
        extra_lines: Markdown lines appended under "Notes" (e.g. the command that produced the run). Defaults to ().
        num_images: number of overlay images. Defaults to 6.
        seed: seed of the overlay choice without ``metrics.csv``. Defaults to 0.
        image_size: side length of the overlay panels in pixels, the evaluation resolution (see
            :func:`plot_overlays`); None: the size of the predictions (the evaluation writes them at the
            network's input size; the largest side when they differ). The report states both. Defaults to None.
        label_map: ``{source value: class}`` of label maps (``label_classes``), for the overlays' contours; None:
            binary masks. Defaults to None.

    Returns:
        The path of ``report.md``.

    Raises:
        FileNotFoundError: ``eval_dir``, its ``summary.md`` or its ``predictions`` folder (with a datalist) is missing.
        ValueError: a datalist is given but ``predictions/`` holds no prediction for any entry.
    """
    folder = os.fspath(eval_dir)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"eval_dir '{folder}' does not exist (expected the evaluation output folder).")
    summary_path = os.path.join(folder, "summary.md")
    if not os.path.isfile(summary_path):
        raise FileNotFoundError(f"'{summary_path}' does not exist: run the evaluation first (it writes summary.md).")
    if isinstance(extra_lines, str):
        extra_lines = [extra_lines]
    with open(summary_path) as f:
        summary = f.read().strip()
    # demote the headings of the embedded summary below the report's own
    summary = re.sub(r"^(#{1,5}) ", r"#\1 ", summary, flags=re.MULTILINE)

    lines = [f"# {title}", "", f"Evaluation folder: `{os.path.abspath(folder)}`", "", "## Metrics", "", summary, ""]
    files = [f"[{n}]({n})" for n in ("metrics.csv", "summary.json") if os.path.isfile(os.path.join(folder, n))]
    if files:
        lines += ["Files: " + ", ".join(files) + ".", ""]

    if log_dirs is not None:
        lines += ["## Training curves", ""]
        plotted = plot_training_curves(log_dirs, os.path.join(folder, "curves.png"))
        if plotted:
            lines += ["![Training curves](curves.png)", ""]
        else:
            lines += ["No training scalars found.", ""]
        for label, d in log_dirs.items():
            d = os.fspath(d)
            tags = [p[len(f"{label}/"):] for p in plotted if p.startswith(f"{label}/")]
            if not os.path.exists(d):
                lines.append(f"- {label}: log folder `{d}` not found, skipped.")
            elif not tags:
                lines.append(f"- {label}: no scalars in `{d}`, skipped.")
            else:
                lines.append(f"- {label} (`{d}`): " + ", ".join(f"`{t}`" for t in tags))
                if {"train_loss", "boundary_beta"} <= set(tags):
                    lines.append(BETA_RAMP_NOTE)
                if "meanflow_error" in tags and "loss_meanflow_weighted" not in tags:
                    lines.append(STAGE1_CURVES_NOTE)
        lines.append("")
        lines.append(
            "Each log folder shows its latest run: a later event file replaces the steps it repeats (a resumed run "
            "continues the curve, a run started over replaces it). x axes count iterations or epochs, as named."
        )
        lines.append("")

    if datalist is not None:
        lines += ["## Predictions", ""]
        pred_dir = os.path.join(folder, "predictions")
        entries = check_datalist(datalist)
        found, missing = pair_predictions(entries, pred_dir)
        shapes = [prediction_size(p) for _, _, p in found]
        sizes = sort_sizes(f"{w}x{h}" for w, h in shapes)
        size = max(max(s) for s in shapes) if image_size is None else image_size
        metrics_csv = os.path.join(folder, "metrics.csv")
        has_csv = os.path.isfile(metrics_csv)
        n = plot_overlays(entries, pred_dir, os.path.join(folder, "overlays.png"), num_images=num_images,
                          size=size, seed=seed, metrics_csv=metrics_csv if has_csv else None,
                          label_map=label_map)
        how = "best, worst and median Dice (metrics.csv), then spread over the ranking" if has_csv else (
            f"drawn at random (seed {seed})")
        lines += [
            "![Prediction overlays](overlays.png)",
            "",
            f"Ground-truth contour in green, predicted contour in red. {n} of {len(entries) - len(missing)} "
            f"image(s) with a prediction shown: {how}. {_overlay_scale_note(folder, size, sizes)}",
            "",
        ]
        if missing:
            lines.append(
                f"{len(missing)} of {len(entries)} image(s) had no prediction in `predictions/` and were skipped: "
                f"{list_names(missing)}."
            )
        lines.append("")

    if extra_lines:
        lines += ["## Notes", "", *[str(x) for x in extra_lines], ""]
    report = os.path.join(folder, "report.md")
    write_text_atomic(report, "\n".join(lines).rstrip("\n") + "\n")
    return report
