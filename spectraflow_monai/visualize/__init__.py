"""Figures and reports for SpectraFlow runs (Chen et al.): training curves, prediction overlays, Markdown reports."""

from __future__ import annotations

import importlib
from typing import Any

__all__: list[str] = []

# report.py is also a command line module (python -m spectraflow_monai.visualize.report): its names are resolved
# lazily so that running it does not import it twice (runpy warns when the package imported it beforehand).
_LAZY_EXPORTS = {
    "overlay_arrays": ".report",
    "plot_overlays": ".report",
    "plot_training_curves": ".report",
    "read_scalars": ".report",
    "write_report": ".report",
}
__all__ += ["overlay_arrays", "plot_overlays", "plot_training_curves", "read_scalars", "write_report"]


def __getattr__(name: str) -> Any:
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))
