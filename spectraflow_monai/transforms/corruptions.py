"""Appearance corruptions at fixed severities, for the robustness evaluation of SpectraFlow (paper Fig. 5).

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Sec. "Robustness against Appearance Shifts") corrupts the Kvasir-SEG test images with brightness,
contrast, Gaussian blur and Gaussian noise and reports the Dice of each model under each. The paper does not give the
parameters; the severities here follow ImageNet-C (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR 2019), levels 1-5, with level 0 the clean image.

Severity table (:data:`CORRUPTION_SEVERITIES`; intensities in [0, 1], sigma in pixels of the image as given):

============== ============================================ ===== ===== ===== ===== ===== =====
kind           parameter                                      0     1     2     3     4     5
============== ============================================ ===== ===== ===== ===== ===== =====
brightness     shift ``b``: ``x + b``                        0     0.1   0.2   0.3   0.4   0.5
contrast       factor ``c``: ``(x - mean_ch) * c + mean_ch``  1     0.4   0.3   0.2   0.1   0.05
gaussian_blur  sigma (pixels), replicate-padded border       0     1     2     3     4     6
gaussian_noise std ``s``: ``x + N(0, s^2)`` per pixel         0     0.08  0.12  0.18  0.26  0.38
============== ============================================ ===== ===== ===== ===== ===== =====

Every corruption clips its output to [0, 1]; severity 0 returns the input unchanged (the same object, not even
clipped). ``mean_ch`` is the mean of each channel over the image. Brightness is a shift of every channel (ImageNet-C
shifts the HSV value channel of RGB images; for a grey image the two agree).

Place the transforms where the image is in [0, 1] and before it is standardised: after ``LoadImaged`` /
``ScaleIntensityRanged(a_min=0, a_max=255, b_min=0, b_max=1)`` (and after resizing to the evaluation size, 224² in the
paper protocol, so that the blur sigma is in pixels of the network input) and before ``NormalizeIntensityd``.

MONAI's intensity transforms do the arithmetic: :class:`monai.transforms.ShiftIntensity` (brightness),
:class:`monai.transforms.ScaleIntensityFixedMean` (contrast), :class:`monai.transforms.GaussianSmooth` (blur) and
:class:`monai.transforms.RandGaussianNoise` (noise). The noise is drawn from the transform's own random state
(``seed``, default 0), so an evaluation run twice on the same images in the same order sees the same noise;
``set_random_state`` (called by ``Compose.set_random_state`` and ``monai.utils.set_determinism``) reseeds it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from monai.config import KeysCollection
from monai.transforms import (
    GaussianSmooth,
    MapTransform,
    RandGaussianNoise,
    Randomizable,
    ScaleIntensityFixedMean,
    ShiftIntensity,
    Transform,
)
from monai.utils import TransformBackends, convert_to_dst_type, convert_to_tensor

from spectraflow_monai.utils.settings import CORRUPTION_KINDS, CORRUPTION_SEVERITIES, MAX_SEVERITY

__all__ = [
    "CORRUPTION_KINDS",
    "CORRUPTION_SEVERITIES",
    "MAX_SEVERITY",
    "corruption_parameter",
    "BrightnessCorruption",
    "BrightnessCorruptiond",
    "ContrastCorruption",
    "ContrastCorruptiond",
    "GaussianBlurCorruption",
    "GaussianBlurCorruptiond",
    "GaussianNoiseCorruption",
    "GaussianNoiseCorruptiond",
    "Corruption",
    "Corruptiond",
]

# CORRUPTION_SEVERITIES (the parameter of each kind at severity 0..5), CORRUPTION_KINDS (paper Fig. 5) and
# MAX_SEVERITY are owned by spectraflow_monai.utils.settings (command lines list them without loading torch).


def _check_severity(severity: Any) -> int:
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 0 <= severity <= MAX_SEVERITY:
        raise ValueError(f"severity must be an integer in [0, {MAX_SEVERITY}], got {severity!r}.")
    return int(severity)


def _check_kind(kind: Any) -> str:
    if not isinstance(kind, str) or kind not in CORRUPTION_SEVERITIES:
        raise ValueError(f"kind must be one of {list(CORRUPTION_KINDS)}, got {kind!r}.")
    return kind


def _check_seed(seed: Any) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed must be None or a non-negative integer, got {seed!r}.")
    return None if seed is None else int(seed)


def corruption_parameter(kind: str, severity: int) -> float:
    """The parameter of ``kind`` at ``severity`` (shift, contrast factor, blur sigma or noise std).

    Raises:
        ValueError: unknown ``kind`` or ``severity`` outside 0..5.
    """
    return CORRUPTION_SEVERITIES[_check_kind(kind)][_check_severity(severity)]


class _SeverityCorruption(Transform):
    """Shared plumbing: severity check, float conversion, clipping to [0, 1], output type and metadata kept."""

    backend = [TransformBackends.TORCH, TransformBackends.NUMPY]
    kind = ""

    def __init__(self, severity: int = 1) -> None:
        self.severity = _check_severity(severity)
        self.param = CORRUPTION_SEVERITIES[self.kind][self.severity]

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, img: Any) -> Any:
        """Corrupt a channel-first image ``(C, H, W[, D])`` in [0, 1] (numpy array, tensor or ``MetaTensor``).

        Returns:
            the same type, shape, device and floating dtype (integer inputs come back as float32), metadata kept;
            ``img`` itself at severity 0.
        """
        if self.severity == 0:
            return img
        x = convert_to_tensor(img, track_meta=False)
        dtype = x.dtype if x.is_floating_point() else torch.float32
        out = convert_to_tensor(self._apply(x.to(dtype)), track_meta=False).clamp(0.0, 1.0)
        return convert_to_dst_type(out, dst=img, dtype=dtype)[0]


class BrightnessCorruption(_SeverityCorruption):
    """Brightness shift ``clip(x + b, 0, 1)`` with ``b`` from :data:`CORRUPTION_SEVERITIES` (paper Fig. 5).

    Args:
        severity: 0 (identity) to 5: ``b`` = 0, 0.1, 0.2, 0.3, 0.4, 0.5. Defaults to 1.
    """

    kind = "brightness"

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        return ShiftIntensity(offset=self.param)(x)


class ContrastCorruption(_SeverityCorruption):
    """Contrast reduction ``clip((x - m) * c + m, 0, 1)``, ``m`` the mean of each channel (paper Fig. 5).

    Args:
        severity: 0 (identity) to 5: ``c`` = 1, 0.4, 0.3, 0.2, 0.1, 0.05. Defaults to 1.
    """

    kind = "contrast"

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        return ScaleIntensityFixedMean(factor=self.param - 1.0, fixed_mean=True, channel_wise=True, dtype=None)(x)


class GaussianBlurCorruption(_SeverityCorruption):
    """Gaussian blur of every channel with sigma in pixels, border replicated (paper Fig. 5).

    The image is padded by the kernel radius with its edge values before :class:`monai.transforms.GaussianSmooth`
    (which pads with zeros and would darken the border) and cropped back, so a constant image stays constant.

    Args:
        severity: 0 (identity) to 5: sigma = 0, 1, 2, 3, 4, 6 pixels. Defaults to 1.
    """

    kind = "gaussian_blur"

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        spatial = x.ndim - 1
        if spatial not in (2, 3):
            raise ValueError(f"img must be channel-first 2D or 3D (C, H, W[, D]), got shape {tuple(x.shape)}.")
        pad = int(self.param * 4.0 + 0.5) + 1  # GaussianFilter's kernel radius (truncated=4) plus one
        padded = F.pad(x.unsqueeze(0), [pad] * (2 * spatial), mode="replicate").squeeze(0)
        out = convert_to_tensor(GaussianSmooth(sigma=self.param)(padded), track_meta=False)
        crop = (slice(None),) + (slice(pad, -pad),) * spatial
        return out[crop].to(x.dtype)


class GaussianNoiseCorruption(_SeverityCorruption, Randomizable):
    """Additive Gaussian noise ``clip(x + N(0, s^2), 0, 1)``, independent per pixel and channel (paper Fig. 5).

    The noise comes from this transform's random state (seeded with ``seed``), so a fixed seed and the same
    image order give the same corrupted images.

    Args:
        severity: 0 (identity) to 5: ``s`` = 0, 0.08, 0.12, 0.18, 0.26, 0.38. Defaults to 1.
        seed: seed of the random state; None draws it from numpy's global state. Defaults to 0.
    """

    kind = "gaussian_noise"

    def __init__(self, severity: int = 1, seed: int | None = 0) -> None:
        super().__init__(severity)
        self._noise = RandGaussianNoise(prob=1.0, mean=0.0, std=self.param, sample_std=False, dtype=None)
        self.set_random_state(seed=_check_seed(seed))

    def set_random_state(self, seed: int | None = None, state: np.random.RandomState | None = None) -> Randomizable:
        super().set_random_state(seed, state)
        self._noise.set_random_state(state=self.R)
        return self

    def randomize(self, data: Any = None) -> None:
        """Draw the noise for an image shaped like ``data``."""
        self._noise.randomize(data)

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        return self._noise(x, randomize=True)


_CLASSES: dict[str, type[_SeverityCorruption]] = {
    "brightness": BrightnessCorruption,
    "contrast": ContrastCorruption,
    "gaussian_blur": GaussianBlurCorruption,
    "gaussian_noise": GaussianNoiseCorruption,
}


class Corruption(Randomizable, Transform):
    """One corruption of paper Fig. 5 chosen by name, e.g. ``Corruption("contrast", 3)``.

    Args:
        kind: ``"brightness"``, ``"contrast"``, ``"gaussian_blur"`` or ``"gaussian_noise"``.
        severity: 0 (identity) to 5, see :data:`CORRUPTION_SEVERITIES`. Defaults to 1.
        seed: seed of the noise (``"gaussian_noise"`` only). Defaults to 0.

    Raises:
        ValueError: unknown ``kind``, ``severity`` outside 0..5, or a negative ``seed``.
    """

    backend = _SeverityCorruption.backend

    def __init__(self, kind: str, severity: int = 1, seed: int | None = 0) -> None:
        self.kind = _check_kind(kind)
        seed = _check_seed(seed)
        cls = _CLASSES[self.kind]
        self.transform: _SeverityCorruption
        if cls is GaussianNoiseCorruption:
            self.transform = GaussianNoiseCorruption(severity, seed=seed)
        else:
            self.transform = cls(severity)
        self.severity = self.transform.severity

    def set_random_state(self, seed: int | None = None, state: np.random.RandomState | None = None) -> Randomizable:
        super().set_random_state(seed, state)
        if isinstance(self.transform, Randomizable):
            self.transform.set_random_state(state=self.R)
        return self

    def randomize(self, data: Any = None) -> None:
        if isinstance(self.transform, Randomizable):
            self.transform.randomize(data)

    def __call__(self, img: Any) -> Any:
        """Corrupt a channel-first image in [0, 1]; see :class:`BrightnessCorruption` for the types kept."""
        return self.transform(img)


class _CorruptionDict(MapTransform):
    """Apply ``self.corrupter`` to every key."""

    backend = _SeverityCorruption.backend

    def __init__(self, keys: KeysCollection, corrupter: Any, allow_missing_keys: bool = False) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        self.corrupter = corrupter

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.corrupter(d[key])
        return d


class _RandomCorruptionDict(Randomizable, _CorruptionDict):
    """A :class:`_CorruptionDict` whose corrupter may draw noise: ``set_random_state`` is forwarded to it."""

    def set_random_state(self, seed: int | None = None, state: np.random.RandomState | None = None) -> Randomizable:
        super().set_random_state(seed, state)
        if isinstance(self.corrupter, Randomizable):
            self.corrupter.set_random_state(state=self.R)
        return self

    def randomize(self, data: Any = None) -> None:
        if isinstance(self.corrupter, Randomizable):
            self.corrupter.randomize(data)


class BrightnessCorruptiond(_CorruptionDict):
    """Dictionary-based :class:`BrightnessCorruption`.

    Args:
        keys: keys of the images to corrupt (not the labels). Defaults to ``"image"``.
        severity: 0 (identity) to 5. Defaults to 1.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    def __init__(self, keys: KeysCollection = "image", severity: int = 1, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, BrightnessCorruption(severity), allow_missing_keys)


class ContrastCorruptiond(_CorruptionDict):
    """Dictionary-based :class:`ContrastCorruption` (arguments as :class:`BrightnessCorruptiond`)."""

    def __init__(self, keys: KeysCollection = "image", severity: int = 1, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, ContrastCorruption(severity), allow_missing_keys)


class GaussianBlurCorruptiond(_CorruptionDict):
    """Dictionary-based :class:`GaussianBlurCorruption` (arguments as :class:`BrightnessCorruptiond`)."""

    def __init__(self, keys: KeysCollection = "image", severity: int = 1, allow_missing_keys: bool = False) -> None:
        super().__init__(keys, GaussianBlurCorruption(severity), allow_missing_keys)


class GaussianNoiseCorruptiond(_RandomCorruptionDict):
    """Dictionary-based :class:`GaussianNoiseCorruption`; each key gets its own draw.

    Args:
        keys: keys of the images to corrupt (not the labels). Defaults to ``"image"``.
        severity: 0 (identity) to 5. Defaults to 1.
        seed: seed of the noise. Defaults to 0.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    def __init__(
        self, keys: KeysCollection = "image", severity: int = 1, seed: int | None = 0, allow_missing_keys: bool = False
    ) -> None:
        super().__init__(keys, GaussianNoiseCorruption(severity, seed=seed), allow_missing_keys)


class Corruptiond(_RandomCorruptionDict):
    """Dictionary-based :class:`Corruption`, e.g. ``Corruptiond("image", kind="gaussian_blur", severity=2)``.

    Args:
        keys: keys of the images to corrupt (not the labels). Defaults to ``"image"``.
        kind: ``"brightness"``, ``"contrast"``, ``"gaussian_blur"`` or ``"gaussian_noise"``. Defaults to
            ``"brightness"``.
        severity: 0 (identity) to 5. Defaults to 1.
        seed: seed of the noise (``"gaussian_noise"`` only). Defaults to 0.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    def __init__(
        self,
        keys: KeysCollection = "image",
        kind: str = "brightness",
        severity: int = 1,
        seed: int | None = 0,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, Corruption(kind, severity, seed=seed), allow_missing_keys)
