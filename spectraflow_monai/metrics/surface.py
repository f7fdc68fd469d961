"""95th-percentile Hausdorff distance (HD95) of one binary mask pair, in both definitions used in the literature.

SpectraFlow (Chen et al.) reports HD95 in pixels, computed per image at 224x224 and averaged over the evaluation set.
Two definitions of HD95 circulate and give different numbers on the same masks, so every value produced by this
package names its definition:

``"monai"``
    ``max(p95(d(pred -> gt)), p95(d(gt -> pred)))``, the maximum of the two *directed* 95th percentiles, as computed
    by :func:`monai.metrics.compute_hausdorff_distance` with ``percentile=95`` (and MONAI's ``HausdorffDistance``
    handler).
``"pooled"``
    ``p95(concat(d(pred -> gt), d(gt -> pred)))``, the 95th percentile of the surface distances of both directions
    pooled together. This is ``medpy.metric.binary.hd95``, used by TransUNet (Chen et al., 2021) for the Synapse
    multi-organ table and by most methods that copy its evaluation code.

Both use the same surface: the mask minus its erosion by the cross-shaped (connectivity-1) structuring element, with
everything outside the array treated as background, and Euclidean distances between surface points (scaled by
``spacing`` when given). Percentiles interpolate linearly (``numpy.percentile`` / ``torch.quantile`` default).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from monai.metrics import compute_dice, compute_hausdorff_distance

__all__ = [
    "HD95_DEFINITIONS",
    "HD95_SHORT_LABELS",
    "as_binary_numpy",
    "hd95_monai",
    "hd95_pooled",
    "image_diagonal",
    "transunet_case_metrics",
]

HD95_DEFINITIONS: dict[str, str] = {
    "monai": "max of the two directed 95th percentiles (monai.metrics.compute_hausdorff_distance, percentile=95)",
    "pooled": "95th percentile of the pooled surface distances of both directions (medpy hd95, TransUNet)",
}
#: short labels for report tables
HD95_SHORT_LABELS: dict[str, str] = {
    "monai": "max of the directed 95th percentiles (MONAI)",
    "pooled": "95th percentile of pooled distances (medpy/TransUNet)",
}


def as_binary_numpy(mask: np.ndarray | torch.Tensor, name: str = "mask") -> np.ndarray:
    """Return ``mask`` as a boolean numpy array (non-zero = foreground).

    Args:
        mask: numpy array or torch tensor (any device) of any numeric or boolean dtype.
        name: the argument name used in error messages.

    Raises:
        TypeError: when ``mask`` is neither a numpy array nor a torch tensor.
    """
    if isinstance(mask, torch.Tensor):
        return mask.detach().cpu().numpy() != 0
    if isinstance(mask, np.ndarray):
        return mask != 0
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(mask).__name__}.")


def _check_pair(pred: np.ndarray, gt: np.ndarray, spacing: float | Sequence[float] | None) -> np.ndarray:
    if pred.shape != gt.shape:
        raise ValueError(f"pred and gt must have the same shape, got {pred.shape} and {gt.shape}.")
    if pred.ndim not in (2, 3):
        raise ValueError(f"pred and gt must be 2D or 3D masks without batch/channel dims, got shape {pred.shape}.")
    if spacing is None:
        return np.ones(pred.ndim, dtype=np.float64)
    sp = np.atleast_1d(np.asarray(spacing, dtype=np.float64))
    if sp.size == 1:
        sp = np.repeat(sp, pred.ndim)
    if sp.size != pred.ndim or not np.all(np.isfinite(sp)) or np.any(sp <= 0):
        raise ValueError(f"spacing must be one positive number or {pred.ndim} positive numbers, got {spacing!r}.")
    return sp


def _surface(mask: np.ndarray) -> np.ndarray:
    from scipy.ndimage import binary_erosion, generate_binary_structure

    structure = generate_binary_structure(mask.ndim, 1)
    return mask ^ binary_erosion(mask, structure=structure, iterations=1, border_value=0)


def _surface_distances(pred: np.ndarray, gt: np.ndarray, spacing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Directed surface distances (pred -> gt, gt -> pred) of two non-empty boolean masks."""
    from scipy.ndimage import distance_transform_edt

    # Crop to the union's bounding box plus a one-pixel margin (clipped at the array border). Erosion treats the
    # outside as background either way, and all surface points lie inside the box, so distances are unchanged.
    union = pred | gt
    lo, hi = [], []
    for axis in range(union.ndim):
        other = tuple(a for a in range(union.ndim) if a != axis)
        idx = np.flatnonzero(union.any(axis=other))
        lo.append(max(int(idx[0]) - 1, 0))
        hi.append(min(int(idx[-1]) + 2, union.shape[axis]))
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    pred_s, gt_s = _surface(pred[box]), _surface(gt[box])
    d_pred_to_gt = distance_transform_edt(~gt_s, sampling=spacing)[pred_s]
    d_gt_to_pred = distance_transform_edt(~pred_s, sampling=spacing)[gt_s]
    return d_pred_to_gt, d_gt_to_pred


def image_diagonal(shape: Sequence[int], spacing: float | Sequence[float] | None = None) -> float:
    """Diagonal of an image or volume, the HD95 an empty prediction scores in the ``*_empty_as_diagonal`` variants.

    ``sqrt(sum_i (n_i * s_i) ** 2)`` over the spatial ``shape`` (``sqrt(H**2 + W**2)`` pixels in 2D, the volume
    diagonal in voxels, or in the units of ``spacing`` (e.g. mm) when given, like the HD95 values themselves).

    Args:
        shape: spatial shape, 2 or 3 sizes.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing).
    """
    size = np.asarray([int(n) for n in shape], dtype=np.float64)
    sp = np.ones_like(size) if spacing is None else np.atleast_1d(np.asarray(spacing, dtype=np.float64))
    if sp.size == 1:
        sp = np.repeat(sp, size.size)
    if sp.size != size.size or not np.all(np.isfinite(sp)) or np.any(sp <= 0):
        raise ValueError(f"spacing must be one positive number or {size.size} positive numbers, got {spacing!r}.")
    return float(np.sqrt(np.sum((size * sp) ** 2)))


def hd95_pooled(
    pred: np.ndarray | torch.Tensor, gt: np.ndarray | torch.Tensor, spacing: float | Sequence[float] | None = None
) -> float:
    """HD95 as the 95th percentile of the pooled surface distances of both directions (medpy / TransUNet).

    This is the definition of ``medpy.metric.binary.hd95`` used by TransUNet (Chen et al., "TransUNet: Transformers
    Make Strong Encoders for Medical Image Segmentation", 2021) and the Synapse results that follow its protocol.
    Surfaces are ``mask ^ erode(mask)`` (connectivity-1 structure, outside = background); distances come from
    ``scipy.ndimage.distance_transform_edt`` of the other mask's surface.

    Args:
        pred: binary 2D (H, W) or 3D (H, W, D) mask, numpy or torch; non-zero is foreground.
        gt: binary mask of the same shape.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing: pixels).

    Returns:
        The distance as a float, or NaN when either mask is empty (HD95 is undefined there; medpy raises instead).

    Raises:
        ValueError: when the shapes differ, the masks are not 2D/3D, or ``spacing`` is invalid.
    """
    p, g = as_binary_numpy(pred, "pred"), as_binary_numpy(gt, "gt")
    sp = _check_pair(p, g, spacing)
    if not p.any() or not g.any():
        return float("nan")
    d1, d2 = _surface_distances(p, g, sp)
    return float(np.percentile(np.concatenate([d1, d2]), 95))


def hd95_monai(
    pred: np.ndarray | torch.Tensor, gt: np.ndarray | torch.Tensor, spacing: float | Sequence[float] | None = None
) -> float:
    """HD95 as MONAI defines it: the maximum of the two directed 95th percentiles.

    A thin wrapper of :func:`monai.metrics.compute_hausdorff_distance` (``percentile=95``) for one mask pair.

    Args:
        pred: binary 2D (H, W) or 3D (H, W, D) mask, numpy or torch; non-zero is foreground.
        gt: binary mask of the same shape.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing: pixels).

    Returns:
        The distance as a float, or NaN when either mask is empty.

    Raises:
        ValueError: when the shapes differ, the masks are not 2D/3D, or ``spacing`` is invalid.
    """
    p, g = as_binary_numpy(pred, "pred"), as_binary_numpy(gt, "gt")
    sp = _check_pair(p, g, spacing)
    if not p.any() or not g.any():
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # MONAI-internal deprecation notice of get_mask_edges
        hd = compute_hausdorff_distance(
            torch.from_numpy(p)[None, None].float(),
            torch.from_numpy(g)[None, None].float(),
            include_background=True,
            percentile=95,
            spacing=sp.tolist() if spacing is not None else None,
        )
    return float(hd[0, 0])


def transunet_case_metrics(
    pred: np.ndarray | torch.Tensor, gt: np.ndarray | torch.Tensor, spacing: float | Sequence[float] | None = None
) -> tuple[float, float]:
    """Dice and HD95 of one class in one case, exactly as TransUNet's ``calculate_metric_percase``.

    TransUNet (Chen et al., 2021, ``utils.py``) binarises both masks (``> 0``) and returns:

    - both non-empty: ``(dice, hd95)`` with medpy's Dice and pooled HD95 (:func:`hd95_pooled`);
    - prediction non-empty, ground truth empty: ``(1, 0)``;
    - otherwise (prediction empty): ``(0, 0)``, including the case where both are empty.

    These conventions differ from :class:`~spectraflow_monai.metrics.SegmentationMetricSuite` (which leaves HD95
    undefined when a mask is empty); use this function only to reproduce the TransUNet-protocol Synapse table.

    Args:
        pred: binary 2D/3D mask (non-zero = foreground), numpy or torch.
        gt: mask of the same shape.
        spacing: voxel size; TransUNet uses unit spacing (voxels). Defaults to ``None``.

    Returns:
        ``(dice, hd95)`` as floats.
    """
    p, g = as_binary_numpy(pred, "pred"), as_binary_numpy(gt, "gt")
    _check_pair(p, g, spacing)
    if p.any() and g.any():
        dice = compute_dice(
            torch.from_numpy(p)[None, None].float(), torch.from_numpy(g)[None, None].float(), include_background=True
        )
        return float(dice[0, 0]), hd95_pooled(p, g, spacing)
    if p.any():
        return 1.0, 0.0
    return 0.0, 0.0
