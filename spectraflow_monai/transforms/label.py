"""Binarise stored label images (JPEG/PNG masks, instance label maps) into 0/1 foreground masks.

The 2D benchmarks of SpectraFlow (Chen et al.) are binary: polyp, skin lesion or gland versus background. Their masks
are stored differently: Kvasir-SEG as RGB JPEGs with compression noise (foreground = grey level >= 128, not > 0),
ISIC-2016 as 0/255 PNGs, GlaS as instance label maps (foreground = label > 0, i.e. >= 1). The datalists of
:mod:`spectraflow_monai.data.datasets2d` record the right threshold per entry (``label_threshold``), which
:class:`BinarizeLabeld` reads, so one transform chain serves every preset.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.config.type_definitions import NdarrayOrTensor
from monai.transforms import MapTransform, Transform
from monai.utils import TransformBackends, convert_to_dst_type

__all__ = [
    "BinarizeLabel",
    "BinarizeLabelD",
    "BinarizeLabelDict",
    "BinarizeLabeld",
]

_REDUCTIONS = ("mean", "max", "first", None)


def _check_threshold(threshold: Any, name: str = "threshold") -> float:
    if isinstance(threshold, torch.Tensor) and threshold.numel() == 1:
        threshold = threshold.item()
    if isinstance(threshold, np.ndarray) and threshold.size == 1:
        threshold = threshold.item()
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {threshold!r}.")
    if not np.isfinite(threshold):
        raise ValueError(f"{name} must be finite, got {threshold!r}.")
    return float(threshold)


class BinarizeLabel(Transform):
    """Channel-first label image -> single-channel 0/1 mask with ``foreground = value >= threshold``.

    Multi-channel inputs (an RGB JPEG mask loaded as 3 channels) are first reduced over the channel dimension.

    Args:
        threshold: raw grey level from which a pixel is foreground: 128 for 0/255 masks (JPEG or PNG), 1 for
            instance label maps. Defaults to 128.
        channel_reduction: ``"mean"``, ``"max"``, ``"first"`` (channel 0) or ``None`` (threshold every channel,
            keeping the channel count). Defaults to ``"mean"``.
        dtype: output dtype. Defaults to ``torch.float32``.
    """

    backend = [TransformBackends.TORCH, TransformBackends.NUMPY]

    def __init__(
        self, threshold: float = 128, channel_reduction: str | None = "mean", dtype: Any = torch.float32
    ) -> None:
        self.threshold = _check_threshold(threshold)
        if channel_reduction not in _REDUCTIONS:
            raise ValueError(f"channel_reduction must be one of {_REDUCTIONS}, got {channel_reduction!r}.")
        self.channel_reduction = channel_reduction
        self.dtype = dtype

    def __call__(self, img: NdarrayOrTensor, threshold: float | None = None) -> NdarrayOrTensor:
        """
        Args:
            img: channel-first (C, *spatial) label image, numpy or torch (MetaTensor metadata is kept).
            threshold: overrides ``self.threshold`` for this call.
        """
        thr = self.threshold if threshold is None else _check_threshold(threshold)
        if img.ndim < 2:
            raise ValueError(f"img must be channel-first (C, *spatial), got shape {tuple(img.shape)}.")
        x = torch.as_tensor(img) if not isinstance(img, torch.Tensor) else img
        if x.shape[0] > 1 and self.channel_reduction is not None:
            if self.channel_reduction == "mean":
                x = x.float().mean(dim=0, keepdim=True)
            elif self.channel_reduction == "max":
                x = x.amax(dim=0, keepdim=True)
            else:
                x = x[:1]
        out, *_ = convert_to_dst_type(x >= thr, img, dtype=self.dtype)
        return out


class BinarizeLabeld(MapTransform):
    """Dictionary twin of :class:`BinarizeLabel`; the threshold may come from the data (``label_threshold``).

    Args:
        keys: keys of the label images to binarise.
        threshold: fixed threshold; ``None`` reads it from ``data[threshold_key]`` (as written by the datalists of
            :mod:`spectraflow_monai.data.datasets2d`). Defaults to ``None``.
        threshold_key: key of the per-sample threshold. Defaults to ``"label_threshold"``.
        channel_reduction: see :class:`BinarizeLabel`. Defaults to ``"mean"``.
        dtype: output dtype. Defaults to ``torch.float32``.
        allow_missing_keys: don't raise when a key is missing. Defaults to ``False``.
    """

    backend = BinarizeLabel.backend

    def __init__(
        self,
        keys: KeysCollection,
        threshold: float | None = None,
        threshold_key: str = "label_threshold",
        channel_reduction: str | None = "mean",
        dtype: Any = torch.float32,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.binarizer = BinarizeLabel(
            threshold=128 if threshold is None else threshold, channel_reduction=channel_reduction, dtype=dtype
        )
        self.fixed = threshold is not None
        self.threshold_key = threshold_key

    def __call__(self, data: Mapping[Hashable, NdarrayOrTensor]) -> dict[Hashable, NdarrayOrTensor]:
        d = dict(data)
        threshold = None
        if not self.fixed:
            if self.threshold_key not in d:
                raise ValueError(
                    f"BinarizeLabeld: no threshold given and the data has no {self.threshold_key!r} entry; "
                    "pass threshold= (e.g. 128 for 0/255 masks, 1 for label maps)."
                )
            threshold = _check_threshold(d[self.threshold_key], f"data[{self.threshold_key!r}]")
        for key in self.key_iterator(d):
            d[key] = self.binarizer(d[key], threshold=threshold)
        return d


BinarizeLabelD = BinarizeLabelDict = BinarizeLabeld
