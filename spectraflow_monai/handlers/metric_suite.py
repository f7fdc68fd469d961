"""An ignite handler that feeds :class:`~spectraflow_monai.metrics.SegmentationMetricSuite` during evaluation.

The metric (per-image values, the suite, its reports) lives in :mod:`spectraflow_monai.metrics`; this module only
attaches it to an ignite engine, as MONAI keeps ``monai.metrics`` and ``monai.handlers`` apart.

It complements MONAI's metric handlers (``MeanDice``, ``MeanIoUHandler``, ``ConfusionMatrix``, ``HausdorffDistance``,
which give the curves): at the end of each evaluation epoch it writes the per-image ``metrics.csv``, the Markdown
``summary.md`` table of the SpectraFlow protocol (Chen et al.) and ``summary.json``, and logs the table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from monai.handlers.utils import from_engine
from monai.utils import IgniteInfo, min_version, optional_import

from spectraflow_monai.data.readers import read_2d
from spectraflow_monai.metrics.segmentation import SegmentationMetricSuite

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["EvaluationReportHandler", "MetricSuiteHandler", "name_from_path", "read_fov"]

_EXTENSIONS = (".nii.gz", ".nii", ".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".npy", ".npz", ".h5", ".nrrd")


def name_from_path(path: Any) -> str:
    """The file name of ``path`` without its folder and known image extension (``a/b/case1.nii.gz`` -> ``case1``)."""
    s = str(path)
    base = os.path.basename(s.rstrip("/\\")) or s
    low = base.lower()
    for ext in _EXTENSIONS:
        if low.endswith(ext) and len(base) > len(ext):
            return base[: -len(ext)]
    return base


def read_fov(path: str | os.PathLike) -> torch.Tensor:
    """A field-of-view / ignore mask file as a (1, 1, W, H) 0/1 tensor (non-zero = scored; spatial axes as the 2D
    bundle's reader gives them, :class:`~spectraflow_monai.data.Image2DReader`)."""
    arr = read_2d(path, "label")
    if arr.ndim == 3:
        arr = arr.max(axis=-1)
    return torch.as_tensor(np.ascontiguousarray(arr.T) != 0, dtype=torch.float32)[None, None]


def _resize_nearest(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """(B, C, *spatial) -> (B, C, *size), nearest neighbour (masks and label maps keep their values)."""
    x = x.as_tensor() if hasattr(x, "as_tensor") else x
    if tuple(x.shape[2:]) == tuple(size):
        return x
    return torch.nn.functional.interpolate(x.float(), size=tuple(int(s) for s in size), mode="nearest")


def _item_name(item: Any, name_key: str, meta_keys: Sequence[str]) -> Any:
    """Find an image name in one decollated batch item (a dict), or None."""
    if not isinstance(item, Mapping):
        return None
    if name_key in item:
        return item[name_key]
    for key in meta_keys:
        value = item.get(key)
        meta = getattr(value, "meta", None)
        if isinstance(meta, Mapping) and name_key in meta:
            return meta[name_key]
        meta = item.get(f"{key}_meta_dict")
        if isinstance(meta, Mapping) and name_key in meta:
            return meta[name_key]
    return None


class EvaluationReportHandler:
    """Base of the handlers that score every iteration of an evaluation and write reports at the epoch end.

    Subclasses implement ``epoch_started`` (start empty), ``iteration_completed`` (score
    ``output_transform(engine.state.output)``) and ``epoch_completed`` (write the reports into ``output_dir``).

    Args:
        output_dir: folder for the reports (created when missing).
        output_transform: maps ``engine.state.output`` to ``(pred, label)``.
        batch_transform: maps ``engine.state.batch`` to what names are read from.
        name_key: key of the image / case name.
        json_name: JSON summary file name, ``None`` to skip.
        metric_prefix: prefix of the values put into ``engine.state.metrics``, ``None`` to put none.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        output_transform: Callable,
        batch_transform: Callable,
        name_key: str,
        json_name: str | None,
        metric_prefix: str | None,
    ) -> None:
        if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
            raise ValueError(f"output_dir must be a non-empty path, got {output_dir!r}.")
        self.output_dir = os.fspath(output_dir)
        self.output_transform = output_transform
        self.batch_transform = batch_transform
        self.name_key = name_key
        self.json_name = json_name
        self.metric_prefix = metric_prefix
        self.last_summary: dict[str, Any] | None = None

    def attach(self, engine: Engine) -> None:
        """Register the handler's events on ``engine``."""
        engine.add_event_handler(Events.EPOCH_STARTED, self.epoch_started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.iteration_completed)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.epoch_completed)

    def publish(self, engine: Engine, summary: dict[str, Any], title: str, markdown: str, values: Mapping) -> None:
        """Keep ``summary`` in :attr:`last_summary`, log ``title`` and the ``markdown`` table, and put ``values``
        into ``engine.state.metrics`` under ``metric_prefix`` (unless it is ``None``)."""
        self.last_summary = summary
        engine.logger.info("%s, reports in %s:\n%s", title, self.output_dir, markdown)
        if self.metric_prefix is not None:
            for key, value in values.items():
                engine.state.metrics[f"{self.metric_prefix}{key}"] = value

    def epoch_started(self, engine: Engine) -> None:
        raise NotImplementedError

    def iteration_completed(self, engine: Engine) -> None:
        raise NotImplementedError

    def epoch_completed(self, engine: Engine) -> None:
        raise NotImplementedError


class MetricSuiteHandler(EvaluationReportHandler):
    """Collect per-image SpectraFlow metrics during an ignite evaluation and write the reports at epoch end.

    Events: ``EPOCH_STARTED`` resets the suite, ``ITERATION_COMPLETED`` scores ``output_transform(engine.state.output)``
    (binary masks after post-transforms, e.g. ``Activationsd`` + ``AsDiscreted(threshold=0.5)``), and
    ``EPOCH_COMPLETED`` writes ``metrics.csv``, ``summary.md`` and ``summary.json`` into ``output_dir`` (atomically),
    logs the Markdown table with ``engine.logger`` and stores the summary in :attr:`last_summary`.

    Image names come from ``batch_transform(engine.state.batch)`` (as in :class:`monai.handlers.MetricsSaver`): for a
    decollated list of dicts (or a collated dict) the handler looks for ``name_key`` in the item itself, then in the
    ``.meta`` of the MetaTensors under ``meta_keys`` (and the legacy ``<key>_meta_dict``); paths are shortened to the
    file name without extension. Items without a name are numbered.

    The handler runs in one process; in a multi-process evaluation each rank would only see its own images.

    Args:
        output_dir: folder for the reports (created when missing).
        suite: the metric suite to fill; defaults to ``SegmentationMetricSuite()``.
        output_transform: maps ``engine.state.output`` to ``(pred, label)``, each a batch tensor or a list of
            per-image (C, *spatial) tensors. Defaults to ``from_engine(["pred", "label"])``.
        batch_transform: maps ``engine.state.batch`` to what names are read from. Defaults to identity.
        name_key: key of the image name. Defaults to ``"filename_or_obj"``.
        meta_keys: keys whose MetaTensor metadata may hold ``name_key``. Defaults to ``("image", "label", "pred")``.
        csv_name: per-image CSV file name. Defaults to ``"metrics.csv"``.
        summary_name: Markdown summary file name. Defaults to ``"summary.md"``.
        json_name: JSON summary file name, ``None`` to skip. Defaults to ``"summary.json"``.
        fov_key: key of a field-of-view / ignore mask file in the batch items (a datalist entry's ``"fov"``): where
            present, only its non-zero pixels are scored (resized nearest to the scored size). ``None`` ignores
            such files. Defaults to ``"fov"``.
        original_size: score each image at its original size instead of the network's (e.g. 224x224): the ground
            truth is read again from its file with ``label_loader`` and the prediction resized to it (nearest), so
            thin structures are not scored on a squashed resize. Defaults to False.
        label_loader: a dictionary transform ``{"label": path, "label_threshold": t} -> {"label": (1, *spatial)}``
            reading a ground truth as the bundle does, without resizing
            (:meth:`spectraflow_monai.apps.seg2d.LabelSetup.label_loader`). Needed by ``original_size``.
        metric_prefix: when not ``None``, the scalar summary values are also put in ``engine.state.metrics`` under
            ``f"{metric_prefix}{key}"`` (e.g. ``suite_mDSC``, ``suite_hd95_monai_empty_as_diagonal``, and the count
            ``suite_hd95_dropped``). Defaults to ``None``.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        suite: SegmentationMetricSuite | None = None,
        output_transform: Callable = from_engine(["pred", "label"]),
        batch_transform: Callable = lambda x: x,
        name_key: str = "filename_or_obj",
        meta_keys: Sequence[str] = ("image", "label", "pred"),
        csv_name: str = "metrics.csv",
        summary_name: str = "summary.md",
        json_name: str | None = "summary.json",
        metric_prefix: str | None = None,
        fov_key: str | None = "fov",
        original_size: bool = False,
        label_loader: Callable | None = None,
    ) -> None:
        super().__init__(output_dir, output_transform, batch_transform, name_key, json_name, metric_prefix)
        if suite is not None and not isinstance(suite, SegmentationMetricSuite):
            raise ValueError(f"suite must be a SegmentationMetricSuite, got {type(suite).__name__}.")
        if not isinstance(original_size, bool):
            raise ValueError(f"original_size must be True or False, got {original_size!r}.")
        if original_size and label_loader is None:
            raise ValueError("original_size True needs label_loader (it reads each ground truth at its own size).")
        self.suite = suite if suite is not None else SegmentationMetricSuite()
        self.meta_keys = tuple(meta_keys)
        self.csv_name, self.summary_name = csv_name, summary_name
        self.fov_key, self.original_size, self.label_loader = fov_key, original_size, label_loader

    def epoch_started(self, engine: Engine) -> None:
        """Reset the suite."""
        self.suite.reset()

    @staticmethod
    def _stack(x: Any, what: str) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(i, torch.Tensor) for i in x):
            return torch.stack([i.as_tensor() if hasattr(i, "as_tensor") else i for i in x], dim=0)
        raise ValueError(
            f"output_transform must give ({what} batch tensor or list of per-image tensors), got {type(x).__name__}."
        )

    def _names(self, engine: Engine, batch_size: int) -> list[str]:
        data = self.batch_transform(engine.state.batch)
        found: list[Any] = []
        if isinstance(data, Mapping):
            value = _item_name(data, self.name_key, self.meta_keys)
            if isinstance(value, (list, tuple)):
                found = list(value)
            elif value is not None and batch_size == 1:
                found = [value]
        elif isinstance(data, (list, tuple)):
            found = [_item_name(item, self.name_key, self.meta_keys) for item in data]
        if len(found) != batch_size:
            found = [None] * batch_size
        offset = len(self.suite)
        return [name_from_path(n) if n is not None else f"image_{offset + i:05d}" for i, n in enumerate(found)]

    def iteration_completed(self, engine: Engine) -> None:
        """Score the iteration's predictions."""
        out = self.output_transform(engine.state.output)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("output_transform must return (pred, label).")
        pred, label = self._stack(out[0], "pred"), self._stack(out[1], "label")
        names = self._names(engine, pred.shape[0])
        data = self.batch_transform(engine.state.batch)
        items = list(data) if isinstance(data, (list, tuple)) else []
        if len(items) != pred.shape[0] or not all(isinstance(i, Mapping) for i in items):
            items = [{} for _ in range(pred.shape[0])]
        fovs = [i.get(self.fov_key) if self.fov_key else None for i in items]
        if not self.original_size and all(f is None for f in fovs):
            self.suite.update(pred, label, name=names)
            return
        for b, item in enumerate(items):  # one image at a time: sizes may differ
            p, g = pred[b : b + 1], label[b : b + 1]
            if self.original_size:
                g = self._original_label(item)
                p = _resize_nearest(p, g.shape[2:])
            mask = None if fovs[b] is None else _resize_nearest(read_fov(fovs[b]), g.shape[2:])
            self.suite.update(p, g, name=names[b], mask=mask)

    def _original_label(self, item: Mapping) -> torch.Tensor:
        """The ground truth of ``item`` read again from its file, at its own size, with ``label_loader``."""
        path = _item_name(item, "filename_or_obj", ("label",))
        if path is None:
            raise ValueError("original_size: the batch has no label file name (label.meta['filename_or_obj']).")
        entry: dict[str, Any] = {"label": os.fspath(path)}
        threshold = item.get("label_threshold")
        if threshold is not None:
            entry["label_threshold"] = int(threshold)
        label = self.label_loader(entry)["label"]  # type: ignore[misc]
        label = label.as_tensor() if hasattr(label, "as_tensor") else torch.as_tensor(label)
        return label[None].float()

    def epoch_completed(self, engine: Engine) -> None:
        """Write the reports, log the table and optionally publish the summary in ``engine.state.metrics``."""
        summary = self.suite.save(
            self.output_dir, self.csv_name, self.summary_name, self.json_name, original_size=self.original_size
        )
        values = {k: v for k, v in summary.items() if isinstance(v, float) or k == "hd95_dropped"}
        title = f"SpectraFlow metric suite ({len(self.suite)} images)"
        self.publish(engine, summary, title, self.suite.summary_markdown(summary), values)
