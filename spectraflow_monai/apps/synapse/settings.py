"""Settings of the Synapse bundle's data source: the label map, the class names, and their checks before any work;
the settings the bundle derives from them (``layout``, the default ``val_cases``, the non-finite replacements, the
spacing of the volume metrics).

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from spectraflow_monai.apps.synapse.constants import SYNAPSE_BUNDLE_DATASETS, SYNAPSE_ORGANS
from spectraflow_monai.apps.synapse.readers import class_values
from spectraflow_monai.data.label_map import (
    LABEL_MAP_UNMAPPED,
    check_class_names,
    check_label_map,
    identity_label_map,
    inverse_label_map,
)
from spectraflow_monai.data.subsets import check_val_fraction
from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import SettingsObject

__all__ = [
    "LAYOUTS",
    "OUTPUT_FORMATS",
    "all_class_names",
    "SynapseDataOptions",
    "SynapseDataSettings",
    "check_datalist_base",
    "check_own_data_settings",
    "default_val_cases",
    "label_values",
    "prediction_values",
    "resolve_label_map",
    "slice_nonfinite_value",
    "synapse_class_names",
    "synapse_layout",
    "volume_nonfinite_value",
    "volume_spacing",
]

#: the on-disk layouts of the Synapse data (:func:`synapse_layout`): the BTCV NIfTI release (and one's own NIfTI
#: volumes) and TransUNet's preprocessed files
LAYOUTS: tuple[str, ...] = ("raw", "transunet")
#: what ``configs/inference.yaml`` writes (``output_format``): the label NIfTI, or with it a DICOM SEG of each DICOM
#: series input
OUTPUT_FORMATS: tuple[str, ...] = ("nifti", "dicom_seg")
@dataclasses.dataclass(frozen=True)
class SynapseDataSettings:
    """The data settings of one Synapse run, under the bundle's own names, handed whole to the pipeline that lists,
    maps and slices its volumes (:class:`~spectraflow_monai.apps.synapse.SynapseDataSource`,
    :func:`~spectraflow_monai.apps.synapse.build_synapse_datalist`,
    :func:`~spectraflow_monai.apps.synapse.decathlon_synapse_datalist`). The bundle checks the values first
    (:func:`~spectraflow_monai.apps.synapse.check_synapse_settings`).

    Args:
        dataset: ``"synthetic"`` (the phantom, generated into ``dataset_dir`` on first use with ``synthetic_size``),
            ``"btcv"`` or ``"transunet"``; not used when ``data_list_file_path`` is given.
        dataset_dir: the data folder (with a datalist JSON: the base of its relative paths; None: the JSON's folder).
        cache_dir: the slice cache (needed where volumes are sliced). Defaults to None.
        image_size: side of the cached slices; None keeps the native size. Defaults to None.
        hu_window: the CT window ``(low, high)`` in HU mapped to [0, 1]. Defaults to ``(-125, 275)`` (TransUNet).
        data_list_file_path: a Decathlon datalist JSON of one's own volumes. Defaults to None.
        label_map: source label -> class (None: the BTCV map of the presets, the identity for a JSON).
        num_classes: classes of the network, background included. Defaults to 9.
        unmapped_labels: ``"error"`` or ``"background"`` for source labels the map does not name.
        val_fraction: share of a JSON's training cases held out when it has no validation list. Defaults to 0.2.
        data_fraction: kept share of the training cases (low-data runs; other splits whole). Defaults to 1.0.
        data_seed: seed of the hold-out and of ``data_fraction``. Defaults to 0.
        synthetic_size: ``generate_synthetic_ct`` arguments of the phantom (``dataset="synthetic"`` only; None:
            never generated). Defaults to None.
        nonfinite: ``"error"`` or ``"replace"`` for NaN / inf voxels; ``nonfinite_value`` replaces them.
        progress: show the slice-extraction progress bar. Defaults to True.
        class_names: the classes, background first, that the segments of a 3D Slicer segmentation label
            (``.seg.nrrd``) are matched with by name; None: :func:`synapse_class_names` of ``num_classes``.
    """

    dataset: str = "synthetic"
    dataset_dir: Any = None
    cache_dir: Any = None
    image_size: Any = None
    hu_window: Any = (-125.0, 275.0)
    data_list_file_path: Any = None
    label_map: Any = None
    num_classes: int = 9
    unmapped_labels: str = "error"
    val_fraction: float = 0.2
    data_fraction: float = 1.0
    data_seed: int = 0
    synthetic_size: Any = None
    nonfinite: str = "error"
    nonfinite_value: Any = None
    progress: bool = True
    class_names: Any = None

    def __post_init__(self) -> None:
        if self.num_classes is None:
            object.__setattr__(self, "num_classes", 9)
        names = all_class_names(self.class_names, self.num_classes, self.data_list_file_path)
        object.__setattr__(self, "class_names", tuple(names))
        object.__setattr__(self, "hu_window", tuple(float(v) for v in self.hu_window))
        if self.synthetic_size is not None:
            object.__setattr__(self, "synthetic_size", dict(self.synthetic_size))

    @property
    def spatial_size(self) -> list[int] | None:
        """``(H, W)`` of the cached slices (``image_size`` square), or None for the native size."""
        return None if self.image_size is None else [int(self.image_size), int(self.image_size)]

    def replace(self, **changes: Any) -> SynapseDataSettings:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class SynapseDataOptions(SettingsObject):
    """The Synapse bundle's own data settings, the ``data_options`` of its run's
    :class:`~spectraflow_monai.utils.settings.DataSettings` (recorded whole; a restart with other values stops):
    which cases train and validate, how the labels map to classes, the CT window and the non-finite rule. The bundle
    builds it from its top-level values by field name (``data_options: {_target_: ...SynapseDataOptions.from_bundle}``);
    the values are checked before (:func:`~spectraflow_monai.apps.synapse.check_synapse_settings`).

    Args:
        label_map: ``{source label value: class}`` (None: the BTCV map of the presets, the identity for a JSON).
        unmapped_labels: ``"error"`` | ``"background"`` for label values the map does not list.
        train_cases, val_cases: the training cases and those held out of them for validation (None: the preset's).
        val_split: where validation cases come from: ``"val"`` (held-out training cases) | ``"test"``.
        hu_window: the CT window ``[a_min, a_max]`` in HU.
        nonfinite, nonfinite_value: the rule for NaN / infinite voxels and its replacement.
        synthetic_size: the phantom's ``generate_synthetic_ct`` arguments (``dataset: synthetic`` only).
    """

    label_map: Any = None
    unmapped_labels: str = "error"
    train_cases: Any = None
    val_cases: Any = None
    val_split: str = "val"
    hu_window: Any = (-125.0, 275.0)
    nonfinite: str = "error"
    nonfinite_value: Any = None
    synthetic_size: Any = None


#: the bundle's default validation cases (:func:`default_val_cases`): TransUNet training cases held out of training
_VAL_CASES: dict[str, list[int]] = {"synthetic": [40], "btcv": [39, 40], "transunet": [39, 40]}


def check_datalist_base(data_list_file_path: Any, dataset_dir: Any) -> tuple[Path, Path]:
    if not isinstance(data_list_file_path, (str, os.PathLike)) or not os.fspath(data_list_file_path):
        raise SettingError(
            f"data_list_file_path must be the path of a datalist JSON file, got {data_list_file_path!r}."
        )
    path = Path(data_list_file_path)
    if not path.exists():
        raise DatasetError(f"datalist {str(path)!r} does not exist.")
    if not path.is_file():
        raise DatasetError(f"datalist {str(path)!r} is not a file (a folder?); give the path of the JSON file.")
    if dataset_dir is None or (isinstance(dataset_dir, str) and not dataset_dir):
        return path, path.parent
    if not isinstance(dataset_dir, (str, os.PathLike)):
        raise SettingError(f"dataset_dir must be a folder path or null, got {dataset_dir!r}.")
    base = Path(dataset_dir)
    if not base.exists():
        raise DatasetError(f"dataset_dir {str(base)!r} (the base of the paths in {str(path)!r}) does not exist.")
    if not base.is_dir():
        raise DatasetError(
            f"dataset_dir {str(base)!r} is a file, not a folder: it must be the folder the relative paths of "
            f"{str(path)!r} start from."
        )
    return path, base


def resolve_label_map(label_map: Any, data_list_file_path: Any, num_classes: Any) -> dict[int, int] | None:
    """The label map a run uses: ``label_map`` checked against ``num_classes``; when it is None, the identity over
    ``0..num_classes-1`` for a Decathlon datalist and None (the BTCV -> 8 organ map of the presets) otherwise."""
    if label_map is None:
        return identity_label_map(num_classes) if data_list_file_path else None
    return check_label_map(label_map, num_classes)


def prediction_values(label_map: Any, data_list_file_path: Any, num_classes: Any) -> list | None:
    """The source label value of every class for saved predictions (the inverse of the run's label map,
    :func:`spectraflow_monai.data.inverse_label_map`): own volumes labelled 0, 1, 5 come back as 0, 1, 5. None (class
    indices, the Synapse convention of TransUNet) for the BTCV -> 8 organ map of the presets, whose 13 source labels
    have no one value per organ class to return."""
    return inverse_label_map(resolve_label_map(label_map, data_list_file_path, num_classes), num_classes)


def synapse_class_names(num_classes: int, data_list_file_path: Any = None, recorded: Any = None) -> list[str]:
    """Default ``class_names`` of the Synapse bundle: ``recorded`` when given (the names a model was trained with,
    from its ``model.json``), else the 9 Synapse classes (background + 8 organs,
    :data:`spectraflow_monai.apps.synapse.SYNAPSE_ORGANS`) when ``num_classes`` is 9 and the data are not a datalist JSON,
    else ``background, class_1, ..., class_<num_classes-1>``."""
    if recorded is not None:
        return list(recorded)
    if not data_list_file_path and num_classes == len(SYNAPSE_ORGANS):
        return list(SYNAPSE_ORGANS)
    return ["background", *(f"class_{i}" for i in range(1, int(num_classes)))]


def all_class_names(class_names: Any, num_classes: Any, data_list_file_path: Any = None) -> list[str]:
    """Every class name, background first: ``class_names`` as given (``num_classes`` names), with ``background`` put
    first when it names the foreground classes only (``num_classes - 1`` names), or :func:`synapse_class_names` when
    None. The names that 3D Slicer segments and DICOM SEG segments are matched with, by position = class index."""
    if class_names is None:
        return synapse_class_names(num_classes, data_list_file_path)
    names = [str(n) for n in class_names]
    if num_classes is not None and len(names) == int(num_classes) - 1:
        names = ["background", *names]
    return names


def label_values(label_map: Any, data_list_file_path: Any, num_classes: Any) -> list[int] | None:
    """The value each class of a 3D Slicer segmentation label is read as, before the run's label map turns it into
    the class (the inverse of the run's map: the BTCV map of the presets, the identity or ``label_map`` of a datalist
    JSON); None: class indices."""
    mapping = resolve_label_map(label_map, data_list_file_path, num_classes)
    return class_values(mapping, mapping is None, int(num_classes))


def check_own_data_settings(
    data_list_file_path: Any = None,
    dataset_dir: Any = None,
    label_map: Any = None,
    num_classes: Any = None,
    class_names: Any = None,
    unmapped_labels: Any = None,
    val_fraction: Any = None,
    data_fraction: Any = None,
) -> dict[str, Any]:
    """Check the data-source settings of the Synapse bundle (called by
    :func:`spectraflow_monai.apps.synapse.check_synapse_settings`); settings left at None are not checked.

    Raises:
        SettingError / DatasetError: (``ValueError`` s) naming the setting (or the file) and the problem: a JSON
            path that is no file, a ``dataset_dir`` that is a file, a label map with a class outside
            ``num_classes``, class names of the wrong count, a fraction out of range.
    """
    out: dict[str, Any] = {}
    if data_list_file_path:
        check_datalist_base(data_list_file_path, dataset_dir)
        out["data_list_file_path"] = os.fspath(data_list_file_path)
    n = 9 if num_classes is None else num_classes
    if label_map is not None:
        out["label_map"] = check_label_map(label_map, n)
    if class_names is not None:
        out["class_names"] = check_class_names(class_names, n)
    if unmapped_labels is not None and unmapped_labels not in LABEL_MAP_UNMAPPED:
        raise SettingError(f"unmapped_labels must be one of {list(LABEL_MAP_UNMAPPED)}, got {unmapped_labels!r}.")
    if val_fraction is not None:
        check_val_fraction(val_fraction)
    if data_fraction is not None:
        ok = isinstance(data_fraction, (int, float)) and not isinstance(data_fraction, bool)
        if not ok or not 0 < data_fraction <= 1:
            raise SettingError(f"data_fraction must be a number in (0, 1], got {data_fraction!r}.")
    return out


# ---------------------------------------------------------------- settings the bundle derives from others


def _check_dataset(dataset: Any) -> str:
    if not isinstance(dataset, str) or dataset.lower() not in SYNAPSE_BUNDLE_DATASETS:
        raise SettingError(f"dataset must be one of {list(SYNAPSE_BUNDLE_DATASETS)}, got {dataset!r}.")
    return dataset.lower()


def _check_layout(layout: Any) -> str:
    if layout not in LAYOUTS:
        raise SettingError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}.")
    return layout


def synapse_layout(dataset: Any, data_list_file_path: Any = None) -> str:
    """The on-disk layout of a run's volumes (the bundle's ``layout``): ``"transunet"`` for TransUNet's preprocessed
    files (``dataset: transunet`` without a datalist JSON), else ``"raw"`` (NIfTI volumes in HU: the BTCV release,
    the phantom, one's own datalist).

    Args:
        dataset: ``"synthetic"``, ``"btcv"`` or ``"transunet"`` (any case); not read when ``data_list_file_path``
            is given (a datalist JSON lists NIfTI volumes).
        data_list_file_path: a Decathlon datalist JSON of one's own volumes, or None. Defaults to None.

    Raises:
        SettingError: ``dataset`` is not one of the bundle's data sets (no datalist JSON given), naming the value.
    """
    if data_list_file_path:
        return "raw"
    return "transunet" if _check_dataset(dataset) == "transunet" else "raw"


def default_val_cases(dataset: Any, data_list_file_path: Any = None) -> list[int] | None:
    """The bundle's default ``val_cases``: TransUNet training cases held out of both training stages for validation
    (checkpoint choice, learning-rate plateau, early stopping); the test cases are never among them.

    Args:
        dataset: ``"synthetic"`` (case 40, which the default phantom holds besides its training cases), ``"btcv"``
            or ``"transunet"`` (cases 39 and 40); not read when ``data_list_file_path`` is given.
        data_list_file_path: a Decathlon datalist JSON, or None. With a JSON the answer is None: its ``validation``
            list, or the ``val_fraction`` hold-out of its ``training`` list. Defaults to None.

    Returns:
        a new list of case ids, or None.

    Raises:
        SettingError: ``dataset`` is not one of the bundle's data sets (no datalist JSON given), naming the value.
    """
    if data_list_file_path:
        return None
    return list(_VAL_CASES[_check_dataset(dataset)])


def volume_nonfinite_value(nonfinite_value: Any, layout: Any, hu_window: Sequence[float] | None = None) -> float:
    """The replacement of NaN / infinite voxels of whole volumes (``nonfinite: replace``; the bundle's
    ``volume_nonfinite_value``): ``nonfinite_value`` when given, else black after windowing, i.e. the window's
    lower bound ``hu_window[0]`` for NIfTI volumes in HU (``layout: raw``) and 0 for TransUNet's volumes, windowed
    to [0, 1] already.

    Args:
        nonfinite_value: the bundle's ``nonfinite_value`` (in the units of the files), or None.
        layout: ``"raw"`` or ``"transunet"`` (:func:`synapse_layout`).
        hu_window: the CT window ``[a_min, a_max]``; needed for ``layout: raw`` without ``nonfinite_value``.
            Defaults to None.

    Raises:
        SettingError: ``layout`` is unknown, or ``hu_window`` is not a window when it is needed, naming the value.
    """
    _check_layout(layout)
    if nonfinite_value is not None:
        return nonfinite_value
    if layout != "raw":
        return 0.0
    if isinstance(hu_window, (str, bytes)) or not isinstance(hu_window, Sequence) or len(hu_window) != 2:
        raise SettingError(f"hu_window must be [a_min, a_max] to replace non-finite HU voxels, got {hu_window!r}.")
    return float(hu_window[0])


def slice_nonfinite_value(nonfinite_value: Any, layout: Any) -> float:
    """The replacement of NaN / infinite pixels of loaded training slices (the bundle's ``slice_nonfinite_value``):
    0 (black) for the slice cache of NIfTI volumes (``layout: raw``: windowed to [0, 1] and checked when the cache
    was built) and for TransUNet's ``train_npz`` slices without ``nonfinite_value``, else ``nonfinite_value`` (in
    [0, 1], the units of TransUNet's files).

    Raises:
        SettingError: ``layout`` is unknown, naming the value.
    """
    if _check_layout(layout) == "raw" or nonfinite_value is None:
        return 0.0
    return nonfinite_value


def volume_spacing(layout: Any) -> str | None:
    """The voxel spacing the volume metrics use (``VolumeMetricsHandler(spacing=...)``): ``"meta"`` (each volume's
    spacing from its affine, HD95 in mm) for NIfTI volumes (``layout: raw``), None (unit spacing, HD95 in voxels) for
    TransUNet's volumes, which carry no geometry.

    Raises:
        SettingError: ``layout`` is unknown, naming the value.
    """
    return "meta" if _check_layout(layout) == "raw" else None
