"""Small file helpers for bundle configs."""

from __future__ import annotations

import os

__all__ = ["require_file", "require_items"]


def require_file(path: str | os.PathLike, hint: str = "") -> str:
    """Return ``path`` when it is an existing file, else raise ``FileNotFoundError`` naming it (and ``hint``).

    Bundle configs call it in ``initialize`` so that a missing input stops the run before any work starts.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} does not exist" + (f": {hint}" if hint else "."))
    return path


def require_items(items: list, description: str) -> list:
    """Return ``items`` when it is non-empty, else raise ``FileNotFoundError`` with ``description`` of what is missing."""
    if not items:
        raise FileNotFoundError(description)
    return items
