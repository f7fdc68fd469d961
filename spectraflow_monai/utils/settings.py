"""Checks of bundle settings, run in a bundle's ``initialize`` list so that a wrong value stops the run before any
data is read or any network is built, with a message naming the setting and the value."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "CORRUPTION_KINDS",
    "CORRUPTION_SEVERITIES",
    "MAX_SEVERITY",
    "MODEL_DEFAULTS",
    "PATCH_SIZE",
    "PRECISION_SETTINGS",
    "check_image_size",
    "check_unread_settings",
]

#: the values of the ``precision`` setting (:func:`spectraflow_monai.utils.resolve_precision` reads them); here, away
#: from torch, so that command lines list them without loading it
PRECISION_SETTINGS: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
#: parameter of each corruption kind at severity 0..5 (:mod:`spectraflow_monai.transforms.corruptions` says what each
#: means; the ``corruption`` / ``corruption_severity`` settings of evaluate.yaml, ``spectraflow experiment robustness``)
CORRUPTION_SEVERITIES: dict[str, tuple[float, ...]] = {
    "brightness": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    "contrast": (1.0, 0.4, 0.3, 0.2, 0.1, 0.05),
    "gaussian_blur": (0.0, 1.0, 2.0, 3.0, 4.0, 6.0),
    "gaussian_noise": (0.0, 0.08, 0.12, 0.18, 0.26, 0.38),
}
#: the corruption kinds of paper Fig. 5.
CORRUPTION_KINDS: tuple[str, ...] = tuple(CORRUPTION_SEVERITIES)
#: the highest severity level.
MAX_SEVERITY = 5

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
