"""Seeded subsets of a datalist: the validation hold-out and the nested low-data fractions.

SpectraFlow (Chen et al.) measures label efficiency on 10 / 20 / 50 / 100 % of the training images (Fig. 4); the
subsets here are deterministic for a seed, nested across fractions and independent of the input order. The hold-out
gives a validation split to sources without one (a datalist JSON without ``validation``, a folder without
``splits/val.txt``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.utils.errors import SettingError

__all__ = ["check_val_fraction", "holdout", "low_data_subset"]


def check_val_fraction(val_fraction: Any) -> float:
    """``val_fraction`` as a float; SettingError naming the value unless it is a number in (0, 1)."""
    ok = isinstance(val_fraction, (int, float)) and not isinstance(val_fraction, bool)
    if not ok or not 0.0 < float(val_fraction) < 1.0:
        raise SettingError(f"val_fraction must be a number in (0, 1), got {val_fraction!r}.")
    return float(val_fraction)


def low_data_subset(datalist: Sequence[Mapping[str, Any]], fraction: float, seed: int = 0) -> list[dict]:
    """A deterministic, nested fraction of a datalist for the low-data experiments (10/20/50/100 %).

    The entries are ordered by ``name`` (or ``image`` when absent), shuffled with ``numpy.random.RandomState(seed)``,
    and the first ``round(fraction * N)`` (at least one) are kept, so for one seed the subsets are nested
    (10 % within 20 % within 50 %) and independent of the input order. The result keeps the input order.

    Args:
        datalist: entries (dicts).
        fraction: kept fraction in (0, 1].
        seed: shuffling seed. Defaults to 0.

    Returns:
        A new list (shallow copies of the kept entries).
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise SettingError(f"fraction must be a number in (0, 1], got {fraction!r}.")
    n = len(datalist)
    if fraction >= 1.0 or n == 0:
        return [dict(d) for d in datalist]
    keys = [str(d.get("name", d.get("image", i))) for i, d in enumerate(datalist)]
    order = sorted(range(n), key=lambda i: (keys[i], i))
    perm = np.random.RandomState(seed).permutation(n)
    k = max(1, int(math.floor(fraction * n + 0.5 - 1e-9)))
    kept = {order[j] for j in perm[:k]}
    return [dict(datalist[i]) for i in range(n) if i in kept]


def holdout(
    entries: Sequence[Mapping[str, Any]],
    val_fraction: float,
    seed: int = 0,
    key: str = "name",
    group_key: str = "group",
) -> tuple[list[dict], list[dict]]:
    """Split ``entries`` into (kept, held out) for validation.

    ``round(val_fraction * N)`` entries (at least 1, at most N - 1) are held out: the entries are sorted by
    ``key`` and permuted with ``numpy.random.RandomState(seed)``, so the split depends on the names and the seed
    only, not on the list order. Both parts keep the input order.

    Grouped hold-out: when entries carry ``group_key`` (a patient, a video: frames of one video, both eyes of one
    patient), whole groups are held out, so that no group has images in both parts: ``round(val_fraction * G)``
    of the G groups (at least 1, at most G - 1), sorted and permuted with the seed the same way. An entry without
    a group is a group of its own.

    Raises:
        SettingError: ``val_fraction`` is not in (0, 1).
        DatasetError: fewer than 2 entries (nothing would be left to train on).
    """
    val_fraction = check_val_fraction(val_fraction)
    n = len(entries)
    if any(group_key in e for e in entries):
        groups = [str(e.get(group_key, f"{e.get(key, i)}")) for i, e in enumerate(entries)]
        names = sorted(set(groups))
        if len(names) < 2:
            raise DatasetError(
                f"cannot hold out a validation group: all {n} training image(s) belong to group {names!r}; give at "
                "least 2 groups, or a validation list."
            )
        k = min(len(names) - 1, max(1, int(np.floor(val_fraction * len(names) + 0.5))))
        held_groups = {names[j] for j in np.random.RandomState(seed).permutation(len(names))[:k]}
        kept = [dict(e) for e, g in zip(entries, groups) if g not in held_groups]
        return kept, [dict(e) for e, g in zip(entries, groups) if g in held_groups]
    if n < 2:
        raise DatasetError(
            f"cannot hold out a validation image from {n} training image(s): give at least 2, or a validation list."
        )
    k = min(n - 1, max(1, int(np.floor(val_fraction * n + 0.5))))
    order = sorted(range(n), key=lambda i: (str(entries[i].get(key, "")), i))
    held = {order[j] for j in np.random.RandomState(seed).permutation(n)[:k]}
    kept = [dict(e) for i, e in enumerate(entries) if i not in held]
    return kept, [dict(e) for i, e in enumerate(entries) if i in held]
