"""The SpectraFlow MONAI Label app's own settings (``--conf KEY VALUE``; main.py's docstring lists them all).

Each setting is checked once, at start, where it is read: a value out of its range stops the server with a
ValueError naming the setting and the value. The settings of other rooms are read there (``kept_model_backups``:
``lib/served.py``; the scoring settings: ``lib/scoring.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .options import check_precision, config_syntax, show_value
from .uploads import DEFAULT_MAX_UPLOAD_MB

__all__ = [
    "INFER_CONFIGS",
    "WEIGHT_SETTINGS",
    "find_bundles",
    "max_upload_bytes",
    "parse_overrides",
    "positive_int",
    "precision_setting",
    "weight_settings",
]

#: the inference configs a bundle serves from (the first that exists)
INFER_CONFIGS = ("inference.json", "inference.yaml")
#: app settings passed to every bundle's training as the bundle settings of the same name
WEIGHT_SETTINGS = ("pretrained_weights", "encoder_init")


def find_bundles(bundles_dir: str) -> dict[str, str]:
    """Bundles in ``bundles_dir``: sub-folders with ``configs/metadata.json`` and an inference config.

    Args:
        bundles_dir: folder to search (not recursive).

    Returns:
        bundle name -> absolute bundle path, sorted by name.
    """
    if not os.path.isdir(bundles_dir):
        raise ValueError(f"bundles_dir {bundles_dir!r} is not a folder.")
    found = {}
    for name in sorted(os.listdir(bundles_dir)):
        path = os.path.join(bundles_dir, name)
        configs = os.path.join(path, "configs")
        if os.path.isfile(os.path.join(configs, "metadata.json")) and any(
            os.path.isfile(os.path.join(configs, c)) for c in INFER_CONFIGS
        ):
            found[name] = os.path.abspath(path)
    return found


def parse_overrides(conf: dict[str, str], name: str) -> dict[str, Any]:
    """Bundle config overrides for bundle ``name`` from the app settings ``overrides`` and ``overrides.<name>``.

    Args:
        conf: the app settings (``--conf KEY VALUE`` pairs, values are strings).
        name: bundle name.

    Returns:
        config id -> value; ``overrides.<name>`` wins over ``overrides``.
    """
    merged: dict[str, Any] = {}
    for key in ("overrides", f"overrides.{name}"):
        text = conf.get(key)
        if not text:
            continue
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as e:
            raise ValueError(f"--conf {key} must be a JSON object of bundle config ids and values, got {text!r} ({e}).")
        if not isinstance(value, dict):
            raise ValueError(f"--conf {key} must be a JSON object of bundle config ids and values, got {text!r}.")
        if "bundle_root" in value:
            raise ValueError(f"--conf {key} must not set 'bundle_root': the app sets it to the bundle folder.")
        merged.update(value)
    return merged


def max_upload_bytes(conf: dict[str, Any]) -> int:
    """``--conf max_upload_mb`` (default :data:`lib.uploads.DEFAULT_MAX_UPLOAD_MB`) in bytes."""
    text = conf.get("max_upload_mb")
    try:
        value = float(text) if text not in (None, "") else DEFAULT_MAX_UPLOAD_MB
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--conf max_upload_mb must be a number of megabytes > 0, got {text!r}.")
    return int(value * 1e6)


def positive_int(conf: dict[str, Any], key: str, default: int) -> int:
    """``--conf <key>`` as an integer >= 1 (``default`` when left out)."""
    text = conf.get(key)
    try:
        value = int(text) if text not in (None, "") else default
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise ValueError(f"--conf {key} must be an integer >= 1, got {text!r}.")
    return value


def weight_settings(conf: dict[str, Any]) -> dict[str, str]:
    """The encoder-weight settings of the app (``--conf pretrained_weights ...``, ``--conf encoder_init ...``) as
    bundle config overrides for training; settings left out keep the bundle's values (``timm`` / ``auto``).

    Args:
        conf: the app settings.

    Raises:
        ValueError: ``encoder_init`` is not one of ``auto`` / ``stage1`` / ``pretrained`` / ``random``, or
            ``pretrained_weights`` is not a plain string (``timm``, ``none`` or a file path on the server).
    """
    from spectraflow_monai.apps.encoder_init import ENCODER_INIT_CHOICES

    settings: dict[str, str] = {}
    for key in WEIGHT_SETTINGS:
        value = conf.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip() or len(value) > 4096 or config_syntax(value):
            raise ValueError(f"--conf {key} must be a plain, non-empty string, got {show_value(value)}.")
        value = value.strip()
        if key == "encoder_init" and value.lower() not in ENCODER_INIT_CHOICES:
            raise ValueError(
                f"--conf encoder_init must be one of {list(ENCODER_INIT_CHOICES)}, got {show_value(value)}."
            )
        settings[key] = value.lower() if key == "encoder_init" or value.lower() in ("timm", "none") else value
    return settings


def precision_setting(conf: dict[str, Any]) -> dict[str, str]:
    """The app's ``--conf precision`` (``auto`` | ``bf16`` | ``fp16`` | ``fp32``) as the bundle config override
    ``{"precision": ...}`` of inference and training; ``{}`` when it is not set (the bundles' ``auto``).

    Raises:
        ValueError: a value that is not one of :data:`lib.options.PRECISION_CHOICES`, named with the value.
    """
    value = conf.get("precision")
    if value is None:
        return {}
    try:
        return {"precision": check_precision(value)}
    except ValueError as e:
        raise ValueError(f"--conf precision {e}, got {show_value(value)}.") from None
