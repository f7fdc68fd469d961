"""Checks of bundle settings, run in a bundle's ``initialize`` list so that a wrong value stops the run before any
data is read or any network is built, with a message naming the setting and the value."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from spectraflow_monai.utils.errors import SettingError

__all__ = ["MODEL_DEFAULTS", "PATCH_SIZE", "check_image_size", "check_unread_settings"]

logger = logging.getLogger(__name__)

#: the bundles' default model settings: those of a model file without settings recorded beside it
#: (:class:`~spectraflow_monai.utils.run_record.ModelRecord`)
MODEL_DEFAULTS: dict[str, Any] = {
    "image_size": 224,
    "encoder_name": "vit_small_patch14_dinov2",
    "encoder_kwargs": None,
    "fusion": "daf",
    "refine": "fdconv",
    "label_classes": None,
    "num_classes": 9,
}
#: patch size of the DINOv2 encoders: the image side must be a multiple of it
PATCH_SIZE = 14


def check_image_size(value: Any, name: str = "image_size", multiple: int = PATCH_SIZE) -> int:
    """Return ``value`` as an ``int`` when it is a positive integer multiple of ``multiple``.

    Args:
        value: the setting's value (an int; numpy integers are accepted, booleans and strings are not).
        name: the setting's name for the message. Defaults to ``"image_size"``.
        multiple: the value must be a multiple of it (the ViT patch size). Defaults to 14.

    Raises:
        SettingError: (a ``ValueError``) naming the setting and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SettingError(f"{name} must be a positive int multiple of {multiple} (e.g. 224), got {value!r}.")
    if value <= 0 or value % multiple:
        raise SettingError(f"{name} must be a positive int multiple of {multiple} (e.g. 224), got {value!r}.")
    return int(value)


def check_unread_settings(given: Mapping[str, Any], instead: Mapping[str, str], command: str) -> list[str]:
    """Report the settings a command does not read: a warning for each of ``given`` that has a value (not None),
    naming the setting the command reads instead (e.g. ``max_epochs`` on a Stage-1 run: ``stage1_epochs``).

    A bundle config sets such a setting to ``null`` for the command; a value given on the command line (or by a
    tool that passes the same overrides to every step) is then reported instead of being silently ignored.

    Args:
        given: ``{setting: value}`` of the settings the command does not read.
        instead: ``{setting: the setting the command reads instead}``.
        command: the command, for the message.

    Returns:
        the names of the settings reported.
    """
    reported = [name for name, value in given.items() if value is not None]
    for name in reported:
        logger.warning(
            f"{name}={given[name]!r} is not read by {command}: it reads {instead.get(name, 'another setting')} "
            f"(give --{instead.get(name, name)} to change it)."
        )
    return reported
