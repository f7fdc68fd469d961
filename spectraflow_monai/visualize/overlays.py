"""Prediction overlays: images with the ground-truth contour (green) and the predicted contour (red).

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") shows qualitative predictions next to the ground truth. Images, masks and predictions are all read
with the reader the 2D bundle trains with, :class:`~spectraflow_monai.data.Image2DReader` (Pillow, and tifffile for the
TIFFs Pillow cannot open; images as RGB in [0, 1], masks with their stored values), so every format the bundle reads
is shown and the orientations agree (the reader and MONAI's PIL writer both swap the two spatial axes, and the
figures swap them back). Label maps (``label_classes``) are shown through their label map: foreground = every
value of a class other than background (class 0), the foreground value 0 of an inverted map included. matplotlib
(Agg canvas, no pyplot state) and scikit-image are imported inside the functions that use them; the PNG is written
atomically.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.data.label_map import apply_label_map
from spectraflow_monai.data.readers import Image2DReader
from spectraflow_monai.transforms.label import BinarizeLabel
from spectraflow_monai.visualize.predictions import PRED_SUFFIX, check_datalist, pair_predictions, read_dice
from spectraflow_monai.visualize.utils import list_names, save_figure, shorten

__all__ = ["GT_COLOR", "PRED_COLOR", "mask_contours", "overlay_arrays", "plot_overlays"]

logger = logging.getLogger(__name__)

#: contour colours of :func:`plot_overlays`
GT_COLOR = "lime"
PRED_COLOR = "red"


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


def _loaders() -> dict[str, Any]:
    """``LoadImage`` of the images and of the masks / predictions, with the bundle's reader."""
    from monai.transforms import LoadImage

    return {kind: LoadImage(reader=Image2DReader(kind), image_only=True) for kind in ("image", "label")}


def _load_chw(loader: Any, path: str, what: str) -> np.ndarray:
    """Read one 2D image as a channel-first float array (spatial axes (W, H), as MONAI's PIL reader gives them)."""
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


def mask_contours(mask_hw: np.ndarray) -> list[np.ndarray]:
    """Sub-pixel contours (row, col) of a binary (H, W) mask; padded so objects touching the border are closed."""
    from skimage import measure

    padded = np.pad(mask_hw.astype(np.float32), 1)
    return [c - 1.0 for c in measure.find_contours(padded, 0.5)]


def _foreground(arr: np.ndarray, label_map: Mapping[int, int], path: str) -> np.ndarray:
    """(C, W, H) label values -> (1, W, H) bool: values of a class other than background (0) under ``label_map``."""
    return apply_label_map(np.rint(arr[:1]), label_map, unmapped="background", where=path) > 0


def overlay_arrays(
    entry: Mapping,
    prediction: str | os.PathLike,
    size: int = 224,
    loader: Any = None,
    label_map: Mapping[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Image, ground truth and prediction of one datalist entry, aligned and ready to display.

    All three files are read with the bundle's :class:`~spectraflow_monai.data.Image2DReader` (images as RGB in
    [0, 1], masks and predictions with their stored values), resized to ``size`` x ``size`` (image: area; masks:
    nearest) and returned in display orientation (row = image row, as the file shows it).

    Args:
        entry: datalist entry with ``"image"``, ``"label"`` and optionally ``"label_threshold"`` (raw grey level
            from which a mask pixel is foreground; default 128).
        prediction: prediction file (foreground = value >= 128, or >= 0.5 for a file holding 0/1).
        size: output side length. Defaults to 224.
        loader: one ``LoadImage`` instance for all three files, or ``{"image": ..., "label": ...}`` (masks and
            predictions). Defaults to the bundle's reader per kind of file.
        label_map: ``{source value: class}`` of label maps (``label_classes``): mask and prediction pixels are
            foreground when their value belongs to a class other than 0 (the prediction holding source values, as
            the bundle writes them). None: binary masks as above. Defaults to None.

    Returns:
        ``(rgb, gt, pred)``: float (size, size, 3) in [0, 1], bool (size, size), bool (size, size).
    """
    if isinstance(loader, Mapping):
        loaders = loader
    else:
        loaders = _loaders() if loader is None else {"image": loader, "label": loader}
    image = _resize(_load_chw(loaders["image"], os.fspath(entry["image"]), "image"), size, "area")
    label_path, pred_path = os.fspath(entry["label"]), os.fspath(prediction)
    raw_label = _load_chw(loaders["label"], label_path, "label")
    raw_pred = _load_chw(loaders["label"], pred_path, "prediction")
    if label_map is not None:
        label, pred = _foreground(raw_label, label_map, label_path), _foreground(raw_pred, label_map, pred_path)
    else:
        threshold = entry.get("label_threshold", 128)
        label = BinarizeLabel(threshold=128 if threshold is None else threshold)(raw_label)
        pred = raw_pred.max(axis=0, keepdims=True)
        pred = pred >= (128.0 if pred.max() > 1.0 else 0.5)
    label = _resize(np.asarray(label, dtype=np.float32), size, "nearest")[0] > 0.5
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
    label_map: Mapping[int, int] | None = None,
) -> int:
    """A grid of images with the ground-truth contour (green) and the predicted contour (red), titled by name.

    Image and mask are read with the bundle's reader (see :func:`overlay_arrays`, ``label_map`` for label maps) and
    resized to ``size`` x ``size`` as in the bundle (image:
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
        label_map: ``{source value: class}`` of label maps (see :func:`overlay_arrays`). Defaults to None.

    Returns:
        The number of images shown.

    Raises:
        FileNotFoundError: ``predictions_dir``, ``metrics_csv`` or a shown image/mask file does not exist.
        ValueError: bad arguments, or no entry of ``datalist`` has a prediction (the message names the folder).
    """
    entries = check_datalist(datalist)
    if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
        raise ValueError(f"num_images must be a positive integer, got {num_images!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}.")
    found, missing = pair_predictions(entries, predictions_dir)
    if missing:
        logger.warning(
            "overlays: %d of %d image(s) have no prediction in '%s' (looked for <name>%s), skipped: %s.",
            len(missing), len(entries), os.fspath(predictions_dir), PRED_SUFFIX, list_names(missing),
        )
    k = min(num_images, len(found))

    picked: list[tuple[Mapping, str, str, str]] = []  # entry, name, prediction, title suffix
    if metrics_csv is not None:
        dice = read_dice(metrics_csv)
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
    loaders = _loaders()
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
        rgb, label, pred = overlay_arrays(entry, pred_path, size=size, label_map=label_map, loader=loaders)
        ax = axes[i]
        ax.set_axis_off()
        ax.imshow(rgb, interpolation="nearest")
        for mask, color in ((label, GT_COLOR), (pred, PRED_COLOR)):
            for c in mask_contours(mask):
                ax.plot(c[:, 1], c[:, 0], color=color, linewidth=1.3)
        ax.set_xlim(-0.5, size - 0.5)
        ax.set_ylim(size - 0.5, -0.5)
        ax.set_title(shorten(name) + (f"\n{suffix}" if suffix else ""), fontsize=9)
    handles = [Line2D([], [], color=GT_COLOR, linewidth=2, label="ground truth"),
               Line2D([], [], color=PRED_COLOR, linewidth=2, label="prediction")]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=2, fontsize=9, frameon=False)
    save_figure(fig, path)
    return len(picked)
