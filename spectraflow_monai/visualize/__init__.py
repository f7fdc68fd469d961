"""Figures and reports for SpectraFlow runs (Chen et al.): training curves, prediction overlays, Markdown reports.

- :mod:`.curves`: :func:`read_scalars`, :func:`plot_training_curves` (TensorBoard scalars, one panel per tag);
- :mod:`.overlays`: :func:`overlay_arrays`, :func:`plot_overlays` (ground-truth and predicted contours);
- :mod:`.predictions`: :func:`find_prediction` and the per-image Dice of an evaluation folder;
- :mod:`.report`: :func:`write_report` (``report.md``); its command line is :mod:`.cli` (``spectraflow report``).
"""

from .curves import plot_training_curves, read_scalars
from .overlays import overlay_arrays, plot_overlays
from .predictions import find_prediction
from .report import write_report

__all__ = [
    "find_prediction",
    "overlay_arrays",
    "plot_overlays",
    "plot_training_curves",
    "read_scalars",
    "write_report",
]
