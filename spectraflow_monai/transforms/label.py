"""Binarise stored label images (JPEG/PNG masks, instance label maps) into 0/1 foreground masks.

The 2D benchmarks of SpectraFlow (Chen et al.) are binary: polyp, skin lesion or gland versus background. Their masks
are stored differently: Kvasir-SEG as RGB JPEGs with compression noise (foreground = grey level >= 128, not > 0),
ISIC-2016 as 0/255 PNGs, GlaS as instance label maps (foreground = label > 0, i.e. >= 1). The datalists of
:mod:`spectraflow_monai.apps.seg2d.presets` record the right threshold per entry (``label_threshold``), which
:class:`BinarizeLabeld` reads, so one transform chain serves every preset.

With ``check_values=True`` (as in the 2D bundle) a mask binarised at a grey level (threshold above 1) is checked
first with :func:`binary_mask_threshold`: a 0/1 mask is binarised at 1 (instead of
becoming all background), and any set of values other than 0/1 or 0/255 (JPEG noise tolerated), e.g. ``{0, 1, 2}``
or ``{0, 128, 255}``, raises a :class:`~spectraflow_monai.utils.errors.DataError` naming the file and the values.

Multi-class label maps (the bundle's ``label_classes``, :func:`spectraflow_monai.data.label_mode`) skip the binary
rule: :class:`LabelClassesd` maps their source values to class indices and stops at any other value.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.config.type_definitions import NdarrayOrTensor
from monai.transforms import MapTransform, SaveImaged, Transform
from monai.utils import TransformBackends, convert_to_dst_type

from spectraflow_monai.transforms.finite import count_nonfinite
from spectraflow_monai.utils.errors import DataError, DatasetError

__all__ = [
    "BinarizeLabel",
    "BinarizeLabelD",
    "BinarizeLabelDict",
    "BinarizeLabeld",
    "LabelClasses",
    "LabelClassesd",
    "SaveLabelValuesd",
    "binary_mask_threshold",
]


def _values_text(arr: np.ndarray, limit: int = 12) -> str:
    values = np.unique(arr)
    shown = ", ".join(f"{v:g}" if isinstance(v, (float, np.floating)) else str(v) for v in values[:limit].tolist())
    more = f", ... ({len(values)} distinct values)" if len(values) > limit else ""
    return "{" + shown + more + "}"


def binary_mask_threshold(mask: Any, path: str | os.PathLike = "mask", max_grey_fraction: float = 0.01) -> int:
    """Classify a single-channel mask as a 0/1 or a 0/255 mask and return its threshold (1 or 128).

    Rules (values above 255, e.g. 16-bit masks, are first rescaled to 0..255 by the maximum):

    - every value is 0 or 1: a 0/1 mask, foreground = 1 (threshold 1);
    - values near 0 and near 255 (JPEG compression noise included, e.g. Kvasir-SEG's masks hold 0..8 and
      246..255), at most ``max_grey_fraction`` of the pixels in the mid-grey range (32, 224), and at least one value
      >= 224: a 0/255 mask, foreground = value >= 128 (threshold 128);
    - anything else (e.g. ``{0, 1, 2}``, ``{0, 128, 255}``, a grey-level image, negative or non-finite values)
      raises :class:`~spectraflow_monai.utils.errors.DatasetError` naming ``path`` and the values found.

    Args:
        mask: the mask values (numpy array or torch tensor, any shape).
        path: file name for the messages. Defaults to ``"mask"``.
        max_grey_fraction: largest tolerated fraction of mid-grey pixels in a 0/255 mask. Defaults to 0.01.
    """
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    arr = np.asarray(mask)
    path = os.fspath(path)
    if arr.dtype == bool or arr.size == 0:
        return 1
    n_nan, n_inf = count_nonfinite(arr)
    if n_nan or n_inf:
        raise DatasetError(f"not a binary mask: {path!r} holds {n_nan} NaN and {n_inf} infinite value(s).")
    lo, hi = arr.min(), arr.max()
    if lo >= 0 and hi <= 1 and bool(np.all((arr == 0) | (arr == 1))):
        return 1
    if lo < 0:
        raise DatasetError(f"not a binary mask: {path!r} has negative values; values found: {_values_text(arr)}.")
    scaled = arr.astype(np.float64) * (255.0 / float(hi)) if hi > 255 else arr
    grey = float(np.mean((scaled > 32) & (scaled < 224)))
    if grey > max_grey_fraction:
        raise DatasetError(
            f"not a binary mask: {path!r} has {100 * grey:.1f}% mid-grey pixels (values in (32, 224)); "
            f"at most {100 * max_grey_fraction:.1f}% are tolerated; values found: {_values_text(arr)}. "
            "Expected a 0/1 or a 0/255 mask."
        )
    if float(scaled.max()) < 224:
        raise DatasetError(
            f"not a binary mask: {path!r} has values {_values_text(arr)}: neither a 0/1 mask nor a 0/255 mask. "
            "A 0/1 mask saved as JPEG (compression noise around 0 and 1) or an instance label map: "
            "--datalist_kwargs \"{'label_threshold': 1}\" (every non-zero value is foreground); a label map of "
            "classes: --model_settings#label_classes."
        )
    return 128

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



def check_label_values(
    arr: Any, label_map: Mapping[int, int], class_names: Sequence[str], path: str, channel_axis: int = -1
) -> np.ndarray:
    """Stored label values (2D, or 3D with channels on ``channel_axis``) -> one grey 2D array after the checks of
    :class:`LabelMode`.

    Raises:
        DataError: a colour mask (channels that differ) or values outside ``label_map``, naming ``path``.
    """
    arr = np.asarray(arr)
    if arr.ndim == 3:
        first = np.take(arr, 0, axis=channel_axis)
        others = (np.take(arr, i, axis=channel_axis) for i in range(1, arr.shape[channel_axis]))
        if any(not np.array_equal(first, other) for other in others):
            raise DataError(
                f"mask {path!r} is a colour image: label maps of label_classes must be single-channel (grey, 8- or "
                "16-bit, or palette indices)."
            )
        arr = first
    values = np.unique(arr)
    if np.issubdtype(values.dtype, np.floating) and not np.array_equal(values, np.round(values)):
        raise DataError(f"mask {path!r} holds non-integer values {values[:10].tolist()}; label maps need integers.")
    unknown = [int(v) for v in values if int(v) not in label_map]
    if unknown:
        more = f" ... ({len(unknown)} values)" if len(unknown) > 10 else ""
        raise DataError(
            f"mask {path!r} holds value(s) {unknown[:10]}{more} that are not classes of label_classes (values "
            f"{sorted(label_map)} -> classes {list(class_names)})."
        )
    return arr


class BinarizeLabel(Transform):
    """Channel-first label image -> single-channel 0/1 mask with ``foreground = value >= threshold``.

    Multi-channel inputs (an RGB JPEG mask loaded as 3 channels) are first reduced over the channel dimension.

    Args:
        threshold: raw grey level from which a pixel is foreground: 128 for 0/255 masks (JPEG or PNG), 1 for
            instance label maps. Defaults to 128.
        channel_reduction: ``"mean"``, ``"max"``, ``"first"`` (channel 0) or ``None`` (threshold every channel,
            keeping the channel count). Defaults to ``"mean"``.
        dtype: output dtype. Defaults to ``torch.float32``.
        check_values: when the threshold is above 1, check the (channel-reduced) values first: a 0/1 mask is
            binarised at 1, anything but a 0/1 or 0/255 mask (JPEG noise tolerated) raises
            :class:`~spectraflow_monai.utils.errors.DataError` naming the file (``meta["filename_or_obj"]`` of a
            MetaTensor) and the values found. Defaults to ``False``.
        max_grey_fraction: tolerated fraction of mid-grey pixels for ``check_values``. Defaults to 0.01.
    """

    backend = [TransformBackends.TORCH, TransformBackends.NUMPY]

    def __init__(
        self,
        threshold: float = 128,
        channel_reduction: str | None = "mean",
        dtype: Any = torch.float32,
        check_values: bool = False,
        max_grey_fraction: float = 0.01,
    ) -> None:
        self.threshold = _check_threshold(threshold)
        if channel_reduction not in _REDUCTIONS:
            raise ValueError(f"channel_reduction must be one of {_REDUCTIONS}, got {channel_reduction!r}.")
        if not isinstance(check_values, bool):
            raise ValueError(f"check_values must be a bool, got {check_values!r}.")
        max_grey_fraction = _check_threshold(max_grey_fraction, "max_grey_fraction")
        if not 0.0 <= max_grey_fraction < 1.0:
            raise ValueError(f"max_grey_fraction must be in [0, 1), got {max_grey_fraction!r}.")
        self.channel_reduction = channel_reduction
        self.dtype = dtype
        self.check_values = check_values
        self.max_grey_fraction = max_grey_fraction

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
        if self.check_values and thr > 1:
            meta = getattr(img, "meta", None) or {}
            thr = binary_mask_threshold(x, str(meta.get("filename_or_obj", "label")), self.max_grey_fraction)
        out, *_ = convert_to_dst_type(x >= thr, img, dtype=self.dtype)
        return out


class BinarizeLabeld(MapTransform):
    """Dictionary twin of :class:`BinarizeLabel`; the threshold may come from the data (``label_threshold``).

    Args:
        keys: keys of the label images to binarise.
        threshold: fixed threshold; ``None`` reads it from ``data[threshold_key]`` (as written by the datalists of
            :mod:`spectraflow_monai.apps.seg2d.presets`); an entry without one (e.g. MONAI Label's datastore pairs)
            is binarised by its values when ``check_values`` is on (0/1 masks at 1, 0/255 masks at 128, other
            values an error naming the file). Defaults to ``None``.
        threshold_key: key of the per-sample threshold. Defaults to ``"label_threshold"``.
        channel_reduction: see :class:`BinarizeLabel`. Defaults to ``"mean"``.
        dtype: output dtype. Defaults to ``torch.float32``.
        check_values: see :class:`BinarizeLabel`; applies to samples whose threshold is above 1. Defaults to
            ``False``.
        max_grey_fraction: see :class:`BinarizeLabel`. Defaults to 0.01.
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
        check_values: bool = False,
        max_grey_fraction: float = 0.01,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.binarizer = BinarizeLabel(
            threshold=128 if threshold is None else threshold,
            channel_reduction=channel_reduction,
            dtype=dtype,
            check_values=check_values,
            max_grey_fraction=max_grey_fraction,
        )
        self.fixed = threshold is not None
        self.threshold_key = threshold_key

    def __call__(self, data: Mapping[Hashable, NdarrayOrTensor]) -> dict[Hashable, NdarrayOrTensor]:
        d = dict(data)
        threshold = None
        if not self.fixed and self.threshold_key in d:
            threshold = _check_threshold(d[self.threshold_key], f"data[{self.threshold_key!r}]")
        elif not self.fixed and not self.binarizer.check_values:  # with check_values the values decide (above)
            raise ValueError(
                f"BinarizeLabeld: no threshold given and the data has no {self.threshold_key!r} entry; "
                "pass threshold= (e.g. 128 for 0/255 masks, 1 for label maps)."
            )
        for key in self.key_iterator(d):
            d[key] = self.binarizer(d[key], threshold=threshold)
        return d


BinarizeLabelD = BinarizeLabelDict = BinarizeLabeld


class LabelClasses(Transform):
    """Channel-first stored label map -> (1, *spatial) class indices 0..K-1 (``label_classes`` of the 2D bundle).

    A multi-channel mask must have equal channels (a grey map saved as RGB); a colour mask, or a value that
    ``label_map`` does not list, raises :class:`~spectraflow_monai.utils.errors.DataError` naming the file
    (``meta["filename_or_obj"]`` of a MetaTensor) and the values.

    Args:
        label_map: ``{source value: class index}``.
        class_names: class names, background first (for messages). Defaults to None.
        dtype: output dtype. Defaults to ``torch.float32``.
    """

    backend = [TransformBackends.TORCH, TransformBackends.NUMPY]

    def __init__(self, label_map: Mapping[int, int], class_names: Any = None, dtype: Any = torch.float32) -> None:
        if not isinstance(label_map, Mapping) or not label_map:
            raise ValueError(f"label_map must be a non-empty mapping {{source value: class}}, got {label_map!r}.")
        self.label_map = {int(k): int(v) for k, v in label_map.items()}
        self.class_names = list(class_names) if class_names is not None else sorted(set(self.label_map.values()))
        self.dtype = dtype

    def __call__(self, img: NdarrayOrTensor) -> NdarrayOrTensor:
        """
        Args:
            img: channel-first (C, *spatial) label image, numpy or torch (MetaTensor metadata is kept).
        """
        if img.ndim < 2:
            raise ValueError(f"img must be channel-first (C, *spatial), got shape {tuple(img.shape)}.")
        meta = getattr(img, "meta", None) or {}
        arr = img.detach().cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
        where = str(meta.get("filename_or_obj", "label"))
        grey = check_label_values(arr if arr.shape[0] > 1 else arr[0], self.label_map, self.class_names, where, 0)
        values, inverse = np.unique(grey, return_inverse=True)
        lut = np.asarray([self.label_map[int(v)] for v in values], dtype=np.int64)
        out = lut[inverse.reshape(-1)].reshape((1, *grey.shape))
        result, *_ = convert_to_dst_type(out, img, dtype=self.dtype)
        return result


class LabelClassesd(MapTransform):
    """Dictionary twin of :class:`LabelClasses`.

    Args:
        keys: keys of the label images.
        label_map: see :class:`LabelClasses`.
        class_names: see :class:`LabelClasses`. Defaults to None.
        dtype: output dtype. Defaults to ``torch.float32``.
        allow_missing_keys: don't raise when a key is missing. Defaults to ``False``.
    """

    backend = LabelClasses.backend

    def __init__(
        self,
        keys: KeysCollection,
        label_map: Mapping[int, int],
        class_names: Any = None,
        dtype: Any = torch.float32,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.mapper = LabelClasses(label_map, class_names, dtype)

    def __call__(self, data: Mapping[Hashable, NdarrayOrTensor]) -> dict[Hashable, NdarrayOrTensor]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.mapper(d[key])
        return d


class SaveLabelValuesd(SaveImaged):
    """MONAI's ``SaveImaged`` that writes class-index label maps with the source label values.

    A network trained on a label map (``label_classes`` / ``label_map``: source values -> classes) predicts class
    indices; this writer saves ``values[c]`` for class ``c`` (the inverse of the map,
    :func:`spectraflow_monai.data.inverse_label_map`), so that a prediction holds the values its ground truth uses
    (labels 1 and 5 come back as 1 and 5, an inverted 0/255 map as 0/255). The data dictionary is returned unchanged,
    so metrics computed after the writer still see the class indices.

    Args:
        keys: keys of the label maps to save (as ``SaveImaged``).
        values: source value of every class (index = class); None saves the class indices as they are. Defaults to
            None.
        kwargs: the other arguments of ``monai.transforms.SaveImaged`` (``output_dir``, ``output_dtype``, ...).

    Raises:
        ValueError: ``values`` is not None nor a non-empty sequence of integers.
    """

    def __init__(self, keys: KeysCollection, values: Sequence[int] | None = None, **kwargs: Any) -> None:
        super().__init__(keys, **kwargs)
        if values is not None:
            ok = isinstance(values, Sequence) and not isinstance(values, str) and len(values) > 0
            if not ok or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
                raise ValueError(f"values must be None or a non-empty sequence of ints (one per class), got {values!r}.")
        self.values = None if values is None else [int(v) for v in values]

    def __call__(self, data: Mapping[Hashable, Any]) -> Mapping[Hashable, Any]:
        if self.values is None:
            return super().__call__(data)
        lut = torch.as_tensor(self.values, dtype=torch.float32)
        d = dict(data)
        for key in self.key_iterator(d):
            x = d[key]
            classes = torch.as_tensor(x).long()
            if bool((classes < 0).any()) or bool((classes >= len(self.values)).any()):
                raise ValueError(
                    f"{key}: class indices must lie in 0..{len(self.values) - 1} to be saved with their source values."
                )
            mapped = x.clone() if isinstance(x, torch.Tensor) else torch.as_tensor(x).clone()
            mapped = mapped.float()
            mapped.copy_(lut.to(classes.device)[classes])
            d[key] = mapped
        super().__call__(d)
        return data
