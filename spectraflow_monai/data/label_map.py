"""Label maps: source label values -> the classes a segmentation network learns.

SpectraFlow's Synapse experiment (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation
for Medical Image Segmentation") learns 8 organs of the 13 BTCV labels (TransUNet's mapping,
:data:`spectraflow_monai.apps.synapse.BTCV_TO_SYNAPSE`). Other label volumes (a Decathlon data set, labels drawn in MONAI
Label) carry their own values; a *label map* ``{source value: class index}`` says which class each value becomes:

- :func:`check_label_map` validates a map (from a bundle setting, YAML or the command line) against ``num_classes``;
- :func:`apply_label_map` maps a label array, and names the file and the values the map does not cover
  (``unmapped="error"``) or sends them to background 0 (``unmapped="background"``);
- :func:`check_class_names` checks the class names of the per-organ metric table;
- :func:`inverse_label_map` gives the source value of every class, so that predictions can be saved with the values
  the source labels use (the inverse of the map).

This module needs numpy and torch only; it imports nothing else of the package but its error types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from spectraflow_monai.utils.errors import DataError, SettingError

__all__ = [
    "LABEL_MAP_UNMAPPED",
    "MAX_CLASSES",
    "as_label_int",
    "check_label_map",
    "identity_label_map",
    "apply_label_map",
    "check_class_names",
    "inverse_label_map",
]

#: what :func:`apply_label_map` does with a value the map does not list: stop naming it, or make it background 0.
LABEL_MAP_UNMAPPED: tuple[str, ...] = ("error", "background")
#: the most classes a label map may have (the slice cache stores labels as uint8)
MAX_CLASSES = 256


def as_label_int(value: Any) -> int | None:
    """``value`` as an ``int`` label value (ints, integral floats, numeric strings), else None (booleans included)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _check_num_classes(num_classes: Any, name: str = "num_classes") -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise SettingError(f"{name} must be an int in 2..{MAX_CLASSES}, got {num_classes!r}.")
    if not 2 <= num_classes <= MAX_CLASSES:
        raise SettingError(f"{name} must be an int in 2..{MAX_CLASSES}, got {num_classes!r}.")
    return int(num_classes)


def check_label_map(label_map: Any, num_classes: int, name: str = "label_map") -> dict[int, int]:
    """Return ``label_map`` as ``{int source value: int class}`` after checking it.

    Args:
        label_map: a mapping ``{source value: class index}``; keys may be ints or digit strings (JSON object keys,
            ``"3"``), e.g. ``{0: 0, 3: 1, 7: 2}``. Several source values may share a class. A list of
            ``[source, class]`` pairs (how the slice cache records a map) is accepted too.
        num_classes: number of classes including background 0; every class index must lie in ``[0, num_classes)``.
        name: the setting's name for messages. Defaults to ``"label_map"``.

    Raises:
        SettingError: (a ``ValueError``) naming the setting and the offending entry.
    """
    num_classes = _check_num_classes(num_classes)
    items: Any = label_map
    if isinstance(label_map, Mapping):
        items = list(label_map.items())
    elif isinstance(label_map, Sequence) and not isinstance(label_map, str):
        if not all(isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2 for p in label_map):
            items = None
    else:
        items = None
    if items is None or not items:
        raise SettingError(
            f"{name} must be a non-empty mapping {{source label value: class index}}, e.g. {{0: 0, 3: 1, 7: 2}}, "
            f"got {label_map!r}."
        )
    out: dict[int, int] = {}
    for key, value in items:
        src, dst = as_label_int(key), as_label_int(value)
        if src is None:
            raise SettingError(f"{name} keys must be integer label values, got {key!r} (in {label_map!r}).")
        if dst is None or not 0 <= dst < num_classes:
            raise SettingError(
                f"{name} maps {key!r} to {value!r}: class indices must be ints in 0..{num_classes - 1} "
                f"(num_classes {num_classes})."
            )
        if src in out and out[src] != dst:
            raise SettingError(f"{name} maps the label value {src} twice ({out[src]} and {dst}).")
        out[src] = dst
    return out


def identity_label_map(num_classes: int) -> dict[int, int]:
    """``{0: 0, 1: 1, ..., num_classes - 1: num_classes - 1}``: label values are already the classes."""
    n = _check_num_classes(num_classes)
    return {i: i for i in range(n)}


def apply_label_map(
    label: Any, label_map: Mapping[int, int] | Sequence[Sequence[int]], unmapped: str = "error", where: Any = None
) -> Any:
    """Map the values of a label array with ``label_map`` (a look-up over the values present).

    Args:
        label: integer-valued ``np.ndarray`` or ``torch.Tensor`` of any shape (float arrays must hold integers).
        label_map: ``{source value: class}`` (checked with :func:`check_label_map` by the callers; a list of pairs
            is accepted).
        unmapped: ``"error"``: a value the map does not list stops with a :class:`DataError` naming ``where`` and
            the values; ``"background"``: such values become 0. Defaults to ``"error"``.
        where: file name or case used in messages. Defaults to None.

    Returns:
        the mapped labels, ``np.uint8`` for numpy input (``torch.uint8`` for tensors), same shape.

    Raises:
        ValueError: bad ``unmapped``.
        DataError: (a ``ValueError``) non-numeric or non-integral labels, or unmapped values with
            ``unmapped="error"``; the message names ``where`` and the values.
    """
    if unmapped not in LABEL_MAP_UNMAPPED:
        raise ValueError(f"unmapped must be one of {list(LABEL_MAP_UNMAPPED)}, got {unmapped!r}.")
    mapping = dict(label_map.items()) if isinstance(label_map, Mapping) else {int(k): int(v) for k, v in label_map}
    what = f"label {where}" if where is not None else "label"
    is_tensor = isinstance(label, torch.Tensor)
    if is_tensor:
        lab = label.as_tensor() if hasattr(label, "as_tensor") else label
        arr = lab.detach().cpu().numpy()
    else:
        arr = np.asarray(label)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise DataError(f"{what} must be a numeric array, got dtype {arr.dtype}.")
    values, inverse = np.unique(arr, return_inverse=True)
    if np.issubdtype(values.dtype, np.floating) and not np.array_equal(values, np.rint(values)):
        bad = values[values != np.rint(values)]
        raise DataError(f"{what} holds non-integral values {_fmt(bad)}; a label map needs integer label values.")
    ints = values.astype(np.int64)
    missing = [int(v) for v in ints if int(v) not in mapping]
    if missing and unmapped == "error":
        raise DataError(
            f"{what} holds value(s) {_fmt(np.asarray(missing))} that the label map does not list (it maps "
            f"{sorted(mapping)}); add them to label_map, or set unmapped_labels: background to read them as 0."
        )
    lut = np.asarray([mapping.get(int(v), 0) for v in ints], dtype=np.uint8)
    out = lut[inverse.reshape(-1)].reshape(arr.shape)
    if is_tensor:
        return torch.as_tensor(out, device=label.device)
    return out


def _fmt(values: np.ndarray, limit: int = 10) -> str:
    vals = [v.item() for v in np.asarray(values).ravel()[:limit]]
    more = f" ... ({values.size - limit} more)" if values.size > limit else ""
    return f"{vals}{more}"


def check_class_names(class_names: Any, num_classes: int, name: str = "class_names") -> list[str]:
    """Return the ``num_classes - 1`` foreground class names of ``class_names``.

    Args:
        class_names: a sequence of ``num_classes`` distinct names (background first) or of ``num_classes - 1``
            (foreground only).
        num_classes: number of classes including background.
        name: the setting's name for messages. Defaults to ``"class_names"``.

    Raises:
        SettingError: (a ``ValueError``) naming the setting and the value.
    """
    n = _check_num_classes(num_classes)
    ok = isinstance(class_names, Sequence) and not isinstance(class_names, str)
    names = [str(c) for c in class_names] if ok else []
    if ok and len(names) == n:
        names = names[1:]
    if not ok or len(names) != n - 1 or len(set(names)) != len(names) or not all(c.strip() for c in names):
        raise SettingError(
            f"{name} must list {n} distinct names (background first) or {n - 1} (the foreground classes), as "
            f"num_classes is {n}; got {class_names!r}."
        )
    return names



def inverse_label_map(label_map: Mapping[int, int] | Sequence[Sequence[int]] | None, num_classes: int) -> list | None:
    """The source label value of every class: ``values[c]`` is the first source value that ``label_map`` maps to
    class ``c`` (in the map's order, so ``{background: 255, membrane: 0}`` gives ``[255, 0]``; several values of one
    class give the first listed); a class that no value maps to keeps its index. None for ``label_map`` None.

    Predictions saved through it carry the values of the source labels instead of class indices
    (:class:`spectraflow_monai.transforms.SaveLabelValuesd`).

    Raises:
        SettingError: (a ``ValueError``) a bad map or ``num_classes`` (see :func:`check_label_map`).
    """
    if label_map is None:
        return None
    mapping = check_label_map(label_map, num_classes)
    values: list[int | None] = [None] * int(num_classes)
    for src, cls in mapping.items():
        if values[cls] is None:
            values[cls] = src
    return [c if v is None else v for c, v in enumerate(values)]
