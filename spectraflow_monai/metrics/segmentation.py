"""The SpectraFlow evaluation protocol over a set: per-image rows with names, averaged, with CSV and Markdown reports.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Sec. "Datasets and Metrics") computes every metric per image at 224x224 and averages over the
evaluation set; overlap metrics are reported in percent and HD95 in pixels. The per-image values come from
:func:`~spectraflow_monai.metrics.per_image.compute_segmentation_metrics` (``monai.metrics`` and the one
surface-distance core of :mod:`spectraflow_monai.metrics.surface`; the empty-mask conventions are tabulated there);
:class:`SegmentationMetricSuite` adds the bookkeeping (per-image rows with names, input forms, NaN-aware means, the
reports of :mod:`spectraflow_monai.metrics.reports`).

HD95 comes in two versions per definition. ``hd95_<definition>`` leaves every image with an empty mask out of the
mean (``excluded``); the images with an empty prediction and a non-empty ground truth among them (missed structures)
are counted as ``hd95_dropped``. Because dropping them can flatter a model that misses lesions,
``hd95_<definition>_empty_as_diagonal`` scores those images with the image diagonal; images with an empty ground
truth stay undefined in both. NaN values are excluded from the means and counted in the summary (``excluded``). The
TransUNet conventions for Synapse are in :func:`~spectraflow_monai.metrics.surface.transunet_case_metrics`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.networks.utils import one_hot

from spectraflow_monai.metrics.per_image import (
    EMPTY_CONVENTIONS,
    METRIC_KEYS,
    binarize_prediction,
    check_hd95_definitions,
    compute_segmentation_metrics,
    segmentation_metric_keys,
)
from spectraflow_monai.metrics.reports import SEGMENTATION_SUMMARY_NAMES, nanmean, segmentation_markdown, write_rows_csv
from spectraflow_monai.metrics.surface import HD95_DEFINITIONS
from spectraflow_monai.utils.files import write_text_atomic

__all__ = [
    "NEARLY_FULL_FRACTION",
    "degenerate_prediction_warnings",
    "scoring_description",
    "sort_sizes",
    "EMPTY_CONVENTIONS",
    "METRIC_KEYS",
    "SegmentationMetricSuite",
    "binarize_prediction",
    "evaluate_segmentation",
]


def _to_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor or numpy array, got {type(x).__name__}.")
    x = x.detach()
    x = x.as_tensor() if hasattr(x, "as_tensor") else x  # MetaTensor -> plain tensor
    return x.cpu().double()


#: a prediction covering at least this fraction of the scored pixels (the whole image, or its field of view) "nearly
#: fills" it: :func:`degenerate_prediction_warnings` warns when most predictions do
NEARLY_FULL_FRACTION = 0.9


def degenerate_prediction_warnings(
    rows: Sequence[Mapping[str, Any]], share: float = 0.5, full_fraction: float = NEARLY_FULL_FRACTION
) -> list[str]:
    """Warnings about predictions that make averaged scores mislead: more than ``share`` of the rows (images, or
    image and class) predicted empty, or predicted foreground over nearly all the scored pixels (at least
    ``full_fraction`` of the image, or of its field of view when one is given) while fewer ground truths are: an
    all-foreground model scores a high Dice on data whose foreground covers most of the image (e.g. EM membranes),
    or a fair recall with a precision near the foreground share, without having learned anything.

    Args:
        rows: per-image rows with ``class``, ``pred_area``, ``gt_area`` and ``pixels`` (the number of scored
            pixels: the image's, or its field of view's).
        share: the fraction of rows above which a warning is given. Defaults to 0.5.
        full_fraction: the fraction of the scored pixels from which a prediction counts as nearly full. Defaults
            to :data:`NEARLY_FULL_FRACTION` (0.9).
    """
    if not 0 < full_fraction <= 1:
        raise ValueError(f"full_fraction must be in (0, 1], got {full_fraction!r}.")
    warnings = []
    for cls in dict.fromkeys(r["class"] for r in rows):
        sub = [r for r in rows if r["class"] == cls and "pixels" in r]
        if not sub:
            continue
        which = f" of class {cls!r}" if len({r["class"] for r in rows}) > 1 else ""
        empty = sum(1 for r in sub if r["pred_area"] == 0)
        full = sum(1 for r in sub if r["pixels"] > 0 and r["pred_area"] >= full_fraction * r["pixels"])
        gt_full = sum(1 for r in sub if r["pixels"] > 0 and r["gt_area"] >= full_fraction * r["pixels"])
        if empty > share * len(sub):
            warnings.append(
                f"{empty} of {len(sub)} prediction(s){which} are empty: the model predicts background almost "
                "everywhere; the scores may reflect the empty-mask convention more than the segmentation."
            )
        if full > share * len(sub) and gt_full < full:
            warnings.append(
                f"{full} of {len(sub)} prediction(s){which} are foreground over >= {100 * full_fraction:.0f} % of "
                "the scored pixels (the whole image, or its field of view): the scores measure how much of each "
                "image the ground truth covers, not the segmentation."
            )
    return warnings


def sort_sizes(sizes: Iterable[str]) -> list[str]:
    """The distinct image sizes ``"AxB"`` (any number of dimensions) from the smallest to the largest.

    Sizes are compared as numbers, by pixel count and then dimension by dimension (``"720x576"`` before
    ``"1214x1019"``, ``"64x128"`` before ``"128x64"``); a text that is not a size comes last, in text order.

    Args:
        sizes: sizes such as ``"224x224"``.

    Returns:
        The distinct sizes, sorted.
    """

    def key(size: str) -> tuple:
        parts = str(size).split("x")
        if not all(p.isdigit() for p in parts):
            return (1, 0, (), str(size))
        dims = tuple(int(p) for p in parts)
        return (0, int(np.prod(dims, dtype=object)), dims, str(size))

    return sorted(set(sizes), key=key)


def scoring_description(rows: Sequence[Mapping[str, Any]], original_size: bool | None = None) -> str:
    """One sentence saying how the rows were scored: at which size, and inside a field of view or not.

    Args:
        rows: per-image rows with ``size`` (the scored spatial shape, e.g. ``"224x224"``) and ``fov`` (whether a
            field-of-view mask restricted the scored pixels).
        original_size: True: each image at its original size (the prediction resized to it); False: at the
            network's input size; None: not known (only the sizes are stated). Defaults to None.
    """
    images = {(r.get("name"), r.get("size"), r.get("fov")) for r in rows}
    sizes = sort_sizes(s for _, s, _ in images if s)
    with_fov = sum(1 for _, _, f in images if f)
    if not sizes:
        where = "at the size of the masks given"
    elif len(sizes) == 1:
        where = f"at {sizes[0]}"
    else:
        where = f"at {len(sizes)} different sizes ({sizes[0]} .. {sizes[-1]})"
    if original_size is True:
        where = f"at each image's original size ({where[3:]}; the prediction resized to it, nearest)"
    elif original_size is False:
        where += ", the network's input size (the ground truth resized to it)"
    fov = (
        f"inside a field-of-view mask for {with_fov} of {len(images)} image(s) (only its pixels scored, its area "
        "the whole for the degenerate-prediction warnings)"
        if with_fov
        else "over the whole image (no field-of-view mask)"
    )
    return f"Scored {where}, {fov}."


class SegmentationMetricSuite:
    """Per-image segmentation metrics of the SpectraFlow protocol, built on ``monai.metrics``.

    For every image (and every foreground class) the suite records Dice, IoU, precision, recall and HD95 in the
    selected definitions (see :mod:`spectraflow_monai.metrics.surface`), then averages over images: the SpectraFlow
    paper (Chen et al.) reports mIoU, mDSC, recall, precision in percent and HD95 in pixels, per image at 224x224.
    For multi-class input each class is averaged over images first, then the classes are averaged (the TransUNet
    Synapse convention). The empty-mask conventions are tabulated in :mod:`spectraflow_monai.metrics.per_image`.

    Example::

        suite = SegmentationMetricSuite()
        suite.update(binarize_prediction(logits), labels, name=["a", "b"])
        suite.summary()["mDSC"], suite.summary_markdown()

    Args:
        hd95: HD95 definition(s) to compute, ``"monai"`` and/or ``"pooled"``; an empty sequence or ``None`` skips
            HD95. Defaults to ``("monai", "pooled")``.
        include_background: for multi-channel (one-hot) input, whether channel 0 is scored. Single-channel binary
            input is always the foreground. Defaults to ``False``.
        empty: empty-mask convention, ``"one"``, ``"nan"`` or ``"monai"``. Defaults to ``"one"``.
        num_classes: number of classes (background included) when masks are given as (B, 1, ...) integer label maps
            with more than two classes; ``None`` means single-channel input is binary. Defaults to ``None``.
        class_names: names of the scored classes in channel order (background included when
            ``include_background``); defaults to ``"foreground"`` for binary input and the channel index otherwise.
            Binary input (a 2-class label map included) takes 1 name, or 2 with background first.
        spacing: default pixel/voxel size for HD95 (``None``: pixels); ``update`` may override it per call.
    """

    def __init__(
        self,
        hd95: str | Sequence[str] | None = ("monai", "pooled"),
        include_background: bool = False,
        empty: str = "one",
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
        spacing: float | Sequence[float] | None = None,
    ) -> None:
        defs = check_hd95_definitions(hd95)
        if empty not in EMPTY_CONVENTIONS:
            raise ValueError(f"empty must be one of {EMPTY_CONVENTIONS}, got {empty!r}.")
        if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"num_classes must be None or an integer >= 2, got {num_classes!r}.")
        self.hd95 = defs
        self.include_background = bool(include_background)
        self.empty = empty
        self.num_classes = num_classes
        self.class_names = None if class_names is None else [str(c) for c in class_names]
        self.spacing = spacing
        self._rows: list[dict[str, Any]] = []
        self._count = 0
        self._units = "pixels" if spacing is None else "spacing units"

    # ------------------------------------------------------------------ inputs
    @property
    def metric_keys(self) -> tuple[str, ...]:
        """Per-row metric keys: ``iou, dice, recall, precision``, ``hd95_<definition>`` (missed structures dropped)
        then ``hd95_<definition>_empty_as_diagonal`` (missed structures score the image diagonal)."""
        return segmentation_metric_keys(self.hd95)

    def reset(self) -> None:
        """Forget all recorded images."""
        self._rows = []
        self._count = 0
        self._units = "pixels" if self.spacing is None else "spacing units"

    def _prepare(self, pred: Any, gt: Any) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        p, g = _to_tensor(pred, "pred"), _to_tensor(gt, "gt")
        if p.ndim not in (4, 5) or g.ndim not in (4, 5):
            raise ValueError(
                f"pred and gt must be (B, C, H, W) or (B, C, H, W, D), got {tuple(p.shape)} and {tuple(g.shape)}."
            )
        if p.shape[0] != g.shape[0] or p.shape[2:] != g.shape[2:]:
            raise ValueError(
                f"pred and gt must share batch and spatial shape, got {tuple(p.shape)} and {tuple(g.shape)}."
            )
        if p.shape[1] == 1 and g.shape[1] == 1 and self.num_classes in (None, 2):
            for x, nm in ((p, "pred"), (g, "gt")):
                if bool(((x != 0) & (x != 1)).any()):
                    raise ValueError(
                        f"{nm} must be a binary (0/1) mask; threshold probabilities first, e.g. with "
                        "binarize_prediction(), or set num_classes for an integer label map."
                    )
            names = self.class_names or ["foreground"]
            if len(names) == 2:  # a 2-class label map (background first): its one scored class is the foreground
                names = names[1:]
            if len(names) != 1:
                raise ValueError(
                    "class_names must have 1 entry (the foreground) or 2 (background first) for binary input, "
                    f"got {self.class_names!r}."
                )
            return p, g, list(names)
        n_cls = self.num_classes or max(p.shape[1], g.shape[1])
        converted = []
        for x, nm in ((p, "pred"), (g, "gt")):
            if x.shape[1] == 1:
                if bool(((x < 0) | (x >= n_cls) | (x != torch.round(x))).any()):
                    raise ValueError(f"{nm} label map must hold integer labels in [0, {n_cls - 1}].")
                x = one_hot(x.long(), num_classes=n_cls, dim=1).float()
            elif x.shape[1] != n_cls:
                raise ValueError(f"{nm} has {x.shape[1]} channels but {n_cls} classes are expected.")
            elif bool(((x != 0) & (x != 1)).any()):
                raise ValueError(f"{nm} must be one-hot (0/1 values); use binarize_prediction() on logits.")
            converted.append(x)
        p, g = converted
        start = 0 if self.include_background else 1
        p, g = p[:, start:], g[:, start:]
        names = [str(c) for c in range(start, n_cls)]
        if self.class_names is not None:
            if len(self.class_names) not in (n_cls, n_cls - start):
                raise ValueError(
                    f"class_names must have {n_cls} (all) or {n_cls - start} (scored) entries, "
                    f"got {self.class_names!r}."
                )
            names = self.class_names[start:] if len(self.class_names) == n_cls else list(self.class_names)
        return p, g, names

    @staticmethod
    def _names(name: str | Sequence[str] | None, batch: int, offset: int) -> list[str]:
        if name is None:
            return [f"image_{offset + i:05d}" for i in range(batch)]
        if isinstance(name, (str, os.PathLike)):
            if batch != 1:
                raise ValueError(f"name must be a sequence of {batch} names for a batch of {batch}, got {name!r}.")
            return [os.fspath(name)]
        names = [os.fspath(n) if isinstance(n, os.PathLike) else str(n) for n in name]
        if len(names) != batch:
            raise ValueError(f"name must have {batch} entries (one per image), got {len(names)}.")
        return names

    def update(
        self,
        pred: torch.Tensor | np.ndarray,
        gt: torch.Tensor | np.ndarray,
        name: str | Sequence[str] | None = None,
        spacing: float | Sequence[float] | None = None,
        mask: torch.Tensor | np.ndarray | None = None,
    ) -> list[dict[str, Any]]:
        """Score a batch and record one row per image (and class).

        Args:
            pred: binary prediction, (B, 1, *spatial) 0/1 mask, (B, C, *spatial) one-hot, or (B, 1, *spatial) integer
                labels when ``num_classes > 2``; 2D or 3D spatial, numpy or torch (any device).
            gt: ground truth in any of the same forms (it may differ in form from ``pred``).
            name: one name per image (a string for B == 1); ``None`` numbers the images. Defaults to ``None``.
            spacing: pixel/voxel size for HD95, overriding the suite's ``spacing``. Defaults to ``None``.
            mask: field of view / ignore mask, (B, 1, *spatial) (or broadcastable), non-zero = scored: prediction and
                ground truth outside it are set to background before scoring (as the DRIVE protocol scores vessels
                inside the field of view only). Defaults to ``None`` (every pixel scored).

        Returns:
            The rows added: dicts with ``name``, ``class``, ``gt_area``, ``pred_area`` and :attr:`metric_keys`
            (``pred_area == 0 < gt_area`` marks an image dropped from ``hd95_<definition>``).
        """
        p, g, class_names = self._prepare(pred, gt)
        pixels = torch.full((p.shape[0],), int(np.prod(p.shape[2:])))
        if mask is not None:
            m = _to_tensor(mask, "mask").to(p.device) != 0
            if m.ndim != p.ndim or m.shape[0] != p.shape[0] or m.shape[1] != 1 or m.shape[2:] != p.shape[2:]:
                raise ValueError(
                    f"mask must be (B, 1, *spatial) like pred {tuple(p.shape[:1])} + (1,) + {tuple(p.shape[2:])}, "
                    f"got {tuple(m.shape)}."
                )
            p, g = p * m, g * m
            pixels = m.flatten(1).sum(1).cpu()
        spacing = self.spacing if spacing is None else spacing
        if spacing is not None:
            self._units = "spacing units"
        batch, n_cls = p.shape[:2]
        names = self._names(name, batch, self._count)
        values = compute_segmentation_metrics(p, g, self.hd95, self.empty, spacing)
        rows = []
        for b, c in np.ndindex(batch, n_cls):
            row: dict[str, Any] = {"name": names[b], "class": class_names[c]}
            row.update({k: int(values[k][b, c]) for k in ("gt_area", "pred_area")})
            row["pixels"] = int(pixels[b])
            row["size"], row["fov"] = "x".join(str(int(d)) for d in p.shape[2:]), mask is not None
            row.update({k: float(values[k][b, c]) for k in self.metric_keys})
            rows.append(row)
        self._rows.extend(rows)
        self._count += batch
        return rows

    # ----------------------------------------------------------------- outputs
    def per_image(self) -> list[dict[str, Any]]:
        """All recorded rows (one per image and scored class), in insertion order."""
        return [dict(r) for r in self._rows]

    def __len__(self) -> int:
        return self._count

    def _aggregate(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        excluded: dict[str, int] = {}
        for key in self.metric_keys:
            name = SEGMENTATION_SUMMARY_NAMES.get(key, key)
            out[name], excluded[name] = nanmean([r[key] for r in rows])
        out["excluded"] = excluded
        out["hd95_dropped"] = sum(1 for r in rows if r["pred_area"] == 0 < r["gt_area"])
        return out

    def summary(self, original_size: bool | None = None) -> dict[str, Any]:
        """Averages over the recorded images.

        Args:
            original_size: how the images were sized for scoring, for ``scoring`` (see
                :func:`scoring_description`). Defaults to None (not known).

        Returns:
            A dict with ``mIoU``, ``mDSC``, ``recall``, ``precision`` (fractions in [0, 1]), ``hd95_<definition>``
            (pixels, or spacing units) with the images of an empty mask left out,
            ``hd95_<definition>_empty_as_diagonal`` with the missed structures (prediction empty, ground truth not)
            scored as the image diagonal, ``hd95_dropped`` (the number of such missed structures, left out of
            ``hd95_<definition>``), ``excluded`` (per metric, the number of NaN rows left out of the mean: for HD95
            the images where either mask is empty, for the diagonal variant those with an empty ground truth),
            ``num_images``, ``empty``, ``hd95_definitions`` (the name and text of each definition), ``units`` and,
            for multi-class input, ``per_class`` (the same metrics for each class); the top-level values are then
            the means over classes and ``excluded`` and ``hd95_dropped`` are summed over classes; ``warnings``
            (:func:`degenerate_prediction_warnings`: most predictions empty, or covering >= 90 % of the image or its
            field of view); ``scoring`` (:func:`scoring_description`: the scored size, and the field of view).
        """
        classes = list(dict.fromkeys(r["class"] for r in self._rows))
        out: dict[str, Any]
        if len(classes) <= 1:
            out = self._aggregate(self._rows)
        else:
            per_class = {c: self._aggregate([r for r in self._rows if r["class"] == c]) for c in classes}
            out = {}
            for key in self.metric_keys:
                name = SEGMENTATION_SUMMARY_NAMES.get(key, key)
                out[name], _ = nanmean([per_class[c][name] for c in classes])
            out["excluded"] = {
                k: sum(per_class[c]["excluded"][k] for c in classes) for k in per_class[classes[0]]["excluded"]
            }
            out["hd95_dropped"] = sum(per_class[c]["hd95_dropped"] for c in classes)
            out["per_class"] = per_class
        out["num_images"] = self._count
        out["warnings"] = degenerate_prediction_warnings(self._rows)
        out["scoring"] = scoring_description(self._rows, original_size)
        out["empty"] = self.empty
        out["hd95_definitions"] = {d: HD95_DEFINITIONS[d] for d in self.hd95}
        out["units"] = self._units
        return out

    def to_csv(self, path: str | os.PathLike) -> str:
        """Write the per-image rows to ``path`` (CSV with a header, written atomically) and return the path."""
        return write_rows_csv(path, self._rows, ["name", "class", "gt_area", "pred_area", *self.metric_keys])

    def summary_markdown(self, summary: Mapping[str, Any] | None = None) -> str:
        """A Markdown table ``Metric | Value``: overlap metrics in %, HD95 in pixels, each HD95 row naming its
        definition; followed by the image count, the empty-mask convention, exclusions and, for multi-class input,
        a per-class table."""
        return segmentation_markdown(summary if summary is not None else self.summary(), self.hd95)

    def save(
        self,
        output_dir: str | os.PathLike,
        csv_name: str = "metrics.csv",
        summary_name: str = "summary.md",
        json_name: str | None = "summary.json",
        original_size: bool | None = None,
    ) -> dict[str, Any]:
        """Write ``metrics.csv``, ``summary.md`` (and ``summary.json`` unless ``json_name`` is None) atomically into
        ``output_dir``; returns the summary (``original_size``: see :meth:`summary`)."""
        s = self.summary(original_size)
        os.makedirs(output_dir, exist_ok=True)
        self.to_csv(os.path.join(output_dir, csv_name))
        write_text_atomic(os.path.join(output_dir, summary_name), self.summary_markdown(s))
        if json_name:
            write_text_atomic(os.path.join(output_dir, json_name), json.dumps(s, indent=2, allow_nan=True) + "\n")
        return s


def evaluate_segmentation(
    pairs: Iterable[Any], output_dir: str | os.PathLike | None = None, **suite_kwargs: Any
) -> SegmentationMetricSuite:
    """Score an iterable of predictions against ground truth with a :class:`SegmentationMetricSuite`.

    Args:
        pairs: items ``(pred, gt)``, ``(pred, gt, name)`` or dicts with keys ``pred``, ``label`` and optionally
            ``name``; ``pred``/``gt`` as accepted by :meth:`SegmentationMetricSuite.update` (binary masks).
        output_dir: when given, ``metrics.csv``, ``summary.md`` and ``summary.json`` are written there.
        suite_kwargs: arguments of :class:`SegmentationMetricSuite`.

    Returns:
        The filled suite (call ``summary()``).
    """
    suite = SegmentationMetricSuite(**suite_kwargs)
    for item in pairs:
        if isinstance(item, Mapping):
            suite.update(item["pred"], item["label"], item.get("name"))
        elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
            suite.update(*item)
        else:
            raise ValueError("each item of pairs must be (pred, gt), (pred, gt, name) or a dict with 'pred'/'label'.")
    if output_dir is not None:
        suite.save(output_dir)
    return suite
