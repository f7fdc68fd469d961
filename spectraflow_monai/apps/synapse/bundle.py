"""The Synapse bundle's data entry points: settings checked before any work, and one datalist call for every source.

SpectraFlow (Chen et al.) reports its 3D experiment on Synapse multi-organ CT with TransUNet's protocol
(:mod:`spectraflow_monai.apps.synapse`: split, label map, readers, slice cache). :func:`build_synapse_datalist` is
what the ``spectraflow_synapse_segmentation`` bundle calls: the BTCV / TransUNet layouts and the synthetic phantom
as presets, or a user's Decathlon datalist JSON (:mod:`spectraflow_monai.apps.synapse.datalist`), all giving the same
datalist contract. :func:`check_synapse_settings` runs first in the bundle's ``run``.

Layering (no import circle): protocol, readers and cache (``synapse``) <- own-data datalists (``synapse_datalist``)
<- these entry points.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose

from spectraflow_monai.apps.synapse.cache import slice_with_settings
from spectraflow_monai.apps.synapse.constants import (
    ORGAN_DISPLAY_NAMES,
    PAPER_ORGAN_ORDER,
    RAW_IMAGE,
    SYNAPSE_BUNDLE_DATASETS,
    SYNAPSE_TEST_CASES,
    SYNAPSE_TRAIN_CASES,
    format_case_id,
)
from spectraflow_monai.apps.synapse.datalist import case_fraction, decathlon_synapse_datalist
from spectraflow_monai.apps.synapse.layouts import case_list, synapse_datalist
from spectraflow_monai.apps.synapse.phantom import PHANTOM_MANIFEST, generate_synthetic_ct, phantom_parameters
from spectraflow_monai.apps.synapse.readers import check_volume_pair
from spectraflow_monai.apps.synapse.settings import (
    LAYOUTS,
    OUTPUT_FORMATS,
    SynapseDataSettings,
    all_class_names,
    check_own_data_settings,
    label_values,
    resolve_label_map,
    volume_spacing,
)
from spectraflow_monai.apps.synapse.transforms import SaveDicomSegd
from spectraflow_monai.data.label_map import identity_label_map
from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.data.volumes import volume_name
from spectraflow_monai.handlers.volume_metrics import VolumeMetricsHandler
from spectraflow_monai.transforms.finite import NONFINITE_MODES, check_nonfinite_args
from spectraflow_monai.transforms.label import SaveLabelValuesd
from spectraflow_monai.utils.bundles import bundle_values
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import check_image_size

__all__ = [
    "VolumeSlices",
    "build_synapse_datalist",
    "synapse_split",
    "check_bundle_settings",
    "check_synapse_settings",
    "prediction_writer",
    "series_seg_writer",
    "volume_label_reader",
    "volume_loading",
    "volume_output_name",
    "volume_metrics_handler",
    "volume_postprocessing",
]

logger = logging.getLogger(__name__)

_RAW_IMAGE_NAME = re.compile(r"^img(\d+)\.nii(\.gz)?$")


def check_synapse_settings(
    image_size: Any = None,
    dataset: Any = None,
    num_classes: Any = None,
    hu_window: Any = None,
    nonfinite: Any = None,
    nonfinite_value: Any = None,
    sw_batch_size: Any = None,
    output_format: Any = None,
    **data_source: Any,
) -> dict[str, Any]:
    """Check the settings of the ``spectraflow_synapse_segmentation`` bundle before any work starts.

    The bundle's configs call it first in their ``run`` (:func:`check_bundle_settings` reads the arguments from the
    config by name), so that a wrong value stops the run before the phantom, the slice cache or the network is
    built. Settings left at None are not checked.

    Args:
        image_size: the network's input side: a positive int multiple of 14 (the DINOv2 patch size), e.g. 224.
            Defaults to None (evaluation and inference: the record's).
        dataset: one of :data:`SYNAPSE_BUNDLE_DATASETS`. Defaults to None.
        num_classes: number of classes including background, an int >= 2 (9 for Synapse). Defaults to None.
        hu_window: the HU window ``[a_min, a_max]``, two finite numbers with ``a_min < a_max``. Defaults to None.
        nonfinite: ``"error"`` or ``"replace"`` (NaN / infinite voxels). Defaults to None.
        nonfinite_value: the replacement value of ``nonfinite: replace``, a finite number. Defaults to None.
        sw_batch_size: the slices per network call of evaluation and inference, a positive int. Defaults to None.
        output_format: what inference writes: one of :data:`OUTPUT_FORMATS`. Defaults to None.
        data_source: the own-data settings ``data_list_file_path``, ``dataset_dir``, ``label_map``,
            ``class_names``, ``unmapped_labels``, ``val_fraction``, ``data_fraction``, checked by
            :func:`spectraflow_monai.apps.synapse.datalist.check_own_data_settings` (a JSON path that is no file, a
            ``dataset_dir`` that is a file, a label map or class names that do not fit ``num_classes``, ...).

    Returns:
        the checked settings, normalised (``image_size`` as an ``int``, ``hu_window`` as two floats, ...).

    Raises:
        SettingError: (a ``ValueError``) naming the setting and its value.
    """
    out: dict[str, Any] = {}
    if image_size is not None:  # None: the model record's (evaluation, inference)
        out["image_size"] = check_image_size(image_size, "image_size")
    if dataset is not None:
        if not isinstance(dataset, str) or dataset.lower() not in SYNAPSE_BUNDLE_DATASETS:
            raise SettingError(f"dataset must be one of {list(SYNAPSE_BUNDLE_DATASETS)}, got {dataset!r}.")
        out["dataset"] = dataset.lower()
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise SettingError(f"num_classes must be an int >= 2 (9 for Synapse), got {num_classes!r}.")
        out["num_classes"] = int(num_classes)
    if hu_window is not None:
        ok = isinstance(hu_window, Sequence) and not isinstance(hu_window, str) and len(hu_window) == 2
        ok = ok and all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in hu_window)
        if not ok or not all(np.isfinite(float(v)) for v in hu_window) or not hu_window[0] < hu_window[1]:
            raise SettingError(
                f"hu_window must be [a_min, a_max], finite numbers with a_min < a_max, got {hu_window!r}."
            )
        out["hu_window"] = [float(hu_window[0]), float(hu_window[1])]
    if nonfinite is not None or nonfinite_value is not None:
        mode = "error" if nonfinite is None else nonfinite
        if not isinstance(mode, str) or mode not in NONFINITE_MODES:
            raise SettingError(f"nonfinite must be one of {list(NONFINITE_MODES)}, got {nonfinite!r}.")
        out["nonfinite"] = mode
        if nonfinite_value is not None:
            try:
                out["nonfinite_value"] = check_nonfinite_args(mode, nonfinite_value, "nonfinite", "nonfinite_value")
            except ValueError as e:
                raise SettingError(str(e)) from e
    if sw_batch_size is not None:
        if isinstance(sw_batch_size, bool) or not isinstance(sw_batch_size, (int, np.integer)) or sw_batch_size < 1:
            raise SettingError(
                f"sw_batch_size must be a positive int (slices per network call), got {sw_batch_size!r}."
            )
        out["sw_batch_size"] = int(sw_batch_size)
    if output_format is not None:
        out["output_format"] = _check_output_format(output_format)
    if data_source:

        out.update(check_own_data_settings(num_classes=num_classes, **data_source))
    return out


def _check_output_format(output_format: Any) -> str:
    if output_format not in OUTPUT_FORMATS:
        raise SettingError(f"output_format must be one of {list(OUTPUT_FORMATS)}, got {output_format!r}.")
    return output_format


def check_bundle_settings() -> dict[str, Any]:
    """:func:`check_synapse_settings` of the bundle config that MONAI is resolving, each argument the top-level value
    of the same name (:func:`~spectraflow_monai.utils.bundles.bundle_values`): the bundle's ``check_settings``."""
    names = [*inspect.signature(check_synapse_settings).parameters]
    names += inspect.signature(check_own_data_settings).parameters
    names = [name for name in names if name != "data_source"]
    return check_synapse_settings(**bundle_values(names, "check_synapse_settings"))


def _cases_on_disk(root: Path, split: str) -> list[str]:
    """The raw-layout case ids found under ``root`` that belong to TransUNet's ``split`` list."""
    folder = root / os.path.dirname(RAW_IMAGE)
    found = sorted(
        f"{int(m.group(1)):04d}" for m in map(_RAW_IMAGE_NAME.match, os.listdir(folder) if folder.is_dir() else []) if m
    )
    wanted = {format_case_id(c) for c in (SYNAPSE_TRAIN_CASES if split == "train" else SYNAPSE_TEST_CASES)}
    return [c for c in found if c in wanted]


def _generate_or_check_phantom(root: Path, generate: Mapping[str, Any]) -> None:
    """Write the phantom when ``root`` holds none; else make sure it is the one ``generate`` asks for."""
    on_disk = _cases_on_disk(root, "train") + _cases_on_disk(root, "test")
    if not on_disk:
        logger.info("writing the synthetic CT phantom into %s", root)
        generate_synthetic_ct(root, **{**dict(generate), "layout": "raw"})
        return
    try:
        wanted = phantom_parameters(**{k: v for k, v in generate.items() if k != "layout"})
    except TypeError as exc:
        raise ValueError(f"generate holds an argument generate_synthetic_ct does not take: {exc}") from exc
    manifest = root / PHANTOM_MANIFEST
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())
        except (OSError, ValueError) as e:
            raise DatasetError(f"phantom manifest {str(manifest)!r} is unreadable: {e}") from e
        if not isinstance(recorded, dict):
            raise DatasetError(f"phantom manifest {str(manifest)!r} must hold a JSON object, got {recorded!r:.80}.")
        differs = {k: recorded.get(k) for k in wanted if recorded.get(k) != wanted[k]}
    else:  # written before the manifest existed: only the case ids can be compared
        differs = {"cases": on_disk} if set(wanted["cases"]) - set(on_disk) else {}
    if differs:
        raise DatasetError(
            f"{str(root)!r} holds a synthetic CT phantom generated with other parameters ({differs}) than the "
            f"requested ones ({ {k: wanted[k] for k in differs} }): choose another dataset_dir, or delete that folder "
            "to regenerate it."
        )


def build_synapse_datalist(
    dataset: str,
    root: str | os.PathLike,
    split: str = "train",
    cases: Sequence[int | str] | None = None,
    slices: bool = False,
    cache_dir: str | os.PathLike | None = None,
    spatial_size: Sequence[int] | None = None,
    window: Sequence[float] = (-125.0, 275.0),
    generate: Mapping[str, Any] | None = None,
    progress: bool = True,
    exclude_cases: Sequence[int | str] | None = None,
    nonfinite: str = "error",
    nonfinite_value: float | None = None,
    data_list_file_path: str | os.PathLike | None = None,
    label_map: Mapping[int, int] | None = None,
    num_classes: int | None = None,
    unmapped_labels: str = "error",
    val_fraction: float = 0.2,
    fraction: float = 1.0,
    seed: int = 0,
    class_names: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One entry point for the ``spectraflow_synapse_segmentation`` bundle (SpectraFlow's Synapse experiment).

    Data sets:

    - ``"btcv"``: the raw BTCV release (``RawData/Training/{img,label}``), the TransUNet 18 / 12 case split unless
      ``cases`` is given, BTCV labels mapped 13 -> 8 (:data:`BTCV_TO_SYNAPSE`).
    - ``"transunet"``: TransUNet's preprocessed files (``train_npz/`` slices, ``test_vol_h5/`` volumes; h5py).
    - ``"synthetic"``: the phantom of :mod:`spectraflow_monai.apps.synapse.phantom` in the raw layout, written into
      ``root`` on first use when ``generate`` is a mapping (the arguments of
      :func:`~spectraflow_monai.apps.synapse.phantom.generate_synthetic_ct`; ``layout`` is always ``"raw"``); without
      ``cases``, every case found on disk is used, split by TransUNet's lists.
    - your own volumes: when ``data_list_file_path`` names a Decathlon-style datalist JSON, it is the source and
      ``dataset`` is not used (logged): see :func:`spectraflow_monai.apps.synapse.datalist.decathlon_synapse_datalist`
      (``root`` is the base of its relative paths, ``label_map`` defaults to the identity over ``num_classes``).

    Every source gives the same contract: volumes ``{"image", "label", "case"}`` or cached slices
    ``{"image", "label", "case", "slice"}``.

    Args:
        dataset: ``"synthetic"``, ``"btcv"`` or ``"transunet"``.
        root: the data set folder (with ``data_list_file_path``: the base of the JSON's relative paths; None or
            ``""``: the JSON's folder).
        split: ``"train"``, ``"val"`` (presets: the training list, normally restricted to ``cases``, the held-out
            validation cases) or ``"test"``. Defaults to ``"train"``.
        cases: case ids instead of the split's default ones. Defaults to None.
        slices: False: one entry per volume (``{"image", "label", "case"}``; raw NIfTI pairs are checked from their
            headers: 3D, same shape and affine); True: one entry per axial slice ``.npz``
            (``{"image", "label", "case", "slice"}``, load with
            :class:`spectraflow_monai.apps.synapse.LoadSynapseSliced`): raw volumes and TransUNet test volumes are
            read once into the slice cache ``cache_dir`` with :func:`extract_slices` (reused by later calls),
            TransUNet's ``train_npz`` slices are listed as they are. Defaults to False.
        cache_dir: the slice cache folder; required when a volume has to be sliced. Defaults to None.
        spatial_size: ``(H, W)`` the cached slices are resized to (e.g. the network's 224 x 224); None keeps the
            native size. Defaults to None.
        window: HU window of the cached raw slices (TransUNet's files are already windowed). Defaults to
            ``(-125, 275)``.
        generate: synthetic data set only: the arguments of ``generate_synthetic_ct`` used when ``root`` holds no
            phantom yet; None never generates. Defaults to None.
        progress: show a progress bar while slices are extracted. Defaults to True.
        exclude_cases: case ids left out of the split (after ``cases`` or the split's default cases are chosen),
            e.g. the training cases held out for validation. Defaults to None.
        nonfinite: ``"error"`` or ``"replace"``: NaN / infinite voxels of the volumes sliced into the cache (see
            :func:`extract_slices`). Defaults to ``"error"``.
        nonfinite_value: the replacement for ``nonfinite="replace"``; None: black after windowing (see
            :func:`extract_slices`). Defaults to None.
        data_list_file_path: a Decathlon-style datalist JSON of NIfTI volumes; takes precedence over ``dataset``.
            Defaults to None.
        label_map: ``{source label value: class}`` for NIfTI labels; None: the BTCV -> 8 organ map for
            ``btcv`` / ``synthetic``, the identity over ``num_classes`` for a datalist JSON. Not allowed with
            ``transunet`` (its files are mapped already). Defaults to None.
        num_classes: number of classes including background; needed with ``label_map`` or a datalist JSON.
            Defaults to None (9).
        unmapped_labels: label values ``label_map`` does not list: ``"error"`` or ``"background"``. Defaults to
            ``"error"``.
        val_fraction: datalist JSON without a ``validation`` list: the share of ``training`` held out for
            validation (seeded with ``seed``). Defaults to 0.2.
        fraction: ``"train"`` split only: the share of the training cases kept (seeded with ``seed``, nested:
            low-data runs). Defaults to 1.0.
        seed: seed of the validation hold-out and of ``fraction``. Defaults to 0.
        class_names: the classes (background first) that the segments of 3D Slicer segmentation labels
            (``.seg.nrrd``) are matched with by name; None: :func:`~spectraflow_monai.apps.synapse.synapse_class_names`.
            Defaults to None.

    In a ``torch.distributed`` run (process group initialised), rank 0 builds first (writing the phantom and the
    slice cache) while the other ranks wait at a barrier, then they build from the files rank 0 wrote; every rank
    must call this function the same number of times (a bundle config resolves each datalist once per process).

    Raises:
        ValueError: bad arguments; TransUNet's training split asked for as volumes; labels outside the expected set
            (the message names the case).
        DatasetError: a missing root or case (the message names the case and the expected path), a 2D file where a
            volume is expected, or a label volume whose shape or affine differs from its image.
    """
    if spatial_size is not None and (len(spatial_size) != 2 or spatial_size[0] != spatial_size[1]):
        raise ValueError(f"spatial_size must be a square (H, H) of the cached slices, got {spatial_size!r}.")
    settings = SynapseDataSettings(
        dataset=dataset,
        dataset_dir=root,
        cache_dir=cache_dir,
        image_size=None if spatial_size is None else int(spatial_size[0]),
        hu_window=window,
        data_list_file_path=data_list_file_path,
        label_map=label_map,
        num_classes=9 if num_classes is None else num_classes,
        unmapped_labels=unmapped_labels,
        val_fraction=val_fraction,
        data_fraction=fraction,
        data_seed=seed,
        synthetic_size=generate,
        nonfinite=nonfinite,
        nonfinite_value=nonfinite_value,
        progress=progress,
        class_names=class_names,
    )
    return synapse_split(settings, split, cases=cases, exclude_cases=exclude_cases, slices=slices)


def synapse_split(
    settings: SynapseDataSettings,
    split: str = "train",
    cases: Sequence[int | str] | None = None,
    exclude_cases: Sequence[int | str] | None = None,
    slices: bool = False,
) -> list[dict[str, Any]]:
    """One split of the run whose data ``settings`` describe (:class:`SynapseDataSettings`, handed whole): the data
    sets, contract, checks and errors of :func:`build_synapse_datalist`.

    In a ``torch.distributed`` run (process group initialised), rank 0 builds first (writing the phantom and the
    slice cache) while the other ranks wait at a barrier, then they build from the files rank 0 wrote; every rank
    must call this function the same number of times (a bundle config resolves each datalist once per process).
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return _synapse_split(settings, split, cases, exclude_cases, slices)
    if torch.distributed.get_rank() == 0:
        try:
            out = _synapse_split(settings, split, cases, exclude_cases, slices)
        finally:  # the other ranks must not wait for a rank that failed; they fail on their own build
            torch.distributed.barrier()
        return out
    torch.distributed.barrier()
    return _synapse_split(settings.replace(progress=False), split, cases, exclude_cases, slices)


def _synapse_split(
    settings: SynapseDataSettings,
    split: str,
    cases: Sequence[int | str] | None,
    exclude_cases: Sequence[int | str] | None,
    slices: bool,
) -> list[dict[str, Any]]:
    s = settings
    dataset, root = s.dataset, s.dataset_dir
    if s.data_list_file_path:
        logger.info(
            "data source: the datalist %s (paths relative to %s); the dataset setting %r is not used",
            s.data_list_file_path, root or os.path.dirname(os.fspath(s.data_list_file_path)), dataset,
        )  # fmt: skip
        return decathlon_synapse_datalist(s, split, cases, exclude_cases, slices)
    key = str(dataset).lower()
    if key not in SYNAPSE_BUNDLE_DATASETS:
        raise ValueError(f"dataset must be one of {list(SYNAPSE_BUNDLE_DATASETS)}, got {dataset!r}.")
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}.")
    if s.label_map is not None and key == "transunet":
        raise SettingError("label_map does not apply to dataset 'transunet' (its files hold the 9 classes already).")
    mapping = resolve_label_map(s.label_map, None, s.num_classes)
    train_fraction = s.data_fraction if split == "train" else 1.0
    split = "train" if split == "val" else split  # the presets' validation cases are training cases
    generate = s.synthetic_size
    if generate is not None and not isinstance(generate, Mapping):
        raise ValueError(f"generate must be None or a mapping of generate_synthetic_ct arguments, got {generate!r}.")
    root = Path(root)
    if key == "synthetic":
        if generate is not None:
            _generate_or_check_phantom(root, generate)
        if cases is None:
            cases = _cases_on_disk(root, split)
            if not cases:
                raise DatasetError(
                    f"no synthetic case of the {split} split (TransUNet's list) under {str(root)!r}: expected "
                    f"{str(root / os.path.dirname(RAW_IMAGE))}/imgXXXX.nii.gz; generate the phantom with "
                    "spectraflow synthetic-ct --output <dir>."
                )
    if exclude_cases:
        excluded = set(case_list(exclude_cases, split))
        chosen = case_list(cases, split)
        cases = [c for c in chosen if c not in excluded]
        if not cases:
            raise ValueError(
                f"no case of the {split} split is left after excluding {sorted(excluded)} from {chosen} "
                "(exclude_cases, e.g. the bundle's val_cases, takes every case of the split)."
            )
    layout = "transunet" if key == "transunet" else "raw"
    listed = synapse_datalist(root, split=split, layout=layout, cases=cases)
    entries = case_fraction(listed, train_fraction, s.data_seed)
    if layout == "transunet" and split == "train":
        if not slices:
            raise ValueError(
                "TransUNet's training split is distributed as slices (train_npz/); use slices=True, or the raw BTCV "
                "layout for training volumes."
            )
        return entries
    if not slices:
        if layout == "raw":
            for e in entries:
                check_volume_pair(e["image"], e["label"], case=e["case"])
        return entries
    if s.cache_dir is None:
        raise ValueError(f"cache_dir is required to slice the {split} volumes of {dataset!r} (slices=True).")
    return slice_with_settings(entries, s, mapping)


# ---------------------------------------------------------------- config entry points: one component each


class VolumeSlices:
    """Whole CT volumes given as training or validation entries (MONAI Label's bundle trainer replaces
    ``train#dataset#data`` / ``validate#dataset#data`` with its datastore's image-label pairs) as cached axial
    slices, extracted once as the run's own cases are (windowed with ``hu_window``, resized to ``image_size``);
    entries that are slices already pass unchanged. The labels of such volumes are taken as the run's classes
    ``0..num_classes-1`` (a MONAI Label datastore holds them so), not mapped: a value outside stops the run naming the
    file. Labels may be NIfTI or NRRD files; a 3D Slicer segmentation (``.seg.nrrd``) is mapped to the run's
    ``class_names`` by segment name (a liver segment is the liver class whatever its number in the file).

    Args:
        source: the run's :class:`~spectraflow_monai.apps.synapse.SynapseDataSource` (or its settings).
    """

    def __init__(self, source: Any) -> None:
        self.settings: SynapseDataSettings = getattr(source, "settings", source)
        if not isinstance(self.settings, SynapseDataSettings):
            raise ValueError(f"source must be a SynapseDataSource or SynapseDataSettings, got {type(source).__name__}.")

    def __call__(self, data: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        entries = [dict(e) for e in data]
        volumes = [e for e in entries if "slice" not in e]
        if not volumes:
            return entries
        s = self.settings
        if s.cache_dir is None:
            raise SettingError("cache_dir is required to slice the volumes given as training data.")
        for e in volumes:  # the file name without its extension (series UIDs, as MONAI Label names images, hold dots)
            e.setdefault("case", volume_name(e["image"]))
        # the classes themselves (another value: an error naming the file)
        sliced = slice_with_settings(volumes, s, identity_label_map(s.num_classes), "error", f"{s.cache_dir}_volumes")
        return [e for e in entries if "slice" in e] + sliced



def volume_loading(loading: Mapping[str, Sequence[Any]], layout: Any) -> Any:
    """``Compose`` of the volume-loading transforms of ``layout`` (``configs/evaluate.yaml``: ``volume_loading``
    holds one list per layout: NIfTI volumes in HU read, checked, label-mapped, reoriented and windowed; TransUNet's
    h5 volumes read windowed and mapped already).

    Args:
        loading: ``{layout: its transforms}``; needs an entry for ``layout``.
        layout: ``"raw"`` or ``"transunet"`` (:func:`~spectraflow_monai.apps.synapse.synapse_layout`).

    Raises:
        SettingError: ``layout`` is unknown or ``loading`` has no entry for it, naming the layout and the entries.
    """
    if layout not in LAYOUTS:
        raise SettingError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}.")
    if not isinstance(loading, Mapping) or layout not in loading:
        entries = sorted(loading) if isinstance(loading, Mapping) else loading
        raise SettingError(f"volume_loading has no entry for the layout {layout!r} (entries: {entries!r}).")
    return Compose(list(loading[layout]))


def volume_postprocessing(transforms: Sequence[Any], writer: Any = None, save: bool = True) -> Any:
    """``Compose`` of ``transforms`` (argmax, back to the input grid) followed by ``writer`` when ``save`` is true
    (``configs/evaluate.yaml``: ``save_predictions``).

    Raises:
        SettingError: ``save`` is not a bool, or true without a ``writer``, naming the value.
    """
    if not isinstance(save, (bool, np.bool_)):
        raise SettingError(f"save_predictions must be true or false, got {save!r}.")
    if save and writer is None:
        raise SettingError("save_predictions is true but no prediction writer was given.")
    return Compose([*transforms, *([writer] if save else [])])


def prediction_writer(
    output_dir: str | os.PathLike, values: Sequence[int] | None = None, keys: Any = "pred", **kwargs: Any
) -> Any:
    """The writer of predicted label volumes: :class:`~spectraflow_monai.transforms.SaveLabelValuesd` writing
    ``<name>_seg.nii.gz`` (uint8) directly into ``output_dir``, on the grid the prediction carries (no resampling);
    ``<name>`` is the input's file name without its extension, or the whole name of a DICOM series folder
    (:func:`volume_output_name`).

    Args:
        output_dir: the folder of the predictions.
        values: the source label value of every class
            (:func:`~spectraflow_monai.apps.synapse.prediction_values`); None: the class indices. Defaults to None.
        keys: the prediction key. Defaults to ``"pred"``.
        kwargs: further ``SaveImaged`` arguments (``print_log``, ...), replacing the defaults above.

    Raises:
        SettingError: ``output_dir`` is not a folder path, naming the value.
    """
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
        raise SettingError(f"output_dir must be a folder path, got {output_dir!r}.")
    options = {
        "output_postfix": "seg", "output_ext": ".nii.gz", "output_dtype": np.uint8, "separate_folder": False,
        "resample": False, "output_name_formatter": volume_output_name, **kwargs,
    }  # fmt: skip
    return SaveLabelValuesd(keys, values=values, output_dir=output_dir, **options)


def volume_output_name(metadict: Mapping[str, Any] | None, saver: Any) -> dict[str, Any]:
    """MONAI's ``output_name_formatter`` of the prediction writers: MONAI's default, but a DICOM series folder keeps
    its whole name (``1.2.840.1234`` -> ``1.2.840.1234_seg.nii.gz``; MONAI would cut its last ``.1234`` as an
    extension, and two series of one study would write one file)."""
    from monai.data.folder_layout import default_name_formatter

    out = default_name_formatter(dict(metadict) if metadict else {}, saver)
    if os.path.isdir(out["subject"]):
        out["subject"] = out["subject"].rstrip("/\\") + ".series"
    return out


def volume_label_reader(
    class_names: Sequence[str] | None, num_classes: int, label_map: Any = None, data_list_file_path: Any = None
) -> Any:
    """The reader of the label volumes of ``configs/evaluate.yaml``
    (:class:`~spectraflow_monai.data.volumes.VolumeReader`): NIfTI and NRRD labels as stored, a 3D Slicer
    segmentation (``.seg.nrrd``) by segment name, each class as the value the run's label map turns into it
    (:func:`~spectraflow_monai.apps.synapse.label_values`).

    Args:
        class_names: the class names (background first, or the foreground ones); None: the defaults.
        num_classes: classes including background.
        label_map, data_list_file_path: the run's label map and datalist JSON.
    """
    from spectraflow_monai.data.volumes import VolumeReader

    names = all_class_names(class_names, num_classes, data_list_file_path)
    return VolumeReader("label", class_names=names, values=label_values(label_map, data_list_file_path, num_classes))


def series_seg_writer(
    output_format: str, output_dir: str | os.PathLike, class_names: Sequence[str] | None, num_classes: int,
    keys: Any = "pred",
) -> Any:  # fmt: skip
    """The DICOM SEG writer of ``configs/inference.yaml``: ``output_format: dicom_seg`` writes each prediction of a
    DICOM series input as ``<name>_seg.dcm`` beside its label file (:class:`SaveDicomSegd`, segments named by
    ``class_names``); ``nifti``: nothing more (MONAI's ``Identityd``).

    Raises:
        SettingError: ``output_format`` is not one of :data:`OUTPUT_FORMATS`, naming the value.
    """
    if _check_output_format(output_format) == "nifti":
        from monai.transforms import Identityd

        return Identityd(keys)
    return SaveDicomSegd(keys, output_dir=output_dir, class_names=all_class_names(class_names, num_classes))


def volume_metrics_handler(
    output_dir: str | os.PathLike, layout: Any, num_classes: int = 9, organ_names: Sequence[str] | None = None,
    **kwargs: Any,
) -> Any:  # fmt: skip
    """The per-organ volume metrics of ``configs/evaluate.yaml``: a
    :class:`~spectraflow_monai.handlers.VolumeMetricsHandler` writing into ``output_dir``, with the spacing of the
    layout's volumes (:func:`~spectraflow_monai.apps.synapse.volume_spacing`: HD95 in mm for NIfTI volumes, in
    voxels for TransUNet's, which carry no geometry) and the rows of the paper's table
    (:data:`PAPER_ORGAN_ORDER`, :data:`ORGAN_DISPLAY_NAMES`; Synapse organs only, other class names in class order).

    Args:
        output_dir: the evaluation folder.
        layout: ``"raw"`` or ``"transunet"``.
        num_classes: classes including background. Defaults to 9.
        organ_names: the class names (the bundle's ``class_names``). Defaults to None.
        kwargs: further ``VolumeMetricsHandler`` arguments, replacing the defaults above.

    Raises:
        SettingError: ``layout`` is unknown, naming the value.
    """
    options = {"order": list(PAPER_ORGAN_ORDER), "display_names": dict(ORGAN_DISPLAY_NAMES), **kwargs}
    return VolumeMetricsHandler(
        output_dir, spacing=volume_spacing(layout), num_classes=num_classes, organ_names=organ_names, **options
    )
