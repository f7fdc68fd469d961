"""Map label values to training classes: :class:`MapLabels` / :class:`MapLabelsd`.

SpectraFlow's Synapse experiment (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation
for Medical Image Segmentation") maps the 13 BTCV labels to 8 organs (TransUNet's map, :class:`MapBTCVLabels`). Own
data carry other values: these transforms apply a label map ``{source value: class}`` (see
:mod:`spectraflow_monai.data.label_map`), or the BTCV map when none is given, so one evaluation / inference pipeline
serves every data source.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.data import MetaTensor
from monai.transforms import MapTransform, Transform
from monai.utils import convert_to_dst_type

from spectraflow_monai.apps.synapse.readers import map_btcv_labels
from spectraflow_monai.data.label_map import LABEL_MAP_UNMAPPED, apply_label_map, check_label_map

__all__ = ["MapLabels", "MapLabelsd"]


class MapLabels(Transform):
    """Map label values with ``label_map`` ``{source value: class}``; None applies the BTCV -> 8 organ map.

    The input type, dtype and metadata are kept. Values the map does not list raise a ``ValueError`` naming the file
    (from the ``MetaTensor`` metadata) and the values (``unmapped="error"``) or become background 0
    (``unmapped="background"``).

    Args:
        label_map: ``{source value: class}`` (int keys or digit strings), checked against ``num_classes``; None:
            :func:`spectraflow_monai.apps.synapse.map_btcv_labels` (values outside 0..13 are errors). Defaults to None.
        num_classes: number of classes including background, bounds the classes of ``label_map``. Defaults to 256.
        unmapped: ``"error"`` or ``"background"``. Defaults to ``"error"``.
    """

    backend = [torch.Tensor, np.ndarray]  # type: ignore[assignment]

    def __init__(
        self, label_map: Mapping[Any, Any] | None = None, num_classes: int = 256, unmapped: str = "error"
    ) -> None:
        if unmapped not in LABEL_MAP_UNMAPPED:
            raise ValueError(f"unmapped must be one of {list(LABEL_MAP_UNMAPPED)}, got {unmapped!r}.")
        self.label_map = None if label_map is None else check_label_map(label_map, num_classes)
        self.unmapped = unmapped

    def __call__(self, img: Any) -> Any:
        """Map a label array or tensor of any shape."""
        name = img.meta.get("filename_or_obj") if isinstance(img, MetaTensor) else None
        if self.label_map is None:
            out = map_btcv_labels(img, case=str(name) if name else None)
        else:
            out = apply_label_map(img, self.label_map, self.unmapped, where=repr(str(name)) if name else None)
        if isinstance(img, (torch.Tensor, np.ndarray)):
            out, *_ = convert_to_dst_type(out, img, dtype=img.dtype)
        return out


class MapLabelsd(MapTransform):
    """Dictionary-based :class:`MapLabels`.

    Args:
        keys: keys of the label items to map. Defaults to ``"label"``.
        label_map: as :class:`MapLabels`. Defaults to None (the BTCV map).
        num_classes: as :class:`MapLabels`. Defaults to 256.
        unmapped: as :class:`MapLabels`. Defaults to ``"error"``.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    backend = MapLabels.backend

    def __init__(
        self,
        keys: KeysCollection = "label",
        label_map: Mapping[Any, Any] | None = None,
        num_classes: int = 256,
        unmapped: str = "error",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.mapper = MapLabels(label_map, num_classes, unmapped)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.mapper(d[key])
        return d
