"""HD95 of batches in either definition, and the MONAI metric that charges a missed structure the image diagonal.

MONAI's :class:`~monai.handlers.HausdorffDistance` returns NaN when the prediction is empty and leaves that image out
of the mean, so a model that misses whole lesions can score a *better* mean HD95 than one that finds them roughly.
:class:`HD95EmptyAsDiagonalMetric` scores such an image (prediction empty, ground truth not) with the image diagonal
``sqrt(H**2 + W**2)`` (pixels; the volume diagonal in 3D; in the units of ``spacing`` when given), the largest
distance two points of the image can have; images with an empty ground truth stay undefined (NaN, left out of the
mean), as in MONAI. :func:`compute_hd95` is the functional form (both definitions, with or without the diagonal);
:class:`spectraflow_monai.handlers.HD95EmptyAsDiagonal` is the ignite handler for a bundle's
``validate#additional_metrics``. Every value comes from the surface-distance core
(:mod:`spectraflow_monai.metrics.surface`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from monai.metrics import CumulativeIterationMetric, HausdorffDistanceMetric
from monai.metrics.utils import do_metric_reduction, ignore_background
from monai.utils import MetricReduction

from spectraflow_monai.metrics.surface import HD95_DEFINITIONS, hd95_by_definition

__all__ = ["HD95EmptyAsDiagonalMetric", "HD95Metric", "compute_hd95", "reduce_defined"]


def compute_hd95(
    y_pred: torch.Tensor,
    y: torch.Tensor,
    definition: str = "monai",
    include_background: bool = True,
    spacing: float | Sequence[float] | None = None,
    empty_as_diagonal: bool = False,
) -> torch.Tensor:
    """HD95 of every image and channel of binarised one-hot ``y_pred`` and ``y`` of shape ``(B, C, *spatial)``.

    With ``definition="monai"`` and ``empty_as_diagonal=False`` this gives the values of
    ``monai.metrics.compute_hausdorff_distance(percentile=95)`` (NaN where a mask is empty).

    Args:
        y_pred: binarised prediction ``(B, C, H, W[, D])``.
        y: ground truth of the same shape.
        definition: ``"monai"`` or ``"pooled"`` (see :mod:`spectraflow_monai.metrics.surface`). Defaults to
            ``"monai"``.
        include_background: whether channel 0 is scored. Defaults to ``True``.
        spacing: pixel/voxel size, one number or one per axis. Defaults to ``None`` (pixels/voxels).
        empty_as_diagonal: an empty prediction of a non-empty ground truth scores the image diagonal instead of
            NaN. Defaults to ``False``.

    Returns:
        float32 tensor ``(B, C)`` on the device of ``y_pred``.

    Raises:
        ValueError: shapes differ or are not 4D/5D, bad ``definition`` or ``spacing``.
    """
    if definition not in HD95_DEFINITIONS:
        raise ValueError(f"definition must be one of {tuple(HD95_DEFINITIONS)}, got {definition!r}.")
    if y_pred.shape != y.shape or y_pred.ndim not in (4, 5):
        raise ValueError(f"y_pred and y must share a (B, C, H, W[, D]) shape, got {y_pred.shape} and {y.shape}.")
    if not include_background:
        y_pred, y = ignore_background(y_pred=y_pred, y=y)
    p, g = y_pred.detach().cpu() != 0, y.detach().cpu() != 0
    out = torch.empty(p.shape[:2], dtype=torch.float32)
    for b, c in np.ndindex(*p.shape[:2]):
        out[b, c] = hd95_by_definition(p[b, c], g[b, c], definition, spacing, empty_as_diagonal)[definition]
    return out.to(y_pred.device)


class HD95EmptyAsDiagonalMetric(CumulativeIterationMetric):
    """HD95 per image and channel in which an empty prediction of a non-empty ground truth scores the diagonal.

    Both masks non-empty: HD95 in the chosen definition (``"monai"``: max of the directed 95th percentiles, as
    ``monai.metrics.HausdorffDistanceMetric(percentile=95)``; ``"pooled"``: medpy/TransUNet). Prediction empty,
    ground truth not: :func:`~spectraflow_monai.metrics.surface.image_diagonal` of the spatial shape. Ground truth
    empty: NaN (undefined, left out of the reduction).

    Args:
        include_background: whether channel 0 is scored. Defaults to ``True`` (single-channel binary output).
        definition: ``"monai"`` or ``"pooled"``. Defaults to ``"monai"``.
        spacing: pixel/voxel size for distances and the diagonal. Defaults to ``None`` (pixels/voxels).
        reduction: MONAI reduction over the non-NaN values. Defaults to ``"mean"``.
        get_not_nans: whether ``aggregate`` also returns the count of non-NaN values. Defaults to ``False``.
    """

    def __init__(
        self,
        include_background: bool = True,
        definition: str = "monai",
        spacing: float | Sequence[float] | None = None,
        reduction: MetricReduction | str = MetricReduction.MEAN,
        get_not_nans: bool = False,
    ) -> None:
        super().__init__()
        if definition not in HD95_DEFINITIONS:
            raise ValueError(f"definition must be one of {tuple(HD95_DEFINITIONS)}, got {definition!r}.")
        self.include_background = include_background
        self.definition = definition
        self.spacing = spacing
        self.reduction = reduction
        self.get_not_nans = get_not_nans

    def _compute_tensor(self, y_pred: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """(B, C) HD95 of binarised one-hot ``y_pred`` and ``y`` of shape (B, C, *spatial)."""
        return compute_hd95(y_pred, y, self.definition, self.include_background, self.spacing, empty_as_diagonal=True)

    def aggregate(self, reduction: MetricReduction | str | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Reduce the buffered (N, C) values over their non-NaN entries."""
        data = self.get_buffer()
        if not isinstance(data, torch.Tensor):
            raise ValueError("the data to aggregate must be a PyTorch Tensor.")
        value, not_nans = reduce_defined(data, reduction or self.reduction)
        return (value, not_nans) if self.get_not_nans else value


def reduce_defined(data: torch.Tensor, reduction: MetricReduction | str) -> tuple[torch.Tensor, torch.Tensor]:
    """MONAI's ``do_metric_reduction`` over the non-NaN values, but NaN (not 0) where no value is defined.

    MONAI fills a reduction over only NaN values (every prediction empty, for HD95) with 0, which for a distance is
    the best possible score; here it stays NaN, as the evaluation reports it (:mod:`spectraflow_monai.metrics`).

    Returns:
        ``(reduced values, number of non-NaN values)``, as ``do_metric_reduction``.
    """
    value, not_nans = do_metric_reduction(data, reduction)
    if torch.is_tensor(value) and torch.is_tensor(not_nans) and value.is_floating_point():
        value = torch.where(not_nans > 0, value, torch.full_like(value, float("nan")))
    return value, not_nans


class HD95Metric(HausdorffDistanceMetric):
    """MONAI's ``HausdorffDistanceMetric`` at the 95th percentile (same arguments but ``percentile``) whose mean is
    NaN, not 0, when no image has a defined HD95 (every prediction empty): see :func:`reduce_defined`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(percentile=95, **kwargs)

    def aggregate(self, reduction: MetricReduction | str | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Reduce the buffered (N, C) values over their non-NaN entries (NaN where there is none)."""
        data = self.get_buffer()
        if not isinstance(data, torch.Tensor):
            raise ValueError("the data to aggregate must be a PyTorch Tensor.")
        value, not_nans = reduce_defined(data, reduction or self.reduction)
        return (value, not_nans) if self.get_not_nans else value
