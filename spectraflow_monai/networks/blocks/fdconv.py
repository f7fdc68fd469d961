"""Frequency Dynamic Convolution (FDConv): the frequency-directional refinement convolution of SpectraFlow.

References:
    - Chen et al., "Frequency Dynamic Convolution for Dense Image Prediction", CVPR 2025 (FDConv).
    - Chen, Wang, Zou, Wu, "SpectraFlow" (Sec. "FDConv: Frequency-Directional Refinement"): FDConv replaces the
      first 3x3 convolution in the decoder refinement block to sharpen high-frequency boundary details.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

__all__ = ["FDConv2d"]

_SUPPORTED_KERNEL_SIZES = (1, 3)
_CONV_ARGS = (
    "in_channels",
    "out_channels",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "bias",
    "padding_mode",
    "device",
    "dtype",
)


def _fft_dtype(dtype: torch.dtype) -> torch.dtype:
    """Real dtype the FFTs run in: float64 stays float64, everything else (bf16/fp16/fp32) runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_k_list(k_list: Sequence[float]) -> list[float]:
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


class StarReLU(nn.Module):
    """StarReLU ``s * relu(x) ** 2 + b`` with learnable scalars (Yu et al., "MetaFormer Baselines", 2022).

    timm ships it only inside ``timm.models.metaformer`` (not in ``timm.layers``); this copy keeps timm optional.

    Args:
        scale: initial value of ``s``. Defaults to 1.0.
        bias: initial value of ``b``. Defaults to 0.0.
    """

    def __init__(self, scale: float = 1.0, bias: float = 0.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), float(scale)))
        self.bias = nn.Parameter(torch.full((1,), float(bias)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * F.relu(x).square() + self.bias


class KernelSpatialModulationGlobal(nn.Module):
    """Global branch of FDConv's Kernel Spatial Modulation (KSM) on the globally pooled input.

    Trunk ``Linear(Cin, A, bias=False) -> LayerNorm(A) -> StarReLU`` followed by four linear heads: channel
    (``Cin``), filter (``Cout``), spatial (``k*k``, only for ``k > 1``) and kernel-number (``kernel_num``, only for
    ``kernel_num > 1``) attentions. Channel, filter and spatial attentions are ``2 * sigmoid(logit / temperature)``;
    the kernel attention is ``2 * sigmoid(logit / kernel_temperature) / kernel_num``. All heads are zero-initialised,
    so at initialisation every attention is exactly 1 (kernel attention exactly ``1 / kernel_num``).

    Args:
        in_channels: input channels ``Cin``.
        out_channels: output channels ``Cout``.
        kernel_size: square kernel size ``k``.
        kernel_num: number of frequency bands ``kernel_num``.
        attention_channels: trunk width ``A``.
        temperature: temperature of the channel/filter/spatial attentions.
        kernel_temperature: temperature of the kernel attention.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        kernel_num: int,
        attention_channels: int,
        temperature: float = 1.0,
        kernel_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.kernel_num = kernel_num
        self.temperature = float(temperature)
        self.kernel_temperature = float(kernel_temperature)
        self.fc = nn.Linear(in_channels, attention_channels, bias=False)
        self.norm = nn.LayerNorm(attention_channels)
        self.act = StarReLU()
        self.channel_fc = nn.Linear(attention_channels, in_channels)
        self.filter_fc = nn.Linear(attention_channels, out_channels)
        self.spatial_fc = nn.Linear(attention_channels, kernel_size * kernel_size) if kernel_size > 1 else None
        self.kernel_fc = nn.Linear(attention_channels, kernel_num) if kernel_num > 1 else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming (fan-out) trunk as in the official code; all heads zero so that every attention starts at 1."""
        nn.init.kaiming_normal_(self.fc.weight, mode="fan_out", nonlinearity="relu")
        self.norm.reset_parameters()
        with torch.no_grad():
            self.act.scale.fill_(1.0)
            self.act.bias.fill_(0.0)
        for head in (self.channel_fc, self.filter_fc, self.spatial_fc, self.kernel_fc):
            if head is not None:
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def forward(
        self, pooled: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """
        Args:
            pooled: globally average-pooled input, shape ``(B, Cin)``.

        Returns:
            channel ``(B, Cin)``, filter ``(B, Cout)``, spatial ``(B, k, k)`` or None, kernel ``(B, kernel_num)``
            or None attentions.
        """
        hidden = self.act(self.norm(self.fc(pooled)))
        channel = 2.0 * torch.sigmoid(self.channel_fc(hidden) / self.temperature)
        filt = 2.0 * torch.sigmoid(self.filter_fc(hidden) / self.temperature)
        spatial: Optional[torch.Tensor] = None
        if self.spatial_fc is not None:
            spatial_logit = self.spatial_fc(hidden).reshape(-1, self.kernel_size, self.kernel_size)
            spatial = 2.0 * torch.sigmoid(spatial_logit / self.temperature)
        kernel: Optional[torch.Tensor] = None
        if self.kernel_fc is not None:
            kernel = 2.0 * torch.sigmoid(self.kernel_fc(hidden) / self.kernel_temperature) / self.kernel_num
        return channel, filt, spatial, kernel


class KernelSpatialModulationLocal(nn.Module):
    """Local branch of FDConv's Kernel Spatial Modulation: a dense, per-element kernel modulation (ECA-like).

    The pooled input ``(B, Cin)`` is layer-normalised and read by a ``Conv1d(1, Cout*k*k)`` sliding along the input
    channels (kernel ``round(log2(Cin) / 2 + 0.5) // 2 * 2 + 1``, i.e. 5 for 64-256 channels), giving one logit per
    kernel element; the modulation is ``2 * sigmoid(logit)``. The convolution is zero-initialised (modulation 1).

    Args:
        in_channels: input channels ``Cin``.
        out_channels: output channels ``Cout``.
        kernel_size: square kernel size ``k``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        eca_kernel = round(math.log2(in_channels) / 2 + 0.5) // 2 * 2 + 1
        self.norm = nn.LayerNorm(in_channels)
        self.conv = nn.Conv1d(
            1, out_channels * kernel_size * kernel_size, eca_kernel, padding=eca_kernel // 2, bias=False
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        nn.init.zeros_(self.conv.weight)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """Map the pooled input ``(B, Cin)`` to the modulation ``(B, Cout, Cin, k, k)``."""
        logits = self.conv(self.norm(pooled).unsqueeze(1))  # (B, Cout*k*k, Cin)
        k = self.kernel_size
        logits = logits.reshape(logits.shape[0], self.out_channels, k, k, logits.shape[-1]).permute(0, 1, 4, 2, 3)
        return 2.0 * torch.sigmoid(logits)


class FrequencyBandModulation(nn.Module):
    """FDConv's Frequency Band Modulation (FBM) of the input feature map.

    ``X = rfft2(x, norm="ortho")``; for each ``k`` in ``k_list`` an L-infinity box low-pass mask
    ``M_k = [max(|f_h|, |f_w|) < 0.5 / k]`` gives ``low_k = irfft2(X * M_k)``. The bands are
    ``high_1 = x - low_{k_1}``, ``high_i = low_{k_{i-1}} - low_{k_i}`` and the lowest band ``low_{k_last}``; each
    high band is multiplied by a spatial map ``2 * sigmoid(conv3x3(x))`` and the lowest band is left unmodulated:
    ``FBM(x) = sum_i g_i * high_i + low_{k_last}``. It is evaluated in the algebraically equal form
    ``g_1 x + sum_i (g_{i+1} - g_i) low_{k_i} + (1 - g_last) low_{k_last}``, which returns ``x`` exactly (not only up
    to FFT round-off) when all gains are 1, as they are at initialisation (zero-initialised gain convolution).

    Args:
        in_channels: input channels.
        k_list: strictly increasing low-pass divisors; band edges are at ``0.5 / k`` cycles per pixel.
            Defaults to ``(2, 4, 8)``.
        spatial_kernel: kernel size of the gain convolution. Defaults to 3.
    """

    def __init__(self, in_channels: int, k_list: Sequence[float] = (2, 4, 8), spatial_kernel: int = 3) -> None:
        super().__init__()
        self.k_list = _check_k_list(k_list)
        # one Conv2d(Cin -> len(k_list)) equals the official list of Conv2d(Cin -> 1), one per band
        self.gain_conv = nn.Conv2d(in_channels, len(self.k_list), spatial_kernel, padding=spatial_kernel // 2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.gain_conv.weight)
        if self.gain_conv.bias is not None:
            nn.init.zeros_(self.gain_conv.bias)

    def _kept_columns(self, width: int) -> list[int]:
        """Per band, how many leading rfft columns ``j`` pass ``j / width < 0.5 / k`` (a prefix of the rfft grid)."""
        counts: list[int] = []
        for k in self.k_list:
            counts.append(min(int(math.ceil(width / (2.0 * k))), width // 2 + 1))
        return counts

    def _kept_rows(self, height: int, k: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """0/1 vector over the ``height`` fft rows: ``|f_h| < 0.5 / k``."""
        index = torch.arange(height, device=device, dtype=torch.float64)
        return (2.0 * k * torch.minimum(index, height - index) < height).to(dtype)

    def masks(self, height: int, width: int, device: Optional[torch.device] = None) -> torch.Tensor:
        """Low-pass masks ``(len(k_list), height, width // 2 + 1)`` (float32) on the rfft2 grid of ``(height, width)``.

        ``M_k[i, j] = 1`` iff ``max(|f_h(i)|, |f_w(j)|) < 0.5 / k`` (strict, so a bin exactly on the edge is dropped).
        """
        device = torch.device("cpu") if device is None else device
        columns = torch.arange(width // 2 + 1, device=device)
        masks: list[torch.Tensor] = []
        for k, n_cols in zip(self.k_list, self._kept_columns(width)):
            rows = self._kept_rows(height, k, device, torch.float32)
            masks.append(rows[:, None] * (columns < n_cols).to(torch.float32)[None, :])
        return torch.stack(masks, dim=0)

    def _modulate(self, x: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        """FBM in float32 (float64 for double input); the L-infinity boxes are separable, so each low band is a
        prefix of the rfft columns times a set of rows, and only the kept columns are transformed along the height."""
        height, width = x.shape[-2], x.shape[-1]
        n_cols = self._kept_columns(width)
        work = x.to(_fft_dtype(x.dtype))
        gains = gains.to(work.dtype)
        coef = torch.cat([gains[:, 1:] - gains[:, :-1], 1.0 - gains[:, -1:]], dim=1)  # (B, L, H, W)
        spectrum = torch.fft.rfft(work, dim=-1, norm="ortho")[..., : max(n_cols)]
        spectrum = torch.fft.fft(spectrum, dim=-2, norm="ortho")
        out = gains[:, :1] * work
        for idx, k in enumerate(self.k_list):
            rows = self._kept_rows(height, k, x.device, work.dtype)
            low = torch.fft.ifft(spectrum[..., : n_cols[idx]] * rows[:, None], dim=-2, norm="ortho")
            low = torch.fft.irfft(low, n=width, dim=-1, norm="ortho")
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


class FDConv2d(nn.Conv2d):
    """Frequency Dynamic Convolution, a drop-in replacement for a 1x1 or 3x3 ``nn.Conv2d`` (``groups=1``).

    Chen et al., "Frequency Dynamic Convolution for Dense Image Prediction", CVPR 2025. In SpectraFlow (Chen, Wang,
    Zou, Wu), FDConv replaces the first 3x3 convolution in the decoder refinement block: it synthesises a
    sample-adaptive kernel ``W_eff(f) = F^{-1}(a(f) * W~)`` from learnable frequency-domain coefficients ``W~`` and
    convolves the input with it.

    - **Fourier Disjoint Weight (FDW).** The ``(Cout, Cin, k, k)`` kernel is rearranged to a ``(Cout*k) x (Cin*k)``
      matrix and stored only as its ``rfft2`` (parameter ``dft_weight`` of shape ``(Cout*k, Cin*k//2+1, 2)``, real and
      imaginary parts, divided by ``max(min(Cin, Cout) // 2, 1)``); there is no ``weight`` parameter. The rfft bins are
      sorted by radial frequency and split into ``kernel_num`` disjoint, equally sized bands (low to high). The
      per-sample kernel is ``irfft2(sum_n kernel_num * a_n * band_n(W~))``.
    - **Kernel Spatial Modulation (KSM).** Global branch (:class:`KernelSpatialModulationGlobal`) gives channel,
      filter, spatial and kernel-number attentions from the pooled input; local branch
      (:class:`KernelSpatialModulationLocal`) gives a dense per-element modulation. All multiply the kernel.
    - **Frequency Band Modulation (FBM)**, 3x3 only (:class:`FrequencyBandModulation`): spatially modulates the high
      frequency bands of the input before the convolution.

    At initialisation the layer computes exactly the static convolution with :meth:`static_weight` (up to float
    round-off), so :meth:`from_conv2d` converts a trained ``nn.Conv2d`` without changing its output. The per-sample
    kernels are applied with one grouped convolution (``groups=B``). FFTs run in float32 (float64 for double modules)
    with autocast disabled around them. A state dict holding a plain ``weight`` (e.g. from an ``nn.Conv2d``) is
    converted to ``dft_weight`` on load.

    If ``min(in_channels, out_channels) <= min_attention_channels`` (as in the official code) the layer has no dynamic
    part (no KSM, no FBM) and behaves exactly as an ``nn.Conv2d`` whose weight is :meth:`static_weight`; the FDW
    parametrisation is kept so the state dict and API are the same.

    Deviations from the official implementation (``Linwei-Chen/FDConv``, ``FDConv_detection/mmdet_custom/FDConv.py``):

    - Every attention head (channel, filter, spatial, kernel, local Conv1d, FBM gain conv) is zero-initialised, so
      the layer reproduces the static convolution exactly at initialisation. The official code uses N(0, 1e-6) /
      constant 1e-6 and, because its check tests a bound method, leaves ``filter_fc`` with Kaiming initialisation.
    - The global trunk uses LayerNorm over the pooled vector instead of BatchNorm2d on a 1x1 map (which fails for
      batch size 1 in training); trunk and heads are ``nn.Linear`` (equal to 1x1 convolutions on the pooled map).
    - ``irfft2`` gets the spatial size explicitly, so ``Cin*k`` may be odd; the band sort is stable (deterministic
      ties); the kernel mixing is a per-bin gather ``a[band(f)] * W~`` instead of a scatter into a zero map.
    - FBM masks are computed exactly on each input's rfft grid (the official code nearest-resizes 64x64 masks) with a
      strict edge ``|f| < 0.5 / k`` (the official ``+ 1e-8`` is lost in float32, so edge bins are dropped there too);
      the per-band gain convolutions are merged into one ``Conv2d(Cin, len(fbm_k_list), 3)``; FBM uses separable
      partial FFTs and an equivalent form that is exactly the identity at initialisation.
    - Only the sigmoid activations, ``param_ratio=1`` and ``param_reduction=1`` are implemented (the leading
      ``param_ratio`` axis of ``dft_weight`` is dropped); small-channel layers keep the FDW parametrisation.
    - ``padding=None`` (default) means ``dilation * (k // 2)``, i.e. "same" output size at stride 1.

    Notes:
        ``torch.jit.script`` works for any input size. ``torch.jit.trace`` works too, but the traced graph is
        specialised to the traced input shape (the batch size is the ``groups`` of the per-sample convolution).
        Code that initialises ``module.weight`` of every ``nn.Conv2d`` must skip this class (use
        :meth:`reset_parameters` or :meth:`from_conv2d`).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: 1 or 3 (int or a pair of equal ints). Defaults to 3.
        stride: as ``nn.Conv2d``. Defaults to 1.
        padding: as ``nn.Conv2d``; None means ``dilation * (kernel_size // 2)``. Defaults to None.
        dilation: as ``nn.Conv2d``. Defaults to 1.
        groups: must be 1. Defaults to 1.
        bias: whether to add a learnable bias. Defaults to True.
        padding_mode: as ``nn.Conv2d``. Defaults to ``"zeros"``.
        kernel_num: number of disjoint frequency bands; must divide the number of rfft bins
            ``Cout*k * (Cin*k // 2 + 1)`` (checked only when the layer is dynamic). Defaults to 4.
        reduction: KSM trunk width ratio, width ``max(int(Cin * reduction), min_attention_channels, 1)``.
            Defaults to 0.0625.
        min_attention_channels: minimum trunk width, and the layer is dynamic only when
            ``min(in_channels, out_channels) > min_attention_channels``. Defaults to 16.
        kernel_temperature: temperature of the kernel-number attention. Defaults to 1.0.
        temperature: temperature of the channel/filter/spatial attentions; None uses ``kernel_temperature``.
            Defaults to None.
        use_ksm_local: whether to use the local (dense) kernel modulation. Defaults to True.
        use_fbm: whether to use frequency band modulation (3x3 only). Defaults to True.
        fbm_k_list: strictly increasing FBM low-pass divisors. Defaults to ``(2, 4, 8)``.
        device: parameter device. Defaults to None.
        dtype: parameter dtype. Defaults to None.

    Example::

        conv = nn.Conv2d(64, 64, 3, padding=1)
        fd = FDConv2d.from_conv2d(conv)  # fd(x) == conv(x) until trained
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 3,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str | None = None,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        kernel_num: int = 4,
        reduction: float = 0.0625,
        min_attention_channels: int = 16,
        kernel_temperature: float = 1.0,
        temperature: float | None = None,
        use_ksm_local: bool = True,
        use_fbm: bool = True,
        fbm_k_list: Sequence[float] = (2, 4, 8),
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        k_pair = _pair(kernel_size)
        if len(k_pair) != 2 or k_pair[0] != k_pair[1] or k_pair[0] not in _SUPPORTED_KERNEL_SIZES:
            raise ValueError(
                f"kernel_size must be one of {_SUPPORTED_KERNEL_SIZES} (square), got {kernel_size!r}; "
                "FDConv2d is defined for 1x1 and 3x3 kernels."
            )
        k = int(k_pair[0])
        if groups != 1:
            raise ValueError(
                f"groups must be 1 for FDConv2d (grouped/depth-wise kernels are not supported), got {groups!r}."
            )
        if isinstance(kernel_num, bool) or not isinstance(kernel_num, int) or kernel_num < 1:
            raise ValueError(f"kernel_num must be a positive int, got {kernel_num!r}.")
        if not reduction > 0:
            raise ValueError(f"reduction must be > 0, got {reduction!r}.")
        if (
            isinstance(min_attention_channels, bool)
            or not isinstance(min_attention_channels, int)
            or min_attention_channels < 0
        ):
            raise ValueError(f"min_attention_channels must be a non-negative int, got {min_attention_channels!r}.")
        temperature = kernel_temperature if temperature is None else temperature
        for name, value in (("kernel_temperature", kernel_temperature), ("temperature", temperature)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}.")
        k_list = _check_k_list(fbm_k_list)
        if padding is None:
            padding = tuple(d * (k // 2) for d in _pair(dilation))

        dynamic = min(in_channels, out_channels) > min_attention_channels
        n_rows, n_cols = out_channels * k, in_channels * k
        n_bins = n_rows * (n_cols // 2 + 1)
        if dynamic and n_bins % kernel_num != 0:
            valid = [d for d in range(1, 129) if n_bins % d == 0]
            raise ValueError(
                f"kernel_num={kernel_num} must divide the number of rfft bins of the {n_rows}x{n_cols} "
                f"rearranged kernel ({n_rows} * {n_cols // 2 + 1} = {n_bins}); valid values up to 128: {valid}."
            )

        super().__init__(
            in_channels,
            out_channels,
            k,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=1,
            bias=bias,
            padding_mode=padding_mode,
            device=device,
            dtype=dtype,
        )
        self.kernel_num = kernel_num
        self.dynamic = dynamic
        self.dft_scale = float(max(min(in_channels, out_channels) // 2, 1))
        self.freq_size = (n_rows, n_cols)

        weight = self.weight.detach()
        del self.weight
        self.dft_weight = nn.Parameter(self._weight_to_dft(weight))

        self.ksm_global: KernelSpatialModulationGlobal | None = None
        self.ksm_local: KernelSpatialModulationLocal | None = None
        self.fbm: FrequencyBandModulation | None = None
        if not dynamic:
            self.register_buffer("band_index", None, persistent=False)
            return
        self.register_buffer("band_index", self._band_index(n_rows, n_cols, kernel_num, device), persistent=False)
        attention_channels = max(int(in_channels * reduction), min_attention_channels, 1)
        factory = {"device": device, "dtype": dtype}
        self.ksm_global = KernelSpatialModulationGlobal(
            in_channels, out_channels, k, kernel_num, attention_channels, temperature, kernel_temperature
        ).to(**factory)
        if use_ksm_local:
            self.ksm_local = KernelSpatialModulationLocal(in_channels, out_channels, k).to(**factory)
        if use_fbm and k == 3:
            self.fbm = FrequencyBandModulation(in_channels, k_list).to(**factory)

    # ----------------------------------------------------------------------------------------- FDW parametrisation
    @staticmethod
    def _band_index(n_rows: int, n_cols: int, kernel_num: int, device: torch.device | str | None) -> torch.Tensor:
        """Band id ``(n_rows, n_cols // 2 + 1)`` of every rfft2 bin: bins sorted by radius, split into equal bands."""
        freq_h = torch.fft.fftfreq(n_rows, dtype=torch.float64)
        freq_w = torch.fft.rfftfreq(n_cols, dtype=torch.float64)
        radius = torch.sqrt(freq_h[:, None] ** 2 + freq_w[None, :] ** 2).flatten()
        order = torch.sort(radius, stable=True).indices
        band = torch.empty_like(order)
        band[order] = torch.arange(order.numel()) // (order.numel() // kernel_num)
        return band.reshape(n_rows, n_cols // 2 + 1).to(device=device)

    def _weight_to_dft(self, weight: torch.Tensor) -> torch.Tensor:
        """FDW transform of a ``(Cout, Cin, k, k)`` kernel to ``dft_weight`` layout ``(Cout*k, Cin*k//2+1, 2)``."""
        expected = (self.out_channels, self.in_channels, self.kernel_size[0], self.kernel_size[1])
        if tuple(weight.shape) != expected:
            raise ValueError(f"weight must have shape {expected}, got {tuple(weight.shape)}.")
        n_rows, n_cols = self.freq_size
        matrix = weight.detach().permute(0, 2, 1, 3).reshape(n_rows, n_cols)
        with torch.autocast(device_type=matrix.device.type, enabled=False):
            spectrum = torch.fft.rfft2(matrix.to(_fft_dtype(matrix.dtype)))
            return (torch.view_as_real(spectrum) / self.dft_scale).to(weight.dtype)

    def _spectrum(self) -> torch.Tensor:
        """Complex ``W~`` of shape ``(Cout*k, Cin*k//2+1)`` (float32/float64 precision)."""
        dft = self.dft_weight.to(_fft_dtype(self.dft_weight.dtype)) * self.dft_scale
        return torch.complex(dft[..., 0], dft[..., 1])

    def _spectrum_to_kernel(self, spectrum: torch.Tensor) -> torch.Tensor:
        """``irfft2`` of ``(N, Cout*k, Cin*k//2+1)`` spectra to ``(N, Cout, Cin, k, k)`` kernels."""
        matrix = torch.fft.irfft2(spectrum, s=self.freq_size)
        k = self.kernel_size[0]
        return matrix.reshape(-1, self.out_channels, k, self.in_channels, k).permute(0, 1, 3, 2, 4)

    def _mixed_kernels(self, kernel_att: Optional[torch.Tensor]) -> torch.Tensor:
        """Kernels ``irfft2(kernel_num * a[band(f)] * W~)`` ``(B, Cout, Cin, k, k)`` for kernel attention ``a``
        ``(B, kernel_num)``, or the static kernel ``(1, Cout, Cin, k, k)`` for None."""
        spectrum = self._spectrum().unsqueeze(0)  # (1, Cout*k, Cin*k//2+1)
        band_index = self.band_index
        if kernel_att is not None and band_index is not None:
            # W_eff = F^-1(a(f) * W~): bin f takes the attention of its band (kernel_num * a = 1 at init)
            coef = torch.index_select(kernel_att.to(spectrum.real.dtype), 1, band_index.flatten())
            coef = coef.reshape(-1, band_index.shape[0], band_index.shape[1]) * self.kernel_num
            spectrum = spectrum * coef
        return self._spectrum_to_kernel(spectrum)

    def static_weight(self) -> torch.Tensor:
        """The ``(Cout, Cin, k, k)`` kernel the frequency parameters encode (``iFFT`` of ``dft_weight``).

        This is the kernel the layer applies when every attention equals its initial value.
        """
        if torch.jit.is_scripting():
            kernel = self._mixed_kernels(None)[0]
        else:
            with torch.autocast(device_type=self.dft_weight.device.type, enabled=False):
                kernel = self._mixed_kernels(None)[0]
        return kernel.to(self.dft_weight.dtype)

    def reset_parameters(self) -> None:
        """Re-initialise as ``nn.Conv2d`` does (Kaiming-uniform kernel, transformed to FDW) and reset attentions."""
        if "dft_weight" not in self._parameters:  # called by nn.Conv2d.__init__, before the FDW conversion
            super().reset_parameters()
            return
        k = self.kernel_size[0]
        with torch.no_grad():
            weight = torch.empty(
                self.out_channels, self.in_channels, k, k, device=self.dft_weight.device, dtype=self.dft_weight.dtype
            )
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            self.dft_weight.copy_(self._weight_to_dft(weight))
            if self.bias is not None:
                bound = 1.0 / math.sqrt(self.in_channels * k * k)
                nn.init.uniform_(self.bias, -bound, bound)
        for module in (self.ksm_global, self.ksm_local, self.fbm):
            if module is not None:
                module.reset_parameters()

    @classmethod
    def from_conv2d(cls, conv: nn.Conv2d, **kwargs) -> FDConv2d:
        """Build an ``FDConv2d`` computing the same function as ``conv`` (FDW transform of its weight).

        Args:
            conv: a square 1x1 or 3x3 ``nn.Conv2d`` with ``groups=1`` (an ``FDConv2d`` is converted through its
                :meth:`static_weight`). Geometry, bias, padding mode, device, dtype and train/eval mode are copied.
            kwargs: FDConv options (``kernel_num``, ``reduction``, ``use_fbm``, ...), not the convolution geometry.

        Raises:
            TypeError: ``conv`` is not an ``nn.Conv2d``.
            ValueError: ``kwargs`` repeats the geometry, or the geometry is not supported.
        """
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv must be an nn.Conv2d, got {type(conv).__name__}.")
        clash = sorted(set(kwargs) & set(_CONV_ARGS))
        if clash:
            raise ValueError(f"from_conv2d takes {clash} from conv; pass only FDConv options in kwargs.")
        weight = conv.static_weight() if isinstance(conv, FDConv2d) else conv.weight
        module = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            groups=conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
            device=weight.device,
            dtype=weight.dtype,
            **kwargs,
        )
        with torch.no_grad():
            module.dft_weight.copy_(module._weight_to_dft(weight))
            if conv.bias is not None and module.bias is not None:
                module.bias.copy_(conv.bias)
        module.train(conv.training)
        return module

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        weight_key, dft_key = prefix + "weight", prefix + "dft_weight"
        if weight_key in state_dict and dft_key not in state_dict:
            weight = state_dict.pop(weight_key)
            try:
                state_dict[dft_key] = self._weight_to_dft(weight.to(self.dft_weight.device))
            except ValueError as err:
                error_msgs.append(f"size mismatch for {weight_key} (converted to {dft_key}): {err}")
                state_dict[weight_key] = weight
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # --------------------------------------------------------------------------------------------------- forward
    def _grouped_conv(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Convolve each sample of ``x`` ``(B, Cin, H, W)`` with its own kernel ``weight`` ``(B, Cout, Cin, k, k)``."""
        batch = x.shape[0]
        bias = self.bias
        if bias is not None:
            bias = bias.repeat(batch)
        weight = weight.reshape(batch * self.out_channels, self.in_channels, weight.shape[-2], weight.shape[-1])
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            x = x.reshape(1, batch * self.in_channels, x.shape[-2], x.shape[-1])
            out = F.conv2d(x, weight, bias, self.stride, _pair(0), self.dilation, batch)
        else:
            x = x.reshape(1, batch * self.in_channels, x.shape[-2], x.shape[-1])
            out = F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, batch)
        return out.reshape(batch, self.out_channels, out.shape[-2], out.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"FDConv2d expects input of shape (B, {self.in_channels}, H, W), got {list(x.shape)}.")
        if self.ksm_global is None:
            return self._conv_forward(x, self.static_weight(), self.bias)

        pooled = x.mean(dim=(2, 3))
        channel, filt, spatial, kernel_att = self.ksm_global(pooled)
        if torch.jit.is_scripting():  # TorchScript needs a constant autocast device
            kernels = self._mixed_kernels(kernel_att)
        else:
            with torch.autocast(device_type=x.device.type, enabled=False):
                kernels = self._mixed_kernels(kernel_att)  # (B or 1, Cout, Cin, k, k)
        weight = kernels * (filt[:, :, None, None, None] * channel[:, None, :, None, None])
        if spatial is not None:
            weight = weight * spatial[:, None, None]
        if self.ksm_local is not None:
            weight = weight * self.ksm_local(pooled)
        if self.fbm is not None:
            x = self.fbm(x)
        return self._grouped_conv(x, weight.to(x.dtype))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel_num={self.kernel_num}, dynamic={self.dynamic}"
