"""The Synapse bundle's entry points: one datalist call for every source, what inference segments and writes
(:class:`VolumeInferenceSettings`), and the evaluation and inference components.

SpectraFlow (Chen et al.) reports its 3D experiment on Synapse multi-organ CT with TransUNet's protocol
(:mod:`spectraflow_monai.apps.synapse`: split, label map, readers, slice cache). :func:`synapse_split` is what the
bundle's data source (:class:`~spectraflow_monai.apps.synapse.SynapseDataSource`) calls: the BTCV / TransUNet
layouts and the synthetic phantom as presets, or a user's Decathlon datalist JSON
(:mod:`spectraflow_monai.apps.synapse.datalist`), all giving the same datalist contract.

Layering (no import circle): protocol, readers and cache <- own-data datalists (``datalist``) <- these entry points
<- the data source (``source``).
"""

from __future__ import annotations

import dataclasses
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
    SYNAPSE_TEST_CASES,
    SYNAPSE_TRAIN_CASES,
    format_case_id,
)
from spectraflow_monai.apps.synapse.datalist import (
    case_fraction,
    decathlon_synapse_datalist,
    synapse_inference_datalist,
)
from spectraflow_monai.apps.synapse.layouts import case_list, synapse_datalist
from spectraflow_monai.apps.synapse.phantom import PHANTOM_MANIFEST, generate_synthetic_ct, phantom_parameters
from spectraflow_monai.apps.synapse.readers import check_volume_pair
from spectraflow_monai.apps.synapse.settings import (
    LAYOUTS,
    OUTPUT_FORMATS,
    VolumeLabels,
    resolve_label_map,
)
from spectraflow_monai.apps.synapse.transforms import SaveDicomSegd
from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.handlers.volume_metrics import VolumeMetricsHandler
from spectraflow_monai.transforms.label import SaveLabelValuesd
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.settings import InferenceSettings

__all__ = [
    "synapse_split",
    "VolumeInferenceSettings",
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


@dataclasses.dataclass(frozen=True)
class VolumeInferenceSettings(InferenceSettings):
    """What ``configs/inference.yaml`` segments and writes
    (:class:`~spectraflow_monai.utils.settings.InferenceSettings`): the volumes of ``input_dir`` matching
    ``input_pattern`` and its DICOM series folders, or the ``test`` list of ``data_list_file_path``; a label volume of
    each, and with ``output_format: dicom_seg`` a DICOM SEG of each DICOM series, in ``output_dir``.

    Args:
        input_dir, input_pattern, data_list_file_path, dataset_dir, output_dir: as
            :class:`~spectraflow_monai.utils.settings.InferenceSettings` (``input_pattern`` defaults to
            ``"*.nii*"``).
        output_format: one of :data:`OUTPUT_FORMATS`: ``nifti`` (``<name>_seg.nii.gz``) or ``dicom_seg`` (also
            ``<name>_seg.dcm`` of each DICOM series input). Defaults to ``"nifti"``.

    Raises:
        SettingError: (a ``ValueError``) a value of the wrong kind, naming the setting and the value.
    """

    input_pattern: str = "*.nii*"
    output_format: str = "nifti"
    list_inputs = staticmethod(synapse_inference_datalist)  # [{"image": path}, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_output_format(self.output_format)


def _check_output_format(output_format: Any) -> str:
    if output_format not in OUTPUT_FORMATS:
        raise SettingError(f"output_format must be one of {list(OUTPUT_FORMATS)}, got {output_format!r}.")
    return output_format


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


def synapse_split(
    source: Any,
    split: str = "train",
    cases: Sequence[int | str] | None = None,
    exclude_cases: Sequence[int | str] | None = None,
    slices: bool = False,
) -> list[dict[str, Any]]:
    """One split of the run whose data source is ``source`` (a
    :class:`~spectraflow_monai.apps.synapse.SynapseDataSource`: the run's settings under the bundle's names).

    Data sets:

    - ``"btcv"``: the raw BTCV release (``RawData/Training/{img,label}``), the TransUNet 18 / 12 case split unless
      ``cases`` is given, BTCV labels mapped 13 -> 8 (:data:`BTCV_TO_SYNAPSE`) unless the model has a ``label_map``.
    - ``"transunet"``: TransUNet's preprocessed files (``train_npz/`` slices, ``test_vol_h5/`` volumes; h5py).
    - ``"synthetic"``: the phantom of :mod:`spectraflow_monai.apps.synapse.phantom` in the raw layout, written into
      ``dataset_dir`` on first use with ``synthetic_size``; without ``cases``, every case found on disk is used,
      split by TransUNet's lists.
    - one's own volumes: a ``data_list_file_path`` is the source and ``dataset`` is not used (logged): see
      :func:`spectraflow_monai.apps.synapse.datalist.decathlon_synapse_datalist`.

    Every source gives the same contract: volumes ``{"image", "label", "case"}`` or cached slices
    ``{"image", "label", "case", "slice"}``.

    Args:
        source: the run's data source.
        split: ``"train"``, ``"val"`` (presets: training cases, normally the held-out ``val_cases``) or
            ``"test"``. Defaults to ``"train"``.
        cases: case ids instead of the split's default ones. Defaults to None.
        exclude_cases: case ids left out of the split (after ``cases`` or the split's default cases are chosen),
            e.g. the training cases held out for validation. Defaults to None.
        slices: False: one entry per volume (raw NIfTI pairs checked from their headers: 3D, same shape and
            affine); True: one entry per axial slice ``.npz`` of the slice cache (raw volumes and TransUNet test
            volumes read once into ``cache_dir``, windowed, labels mapped, resized to ``image_size``; TransUNet's
            ``train_npz`` slices listed as they are). Defaults to False.

    In a ``torch.distributed`` run (process group initialised), rank 0 builds first (writing the phantom and the
    slice cache) while the other ranks wait at a barrier, then they build from the files rank 0 wrote; every rank
    must call this function the same number of times (a bundle config resolves each datalist once per process).

    Raises:
        ValueError: bad arguments; TransUNet's training split asked for as volumes; labels outside the expected set
            (the message names the case).
        DatasetError: a missing root or case (the message names the case and the expected path), a 2D file where a
            volume is expected, a label volume whose shape or affine differs from its image, a phantom of other
            parameters in ``dataset_dir``.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return _synapse_split(source, split, cases, exclude_cases, slices)
    if torch.distributed.get_rank() == 0:
        try:
            out = _synapse_split(source, split, cases, exclude_cases, slices)
        finally:  # the other ranks must not wait for a rank that failed; they fail on their own build
            torch.distributed.barrier()
        return out
    torch.distributed.barrier()
    return _synapse_split(source.quiet(), split, cases, exclude_cases, slices)


def _synapse_split(
    s: Any,
    split: str,
    cases: Sequence[int | str] | None,
    exclude_cases: Sequence[int | str] | None,
    slices: bool,
) -> list[dict[str, Any]]:
    dataset, root = s.dataset, s.dataset_dir
    if s.data_list_file_path:
        logger.info(
            "data source: the datalist %s (paths relative to %s); the dataset setting %r is not used",
            s.data_list_file_path, root or os.path.dirname(os.fspath(s.data_list_file_path)), dataset,
        )  # fmt: skip
        return decathlon_synapse_datalist(s, split, cases, exclude_cases, slices)
    key = dataset
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}.")
    if root is None:
        raise SettingError(f"dataset_dir must be the folder of the {dataset!r} data set, got None.")
    mapping = resolve_label_map(s.label_map, None, s.num_classes)
    train_fraction = s.data_fraction if split == "train" else 1.0
    split = "train" if split == "val" else split  # the presets' validation cases are training cases
    generate = s.synthetic_size
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
    return slice_with_settings(entries, s, mapping)


# ---------------------------------------------------------------- config entry points: one component each


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


def volume_label_reader(labels: VolumeLabels) -> Any:
    """The reader of the label volumes of ``configs/evaluate.yaml``
    (:class:`~spectraflow_monai.data.volumes.VolumeReader`): NIfTI and NRRD labels as stored, a 3D Slicer
    segmentation (``.seg.nrrd``) by segment name, each class as the value the run's label map turns into it
    (:attr:`VolumeLabels.read_values`).

    Args:
        labels: what the label values of the run's volumes are (``pipeline.labels(data_list_file_path)``).
    """
    from spectraflow_monai.data.volumes import VolumeReader

    return VolumeReader("label", class_names=labels.names, values=labels.read_values)


def series_seg_writer(settings: VolumeInferenceSettings, class_names: Sequence[str], keys: Any = "pred") -> Any:
    """The DICOM SEG writer of ``configs/inference.yaml``: with ``settings.output_format`` ``dicom_seg``, each
    prediction of a DICOM series input is written as ``<name>_seg.dcm`` into ``settings.output_dir``, beside its label
    file (:class:`SaveDicomSegd`, segments named by ``class_names``, background first: ``VolumeLabels.names``);
    ``nifti``: nothing more (MONAI's ``Identityd``). A transform of its own, not a ``SaveImaged``: MONAI Label's
    ``BundleInferTask`` drops the label writer and keeps this one, which writes nothing under the default ``nifti``.

    Raises:
        SettingError: ``settings`` is not a :class:`VolumeInferenceSettings`.
    """
    if not isinstance(settings, VolumeInferenceSettings):
        raise SettingError(f"settings must be a VolumeInferenceSettings, got {type(settings).__name__}.")
    if settings.output_format == "nifti":
        from monai.transforms import Identityd

        return Identityd(keys)
    return SaveDicomSegd(keys, output_dir=settings.output_dir, class_names=list(class_names))


def volume_metrics_handler(
    output_dir: str | os.PathLike, num_classes: int = 9, organ_names: Sequence[str] | None = None, **kwargs: Any,
) -> Any:  # fmt: skip
    """The per-organ volume metrics of ``configs/evaluate.yaml``: a
    :class:`~spectraflow_monai.handlers.VolumeMetricsHandler` writing into ``output_dir``, with the spacing of each
    label volume's affine (HD95 in mm for NIfTI / NRRD / DICOM volumes), unit spacing for TransUNet's volumes, which
    carry no geometry and whose loader says so (:class:`~spectraflow_monai.apps.synapse.LoadSynapseH5d`,
    :data:`~spectraflow_monai.handlers.SPACING_UNITS_KEY`: HD95 in voxels), and the rows of the paper's table
    (:data:`PAPER_ORGAN_ORDER`, :data:`ORGAN_DISPLAY_NAMES`; Synapse organs only, other class names in class order).

    Args:
        output_dir: the evaluation folder.
        num_classes: classes including background. Defaults to 9.
        organ_names: the class names (the bundle's ``class_names``). Defaults to None.
        kwargs: further ``VolumeMetricsHandler`` arguments, replacing the defaults above.
    """
    options = {
        "spacing": "meta", "order": list(PAPER_ORGAN_ORDER), "display_names": dict(ORGAN_DISPLAY_NAMES), **kwargs,
    }  # fmt: skip
    return VolumeMetricsHandler(output_dir, num_classes=num_classes, organ_names=organ_names, **options)
