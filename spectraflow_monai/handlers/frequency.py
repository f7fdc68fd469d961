"""Validation handler of the frequency-band error of SpectraFlow (Chen et al., Fig. 1(d)).

:class:`FrequencyBandErrorHandler` attaches :class:`~spectraflow_monai.metrics.FrequencyBandError` (the error energy
of a prediction per radial frequency band, defined in :mod:`spectraflow_monai.metrics.frequency`) to an ignite
engine and reports one band as the scalar, for a bundle's ``validate#additional_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from monai.handlers.ignite_metric import IgniteMetricHandler
from monai.utils import MetricReduction

from spectraflow_monai.metrics.frequency import DEFAULT_BAND_EDGES, FrequencyBandError

__all__ = ["FrequencyBandErrorHandler"]


class FrequencyBandErrorHandler(IgniteMetricHandler):
    """Validation handler of :class:`~spectraflow_monai.metrics.FrequencyBandError`: the mean error energy of one band
    (lower is better).

    Example (bundle YAML, ``validate#additional_metrics``)::

        val_high_band_error:
          _target_: spectraflow_monai.handlers.FrequencyBandErrorHandler
          band_edges: [0.0, 0.05, 0.15, 0.5]
          band: -1
          output_transform: $monai.handlers.from_engine(['pred', 'label'])

    The per-image, per-channel values of every band go to ``engine.state.metric_details`` (``(N, C, n_bands)``)
    when ``save_details`` is on.

    Args:
        band_edges: band edges in cycles/pixel. Defaults to :data:`~spectraflow_monai.metrics.DEFAULT_BAND_EDGES`.
        band: index of the band reported (``-1``: the highest, ``0``: the lowest). Defaults to ``-1``.
        mode: ``"energy"``, ``"mean"`` or ``"fraction"``. Defaults to ``"energy"``.
        include_background: whether channel 0 is scored. Defaults to ``True``.
        reduction: MONAI reduction over the non-NaN values. Defaults to ``"mean"``.
        output_transform: maps ``engine.state.output`` to ``(y_pred, y)``. Defaults to identity.
        save_details: whether the per-image values go to ``engine.state.metric_details``. Defaults to ``True``.
    """

    def __init__(
        self,
        band_edges: Sequence[float] = DEFAULT_BAND_EDGES,
        band: int = -1,
        mode: str = "energy",
        include_background: bool = True,
        reduction: MetricReduction | str = MetricReduction.MEAN,
        output_transform: Callable = lambda x: x,
        save_details: bool = True,
    ) -> None:
        if band is None:
            raise ValueError("band must be a band index (the handler reports one number), got None.")
        metric_fn = FrequencyBandError(band_edges, mode, include_background, band, reduction)
        super().__init__(metric_fn=metric_fn, output_transform=output_transform, save_details=save_details)
