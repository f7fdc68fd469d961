"""Small helpers of the figures and reports: atomic PNG output and short names for titles and messages."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from spectraflow_monai.utils.files import atomic_path

__all__ = ["list_names", "save_figure", "shorten"]

#: names listed in full in a message before "... (N more)"
MAX_LISTED = 10


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 110) -> str:
    """Render ``fig`` (a ``matplotlib.figure.Figure``) as PNG to ``path`` atomically and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = os.fspath(path)
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)
    return path


def list_names(names: Sequence[str]) -> str:
    shown = ", ".join(str(n) for n in names[:MAX_LISTED])
    return shown + (f", ... ({len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else "")


def shorten(text: str, width: int = 26) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
