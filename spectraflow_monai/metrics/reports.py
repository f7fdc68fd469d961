"""Reports of the metric tables: NaN-aware means, the per-row CSV and the Markdown summaries.

Shared by :class:`~spectraflow_monai.metrics.SegmentationMetricSuite` (the per-image protocol of SpectraFlow, Chen et
al.) and :class:`~spectraflow_monai.metrics.VolumeMetricTable` (the organ-wise Synapse table). Overlap metrics are
printed in percent, HD95 in the units the values carry (pixels, voxels, mm or spacing units); every HD95 row names
its definition (:data:`~spectraflow_monai.metrics.surface.HD95_DEFINITIONS`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.metrics.surface import HD95_DEFINITIONS, HD95_SHORT_LABELS
from spectraflow_monai.utils.files import write_text_atomic

__all__ = [
    "SEGMENTATION_SUMMARY_NAMES",
    "nanmean",
    "segmentation_markdown",
    "volume_markdown",
    "write_rows_csv",
]

#: summary names of the per-image overlap metrics
SEGMENTATION_SUMMARY_NAMES = {"iou": "mIoU", "dice": "mDSC", "recall": "recall", "precision": "precision"}
_MARKDOWN_LABELS = {"mIoU": "mIoU", "mDSC": "mDSC", "recall": "Recall", "precision": "Precision"}

def nanmean(values: Sequence[float], skip_nan: bool = True) -> tuple[float, int]:
    """Mean of ``values`` and the number of NaNs left out (``skip_nan``); NaN when nothing is left."""
    arr = np.asarray(values, dtype=np.float64)
    if not skip_nan:
        return (float(arr.mean()) if arr.size else float("nan")), 0
    nan = np.isnan(arr)
    kept = arr[~nan]
    return (float(kept.mean()) if kept.size else float("nan")), int(nan.sum())


def write_rows_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """Write ``rows`` (the columns ``fields``; floats as ``%.6g``) to the CSV ``path`` atomically; returns the path."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in fields})
    write_text_atomic(path, buffer.getvalue())
    return os.fspath(path)


def _percent(v: float, digits: int = 2) -> str:
    return "nan" if math.isnan(v) else f"{100.0 * v:.{digits}f}"


def _distance(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.2f}"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def segmentation_markdown(summary: Mapping[str, Any], hd95: Sequence[str]) -> str:
    """The per-image protocol summary as Markdown: ``Metric | Value`` (overlap in %, HD95 naming its definition),
    the image count, the empty-mask convention, exclusions and, for multi-class input, a per-class table.

    Args:
        summary: :meth:`SegmentationMetricSuite.summary` output.
        hd95: the HD95 definitions in the summary.
    """
    s = summary
    units = s.get("units", "pixels")
    rows = [[f"{label} (%)", _percent(s[key])] for key, label in _MARKDOWN_LABELS.items()]
    rows += [[f"HD95, {d}: {HD95_SHORT_LABELS[d]} ({units})", _distance(s[f"hd95_{d}"])] for d in hd95]
    rows += [
        [f"HD95, {d}, empty prediction = image diagonal ({units})", _distance(s[f"hd95_{d}_empty_as_diagonal"])]
        for d in hd95
    ]
    lines = [f"**Warning:** {w}" for w in s.get("warnings", [])]
    lines += [""] if lines else []
    lines += _table(["Metric", "Value"], rows)
    lines += ["", f"Images: {s['num_images']}. Empty-mask convention: `{s['empty']}`."]
    if s.get("scoring"):
        lines.append(str(s["scoring"]))
    for d in hd95:
        lines.append(f"HD95 [{d}]: {s['excluded'][f'hd95_{d}']} image(s) excluded (prediction or ground truth empty).")
    if hd95:
        lines.append(
            f"HD95 dropped: {s['hd95_dropped']} image(s) with an empty prediction and a non-empty ground truth, "
            "left out of the HD95 rows above and scored as the image diagonal in the 'empty prediction' rows."
        )
    nan_overlap = {k: v for k, v in s["excluded"].items() if not k.startswith("hd95") and v}
    if nan_overlap:
        lines.append(f"Undefined (NaN) values excluded from the means: {nan_overlap}.")
    if "per_class" in s:
        head = ["Class", *(f"{_MARKDOWN_LABELS[k]} (%)" for k in _MARKDOWN_LABELS)]
        head += [f"HD95 [{d}] ({units})" for d in hd95]
        head += [f"HD95 [{d}, empty = diagonal] ({units})" for d in hd95]
        rows = []
        for c, m in s["per_class"].items():
            cells = [c, *(_percent(m[k]) for k in _MARKDOWN_LABELS), *(_distance(m[f"hd95_{d}"]) for d in hd95)]
            rows.append(cells + [_distance(m[f"hd95_{d}_empty_as_diagonal"]) for d in hd95])
        lines += ["", *_table(head, rows)]
    return "\n".join(lines) + "\n"


def volume_markdown(
    summary: Mapping[str, Any],
    row_order: Sequence[str],
    keys: Sequence[str],
    display_names: Mapping[str, str] | None = None,
) -> str:
    """The organ-wise Synapse table as Markdown: one row per organ (display names), a mean row, the definitions.

    Args:
        summary: :meth:`VolumeMetricTable.summary` output.
        row_order: organs in table order.
        keys: the metric keys, ``dice, hd95, dice_transunet, hd95_transunet, hd95_empty_as_diagonal``.
        display_names: ``{organ: name shown in the table}``; organs not in it are shown as they are. Defaults to None.
    """
    s = summary
    units = s["hd95_units"]
    head = ["Organ", "DSC (%)", f"HD95 ({units})", "DSC TransUNet (%)", "HD95 TransUNet (voxels)"]
    head.append(f"HD95, empty = diagonal ({units})")
    fmt = [lambda v: _percent(v, 1), _distance, lambda v: _percent(v, 1), _distance, _distance]
    shown = display_names or {}
    rows = [[shown.get(o, o), *(f(s["organs"][o][k]) for f, k in zip(fmt, keys))] for o in row_order]
    rows.append(["**Mean**", *(f(s["mean"][k]) for f, k in zip(fmt, keys))])
    excluded = {o: {k: n for k, n in s["organs"][o]["excluded"].items() if n} for o in row_order}
    excluded = {o: v for o, v in excluded.items() if v}
    lines = _table(head, rows)
    lines += [
        "",
        f"Cases: {s['num_cases']}.",
        f"- DSC, HD95 ({units}): MONAI `compute_dice` and `compute_hausdorff_distance(percentile=95)`; HD95 = "
        f"{HD95_DEFINITIONS['monai']}. Undefined values (empty ground truth for DSC, an empty mask for HD95) are "
        "left out of the means.",
        "- DSC TransUNet, HD95 TransUNet (voxels): TransUNet's `calculate_metric_percase`; HD95 = "
        f"{HD95_DEFINITIONS['pooled']}, unit spacing. Empty prediction -> (0, 0); empty ground truth with a "
        "non-empty prediction -> (1, 0).",
        f"- HD95, empty = diagonal ({units}): as HD95, but an organ missed by the prediction (prediction empty, "
        f"ground truth not) scores the volume diagonal instead of being left out; {s.get('hd95_dropped', 0)} "
        "(case, organ) pair(s) were missed.",
    ]
    if excluded:
        lines.append(f"- NaN values left out of the means (cases per organ and metric): {excluded}.")
    return "\n".join(lines) + "\n"
