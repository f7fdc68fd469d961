"""Checks for NaN and infinite voxels in input images.

A CT volume or an image with a patch of NaN (or ``inf``) values is not rejected by the readers: through the HU
window NaN stays NaN, the network's output turns NaN, the optimiser step spreads it over the parameters, and at
evaluation the argmax of a NaN prediction is background, so whole slices come out blank without a word. These
transforms stop such inputs where they are read, naming the file and the number of non-finite voxels, or, when
asked for, replace those voxels by a value and log what was replaced.

- :func:`count_nonfinite` / :func:`check_finite`: the functional form, for numpy arrays and torch tensors.
- :class:`CheckFinite` / :class:`CheckFinited`: the array and dictionary transforms (place them right after the
  loader, before any intensity transform: a window clips ``inf`` to its bounds and hides it).

Modes (the bundles' ``nonfinite`` setting):

- ``"error"`` (default): raise :class:`spectraflow_monai.utils.errors.DataError` (a ``ValueError``) naming the
  file and the count of non-finite voxels;
- ``"replace"``: replace every NaN / ``+inf`` / ``-inf`` voxel by ``value`` (the bundles' ``nonfinite_value``) and
  log a warning naming the file and the number of replaced voxels.

Integer and boolean arrays cannot hold non-finite values and are returned as they are.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform, Transform

from spectraflow_monai.utils.errors import DataError
from spectraflow_monai.utils.settings import NONFINITE_MODES  # the accepted values of ``mode``

__all__ = ["NONFINITE_MODES", "count_nonfinite", "check_finite", "check_nonfinite_args", "CheckFinite", "CheckFinited"]

logger = logging.getLogger(__name__)


def check_nonfinite_args(mode: Any, value: Any, mode_name: str = "mode", value_name: str = "value") -> float:
    """Validate a ``(mode, value)`` pair and return ``value`` as a ``float``.

    Args:
        mode: ``"error"`` or ``"replace"``.
        value: the replacement value, a finite real number.
        mode_name: the name of ``mode`` in the message (e.g. the bundle setting ``"nonfinite"``). Defaults to
            ``"mode"``.
        value_name: the name of ``value`` in the message (e.g. ``"nonfinite_value"``). Defaults to ``"value"``.

    Raises:
        ValueError: ``mode`` is not one of :data:`NONFINITE_MODES`, or ``value`` is not a finite number.
    """
    if not isinstance(mode, str) or mode not in NONFINITE_MODES:
        raise ValueError(f"{mode_name} must be one of {list(NONFINITE_MODES)}, got {mode!r}.")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{value_name} must be a finite number, got {value!r}.")
    if not math.isfinite(float(value)):
        raise ValueError(f"{value_name} must be a finite number, got {value!r}.")
    return float(value)


def _is_float(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return data.is_floating_point() or data.is_complex()
    return np.issubdtype(np.asarray(data).dtype, np.inexact)


def count_nonfinite(data: Any) -> tuple[int, int]:
    """Return ``(number of NaN values, number of infinite values)`` of a numpy array or torch tensor."""
    if not _is_float(data):
        return 0, 0
    if isinstance(data, torch.Tensor):
        t = data.as_tensor() if hasattr(data, "as_tensor") else data
        return int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    arr = np.asarray(data)
    return int(np.isnan(arr).sum()), int(np.isinf(arr).sum())


def _name_of(data: Any, name: str | os.PathLike | None) -> str:
    if name is not None:
        return os.fspath(name)
    meta = getattr(data, "meta", None)
    if isinstance(meta, Mapping) and meta.get("filename_or_obj"):
        return str(meta["filename_or_obj"])
    return "<array>"


def check_finite(data: Any, name: str | os.PathLike | None = None, mode: str = "error", value: float = 0.0) -> Any:
    """Return ``data`` when it holds only finite values; otherwise raise, or replace the non-finite values.

    Args:
        data: numpy array or torch tensor (``MetaTensor`` included) of any shape.
        name: the file (or case) named in the message; None takes ``filename_or_obj`` from the ``MetaTensor``
            metadata. Defaults to None.
        mode: ``"error"`` or ``"replace"`` (see the module docstring). Defaults to ``"error"``.
        value: the replacement of every NaN / infinite value in ``"replace"`` mode. Defaults to 0.

    Returns:
        ``data`` itself when every value is finite; in ``"replace"`` mode a copy of the same type (metadata kept)
        with the non-finite values replaced.

    Raises:
        DataError: (a ``ValueError``) in ``"error"`` mode, naming the file and the number of non-finite values.
    """
    value = check_nonfinite_args(mode, value)
    n_nan, n_inf = count_nonfinite(data)
    if n_nan + n_inf == 0:
        return data
    where = _name_of(data, name)
    size = int(data.numel()) if isinstance(data, torch.Tensor) else int(np.asarray(data).size)
    counts = f"{n_nan + n_inf} non-finite voxel(s) ({n_nan} NaN, {n_inf} infinite) out of {size}"
    if mode == "error":
        raise DataError(
            f"{where!r} holds {counts}; fix the file, or replace them with a value (nonfinite: replace, "
            "nonfinite_value: <number> in the bundles; mode='replace' in CheckFinite)."
        )
    logger.warning("%r: replaced %s with %g.", where, counts, value)
    if isinstance(data, torch.Tensor):
        out = data.clone()
        out[~torch.isfinite(out)] = value
        return out
    out_np = np.array(data, copy=True)
    out_np[~np.isfinite(out_np)] = value
    return out_np


class CheckFinite(Transform):
    """Stop (or repair) an image that holds NaN or infinite values, naming its file.

    Args:
        mode: ``"error"``: raise :class:`~spectraflow_monai.utils.errors.DataError` naming the file and the number of
            non-finite voxels; ``"replace"``: replace them by ``value`` and log a warning with the file and the
            count. Defaults to ``"error"``.
        value: replacement value for ``"replace"`` mode, in the units of the input (HU for raw CT). Defaults to 0.

    Raises:
        ValueError: bad ``mode`` or a non-finite ``value``.
    """

    backend = [torch.Tensor, np.ndarray]  # type: ignore[assignment]

    def __init__(self, mode: str = "error", value: float = 0.0) -> None:
        self.value = check_nonfinite_args(mode, value)
        self.mode = mode

    def __call__(self, img: Any, name: str | os.PathLike | None = None) -> Any:
        """Check ``img``; ``name`` (default: the ``MetaTensor``'s ``filename_or_obj``) is named in the messages."""
        return check_finite(img, name, mode=self.mode, value=self.value)


class CheckFinited(MapTransform):
    """Dictionary-based :class:`CheckFinite`.

    The message names the file from the item's ``MetaTensor`` metadata, else the path in ``d[f"{key}_path"]`` or
    the data dictionary's ``"case"``, else the key.

    Args:
        keys: keys of the image items to check. Defaults to ``"image"``.
        mode: ``"error"`` or ``"replace"``. Defaults to ``"error"``.
        value: replacement value for ``"replace"`` mode. Defaults to 0.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    backend = CheckFinite.backend

    def __init__(
        self, keys: KeysCollection = "image", mode: str = "error", value: float = 0.0, allow_missing_keys: bool = False
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.checker = CheckFinite(mode=mode, value=value)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            name = None
            meta = getattr(d[key], "meta", None)
            if not (isinstance(meta, Mapping) and meta.get("filename_or_obj")):
                if isinstance(d.get(f"{key}_path"), (str, os.PathLike)):
                    name = d[f"{key}_path"]
                elif d.get("case") is not None:
                    name = f"case {d['case']} ({key})"
                else:
                    name = str(key)
            d[key] = self.checker(d[key], name)
        return d
