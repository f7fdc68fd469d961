"""Per-image metrics of the SpectraFlow protocol: IoU, Dice, recall, precision and HD95 of a batch of binary masks.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Sec. "Datasets and Metrics") computes every metric per image at 224x224 and averages over the
evaluation set. :func:`compute_segmentation_metrics` gives the per-image, per-class values from ``monai.metrics``
(:func:`~monai.metrics.compute_dice`, :func:`~monai.metrics.compute_iou`, :func:`~monai.metrics.get_confusion_matrix`)
and the surface-distance core (:mod:`spectraflow_monai.metrics.surface`, both HD95 definitions);
:class:`~spectraflow_monai.metrics.SegmentationMetricSuite` keeps the rows and averages them.

Empty-mask conventions (argument ``empty``):

==============================  ===================  =========  ===========
case (per image and class)      ``"one"`` (default)  ``"nan"``  ``"monai"``
==============================  ===================  =========  ===========
both empty: Dice, IoU           1                    NaN        NaN
both empty: precision, recall   1                    NaN        NaN
gt empty, pred not: Dice, IoU   0                    0          NaN
gt empty, pred not: recall      0                    NaN        NaN
gt empty, pred not: precision   0                    0          0
pred empty, gt not: Dice, IoU   0                    0          0
pred empty, gt not: precision   0                    NaN        NaN
pred empty, gt not: recall      0                    0          0
either empty: HD95 (both defs)  NaN                  NaN        NaN
==============================  ===================  =========  ===========

``"one"`` scores a correct "nothing here" as perfect (the clinical reading) and every other undefined ratio (0/0) as
0, so an empty prediction is never rewarded. ``"nan"`` leaves every 0/0 ratio undefined. ``"monai"`` reproduces
MONAI's defaults (``ignore_empty=True``: Dice/IoU are NaN whenever the ground truth is empty; confusion-matrix ratios
are NaN when their denominator is 0), i.e. the values MONAI's ``MeanDice``/``MeanIoUHandler``/``ConfusionMatrix``
handlers average.

HD95 comes in two versions per definition. ``hd95_<definition>`` is undefined (NaN) whenever either mask is empty.
``hd95_<definition>_empty_as_diagonal`` scores a missed structure (prediction empty, ground truth not) with the image
diagonal (``sqrt(H**2 + W**2)`` pixels, the volume diagonal in 3D, in spacing units when ``spacing`` is given; see
:func:`~spectraflow_monai.metrics.surface.image_diagonal`); an empty ground truth stays undefined in both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from monai.metrics import compute_confusion_matrix_metric, compute_dice, compute_iou, get_confusion_matrix
from monai.networks.utils import one_hot

from spectraflow_monai.metrics.surface import HD95_DEFINITIONS, hd95_by_definition, image_diagonal

__all__ = [
    "EMPTY_CONVENTIONS",
    "METRIC_KEYS",
    "binarize_prediction",
    "check_hd95_definitions",
    "compute_segmentation_metrics",
    "segmentation_metric_keys",
]

EMPTY_CONVENTIONS = ("one", "nan", "monai")
#: per-image overlap metric keys, in CSV column order (HD95 keys follow for the selected definitions)
METRIC_KEYS = ("iou", "dice", "recall", "precision")


def binarize_prediction(
    logits: torch.Tensor | np.ndarray, sigmoid: bool = True, threshold: float = 0.5
) -> torch.Tensor:
    """Turn network outputs into the binary masks :func:`compute_segmentation_metrics` expects.

    Args:
        logits: (B, C, *spatial) network output. With C == 1 it is a foreground logit (or probability when
            ``sigmoid=False``) and the result is ``act(logits) > threshold`` with shape (B, 1, *spatial). With C > 1
            the result is the one-hot encoded argmax over channels, shape (B, C, *spatial).
        sigmoid: apply a sigmoid before thresholding (single channel only). Defaults to ``True``.
        threshold: foreground threshold for the single-channel case. Defaults to 0.5.

    Returns:
        A float tensor of 0/1 values.
    """
    x = torch.as_tensor(logits)
    if x.ndim < 3:
        raise ValueError(f"logits must have shape (B, C, *spatial), got {tuple(x.shape)}.")
    if x.shape[1] == 1:
        x = x.float()
        if sigmoid:
            x = torch.sigmoid(x)
        return (x > threshold).float()
    return one_hot(torch.argmax(x, dim=1, keepdim=True), num_classes=x.shape[1], dim=1)


def check_hd95_definitions(hd95: str | Sequence[str] | None) -> tuple[str, ...]:
    """Validate the ``hd95`` argument: a subset of ``("monai", "pooled")`` without repeats (``None``: none)."""
    defs = (hd95,) if isinstance(hd95, str) else tuple(hd95 or ())
    for d in defs:
        if d not in HD95_DEFINITIONS:
            raise ValueError(f"hd95 must be a subset of {tuple(HD95_DEFINITIONS)}, got {hd95!r}.")
    if len(set(defs)) != len(defs):
        raise ValueError(f"hd95 must not repeat a definition, got {hd95!r}.")
    return defs


def segmentation_metric_keys(hd95: Sequence[str]) -> tuple[str, ...]:
    """``iou, dice, recall, precision``, ``hd95_<definition>`` then ``hd95_<definition>_empty_as_diagonal``."""
    return METRIC_KEYS + tuple(f"hd95_{d}" for d in hd95) + tuple(f"hd95_{d}_empty_as_diagonal" for d in hd95)


def _apply_empty(value: torch.Tensor, den_empty: torch.Tensor, both_empty: torch.Tensor, empty: str) -> torch.Tensor:
    """Convention for a ratio whose denominator is empty (0/0)."""
    if empty == "one":
        fill = both_empty.to(value.dtype)
    else:
        fill = torch.full_like(value, float("nan"))
    return torch.where(den_empty, fill, value)


def compute_segmentation_metrics(
    y_pred: torch.Tensor,
    y: torch.Tensor,
    hd95: str | Sequence[str] | None = ("monai", "pooled"),
    empty: str = "one",
    spacing: float | Sequence[float] | None = None,
) -> dict[str, torch.Tensor]:
    """IoU, Dice, recall, precision and HD95 of every image and channel of binary masks.

    Args:
        y_pred: binary prediction ``(B, C, H, W[, D])`` (0/1; one foreground channel or one-hot), every channel
            scored.
        y: ground truth of the same shape.
        hd95: HD95 definition(s), ``"monai"`` and/or ``"pooled"``; ``None`` or ``()`` skips HD95. Defaults to both.
        empty: empty-mask convention, ``"one"``, ``"nan"`` or ``"monai"`` (see the module docstring). Defaults to
            ``"one"``.
        spacing: pixel/voxel size for HD95 and the diagonal, one number or one per axis. Defaults to ``None``
            (pixels).

    Returns:
        ``{key: (B, C) float64 tensor}`` for the keys of :func:`segmentation_metric_keys` and ``gt_area``,
        ``pred_area`` (foreground counts).

    Raises:
        ValueError: shapes differ or are not 4D/5D, bad ``hd95`` / ``empty`` / ``spacing``.
    """
    defs = check_hd95_definitions(hd95)
    if empty not in EMPTY_CONVENTIONS:
        raise ValueError(f"empty must be one of {EMPTY_CONVENTIONS}, got {empty!r}.")
    if y_pred.shape != y.shape or y_pred.ndim not in (4, 5):
        raise ValueError(f"y_pred and y must share a (B, C, H, W[, D]) shape, got {y_pred.shape} and {y.shape}.")
    p, g = y_pred.detach().cpu().double(), y.detach().cpu().double()
    cm = get_confusion_matrix(p, g, include_background=True)  # (B, C, 4): tp, fp, tn, fn
    tp, fp, fn = cm[..., 0].double(), cm[..., 1].double(), cm[..., 3].double()
    gt_area, pred_area = tp + fn, tp + fp
    gt_empty, pred_empty = gt_area == 0, pred_area == 0
    both = gt_empty & pred_empty
    ignore_empty = empty == "monai"
    out = {
        "gt_area": gt_area,
        "pred_area": pred_area,
        "iou": compute_iou(p, g, include_background=True, ignore_empty=ignore_empty).double(),
        "dice": compute_dice(p, g, include_background=True, ignore_empty=ignore_empty).double(),
        "recall": compute_confusion_matrix_metric("recall", cm).double(),
        "precision": compute_confusion_matrix_metric("precision", cm).double(),
    }
    if empty != "monai":
        out["dice"] = _apply_empty(out["dice"], both, both, empty)
        out["iou"] = _apply_empty(out["iou"], both, both, empty)
        out["precision"] = _apply_empty(out["precision"], pred_empty, both, empty)
        out["recall"] = _apply_empty(out["recall"], gt_empty, both, empty)
    diagonal = image_diagonal(p.shape[2:], spacing)  # validates spacing
    if defs:
        values = torch.full((len(defs), *p.shape[:2]), float("nan"), dtype=torch.float64)
        for b, c in np.ndindex(*p.shape[:2]):
            if not (gt_empty[b, c] or pred_empty[b, c]):
                hd = hd95_by_definition(p[b, c].numpy(), g[b, c].numpy(), defs, spacing)
                values[:, b, c] = torch.tensor([hd[d] for d in defs], dtype=torch.float64)
        missed = pred_empty & ~gt_empty
        for i, d in enumerate(defs):
            out[f"hd95_{d}"] = values[i]
            out[f"hd95_{d}_empty_as_diagonal"] = torch.where(missed, torch.full_like(values[i], diagonal), values[i])
    return out
