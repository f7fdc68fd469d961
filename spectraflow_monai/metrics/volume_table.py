"""The organ-wise Synapse table of SpectraFlow: per-case organ metrics collected, averaged and reported.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") reports per-organ DSC on the Synapse test volumes following TransUNet. :class:`VolumeMetricTable`
collects the :func:`~spectraflow_monai.metrics.organ_metrics` of every case and writes the per-case CSV and the
per-organ Markdown table (organs by name in the order of the paper's table, a mean row, the HD95 definitions named).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from spectraflow_monai.metrics.reports import nanmean, volume_markdown, write_rows_csv
from spectraflow_monai.metrics.volume import VOLUME_METRIC_KEYS, check_organ_names, organ_metrics
from spectraflow_monai.utils.files import write_text_atomic

__all__ = ["VolumeMetricTable"]

_NAN_SKIPPED = ("dice", "hd95", "hd95_empty_as_diagonal")  # MONAI conventions: NaN = undefined, left out of the means


class VolumeMetricTable:
    """Collect per-case :func:`organ_metrics` and report the organ-wise Synapse table of SpectraFlow (Chen et al.).

    Per-organ values are averaged over cases (MONAI columns skip NaN, TransUNet columns are plain means, as in
    TransUNet's ``test.py``), and the mean row averages the organs. Write the per-case CSV with :meth:`to_csv`
    and the Markdown table with :meth:`to_markdown` / :meth:`save`.

    Example::

        table = VolumeMetricTable()
        for case, pred, label, spacing in results:
            table.add(case, pred, label, spacing)
        table.save("eval")  # eval/synapse_per_case.csv, eval/synapse_organs.md

    Args:
        num_classes: number of classes including background. Defaults to 9 (Synapse).
        organ_names: class names as in :func:`organ_metrics` (the Synapse organs:
            :data:`spectraflow_monai.apps.synapse.SYNAPSE_ORGANS`). Defaults to None (``class_<i>``).
        order: row order of the Markdown table: ``"class"`` (class index) or the organ names in table order (the
            SpectraFlow table: :data:`spectraflow_monai.apps.synapse.PAPER_ORGAN_ORDER`), used when they are the
            organs of the table (class order otherwise). Defaults to ``"class"``.
        display_names: ``{organ: name shown in the Markdown table}``
            (:data:`spectraflow_monai.apps.synapse.ORGAN_DISPLAY_NAMES`). Defaults to None (the organ names).
    """

    def __init__(
        self,
        num_classes: int = 9,
        organ_names: Sequence[str] | None = None,
        order: str | Sequence[str] = "class",
        display_names: Mapping[str, str] | None = None,
    ) -> None:
        self.organ_names = check_organ_names(organ_names, num_classes)
        if isinstance(order, str) and order != "class":
            raise ValueError(f"order must be 'class' or a sequence of organ names, got {order!r}.")
        if display_names is not None and not isinstance(display_names, Mapping):
            raise ValueError(f"display_names must be a mapping {{organ: shown name}}, got {display_names!r}.")
        self.num_classes = int(num_classes)
        self.display_names = dict(display_names or {})
        if not isinstance(order, str) and sorted(order) == sorted(self.organ_names):
            self.row_order = list(order)
        else:
            self.row_order = list(self.organ_names)
        self._cases: dict[str, dict[str, dict[str, float]]] = {}
        self._units: str | None = None

    def __len__(self) -> int:
        return len(self._cases)

    @property
    def cases(self) -> list[str]:
        """The recorded case ids, in insertion order."""
        return list(self._cases)

    def add(
        self,
        case: str,
        pred_volume: np.ndarray | torch.Tensor,
        label_volume: np.ndarray | torch.Tensor,
        spacing: float | Sequence[float] | None = None,
    ) -> dict[str, dict[str, float]]:
        """Score one case with :func:`organ_metrics` and record it; returns its per-organ metrics."""
        metrics = organ_metrics(pred_volume, label_volume, spacing, self.num_classes, self.organ_names)
        self.add_metrics(case, metrics, units="voxels" if spacing is None else "mm")
        return metrics

    def add_metrics(self, case: str, metrics: Mapping[str, Mapping[str, float]], units: str = "mm") -> None:
        """Record precomputed :func:`organ_metrics` output for ``case``.

        Args:
            case: case id (unique in the table).
            metrics: ``{organ: {metric: value}}`` with every organ of the table and :data:`VOLUME_METRIC_KEYS`.
            units: units of the MONAI ``hd95``: ``"mm"`` or ``"voxels"``; all cases must agree. Defaults to ``"mm"``.
        """
        case = str(case)
        if case in self._cases:
            raise ValueError(f"case {case!r} is already in the table.")
        if units not in ("mm", "voxels"):
            raise ValueError(f"units must be 'mm' or 'voxels', got {units!r}.")
        if self._units is not None and units != self._units:
            raise ValueError(f"case {case!r}: hd95 in {units} but earlier cases are in {self._units}; use one unit.")
        missing = [o for o in self.organ_names if o not in metrics]
        if missing:
            raise ValueError(f"case {case!r}: metrics lack organ(s) {missing}.")
        for o in self.organ_names:
            lack = [k for k in VOLUME_METRIC_KEYS if k not in metrics[o]]
            if lack:
                raise ValueError(f"case {case!r}, organ {o!r}: metrics lack {lack}.")
        self._units = units
        self._cases[case] = {o: dict(metrics[o]) for o in self.organ_names}

    def rows(self) -> list[dict[str, Any]]:
        """One row per case and organ: ``case``, ``organ`` and the metrics."""
        return [{"case": c, "organ": o, **m[o]} for c, m in self._cases.items() for o in self.organ_names]

    def summary(self) -> dict[str, Any]:
        """Per-organ means over cases and the mean over organs.

        Returns:
            ``{"organs": {organ: {metric: mean, "excluded": {metric: n_nan}, "hd95_dropped": n}},
            "mean": {metric: value}, "hd95_dropped": n, "num_cases": n, "hd95_units": "mm" | "voxels"}``;
            ``hd95_dropped`` counts the (case, organ) pairs with an empty prediction and a non-empty ground truth,
            left out of ``hd95`` and scored as the volume diagonal in ``hd95_empty_as_diagonal``.
        """
        organs: dict[str, dict[str, Any]] = {}
        for o in self.organ_names:
            entry: dict[str, Any] = {"excluded": {}}
            for k in VOLUME_METRIC_KEYS:
                entry[k], entry["excluded"][k] = nanmean([m[o][k] for m in self._cases.values()], k in _NAN_SKIPPED)
            entry["hd95_dropped"] = sum(1 for m in self._cases.values() if m[o]["pred_voxels"] == 0 < m[o]["gt_voxels"])
            organs[o] = entry
        mean = {k: nanmean([organs[o][k] for o in self.organ_names], k in _NAN_SKIPPED)[0] for k in VOLUME_METRIC_KEYS}
        dropped = sum(organs[o]["hd95_dropped"] for o in self.organ_names)
        return {
            "organs": organs,
            "mean": mean,
            "hd95_dropped": dropped,
            "num_cases": len(self._cases),
            "hd95_units": self._units or "mm",
        }

    def to_csv(self, path: str | os.PathLike) -> str:
        """Write the per-case rows (one per case and organ) to ``path`` atomically; returns the path."""
        return write_rows_csv(path, self.rows(), ["case", "organ", "gt_voxels", "pred_voxels", *VOLUME_METRIC_KEYS])

    def to_markdown(self, summary: Mapping[str, Any] | None = None) -> str:
        """The organ-wise table: one row per organ (display names), a mean row, then the metric definitions."""
        return volume_markdown(
            summary if summary is not None else self.summary(), self.row_order, VOLUME_METRIC_KEYS, self.display_names
        )

    def save(
        self,
        output_dir: str | os.PathLike,
        csv_name: str = "synapse_per_case.csv",
        markdown_name: str = "synapse_organs.md",
    ) -> dict[str, Any]:
        """Write the per-case CSV and the Markdown table into ``output_dir`` (atomically); returns the summary."""
        s = self.summary()
        os.makedirs(output_dir, exist_ok=True)
        self.to_csv(os.path.join(output_dir, csv_name))
        write_text_atomic(os.path.join(output_dir, markdown_name), self.to_markdown(s))
        return s
