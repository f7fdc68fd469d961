"""Finding the saved predictions of an evaluation run and its per-image Dice, for the report and the overlays.

The 2D bundle's evaluation writes ``predictions/<name>_seg.png`` (MONAI ``SaveImaged`` with the ``PILWriter``;
``predictions/<name>/<name>_seg.png`` when ``separate_folder=True``) and ``metrics.csv``
(:class:`~spectraflow_monai.metrics.SegmentationMetricSuite`, one row per image, or per image and class).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.handlers.metric_suite import name_from_path

__all__ = [
    "PRED_SUFFIX", "check_datalist", "entry_name", "find_prediction", "pair_predictions", "prediction_size", "read_dice"
]

#: file name suffix of the predictions written by the bundle (``SaveImaged(output_postfix="seg")``)
PRED_SUFFIX = "_seg.png"
_DICE_COLUMNS = ("dice", "dsc", "mdsc", "mean_dice", "dice_score", "val_mean_dice")
_NAME_COLUMNS = ("name", "image", "id", "filename", "filename_or_obj")


def check_datalist(datalist: Any) -> list[Mapping]:
    if isinstance(datalist, (str, bytes)) or not isinstance(datalist, Sequence):
        raise ValueError(f"datalist must be a sequence of dicts, got {type(datalist).__name__}.")
    if len(datalist) == 0:
        raise ValueError("datalist is empty.")
    for i, entry in enumerate(datalist):
        if not isinstance(entry, Mapping):
            raise ValueError(f"datalist[{i}] must be a dict, got {type(entry).__name__}.")
        missing = [k for k in ("image", "label") if k not in entry]
        if missing:
            raise ValueError(f"datalist[{i}] has no {' or '.join(repr(k) for k in missing)} entry: {dict(entry)!r}.")
    return list(datalist)


def entry_name(entry: Mapping) -> str:
    name = entry.get("name")
    return str(name) if name is not None else name_from_path(entry["image"])


def find_prediction(entry: Mapping, predictions_dir: str | os.PathLike) -> str | None:
    """Path of the prediction of one datalist entry, or None when there is none.

    Looked for, in this order, for ``n`` in (``entry["name"]``, the image file name without extension):
    ``<predictions_dir>/<n>_seg.png`` and ``<predictions_dir>/<n>/<n>_seg.png`` (MONAI ``SaveImaged`` with
    ``separate_folder=False`` / ``True``).

    Args:
        entry: a datalist entry with ``"image"`` (and optionally ``"name"``).
        predictions_dir: the folder the predictions were saved to.
    """
    folder = os.fspath(predictions_dir)
    names = [entry_name(entry)]
    if "image" in entry:
        stem = name_from_path(entry["image"])
        if stem not in names:
            names.append(stem)
    for n in names:
        for candidate in (os.path.join(folder, n + PRED_SUFFIX), os.path.join(folder, n, n + PRED_SUFFIX)):
            if os.path.isfile(candidate):
                return candidate
    return None


def pair_predictions(
    datalist: Sequence[Mapping], predictions_dir: str | os.PathLike
) -> tuple[list[tuple[Mapping, str, str]], list[str]]:
    """Split ``datalist`` into (entry, name, prediction path) triples and the names without a prediction."""
    folder = os.fspath(predictions_dir)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"predictions_dir '{folder}' does not exist.")
    found, missing = [], []
    for entry in datalist:
        pred = find_prediction(entry, folder)
        if pred is None:
            missing.append(entry_name(entry))
        else:
            found.append((entry, entry_name(entry), pred))
    if not found:
        raise ValueError(
            f"no predictions in '{folder}' for any of the {len(datalist)} datalist entries "
            f"(looked for <name>{PRED_SUFFIX}, e.g. '{entry_name(datalist[0])}{PRED_SUFFIX}')."
        )
    return found, missing


def prediction_size(path: str | os.PathLike) -> tuple[int, int]:
    """The size ``(width, height)`` of a saved prediction, read from its header (MONAI's PIL reader gives the same
    spatial axes, in that order).

    Raises:
        ValueError: the file is not an image Pillow can read (the message names it).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(os.fspath(path)) as img:
            return int(img.width), int(img.height)
    except (OSError, UnidentifiedImageError) as e:
        raise ValueError(f"cannot read the size of prediction '{os.fspath(path)}': {e}") from e


def read_dice(metrics_csv: str | os.PathLike) -> dict[str, float]:
    """Per-image Dice from a metrics CSV (columns found by name; rows of one image, e.g. classes, averaged)."""
    path = os.fspath(metrics_csv)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"metrics_csv '{path}' does not exist.")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        low = {h.strip().lower(): h for h in header}
        name_col = next((low[c] for c in _NAME_COLUMNS if c in low), None)
        dice_col = next((low[c] for c in _DICE_COLUMNS if c in low), None)
        if dice_col is None:
            dice_col = next((h for h in header if "dice" in h.lower() or "dsc" in h.lower()), None)
        if name_col is None or dice_col is None:
            raise ValueError(
                f"metrics_csv '{path}' needs a name column ({'/'.join(_NAME_COLUMNS)}) and a Dice column "
                f"(e.g. 'dice' or 'DSC'); its header is {header}."
            )
        values: dict[str, list[float]] = {}
        for row in reader:
            try:
                v = float(row.get(dice_col) or "nan")
            except ValueError:
                v = float("nan")
            values.setdefault(str(row.get(name_col)), []).append(v)
    out = {}
    for name, vs in values.items():
        finite = [v for v in vs if math.isfinite(v)]
        out[name] = float(np.mean(finite)) if finite else float("nan")
    return out
