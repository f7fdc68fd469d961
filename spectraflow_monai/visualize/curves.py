"""Training curves of SpectraFlow runs from their TensorBoard event files, one panel per scalar tag.

Training writes TensorBoard event files with MONAI's ``TensorBoardStatsHandler`` (Stage-2 into ``logs/``, Stage-1
into ``logs/stage1/``); :func:`read_scalars` reads them back and :func:`plot_training_curves` draws every tag, the
headline curves (:data:`HEADLINE_TAGS`) first. matplotlib (Agg canvas, no pyplot state) and TensorBoard are imported
inside the functions that use them; the PNG is written atomically.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping

import numpy as np

from spectraflow_monai.visualize.utils import save_figure, shorten

__all__ = ["HEADLINE_TAGS", "REDUNDANT_TAGS", "plot_training_curves", "read_scalars", "redundant_tags", "step_units"]

logger = logging.getLogger(__name__)

#: tags plotted first in their folder's block: Stage-1's unweighted MeanFlow error, Stage-2's training loss
HEADLINE_TAGS = ("meanflow_error", "train_loss")

#: Stage-1 (MeanFlow) series that another series of the same folder shows better, left out of the curves:
#: ``{tag: (the tags that make it redundant, each with a finite value), why}``
REDUNDANT_TAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "loss_meanflow_weighted": (
        ("meanflow_error",),
        (
            "the adaptively weighted MeanFlow loss L / (L + c)^p, close to 1 by construction (p = 1); meanflow_error "
            "is the unweighted error"
        ),
    ),
    "dispersive_weighted": (("loss_dispersive",), "lambda * loss_dispersive, the same curve scaled"),
    "loss": (
        ("meanflow_error", "loss_meanflow_weighted", "loss_dispersive"),
        (
            "the optimised total loss_meanflow_weighted + lambda * loss_dispersive: the flat weighted term plus the "
            "dispersive curve"
        ),
    ),
}


def _event_files(folder: str) -> list[str]:
    """The event files directly inside ``folder``, by name (the order of runs is :func:`_run_order`'s)."""
    names = [n for n in os.listdir(folder) if n.startswith("events.out.tfevents")]
    return [os.path.join(folder, n) for n in sorted(names) if os.path.isfile(os.path.join(folder, n))]


def _run_order(path: str, first_wall_time: float | None) -> tuple:
    """Sort key of one event file, oldest run first: the wall time of its first event (the writer writes it when it
    opens the file, to the microsecond), else the start time in its name (``events.out.tfevents.<seconds>.<host>.
    <pid>.<writer number>``); ties by the name with its numbers compared as numbers (writer 10 after writer 9).
    The name alone cannot order runs begun within one second: its time counts whole seconds, and its text order puts
    writer 10 before writer 9."""
    name = os.path.basename(path)
    if first_wall_time is None:
        try:
            first_wall_time = float(name.split(".")[3])
        except (IndexError, ValueError):
            first_wall_time = float("inf")
    parts = re.split(r"(\d+)", name)  # text, number, text, ...: numbers at the odd places
    return first_wall_time, [int(p) if i % 2 else p for i, p in enumerate(parts)]


def _read_file(path: str) -> tuple[float | None, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The wall time of the first event of one event file (None: no event) and its scalar series."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(path, size_guidance={SCALARS: 0})
    acc.Reload()
    try:
        first = float(acc.FirstEventTimestamp())
    except ValueError:  # a file without events
        first = None
    out = {}
    for tag in acc.Tags().get("scalars", []):
        events = acc.Scalars(tag)
        out[tag] = (np.array([e.step for e in events]), np.array([e.value for e in events], dtype=np.float64))
    return first, out


def read_scalars(log_dir: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The scalar series of the latest run in a TensorBoard log folder (its event files, not its sub-folders).

    A folder holds one event file per run (a rerun, a resumed run, a run started over in the same bundle_root). The
    files are read oldest first (by the wall time of their first event, not by name: runs begun within one second
    share the name's time) and a later run replaces every step from its first one on: a resumed run continues
    the curve of the run it resumed (the steps before it are kept), a run started over replaces the whole curve,
    and an interrupted run and its rerun are never joined into one zig-zag.

    Args:
        log_dir: folder written by a ``SummaryWriter`` (e.g. MONAI's ``TensorBoardStatsHandler``), or one event file.

    Returns:
        ``{tag: (steps, values)}``, sorted by tag, steps increasing; empty when the folder holds no scalars.
    """
    path = os.fspath(log_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(f"log_dir '{path}' does not exist.")
    files = _event_files(path) if os.path.isdir(path) else [path]
    runs = sorted(((f, *_read_file(f)) for f in files), key=lambda r: _run_order(r[0], r[1]))
    merged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for _, _, scalars in runs:
        for tag, (steps, values) in scalars.items():
            if len(steps) == 0:
                continue
            if tag in merged:  # the later run replaces the steps from its first one on
                old_steps, old_values = merged[tag]
                keep = old_steps < steps.min()
                steps, values = np.concatenate([old_steps[keep], steps]), np.concatenate([old_values[keep], values])
            merged[tag] = (steps, values)
    return {tag: merged[tag] for tag in sorted(merged)}


def step_units(scalars: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, str]:
    """The x-axis unit of every series of one log folder: ``"iteration"`` or ``"epoch"``.

    MONAI's ``TensorBoardStatsHandler`` writes a trainer's output (e.g. ``train_loss``) at every iteration and the
    metrics (``val_mean_dice``, the loss terms, ``boundary_beta``) once per epoch, both against its own counter. In
    a folder whose series end at different steps, those ending at the largest step are per iteration and the others
    per epoch; when every series ends at the same step (Stage-1 logs every term per iteration), all are per iteration.
    """
    ends = {tag: int(steps.max()) for tag, (steps, _) in scalars.items() if len(steps)}
    if not ends:
        return {tag: "iteration" for tag in scalars}
    last = max(ends.values())
    if len(set(ends.values())) == 1:
        return {tag: "iteration" for tag in scalars}
    return {tag: "iteration" if ends.get(tag, last) == last else "epoch" for tag in scalars}


def _ema(values: np.ndarray, weight: float = 0.9) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing)."""
    out, last, num = np.empty_like(values), 0.0, 0
    for i, v in enumerate(values):
        num += 1
        last = last * weight + (1.0 - weight) * v
        out[i] = last / (1.0 - weight**num)
    return out


def redundant_tags(scalars: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, str]:
    """The series of one log folder left out of its curves (:data:`REDUNDANT_TAGS`), with the reason.

    A tag is left out only when every series that makes it redundant is in the folder with a finite value (a
    ``meanflow_error`` that is all NaN keeps ``loss_meanflow_weighted``).

    Args:
        scalars: ``{tag: (steps, values)}`` of one folder (:func:`read_scalars`).

    Returns:
        ``{tag: why}`` of the tags left out.
    """

    def informative(tag: str) -> bool:
        return tag in scalars and bool(np.isfinite(scalars[tag][1]).any())

    return {
        tag: why
        for tag, (instead, why) in REDUNDANT_TAGS.items()
        if tag in scalars and all(informative(t) for t in instead)
    }


def plot_training_curves(log_dirs: Mapping[str, str | os.PathLike], path: str | os.PathLike) -> list[str]:
    """One PNG with a panel per scalar tag, grouped by log folder (a row block per folder, e.g. Stage-1, Stage-2).

    The tags are listed from the event files (never assumed): MONAI's ``TensorBoardStatsHandler`` writes e.g.
    ``train_loss``, ``train_loss_dice``, ``train_loss_bce``, ``train_loss_boundary``, ``boundary_beta``,
    ``val_mean_dice``, ``val_mean_iou``, ``val_hd95`` for Stage-2 and ``meanflow_error`` (the headline),
    ``loss_meanflow_weighted``, ``loss_dispersive``, ``dispersive_weighted``, ``loss`` for the SpectraFlow Stage-1
    pretraining; the tags of ``HEADLINE_TAGS`` lead their block, the others follow in name order. Stage-1 shows
    ``meanflow_error`` and ``loss_dispersive``: the series that only repeat them (the weighted MeanFlow loss, a flat
    line near 1; ``dispersive_weighted``; the total) are left out (:func:`redundant_tags`), logged and named at the
    bottom of the figure. Non-finite
    values (an undefined HD95) are left out of a panel and counted in its title; long series also get a smoothed
    line. Each folder shows its latest run (:func:`read_scalars`); x axes are named ``iteration`` or ``epoch``
    (:func:`step_units`). Folders that do not exist
    or hold no scalars are skipped with a logged warning and named at the bottom of the figure.

    Args:
        log_dirs: ``{label: folder}``, e.g. ``{"Stage-1": "logs/stage1", "Stage-2": "logs"}``.
        path: output PNG file (written atomically).

    Returns:
        The plotted series as ``"<label>/<tag>"``, in panel order; empty (and nothing written) when no folder holds
        a scalar.
    """
    if not isinstance(log_dirs, Mapping):
        raise ValueError(f"log_dirs must be a mapping {{label: folder}}, got {type(log_dirs).__name__}.")
    groups: list[tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]] = []
    skipped: list[str] = []
    left_out: list[str] = []
    for label, folder in log_dirs.items():
        folder = os.fspath(folder)
        if not os.path.exists(folder):
            logger.warning("training curves: log folder '%s' (%s) does not exist, skipped.", folder, label)
            skipped.append(f"{label} (not found)")
            continue
        scalars = read_scalars(folder)
        if not scalars:
            logger.warning("training curves: no scalars in '%s' (%s), skipped.", folder, label)
            skipped.append(f"{label} (no scalars)")
            continue
        redundant = redundant_tags(scalars)
        for tag, why in redundant.items():
            logger.info("training curves: %s/%s not drawn: %s.", label, tag, why)
        left_out += [f"{label}/{tag}" for tag in redundant]
        scalars = {t: v for t, v in scalars.items() if t not in redundant}
        headline = [t for t in HEADLINE_TAGS if t in scalars]  # the curve to read first leads its block
        groups.append((str(label), {t: scalars[t] for t in headline + [t for t in scalars if t not in headline]}))
    if not groups:
        logger.warning("training curves: nothing to plot, '%s' not written.", os.fspath(path))
        return []

    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ncols = min(3, max(len(s) for _, s in groups))
    rows = [math.ceil(len(s) / ncols) for _, s in groups]
    foot = [f"Skipped: {', '.join(skipped)}"] if skipped else []
    if left_out:
        foot.append(f"Not drawn (another panel shows them): {', '.join(left_out)}")
    fig = Figure(figsize=(4.2 * ncols, 3.0 * sum(rows) + 0.3 * len(foot)), layout="constrained")
    axes = fig.subplots(sum(rows), ncols, squeeze=False)
    plotted: list[str] = []
    row0 = 0
    for (label, scalars), nrow in zip(groups, rows):
        units = step_units(scalars)
        for i, (tag, (steps, values)) in enumerate(scalars.items()):
            ax = axes[row0 + i // ncols][i % ncols]
            ok = np.isfinite(values)
            s, v = steps[ok], values[ok]
            title = f"{label}: {tag}" + (f" ({int((~ok).sum())} non-finite)" if (~ok).any() else "")
            if len(v) >= 50:
                ax.plot(s, v, color="tab:blue", alpha=0.3, linewidth=0.8)
                ax.plot(s, _ema(v), color="tab:blue", linewidth=1.5)
            elif len(v) > 0:
                ax.plot(s, v, color="tab:blue", linewidth=1.5, marker="o", markersize=3)
            else:
                ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(shorten(title, 44), fontsize=9)
            ax.set_xlabel(units[tag], fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            plotted.append(f"{label}/{tag}")
        for j in range(len(scalars), nrow * ncols):
            axes[row0 + j // ncols][j % ncols].set_visible(False)
        row0 += nrow
    if foot:
        fig.supxlabel("\n".join(foot), fontsize=8)
    save_figure(fig, path)
    return plotted
