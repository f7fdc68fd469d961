"""Settings of the Synapse bundle's data: its own data settings (:class:`SynapseDataOptions`, checked where built
and recorded whole), the label map and class names a run uses, and the settings the bundle derives from others
(``layout``, the default ``val_cases``, the non-finite replacements, the spacing of the volume metrics).

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spectraflow_monai.apps.synapse.constants import SYNAPSE_BUNDLE_DATASETS, SYNAPSE_ORGANS
from spectraflow_monai.apps.synapse.phantom import phantom_parameters
from spectraflow_monai.apps.synapse.readers import class_values
from spectraflow_monai.data.label_map import (
    LABEL_MAP_UNMAPPED,
    check_label_map,
    identity_label_map,
    inverse_label_map,
)
from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import SettingsObject

__all__ = [
    "LAYOUTS",
    "OUTPUT_FORMATS",
    "VAL_SPLITS",
    "VolumeLabels",
    "all_class_names",
    "SynapseDataOptions",
    "check_datalist_base",
    "default_val_cases",
    "label_values",
    "prediction_values",
    "resolve_label_map",
    "slice_nonfinite_value",
    "synapse_class_names",
    "synapse_layout",
    "volume_nonfinite_value",
]

#: the on-disk layouts of the Synapse data (:func:`synapse_layout`): the BTCV NIfTI release (and one's own NIfTI
#: volumes) and TransUNet's preprocessed files
LAYOUTS: tuple[str, ...] = ("raw", "transunet")
#: what ``configs/inference.yaml`` writes (``output_format``): the label NIfTI, or with it a DICOM SEG of each DICOM
#: series input
OUTPUT_FORMATS: tuple[str, ...] = ("nifti", "dicom_seg")

#: where the Synapse bundle's validation cases come from (``val_split``): held-out training cases, or the test cases
#: (the paper's protocol, ``configs/paper_protocol.yaml``)
VAL_SPLITS: tuple[str, ...] = ("val", "test")


def _check_cases(name: str, cases: Any) -> list[int | str] | None:
    """``cases`` as a list of case ids (ints >= 0 or non-empty names; one id alone as a list of one), or None."""
    if cases is None:
        return None
    items = [cases] if isinstance(cases, (str, int, np.integer)) and not isinstance(cases, bool) else cases
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence) or not items:
        raise SettingError(f"{name} must be a non-empty list of case ids (e.g. [39, 40]) or null, got {cases!r}.")
    out: list[int | str] = []
    for case in items:
        if isinstance(case, (int, np.integer)) and not isinstance(case, bool) and case >= 0:
            out.append(int(case))
        elif isinstance(case, str) and case.strip():
            out.append(case)
        else:
            raise SettingError(f"{name} must list case ids (ints >= 0 or names), got {case!r} in {cases!r}.")
    if len({str(c) for c in out}) != len(out):
        raise SettingError(f"{name} lists a case twice: {cases!r}.")
    return out


def _check_synthetic_size(size: Any) -> dict[str, Any] | None:
    """``size`` (the phantom's ``generate_synthetic_ct`` arguments) as a dict of JSON data, its names and values
    checked as the phantom checks them."""
    if size is None:
        return None
    if not isinstance(size, Mapping):
        raise SettingError(f"synthetic_size must be a mapping of generate_synthetic_ct arguments, got {size!r}.")
    taken = [*inspect.signature(phantom_parameters).parameters]
    unknown = sorted(set(map(str, size)) - set(taken))
    if unknown:
        raise SettingError(f"synthetic_size holds {unknown}, which generate_synthetic_ct does not take ({taken}).")
    try:
        phantom_parameters(**size)
    except (TypeError, ValueError) as exc:
        raise SettingError(f"synthetic_size {dict(size)!r}: {exc}") from exc
    return dict(size)


@dataclasses.dataclass(frozen=True)
class SynapseDataOptions(SettingsObject):
    """The Synapse bundle's own data settings: which cases train, validate and are tested, what a label value that
    the label map does not list becomes, and the synthetic phantom's size. It is the ``data_options`` of the run's
    :class:`~spectraflow_monai.utils.settings.DataSettings`, recorded whole in the run record (a restart with other
    values stops, naming them); the bundle builds it as a component of its values
    (``data_options: {_target_: ...SynapseDataOptions, unmapped_labels: error, ...}``), and the data source
    (:class:`~spectraflow_monai.apps.synapse.SynapseDataSource`) reads it from the data settings. The CT
    preprocessing (``hu_window``, ``label_map``, ``class_names``, ``nonfinite``, ``nonfinite_value``) is the model's
    (:class:`~spectraflow_monai.utils.settings.ModelSettings`, recorded in ``models/model.json``), not a data setting.

    A new Synapse data setting is one field here (checked below) plus its value line in ``configs/train.yaml``.

    Args:
        unmapped_labels: label values the label map does not list: ``"error"`` (the run stops naming the file and
            the values) or ``"background"``; evaluation maps the test labels with it too. Defaults to ``"error"``.
        train_cases: the training cases (None: TransUNet's 18; the synthetic phantom: every case of that list it
            holds; a datalist JSON: its training list). Defaults to None.
        val_cases: the training cases held out of training for validation (None: a datalist JSON's validation list
            or hold-out; with ``val_split: test`` the test cases). Defaults to None.
        test_cases: the cases ``configs/evaluate.yaml`` scores (None: TransUNet's 12; a JSON's test list). Defaults
            to None.
        val_split: where validation cases come from, one of :data:`VAL_SPLITS`: ``"val"`` (held-out training cases)
            or ``"test"`` (the paper's protocol). Defaults to ``"val"``.
        synthetic_size: the phantom's :func:`~spectraflow_monai.apps.synapse.generate_synthetic_ct` arguments
            (``cases``, ``shape``, ``spacing``, ``seed``, ``noise_std``; ``dataset: synthetic`` only), or None
            (never generated). Defaults to None.

    Case ids are ints (``5`` is ``img0005``) or names (a datalist JSON's ``ct_01``); one id alone is a list of one.

    Raises:
        SettingError: (a ``ValueError``) a value out of its range or of the wrong kind, naming the setting and the
            value.
    """

    unmapped_labels: str = "error"
    train_cases: Any = None
    val_cases: Any = None
    test_cases: Any = None
    val_split: str = "val"
    synthetic_size: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.unmapped_labels, str) or self.unmapped_labels not in LABEL_MAP_UNMAPPED:
            raise SettingError(
                f"unmapped_labels must be one of {list(LABEL_MAP_UNMAPPED)}, got {self.unmapped_labels!r}."
            )
        for name in ("train_cases", "val_cases", "test_cases"):
            object.__setattr__(self, name, _check_cases(name, getattr(self, name)))
        if not isinstance(self.val_split, str) or self.val_split not in VAL_SPLITS:
            raise SettingError(f"val_split must be one of {list(VAL_SPLITS)}, got {self.val_split!r}.")
        object.__setattr__(self, "synthetic_size", _check_synthetic_size(self.synthetic_size))


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


@dataclasses.dataclass(frozen=True)
class VolumeLabels:
    """What the label values of a run's volumes mean, derived once from the model's settings (its record:
    ``num_classes``, ``label_map``, ``class_names``) and the data (a Decathlon datalist JSON or a preset): the label
    map applied on reading, the name of every class, the value a class is read as from a 3D Slicer segmentation and
    written back as in a prediction. Evaluation and inference read them from here
    (:meth:`~spectraflow_monai.apps.pipelines.CTSlicePipeline.labels`), each component from the one object.

    Args:
        num_classes: classes including background.
        label_map: the model's ``label_map`` (None: BTCV's map for the presets, the identity for a datalist JSON).
        class_names: the model's ``class_names`` (None: the defaults, :func:`synapse_class_names`).
        data_list_file_path: the run's datalist JSON, or None (a preset).
    """

    num_classes: int
    label_map: Any = None
    class_names: Any = None
    data_list_file_path: Any = None

    @property
    def resolved_label_map(self) -> dict[int, int] | None:
        """The label map the run applies (:func:`resolve_label_map`)."""
        return resolve_label_map(self.label_map, self.data_list_file_path, self.num_classes)

    @property
    def names(self) -> list[str]:
        """Every class name, background first (:func:`all_class_names`)."""
        return all_class_names(self.class_names, self.num_classes, self.data_list_file_path)

    @property
    def read_values(self) -> list[int] | None:
        """The value each class of a 3D Slicer segmentation is read as (:func:`label_values`)."""
        return label_values(self.label_map, self.data_list_file_path, self.num_classes)

    @property
    def written_values(self) -> list | None:
        """The source value each class is written back as in a prediction (:func:`prediction_values`)."""
        return prediction_values(self.label_map, self.data_list_file_path, self.num_classes)


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
