"""The training augmentation of the ``spectraflow_2d_segmentation`` bundle: geometry for every data set, colour
jitter suited to the modality of its source (endoscopy, dermoscopy, histology; none for own data unless added)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spectraflow_monai.utils.errors import SettingError

__all__ = ["train_augmentation"]


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
