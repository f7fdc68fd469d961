"""HD95 that charges a missed structure the image diagonal, as a MONAI metric and a validation handler.

MONAI's :class:`~monai.handlers.HausdorffDistance` returns NaN when the prediction is empty and leaves that image out
of the mean, so a model that misses whole lesions can score a *better* mean HD95 than one that finds them roughly.
:class:`HD95EmptyAsDiagonalMetric` scores such an image (prediction empty, ground truth not) with the image diagonal
``sqrt(H**2 + W**2)`` (pixels; the volume diagonal in 3D; in the units of ``spacing`` when given), the largest
distance two points of the image can have; images with an empty ground truth stay undefined (NaN, left out of the
mean), as in MONAI. :class:`HD95EmptyAsDiagonal` is the ignite handler for a bundle's ``validate#additional_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from monai.handlers.ignite_metric import IgniteMetricHandler
from monai.metrics import CumulativeIterationMetric
from monai.metrics.utils import do_metric_reduction, ignore_background
from monai.utils import MetricReduction

from spectraflow_monai.metrics.surface import HD95_DEFINITIONS, hd95_monai, hd95_pooled, image_diagonal

__all__ = ["HD95EmptyAsDiagonal", "HD95EmptyAsDiagonalMetric"]


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
        if y_pred.shape != y.shape or y_pred.ndim not in (4, 5):
            raise ValueError(f"y_pred and y must share a (B, C, H, W[, D]) shape, got {y_pred.shape} and {y.shape}.")
        if not self.include_background:
            y_pred, y = ignore_background(y_pred=y_pred, y=y)
        p, g = y_pred.detach().cpu() != 0, y.detach().cpu() != 0
        diagonal = image_diagonal(p.shape[2:], self.spacing)
        hd_fn = hd95_monai if self.definition == "monai" else hd95_pooled
        out = torch.full(p.shape[:2], float("nan"), dtype=torch.float32)
        for b in range(p.shape[0]):
            for c in range(p.shape[1]):
                if not bool(g[b, c].any()):
                    continue
                out[b, c] = hd_fn(p[b, c], g[b, c], self.spacing) if bool(p[b, c].any()) else diagonal
        return out.to(y_pred.device)

    def aggregate(self, reduction: MetricReduction | str | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Reduce the buffered (N, C) values over their non-NaN entries."""
        data = self.get_buffer()
        if not isinstance(data, torch.Tensor):
            raise ValueError("the data to aggregate must be a PyTorch Tensor.")
        value, not_nans = do_metric_reduction(data, reduction or self.reduction)
        return (value, not_nans) if self.get_not_nans else value


class HD95EmptyAsDiagonal(IgniteMetricHandler):
    """Validation handler of :class:`HD95EmptyAsDiagonalMetric` (for ``validate#additional_metrics``).

    Example (bundle YAML)::

        val_hd95_empty_as_diagonal:
          _target_: spectraflow_monai.metrics.HD95EmptyAsDiagonal
          include_background: true
          output_transform: $monai.handlers.from_engine(['pred', 'label'])

    Args:
        include_background: whether channel 0 is scored. Defaults to ``True``.
        definition: ``"monai"`` or ``"pooled"``. Defaults to ``"monai"``.
        spacing: pixel/voxel size. Defaults to ``None`` (pixels/voxels).
        reduction: MONAI reduction over the non-NaN values. Defaults to ``"mean"``.
        output_transform: maps ``engine.state.output`` to ``(y_pred, y)``. Defaults to identity.
        save_details: whether the per-image values go to ``engine.state.metric_details``. Defaults to ``True``.
    """

    def __init__(
        self,
        include_background: bool = True,
        definition: str = "monai",
        spacing: float | Sequence[float] | None = None,
        reduction: MetricReduction | str = MetricReduction.MEAN,
        output_transform: Callable = lambda x: x,
        save_details: bool = True,
    ) -> None:
        metric_fn = HD95EmptyAsDiagonalMetric(include_background, definition, spacing, reduction)
        super().__init__(metric_fn=metric_fn, output_transform=output_transform, save_details=save_details)
