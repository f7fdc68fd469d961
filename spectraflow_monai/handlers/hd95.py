"""Validation handler of the HD95 that charges a missed structure the image diagonal.

MONAI's :class:`~monai.handlers.HausdorffDistance` leaves an image with an empty prediction out of the mean, so a
model that misses whole lesions can score a *better* mean HD95 than one that finds them roughly.
:class:`HD95EmptyAsDiagonal` attaches :class:`~spectraflow_monai.metrics.HD95EmptyAsDiagonalMetric` (the image
diagonal for such images, either HD95 definition) to an ignite engine, for a bundle's ``validate#additional_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from monai.handlers.ignite_metric import IgniteMetricHandler
from monai.utils import MetricReduction

from spectraflow_monai.metrics.hd95 import HD95EmptyAsDiagonalMetric, HD95Metric

__all__ = ["HD95", "HD95EmptyAsDiagonal"]


class HD95EmptyAsDiagonal(IgniteMetricHandler):
    """Validation handler of :class:`HD95EmptyAsDiagonalMetric` (for ``validate#additional_metrics``).

    Example (bundle YAML)::

        val_hd95_empty_as_diagonal:
          _target_: spectraflow_monai.handlers.HD95EmptyAsDiagonal
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


class HD95(IgniteMetricHandler):
    """MONAI's ``HausdorffDistance`` handler at the 95th percentile whose mean is NaN, not 0, when every image's
    HD95 is undefined (every prediction empty): :class:`~spectraflow_monai.metrics.HD95Metric`. MONAI's handler
    reports 0 then, the best possible value, for a model that segments nothing; evaluation reports NaN.

    Args:
        output_transform: maps ``engine.state.output`` to ``(y_pred, y)``. Defaults to identity.
        save_details: whether the per-image values go to ``engine.state.metric_details``. Defaults to ``True``.
        metric_kwargs: of MONAI's ``HausdorffDistanceMetric`` but ``percentile`` (``include_background``, default
            ``False``; ``reduction``, default ``"mean"``; ...).
    """

    def __init__(
        self, output_transform: Callable = lambda x: x, save_details: bool = True, **metric_kwargs: Any
    ) -> None:
        metric_fn = HD95Metric(**metric_kwargs)
        super().__init__(metric_fn=metric_fn, output_transform=output_transform, save_details=save_details)
