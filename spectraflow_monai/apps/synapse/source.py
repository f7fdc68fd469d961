"""The data source of one run of the ``spectraflow_synapse_segmentation`` bundle: every datalist it reads.

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from spectraflow_monai.apps.synapse.bundle import synapse_split
from spectraflow_monai.apps.synapse.cache import slice_cache_dir, slice_with_settings
from spectraflow_monai.apps.synapse.constants import SYNAPSE_BUNDLE_DATASETS
from spectraflow_monai.apps.synapse.readers import check_synapse_h5, is_h5
from spectraflow_monai.apps.synapse.settings import SynapseDataOptions, all_class_names, check_datalist_base
from spectraflow_monai.data.label_map import check_class_names, check_label_map, identity_label_map
from spectraflow_monai.data.volumes import volume_name
from spectraflow_monai.utils.errors import DataError, DatasetError, SettingError

logger = logging.getLogger(__name__)

__all__ = ["SynapseDataSource", "VolumeSlices", "check_test_volumes"]


class SynapseDataSource:
    """The data source of a Synapse bundle run, built from the run's three settings objects and the only reader of
    them for its data: ``data`` (a :class:`~spectraflow_monai.utils.settings.DataSettings`: the source, selection,
    ``allow_empty_masks``, and the bundle's own :class:`~spectraflow_monai.apps.synapse.SynapseDataOptions` as its
    ``data_options``), ``model`` (a :class:`~spectraflow_monai.utils.settings.ModelSettings`: the slice size, the CT
    window, label map, classes and their names, the non-finite rule) and ``run`` (a
    :class:`~spectraflow_monai.utils.settings.RunSettings`: ``dataset_dir``, the slice ``cache_dir``, None for
    :func:`~spectraflow_monai.apps.synapse.slice_cache_dir` under ``bundle_root``, and ``progress_bar``). Its
    read-only attributes are those values under the bundle's names; every datalist of the run comes from
    :meth:`datalist` (``{_target_: spectraflow_monai.apps.workflow.datalist, source: '@data_source', split: train,
    cases: '@train_cases', exclude_cases: '@val_cases'}``).

    What the settings objects cannot check alone is checked here, when the source is built (the bundle's
    ``check_settings`` builds it first of all, before the phantom, the slice cache or the network): the data set
    name (without a datalist JSON), a datalist JSON that is no file, a ``dataset_dir`` that is a file, the number of classes, a label map or
    class names that do not fit it, a label map given for TransUNet's files (mapped already).

    Args:
        data: the run's data settings; its ``data_options`` are a :class:`SynapseDataOptions` or their recorded dict.
        model: the run's model settings (a CT model's: ``hu_window``, ``num_classes`` and ``nonfinite`` set).
        run: the run's run settings.

    Raises:
        SettingError: (a ``ValueError``) a setting that does not fit, naming it and its value.
        DatasetError: a datalist JSON that does not exist or is no file, a ``dataset_dir`` that is a file.
    """

    def __init__(self, data: Any, model: Any, run: Any) -> None:
        self.data, self.model, self.run = data, model, run
        options = data.data_options
        self.options: SynapseDataOptions = (
            options if isinstance(options, SynapseDataOptions)
            else SynapseDataOptions.from_dict(dict(options or {}), source="data_options")
        )  # fmt: skip
        self.progress = bool(run.progress_bar)
        self._check()

    def _check(self) -> None:
        dataset = self.data.dataset
        if not self.data_list_file_path and (
            not isinstance(dataset, str) or dataset.lower() not in SYNAPSE_BUNDLE_DATASETS
        ):  # a datalist JSON is the source then, the dataset not read
            raise SettingError(f"dataset must be one of {list(SYNAPSE_BUNDLE_DATASETS)}, got {dataset!r}.")
        for name in ("hu_window", "num_classes", "nonfinite"):
            if getattr(self.model, name) is None:
                raise SettingError(f"{name} must be set: the Synapse data are prepared by a CT model's settings.")
        n = self.model.num_classes
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise SettingError(f"num_classes must be an int >= 2 (9 for Synapse), got {n!r}.")
        if self.data_list_file_path:
            check_datalist_base(self.data_list_file_path, self.dataset_dir)
        elif self.dataset_dir is not None and os.path.isfile(self.dataset_dir):
            raise DatasetError(f"dataset_dir {self.dataset_dir!r} is a file, not a folder: give the data set's folder.")
        if self.model.label_map is not None:
            check_label_map(self.model.label_map, n)
            if self.dataset == "transunet" and not self.data_list_file_path:
                raise SettingError(
                    "label_map does not apply to dataset 'transunet' (its files hold the 9 classes already)."
                )
        if self.model.class_names is not None:
            check_class_names(self.model.class_names, n)

    # ---------------------------------------------------------------- the settings, under the bundle's names
    @property
    def dataset(self) -> str:
        """``synthetic``, ``btcv`` or ``transunet`` (not read when :attr:`data_list_file_path` is set)."""
        return str(self.data.dataset).lower()

    @property
    def data_list_file_path(self) -> str | None:
        """A Decathlon datalist JSON of one's own volumes, or None."""
        return self.data.data_list_file_path

    @property
    def dataset_dir(self) -> str | None:
        """The data folder (with a datalist JSON: the base of its relative paths; None: the JSON's folder)."""
        return self.run.dataset_dir

    @property
    def cache_dir(self) -> str:
        """The slice cache: the run settings' ``cache_dir``, else ``<bundle_root>/cache/<source>_<image_size>``."""
        if self.run.cache_dir is not None:
            return self.run.cache_dir
        return slice_cache_dir(self.run.bundle_root, self.dataset, self.image_size, self.data_list_file_path)

    @property
    def image_size(self) -> int:
        """Side of the cached slices (the network's input)."""
        return self.model.image_size

    @property
    def spatial_size(self) -> list[int]:
        """``(H, W)`` of the cached slices."""
        return [self.image_size, self.image_size]

    @property
    def hu_window(self) -> tuple[float, float]:
        """The CT window ``(a_min, a_max)`` in HU."""
        return tuple(self.model.hu_window)

    @property
    def label_map(self) -> dict[int, int] | None:
        """``{source label value: class}`` (None: the BTCV map of the presets, the identity for a JSON)."""
        return self.model.label_map

    @property
    def num_classes(self) -> int:
        """Classes of the network, background included."""
        return self.model.num_classes

    @property
    def class_names(self) -> tuple[str, ...]:
        """Every class name, background first (3D Slicer segments are matched with them by name)."""
        return tuple(all_class_names(self.model.class_names, self.num_classes, self.data_list_file_path))

    @property
    def nonfinite(self) -> str:
        """``error`` or ``replace``: NaN / infinite voxels."""
        return self.model.nonfinite

    @property
    def nonfinite_value(self) -> float | None:
        """The replacement of ``nonfinite: replace`` (None: black after windowing)."""
        return self.model.nonfinite_value

    @property
    def unmapped_labels(self) -> str:
        """``error`` or ``background``: label values the label map does not list."""
        return self.options.unmapped_labels

    @property
    def synthetic_size(self) -> dict[str, Any] | None:
        """The phantom's arguments when this run generates it (``dataset: synthetic`` without a JSON), else None."""
        generates = self.dataset == "synthetic" and not self.data_list_file_path
        return self.options.synthetic_size if generates else None

    @property
    def val_fraction(self) -> float:
        """Share of a JSON's training cases held out when it has no validation list."""
        return self.data.val_fraction

    @property
    def data_fraction(self) -> float:
        """Kept share of the training cases (low-data runs; the other splits whole)."""
        return self.data.data_fraction

    @property
    def data_seed(self) -> int:
        """Seed of the hold-out and of ``data_fraction``."""
        return self.data.data_seed

    @property
    def allow_empty_masks(self) -> bool:
        """Train on masks that are all background, with a warning."""
        return self.data.allow_empty_masks

    def __repr__(self) -> str:  # what the run record names the source by (the settings are recorded whole beside)
        where = f"data_list_file_path={self.data_list_file_path!r}" if self.data_list_file_path else (
            f"dataset={self.dataset!r}"
        )
        return f"{type(self).__name__}({where}, dataset_dir={self.dataset_dir!r}, cache_dir={self.cache_dir!r})"

    def quiet(self) -> SynapseDataSource:
        """The same source without the slice-extraction progress bar (the other ranks of a distributed run)."""
        out = copy.copy(self)
        out.progress = False
        return out

    def datalist(
        self,
        split: str,
        cases: Sequence[int | str] | None = None,
        exclude_cases: Sequence[int | str] | None = None,
        slices: bool = True,
    ) -> list[dict[str, Any]]:
        """The entries of ``split``: cached axial slices (``slices=True``) or whole volumes (evaluation)."""
        return synapse_split(self, split, cases=cases, exclude_cases=exclude_cases, slices=slices)


class VolumeSlices:
    """Whole CT volumes given as training or validation entries (MONAI Label's bundle trainer replaces
    ``train#dataset#data`` / ``validate#dataset#data`` with its datastore's image-label pairs) as cached axial
    slices, extracted once as the run's own cases are (windowed with ``hu_window``, resized to ``image_size``);
    entries that are slices already pass unchanged. The labels of such volumes are taken as the run's classes
    ``0..num_classes-1`` (a MONAI Label datastore holds them so), not mapped: a value outside stops the run naming the
    file. Labels may be NIfTI or NRRD files; a 3D Slicer segmentation (``.seg.nrrd``) is mapped to the run's
    ``class_names`` by segment name (a liver segment is the liver class whatever its number in the file).

    Args:
        source: the run's :class:`~spectraflow_monai.apps.synapse.SynapseDataSource`.
    """

    def __init__(self, source: Any) -> None:
        if not isinstance(source, SynapseDataSource):
            raise ValueError(f"source must be a SynapseDataSource, got {type(source).__name__}.")
        self.source = source

    def __call__(self, data: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        entries = [dict(e) for e in data]
        volumes = [e for e in entries if "slice" not in e]
        if not volumes:
            return entries
        s = self.source
        for e in volumes:  # the file name without its extension (series UIDs, as MONAI Label names images, hold dots)
            e.setdefault("case", volume_name(e["image"]))
        # the classes themselves (another value: an error naming the file)
        sliced = slice_with_settings(volumes, s, identity_label_map(s.num_classes), "error", f"{s.cache_dir}_volumes")
        return [e for e in entries if "slice" in e] + sliced


def check_test_volumes(
    source: SynapseDataSource, cases: Sequence[int | str] | None = None, split: str = "test"
) -> list[str]:
    """Check the volumes of ``split`` of ``source`` from their headers (no voxel read; NIfTI: 3D, label shape and
    affine as the image's; TransUNet's h5: the ``image`` / ``label`` datasets and their shapes) and log a warning
    naming each problem, so that a broken test volume is named before training (the Synapse ``train.yaml`` runs
    it), not only after it, at evaluation.

    Training does not read these volumes, so a problem is a warning here, never an error; evaluation stops on it,
    naming the file as here. Non-finite voxels are found only when a volume is read whole (at evaluation).

    Args:
        source: the run's data source.
        cases: the case ids of the split (the bundle's ``test_cases``); None: the split's own. Defaults to None.
        split: the split to check. Defaults to ``"test"`` (``configs/evaluate.yaml``'s volumes).

    Returns:
        The problems found (their messages), empty when none.
    """
    problems: list[str] = []
    try:
        entries = source.datalist(split, cases=cases, slices=False)
    except (ValueError, FileNotFoundError) as e:  # DataError / SettingError: named, training goes on
        problems.append(str(e))
        entries = []
    for entry in entries:
        if is_h5(entry["image"]):
            try:
                check_synapse_h5(entry["image"])
            except DataError as e:
                problems.append(str(e))
    for problem in problems:
        logger.warning("the %s volumes (configs/evaluate.yaml) will not evaluate: %s", split, problem)
    return problems
