"""A Markdown report of one evaluation run: metric table, training curves and prediction overlays.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") reports per-image metrics averaged over each test set (Sec. "Datasets and Metrics") and shows
qualitative predictions next to the ground truth. The 2D bundle's evaluation writes, into one folder ``eval_dir``:

- ``metrics.csv`` (one row per image, or per image and class), ``summary.md`` and ``summary.json``
  (:class:`~spectraflow_monai.metrics.SegmentationMetricSuite`);
- ``predictions/<name>_seg.png``: binary predictions (0/255) at 224x224, written by MONAI ``SaveImaged`` with the
  ``PILWriter`` (``predictions/<name>/<name>_seg.png`` when ``separate_folder=True``).

Training writes TensorBoard event files with MONAI's ``TensorBoardStatsHandler`` (Stage-2 into ``logs/``, Stage-1
into ``logs/stage1/``). :func:`write_report` gathers all of it into ``eval_dir/report.md`` with two figures next to
it: ``curves.png`` (:func:`plot_training_curves`, one panel per scalar tag) and ``overlays.png``
(:func:`plot_overlays`, images with the ground-truth contour in green and the predicted contour in red).

Images, masks and predictions are all read with MONAI's ``LoadImage(reader="PILReader")``, the reader the bundle
trains and saves with, so their orientations agree (MONAI's PIL reader and writer both swap the two spatial axes,
and the figures swap them back). matplotlib (Agg canvas, no pyplot state), scikit-image and TensorBoard are
imported inside the functions that use them. Every file is written atomically.

Command line::

    python -m spectraflow_monai.visualize.report --eval-dir eval \\
        --log-dir Stage-1=logs/stage1 --log-dir Stage-2=logs --datalist val.json
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.metrics.handler import name_from_path
from spectraflow_monai.transforms.label import BinarizeLabel
from spectraflow_monai.utils.files import atomic_path, write_text_atomic

__all__ = [
    "GT_COLOR",
    "HEADLINE_TAGS",
    "PRED_COLOR",
    "find_prediction",
    "main",
    "overlay_arrays",
    "plot_overlays",
    "plot_training_curves",
    "read_scalars",
    "write_report",
]

logger = logging.getLogger(__name__)

#: tags plotted first in their folder's block: Stage-1's unweighted MeanFlow error, Stage-2's training loss
HEADLINE_TAGS = ("meanflow_error", "train_loss")

#: contour colours of :func:`plot_overlays`
GT_COLOR = "lime"
PRED_COLOR = "red"
#: file name suffix of the predictions written by the bundle (``SaveImaged(output_postfix="seg")``)
PRED_SUFFIX = "_seg.png"
_DICE_COLUMNS = ("dice", "dsc", "mdsc", "mean_dice", "dice_score", "val_mean_dice")
_NAME_COLUMNS = ("name", "image", "id", "filename", "filename_or_obj")
_MAX_LISTED = 10


# ---------------------------------------------------------------------------------------------------- helpers
def _save_figure(fig: Any, path: str | os.PathLike, dpi: int = 110) -> str:
    """Render ``fig`` (a ``matplotlib.figure.Figure``) as PNG to ``path`` atomically and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = os.fspath(path)
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)
    return path


def _list_names(names: Sequence[str]) -> str:
    shown = ", ".join(str(n) for n in names[:_MAX_LISTED])
    return shown + (f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else "")


def _short(text: str, width: int = 26) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _check_datalist(datalist: Any) -> list[Mapping]:
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


def _entry_name(entry: Mapping) -> str:
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
    names = [_entry_name(entry)]
    if "image" in entry:
        stem = name_from_path(entry["image"])
        if stem not in names:
            names.append(stem)
    for n in names:
        for candidate in (os.path.join(folder, n + PRED_SUFFIX), os.path.join(folder, n, n + PRED_SUFFIX)):
            if os.path.isfile(candidate):
                return candidate
    return None


def _pair_predictions(
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
            missing.append(_entry_name(entry))
        else:
            found.append((entry, _entry_name(entry), pred))
    if not found:
        raise ValueError(
            f"no predictions in '{folder}' for any of the {len(datalist)} datalist entries "
            f"(looked for <name>{PRED_SUFFIX}, e.g. '{_entry_name(datalist[0])}{PRED_SUFFIX}')."
        )
    return found, missing


def _read_dice(metrics_csv: str | os.PathLike) -> dict[str, float]:
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


def _spread_ranks(n: int, k: int) -> list[int]:
    """``k`` ranks out of ``n`` sorted items: best (0), worst (n - 1), median, then the ranks farthest from those
    already taken (an even spread over the ranking)."""
    chosen: list[int] = []
    for r in (0, n - 1, (n - 1) // 2):
        if r not in chosen and len(chosen) < k:
            chosen.append(r)
    while len(chosen) < k:
        rest = [r for r in range(n) if r not in chosen]
        chosen.append(max(rest, key=lambda r: (min(abs(r - c) for c in chosen), -r)))
    return sorted(chosen)


def _load_chw(loader: Any, path: str, what: str) -> np.ndarray:
    """Read one 2D image as a channel-first float array (MONAI PIL reader: spatial axes (W, H))."""
    from monai.transforms import EnsureChannelFirst
    from monai.utils import convert_to_numpy

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} '{path}' does not exist.")
    try:
        img = EnsureChannelFirst()(loader(path))
    except Exception as e:  # unreadable or unsupported file
        raise ValueError(f"cannot read {what} '{path}': {e}") from e
    arr = convert_to_numpy(img, dtype=np.float32)
    if arr.ndim != 3:
        raise ValueError(f"{what} '{path}' must be a 2D image, got an array of shape {arr.shape[1:]}.")
    return arr


def _resize(arr: np.ndarray, size: int, mode: str) -> np.ndarray:
    from monai.transforms import Resize
    from monai.utils import convert_to_numpy

    if arr.shape[1:] == (size, size):
        return arr
    return convert_to_numpy(Resize((size, size), mode=mode)(arr), dtype=np.float32)


def _display_rgb(img_chw: np.ndarray) -> np.ndarray:
    """(C, W, H) image -> (H, W, 3) in [0, 1] for ``imshow``."""
    x = img_chw[:3] if img_chw.shape[0] >= 3 else np.repeat(img_chw[:1], 3, axis=0)
    hi, lo = float(x.max()), float(x.min())
    if hi > 255.0 or lo < 0.0:  # 16-bit or signed data: min-max
        x = (x - lo) / max(hi - lo, 1e-8)
    elif hi > 1.0:
        x = x / 255.0
    return np.clip(np.transpose(x, (2, 1, 0)), 0.0, 1.0)


def _contours(mask_hw: np.ndarray) -> list[np.ndarray]:
    """Sub-pixel contours (row, col) of a binary (H, W) mask; padded so objects touching the border are closed."""
    from skimage import measure

    padded = np.pad(mask_hw.astype(np.float32), 1)
    return [c - 1.0 for c in measure.find_contours(padded, 0.5)]


# ---------------------------------------------------------------------------------------------------- curves
def read_scalars(log_dir: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """All scalar series of a TensorBoard log folder (the event files directly inside it, not its sub-folders).

    Args:
        log_dir: folder written by a ``SummaryWriter`` (e.g. MONAI's ``TensorBoardStatsHandler``), or one event file.

    Returns:
        ``{tag: (steps, values)}``, sorted by tag; empty when the folder holds no scalars.
    """
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    path = os.fspath(log_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(f"log_dir '{path}' does not exist.")
    acc = EventAccumulator(path, size_guidance={SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in sorted(acc.Tags().get("scalars", [])):
        events = acc.Scalars(tag)
        out[tag] = (np.array([e.step for e in events]), np.array([e.value for e in events], dtype=np.float64))
    return out


def _ema(values: np.ndarray, weight: float = 0.9) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing)."""
    out, last, num = np.empty_like(values), 0.0, 0
    for i, v in enumerate(values):
        num += 1
        last = last * weight + (1.0 - weight) * v
        out[i] = last / (1.0 - weight**num)
    return out


def plot_training_curves(log_dirs: Mapping[str, str | os.PathLike], path: str | os.PathLike) -> list[str]:
    """One PNG with a panel per scalar tag, grouped by log folder (a row block per folder, e.g. Stage-1, Stage-2).

    The tags are listed from the event files (never assumed): MONAI's ``TensorBoardStatsHandler`` writes e.g.
    ``train_loss``, ``train_loss_dice``, ``train_loss_bce``, ``train_loss_boundary``, ``boundary_beta``,
    ``val_mean_dice``, ``val_mean_iou``, ``val_hd95`` for Stage-2 and ``meanflow_error`` (the headline),
    ``loss_meanflow_weighted``, ``loss_dispersive``, ``dispersive_weighted``, ``loss`` for the SpectraFlow Stage-1
    pretraining; the tags of ``HEADLINE_TAGS`` lead their block, the others follow in name order. Non-finite
    values (an undefined HD95) are left out of a panel and counted in its title; long series also get a smoothed
    line. Folders that do not exist
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
        headline = [t for t in HEADLINE_TAGS if t in scalars]  # the curve to read first leads its block
        groups.append((str(label), {t: scalars[t] for t in headline + [t for t in scalars if t not in headline]}))
    if not groups:
        logger.warning("training curves: nothing to plot, '%s' not written.", os.fspath(path))
        return []

    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ncols = min(3, max(len(s) for _, s in groups))
    rows = [math.ceil(len(s) / ncols) for _, s in groups]
    fig = Figure(figsize=(4.2 * ncols, 3.0 * sum(rows) + (0.3 if skipped else 0.0)), layout="constrained")
    axes = fig.subplots(sum(rows), ncols, squeeze=False)
    plotted: list[str] = []
    row0 = 0
    for (label, scalars), nrow in zip(groups, rows):
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
            ax.set_title(_short(title, 44), fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            plotted.append(f"{label}/{tag}")
        for j in range(len(scalars), nrow * ncols):
            axes[row0 + j // ncols][j % ncols].set_visible(False)
        row0 += nrow
    if skipped:
        fig.supxlabel("Skipped: " + ", ".join(skipped), fontsize=8)
    _save_figure(fig, path)
    return plotted


# ---------------------------------------------------------------------------------------------------- overlays
def overlay_arrays(
    entry: Mapping, prediction: str | os.PathLike, size: int = 224, loader: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Image, ground truth and prediction of one datalist entry, aligned and ready to display.

    All three files are read with MONAI's ``LoadImage(reader="PILReader")`` (as the bundle reads images and
    ``SaveImaged``/``PILWriter`` writes predictions), resized to ``size`` x ``size`` (image: area; masks: nearest)
    and returned in display orientation (row = image row, as the file shows it).

    Args:
        entry: datalist entry with ``"image"``, ``"label"`` and optionally ``"label_threshold"`` (raw grey level
            from which a mask pixel is foreground; default 128).
        prediction: prediction file (foreground = value >= 128, or >= 0.5 for a file holding 0/1).
        size: output side length. Defaults to 224.
        loader: a ``LoadImage`` instance to reuse. Defaults to a new PIL reader.

    Returns:
        ``(rgb, gt, pred)``: float (size, size, 3) in [0, 1], bool (size, size), bool (size, size).
    """
    if loader is None:
        from monai.transforms import LoadImage

        loader = LoadImage(reader="PILReader", image_only=True)
    image = _resize(_load_chw(loader, os.fspath(entry["image"]), "image"), size, "area")
    threshold = entry.get("label_threshold", 128)
    label = BinarizeLabel(threshold=128 if threshold is None else threshold)(
        _load_chw(loader, os.fspath(entry["label"]), "label")
    )
    label = _resize(np.asarray(label, dtype=np.float32), size, "nearest")[0] > 0.5
    pred = _load_chw(loader, os.fspath(prediction), "prediction").max(axis=0, keepdims=True)
    pred = pred >= (128.0 if pred.max() > 1.0 else 0.5)
    pred = _resize(pred.astype(np.float32), size, "nearest")[0] > 0.5
    # MONAI's PIL reader gives (W, H) spatial axes: transpose back to (H, W) for display
    return _display_rgb(image), label.T, pred.T


def plot_overlays(
    datalist: Sequence[Mapping],
    predictions_dir: str | os.PathLike,
    path: str | os.PathLike,
    num_images: int = 6,
    size: int = 224,
    seed: int = 0,
    metrics_csv: str | os.PathLike | None = None,
) -> int:
    """A grid of images with the ground-truth contour (green) and the predicted contour (red), titled by name.

    Image and mask are read with MONAI's PIL reader and resized to ``size`` x ``size`` as in the bundle (image:
    area, mask: nearest after ``value >= entry["label_threshold"]``, default 128); the prediction (see
    :func:`find_prediction`; foreground = value >= 128, or >= 0.5 for a 0/1 file) is expected at that size and
    resized (nearest) otherwise. Entries without a prediction are skipped with a logged warning.

    With ``metrics_csv`` the shown images are the best, worst and median by per-image Dice, then further images
    spread evenly over the ranking, ordered from best to worst, with their Dice in the title; images missing from
    the CSV come last. Without it, ``num_images`` images are drawn at random (``numpy.random.RandomState(seed)``)
    and shown in datalist order.

    Args:
        datalist: entries ``{"image", "label", "name", "label_threshold"}`` (``name`` defaults to the image file
            name, ``label_threshold`` to 128).
        predictions_dir: folder of ``<name>_seg.png`` predictions.
        path: output PNG file (written atomically).
        num_images: number of images shown (at most the number with a prediction). Defaults to 6.
        size: displayed side length in pixels, the evaluation resolution. Defaults to 224.
        seed: seed of the random choice without ``metrics_csv``. Defaults to 0.
        metrics_csv: per-image metrics CSV with a name column and a Dice (``dice``/``DSC``) column. Defaults to None.

    Returns:
        The number of images shown.

    Raises:
        FileNotFoundError: ``predictions_dir``, ``metrics_csv`` or a shown image/mask file does not exist.
        ValueError: bad arguments, or no entry of ``datalist`` has a prediction (the message names the folder).
    """
    entries = _check_datalist(datalist)
    if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
        raise ValueError(f"num_images must be a positive integer, got {num_images!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}.")
    found, missing = _pair_predictions(entries, predictions_dir)
    if missing:
        logger.warning(
            "overlays: %d of %d image(s) have no prediction in '%s' (looked for <name>%s), skipped: %s.",
            len(missing), len(entries), os.fspath(predictions_dir), PRED_SUFFIX, _list_names(missing),
        )
    k = min(num_images, len(found))

    picked: list[tuple[Mapping, str, str, str]] = []  # entry, name, prediction, title suffix
    if metrics_csv is not None:
        dice = _read_dice(metrics_csv)
        scored = [(t, dice.get(t[1], float("nan"))) for t in found]
        ranked = sorted((x for x in scored if math.isfinite(x[1])), key=lambda x: -x[1])
        unscored = [x for x in scored if not math.isfinite(x[1])]
        n_rank = min(k, len(ranked))
        ranks = _spread_ranks(len(ranked), n_rank) if n_rank else []
        tags = {0: "best", len(ranked) - 1: "worst", (len(ranked) - 1) // 2: "median"}
        for r in ranks:
            (entry, name, pred), d = ranked[r]
            picked.append((entry, name, pred, f"DSC {d:.3f}" + (f" ({tags[r]})" if r in tags else "")))
        for (entry, name, pred), _ in unscored[: k - n_rank]:
            picked.append((entry, name, pred, "DSC n/a"))
    else:
        idx = sorted(np.random.RandomState(seed).choice(len(found), size=k, replace=False).tolist())
        picked = [(*found[i], "") for i in idx]

    logger.info("overlays: showing %s", ", ".join(p[1] for p in picked))

    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from monai.transforms import LoadImage

    loader = LoadImage(reader="PILReader", image_only=True)
    # fixed layout in inches (square panels, room for two title lines above each and the legend below)
    ncols = len(picked) if len(picked) <= 3 else min(4, math.ceil(math.sqrt(len(picked))))
    nrows = math.ceil(len(picked) / ncols)
    panel, title_h, gap, legend_h = 2.5, 0.45, 0.15, 0.4
    fig_w, fig_h = ncols * (panel + gap) + gap, nrows * (panel + title_h) + legend_h
    fig = Figure(figsize=(fig_w, fig_h))
    axes = [
        fig.add_axes((
            (gap + (i % ncols) * (panel + gap)) / fig_w,
            (legend_h + (nrows - 1 - i // ncols) * (panel + title_h)) / fig_h,
            panel / fig_w,
            panel / fig_h,
        ))
        for i in range(len(picked))
    ]
    for i, (entry, name, pred_path, suffix) in enumerate(picked):
        rgb, label, pred = overlay_arrays(entry, pred_path, size=size, loader=loader)
        ax = axes[i]
        ax.set_axis_off()
        ax.imshow(rgb, interpolation="nearest")
        for mask, color in ((label, GT_COLOR), (pred, PRED_COLOR)):
            for c in _contours(mask):
                ax.plot(c[:, 1], c[:, 0], color=color, linewidth=1.3)
        ax.set_xlim(-0.5, size - 0.5)
        ax.set_ylim(size - 0.5, -0.5)
        ax.set_title(_short(name) + (f"\n{suffix}" if suffix else ""), fontsize=9)
    handles = [Line2D([], [], color=GT_COLOR, linewidth=2, label="ground truth"),
               Line2D([], [], color=PRED_COLOR, linewidth=2, label="prediction")]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=2, fontsize=9, frameon=False)
    _save_figure(fig, path)
    return len(picked)


# ---------------------------------------------------------------------------------------------------- report
def write_report(
    eval_dir: str | os.PathLike,
    datalist: Sequence[Mapping] | None = None,
    log_dirs: Mapping[str, str | os.PathLike] | None = None,
    title: str = "SpectraFlow report",
    extra_lines: Sequence[str] = (),
    num_images: int = 6,
    seed: int = 0,
) -> str:
    """Write ``eval_dir/report.md``: the ``summary.md`` metric table, training curves and prediction overlays.

    ``curves.png`` (:func:`plot_training_curves`, when ``log_dirs`` is given) and ``overlays.png``
    (:func:`plot_overlays` on ``eval_dir/predictions``, when ``datalist`` is given; best/median/worst Dice images
    when ``eval_dir/metrics.csv`` exists) are written next to the report and linked from it. Skipped log folders
    and the number of images without a prediction are stated in the report.

    Args:
        eval_dir: evaluation output folder holding ``summary.md`` (and ``metrics.csv``, ``summary.json``,
            ``predictions/``).
        datalist: the evaluated entries (see :func:`plot_overlays`); None: no overlays. Defaults to None.
        log_dirs: ``{label: TensorBoard folder}``, e.g. ``{"Stage-1": "logs/stage1", "Stage-2": "logs"}``; None: no
            curves. Defaults to None.
        title: report title. Defaults to ``"SpectraFlow report"``.
        extra_lines: Markdown lines appended under "Notes" (e.g. the command that produced the run). Defaults to ().
        num_images: number of overlay images. Defaults to 6.
        seed: seed of the overlay choice without ``metrics.csv``. Defaults to 0.

    Returns:
        The path of ``report.md``.

    Raises:
        FileNotFoundError: ``eval_dir``, its ``summary.md`` or its ``predictions`` folder (with a datalist) is missing.
        ValueError: a datalist is given but ``predictions/`` holds no prediction for any entry.
    """
    folder = os.fspath(eval_dir)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"eval_dir '{folder}' does not exist (expected the evaluation output folder).")
    summary_path = os.path.join(folder, "summary.md")
    if not os.path.isfile(summary_path):
        raise FileNotFoundError(f"'{summary_path}' does not exist: run the evaluation first (it writes summary.md).")
    if isinstance(extra_lines, str):
        extra_lines = [extra_lines]
    with open(summary_path) as f:
        summary = f.read().strip()
    # demote the headings of the embedded summary below the report's own
    summary = re.sub(r"^(#{1,5}) ", r"#\1 ", summary, flags=re.MULTILINE)

    lines = [f"# {title}", "", f"Evaluation folder: `{os.path.abspath(folder)}`", "", "## Metrics", "", summary, ""]
    files = [f"[{n}]({n})" for n in ("metrics.csv", "summary.json") if os.path.isfile(os.path.join(folder, n))]
    if files:
        lines += ["Files: " + ", ".join(files) + ".", ""]

    if log_dirs is not None:
        lines += ["## Training curves", ""]
        plotted = plot_training_curves(log_dirs, os.path.join(folder, "curves.png"))
        if plotted:
            lines += ["![Training curves](curves.png)", ""]
        else:
            lines += ["No training scalars found.", ""]
        for label, d in log_dirs.items():
            d = os.fspath(d)
            tags = [p[len(f"{label}/"):] for p in plotted if p.startswith(f"{label}/")]
            if not os.path.exists(d):
                lines.append(f"- {label}: log folder `{d}` not found, skipped.")
            elif not tags:
                lines.append(f"- {label}: no scalars in `{d}`, skipped.")
            else:
                lines.append(f"- {label} (`{d}`): " + ", ".join(f"`{t}`" for t in tags))
        lines.append("")

    if datalist is not None:
        lines += ["## Predictions", ""]
        pred_dir = os.path.join(folder, "predictions")
        entries = _check_datalist(datalist)
        _, missing = _pair_predictions(entries, pred_dir)
        metrics_csv = os.path.join(folder, "metrics.csv")
        has_csv = os.path.isfile(metrics_csv)
        n = plot_overlays(entries, pred_dir, os.path.join(folder, "overlays.png"), num_images=num_images, seed=seed,
                          metrics_csv=metrics_csv if has_csv else None)
        how = "best, worst and median Dice (metrics.csv), then spread over the ranking" if has_csv else (
            f"drawn at random (seed {seed})")
        lines += [
            "![Prediction overlays](overlays.png)",
            "",
            f"Ground-truth contour in green, predicted contour in red. {n} of {len(entries) - len(missing)} "
            f"image(s) with a prediction shown: {how}.",
            "",
        ]
        if missing:
            lines.append(
                f"{len(missing)} of {len(entries)} image(s) had no prediction in `predictions/` and were skipped: "
                f"{_list_names(missing)}."
            )
        lines.append("")

    if extra_lines:
        lines += ["## Notes", "", *[str(x) for x in extra_lines], ""]
    report = os.path.join(folder, "report.md")
    write_text_atomic(report, "\n".join(lines).rstrip("\n") + "\n")
    return report


# ---------------------------------------------------------------------------------------------------- CLI
def _load_datalist(path: str, key: str | None) -> list[dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--datalist '{path}' does not exist.")
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, Mapping):
        keys = [key] if key else ["validation", "val", "test", "testing"]
        for k in keys:
            if k in data:
                return list(data[k])
        raise ValueError(f"--datalist '{path}' is a dict without any of the keys {keys}; its keys: {sorted(data)}.")
    if not isinstance(data, list):
        raise ValueError(f"--datalist '{path}' must hold a list of entries or a dict of lists.")
    return data


def _parse_log_dir(text: str) -> tuple[str, str]:
    label, sep, folder = text.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"--log-dir must be NAME=DIR (e.g. Stage-2=logs), got {text!r}.")
    return label, folder


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: ``python -m spectraflow_monai.visualize.report --eval-dir DIR ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m spectraflow_monai.visualize.report",
        description="Write eval_dir/report.md (metric table, training curves, prediction overlays).",
    )
    parser.add_argument("--eval-dir", required=True, help="evaluation output folder (summary.md, predictions/)")
    parser.add_argument("--log-dir", action="append", type=_parse_log_dir, default=[], metavar="NAME=DIR",
                        help="TensorBoard folder with a label, repeatable (e.g. Stage-1=logs/stage1 Stage-2=logs)")
    parser.add_argument("--datalist", help="JSON datalist of the evaluated images (a list, or a dict of lists)")
    parser.add_argument("--datalist-key", help="key of the list in a dict datalist (default: validation/val/test)")
    parser.add_argument("--dataset", help="2D preset instead of --datalist: kvasir | isic2016 | glas | synthetic")
    parser.add_argument("--dataset-dir", help="root folder of --dataset")
    parser.add_argument("--split", default="val", help="split of --dataset (default: val)")
    parser.add_argument("--title", default="SpectraFlow report")
    parser.add_argument("--num-images", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    if args.datalist and args.dataset:
        parser.error("give either --datalist or --dataset, not both.")
    if args.dataset and not args.dataset_dir:
        parser.error("--dataset needs --dataset-dir.")
    try:
        datalist = None
        if args.datalist:
            datalist = _load_datalist(args.datalist, args.datalist_key)
        elif args.dataset:
            from spectraflow_monai.data import build_datalist

            datalist = build_datalist(args.dataset, args.dataset_dir, args.split)
        log_dirs = dict(args.log_dir) if args.log_dir else None
        path = write_report(args.eval_dir, datalist=datalist, log_dirs=log_dirs, title=args.title,
                            num_images=args.num_images, seed=args.seed)
    except (OSError, ValueError) as e:  # bad input: one line naming the file / argument, no traceback
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
