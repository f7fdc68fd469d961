"""Figures and reports for SpectraFlow runs (Chen et al.): training curves, prediction overlays, Markdown reports.

- :mod:`.curves`: :func:`read_scalars`, :func:`plot_training_curves` (TensorBoard scalars, one panel per tag);
- :mod:`.overlays`: :func:`overlay_arrays`, :func:`plot_overlays` (ground-truth and predicted contours);
- :mod:`.predictions`: :func:`find_prediction` and the per-image Dice of an evaluation folder;
- :mod:`.report`: :func:`write_report` (``report.md``); its command line is :mod:`.cli` (``spectraflow report``).
"""

from spectraflow_monai._lazy import lazy_exports

#: module -> the names it exports (imported when a name is first used: the command line stays light)
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".predictions": ("find_prediction",),
    ".overlays": ("overlay_arrays", "plot_overlays"),
    ".curves": ("plot_training_curves", "read_scalars"),
    ".report": ("write_report",),
}

__all__: list[str] = [name for names in _EXPORTS.values() for name in names]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
