"""Frequency Dynamic Convolution (FDConv): the frequency-directional refinement convolution of SpectraFlow.

References:
    - Chen et al., "Frequency Dynamic Convolution for Dense Image Prediction", CVPR 2025 (FDConv).
    - Chen, Wang, Zou, Wu, "SpectraFlow" (Sec. "FDConv: Frequency-Directional Refinement"): FDConv replaces the
      first 3x3 convolution in the decoder refinement block to sharpen high-frequency boundary details.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

from spectraflow_monai.networks.blocks.frequency import (
    FrequencyBandModulation,
    c2r_matrices,
    check_k_list,
    dft_matrices,
    fft_dtype,
    rfft2_band_index,
)
from spectraflow_monai.networks.blocks.kernel_modulation import KernelSpatialModulationGlobal, KernelSpatialModulationLocal

__all__ = ["FDConv2d", "FDConvConfig"]

_SUPPORTED_KERNEL_SIZES = (1, 3)


def _positive_number(value: Any) -> bool:
    """A finite real number ``> 0`` (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _int_at_least(value: Any, low: int) -> bool:
    """An integer ``>= low`` (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True)
class FDConvConfig:
    """The options of :class:`FDConv2d`'s frequency-dynamic part (its convolution geometry is ``nn.Conv2d``'s).

    The defaults are the official FDConv's (``Linwei-Chen/FDConv``) as SpectraFlow uses it.

    Args:
        kernel_num: number of disjoint frequency bands of the Fourier disjoint weight, a positive int; must divide
            the number of rfft bins ``Cout*k * (Cin*k // 2 + 1)`` of the layer (checked by the layer, when it is
            dynamic). Defaults to 4.
        reduction: kernel spatial modulation (KSM) trunk width ratio, width
            ``max(int(Cin * reduction), min_attention_channels, 1)``; a finite number ``> 0``. Defaults to 0.0625.
        min_attention_channels: minimum trunk width, a non-negative int; the layer is dynamic only when
            ``min(in_channels, out_channels) > min_attention_channels``. Defaults to 16.
        kernel_temperature: temperature of the kernel-number attention, ``> 0``. Defaults to 1.0.
        temperature: temperature of the channel / filter / spatial attentions, ``> 0``; None uses
            ``kernel_temperature``. Defaults to None.
        use_ksm_local: whether to use the local (dense) kernel modulation. Defaults to True.
        use_fbm: whether to use frequency band modulation (3x3 kernels only). Defaults to True.
        fbm_k_list: strictly increasing positive FBM low-pass divisors (kept as a tuple of floats). Defaults to
            ``(2, 4, 8)``.

    Raises:
        ValueError: a value of the wrong type or out of range, naming the argument and the value.

    Example::

        FDConv2d(64, 64, 3, config=FDConvConfig(kernel_num=2, use_fbm=False))
    """

    kernel_num: int = 4
    reduction: float = 0.0625
    min_attention_channels: int = 16
    kernel_temperature: float = 1.0
    temperature: float | None = None
    use_ksm_local: bool = True
    use_fbm: bool = True
    fbm_k_list: Sequence[float] = (2.0, 4.0, 8.0)

    def __post_init__(self) -> None:
        if not _int_at_least(self.kernel_num, 1):
            raise ValueError(f"FDConvConfig: kernel_num must be a positive int, got {self.kernel_num!r}.")
        if not _positive_number(self.reduction):
            raise ValueError(f"FDConvConfig: reduction must be a finite number > 0, got {self.reduction!r}.")
        if not _int_at_least(self.min_attention_channels, 0):
            raise ValueError(
                f"FDConvConfig: min_attention_channels must be a non-negative int, got {self.min_attention_channels!r}."
            )
        if not _positive_number(self.kernel_temperature):
            raise ValueError(
                f"FDConvConfig: kernel_temperature must be a finite number > 0, got {self.kernel_temperature!r}."
            )
        if self.temperature is not None and not _positive_number(self.temperature):
            raise ValueError(
                f"FDConvConfig: temperature must be None or a finite number > 0, got {self.temperature!r}."
            )
        for name in ("use_ksm_local", "use_fbm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FDConvConfig: {name} must be True or False, got {getattr(self, name)!r}.")
        try:
            k_list = tuple(check_k_list(self.fbm_k_list))
        except ValueError as err:
            raise ValueError(f"FDConvConfig: {err}") from None
        object.__setattr__(self, "fbm_k_list", k_list)  # a tuple: the object stays immutable and hashable


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
    kernels are applied with one grouped convolution (``groups=B``), or, with ``batch_free_conv`` (exports), with
    shifted slices and one batched matrix product, whose shapes do not depend on the batch size. FFTs run in float32 (float64 for double modules)
    with autocast disabled around them. A state dict holding a plain ``weight`` (e.g. from an ``nn.Conv2d``) is
    converted to ``dft_weight`` on load.

    If ``min(in_channels, out_channels) <= config.min_attention_channels`` (as in the official code) the layer has no
    dynamic part (no KSM, no FBM) and behaves exactly as an ``nn.Conv2d`` whose weight is :meth:`static_weight`; the
    FDW parametrisation is kept so the state dict and API are the same.

    Deviations from the official implementation (``Linwei-Chen/FDConv``, ``FDConv_detection/mmdet_custom/FDConv.py``):

    - Every attention head (channel, filter, spatial, kernel, local Conv1d, FBM gain conv) is zero-initialised, so
      the layer reproduces the static convolution exactly at initialisation. The official code uses N(0, 1e-6) /
      constant 1e-6 and, because its check tests a bound method, leaves ``filter_fc`` with Kaiming initialisation.
    - The global trunk uses LayerNorm over the pooled vector instead of BatchNorm2d on a 1x1 map (which fails for
      batch size 1 in training); trunk and heads are ``nn.Linear`` (equal to 1x1 convolutions on the pooled map).
    - ``irfft2`` gets the spatial size explicitly, so ``Cin*k`` may be odd; the kernel mixing is a per-bin gather
      ``a[band(f)] * W~`` instead of a scatter into a zero map (the same bands, hence the same kernel).
    - The per-band FBM gain convolutions are merged into one ``Conv2d(Cin, len(fbm_k_list), 3)``; FBM transforms only
      the kept rfft columns along the height and uses an equivalent form that is exactly the identity at
      initialisation.

    Rules kept as in the official code: the bands of the Fourier disjoint weight are the rfft bins ordered by float32
    radius with PyTorch's default (not stable) CPU ``torch.sort``, ties included
    (:func:`~spectraflow_monai.networks.blocks.frequency.rfft2_frequency_order`); the FBM masks are the float32 boxes
    ``max(|f_h|, |f_w|) < 0.5 / k + 1e-8`` on the 64x64 rfft grid, nearest-resized to the input's rfft grid, which
    keeps the edge bins ``|f| = 0.5 / k`` for ``k = 4, 8`` and drops them for ``k = 2``
    (:func:`~spectraflow_monai.networks.blocks.frequency.fbm_lowpass_masks`).
    - Only the sigmoid activations, ``param_ratio=1`` and ``param_reduction=1`` are implemented (the leading
      ``param_ratio`` axis of ``dft_weight`` is dropped); small-channel layers keep the FDW parametrisation.
    - ``padding=None`` (default) means ``dilation * (k // 2)``, i.e. "same" output size at stride 1.

    Notes:
        ``torch.jit.script`` works for any input size. ``torch.jit.trace`` works too, but the traced graph is
        specialised to the traced input shape (the batch size is the ``groups`` of the per-sample convolution;
        with ``batch_free_conv`` it is not).
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
        config: the options of the frequency-dynamic part (:class:`FDConvConfig`: ``kernel_num``, the KSM
            ``reduction``, ``min_attention_channels`` and temperatures, ``use_ksm_local``, ``use_fbm``,
            ``fbm_k_list``). None: ``FDConvConfig()``, the official defaults. Defaults to None.
        device: parameter device. Defaults to None.
        dtype: parameter dtype. Defaults to None.

    Raises:
        ValueError: an unsupported geometry, a ``config`` that is not an :class:`FDConvConfig`, or a ``kernel_num``
            that does not divide the layer's rfft bins, each named with its value.

    Example::

        conv = nn.Conv2d(64, 64, 3, padding=1)
        fd = FDConv2d.from_conv2d(conv)  # fd(x) == conv(x) until trained
        small = FDConv2d(64, 64, config=FDConvConfig(kernel_num=2, use_fbm=False))
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
        config: FDConvConfig | None = None,
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
        config = FDConvConfig() if config is None else config
        if not isinstance(config, FDConvConfig):
            raise ValueError(f"config must be an FDConvConfig or None, got {type(config).__name__}.")
        kernel_num = int(config.kernel_num)
        if padding is None:
            padding = tuple(d * (k // 2) for d in _pair(dilation))

        dynamic = min(in_channels, out_channels) > config.min_attention_channels
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
        self.config = config
        self.kernel_num = kernel_num
        self.dynamic = dynamic
        self.dft_scale = float(max(min(in_channels, out_channels) // 2, 1))
        self.freq_size = (n_rows, n_cols)
        # the frequency transforms as real matrix products instead of complex FFTs (for exports: ONNX, TensorRT);
        # :func:`spectraflow_monai.networks.export.set_real_dft` switches it on every FDConv2d / FBM of a network
        self.real_dft = False
        # the per-sample convolution as shifted slices and one batched matrix product instead of a grouped
        # convolution with ``groups=B`` (exports with a free batch axis); see :meth:`_sliced_conv` and
        # :func:`spectraflow_monai.networks.export.set_batch_free_conv`
        self.batch_free_conv = False

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
        attention_channels = max(int(in_channels * config.reduction), int(config.min_attention_channels), 1)
        temperature = config.kernel_temperature if config.temperature is None else config.temperature
        factory = {"device": device, "dtype": dtype}
        self.ksm_global = KernelSpatialModulationGlobal(
            in_channels, out_channels, k, kernel_num, attention_channels, temperature, config.kernel_temperature
        ).to(**factory)
        if config.use_ksm_local:
            self.ksm_local = KernelSpatialModulationLocal(in_channels, out_channels, k).to(**factory)
        if config.use_fbm and k == 3:
            self.fbm = FrequencyBandModulation(in_channels, list(config.fbm_k_list)).to(**factory)

    # ----------------------------------------------------------------------------------------- FDW parametrisation
    @staticmethod
    def _band_index(n_rows: int, n_cols: int, kernel_num: int, device: torch.device | str | None) -> torch.Tensor:
        """Band id ``(n_rows, n_cols // 2 + 1)`` of every rfft2 bin (official order, see :func:`rfft2_band_index`)."""
        return rfft2_band_index(n_rows, n_cols, kernel_num).to(device=device)

    def _weight_to_dft(self, weight: torch.Tensor) -> torch.Tensor:
        """FDW transform of a ``(Cout, Cin, k, k)`` kernel to ``dft_weight`` layout ``(Cout*k, Cin*k//2+1, 2)``."""
        expected = (self.out_channels, self.in_channels, self.kernel_size[0], self.kernel_size[1])
        if tuple(weight.shape) != expected:
            raise ValueError(f"weight must have shape {expected}, got {tuple(weight.shape)}.")
        n_rows, n_cols = self.freq_size
        matrix = weight.detach().permute(0, 2, 1, 3).reshape(n_rows, n_cols)
        with torch.autocast(device_type=matrix.device.type, enabled=False):
            spectrum = torch.fft.rfft2(matrix.to(fft_dtype(matrix.dtype)))
            return (torch.view_as_real(spectrum) / self.dft_scale).to(weight.dtype)

    def _spectrum(self) -> torch.Tensor:
        """Complex ``W~`` of shape ``(Cout*k, Cin*k//2+1)`` (float32/float64 precision)."""
        dft = self.dft_weight.to(fft_dtype(self.dft_weight.dtype)) * self.dft_scale
        return torch.complex(dft[..., 0], dft[..., 1])

    def _spectrum_to_kernel(self, spectrum: torch.Tensor) -> torch.Tensor:
        """``irfft2`` of ``(N, Cout*k, Cin*k//2+1)`` spectra to ``(N, Cout, Cin, k, k)`` kernels."""
        matrix = torch.fft.irfft2(spectrum, s=self.freq_size)
        k = self.kernel_size[0]
        return matrix.reshape(-1, self.out_channels, k, self.in_channels, k).permute(0, 1, 3, 2, 4)

    def _mixed_kernels_real(self, kernel_att: Optional[torch.Tensor]) -> torch.Tensor:
        """:meth:`_mixed_kernels` in real arithmetic (``real_dft``): the inverse transform as matrix products."""
        dft = self.dft_weight.to(fft_dtype(self.dft_weight.dtype)) * self.dft_scale
        re, im = dft[..., 0].unsqueeze(0), dft[..., 1].unsqueeze(0)
        band_index = self.band_index
        if kernel_att is not None and band_index is not None:
            coef = torch.index_select(kernel_att.to(re.dtype), 1, band_index.flatten())
            coef = coef.reshape(-1, band_index.shape[0], band_index.shape[1]) * self.kernel_num
            re, im = re * coef, im * coef
        n_rows, n_cols = self.freq_size
        cos_r, sin_r = dft_matrices(n_rows, re.dtype, re.device)
        y_re = (torch.matmul(cos_r, re) - torch.matmul(sin_r, im)) / n_rows  # inverse DFT along the rows
        y_im = (torch.matmul(sin_r, re) + torch.matmul(cos_r, im)) / n_rows
        back_c, back_s = c2r_matrices(re.shape[-1], n_cols, re.dtype, re.device)
        matrix = (y_re @ back_c - y_im @ back_s) / n_cols  # C2R along the columns
        k = self.kernel_size[0]
        return matrix.reshape(-1, self.out_channels, k, self.in_channels, k).permute(0, 1, 3, 2, 4)

    def _mixed_kernels(self, kernel_att: Optional[torch.Tensor]) -> torch.Tensor:
        """Kernels ``irfft2(kernel_num * a[band(f)] * W~)`` ``(B, Cout, Cin, k, k)`` for kernel attention ``a``
        ``(B, kernel_num)``, or the static kernel ``(1, Cout, Cin, k, k)`` for None."""
        if self.real_dft:
            return self._mixed_kernels_real(kernel_att)
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
    def from_conv2d(cls, conv: nn.Conv2d, config: FDConvConfig | None = None) -> FDConv2d:
        """Build an ``FDConv2d`` computing the same function as ``conv`` (FDW transform of its weight).

        Args:
            conv: a square 1x1 or 3x3 ``nn.Conv2d`` with ``groups=1`` (an ``FDConv2d`` is converted through its
                :meth:`static_weight`). Geometry, bias, padding mode, device, dtype and train/eval mode are copied.
            config: the FDConv options (:class:`FDConvConfig`); None: the official defaults. An ``FDConv2d``'s own
                options are not copied. Defaults to None.

        Raises:
            TypeError: ``conv`` is not an ``nn.Conv2d``.
            ValueError: the geometry is not supported, or ``config`` is not an :class:`FDConvConfig`.
        """
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv must be an nn.Conv2d, got {type(conv).__name__}.")
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
            config=config,
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

    def _sliced_conv(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """:meth:`_grouped_conv` without a batch-sized group count (``batch_free_conv``): the ``k * k`` shifted,
        strided slices of the padded input stacked to ``(B, Cin * k * k, Ho * Wo)`` (the layout of ``F.unfold``) and
        multiplied by the kernels ``(B, Cout, Cin * k * k)`` in one batched matrix product. The same sums as the
        grouped convolution (equal within float round-off; tested), with shapes that hold for any batch size, so an
        ONNX export keeps the batch axis free."""
        k_h, k_w = weight.shape[-2], weight.shape[-1]
        mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
        x = F.pad(x, self._reversed_padding_repeated_twice, mode=mode)
        (s_h, s_w), (d_h, d_w) = self.stride, self.dilation
        out_h = (x.shape[-2] - d_h * (k_h - 1) - 1) // s_h + 1
        out_w = (x.shape[-1] - d_w * (k_w - 1) - 1) // s_w + 1
        shifted = []
        for i in range(k_h):
            for j in range(k_w):
                top, left = i * d_h, j * d_w
                bottom, right = top + (out_h - 1) * s_h + 1, left + (out_w - 1) * s_w + 1
                shifted.append(x[:, :, top:bottom:s_h, left:right:s_w])
        columns = torch.stack(shifted, dim=2).flatten(1, 2).flatten(2)  # (B, Cin * k * k, Ho * Wo)
        out = torch.matmul(weight.flatten(2), columns)  # (B, Cout, Ho * Wo)
        bias = self.bias
        if bias is not None:
            out = out + bias[:, None]
        return out.reshape(out.shape[0], self.out_channels, out_h, out_w)

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
        if self.batch_free_conv:
            return self._sliced_conv(x, weight.to(x.dtype))
        return self._grouped_conv(x, weight.to(x.dtype))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel_num={self.kernel_num}, dynamic={self.dynamic}"
