"""An ignite handler that scores whole predicted volumes organ by organ during an evaluation (Synapse protocol).

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") reports organ-wise DSC on the Synapse test volumes, following TransUNet (Chen et al.,
arXiv:2102.04306). :class:`VolumeMetricsHandler` feeds every predicted label volume of an evaluation epoch, with its
ground truth and voxel spacing, to :class:`~spectraflow_monai.metrics.VolumeMetricTable` (per-organ DSC and HD95 in
MONAI's convention with the spacing in mm, and TransUNet's voxel-unit values), and writes the per-case CSV, the
organ-wise Markdown table and a JSON summary at the end of the epoch.

MONAI's ``HausdorffDistance`` handler has no spacing argument, so its HD95 is in voxels; this handler reads the
spacing of each volume from the affine of its label ``MetaTensor`` (``spacing="meta"``), or unit spacing for a volume
that its loader marks as carrying no geometry (:data:`SPACING_UNITS_KEY`: TransUNet's preprocessed volumes).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from monai.handlers.utils import from_engine
from monai.utils import IgniteInfo, min_version, optional_import

from spectraflow_monai.handlers.metric_suite import EvaluationReportHandler, name_from_path
from spectraflow_monai.metrics.volume_table import VolumeMetricTable
from spectraflow_monai.utils.files import write_text_atomic

if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["SPACING_UNITS_KEY", "VolumeMetricsHandler", "spacing_from_affine"]

#: the metadata key by which a loader marks a volume that carries no geometry (its affine is the identity by
#: convention, not a measurement): ``meta[SPACING_UNITS_KEY] == "voxels"``; ``spacing="meta"`` then scores it with
#: unit spacing and reports HD95 in voxels (TransUNet's preprocessed volumes,
#: :class:`~spectraflow_monai.apps.synapse.LoadSynapseH5d`)
SPACING_UNITS_KEY = "spacing_units"


def spacing_from_affine(affine: Any) -> tuple[float, ...]:
    """Voxel sizes (the column norms of the affine's rotation-zoom block), e.g. ``(0.8, 0.8, 2.5)`` mm.

    Args:
        affine: ``(N+1, N+1)`` affine matrix (numpy or torch).

    Raises:
        ValueError: ``affine`` is not a square matrix of size 3 or 4, or gives a zero / non-finite spacing.
    """
    a = affine.detach().cpu().numpy() if isinstance(affine, torch.Tensor) else np.asarray(affine)
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] not in (3, 4):
        raise ValueError(f"affine must be a 3x3 or 4x4 matrix, got shape {a.shape}.")
    n = a.shape[0] - 1
    sp = np.sqrt((a[:n, :n] ** 2).sum(axis=0))
    if not np.all(np.isfinite(sp)) or np.any(sp <= 0):
        raise ValueError(f"affine gives an invalid voxel spacing {sp.tolist()}:\n{a}")
    return tuple(float(s) for s in sp)


def _per_item(x: Any, what: str) -> list[torch.Tensor | np.ndarray]:
    """A decollated list of per-volume tensors, or a batch tensor split along its first axis."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return [x[i] for i in range(x.shape[0])]
    if isinstance(x, (list, tuple)) and x and all(isinstance(i, (torch.Tensor, np.ndarray)) for i in x):
        return list(x)
    raise ValueError(
        f"output_transform must give {what} as a batch tensor or a list of per-volume tensors, got {type(x).__name__}."
    )


class VolumeMetricsHandler(EvaluationReportHandler):
    """Per-organ DSC / HD95 of each evaluated volume; the SpectraFlow (Chen et al.) Synapse table at epoch end.

    Events: ``EPOCH_STARTED`` starts a new table, ``ITERATION_COMPLETED`` scores every volume of
    ``output_transform(engine.state.output)`` (label maps ``(1, H, W, D)`` of class ids, e.g. after
    ``AsDiscreted(argmax=True)`` and ``Invertd`` back to the ground truth's grid) with
    :func:`~spectraflow_monai.metrics.organ_metrics`, and ``EPOCH_COMPLETED`` writes ``csv_name`` (one row per case
    and organ), ``markdown_name`` (the organ-wise table, in the order of the paper's table, HD95 definitions named)
    and ``json_name`` into ``output_dir`` (atomically), logs the table and keeps the summary in
    :attr:`last_summary`.

    Case names: the ``name_key`` entry of each decollated batch item (the Synapse datalists carry ``"case"``), else
    the ``filename_or_obj`` of its MetaTensors' metadata shortened to the file name, else a running number.

    Args:
        output_dir: folder for the reports (created when missing).
        output_transform: maps ``engine.state.output`` to ``(pred, label)``, each a list of per-volume tensors or a
            batch tensor. Defaults to ``from_engine(["pred", "label"])``.
        batch_transform: maps ``engine.state.batch`` to what case names are read from. Defaults to identity.
        spacing: voxel spacing for the MONAI HD95: ``"meta"`` reads it from the affine of each label ``MetaTensor``
            (mm), unit spacing for a label its loader marks as without geometry (:data:`SPACING_UNITS_KEY`, HD95 in
            voxels); a number or one number per axis fixes it (mm); None uses unit spacing (HD95 in voxels, e.g. for
            TransUNet's preprocessed volumes, which carry no geometry). Defaults to ``"meta"``.
        name_key: item key holding the case name. Defaults to ``"case"``.
        num_classes: number of classes including background. Defaults to 9 (Synapse).
        organ_names: class names (see :func:`~spectraflow_monai.metrics.organ_metrics`). Defaults to None
            (``class_<i>``).
        order: row order of the table, ``"class"`` or the organ names in table order (see
            :class:`~spectraflow_monai.metrics.VolumeMetricTable`). Defaults to ``"class"``.
        display_names: ``{organ: name shown in the table}``. Defaults to None.
        csv_name: per-case CSV file name. Defaults to ``"synapse_per_case.csv"``.
        markdown_name: organ-wise table file name. Defaults to ``"synapse_organs.md"``.
        json_name: JSON summary file name, None to skip. Defaults to ``"synapse_summary.json"``.
        metric_prefix: when not None, the mean values over organs are put into ``engine.state.metrics`` as
            ``f"{metric_prefix}{metric}"`` (``mean_dice``, ``mean_hd95``, ``mean_dice_transunet``,
            ``mean_hd95_transunet``, ``mean_hd95_empty_as_diagonal``), with the count ``hd95_dropped``.
            Defaults to ``""``.

    Raises:
        ValueError: bad arguments; at run time, a prediction and label of different shapes, label values outside
            the classes, or ``spacing="meta"`` with a label that carries no affine (the message names the case).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        output_transform: Callable = from_engine(["pred", "label"]),
        batch_transform: Callable = lambda x: x,
        spacing: str | float | Sequence[float] | None = "meta",
        name_key: str = "case",
        num_classes: int = 9,
        organ_names: Sequence[str] | None = None,
        order: str | Sequence[str] = "class",
        display_names: Mapping[str, str] | None = None,
        csv_name: str = "synapse_per_case.csv",
        markdown_name: str = "synapse_organs.md",
        json_name: str | None = "synapse_summary.json",
        metric_prefix: str | None = "",
    ) -> None:
        super().__init__(output_dir, output_transform, batch_transform, name_key, json_name, metric_prefix)
        if isinstance(spacing, str) and spacing != "meta":
            raise ValueError(f"spacing must be 'meta', None, a number or a sequence of numbers, got {spacing!r}.")
        if spacing is not None and not isinstance(spacing, str):
            sp = np.atleast_1d(np.asarray(spacing, dtype=np.float64))
            if sp.ndim != 1 or not np.all(np.isfinite(sp)) or np.any(sp <= 0):
                raise ValueError(f"spacing must be positive, got {spacing!r}.")
        self.table = VolumeMetricTable(num_classes, organ_names, order, display_names)  # validates them
        self.spacing = spacing
        self.table_args = (num_classes, organ_names, order, display_names)
        self.csv_name, self.markdown_name = csv_name, markdown_name

    def epoch_started(self, engine: Engine) -> None:
        """Start a new table."""
        self.table = VolumeMetricTable(*self.table_args)

    def _names(self, engine: Engine, n: int) -> list[str]:
        data = self.batch_transform(engine.state.batch)
        items: list[Any]
        if isinstance(data, Mapping):  # a collated batch: per-key lists
            value = data.get(self.name_key)
            if isinstance(value, (list, tuple)):
                items = [{self.name_key: v} for v in value]
            else:
                items = [data] if n == 1 else []
        elif isinstance(data, (list, tuple)):
            items = list(data)
        else:
            items = []
        names = []
        for i in range(n):
            item = items[i] if i < len(items) and isinstance(items[i], Mapping) else {}
            name = item.get(self.name_key)
            if name is None:
                for key in ("label", "image", "pred"):
                    meta = getattr(item.get(key), "meta", None)
                    if isinstance(meta, Mapping) and meta.get("filename_or_obj"):
                        name = name_from_path(meta["filename_or_obj"])
                        name = name[: -len(".npy")] if name.endswith(".npy") else name  # TransUNet's .npy.h5
                        break
            names.append(str(name) if name is not None else f"volume_{len(self.table) + i:04d}")
        return names

    def _spacing(self, label: Any, case: str) -> Any:
        if self.spacing != "meta":
            return self.spacing
        units = getattr(label, "meta", {}).get(SPACING_UNITS_KEY)
        if (units[0] if isinstance(units, (list, tuple)) and units else units) == "voxels":
            return None  # no geometry: distances in voxels
        affine = getattr(label, "affine", None)
        if affine is None:
            raise ValueError(
                f"case {case}: spacing='meta' needs the label as a MetaTensor with an affine; got "
                f"{type(label).__name__} (pass spacing=None for voxel units or a fixed spacing)."
            )
        return spacing_from_affine(affine)

    def iteration_completed(self, engine: Engine) -> None:
        """Score the volumes of the iteration."""
        out = self.output_transform(engine.state.output)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("output_transform must return (pred, label).")
        preds, labels = _per_item(out[0], "pred"), _per_item(out[1], "label")
        if len(preds) != len(labels):
            raise ValueError(f"got {len(preds)} predictions for {len(labels)} labels.")
        for case, pred, label in zip(self._names(engine, len(preds)), preds, labels):
            spacing = self._spacing(label, case)
            if tuple(pred.shape) != tuple(label.shape):
                raise ValueError(
                    f"case {case}: the prediction has shape {tuple(pred.shape)} but the label {tuple(label.shape)}; "
                    "invert the preprocessing (Invertd) to the label's grid before scoring."
                )
            try:
                metrics = self.table.add(case, pred, label, spacing)
            except ValueError as e:
                raise ValueError(f"case {case}: {e}") from e
            dice = [m["dice"] for m in metrics.values() if not math.isnan(m["dice"])]
            engine.logger.info(
                "case %s: mean DSC %.4f over %d organ(s) present", case, float(np.mean(dice)) if dice else math.nan,
                len(dice),
            )  # fmt: skip

    def epoch_completed(self, engine: Engine) -> None:
        """Write the reports, log the table and publish the means in ``engine.state.metrics``."""
        if not len(self.table):
            engine.logger.warning("VolumeMetricsHandler: no volume was scored, no report written.")
            return
        summary = self.table.save(self.output_dir, self.csv_name, self.markdown_name)
        summary["cases"] = self.table.cases
        if self.json_name is not None:
            write_text_atomic(os.path.join(self.output_dir, self.json_name), json.dumps(summary, indent=1) + "\n")
        values = {**{f"mean_{k}": v for k, v in summary["mean"].items()}, "hd95_dropped": summary["hd95_dropped"]}
        title = f"Synapse organ-wise metrics ({len(self.table)} volume(s))"
        self.publish(engine, summary, title, self.table.to_markdown(summary), values)
