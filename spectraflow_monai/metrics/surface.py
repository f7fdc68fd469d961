"""The surface-distance core behind every 95th-percentile Hausdorff distance (HD95) of the package, 2D and 3D.

SpectraFlow (Chen et al.) reports HD95 in pixels, computed per image at 224x224 and averaged over the evaluation set,
and the Synapse table follows TransUNet (Chen et al., 2021). Two definitions of HD95 circulate and give different
numbers on the same masks, so every value produced by this package names its definition:

``"monai"``
    ``max(p95(d(pred -> gt)), p95(d(gt -> pred)))``, the maximum of the two *directed* 95th percentiles, as computed
    by :func:`monai.metrics.compute_hausdorff_distance` with ``percentile=95`` (and MONAI's ``HausdorffDistance``
    handler).
``"pooled"``
    ``p95(concat(d(pred -> gt), d(gt -> pred)))``, the 95th percentile of the surface distances of both directions
    pooled together. This is ``medpy.metric.binary.hd95``, used by TransUNet for the Synapse multi-organ table and by
    most methods that copy its evaluation code.

One algorithm serves both definitions, 2D and 3D, with or without ``spacing``:

1. :func:`mask_surfaces`: crop both masks to the bounding box of their union plus a one-pixel margin (clipped at the
   array border; exact, since both masks are empty outside it and erosion treats the outside as background either
   way), then take each surface as ``mask ^ erode(mask)`` with the cross-shaped (connectivity-1) structuring element,
   as MONAI's :func:`~monai.metrics.utils.get_mask_edges` and medpy do.
2. :func:`surface_distances`: the Euclidean distance (coordinates scaled by ``spacing``) from every surface point of
   one mask to the nearest surface point of the other, by a nearest-neighbour query in a
   :class:`scipy.spatial.KDTree` over the other surface (as MONAI does on the CPU). Surface points shared by both
   surfaces are at distance 0 and are not queried.
3. :func:`hd95_from_distances`: the 95th percentile(s) with linear interpolation (``numpy.percentile`` /
   ``torch.quantile`` default).

A nearest-surface query costs in proportion to the number of surface points, a Euclidean distance transform in
proportion to the voxels of the box: on the liver of a 512x512x100 Synapse-size volume (a 203x226x82 box, 70k surface
voxels per mask, spacing 0.8x0.8x2.5 mm) the two anisotropic distance transforms of the MONAI HD95 alone take
0.8-1.2 s on one CPU core, the four KD-tree queries of both definitions (mm and voxels) about 0.65 s; so the KD-tree
is the one algorithm (see ``docs/method.md`` and ``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

__all__ = [
    "HD95_DEFINITIONS",
    "HD95_SHORT_LABELS",
    "as_binary_numpy",
    "check_spacing",
    "hd95",
    "hd95_by_definition",
    "hd95_from_distances",
    "hd95_monai",
    "hd95_pooled",
    "image_diagonal",
    "mask_surfaces",
    "surface_distances",
    "transunet_case_metrics",
    "union_box",
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

SpacingLike = float | Sequence[float] | np.ndarray | None


def as_binary_numpy(mask: np.ndarray | torch.Tensor, name: str = "mask") -> np.ndarray:
    """Return ``mask`` as a boolean numpy array (non-zero = foreground).

    Args:
        mask: numpy array or torch tensor (any device, MetaTensor included) of any numeric or boolean dtype.
        name: the argument name used in error messages.

    Raises:
        TypeError: when ``mask`` is neither a numpy array nor a torch tensor.
    """
    if isinstance(mask, torch.Tensor):
        mask = mask.as_tensor() if hasattr(mask, "as_tensor") else mask
        return mask.detach().cpu().numpy() != 0
    if isinstance(mask, np.ndarray):
        return mask != 0
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(mask).__name__}.")


def check_spacing(spacing: SpacingLike, ndim: int) -> tuple[float, ...] | None:
    """Validate a pixel/voxel size: ``None`` (unit spacing), one positive number or ``ndim`` positive numbers.

    Returns:
        ``None`` or a tuple of ``ndim`` floats.

    Raises:
        ValueError: naming ``spacing`` and its value.
    """
    if spacing is None:
        return None
    try:
        sp = np.atleast_1d(np.asarray(spacing, dtype=np.float64)).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"spacing must be one positive number or {ndim} positive numbers, got {spacing!r}.") from None
    if sp.size == 1:
        sp = np.repeat(sp, ndim)
    if sp.size != ndim or not np.all(np.isfinite(sp)) or np.any(sp <= 0):
        raise ValueError(f"spacing must be one positive number or {ndim} positive numbers, got {spacing!r}.")
    return tuple(float(s) for s in sp)


def image_diagonal(shape: Sequence[int], spacing: SpacingLike = None) -> float:
    """Diagonal of an image or volume, the HD95 an empty prediction scores in the ``*_empty_as_diagonal`` variants.

    ``sqrt(sum_i (n_i * s_i) ** 2)`` over the spatial ``shape`` (``sqrt(H**2 + W**2)`` pixels in 2D, the volume
    diagonal in voxels, or in the units of ``spacing`` (e.g. mm) when given, like the HD95 values themselves).

    Args:
        shape: spatial shape, 2 or 3 sizes.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing).
    """
    size = np.asarray([int(n) for n in shape], dtype=np.float64)
    sp = check_spacing(spacing, size.size)
    scale = np.ones_like(size) if sp is None else np.asarray(sp)
    return float(np.sqrt(np.sum((size * scale) ** 2)))


def union_box(
    boxes: Iterable[tuple[slice, ...] | None], shape: Sequence[int], margin: int = 1
) -> tuple[slice, ...] | None:
    """The bounding box of several boxes (``scipy.ndimage.find_objects`` slices; ``None`` = empty) plus ``margin``.

    The margin is clipped at the array border. Returns ``None`` when every box is ``None``.
    """
    found = [b for b in boxes if b is not None]
    if not found:
        return None
    return tuple(
        slice(max(min(b[d].start for b in found) - margin, 0), min(max(b[d].stop for b in found) + margin, shape[d]))
        for d in range(len(shape))
    )


def mask_surfaces(pred: np.ndarray, gt: np.ndarray, crop: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Surfaces ``mask ^ erode(mask)`` (cross-shaped structure, outside = background) of two boolean masks.

    Args:
        pred: boolean mask, 2D or 3D.
        gt: boolean mask of the same shape.
        crop: crop both masks to the bounding box of their union plus a one-pixel margin first (exact; the
            returned surfaces then have the shape of that box). ``False`` when the caller has cropped already.
            Defaults to ``True``.
    """
    from scipy.ndimage import binary_erosion, find_objects, generate_binary_structure

    if crop:
        box = union_box(find_objects((pred | gt).view(np.uint8)), pred.shape)
        if box is not None:
            pred, gt = pred[box], gt[box]
    structure = generate_binary_structure(pred.ndim, 1)
    return (
        pred ^ binary_erosion(pred, structure=structure, border_value=0),
        gt ^ binary_erosion(gt, structure=structure, border_value=0),
    )


def _nearest(
    src: np.ndarray, dst: np.ndarray, shared: np.ndarray, scale: np.ndarray | None, workers: int
) -> np.ndarray:
    from scipy.spatial import KDTree

    query = np.argwhere(src & ~shared).astype(np.float64)
    d = np.zeros(int(shared.sum()) + len(query))
    if len(query):
        target = np.argwhere(dst).astype(np.float64)
        if scale is not None:
            query, target = query * scale, target * scale
        # an unbalanced, non-compact tree builds and queries faster for one batched query (same exact distances)
        tree = KDTree(target, leafsize=32, balanced_tree=False, compact_nodes=False)
        d[len(d) - len(query) :] = tree.query(query, k=1, workers=workers)[0]
    return d


def surface_distances(
    edges_pred: np.ndarray, edges_gt: np.ndarray, spacing: SpacingLike = None, workers: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Directed surface distances ``(pred -> gt, gt -> pred)`` of two non-empty surfaces (see :func:`mask_surfaces`).

    Each entry is the Euclidean distance from one surface point to the nearest point of the other surface, with
    coordinates scaled by ``spacing``; points shared by both surfaces come first, at distance 0 (the order does not
    matter to percentiles).

    Args:
        edges_pred: boolean surface of the prediction.
        edges_gt: boolean surface of the ground truth, same shape.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing).
        workers: threads of the KD-tree queries (``-1``: all CPUs). Defaults to 1.
    """
    sp = check_spacing(spacing, edges_pred.ndim)
    scale = None if sp is None or all(s == 1.0 for s in sp) else np.asarray(sp)
    shared = edges_pred & edges_gt
    d_pred_to_gt = _nearest(edges_pred, edges_gt, shared, scale, workers)
    return d_pred_to_gt, _nearest(edges_gt, edges_pred, shared, scale, workers)


def hd95_from_distances(d_pred_to_gt: np.ndarray, d_gt_to_pred: np.ndarray, definition: str = "monai") -> float:
    """HD95 in ``definition`` (``"monai"`` or ``"pooled"``) from the two directed surface distance arrays."""
    if definition == "monai":
        return float(max(np.percentile(d_pred_to_gt, 95), np.percentile(d_gt_to_pred, 95)))
    if definition == "pooled":
        return float(np.percentile(np.concatenate([d_pred_to_gt, d_gt_to_pred]), 95))
    raise ValueError(f"definition must be one of {tuple(HD95_DEFINITIONS)}, got {definition!r}.")


def _check_definitions(definitions: str | Sequence[str]) -> tuple[str, ...]:
    defs = (definitions,) if isinstance(definitions, str) else tuple(definitions)
    for d in defs:
        if d not in HD95_DEFINITIONS:
            raise ValueError(f"definition must be one of {tuple(HD95_DEFINITIONS)}, got {definitions!r}.")
    return defs


def hd95_by_definition(
    pred: np.ndarray | torch.Tensor,
    gt: np.ndarray | torch.Tensor,
    definitions: str | Sequence[str] = ("monai", "pooled"),
    spacing: SpacingLike = None,
    empty_as_diagonal: bool = False,
    workers: int = 1,
) -> dict[str, float]:
    """HD95 of one mask pair in each of ``definitions``, from one surface extraction and one distance computation.

    Args:
        pred: binary 2D (H, W) or 3D (H, W, D) mask, numpy or torch; non-zero is foreground.
        gt: binary mask of the same shape.
        definitions: ``"monai"`` and/or ``"pooled"`` (see the module docstring). Defaults to both.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing: pixels).
        empty_as_diagonal: an empty prediction of a non-empty ground truth (a missed structure) scores
            :func:`image_diagonal` instead of NaN. Defaults to ``False``.
        workers: threads of the KD-tree queries (``-1``: all CPUs). Defaults to 1.

    Returns:
        ``{definition: value}``; NaN when either mask is empty (HD95 is undefined there; medpy raises instead),
        except for the missed structure with ``empty_as_diagonal``.

    Raises:
        ValueError: when the shapes differ, the masks are not 2D/3D, or ``definitions`` / ``spacing`` is invalid.
    """
    defs = _check_definitions(definitions)
    p, g = as_binary_numpy(pred, "pred"), as_binary_numpy(gt, "gt")
    if p.shape != g.shape:
        raise ValueError(f"pred and gt must have the same shape, got {p.shape} and {g.shape}.")
    if p.ndim not in (2, 3):
        raise ValueError(f"pred and gt must be 2D or 3D masks without batch/channel dims, got shape {p.shape}.")
    sp = check_spacing(spacing, p.ndim)
    p_any, g_any = bool(p.any()), bool(g.any())
    if not (p_any and g_any):
        value = image_diagonal(p.shape, sp) if (empty_as_diagonal and g_any) else float("nan")
        return {d: value for d in defs}
    distances = surface_distances(*mask_surfaces(p, g), sp, workers)
    return {d: hd95_from_distances(*distances, d) for d in defs}


def hd95(
    pred: np.ndarray | torch.Tensor,
    gt: np.ndarray | torch.Tensor,
    definition: str = "monai",
    spacing: SpacingLike = None,
    empty_as_diagonal: bool = False,
) -> float:
    """HD95 of one mask pair in one definition (:func:`hd95_by_definition` with one definition)."""
    if not isinstance(definition, str):
        raise ValueError(f"definition must be one of {tuple(HD95_DEFINITIONS)}, got {definition!r}.")
    return hd95_by_definition(pred, gt, definition, spacing, empty_as_diagonal)[definition]


def hd95_pooled(pred: np.ndarray | torch.Tensor, gt: np.ndarray | torch.Tensor, spacing: SpacingLike = None) -> float:
    """HD95 as the 95th percentile of the pooled surface distances of both directions (medpy / TransUNet).

    The definition of ``medpy.metric.binary.hd95`` used by TransUNet (Chen et al., "TransUNet: Transformers Make
    Strong Encoders for Medical Image Segmentation", 2021). NaN when either mask is empty (medpy raises).

    Args:
        pred: binary 2D (H, W) or 3D (H, W, D) mask, numpy or torch; non-zero is foreground.
        gt: binary mask of the same shape.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing: pixels).
    """
    return hd95(pred, gt, "pooled", spacing)


def hd95_monai(pred: np.ndarray | torch.Tensor, gt: np.ndarray | torch.Tensor, spacing: SpacingLike = None) -> float:
    """HD95 as MONAI defines it: the maximum of the two directed 95th percentiles.

    The value of :func:`monai.metrics.compute_hausdorff_distance` (``percentile=95``, same surfaces and spacing; MONAI
    computes in float32, so the two agree to about 1e-6 relative). NaN when either mask is empty.

    Args:
        pred: binary 2D (H, W) or 3D (H, W, D) mask, numpy or torch; non-zero is foreground.
        gt: binary mask of the same shape.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (unit spacing: pixels).
    """
    return hd95(pred, gt, "monai", spacing)


def transunet_case_metrics(
    pred: np.ndarray | torch.Tensor, gt: np.ndarray | torch.Tensor, spacing: SpacingLike = None
) -> tuple[float, float]:
    """Dice and HD95 of one class in one case, exactly as TransUNet's ``calculate_metric_percase``.

    TransUNet (Chen et al., 2021, ``utils.py``) binarises both masks (``> 0``) and returns:

    - both non-empty: ``(dice, hd95)`` with medpy's Dice ``2|A & B| / (|A| + |B|)`` and pooled HD95
      (:func:`hd95_pooled`);
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
    hd = hd95_pooled(p, g, spacing)  # validates shapes and spacing
    n_p, n_g = int(p.sum()), int(g.sum())
    if n_p and n_g:
        return 2.0 * int(np.count_nonzero(p & g)) / (n_p + n_g), hd
    if n_p:
        return 1.0, 0.0
    return 0.0, 0.0
