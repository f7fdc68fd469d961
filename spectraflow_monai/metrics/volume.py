"""Organ-wise 3D metrics of one predicted label volume, for the Synapse multi-organ table of SpectraFlow.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Table "Organ-wise performance ... on the 3D Synapse dataset") reports per-organ DSC on the Synapse
test volumes following TransUNet (Chen et al., arXiv:2102.04306). :func:`organ_metrics` scores one predicted label
volume against its ground truth, per organ, in two conventions side by side:

``dice`` / ``hd95`` (MONAI)
    The values of :func:`monai.metrics.compute_dice` and :func:`monai.metrics.compute_hausdorff_distance`
    (``percentile=95``, the maximum of the two directed 95th percentiles), with the voxel ``spacing`` (mm). MONAI's
    empty conventions: Dice is NaN when the ground truth is empty (``ignore_empty=True``), HD95 is NaN when either
    mask is empty; NaNs are left out of the means.
``dice_transunet`` / ``hd95_transunet`` (TransUNet)
    TransUNet's ``calculate_metric_percase`` (:func:`spectraflow_monai.metrics.surface.transunet_case_metrics`):
    medpy Dice and the *pooled* 95th percentile of the surface distances of both directions, in voxels (unit
    spacing). Empty conventions: prediction non-empty and ground truth empty -> (1, 0); prediction empty -> (0, 0),
    including both empty. Means are plain means.

Every organ is scored on the bounding box of prediction and ground truth (plus a one-voxel margin), found for all
organs in one pass with :func:`scipy.ndimage.find_objects`; both HD95 definitions then come from one surface
extraction per organ with the surface-distance core of :mod:`spectraflow_monai.metrics.surface`, the same code
behind every HD95 of the package. On one CPU core, a 512x512x100 volume with 8 organs takes about 1.5 s
(``benchmarks/bench_synapse.py``).

:class:`~spectraflow_monai.metrics.VolumeMetricTable` collects cases and writes the per-case CSV and the per-organ
Markdown table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from spectraflow_monai.metrics.surface import (
    check_spacing,
    hd95_by_definition,
    hd95_from_distances,
    image_diagonal,
    mask_surfaces,
    surface_distances,
    transunet_case_metrics,
    union_box,
)

__all__ = [
    "VOLUME_METRIC_KEYS",
    "check_organ_names",
    "organ_metrics",
]

#: per-organ metric keys returned by :func:`organ_metrics`.
VOLUME_METRIC_KEYS: tuple[str, ...] = ("dice", "hd95", "dice_transunet", "hd95_transunet", "hd95_empty_as_diagonal")


def _as_label_volume(x: Any, name: str, num_classes: int) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach()
        x = x.as_tensor() if hasattr(x, "as_tensor") else x
        x = x.cpu().numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}.")
    while x.ndim > 3 and x.shape[0] == 1:  # drop leading batch / channel singletons
        x = x[0]
    if x.ndim not in (2, 3):
        raise ValueError(
            f"{name} must be a label map (H, W[, D]) optionally with leading singleton dims, got shape {x.shape}."
        )
    if x.size:
        lo, hi = x.min(), x.max()
        if lo < 0 or hi >= num_classes or (x.dtype.kind == "f" and not np.array_equal(x, np.rint(x))):
            bad = np.unique(x[(x < 0) | (x >= num_classes) | (x != np.rint(x))])[:10].tolist()
            raise ValueError(f"{name} must hold integer labels in [0, {num_classes - 1}], found {bad}.")
    dtype = np.uint8 if num_classes <= 256 else np.int32
    return x.astype(dtype, copy=False)


def check_organ_names(organ_names: Sequence[str] | None, num_classes: int) -> list[str]:
    """Names of the classes ``1..num_classes-1``.

    Args:
        organ_names: the foreground names, or all names with background first; ``None`` gives ``class_<i>`` (the
            Synapse organ names are :data:`spectraflow_monai.apps.synapse.SYNAPSE_ORGANS`).
        num_classes: number of classes including background 0.

    Raises:
        ValueError: ``num_classes`` is not an integer >= 2, or ``organ_names`` has the wrong length or repeats.
    """
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}.")
    if organ_names is None:
        return [f"class_{i}" for i in range(1, num_classes)]
    if isinstance(organ_names, str):
        raise ValueError(f"organ_names must be a sequence of names, got the string {organ_names!r}.")
    names = [str(n) for n in organ_names]
    if len(names) == num_classes:
        names = names[1:]
    if len(names) != num_classes - 1 or len(set(names)) != len(names):
        raise ValueError(
            f"organ_names must hold {num_classes - 1} (foreground) or {num_classes} distinct names, "
            f"got {organ_names!r}."
        )
    return names


def _both_hd95(
    p: np.ndarray, g: np.ndarray, spacing: tuple[float, ...] | None, fast: bool, workers: int
) -> tuple[float, float]:
    """(MONAI HD95 with ``spacing``, pooled HD95 in voxels) of two non-empty masks cropped to their union box."""
    if not fast:
        return hd95_by_definition(p, g, "monai", spacing)["monai"], hd95_by_definition(p, g, "pooled")["pooled"]
    edges = mask_surfaces(p, g, crop=False)  # one surface extraction for both definitions
    d_voxels = surface_distances(*edges, None, workers)
    d_spacing = d_voxels if spacing is None else surface_distances(*edges, spacing, workers)
    return hd95_from_distances(*d_spacing, "monai"), hd95_from_distances(*d_voxels, "pooled")


def organ_metrics(
    pred_volume: np.ndarray | torch.Tensor,
    label_volume: np.ndarray | torch.Tensor,
    spacing: float | Sequence[float] | None = None,
    num_classes: int = 9,
    organ_names: Sequence[str] | None = None,
    fast: bool = True,
    workers: int = 1,
) -> dict[str, dict[str, float]]:
    """Per-organ DSC and HD95 of one predicted label volume, in MONAI's and TransUNet's conventions.

    Args:
        pred_volume: predicted label map ``(H, W, D)`` (or 2D), integer values in ``[0, num_classes)``, numpy or
            torch; leading singleton batch/channel dims are dropped.
        label_volume: ground-truth label map of the same shape.
        spacing: voxel size (mm), one number or one per axis, used for the MONAI ``hd95``; None means unit
            spacing (voxels). TransUNet's ``hd95_transunet`` is always in voxels. Defaults to None.
        num_classes: number of classes including background 0. Defaults to 9 (Synapse).
        organ_names: names of the classes ``1..num_classes-1`` (or of all classes, background first), e.g.
            :data:`spectraflow_monai.apps.synapse.SYNAPSE_ORGANS`; None gives ``class_<i>``. Defaults to None.
        fast: when both masks of an organ are non-empty, extract the surfaces once and compute both HD95
            definitions from them. False computes each definition with its own call of
            :func:`~spectraflow_monai.metrics.surface.hd95_by_definition` (the same core; a check, not faster).
            Defaults to True.
        workers: threads of the KD-tree nearest-surface queries (``-1``: all CPUs). Defaults to 1.

    Returns:
        ``{organ: {"dice", "hd95", "dice_transunet", "hd95_transunet", "hd95_empty_as_diagonal", "gt_voxels",
        "pred_voxels"}}`` in class order; ``dice`` / ``hd95`` may be NaN (MONAI's undefined cases, see the module
        docstring); ``hd95_empty_as_diagonal`` scores a missed organ with the volume diagonal (units of ``hd95``).

    Raises:
        ValueError: shapes differ, values outside ``[0, num_classes)``, bad ``spacing`` / ``num_classes`` /
            ``organ_names`` / ``workers``.
    """
    from scipy.ndimage import find_objects

    names = check_organ_names(organ_names, num_classes)
    if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers == 0 or workers < -1:
        raise ValueError(f"workers must be a positive integer or -1, got {workers!r}.")
    pred = _as_label_volume(pred_volume, "pred_volume", num_classes)
    gt = _as_label_volume(label_volume, "label_volume", num_classes)
    if pred.shape != gt.shape:
        raise ValueError(f"pred_volume and label_volume must have the same shape, got {pred.shape} and {gt.shape}.")
    sp = check_spacing(spacing, pred.ndim)
    boxes_p = find_objects(pred, max_label=num_classes - 1)
    boxes_g = find_objects(gt, max_label=num_classes - 1)
    empty = np.zeros((1,) * pred.ndim, dtype=bool)
    diagonal = image_diagonal(pred.shape, sp)  # a missed organ's hd95_empty_as_diagonal, in the units of hd95
    out: dict[str, dict[str, float]] = {}
    for c in range(1, num_classes):
        box = union_box((boxes_p[c - 1], boxes_g[c - 1]), pred.shape)
        p_c, g_c = (empty, empty) if box is None else (pred[box] == c, gt[box] == c)
        n_p, n_g = int(np.count_nonzero(p_c)), int(np.count_nonzero(g_c))
        if n_p and n_g:
            hd, hd_tu = _both_hd95(p_c, g_c, sp, fast, workers)
            dice = dice_tu = 2.0 * int(np.count_nonzero(p_c & g_c)) / (n_p + n_g)  # MONAI and medpy: the same ratio
        else:
            hd = float("nan")  # MONAI: undefined when a mask is empty
            dice = float("nan") if n_g == 0 else 0.0  # MONAI compute_dice(ignore_empty=True)
            dice_tu, hd_tu = transunet_case_metrics(p_c, g_c)  # TransUNet's empty-mask conventions
        out[names[c - 1]] = {
            "dice": float(dice),
            "hd95": float(hd),
            "dice_transunet": float(dice_tu),
            "hd95_transunet": float(hd_tu),
            "hd95_empty_as_diagonal": diagonal if (n_p == 0 and n_g > 0) else float(hd),
            "gt_voxels": n_g,
            "pred_voxels": n_p,
        }
    return out
