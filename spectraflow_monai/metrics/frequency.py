"""Frequency-band error of a segmentation: where in the spectrum the prediction's mistakes lie.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Fig. 1(d) and Sec. 1) observes that the errors of texture-biased models "mainly concentrate in
mid-to-high frequency components, which encode fine structural details". The paper gives no formula or band edges;
this module measures it as follows, per image and channel of binary masks (2D, or 3D with the same formulas):

- error map ``e = float(y_pred) - float(y)`` (values in {-1, 0, 1} for binary masks);
- error power spectrum ``E = |FFT(e)|^2 / N`` with ``N = H*W`` (``H*W*D`` in 3D) the number of pixels, so that by
  Parseval ``sum(E) = sum(e^2)``, the number of wrong pixels of a binary mask;
- radial frequency of each bin ``r = sqrt(fy^2 + fx^2)`` (``+ fz^2`` in 3D) with ``f = torch.fft.fftfreq(n)`` in
  cycles per pixel, ``0 <= r <= sqrt(2)/2`` (the corner bins lie beyond the axis Nyquist frequency 0.5);
- band ``k`` with edges ``band_edges[k] <= r < band_edges[k+1]``; the last band is closed, and when its upper edge is
  0.5 it also takes the corner bins ``r > 0.5``, so edges running from 0 to 0.5 partition the whole spectrum;
- the value of band ``k`` (``mode``): ``"energy"`` the sum of ``E`` over the band (pixels; the bands add up to the
  number of wrong pixels), ``"mean"`` that sum divided by ``N`` (the bands add up to the pixel error rate, comparable
  across image sizes), ``"fraction"`` that sum divided by ``sum(E)`` (the share of the error energy in the band; NaN
  when the masks agree everywhere, so such images are left out of the mean as MONAI does with undefined values).

Default band edges ``(0.0, 0.05, 0.15, 0.5)`` (:data:`DEFAULT_BAND_EDGES`): low (periods longer than 20 pixels: the
coarse shape and misplaced blobs), mid (periods 6.7-20 pixels) and high (periods shorter than 6.7 pixels, and the
corners: boundary jitter one or two pixels wide), at the paper's 224² evaluation size.

- :func:`compute_frequency_band_error`: the functional form, ``(B, C, n_bands)``;
- :class:`FrequencyBandError`: a MONAI ``CumulativeIterationMetric`` (``reduction``, ``get_not_nans``);
- :class:`spectraflow_monai.handlers.FrequencyBandErrorHandler`: its ignite handler for a bundle's
  ``validate#additional_metrics``, one band (``band``, the highest by default) as the scalar. Lower is better.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from monai.metrics import CumulativeIterationMetric
from monai.metrics.utils import do_metric_reduction, ignore_background
from monai.utils import MetricReduction

__all__ = [
    "DEFAULT_BAND_EDGES",
    "FREQUENCY_BAND_MODES",
    "check_band_edges",
    "radial_frequency",
    "frequency_band_masks",
    "compute_frequency_band_error",
    "FrequencyBandError",
]

#: default band edges (normalised radial frequency, cycles/pixel): low [0, 0.05), mid [0.05, 0.15), high [0.15, 0.5].
DEFAULT_BAND_EDGES: tuple[float, ...] = (0.0, 0.05, 0.15, 0.5)
#: the accepted values of ``mode``.
FREQUENCY_BAND_MODES: tuple[str, ...] = ("energy", "mean", "fraction")


def check_band_edges(band_edges: Any) -> tuple[float, ...]:
    """Validate band edges: at least two finite, strictly increasing numbers in [0, 0.5].

    Raises:
        ValueError: naming ``band_edges`` and its value.
    """
    try:
        edges = tuple(float(v) for v in band_edges)
    except (TypeError, ValueError):
        raise ValueError(f"band_edges must be a sequence of numbers, got {band_edges!r}.") from None
    if len(edges) < 2:
        raise ValueError(f"band_edges must hold at least two edges (one band), got {band_edges!r}.")
    if not all(math.isfinite(v) and 0.0 <= v <= 0.5 for v in edges):
        raise ValueError(f"band_edges must lie in [0, 0.5] cycles/pixel, got {band_edges!r}.")
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"band_edges must be strictly increasing, got {band_edges!r}.")
    return edges


def radial_frequency(
    spatial_shape: Sequence[int], device: torch.device | str | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``r = sqrt(sum_i f_i^2)`` of every bin of an unshifted FFT of ``spatial_shape`` (cycles/pixel)."""
    freqs = [torch.fft.fftfreq(int(n), device=device, dtype=dtype) for n in spatial_shape]
    grids = torch.meshgrid(*freqs, indexing="ij")
    return torch.sqrt(sum(g**2 for g in grids))  # type: ignore[arg-type]


def frequency_band_masks(
    spatial_shape: Sequence[int],
    band_edges: Sequence[float] = DEFAULT_BAND_EDGES,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean masks ``(n_bands, *spatial_shape)`` of the FFT bins in each band (see the module docstring)."""
    edges = check_band_edges(band_edges)
    r = radial_frequency(spatial_shape, device=device)
    masks = []
    for k, (lo, hi) in enumerate(zip(edges, edges[1:])):
        if k < len(edges) - 2:
            masks.append((r >= lo) & (r < hi))
        elif hi >= 0.5:
            masks.append(r >= lo)  # the last band up to the corners
        else:
            masks.append((r >= lo) & (r <= hi))
    return torch.stack(masks)


def _check_mode(mode: Any) -> str:
    if mode not in FREQUENCY_BAND_MODES:
        raise ValueError(f"mode must be one of {list(FREQUENCY_BAND_MODES)}, got {mode!r}.")
    return str(mode)


def compute_frequency_band_error(
    y_pred: torch.Tensor,
    y: torch.Tensor,
    band_edges: Sequence[float] = DEFAULT_BAND_EDGES,
    mode: str = "energy",
    include_background: bool = True,
) -> torch.Tensor:
    """Error energy of ``y_pred`` against ``y`` in each radial frequency band.

    Args:
        y_pred: binarised prediction ``(B, C, H, W[, D])`` (one-hot, or one foreground channel); other real values
            are used as they are (``e = y_pred - y``).
        y: ground truth of the same shape.
        band_edges: band edges in cycles/pixel, strictly increasing in [0, 0.5]. Defaults to
            :data:`DEFAULT_BAND_EDGES` (low / mid / high).
        mode: ``"energy"``, ``"mean"`` or ``"fraction"`` (see the module docstring). Defaults to ``"energy"``.
        include_background: whether channel 0 is scored. Defaults to ``True`` (single-channel binary output).

    Returns:
        float32 tensor ``(B, C, n_bands)`` on the device of ``y_pred``.

    Raises:
        ValueError: shapes differ or are not 4D/5D, bad ``band_edges`` or ``mode``.
    """
    edges = check_band_edges(band_edges)
    mode = _check_mode(mode)
    if not isinstance(y_pred, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"y_pred and y must be torch tensors, got {type(y_pred).__name__} and {type(y).__name__}.")
    if y_pred.shape != y.shape or y_pred.ndim not in (4, 5):
        raise ValueError(
            f"y_pred and y must share a (B, C, H, W[, D]) shape, got {tuple(y_pred.shape)} and {tuple(y.shape)}."
        )
    if not include_background:
        y_pred, y = ignore_background(y_pred=y_pred, y=y)
    device = y_pred.device
    e = torch.as_tensor(y_pred).detach().to(torch.float64) - torch.as_tensor(y).detach().to(device, torch.float64)
    spatial = tuple(e.shape[2:])
    dims = tuple(range(2, e.ndim))
    n = math.prod(spatial)
    power = torch.fft.fftn(e, dim=dims).abs() ** 2 / n  # (B, C, *spatial); sum over bins == sum(e**2)
    masks = frequency_band_masks(spatial, edges, device=device).to(torch.float64)  # (K, *spatial)
    band = torch.einsum("bc...,k...->bck", power, masks)
    if mode == "mean":
        band = band / n
    elif mode == "fraction":
        total = power.sum(dim=dims).unsqueeze(-1)
        band = torch.where(total > 0, band / total.clamp_min(1e-300), torch.full_like(band, float("nan")))
    return band.to(torch.float32)


def _check_band(band: Any, n_bands: int) -> int | None:
    if band is None:
        return None
    if isinstance(band, bool) or not isinstance(band, int) or not -n_bands <= band < n_bands:
        raise ValueError(f"band must be None or a band index in [{-n_bands}, {n_bands - 1}], got {band!r}.")
    return band


class FrequencyBandError(CumulativeIterationMetric):
    """Error energy per radial frequency band (:func:`compute_frequency_band_error`) as a MONAI metric.

    Each iteration buffers ``(B, C, n_bands)``; :meth:`aggregate` reduces over images and channels (NaN values, the
    ``"fraction"`` of images without error, left out) to ``(n_bands,)`` with ``reduction="mean"``, or to one band
    when ``band`` is given.

    Example::

        metric = FrequencyBandError(band_edges=(0.0, 0.05, 0.15, 0.5))
        metric(y_pred=pred_onehot, y=label_onehot)
        low, mid, high = metric.aggregate().tolist()

    Args:
        band_edges: band edges in cycles/pixel. Defaults to :data:`DEFAULT_BAND_EDGES`.
        mode: ``"energy"``, ``"mean"`` or ``"fraction"``. Defaults to ``"energy"``.
        include_background: whether channel 0 is scored. Defaults to ``True``.
        band: index of the band :meth:`aggregate` returns (``-1``: the highest); None returns every band.
            Defaults to None.
        reduction: MONAI reduction over the non-NaN values. Defaults to ``"mean"``.
        get_not_nans: whether ``aggregate`` also returns the count of non-NaN values. Defaults to ``False``.

    Raises:
        ValueError: bad ``band_edges``, ``mode`` or ``band``.
    """

    def __init__(
        self,
        band_edges: Sequence[float] = DEFAULT_BAND_EDGES,
        mode: str = "energy",
        include_background: bool = True,
        band: int | None = None,
        reduction: MetricReduction | str = MetricReduction.MEAN,
        get_not_nans: bool = False,
    ) -> None:
        super().__init__()
        self.band_edges = check_band_edges(band_edges)
        self.mode = _check_mode(mode)
        self.band = _check_band(band, len(self.band_edges) - 1)
        self.include_background = include_background
        self.reduction = reduction
        self.get_not_nans = get_not_nans

    def _compute_tensor(self, y_pred: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """``(B, C, n_bands)`` band values of ``y_pred`` and ``y`` of shape ``(B, C, *spatial)``."""
        return compute_frequency_band_error(y_pred, y, self.band_edges, self.mode, self.include_background)

    def aggregate(self, reduction: MetricReduction | str | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Reduce the buffered ``(N, C, n_bands)`` values over their non-NaN entries (then pick ``band``)."""
        data = self.get_buffer()
        if not isinstance(data, torch.Tensor):
            raise ValueError("the data to aggregate must be a PyTorch Tensor.")
        value, not_nans = do_metric_reduction(data.clone(), reduction or self.reduction)
        if self.band is not None:
            value, not_nans = value[..., self.band], not_nans[..., self.band]
        return (value, not_nans) if self.get_not_nans else value
