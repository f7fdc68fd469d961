"""Random augmentation of a whole (B, C, H, W) batch on the training device, one call per batch.

MONAI's ``RandFlipd`` / ``RandRotate90d`` / ``RandAffined`` / ``RandAdjustContrastd`` / ... run on tensors on any
device, but per sample: a batch of 8 is 8 launches per transform, and each sample's parameters come from numpy on the host.
The transforms here draw the parameters of every sample of a batch at once from a seeded ``torch.Generator`` on the
batch's device and apply them with batched tensor operations; each sample is transformed with its own probability
``prob``, as a per-sample transform would, and an image and its label get the same geometric transform.

The parameter distributions follow MONAI's transforms of the same name (``RandFlip``, ``RandRotate90``,
``RandAffine``, ``RandAdjustContrast``, ``RandScaleIntensity``, ``RandShiftIntensity``, ``RandGaussianSmooth``,
``NormalizeIntensity``), so that the 2D bundle's augmentation (``geometric_augmentation`` and
``colour_augmentation`` in its train config) can be written one to one with them; where they differ it is said in
the class (docs/method.md, "Augmentation on the device").

Each transform has an array form (``Rand*Batch``, one tensor) and a dictionary form (``Rand*Batchd``, the same
parameters applied to every key, e.g. ``image`` and ``label`` with their interpolation modes); :class:`BatchCompose`
chains dictionary forms and shares one generator among them. Randomness: ``set_random_state(seed)`` seeds the
generator (created on the batch's device at its first call); ``state_dict()`` / ``load_state_dict()`` save and
restore it for a resumed run. No transform synchronises with the host.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from monai.config import KeysCollection
from monai.utils import ensure_tuple, ensure_tuple_rep

__all__ = [
    "BatchCompose",
    "batched_twins",
    "BatchRandomizable",
    "NormalizeIntensityBatch",
    "NormalizeIntensityBatchd",
    "RandAdjustContrastBatch",
    "RandAdjustContrastBatchd",
    "RandAffineBatch",
    "RandAffineBatchd",
    "RandFlipBatch",
    "RandFlipBatchd",
    "RandGaussianSmoothBatch",
    "RandGaussianSmoothBatchd",
    "RandRotate90Batch",
    "RandRotate90Batchd",
    "RandScaleIntensityBatch",
    "RandScaleIntensityBatchd",
    "RandShiftIntensityBatch",
    "RandShiftIntensityBatchd",
    "RepeatChannelBatchd",
]


def _check_prob(prob: float) -> float:
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0.0 <= prob <= 1.0:
        raise ValueError(f"prob must be a number in [0, 1], got {prob!r}.")
    return float(prob)


def _range(value: float | Sequence[float], name: str, centre: float = 0.0) -> tuple[float, float]:
    """MONAI's range convention: a number ``v`` is ``(centre - v, centre + v)``, a pair is itself (low <= high)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 when a single number, got {value!r}.")
        return centre - float(value), centre + float(value)
    values = tuple(float(v) for v in value)
    if len(values) != 2 or values[0] > values[1]:
        raise ValueError(f"{name} must be a number or a (low, high) pair with low <= high, got {value!r}.")
    return values


def _check_batch(x: torch.Tensor, name: str = "batch") -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a (B, C, H, W) tensor, got {shape}.")


def _select(flags: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` for the samples whose flag is set, ``old`` for the others (no host synchronisation)."""
    return torch.where(flags.reshape(-1, *([1] * (old.ndim - 1))), new, old)


class BatchRandomizable:
    """The random state of a batch transform: a ``torch.Generator`` on the batch's device, seeded by
    ``set_random_state`` (MONAI's name), saved and restored with ``state_dict`` / ``load_state_dict``.

    A transform that is part of a :class:`BatchCompose` uses the compose's generator.
    """

    def __init__(self) -> None:
        self._seed: int | None = None
        self._generator: torch.Generator | None = None
        self._pending_state: dict | None = None
        self._shared: BatchRandomizable | None = None

    def set_random_state(self, seed: int | None = None) -> BatchRandomizable:
        """Seed the generator with ``seed`` (None: a seed from torch's global generator, as MONAI draws from numpy).

        Raises:
            ValueError: ``seed`` is not an integer >= 0 or None.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}.")
        self._seed = int(torch.randint(0, 2**62, (1,)).item()) if seed is None else seed
        self._generator = None
        self._pending_state = None
        return self

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator on ``device`` (created and seeded at the first call)."""
        if self._shared is not None:
            return self._shared.generator(device)
        device = torch.device(device)
        if self._generator is None or self._generator.device.type != device.type:
            if self._seed is None:
                self.set_random_state(None)
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self._seed)
            if self._pending_state is not None and self._pending_state["device_type"] == device.type:
                self._generator.set_state(self._pending_state["state"])
                self._pending_state = None
        return self._generator

    def state_dict(self) -> dict[str, Any]:
        """``{"seed", "device_type", "state"}``: what :meth:`load_state_dict` needs to continue the same sequence."""
        gen = self._generator
        if gen is None:
            return {"seed": self._seed, "device_type": None, "state": None}
        return {"seed": self._seed, "device_type": gen.device.type, "state": gen.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state saved by :meth:`state_dict` (applied when the generator is next used on that device)."""
        self._seed = state["seed"]
        self._generator = None
        self._pending_state = dict(state) if state.get("state") is not None else None

    def _uniform(self, n: int, low: float, high: float, device: torch.device) -> torch.Tensor:
        return torch.rand(n, generator=self.generator(device), device=device) * (high - low) + low

    def _coins(self, n: int, prob: float, device: torch.device) -> torch.Tensor:
        return torch.rand(n, generator=self.generator(device), device=device) < prob


class _BatchDict(BatchRandomizable):
    """Dictionary form: the array transform ``self.array`` applied with the same parameters to every key."""

    array: Any

    def __init__(self, keys: KeysCollection, allow_missing_keys: bool = False) -> None:
        super().__init__()
        self.keys = ensure_tuple(keys)
        if not self.keys:
            raise ValueError(f"keys must name at least one key, got {keys!r}.")
        self.allow_missing_keys = allow_missing_keys
        self.array._shared = self

    def _present(self, data: Mapping[Hashable, Any]) -> list[Hashable]:
        keys = [k for k in self.keys if k in data]
        if len(keys) != len(self.keys) and not self.allow_missing_keys:
            missing = [k for k in self.keys if k not in data]
            raise ValueError(f"{type(self).__name__}: key(s) {missing} missing from the batch (keys {list(data)}).")
        return keys

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        keys = self._present(d)
        if not keys:
            return d
        first = d[keys[0]]
        _check_batch(first, repr(keys[0]))
        params = self.array.randomize(first)
        for i, key in enumerate(keys):
            d[key] = self.array(d[key], params=params, index=i)
        return d


class RandFlipBatch(BatchRandomizable):
    """Flip each sample of a (B, C, H, W) batch along ``spatial_axis`` with probability ``prob`` (MONAI ``RandFlip``).

    Args:
        prob: probability of flipping each sample. Defaults to 0.1 (MONAI's).
        spatial_axis: 0 (H) or 1 (W). Defaults to 0.

    Raises:
        ValueError: ``prob`` outside [0, 1] or ``spatial_axis`` not 0 or 1.
    """

    def __init__(self, prob: float = 0.1, spatial_axis: int = 0) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        if spatial_axis not in (0, 1):
            raise ValueError(f"spatial_axis must be 0 or 1 for a (B, C, H, W) batch, got {spatial_axis!r}.")
        self.spatial_axis = spatial_axis

    def randomize(self, x: torch.Tensor) -> torch.Tensor:
        """The per-sample flags (B,) bool."""
        return self._coins(x.shape[0], self.prob, x.device)

    def __call__(self, x: torch.Tensor, params: torch.Tensor | None = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        flags = self.randomize(x) if params is None else params
        return _select(flags, x.flip(2 + self.spatial_axis), x)


class RandRotate90Batch(BatchRandomizable):
    """Rotate each sample by ``k * 90`` degrees in the (H, W) plane with probability ``prob``, ``k`` uniform in
    ``1..max_k`` (MONAI ``RandRotate90``). The batch must be square (a rotated sample keeps the batch's shape).

    Args:
        prob: probability of rotating each sample. Defaults to 0.1 (MONAI's).
        max_k: the largest number of quarter turns, 1..3. Defaults to 3.

    Raises:
        ValueError: ``prob`` outside [0, 1] or ``max_k`` not in 1..3; at call time, a non-square batch.
    """

    def __init__(self, prob: float = 0.1, max_k: int = 3) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        if max_k not in (1, 2, 3):
            raise ValueError(f"max_k must be 1, 2 or 3, got {max_k!r}.")
        self.max_k = max_k

    def randomize(self, x: torch.Tensor) -> torch.Tensor:
        """The per-sample number of quarter turns (B,) int64, 0 for the samples left as they are."""
        gen = self.generator(x.device)
        apply = torch.rand(x.shape[0], generator=gen, device=x.device) < self.prob
        k = torch.randint(1, self.max_k + 1, (x.shape[0],), generator=gen, device=x.device)
        return torch.where(apply, k, torch.zeros_like(k))

    def __call__(self, x: torch.Tensor, params: torch.Tensor | None = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        if x.shape[-1] != x.shape[-2]:
            raise ValueError(f"{type(self).__name__} needs square samples, got a batch of shape {tuple(x.shape)}.")
        k = self.randomize(x) if params is None else params
        out = x
        for turns in range(1, self.max_k + 1):
            out = _select(k == turns, torch.rot90(x, turns, dims=(2, 3)), out)
        return out


class RandAffineBatch(BatchRandomizable):
    """A random rotation and scaling of each sample about its centre with probability ``prob``, resampled with
    ``F.affine_grid`` / ``F.grid_sample`` (MONAI ``RandAffine`` with ``rotate_range`` and ``scale_range``).

    As in MONAI, the matrix maps output pixel coordinates (centred, in pixels) to input ones: ``A = R(theta) S``,
    ``theta`` uniform in ``rotate_range`` and the scale of spatial axis ``i`` ``1 + uniform(scale_range[i])``; a
    single ``scale_range`` number scales the first spatial axis (H) only, the other staying 1, which is what MONAI's
    ``RandAffine(scale_range=0.1)`` does for a 2D image. The samples not drawn are returned unchanged (not resampled).

    Args:
        prob: probability of transforming each sample. Defaults to 0.1 (MONAI's).
        rotate_range: rotation angle range in radians (a number ``r``: ``[-r, r]``, or a ``(low, high)`` pair).
            Defaults to 0.0.
        scale_range: per spatial axis (H, W), the range of the scale offset (a number ``s``: ``[-s, s]``, or a
            ``(low, high)`` pair), as MONAI: one entry scales H alone. Defaults to 0.0.
        mode: ``"bilinear"`` or ``"nearest"`` (per key in the dictionary form). Defaults to ``"bilinear"``.
        padding_mode: ``"zeros"``, ``"border"`` or ``"reflection"``. Defaults to ``"zeros"``.

    Raises:
        ValueError: ``prob`` outside [0, 1], bad ranges, unknown ``mode`` / ``padding_mode``.
    """

    MODES = ("bilinear", "nearest")
    PADDING_MODES = ("zeros", "border", "reflection")

    def __init__(
        self,
        prob: float = 0.1,
        rotate_range: float | Sequence[float] = 0.0,
        scale_range: float | Sequence[Any] = 0.0,
        mode: str | Sequence[str] = "bilinear",
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        self.rotate_range = _range(rotate_range, "rotate_range")
        per_axis = list(ensure_tuple(scale_range))
        if not 1 <= len(per_axis) <= 2:
            raise ValueError(f"scale_range must hold one range per spatial axis (at most 2), got {scale_range!r}.")
        ranges = []
        for s in per_axis:  # MONAI: a number s is [-s, s], a pair is itself; 1.0 is added to the value drawn
            low, high = _range(s, "scale_range")
            if 1.0 + low <= 0:
                raise ValueError(f"scale_range must keep the scale positive, got {scale_range!r}.")
            ranges.append((1.0 + low, 1.0 + high))
        self.scale_range = tuple(ranges) + ((1.0, 1.0),) * (2 - len(ranges))
        self.modes = ensure_tuple(mode)
        for m in self.modes:
            if m not in self.MODES:
                raise ValueError(f"mode must be one of {list(self.MODES)}, got {m!r}.")
        if padding_mode not in self.PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {list(self.PADDING_MODES)}, got {padding_mode!r}.")
        self.padding_mode = padding_mode

    def randomize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flags (B,) bool, theta (B, 2, 3))``: the samples transformed and their ``affine_grid`` matrices."""
        b, dev = x.shape[0], x.device
        flags = self._coins(b, self.prob, dev)
        angle = self._uniform(b, *self.rotate_range, dev)
        scale_h = self._uniform(b, *self.scale_range[0], dev)
        scale_w = self._uniform(b, *self.scale_range[1], dev)
        cos, sin = angle.cos(), angle.sin()
        h, w = x.shape[-2], x.shape[-1]
        # pixel-space matrix over (row, col) = R @ S; affine_grid works in normalised (x=col, y=row) coordinates:
        # theta = D^-1 P A P D with D = diag(W/2, H/2) (align_corners=False) and P swapping row and col
        a_rr, a_rc, a_cr, a_cc = cos * scale_h, -sin * scale_w, sin * scale_h, cos * scale_w
        theta = torch.zeros(b, 2, 3, device=dev, dtype=torch.float32)
        theta[:, 0, 0] = a_cc
        theta[:, 0, 1] = a_cr * (h / w)
        theta[:, 1, 0] = a_rc * (w / h)
        theta[:, 1, 1] = a_rr
        return flags, theta

    def __call__(
        self, x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor] | None = None, index: int = 0
    ) -> torch.Tensor:
        _check_batch(x)
        flags, theta = self.randomize(x) if params is None else params
        mode = self.modes[min(index, len(self.modes) - 1)]
        src = x if x.is_floating_point() else x.float()
        grid = F.affine_grid(theta.to(src.dtype), list(src.shape), align_corners=False)
        out = F.grid_sample(src, grid, mode=mode, padding_mode=self.padding_mode, align_corners=False)
        return _select(flags, out.to(x.dtype), x)


class RandAdjustContrastBatch(BatchRandomizable):
    """Gamma contrast of each sample with probability ``prob`` (MONAI ``RandAdjustContrast``): with ``m`` / ``r`` the
    sample's minimum / range over all channels, ``((x - m) / (r + 1e-7)) ** gamma * r + m``, ``gamma`` uniform.

    Args:
        prob: probability per sample. Defaults to 0.1 (MONAI's).
        gamma: range of gamma (a number ``g > 0.5``: ``(0.5, g)``, MONAI's rule). Defaults to (0.5, 4.5).

    Raises:
        ValueError: ``prob`` outside [0, 1]; ``gamma`` not positive or a number <= 0.5.
    """

    def __init__(self, prob: float = 0.1, gamma: float | Sequence[float] = (0.5, 4.5)) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        if isinstance(gamma, (int, float)) and not isinstance(gamma, bool):
            if gamma <= 0.5:
                raise ValueError(f"gamma must be > 0.5 when a single number, got {gamma!r}.")
            gamma = (0.5, float(gamma))
        self.gamma = _range(gamma, "gamma")
        if self.gamma[0] <= 0:
            raise ValueError(f"gamma must be positive, got {gamma!r}.")

    def randomize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._coins(x.shape[0], self.prob, x.device), self._uniform(x.shape[0], *self.gamma, x.device)

    def __call__(self, x: torch.Tensor, params: Any = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        flags, gamma = self.randomize(x) if params is None else params
        flat = x.flatten(1)
        low = flat.amin(dim=1).reshape(-1, 1, 1, 1)
        span = flat.amax(dim=1).reshape(-1, 1, 1, 1) - low
        out = ((x - low) / (span + 1e-7)).pow(gamma.reshape(-1, 1, 1, 1)) * span + low
        return _select(flags, out, x)


class RandScaleIntensityBatch(BatchRandomizable):
    """``x * (1 + factor)`` per sample with probability ``prob``, ``factor`` uniform in ``factors`` (MONAI
    ``RandScaleIntensity``, not channel-wise).

    Args:
        prob: probability per sample. Defaults to 0.1.
        factors: factor range (a number ``f``: ``[-f, f]``). Defaults to 0.1.

    Raises:
        ValueError: ``prob`` outside [0, 1] or a bad ``factors`` range.
    """

    def __init__(self, prob: float = 0.1, factors: float | Sequence[float] = 0.1) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        self.factors = _range(factors, "factors")

    def randomize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._coins(x.shape[0], self.prob, x.device), self._uniform(x.shape[0], *self.factors, x.device)

    def __call__(self, x: torch.Tensor, params: Any = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        flags, factor = self.randomize(x) if params is None else params
        return _select(flags, x * (1.0 + factor.reshape(-1, 1, 1, 1)), x)


class RandShiftIntensityBatch(BatchRandomizable):
    """``x + offset`` per sample with probability ``prob``, ``offset`` uniform in ``offsets``, one per channel when
    ``channel_wise`` (MONAI ``RandShiftIntensity``).

    Args:
        prob: probability per sample. Defaults to 0.1.
        offsets: offset range (a number ``o``: ``[-o, o]``). Defaults to 0.1.
        channel_wise: one offset per channel. Defaults to False.

    Raises:
        ValueError: ``prob`` outside [0, 1] or a bad ``offsets`` range.
    """

    def __init__(self, prob: float = 0.1, offsets: float | Sequence[float] = 0.1, channel_wise: bool = False) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        self.offsets = _range(offsets, "offsets")
        self.channel_wise = bool(channel_wise)

    def randomize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, c = x.shape[0], (x.shape[1] if self.channel_wise else 1)
        flags = self._coins(b, self.prob, x.device)
        return flags, self._uniform(b * c, *self.offsets, x.device).reshape(b, c, 1, 1)

    def __call__(self, x: torch.Tensor, params: Any = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        flags, offset = self.randomize(x) if params is None else params
        return _select(flags, x + offset, x)


class RandGaussianSmoothBatch(BatchRandomizable):
    """Gaussian smoothing of each sample with probability ``prob``, ``sigma`` per axis uniform in ``sigma_x`` (H) /
    ``sigma_y`` (W) (MONAI ``RandGaussianSmooth``: erf-approximated kernels, zero padding).

    The kernels of one batch share the support of the largest sigma of the ranges (``4 * sigma`` each side, MONAI's
    ``truncated=4``); MONAI cuts each kernel at its own sigma: the difference is the kernel mass beyond 4 sigma
    (below 1e-4).

    Args:
        prob: probability per sample. Defaults to 0.1.
        sigma_x: sigma range of the first spatial axis. Defaults to (0.25, 1.5).
        sigma_y: sigma range of the second spatial axis. Defaults to (0.25, 1.5).

    Raises:
        ValueError: ``prob`` outside [0, 1] or a sigma range not positive.
    """

    def __init__(
        self,
        prob: float = 0.1,
        sigma_x: Sequence[float] = (0.25, 1.5),
        sigma_y: Sequence[float] = (0.25, 1.5),
    ) -> None:
        super().__init__()
        self.prob = _check_prob(prob)
        self.sigma_x = _range(sigma_x, "sigma_x")
        self.sigma_y = _range(sigma_y, "sigma_y")
        if min(self.sigma_x[0], self.sigma_y[0]) <= 0:
            raise ValueError(f"sigma ranges must be positive, got sigma_x={sigma_x!r}, sigma_y={sigma_y!r}.")
        self.tail = int(max(max(self.sigma_x[1], self.sigma_y[1]) * 4.0, 0.5) + 0.5)

    def randomize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        flags = self._coins(b, self.prob, x.device)
        return flags, self._uniform(b, *self.sigma_x, x.device), self._uniform(b, *self.sigma_y, x.device)

    def _kernels(self, sigma: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(-self.tail, self.tail + 1, device=sigma.device, dtype=torch.float32)
        t = (1.0 / math.sqrt(2.0)) / sigma.reshape(-1, 1)
        return (0.5 * (torch.erf(t * (pos + 0.5)) - torch.erf(t * (pos - 0.5)))).clamp_min(0)

    def __call__(self, x: torch.Tensor, params: Any = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        flags, sx, sy = self.randomize(x) if params is None else params
        b, c, h, w = x.shape
        k = 2 * self.tail + 1
        kx = self._kernels(sx).to(x.dtype).repeat_interleave(c, dim=0)  # (B*C, K)
        ky = self._kernels(sy).to(x.dtype).repeat_interleave(c, dim=0)
        y = x.reshape(1, b * c, h, w)
        y = F.conv2d(y, kx.reshape(b * c, 1, k, 1), padding=(self.tail, 0), groups=b * c)
        y = F.conv2d(y, ky.reshape(b * c, 1, 1, k), padding=(0, self.tail), groups=b * c)
        return _select(flags, y.reshape(b, c, h, w), x)


class NormalizeIntensityBatch:
    """``(x - subtrahend[c]) / divisor[c]`` per channel (MONAI ``NormalizeIntensity`` with ``channel_wise=True`` and
    given statistics), on the batch's device.

    Args:
        subtrahend: per-channel values (or one number).
        divisor: per-channel values (or one number), non-zero.

    Raises:
        ValueError: an empty or zero ``divisor``, or statistics whose lengths do not match the batch's channels.
    """

    def __init__(self, subtrahend: float | Sequence[float], divisor: float | Sequence[float]) -> None:
        self.subtrahend = tuple(float(v) for v in ensure_tuple(subtrahend))
        self.divisor = tuple(float(v) for v in ensure_tuple(divisor))
        if not self.subtrahend or not self.divisor or any(v == 0 for v in self.divisor):
            raise ValueError(f"subtrahend and divisor must be given and divisor non-zero, got {divisor!r}.")
        self._stats: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # per (device, dtype, channels)

    def _on(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = x.shape[1]
        key = (x.device, x.dtype, c)
        if key not in self._stats:  # copied to the device once, not at every batch
            stats = []
            for name, values in (("subtrahend", self.subtrahend), ("divisor", self.divisor)):
                if len(values) not in (1, c):
                    raise ValueError(f"{name} has {len(values)} values for a batch of {c} channels.")
                full = ensure_tuple_rep(values[0], c) if len(values) == 1 else values
                stats.append(torch.tensor(full, dtype=x.dtype).reshape(1, c, 1, 1).to(x.device))
            self._stats[key] = (stats[0], stats[1])
        return self._stats[key]

    def __call__(self, x: torch.Tensor, params: Any = None, index: int = 0) -> torch.Tensor:
        _check_batch(x)
        sub, div = self._on(x)
        return (x - sub) / div


def _dict_form(array_cls: type, doc: str) -> type:
    """The dictionary twin of an array batch transform: same arguments plus ``keys`` / ``allow_missing_keys``."""

    class _Dict(_BatchDict):
        def __init__(self, keys: KeysCollection, *args: Any, allow_missing_keys: bool = False, **kwargs: Any) -> None:
            self.array = array_cls(*args, **kwargs)
            super().__init__(keys, allow_missing_keys)
            self.prob = getattr(self.array, "prob", 1.0)

    _Dict.__name__ = _Dict.__qualname__ = array_cls.__name__ + "d"
    _Dict.__doc__ = doc
    return _Dict


_DICT_DOC = """Dictionary form of :class:`{0}`: ``keys`` (e.g. ``["image", "label"]``) get the same random parameters;
    the other arguments are :class:`{0}`'s{1}. ``allow_missing_keys`` as in MONAI."""

RandFlipBatchd = _dict_form(RandFlipBatch, _DICT_DOC.format("RandFlipBatch", ""))
RandRotate90Batchd = _dict_form(RandRotate90Batch, _DICT_DOC.format("RandRotate90Batch", ""))
RandAffineBatchd = _dict_form(
    RandAffineBatch, _DICT_DOC.format("RandAffineBatch", " (``mode`` one per key, e.g. ``[bilinear, nearest]``)")
)
RandAdjustContrastBatchd = _dict_form(RandAdjustContrastBatch, _DICT_DOC.format("RandAdjustContrastBatch", ""))
RandScaleIntensityBatchd = _dict_form(RandScaleIntensityBatch, _DICT_DOC.format("RandScaleIntensityBatch", ""))
RandShiftIntensityBatchd = _dict_form(RandShiftIntensityBatch, _DICT_DOC.format("RandShiftIntensityBatch", ""))
RandGaussianSmoothBatchd = _dict_form(RandGaussianSmoothBatch, _DICT_DOC.format("RandGaussianSmoothBatch", ""))


class NormalizeIntensityBatchd:
    """Dictionary form of :class:`NormalizeIntensityBatch` (``keys``: the images)."""

    def __init__(self, keys: KeysCollection, subtrahend: Any, divisor: Any, allow_missing_keys: bool = False) -> None:
        self.keys = ensure_tuple(keys)
        self.array = NormalizeIntensityBatch(subtrahend, divisor)
        self.allow_missing_keys = allow_missing_keys

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.keys:
            if key in d:
                d[key] = self.array(d[key])
            elif not self.allow_missing_keys:
                raise ValueError(f"{type(self).__name__}: key {key!r} missing from the batch (keys {list(d)}).")
        return d


class BatchCompose(BatchRandomizable):
    """Apply dictionary batch transforms in order, all drawing from one generator (this object's).

    ``set_random_state(seed)`` seeds it; ``state_dict()`` / ``load_state_dict()`` save and restore it (e.g. in the
    trainer's checkpoint beside the model), so a resumed run continues the same augmentation sequence.

    Args:
        transforms: callables taking and returning a batch dictionary (the ``*Batchd`` transforms, the device
            mixed-domain rendering :class:`~spectraflow_monai.transforms.RandMixedDomainBatchd`, or any other).

    Raises:
        ValueError: an element that is not callable.
    """

    def __init__(self, transforms: Sequence[Any]) -> None:
        super().__init__()
        self.transforms = list(transforms)
        for t in self.transforms:
            if not callable(t):
                raise ValueError(f"transforms must be callables, got {type(t).__name__}.")
            if isinstance(t, BatchRandomizable):
                t._shared = self

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for t in self.transforms:
            d = t(d)
        return d


class RepeatChannelBatchd:
    """Repeat the channels of ``keys`` ``repeats`` times in a (B, C, H, W) batch (MONAI's ``RepeatChanneld``, per
    batch: a CT slice shown to DINOv2 as 3 channels)."""

    def __init__(self, keys: KeysCollection, repeats: int) -> None:
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be a positive int, got {repeats!r}.")
        self.keys, self.repeats = ensure_tuple(keys), repeats

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.keys:
            d[key] = d[key].repeat_interleave(self.repeats, dim=1)
        return d


def _affine_twin(t: Any) -> RandAffineBatchd:
    grid = t.rand_affine.rand_affine_grid
    for name in ("shear_range", "translate_range"):
        if any(v not in (None, 0, 0.0) for v in ensure_tuple(getattr(grid, name))):
            raise ValueError(f"RandAffined with {name} has no batched twin (rotation and scaling only).")
    padding = set(ensure_tuple(t.padding_mode))
    if len(padding) != 1:
        raise ValueError(f"RandAffined with one padding mode per key has no batched twin, got {t.padding_mode!r}.")
    rotate = [v for v in ensure_tuple(grid.rotate_range) if v is not None]
    scale = [v for v in ensure_tuple(grid.scale_range) if v is not None]
    return RandAffineBatchd(
        t.keys, prob=t.prob, rotate_range=rotate[0] if rotate else 0.0, scale_range=scale or 0.0,
        mode=list(ensure_tuple(t.mode)), padding_mode=padding.pop(),
    )  # fmt: skip


def batched_twins(transforms: Sequence[Any]) -> list[Any]:
    """The batch transforms of this module that do what MONAI's dictionary transforms ``transforms`` do to one
    sample, with the same arguments (probabilities, ranges, keys): ``RandFlipd``, ``RandRotate90d`` (spatial axes
    (0, 1)), ``RandAffined`` (rotation and scaling), ``RandAdjustContrastd``, ``RandScaleIntensityd``,
    ``RandShiftIntensityd``, ``RandGaussianSmoothd``, ``RepeatChanneld`` and ``NormalizeIntensityd`` (given
    ``subtrahend`` / ``divisor``); ``EnsureTyped`` and ``Identityd`` are left out (the batches are float tensors
    already). A ``Compose`` is flattened. So a bundle writes its augmentation once, as MONAI transforms, and runs it either per
    sample (MONAI's data loader) or per batch on the training device.

    Raises:
        ValueError: a transform without a batched twin, naming it (e.g. a shear, a random crop).
    """
    from monai.transforms import (
        Compose,
        EnsureTyped,
        Identityd,
        NormalizeIntensityd,
        RandAdjustContrastd,
        RandAffined,
        RandFlipd,
        RandGaussianSmoothd,
        RandRotate90d,
        RandScaleIntensityd,
        RandShiftIntensityd,
        RepeatChanneld,
    )

    out: list[Any] = []
    for t in transforms:
        if isinstance(t, Compose):
            out += batched_twins(t.transforms)
        elif isinstance(t, (EnsureTyped, Identityd)):
            continue
        elif isinstance(t, RandFlipd):
            out.append(RandFlipBatchd(t.keys, prob=t.prob, spatial_axis=t.flipper.spatial_axis))
        elif isinstance(t, RandRotate90d):
            if tuple(t.spatial_axes) != (0, 1):
                raise ValueError(f"RandRotate90d with spatial_axes {t.spatial_axes} has no batched twin (0, 1 only).")
            out.append(RandRotate90Batchd(t.keys, prob=t.prob, max_k=t.max_k))
        elif isinstance(t, RandAffined):
            out.append(_affine_twin(t))
        elif isinstance(t, RandAdjustContrastd):
            out.append(RandAdjustContrastBatchd(t.keys, prob=t.prob, gamma=tuple(t.adjuster.gamma)))
        elif isinstance(t, RandScaleIntensityd):
            out.append(RandScaleIntensityBatchd(t.keys, prob=t.prob, factors=tuple(t.scaler.factors)))
        elif isinstance(t, RandShiftIntensityd):
            out.append(RandShiftIntensityBatchd(
                t.keys, prob=t.prob, offsets=tuple(t.shifter.offsets), channel_wise=t.shifter.channel_wise
            ))  # fmt: skip
        elif isinstance(t, RandGaussianSmoothd):
            smooth = t.rand_smooth
            out.append(RandGaussianSmoothBatchd(t.keys, prob=t.prob, sigma_x=smooth.sigma_x, sigma_y=smooth.sigma_y))
        elif isinstance(t, RepeatChanneld):
            out.append(RepeatChannelBatchd(t.keys, repeats=t.repeater.repeats))
        elif isinstance(t, NormalizeIntensityd):
            norm = t.normalizer
            if norm.subtrahend is None or norm.divisor is None:
                raise ValueError("NormalizeIntensityd without subtrahend and divisor has no batched twin.")
            out.append(NormalizeIntensityBatchd(t.keys, norm.subtrahend, norm.divisor))
        else:
            raise ValueError(
                f"{type(t).__name__} has no batched twin: the device data path (data_path: device) runs the random "
                "transforms per batch; use data_path: monai, or one of the transforms batched_twins lists."
            )
    return out
