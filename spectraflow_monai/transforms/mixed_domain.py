"""Mixed-domain inputs for SpectraFlow Stage-1 pretraining: binary masks rendered as images.

SpectraFlow (Chen et al.), Sec. "Mixed-Domain Latent Pretraining": "we repeat the single-channel mask along the
channel dimension to match the encoder input format ... masks are used strictly as additional inputs, never as
prediction targets ... Image and mask inputs are mixed with a fixed sampling ratio to form Stage-1 mini-batches."

:class:`MaskToImage` renders a mask as an encoder input (0/1 in the intensity range of the images, repeated to the
image channels, normalised like the images). :class:`RandMixedDomain` / :class:`RandMixedDomaind` replace an image
by its rendered mask with probability ``mask_ratio`` and record the domain (0 image, 1 mask), which the MeanFlow
head may use as a condition. The mixing is a per-sample Bernoulli draw, so ``mask_ratio`` is the expected fraction
of masks in a mini-batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from monai.config import KeysCollection
from monai.config.type_definitions import NdarrayOrTensor
from monai.transforms.transform import MapTransform, RandomizableTransform, Transform
from monai.utils import convert_to_dst_type, convert_to_tensor

from spectraflow_monai.utils.settings import IMAGENET_MEAN, IMAGENET_STD  # defined once, with the model settings

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MaskToImage",
    "RandMixedDomain",
    "RandMixedDomaind",
    "RandMixedDomainD",
    "RandMixedDomainDict",
    "check_mixing_keys",
    "drop_mask",
    "mask_renderer",
    "mix_image_or_mask",
]


DOMAIN_IMAGE = 0
DOMAIN_MASK = 1


def _as_stats(value: float | Sequence[float] | None, name: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return (float(value),)
    try:
        stats = tuple(float(v) for v in value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be None, a number or a sequence of numbers, got {value!r}.") from e
    if len(stats) == 0:
        raise ValueError(f"{name} must not be empty, got {value!r}.")
    return stats


def _check_stats_channels(stats: tuple[float, ...] | None, name: str, channels: int) -> None:
    if stats is not None and len(stats) not in (1, channels):
        raise ValueError(f"{name} has {len(stats)} values but the output has {channels} channel(s): {stats}.")


def _spatial_shape_of_mask(mask: NdarrayOrTensor, image_ndim: int | None = None) -> tuple[int, ...]:
    """Spatial shape of a (1, *S) or (*S) mask; with ``image_ndim`` (channel-first image) the layout is checked."""
    shape = tuple(mask.shape)
    if image_ndim is None:
        if len(shape) == 2:
            return shape
        if len(shape) >= 3 and shape[0] == 1:
            return shape[1:]
        raise ValueError(f"mask must have shape (1, H, W[, D]) or (H, W), got {shape}.")
    if len(shape) == image_ndim and shape[0] == 1:
        return shape[1:]
    if len(shape) == image_ndim - 1:
        return shape
    raise ValueError(
        f"mask must have one channel, (1, *spatial), or no channel dimension, to match a channel-first image with "
        f"{image_ndim} dimensions; got mask shape {shape}."
    )


class MaskToImage(Transform):
    """Render a binary or label mask as an encoder input image (SpectraFlow, mixed-domain Stage-1 inputs).

    The mask (1, H, W[, D]) or (H, W) becomes a float32 image (C, H, W[, D]): background 0 and foreground
    ``foreground_value`` (the intensity range of the images before normalisation, [0, 1] by default), repeated to
    ``channels`` channels, then normalised per channel as ``(x - mean[c]) / std[c]`` so that the mask looks like a
    black-and-white image to the encoder. Use it after the images' own normalisation, with the same ``mean`` /
    ``std`` (or ``mean=std=None`` when the normalisation comes later in the pipeline and applies to both).

    Args:
        channels: number of output channels (the encoder's input channels). Defaults to 3.
        foreground_value: intensity of the foreground before normalisation. Defaults to 1.0.
        mean: per-channel mean (a sequence of ``channels`` values or one number), None for no normalisation.
            Defaults to the ImageNet mean.
        std: per-channel standard deviation (> 0), None for no normalisation. Defaults to the ImageNet std.
        binarize: if True the foreground is ``mask > 0`` (multi-class label maps such as Synapse become one
            foreground); if False the label values are scaled to [0, 1] by ``max_label`` before
            ``foreground_value`` is applied. Defaults to True.
        max_label: the label value mapped to ``foreground_value`` when ``binarize=False``; None uses each mask's
            maximum (a fixed value, e.g. 8 for Synapse, keeps an organ's grey level the same across slices).
            Defaults to None.

    Raises:
        ValueError: for ``channels < 1``, a non-positive ``std``, ``mean`` / ``std`` lengths that match neither 1 nor
            ``channels``, or ``max_label <= 0``.
    """

    def __init__(
        self,
        channels: int = 3,
        foreground_value: float = 1.0,
        mean: float | Sequence[float] | None = IMAGENET_MEAN,
        std: float | Sequence[float] | None = IMAGENET_STD,
        binarize: bool = True,
        max_label: float | None = None,
    ) -> None:
        if isinstance(channels, bool) or int(channels) != channels or channels < 1:
            raise ValueError(f"channels must be an integer >= 1, got {channels!r}.")
        self.channels = int(channels)
        self.foreground_value = float(foreground_value)
        self.mean = _as_stats(mean, "mean")
        self.std = _as_stats(std, "std")
        if (self.mean is None) != (self.std is None):
            raise ValueError(f"mean and std must both be given or both be None, got mean={mean!r}, std={std!r}.")
        if self.std is not None and any(s <= 0 for s in self.std):
            raise ValueError(f"std must be > 0, got {std!r}.")
        _check_stats_channels(self.mean, "mean", self.channels)
        _check_stats_channels(self.std, "std", self.channels)
        if max_label is not None and not max_label > 0:
            raise ValueError(f"max_label must be > 0 or None, got {max_label!r}.")
        self.binarize = binarize
        self.max_label = max_label

    def render(self, mask: NdarrayOrTensor, channels: int | None = None) -> torch.Tensor:
        """Render ``mask`` as a plain float32 torch tensor with ``channels`` (default ``self.channels``) channels."""
        channels = self.channels if channels is None else int(channels)
        _check_stats_channels(self.mean, "mean", channels)
        _check_stats_channels(self.std, "std", channels)
        spatial = _spatial_shape_of_mask(mask)
        m = convert_to_tensor(mask, track_meta=False).reshape(1, *spatial)
        if m.dtype == torch.bool:
            m = m.to(torch.float32)
        if self.binarize:
            x = (m > 0).to(torch.float32)
        else:
            x = m.to(torch.float32).clamp_min(0.0)
            top = float(x.max()) if self.max_label is None else float(self.max_label)
            x = (x / top).clamp(max=1.0) if top > 0 else x
        x = (x * self.foreground_value).expand(channels, *spatial)
        if self.mean is not None and self.std is not None:
            view = (-1,) + (1,) * len(spatial)
            mean = torch.as_tensor(self.mean, dtype=torch.float32, device=x.device).reshape(view)
            std = torch.as_tensor(self.std, dtype=torch.float32, device=x.device).reshape(view)
            x = (x - mean) / std
        return x.contiguous()

    def render_batch(self, masks: torch.Tensor, channels: int | None = None) -> torch.Tensor:
        """Render a batch of masks (B, 1, H, W[, D]) on its device as :meth:`render` renders each: (B, channels, ...)
        float32, with no host synchronisation (``max_label=None`` takes each mask's maximum on the device)."""
        channels = self.channels if channels is None else int(channels)
        _check_stats_channels(self.mean, "mean", channels)
        _check_stats_channels(self.std, "std", channels)
        if masks.ndim < 3 or masks.shape[1] != 1:
            raise ValueError(f"masks must be a (B, 1, H, W[, D]) batch, got shape {tuple(masks.shape)}.")
        m = masks.as_tensor() if hasattr(masks, "as_tensor") else masks
        spatial = (1,) * (m.ndim - 2)
        if self.binarize:
            x = (m > 0).to(torch.float32)
        else:
            x = m.to(torch.float32).clamp_min(0.0)
            if self.max_label is None:
                top = x.flatten(1).amax(dim=1).reshape(-1, 1, *spatial)
                x = torch.where(top > 0, (x / top.clamp_min(1e-30)).clamp(max=1.0), x)
            else:
                x = (x / float(self.max_label)).clamp(max=1.0)
        x = (x * self.foreground_value).expand(-1, channels, *m.shape[2:])
        if self.mean is not None and self.std is not None:
            key = (x.device, channels, x.ndim)
            cache = self.__dict__.setdefault("_batch_stats", {})
            if key not in cache:  # copied to the device once
                shape = (1, -1, *spatial)
                mean = torch.tensor(self.mean, dtype=torch.float32).expand(channels if len(self.mean) == 1 else -1)
                std = torch.tensor(self.std, dtype=torch.float32).expand(channels if len(self.std) == 1 else -1)
                cache[key] = (mean.reshape(shape).to(x.device), std.reshape(shape).to(x.device))
            mean, std = cache[key]
            x = (x - mean) / std
        return x.contiguous()

    def __call__(self, mask: NdarrayOrTensor) -> NdarrayOrTensor:
        """
        Args:
            mask: (1, H, W[, D]) or (H, W) binary or label mask (numpy, torch or MetaTensor).

        Returns:
            float32 image (channels, H, W[, D]) of the same array type (and metadata) as ``mask``.
        """
        out, *_ = convert_to_dst_type(self.render(mask), dst=mask, dtype=torch.float32)
        return out


def check_mixing_keys(keys: tuple, mask_key: Hashable, domain_key: Hashable) -> None:
    """Raise ``ValueError`` unless the image ``keys``, the ``mask_key`` and the ``domain_key`` of a mixed-domain
    transform are all different (the mask must never be read as an image or a target)."""
    if mask_key in keys:
        raise ValueError(f"mask_key {mask_key!r} must not be one of keys {keys}.")
    if domain_key in keys or domain_key == mask_key:
        raise ValueError(f"domain_key {domain_key!r} must differ from keys {keys} and mask_key {mask_key!r}.")


def mask_renderer(
    mean: float | Sequence[float] | None,
    std: float | Sequence[float] | None,
    foreground_value: float,
    binarize: bool,
    max_label: float | None,
) -> MaskToImage:
    """The :class:`MaskToImage` of the mixed-domain transforms: one channel per ``mean`` value."""
    stats = _as_stats(mean, "mean")
    return MaskToImage(
        channels=len(stats) if stats is not None else 1,
        foreground_value=foreground_value,
        mean=mean,
        std=std,
        binarize=binarize,
        max_label=max_label,
    )


def drop_mask(d: dict, mask_key: Hashable) -> None:
    """Remove the mask (and its legacy meta entries) so that it can never be used as a target."""
    for k in (mask_key, f"{mask_key}_meta_dict", f"{mask_key}_transforms"):
        d.pop(k, None)


class RandMixedDomain(RandomizableTransform):
    """With probability ``mask_ratio``, replace an image by its mask rendered as an image (SpectraFlow Stage-1).

    ``__call__(img, mask)`` returns ``(out, domain)``: ``out`` is ``img`` (domain 0) or the mask rendered by
    :class:`MaskToImage` with ``img``'s channel count, type and metadata (domain 1). ``domain`` is a 0-d int64
    torch tensor for torch images and an ``np.int64`` for numpy images. ``mask_ratio=0`` gives the image-only
    ablation, ``mask_ratio=1`` masks only. The mask is only ever an input, never a target.

    Args:
        mask_ratio: probability of returning the mask, in [0, 1]. Defaults to 0.5.
        foreground_value: see :class:`MaskToImage`. Defaults to 1.0.
        mean: see :class:`MaskToImage`; its length must be 1 or the image's channel count. Defaults to ImageNet.
        std: see :class:`MaskToImage`. Defaults to ImageNet.
        binarize: see :class:`MaskToImage`. Defaults to True.
        max_label: see :class:`MaskToImage`. Defaults to None.

    Raises:
        ValueError: for ``mask_ratio`` outside [0, 1] and the :class:`MaskToImage` argument errors; at call time,
            when the spatial shapes of image and mask differ.
    """

    def __init__(
        self,
        mask_ratio: float = 0.5,
        foreground_value: float = 1.0,
        mean: float | Sequence[float] | None = IMAGENET_MEAN,
        std: float | Sequence[float] | None = IMAGENET_STD,
        binarize: bool = True,
        max_label: float | None = None,
    ) -> None:
        if isinstance(mask_ratio, bool) or not 0.0 <= float(mask_ratio) <= 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1], got {mask_ratio!r}.")
        RandomizableTransform.__init__(self, prob=float(mask_ratio))
        self.mask_ratio = float(mask_ratio)
        self.mask_to_image = mask_renderer(mean, std, foreground_value, binarize, max_label)

    def __call__(
        self, img: NdarrayOrTensor, mask: NdarrayOrTensor, randomize: bool = True
    ) -> tuple[NdarrayOrTensor, NdarrayOrTensor | np.int64]:
        """
        Args:
            img: channel-first image (C, H, W[, D]).
            mask: (1, H, W[, D]) or (H, W[, D]) mask with the spatial shape of ``img``.
            randomize: whether to draw a new image/mask decision. Defaults to True.
        """
        if randomize:
            self.randomize(None)
        out = mix_image_or_mask(self.mask_to_image, img, mask, self._do_transform, "img", "mask")
        return out, _domain_like(img, self._do_transform)


def mix_image_or_mask(m2i: MaskToImage, img: Any, mask: Any, use_mask: bool, img_name: str, mask_name: str) -> Any:
    """``img``, or with ``use_mask`` the ``mask`` rendered by ``m2i`` on ``img``'s grid and type (shapes checked,
    named by ``img_name`` / ``mask_name``): one sample of a mixed-domain batch."""
    if not hasattr(img, "shape") or len(img.shape) < 3:
        raise ValueError(
            f"{img_name} must be a channel-first array (C, H, W[, D]), got {getattr(img, 'shape', type(img))}."
        )
    if not hasattr(mask, "shape"):
        raise ValueError(f"{mask_name} must be an array or tensor, got {type(mask).__name__}.")
    try:
        mask_spatial = _spatial_shape_of_mask(mask, image_ndim=len(img.shape))
    except ValueError as e:
        raise ValueError(
            f"{mask_name} shape {tuple(mask.shape)} does not fit {img_name} shape {tuple(img.shape)}: {e}"
        ) from e
    if tuple(mask_spatial) != tuple(img.shape[1:]):
        raise ValueError(
            f"spatial shapes differ: {img_name} shape {tuple(img.shape)} vs {mask_name} shape {tuple(mask.shape)}."
        )
    if not use_mask:
        return img
    rendered = m2i.render(mask.reshape(1, *mask_spatial), channels=int(img.shape[0]))
    out, *_ = convert_to_dst_type(rendered, dst=img, dtype=torch.float32)
    return out


def _domain_like(img: Any, use_mask: bool) -> torch.Tensor | np.int64:
    value = DOMAIN_MASK if use_mask else DOMAIN_IMAGE
    if isinstance(img, torch.Tensor):
        return torch.tensor(value, dtype=torch.int64)
    return np.int64(value)


class RandMixedDomaind(RandomizableTransform, MapTransform):
    """Dictionary version of :class:`RandMixedDomain` (SpectraFlow mixed-domain Stage-1 mini-batches).

    With probability ``mask_ratio`` every ``keys`` entry (the image) is replaced by ``data[mask_key]`` rendered as an
    image (0/1 mapped to ``[0, foreground_value]``, repeated to the image's channels, normalised with ``mean`` /
    ``std``); the output keeps the image's array type, device and metadata. ``data[domain_key]`` is set to 1 (mask)
    or 0 (image). With ``drop_mask=True`` the mask (and a legacy ``{mask_key}_meta_dict`` /
    ``{mask_key}_transforms`` entry) is removed so that it can never be used as a target.

    Place it after the images' intensity scaling to [0, 1] and their mean/std normalisation, with the same
    ``mean`` / ``std``; or pass ``mean=std=None`` and normalise the "image" key afterwards.

    Args:
        keys: image key(s) to replace. Defaults to ``("image",)``.
        mask_key: key of the (1, H, W[, D]) or (H, W[, D]) mask. Defaults to ``"label"``.
        mask_ratio: probability of using the mask, in [0, 1]; 0 is the image-only ablation. Defaults to 0.5.
        domain_key: key receiving the domain flag (0-d int64 tensor for torch images, ``np.int64`` for numpy).
            Defaults to ``"domain"``.
        drop_mask: remove ``mask_key`` from the output. Defaults to True.
        mean: per-channel mean (1 value or one per image channel), None for no normalisation. Defaults to ImageNet.
        std: per-channel std (> 0), None for no normalisation. Defaults to ImageNet.
        foreground_value: mask foreground intensity before normalisation. Defaults to 1.0.
        binarize: foreground = label > 0; if False the label map is scaled to [0, 1] by ``max_label``.
            Defaults to True.
        max_label: see :class:`MaskToImage`. Defaults to None.
        allow_missing_keys: skip missing image keys; a sample without ``mask_key`` is then kept as an image
            (domain 0). Defaults to False.

    Raises:
        ValueError: for ``mask_ratio`` outside [0, 1], ``mask_key`` / ``domain_key`` clashing with ``keys`` or with
            each other, and the :class:`MaskToImage` argument errors; at call time, when the spatial shapes of
            image and mask differ.
        KeyError: when ``mask_key`` is missing and ``allow_missing_keys`` is False.
    """

    def __init__(
        self,
        keys: KeysCollection = ("image",),
        mask_key: Hashable = "label",
        mask_ratio: float = 0.5,
        domain_key: Hashable = "domain",
        drop_mask: bool = True,
        mean: float | Sequence[float] | None = IMAGENET_MEAN,
        std: float | Sequence[float] | None = IMAGENET_STD,
        foreground_value: float = 1.0,
        binarize: bool = True,
        max_label: float | None = None,
        allow_missing_keys: bool = False,
    ) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        if isinstance(mask_ratio, bool) or not 0.0 <= float(mask_ratio) <= 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1], got {mask_ratio!r}.")
        RandomizableTransform.__init__(self, prob=float(mask_ratio))
        check_mixing_keys(self.keys, mask_key, domain_key)
        self.mask_key = mask_key
        self.mask_ratio = float(mask_ratio)
        self.domain_key = domain_key
        self.drop_mask = drop_mask
        self.mask_to_image = mask_renderer(mean, std, foreground_value, binarize, max_label)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        self.randomize(None)
        if self.mask_key not in d:
            if not self.allow_missing_keys:
                raise KeyError(
                    f"mask_key {self.mask_key!r} of {self.__class__.__name__} is missing from the data (keys "
                    f"{list(d)}) and allow_missing_keys is False."
                )
            use_mask = False
        else:
            use_mask = bool(self._do_transform)
        domain: Any = None
        for key in self.key_iterator(d):
            if self.mask_key in d:
                d[key] = mix_image_or_mask(self.mask_to_image, d[key], d[self.mask_key], use_mask, repr(key), repr(self.mask_key))
            if domain is None:
                domain = _domain_like(d[key], use_mask)
        d[self.domain_key] = domain if domain is not None else np.int64(DOMAIN_MASK if use_mask else DOMAIN_IMAGE)
        if self.drop_mask:
            drop_mask(d, self.mask_key)
        return d


RandMixedDomainD = RandMixedDomainDict = RandMixedDomaind
