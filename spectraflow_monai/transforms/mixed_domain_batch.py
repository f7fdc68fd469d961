"""Stage-1 mini-batches with a fixed image/mask ratio (SpectraFlow, Sec. "Mixed-Domain Latent Pretraining").

The paper: "Image and mask inputs are mixed with a fixed sampling ratio to form Stage-1 mini-batches." A per-sample
coin flip (:class:`~spectraflow_monai.transforms.RandMixedDomaind`) gives that ratio only in expectation; the
composition of each mini-batch then varies. :class:`MixedDomainCollate` is a ``DataLoader`` ``collate_fn`` that
shows exactly ``round(mask_ratio * B)`` samples of every mini-batch of ``B`` samples as their masks and the others
as their images, then collates with MONAI's ``list_data_collate``.

What one Stage-1 epoch shows (``views``, the bundles' ``stage1_views``): every training pair is drawn once (the
sampler's order) and is shown

- ``"either"`` (default): as its image or as its mask, ``round(mask_ratio * B)`` of every mini-batch of ``B`` pairs
  as masks; over ``E`` epochs a pair is seen about ``mask_ratio * E`` times as a mask and ``(1 - mask_ratio) * E``
  times as an image;
- ``"both"``: as its image and as its mask, so a mini-batch of ``B`` pairs becomes ``2 B`` samples (the ``B`` images,
  then the ``B`` masks; half of them masks, so ``mask_ratio`` must be 0.5) and every epoch shows each pair once in
  each domain.

The paper ("image and mask inputs are mixed with a fixed sampling ratio to form Stage-1 mini-batches") does not say
which. Under DDP each process collates its own mini-batch, so each per-process batch (and therefore the global batch)
holds the exact count.

The rows shown as masks are drawn from torch's global generator, which PyTorch seeds per ``DataLoader`` worker from
the loader's base seed (itself drawn from the generator that :func:`monai.utils.set_determinism` seeds): a run is
reproducible for a fixed seed and number of workers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from monai.config import KeysCollection
from monai.data import list_data_collate
from monai.utils import ensure_tuple

from spectraflow_monai.transforms.batched import BatchRandomizable
from spectraflow_monai.transforms.mixed_domain import (
    DOMAIN_IMAGE,
    DOMAIN_MASK,
    IMAGENET_MEAN,
    IMAGENET_STD,
    check_mixing_keys,
    drop_mask,
    mix_image_or_mask,
    mask_renderer,
)

__all__ = ["MIXED_DOMAIN_VIEWS", "MixedDomainCollate", "RandMixedDomainBatchd", "num_masks"]

#: what one Stage-1 epoch shows of each image-mask pair: ``"either"`` its image or its mask, ``"both"`` both.
MIXED_DOMAIN_VIEWS: tuple[str, ...] = ("either", "both")


def num_masks(batch_size: int, mask_ratio: float) -> int:
    """The number of masks in a mini-batch of ``batch_size`` samples: ``round(mask_ratio * batch_size)``.

    Python's ``round`` (half to even) is used, so ``mask_ratio=0.5`` gives 4 of 8 and 2 of 5.
    """
    return int(round(float(mask_ratio) * int(batch_size)))


class MixedDomainCollate:
    """``collate_fn`` that shows exactly ``round(mask_ratio * B)`` samples of each mini-batch as masks (Stage-1), or
    (``views="both"``) every sample twice, as its image and as its mask.

    Each sample is a dictionary holding the image (``keys``) and its mask (``mask_key``, an input only, never a
    target). The chosen samples' images are replaced by the mask rendered with
    :class:`~spectraflow_monai.transforms.MaskToImage` (0/1 in the images' intensity range, repeated to the image
    channels, normalised with ``mean`` / ``std``); ``domain_key`` receives 1 for a mask and 0 for an image. The
    mask is dropped before collation (``drop_mask=True``). Place the images' own normalisation before it, in the
    dataset's transforms, with the same ``mean`` / ``std``.

    Args:
        mask_ratio: fraction of every mini-batch shown as masks, in [0, 1]; 0 is the image-only ablation.
            Defaults to 0.5.
        keys: image key(s) to replace. Defaults to ``("image",)``.
        mask_key: key of the (1, H, W[, D]) or (H, W[, D]) mask. Defaults to ``"label"``.
        domain_key: key receiving the 0/1 domain flag (int64). Defaults to ``"domain"``.
        drop_mask: remove ``mask_key`` (and its legacy meta entries) before collation. Defaults to True.
        mean: per-channel mean (1 value or one per image channel), None for no normalisation. Defaults to ImageNet.
        std: per-channel std (> 0), None for no normalisation. Defaults to ImageNet.
        foreground_value: mask foreground intensity before normalisation. Defaults to 1.0.
        binarize: foreground = label > 0; if False the label map is scaled to [0, 1] by ``max_label``.
            Defaults to True.
        max_label: see :class:`~spectraflow_monai.transforms.MaskToImage`. Defaults to None.
        views: what a mini-batch (and so one epoch) shows of each sample (an image-mask pair): ``"either"`` its image
            or its mask (``mask_ratio`` of the mini-batch as masks), ``"both"`` its image and its mask (``2 B``
            samples from ``B`` pairs, images first; ``mask_ratio`` must be 0.5). Defaults to ``"either"``.

    Raises:
        ValueError: for ``views`` not one of :data:`MIXED_DOMAIN_VIEWS`, ``views="both"`` with a ``mask_ratio``
            other than 0.5, ``mask_ratio`` outside [0, 1], ``mask_key`` / ``domain_key`` clashing with ``keys`` or
            with each other, and the :class:`~spectraflow_monai.transforms.MaskToImage` argument errors; at call
            time, for a sample that is not a dictionary or lacks ``mask_key`` while masks are needed.
    """

    def __init__(
        self,
        mask_ratio: float = 0.5,
        keys: KeysCollection = ("image",),
        mask_key: Hashable = "label",
        domain_key: Hashable = "domain",
        drop_mask: bool = True,
        mean: float | Sequence[float] | None = IMAGENET_MEAN,
        std: float | Sequence[float] | None = IMAGENET_STD,
        foreground_value: float = 1.0,
        binarize: bool = True,
        max_label: float | None = None,
        views: str = "either",
    ) -> None:
        if isinstance(mask_ratio, bool) or not isinstance(mask_ratio, (int, float)) or not 0 <= mask_ratio <= 1:
            raise ValueError(f"mask_ratio must be a number in [0, 1], got {mask_ratio!r}.")
        if views not in MIXED_DOMAIN_VIEWS:
            raise ValueError(f"views must be one of {list(MIXED_DOMAIN_VIEWS)}, got {views!r}.")
        if views == "both" and mask_ratio != 0.5:
            raise ValueError(
                f"views='both' shows every pair as its image and as its mask, so half of every mini-batch are masks: "
                f"mask_ratio must be 0.5, got {mask_ratio!r} (views='either' mixes other ratios)."
            )
        self.views = views
        self.keys = ensure_tuple(keys)
        if not self.keys:
            raise ValueError(f"keys must name at least one image key, got {keys!r}.")
        check_mixing_keys(self.keys, mask_key, domain_key)
        self.mask_ratio = float(mask_ratio)
        self.mask_key = mask_key
        self.domain_key = domain_key
        self.drop_mask = drop_mask
        self.mask_to_image = mask_renderer(mean, std, foreground_value, binarize, max_label)

    def choose(self, batch_size: int) -> torch.Tensor:
        """A bool vector of length ``batch_size`` with exactly :func:`num_masks` True entries at random rows."""
        chosen = torch.zeros(batch_size, dtype=torch.bool)
        chosen[torch.randperm(batch_size)[: num_masks(batch_size, self.mask_ratio)]] = True
        return chosen

    def __call__(self, batch: Sequence[Any]) -> Any:
        """
        Args:
            batch: the list of sample dictionaries of one mini-batch (a dataset returning a list of dictionaries
                per item, e.g. ``RandCropByPosNegLabeld``, is flattened first, as ``list_data_collate`` does).

        Returns:
            the collated mini-batch with the ``domain_key`` entry (``(B,)`` int64; ``(2 B,)`` with ``views="both"``).
        """
        samples = [s for item in batch for s in (item if isinstance(item, list) else [item])]
        if self.views == "both":  # every pair twice: the images, then the same pairs as masks
            chosen = torch.arange(2 * len(samples)) >= len(samples)
            samples = samples + samples
        else:
            chosen = self.choose(len(samples))
        mixed = []
        for i, sample in enumerate(samples):
            if not isinstance(sample, dict):
                raise ValueError(f"{type(self).__name__} needs dictionary samples, got {type(sample).__name__}.")
            d = dict(sample)
            use_mask = bool(chosen[i])
            if self.mask_key not in d:
                if use_mask:
                    raise ValueError(
                        f"mask_key {self.mask_key!r} is missing from a sample (keys {list(d)}); the mixed-domain "
                        f"mini-batch needs each sample's mask."
                    )
            else:
                for key in self.keys:
                    d[key] = mix_image_or_mask(
                        self.mask_to_image, d[key], d[self.mask_key], use_mask, repr(key), repr(self.mask_key)
                    )
            d[self.domain_key] = torch.tensor(DOMAIN_MASK if use_mask else DOMAIN_IMAGE, dtype=torch.int64)
            if self.drop_mask:
                drop_mask(d, self.mask_key)
            mixed.append(d)
        return list_data_collate(mixed)


class RandMixedDomainBatchd(BatchRandomizable):
    """The mixed-domain Stage-1 mini-batch of :class:`MixedDomainCollate`, made from a collated batch on its device.

    The same logic as :class:`MixedDomainCollate` (exactly ``round(mask_ratio * B)`` rows of every batch of ``B``
    shown as their masks, rendered by :meth:`~spectraflow_monai.transforms.MaskToImage.render_batch`: 0/1 in the
    images' intensity range, repeated to the image channels, normalised with ``mean`` / ``std``; ``views="both"``:
    the ``B`` images then the ``B`` masks), on a batch dictionary ``{image: (B, C, H, W), label: (B, 1, H, W)}``
    already on the training device, with the rows drawn by ``torch.randperm`` from this transform's generator (see
    :class:`~spectraflow_monai.transforms.batched.BatchRandomizable`; inside a
    :class:`~spectraflow_monai.transforms.batched.BatchCompose`, the compose's). Place it after the images'
    normalisation, with the same ``mean`` / ``std``.

    Args:
        args, kwargs: the arguments of :class:`MixedDomainCollate` (``mask_ratio``, ``keys``, ``mask_key``,
            ``domain_key``, ``drop_mask``, ``mean``, ``std``, ``foreground_value``, ``binarize``, ``max_label``,
            ``views``), with its defaults.

    Raises:
        ValueError: the argument errors of :class:`MixedDomainCollate`; at call time, a batch without ``mask_key``
            or whose image and mask batches differ in size.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        # the arguments and their checks are the collate's: it validates and keeps the settings
        self.settings = MixedDomainCollate(*args, **kwargs)

    def choose(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """A bool vector of ``batch_size`` on ``device`` with exactly :func:`num_masks` True entries at random rows."""
        n = num_masks(batch_size, self.settings.mask_ratio)
        order = torch.randperm(batch_size, generator=self.generator(device), device=device)
        return order < n  # the rows that the permutation sends to the first n places

    def __call__(self, data: Any) -> dict:
        cfg = self.settings
        d = dict(data)
        if cfg.mask_key not in d:
            raise ValueError(f"mask_key {cfg.mask_key!r} is missing from the batch (keys {list(d)}).")
        mask = d[cfg.mask_key]
        first = d[cfg.keys[0]]
        batch, device = first.shape[0], first.device
        if mask.shape[0] != batch:
            raise ValueError(f"the batch has {batch} images but {mask.shape[0]} masks ({cfg.mask_key!r}).")
        if cfg.views == "both":
            chosen = torch.arange(2 * batch, device=device) >= batch
        else:
            chosen = self.choose(batch, device)
        for key in cfg.keys:
            img = d[key]
            rendered = cfg.mask_to_image.render_batch(mask, channels=img.shape[1]).to(img.dtype)
            if cfg.views == "both":
                d[key] = torch.cat([img, rendered])
            else:
                d[key] = torch.where(chosen.reshape(-1, *([1] * (img.ndim - 1))), rendered, img)
        d[cfg.domain_key] = chosen.to(torch.int64)
        if cfg.drop_mask:
            d.pop(cfg.mask_key, None)
        elif cfg.views == "both":
            d[cfg.mask_key] = torch.cat([mask, mask])
        return d
