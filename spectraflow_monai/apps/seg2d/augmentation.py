"""The training augmentation of the ``spectraflow_2d_segmentation`` bundle: geometry for every data set, colour
jitter suited to the modality of its source (endoscopy, dermoscopy, histology; none for own data unless added); and
the corruption of evaluation's robustness setting (paper Fig. 5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.transforms.corruptions import Corruptiond
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import CORRUPTION_KINDS, MAX_SEVERITY

__all__ = ["evaluation_corruption", "train_augmentation"]


def train_augmentation(geometric: Sequence[Any], colour: Mapping[str, Sequence[Any]], data_source: Any) -> list[Any]:
    """The ``geometric`` transforms followed by the ``colour`` transforms of ``data_source.name``.

    Args:
        geometric: the geometric transforms (image and label together).
        colour: ``{source name: its colour transforms}`` (the config's ``colour_augmentation``); every source name
            of :class:`~spectraflow_monai.apps.seg2d.DataSource` needs an entry (an empty list for none).
        data_source: the run's :class:`~spectraflow_monai.apps.seg2d.DataSource` (its ``name``).

    Raises:
        SettingError: ``colour`` has no entry for the source, naming the source and the entries.
    """
    name = data_source.name
    if name not in colour:
        raise SettingError(
            f"colour_augmentation has no entry for the data source {name!r} (entries: {sorted(colour)}); add one "
            f"(--colour_augmentation#{name} \"[]\" for none)."
        )
    return [*geometric, *colour[name]]


def evaluation_corruption(corruption: Any = None, corruption_severity: Any = 1, keys: Any = "image") -> list[Any]:
    """The corruption of evaluation's ``corruption`` / ``corruption_severity`` settings (paper Fig. 5): ``[]`` for
    clean images (``corruption`` None), else one :class:`~spectraflow_monai.transforms.Corruptiond` of ``keys``.

    Args:
        corruption: None or one of :data:`~spectraflow_monai.utils.settings.CORRUPTION_KINDS`. Defaults to None.
        corruption_severity: an int from 0 (the identity) to 5, checked also without a corruption. Defaults to 1.
        keys: the keys corrupted (the images, never the labels). Defaults to ``"image"``.

    Raises:
        SettingError: a setting's value is not one of these, naming the setting and the value.
    """
    if corruption is not None and corruption not in CORRUPTION_KINDS:
        raise SettingError(f"corruption must be null or one of {list(CORRUPTION_KINDS)}, got {corruption!r}.")
    severity = corruption_severity
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 0 <= severity <= MAX_SEVERITY:
        raise SettingError(f"corruption_severity must be an int from 0 to {MAX_SEVERITY}, got {severity!r}.")
    return [] if corruption is None else [Corruptiond(keys, kind=corruption, severity=int(severity))]
