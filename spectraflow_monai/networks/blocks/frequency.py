"""Frequency indexing and Frequency Band Modulation (FBM) of FDConv.

Chen et al., "Frequency Dynamic Convolution for Dense Image Prediction", CVPR 2025. Two rules of the official code
(``Linwei-Chen/FDConv``, ``FDConv_detection/mmdet_custom/FDConv.py``) are reproduced bit for bit here, because their
float32 arithmetic decides which bins sit in which band:

- :func:`rfft2_frequency_order` / :func:`rfft2_band_index`: the order of the rfft2 bins by radial frequency that
  splits the Fourier disjoint weight into ``kernel_num`` bands (official ``get_fft2freq(d1, d2, use_rfft=True)``);
- :func:`fbm_lowpass_masks`: the L-infinity low-pass boxes of the frequency band modulation, computed on a fixed
  64x64 rfft grid and nearest-resized to the input's rfft grid (official ``_precompute_masks`` + ``F.interpolate``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "FrequencyBandModulation", "c2r_matrices", "check_k_list", "dft_matrices", "fbm_lowpass_masks", "fft_dtype",
    "rfft2_band_index", "rfft2_frequency_order",
]

#: rfft grid on which the official FBM masks are computed before being resized to the input (``max_size``)
FBM_MASK_SIZE = (64, 64)


def fft_dtype(dtype: torch.dtype) -> torch.dtype:
    """Real dtype the FFTs run in: float64 stays float64, everything else (bf16/fp16/fp32) runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_k_list(k_list: Sequence[float]) -> list[float]:
    """Validate the FBM low-pass divisors: a non-empty, strictly increasing sequence of positive numbers."""
    try:
        values = [float(v) for v in k_list]
    except (TypeError, ValueError):
        raise ValueError(f"fbm_k_list must be a sequence of positive numbers, got {k_list!r}.") from None
    if len(values) == 0 or any(v <= 0 for v in values) or any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(
            f"fbm_k_list must be a non-empty, strictly increasing sequence of positive numbers, got {k_list!r}."
        )
    return values


def _rfft2_frequency_grid(n_rows: int, n_cols: int) -> torch.Tensor:
    """float32 ``(n_rows, n_cols // 2 + 1, 2)`` grid of ``(fftfreq(n_rows), rfftfreq(n_cols))`` pairs (CPU)."""
    freq_h = torch.fft.fftfreq(n_rows, dtype=torch.float32)
    freq_w = torch.fft.rfftfreq(n_cols, dtype=torch.float32)
    return torch.stack(torch.meshgrid(freq_h, freq_w, indexing="ij"), dim=-1)


def rfft2_frequency_order(n_rows: int, n_cols: int) -> torch.Tensor:
    """The rfft2 bins of an ``n_rows x n_cols`` matrix sorted by radial frequency, as the official FDConv sorts them.

    Rule (official ``get_fft2freq(n_rows, n_cols, use_rfft=True)``): on CPU in float32, the grid
    ``stack(meshgrid(fftfreq(n_rows), rfftfreq(n_cols), indexing="ij"), dim=-1)`` gives the radius
    ``||(f_h, f_w)||_2`` over the last dimension; the flattened radii are ordered by ``torch.sort`` with its default
    ``stable=False``, and each flat index ``i`` becomes the pair ``(i // (n_cols // 2 + 1), i % (n_cols // 2 + 1))``.
    Equal radii (e.g. the bins at ``+f_h`` and ``-f_h``) are therefore ordered exactly as PyTorch's default CPU sort
    orders them, which is not the stable (index) order for more than a few dozen bins; the band boundaries of the
    Fourier disjoint weight follow this order.

    Args:
        n_rows: number of rows ``d1`` (``Cout * k`` for FDConv).
        n_cols: number of columns ``d2`` (``Cin * k``); the rfft keeps ``n_cols // 2 + 1`` of them.

    Returns:
        A ``(2, n_rows * (n_cols // 2 + 1))`` int64 tensor of (row, column) pairs, lowest frequency first.
    """
    width = n_cols // 2 + 1
    radius = torch.linalg.vector_norm(_rfft2_frequency_grid(n_rows, n_cols), dim=-1)  # == torch.norm(..., dim=-1)
    order = torch.sort(radius.reshape(-1)).indices
    return torch.stack([order // width, order % width], dim=0)


def rfft2_band_index(n_rows: int, n_cols: int, kernel_num: int) -> torch.Tensor:
    """Band of every rfft2 bin: :func:`rfft2_frequency_order` cut into ``kernel_num`` equal, contiguous pieces.

    The official layout is ``order.reshape(2, kernel_num, N // kernel_num)``: band ``n`` owns the bins at sorted
    positions ``n * N / kernel_num`` to ``(n + 1) * N / kernel_num - 1`` (low to high frequency).

    Args:
        n_rows: number of rows of the rearranged kernel.
        n_cols: number of columns of the rearranged kernel.
        kernel_num: number of bands; must divide ``N = n_rows * (n_cols // 2 + 1)``.

    Returns:
        An int64 ``(n_rows, n_cols // 2 + 1)`` map of band ids in ``[0, kernel_num)`` (CPU).

    Raises:
        ValueError: ``kernel_num`` does not divide the number of bins.
    """
    width = n_cols // 2 + 1
    n_bins = n_rows * width
    if kernel_num < 1 or n_bins % kernel_num != 0:
        raise ValueError(f"kernel_num must divide the {n_bins} rfft bins, got {kernel_num!r}.")
    order = rfft2_frequency_order(n_rows, n_cols)
    band = torch.empty(n_rows, width, dtype=torch.long)
    band[order[0], order[1]] = torch.arange(n_bins) // (n_bins // kernel_num)
    return band


def dft_matrices(
    n: int, dtype: torch.dtype, device: Optional[torch.device] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of ``2 pi j m / n`` for ``j, m`` in ``0..n-1``: the real and (negated) imaginary parts of the
    forward DFT matrix, computed in float64 and cast to ``dtype``."""
    idx = torch.arange(n, dtype=torch.float64, device=device)
    angle = (2.0 * math.pi / n) * torch.remainder(idx[:, None] * idx[None, :], float(n))
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def c2r_matrices(
    columns: int, n: int, dtype: torch.dtype, device: Optional[torch.device] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Bc, Bs)`` (``columns`` x ``n``) with ``irfft(Y, n)[m] = (Y.real @ Bc - Y.imag @ Bs)[m] * n`` for the first
    ``columns`` rfft bins of a length-``n`` signal (the other bins zero): ``w_j cos(2 pi j m / n)`` and
    ``w_j sin(2 pi j m / n)`` with ``w_j = 1`` for the zero and Nyquist bins and 2 otherwise; the imaginary parts of
    those two bins drop out (their sine is zero), as ``torch.fft.irfft`` ignores them."""
    j = torch.arange(columns, dtype=torch.float64, device=device)
    m = torch.arange(n, dtype=torch.float64, device=device)
    weight = torch.where((j == 0) | (2 * j == n), torch.ones_like(j), 2.0 * torch.ones_like(j))
    angle = (2.0 * math.pi / n) * torch.remainder(j[:, None] * m[None, :], float(n))
    return (weight[:, None] * torch.cos(angle)).to(dtype), (weight[:, None] * torch.sin(angle)).to(dtype)


def fbm_lowpass_masks(k_list: Sequence[float], mask_size: Sequence[int] = FBM_MASK_SIZE) -> torch.Tensor:
    """The official FBM low-pass boxes on the rfft grid of ``mask_size``, before resizing to an input.

    ``M_k[i, j] = 1[max(|fftfreq(h)[i]|, |rfftfreq(w)[j]|) < 0.5 / k + 1e-8]`` with the frequencies in float32 and the
    threshold rounded to float32 by the comparison. The ``1e-8`` survives the rounding for ``k = 4`` and ``k = 8``
    (``float32(0.125 + 1e-8) > 0.125``), so bins exactly on the edge ``|f| = 0.5 / k`` are kept there, but not for
    ``k = 2`` (``float32(0.25 + 1e-8) == 0.25``), where the edge bins are dropped.

    Args:
        k_list: low-pass divisors ``k``.
        mask_size: ``(h, w)`` of the grid (official ``max_size``). Defaults to ``(64, 64)``.

    Returns:
        A float32 ``(len(k_list), 1, h, w // 2 + 1)`` tensor of 0/1 values.
    """
    grid = _rfft2_frequency_grid(int(mask_size[0]), int(mask_size[1]))
    linf = grid.abs().amax(dim=-1)
    return torch.stack([(linf < 0.5 / float(k) + 1e-8).to(torch.float32) for k in k_list], dim=0).unsqueeze(1)


class FrequencyBandModulation(nn.Module):
    """FDConv's Frequency Band Modulation (FBM) of the input feature map.

    ``X = rfft2(x, norm="ortho")``; for each ``k`` in ``k_list`` a low-pass mask ``M_k`` on the rfft grid gives
    ``low_k = irfft2(X * M_k, s=(H, W))``. The bands are ``high_1 = x - low_{k_1}``,
    ``high_i = low_{k_{i-1}} - low_{k_i}`` and the lowest band ``low_{k_last}``; each high band is multiplied by a
    spatial map ``2 * sigmoid(conv3x3(x))`` and the lowest band is left unmodulated:
    ``FBM(x) = sum_i g_i * high_i + low_{k_last}``. It is evaluated in the algebraically equal form
    ``g_1 x + sum_i (g_{i+1} - g_i) low_{k_i} + (1 - g_last) low_{k_last}``, which returns ``x`` exactly (not only up
    to FFT round-off) when all gains are 1, as they are at initialisation (zero-initialised gain convolution).

    The masks follow the official code: L-infinity boxes ``max(|f_h|, |f_w|) < 0.5 / k + 1e-8`` computed in float32
    on the rfft grid of ``mask_size`` (64x64) by :func:`fbm_lowpass_masks` (edge bins ``|f| = 0.5 / k`` are kept for
    ``k = 4, 8`` and dropped for ``k = 2``, see there), then resized to the input's rfft grid ``(H, W // 2 + 1)`` with
    ``F.interpolate(mode="nearest")``. The resized box is still a prefix of the rfft columns, so only the kept columns
    are transformed along the height.

    Args:
        in_channels: input channels.
        k_list: strictly increasing low-pass divisors; band edges are at ``0.5 / k`` cycles per pixel.
            Defaults to ``(2, 4, 8)``.
        spatial_kernel: kernel size of the gain convolution. Defaults to 3.
        mask_size: grid the masks are computed on before the nearest resize (official ``max_size``).
            Defaults to ``(64, 64)``.
    """

    def __init__(
        self,
        in_channels: int,
        k_list: Sequence[float] = (2, 4, 8),
        spatial_kernel: int = 3,
        mask_size: Sequence[int] = FBM_MASK_SIZE,
    ) -> None:
        super().__init__()
        self.k_list = check_k_list(k_list)
        if len(mask_size) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in mask_size):
            raise ValueError(f"mask_size must be two positive ints, got {mask_size!r}.")
        base = fbm_lowpass_masks(self.k_list, mask_size)
        self.register_buffer("cached_masks", base, persistent=False)
        # the boxes are prefixes of the rfft columns: their length on the mask grid, kept on the host so that the
        # length after the resize to an input's grid is known without reading the device (no synchronisation)
        self.base_columns = int(base.shape[-1])
        self.base_kept_columns = int(base.amax(dim=(0, 1, 2)).gt(0).sum())
        # one Conv2d(Cin -> len(k_list)) equals the official list of Conv2d(Cin -> 1), one per band
        self.gain_conv = nn.Conv2d(in_channels, len(self.k_list), spatial_kernel, padding=spatial_kernel // 2)
        self.real_dft = False  # the transforms as real matrix products (exports), see _modulate_real
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.gain_conv.weight)
        if self.gain_conv.bias is not None:
            nn.init.zeros_(self.gain_conv.bias)

    def masks(self, height: int, width: int, device: Optional[torch.device] = None) -> torch.Tensor:
        """Low-pass masks ``(len(k_list), height, width // 2 + 1)`` (float32) on the rfft2 grid of ``(height, width)``:
        the 64x64-grid masks of :func:`fbm_lowpass_masks` nearest-resized as in the official code."""
        masks = F.interpolate(self.cached_masks.float(), size=[height, width // 2 + 1], mode="nearest")[:, 0]
        return masks if device is None else masks.to(device)

    @torch.jit.unused
    def kept_columns(self, columns: int) -> int:
        """The length of the masks' column prefix on an rfft grid of ``columns`` columns, as the nearest resize of
        :meth:`masks` gives it (PyTorch's nearest: source ``min(floor(j * float32(in / out)), in - 1)``, ``j // 2``
        for an exact doubling), computed on the host once per size."""
        cache = self.__dict__.setdefault("_kept_columns", {})
        if columns not in cache:
            size = self.base_columns
            if columns == size:
                src = np.arange(columns)
            elif columns == 2 * size:
                src = np.arange(columns) // 2
            else:
                scale = np.float32(size) / np.float32(columns)
                src = np.minimum(np.floor(np.arange(columns, dtype=np.float32) * scale).astype(np.int64), size - 1)
            cache[columns] = int((src < self.base_kept_columns).sum())
        return cache[columns]

    def _modulate(self, x: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        """FBM in float32 (float64 for double input), transforming along the height only the kept rfft columns."""
        height, width = x.shape[-2], x.shape[-1]
        work = x.to(fft_dtype(x.dtype))
        masks = self.masks(height, width).to(device=x.device, dtype=work.dtype)
        if torch.jit.is_scripting():  # the boxes are prefixes of the columns
            n_keep = int(masks.amax(dim=1).amax(dim=0).gt(0).sum())
        else:  # the same length, from the host: no device synchronisation
            n_keep = self.kept_columns(width // 2 + 1)
        gains = gains.to(work.dtype)
        coef = torch.cat([gains[:, 1:] - gains[:, :-1], 1.0 - gains[:, -1:]], dim=1)  # (B, L, H, W)
        if self.real_dft:
            return self._modulate_real(work, gains, coef, masks[:, :, :n_keep])
        spectrum = torch.fft.rfft(work, dim=-1, norm="ortho")[..., :n_keep]
        spectrum = torch.fft.fft(spectrum, dim=-2, norm="ortho")
        out = gains[:, :1] * work
        for idx in range(len(self.k_list)):
            low = torch.fft.ifft(spectrum * masks[idx, :, :n_keep], dim=-2, norm="ortho")
            low = torch.fft.irfft(low, n=width, dim=-1, norm="ortho")
            out = out + coef[:, idx : idx + 1] * low
        return out

    def _modulate_real(
        self, work: torch.Tensor, gains: torch.Tensor, coef: torch.Tensor, masks: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`_modulate` with the transforms written as real matrix products (``real_dft``): the same low-pass
        bands, no complex tensor (ONNX / TensorRT), ``O(H^2 W + H W^2)`` per channel instead of FFTs."""
        height, width, n_keep = work.shape[-2], work.shape[-1], masks.shape[-1]
        cos_w, sin_w = dft_matrices(width, work.dtype, work.device)
        cos_w, sin_w = cos_w[:, :n_keep] / math.sqrt(width), sin_w[:, :n_keep] / math.sqrt(width)
        cos_h, sin_h = dft_matrices(height, work.dtype, work.device)
        cos_h, sin_h = cos_h / math.sqrt(height), sin_h / math.sqrt(height)
        back_c, back_s = c2r_matrices(n_keep, width, work.dtype, work.device)
        back_c, back_s = back_c / math.sqrt(width), back_s / math.sqrt(width)
        z_re, z_im = work @ cos_w, -(work @ sin_w)  # rfft along the width (ortho), kept columns
        f_re = torch.matmul(cos_h, z_re) + torch.matmul(sin_h, z_im)  # fft along the height (ortho)
        f_im = torch.matmul(cos_h, z_im) - torch.matmul(sin_h, z_re)
        out = gains[:, :1] * work
        for idx in range(len(self.k_list)):
            g_re, g_im = f_re * masks[idx], f_im * masks[idx]
            l_re = torch.matmul(cos_h, g_re) - torch.matmul(sin_h, g_im)  # inverse fft along the height
            l_im = torch.matmul(sin_h, g_re) + torch.matmul(cos_h, g_im)
            low = l_re @ back_c - l_im @ back_s  # irfft along the width (ortho)
            out = out + coef[:, idx : idx + 1] * low
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gains = 2.0 * torch.sigmoid(self.gain_conv(x))  # (B, L, H, W)
        if torch.jit.is_scripting():  # TorchScript needs a constant autocast device
            out = self._modulate(x, gains)
        else:
            with torch.autocast(device_type=x.device.type, enabled=False):
                out = self._modulate(x, gains)
        return out.to(x.dtype)
