"""The paper's analysis figures from arrays: t-SNE of encoder features, DAF gate maps, error spectra, model panels.

SpectraFlow (Chen et al.) illustrates its claims with a t-SNE of the Stage-1 features with and without the dispersive
loss (Fig. 3), the DAF gate maps over images (Fig. 6), the frequency content of the segmentation errors (Fig. 1d) and
predictions of several models on the same images (Fig. 7). Each function here draws one of them from arrays (the
computation that produces the arrays is in :mod:`spectraflow_monai.experiments.figures`) and writes a PNG atomically.
Images are (H, W, 3) floats in [0, 1] and masks (H, W) booleans, in display orientation. matplotlib (Figure API, no
pyplot state) and scikit-learn are imported inside the functions that use them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectraflow_monai.visualize.overlays import GT_COLOR, PRED_COLOR, mask_contours
from spectraflow_monai.visualize.utils import save_figure

__all__ = [
    "feature_spread",
    "mean_pairwise_distance",
    "plot_error_spectra",
    "plot_feature_tsne",
    "plot_gate_maps",
    "plot_model_panel",
]


def mean_pairwise_distance(features: np.ndarray) -> float:
    """Mean Euclidean distance between the rows of ``features`` (N >= 2, C), each pair once (the quantity the
    dispersive loss pushes up)."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"features must be (N >= 2, C), got shape {x.shape}.")
    sq = (x**2).sum(1)
    d2 = np.clip(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0, None)
    return float(np.sqrt(d2)[~np.eye(len(x), dtype=bool)].mean())


def feature_spread(features: np.ndarray) -> float:
    """:func:`mean_pairwise_distance` over the mean row norm: how dispersed a feature set is, independent of its
    overall scale (a loss can raise distances by scaling all features up; this ratio does not count that)."""
    x = np.asarray(features, dtype=np.float64)
    distance = mean_pairwise_distance(x)
    return float(distance / max(np.sqrt((x**2).sum(1)).mean(), 1e-12))


def _suptitle(fig: Any, title: str | None) -> None:
    if title:
        fig.suptitle(title, fontsize=8)


def plot_feature_tsne(
    groups: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | os.PathLike,
    class_names: Sequence[str] = ("image", "mask"),
    seed: int = 0,
    title: str | None = None,
) -> str:
    """One t-SNE panel per feature set (paper Fig. 3), points coloured by class (image or mask input).

    Args:
        groups: title -> ``(features (N, C), classes (N,) ints indexing class_names)``.
        path: PNG output.
        class_names: the names of the class indices. Defaults to ``("image", "mask")``.
        seed: t-SNE random state. Defaults to 0.
        title: the figure's title (above the panels), or None. Defaults to None.
    """
    from matplotlib.figure import Figure

    try:
        from sklearn.manifold import TSNE
    except ImportError as exc:
        raise ImportError(
            "the t-SNE figure needs scikit-learn: pip install 'spectraflow_monai[figures]' (or scikit-learn)."
        ) from exc

    if not groups:
        raise ValueError("groups must hold at least one feature set.")
    fig = Figure(figsize=(3.4 * len(groups), 3.4))
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, (panel, (features, classes)) in zip(axes, groups.items()):
        features = np.asarray(features, dtype=np.float32)
        classes = np.asarray(classes)
        if features.ndim != 2 or len(features) != len(classes) or len(features) < 3:
            raise ValueError(f"{panel}: need (N >= 3, C) features and N classes, got {features.shape}, "
                             f"{classes.shape}.")  # fmt: skip
        perplexity = float(min(30.0, (len(features) - 1) / 3.0))
        xy = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(features)
        for k, name in enumerate(class_names):
            sel = classes == k
            ax.scatter(xy[sel, 0], xy[sel, 1], s=6, alpha=0.7, label=name)
        ax.set_title(f"{panel}\ndistance {mean_pairwise_distance(features):.3g}, spread {feature_spread(features):.3f}",
                     fontsize=8)  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].legend(fontsize=7, markerscale=2)
    _suptitle(fig, title)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_gate_maps(
    images: Sequence[np.ndarray],
    gates: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    path: str | os.PathLike,
    title: str | None = None,
) -> str:
    """Each image with its ground-truth contour next to its DAF gate map (paper Fig. 6).

    Args:
        images: (H, W, 3) in [0, 1].
        gates: (h, w) gate maps in [0, 1] (e.g. the channel mean of the gate M), shown over the image.
        labels: (H, W) ground-truth masks.
        path: PNG output.
        title: a line above the figure's own title, or None. Defaults to None.
    """
    from matplotlib.figure import Figure

    if not len(images) == len(gates) == len(labels) or not images:
        raise ValueError(f"images, gates and labels must be non-empty and as long, got {len(images)}, "
                         f"{len(gates)}, {len(labels)}.")  # fmt: skip
    fig = Figure(figsize=(4.4, 2.2 * len(images)))
    axes = fig.subplots(len(images), 2, squeeze=False)
    for row, (image, gate, label) in enumerate(zip(images, gates, labels)):
        h, w = image.shape[:2]
        axes[row][0].imshow(image)
        for c in mask_contours(label):
            axes[row][0].plot(c[:, 1], c[:, 0], color=GT_COLOR, lw=1)
        axes[row][1].imshow(image)
        lo, hi = float(np.min(gate)), float(np.max(gate))
        axes[row][1].imshow(gate, cmap="jet", alpha=0.5, vmin=lo, vmax=max(hi, lo + 1e-6),
                            extent=(-0.5, w - 0.5, h - 0.5, -0.5))  # fmt: skip
        axes[row][1].set_title(f"gate {lo:.2f} (blue) - {hi:.2f} (red)", fontsize=7)
        for ax in axes[row]:
            ax.set_axis_off()
    axes[0][0].set_title("image, ground truth", fontsize=8)
    _suptitle(fig, "\n".join(t for t in (title, "DAF gate M (channel mean), each map's own range") if t))
    fig.tight_layout()
    return save_figure(fig, path)


def plot_error_spectra(
    spectra: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | os.PathLike,
    band_edges: Sequence[float] = (),
    title: str | None = None,
) -> str:
    """Radial error spectrum of each model (paper Fig. 1d): error power per frequency bin, band edges marked.

    Args:
        spectra: model -> ``(bin centres (cycles/pixel), mean error power per bin)``.
        path: PNG output.
        band_edges: inner band edges drawn as vertical lines.
        title: the figure's title, or None. Defaults to None.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6, 3.2))
    ax = fig.subplots()
    for name, (centres, power) in spectra.items():
        ax.plot(centres, power, marker=".", label=name)
    for edge in band_edges:
        if 0.0 < edge < 0.5:
            ax.axvline(edge, color="grey", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("radial frequency (cycles/pixel)")
    ax.set_ylabel("error power per image (pixels)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _suptitle(fig, title)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_model_panel(
    images: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    predictions: Mapping[str, Sequence[np.ndarray]],
    path: str | os.PathLike,
    title: str | None = None,
) -> str:
    """A grid of images (rows) by models (columns): ground truth (green) and each model's prediction (red) contours
    (paper Fig. 7), under ``title`` when given."""
    from matplotlib.figure import Figure

    if not images or len(labels) != len(images) or any(len(p) != len(images) for p in predictions.values()):
        raise ValueError("images, labels and every model's predictions must be non-empty and as long.")
    columns = ["ground truth", *predictions]
    fig = Figure(figsize=(2.2 * len(columns), 2.2 * len(images)))
    axes = fig.subplots(len(images), len(columns), squeeze=False)
    for row, (image, label) in enumerate(zip(images, labels)):
        for col, pred in enumerate([None, *(p[row] for p in predictions.values())]):
            ax = axes[row][col]
            ax.imshow(image)
            for mask, color in ((label, GT_COLOR), (pred, PRED_COLOR)):
                for c in mask_contours(mask) if mask is not None else ():
                    ax.plot(c[:, 1], c[:, 0], color=color, lw=1)
            ax.set_axis_off()
            if row == 0:
                ax.set_title(columns[col], fontsize=8)
    _suptitle(fig, title)
    fig.tight_layout()
    return save_figure(fig, path)
