"""One numeric-precision setting for training, evaluation and inference: ``auto``, ``bf16``, ``fp16`` or ``fp32``.

:func:`resolve_precision` turns the setting and the device into a :class:`Precision` (autocast dtype, whether
autocast is on, whether a gradient scaler is needed) and logs the choice, e.g.
``precision: bf16 (auto: CPU has avx512_bf16)``. ``auto`` picks

- bfloat16 on a CPU with native bfloat16 instructions (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``) and on
  a GPU that supports bfloat16 (compute capability 8.0 and newer);
- float16 with a gradient scaler on an older GPU;
- float32 otherwise (a CPU without native bfloat16, other devices).

How the engines use it:

- MONAI's ``SupervisedTrainer`` / ``SupervisedEvaluator`` (MONAI 1.6) enter ``torch.autocast("cuda", **amp_kwargs)``
  when ``amp=True`` and then always build a CUDA ``GradScaler``: their ``amp`` flag can neither autocast on the CPU
  nor leave the scaler out for bfloat16. So the network's forward runs under :class:`AutocastInferer` (any device,
  any dtype, outputs returned in float32) and ``amp`` is :attr:`Precision.use_grad_scaler` (True only for float16
  on CUDA, where the scaler is needed) with ``amp_kwargs`` = :func:`amp_kwargs`.
- :class:`spectraflow_monai.engines.MeanFlowPretrainer` autocasts on its own device: ``amp`` =
  :attr:`Precision.autocast`, ``amp_kwargs`` = :func:`amp_kwargs` (it adds a scaler for float16 on CUDA itself).
- Plain inference code: ``with precision.context(): ...`` (= ``torch.autocast(**autocast_kwargs(precision))``).

The parts whose accuracy needs float32 disable autocast locally and compute in float32 whatever the setting: the
FFTs of FDConv, the MeanFlow JVP target and the losses (Dice + BCE + boundary, dispersive, MeanFlow regression).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from monai.inferers import Inferer, SimpleInferer

from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import PRECISION_SETTINGS, check_precision_setting

__all__ = [
    "PRECISION_SETTINGS",
    "AutocastInferer",
    "Precision",
    "amp_kwargs",
    "autocast_kwargs",
    "autocast_off",
    "cpu_bf16_flags",
    "cpu_supports_bf16",
    "cuda_supports_bf16",
    "resolve_precision",
]

logger = logging.getLogger(__name__)

#: ``/proc/cpuinfo`` flags of native bfloat16 arithmetic (AVX512-BF16, AMX-BF16)
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run (made by :func:`resolve_precision`).

    Attributes:
        name: ``"bf16"``, ``"fp16"`` or ``"fp32"``.
        dtype: the autocast dtype (``torch.float32`` for fp32).
        autocast: whether ``torch.autocast`` is entered (False for fp32).
        use_grad_scaler: whether training needs a gradient scaler (float16 on CUDA only); this is also the value of
            the ``amp`` flag of MONAI's ``SupervisedTrainer`` / ``SupervisedEvaluator``.
        device_type: the autocast device type, ``"cpu"`` or ``"cuda"`` (or another torch device type).
        setting: the setting it was resolved from (``"auto"``, ``"bf16"``, ``"fp16"``, ``"fp32"``).
        reason: why, in words (e.g. ``"auto: CPU has avx512_bf16"``).
    """

    name: str
    dtype: torch.dtype
    autocast: bool
    use_grad_scaler: bool
    device_type: str
    setting: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"

    @property
    def amp_kwargs(self) -> dict[str, Any]:
        """``{"dtype": dtype}``: the ``amp_kwargs`` of MONAI's engines and of ``MeanFlowPretrainer``."""
        return amp_kwargs(self)

    def context(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` of this precision (a do-nothing autocast for fp32)."""
        return torch.autocast(**autocast_kwargs(self))


def _read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """Every CPU flag listed in ``path`` (the ``flags`` lines of Linux's cpuinfo); empty when unreadable."""
    flags: set[str] = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "flags":
                    flags.update(value.split())
    except OSError:
        return frozenset()
    return frozenset(flags)


@functools.lru_cache(maxsize=1)
def _cached_cpu_bf16_flags() -> tuple[str, ...]:
    if sys.platform.startswith("linux"):
        flags = _read_cpu_flags()
        if flags:
            return tuple(f for f in CPU_BF16_FLAGS if f in flags)
    # other systems (or no cpuinfo): torch's own CPU feature probe, where this build has it
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    try:
        return ("avx512_bf16",) if probe is not None and bool(probe()) else ()
    except Exception:  # a private probe: never let it break a run
        return ()


def cpu_bf16_flags() -> tuple[str, ...]:
    """The native-bfloat16 features of this CPU among ``avx512_bf16`` and ``amx_bf16`` (empty when none).

    Linux: the ``flags`` of ``/proc/cpuinfo`` (as ``lscpu | grep -o 'avx512_bf16\\|amx_bf16'`` shows them). Other
    systems: torch's CPU feature probe (``avx512_bf16``) where the build has one, else none.
    """
    return _cached_cpu_bf16_flags()


def cpu_supports_bf16() -> bool:
    """Whether the CPU has native bfloat16 arithmetic (see :func:`cpu_bf16_flags`)."""
    return bool(cpu_bf16_flags())


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def cuda_supports_bf16(device: torch.device | str | int | None = None) -> bool:
    """Whether the CUDA ``device`` (default: the current one) supports bfloat16 natively (not by emulation)."""
    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch without the including_emulation argument
            return bool(torch.cuda.is_bf16_supported())


def _device_of(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise SettingError(f"device must be a torch device (e.g. 'cpu', 'cuda:0'), got {device!r}.") from err


def resolve_precision(
    setting: str | Precision = "auto", device: torch.device | str | None = None, log: bool = True
) -> Precision:
    """The :class:`Precision` of the ``precision`` setting on ``device``, logged as ``precision: bf16 (...)``.

    ============  ==========================================  =============================================
    setting       CPU                                         CUDA
    ============  ==========================================  =============================================
    ``auto``      bf16 with avx512_bf16 / amx_bf16, else fp32  bf16 where supported, else fp16 + grad scaler
    ``bf16``      bf16 (emulated, slow, without native bf16)   bf16; an error where the GPU lacks it
    ``fp16``      an error (no gradient scaler on the CPU)     fp16 + grad scaler
    ``fp32``      fp32                                         fp32
    ============  ==========================================  =============================================

    Other device types (e.g. ``mps``) get fp32 for ``auto`` and ``fp32``; ``bf16`` / ``fp16`` are refused there.

    Args:
        setting: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"fp32"`` (case-insensitive), or a :class:`Precision`
            (returned as it is). Defaults to ``"auto"``.
        device: the device the model runs on; None means ``cuda`` when available, else ``cpu``.
        log: log the choice at INFO level (logger ``spectraflow_monai.utils.precision``). Defaults to True.

    Returns:
        the resolved :class:`Precision`.

    Raises:
        SettingError: (a ``ValueError``) an unknown setting, a setting the device cannot run, or a CUDA device
            where CUDA is not available; the message names the setting and its value.
    """
    if isinstance(setting, Precision):
        return setting
    setting = check_precision_setting(setting)
    dev = _device_of(device)
    kind = dev.type
    if kind == "cuda" and not _cuda_available():
        raise SettingError(
            f"precision={setting!r} was asked for on device {str(dev)!r}, but CUDA is not available here "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False); use device 'cpu'."
        )
    if setting == "auto":
        if kind == "cpu":
            flags = cpu_bf16_flags()
            name = "bf16" if flags else "fp32"
            reason = f"auto: CPU has {' and '.join(flags)}" if flags else "auto: CPU has no native bfloat16"
        elif kind == "cuda":
            name = "bf16" if cuda_supports_bf16(dev) else "fp16"
            reason = "auto: GPU supports bfloat16" if name == "bf16" else "auto: GPU without bfloat16"
        else:
            name, reason = "fp32", f"auto: no reduced precision chosen on {kind}"
    else:
        name, reason = setting, "set explicitly"
        if name != "fp32" and kind not in ("cpu", "cuda"):
            raise SettingError(f"precision={setting!r} is supported on cpu and cuda devices, got device {str(dev)!r}.")
        if name == "fp16" and kind == "cpu":
            raise SettingError(
                "precision='fp16' needs a CUDA device (float16 training needs a gradient scaler, which MONAI's "
                "trainers only run on CUDA); use 'bf16' or 'fp32' on the CPU, got device 'cpu'."
            )
        if name == "bf16" and kind == "cuda" and not cuda_supports_bf16(dev):
            raise SettingError(f"precision='bf16' but the GPU {str(dev)!r} has no bfloat16 support; use 'fp16'.")
        if name == "bf16" and kind == "cpu" and not cpu_supports_bf16():
            reason = "set explicitly; this CPU has no native bfloat16, so it is emulated and slower than fp32"
    result = Precision(
        name=name,
        dtype=_DTYPES[name],
        autocast=name != "fp32",
        use_grad_scaler=name == "fp16" and kind == "cuda",
        device_type=kind,
        setting=setting,
        reason=reason,
    )
    if log:
        logger.info(f"precision: {result}")
    return result


def autocast_kwargs(precision: Precision) -> dict[str, Any]:
    """Keyword arguments of ``torch.autocast`` for ``precision``: ``device_type``, ``dtype`` and ``enabled``.

    Use ``torch.autocast(**autocast_kwargs(p))`` (or ``p.context()``) around plain inference code.
    """
    if not isinstance(precision, Precision):
        raise SettingError(f"precision must be a Precision (from resolve_precision), got {type(precision).__name__}.")
    device_type = precision.device_type if precision.device_type in _AUTOCAST_DEVICE_TYPES else "cpu"
    dtype = precision.dtype if precision.autocast else torch.bfloat16 if device_type == "cpu" else torch.float16
    return {"device_type": device_type, "dtype": dtype, "enabled": precision.autocast}


def amp_kwargs(precision: Precision) -> dict[str, Any]:
    """``{"dtype": precision.dtype}``: the ``amp_kwargs`` of MONAI's engines and of ``MeanFlowPretrainer``.

    No ``device_type``: MONAI 1.6 passes ``amp_kwargs`` to ``torch.autocast("cuda", **amp_kwargs)`` and the Stage-1
    trainer to ``torch.autocast(<its device type>, **amp_kwargs)``, both with the device type already given.
    """
    if not isinstance(precision, Precision):
        raise SettingError(f"precision must be a Precision (from resolve_precision), got {type(precision).__name__}.")
    return {"dtype": precision.dtype}


def autocast_off(device: torch.device | str | torch.Tensor) -> contextlib.AbstractContextManager:
    """A context in which autocast is off on the device type of ``device`` (a device or a tensor on it), so that the
    code inside runs in the dtype of its inputs (used around the float32 parts: FFTs, JVP target, losses)."""
    if isinstance(device, torch.Tensor):
        device = device.device
    device_type = torch.device(device).type
    if device_type not in _AUTOCAST_DEVICE_TYPES:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def _to_float32(output: Any) -> Any:
    """float16 / bfloat16 tensors of a network output (tensor, sequence or mapping) cast to float32."""
    if isinstance(output, torch.Tensor):
        return output.float() if output.dtype in (torch.float16, torch.bfloat16) else output
    if isinstance(output, Mapping):
        return type(output)((k, _to_float32(v)) for k, v in output.items())  # type: ignore[call-arg]
    if isinstance(output, tuple) and hasattr(output, "_fields"):  # named tuple
        return type(output)(*(_to_float32(v) for v in output))
    if isinstance(output, (list, tuple)):
        return type(output)(_to_float32(v) for v in output)
    return output


class _AutocastNetwork:
    """``network`` called under autocast, its output returned in float32."""

    def __init__(self, network: Callable, precision: Precision) -> None:
        self.network = network
        self.precision = precision

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.context():
            out = self.network(*args, **kwargs)
        return _to_float32(out)


class AutocastInferer(Inferer):
    """A MONAI inferer that runs every network call of ``inferer`` under the autocast of ``precision``.

    Each call of the network (once for ``SimpleInferer``, once per window / slice batch for ``SlidingWindowInferer``
    and ``SliceInferer``) runs under ``torch.autocast`` and its float16 / bfloat16 outputs come back as float32, so
    that the aggregation of windows, the loss, the post-processing and the metrics run in float32. Works on the CPU
    as on CUDA (unlike the ``amp`` flag of MONAI's engines, which autocasts on CUDA only); in training the backward
    pass follows the dtypes of the forward pass. With fp32 it is ``inferer`` unchanged.

    Args:
        inferer: the inferer to wrap; None means ``SimpleInferer()``. Defaults to None.
        precision: a :class:`Precision` or a setting (``"auto"``, ``"bf16"``, ``"fp16"``, ``"fp32"``) resolved with
            ``device``. Defaults to ``"auto"``.
        device: the device for a string ``precision``; None means ``cuda`` when available, else ``cpu``.

    Example (bundle config)::

        inferer:
          _target_: spectraflow_monai.utils.AutocastInferer
          inferer: {_target_: SliceInferer, roi_size: [224, 224], spatial_dim: 2}
          precision: '@precision_def'
    """

    def __init__(
        self,
        inferer: Inferer | None = None,
        precision: Precision | str = "auto",
        device: torch.device | str | None = None,
    ) -> None:
        if inferer is not None and not callable(inferer):
            raise SettingError(f"inferer must be a MONAI Inferer or None, got {type(inferer).__name__}.")
        self.inferer = SimpleInferer() if inferer is None else inferer
        self.precision = resolve_precision(precision, device)

    def __call__(self, inputs: torch.Tensor, network: Callable, *args: Any, **kwargs: Any) -> Any:
        if not self.precision.autocast:
            return self.inferer(inputs, network, *args, **kwargs)
        return self.inferer(inputs, _AutocastNetwork(network, self.precision), *args, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(inferer={self.inferer!r}, precision={self.precision.name!r})"
