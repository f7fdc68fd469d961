"""The datalist entry point of the ``spectraflow_2d_segmentation`` bundle: own data (a Decathlon JSON, folder pairs)
or a preset (Kvasir-SEG, ISIC-2016, GlaS, synthetic), one contract for all (:mod:`spectraflow_monai.data.datalist`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from spectraflow_monai.apps.seg2d.presets import DATASET_PRESETS, canonical_dataset_name
from spectraflow_monai.data.datalist import (
    DATA_SOURCES,
    OWN_DATA_KWARGS,
    decathlon_datalist,
    folder_datalist,
    inference_files,
)
from spectraflow_monai.data.subsets import check_val_fraction, holdout, low_data_subset
from spectraflow_monai.utils.errors import SettingError, brief
from spectraflow_monai.utils.settings import InferenceSettings

__all__ = [
    "MASK_EXTENSIONS",
    "TEST_AS_VALIDATION",
    "DataSource",
    "ImageInferenceSettings",
    "build_datalist",
    "canonical_source_name",
]

logger = logging.getLogger(__name__)

#: presets whose validation split is their test set (the official releases have no validation split): the test set
#: then picks the checkpoint. ``datalist_kwargs`` ``val_from_train`` holds out a share of training instead.
TEST_AS_VALIDATION: tuple[str, ...] = ("isic2016", "glas")
#: the mask files inference writes (MONAI's ``PILWriter``; lossless, 8 or 16 bits per pixel)
MASK_EXTENSIONS: tuple[str, ...] = (".png", ".tif", ".tiff")


@dataclasses.dataclass(frozen=True)
class ImageInferenceSettings(InferenceSettings):
    """What the 2D bundle's ``configs/inference.yaml`` segments and writes
    (:class:`~spectraflow_monai.utils.settings.InferenceSettings`): the images of ``input_dir`` matching
    ``input_pattern`` with an image extension, or the ``test`` list of ``data_list_file_path``; one mask per image,
    ``<name>_seg<output_ext>`` in ``output_dir``.

    Args:
        input_dir, input_pattern, data_list_file_path, dataset_dir, output_dir: as
            :class:`~spectraflow_monai.utils.settings.InferenceSettings` (``input_pattern`` defaults to ``"*.*"``).
        output_ext: the mask files' extension, one of :data:`MASK_EXTENSIONS`. Defaults to ``".png"``.

    Raises:
        SettingError: (a ``ValueError``) a value of the wrong kind, naming the setting and the value.
    """

    input_pattern: str = "*.*"
    output_ext: str = ".png"
    list_inputs = staticmethod(inference_files)  # image paths

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.output_ext not in MASK_EXTENSIONS:
            raise SettingError(f"output_ext must be one of {list(MASK_EXTENSIONS)}, got {self.output_ext!r}.")


def _preset_datalist(
    key: str, dataset_dir: Any, split: str, fraction: float, seed: int, val_from_train: Any, **kwargs: Any
) -> list[dict]:
    """A preset's split; for the presets of :data:`TEST_AS_VALIDATION`, ``val_from_train`` (a share in (0, 1)) makes
    ``val`` a seeded hold-out of the training images (``train`` the rest, ``test`` the test set); without it
    ``val`` is the test set, with a warning."""
    preset = DATASET_PRESETS[key]
    if key not in TEST_AS_VALIDATION:
        if val_from_train is not None:
            raise SettingError(f"datalist_kwargs val_from_train applies to {list(TEST_AS_VALIDATION)}, not {key!r}.")
        return preset(dataset_dir, split=split, fraction=fraction, seed=seed, **kwargs)
    split_key = str(split).lower()
    if val_from_train is None:
        if split_key in ("val", "validation", "valid"):
            logger.warning(
                "%s has no validation split: validation uses its test split, so the test set picks the checkpoint "
                "(best model, early stopping, learning-rate plateau) and the test score is optimistic. To keep the "
                "test set unseen: --datalist_kwargs \"{'val_from_train': 0.2}\" (20 %% of training held out, seed "
                "data_seed).", key,
            )  # fmt: skip
        return preset(dataset_dir, split=split, fraction=fraction, seed=seed, **kwargs)
    try:
        share = check_val_fraction(val_from_train)
    except SettingError as e:
        raise SettingError(f"datalist_kwargs val_from_train must be a number in (0, 1), got {val_from_train!r}.") from e
    if split_key in ("test", "all"):
        return preset(dataset_dir, split=split, fraction=fraction, seed=seed, **kwargs)
    train, val = holdout(preset(dataset_dir, split="train", seed=seed, **kwargs), share, seed)
    if split_key == "train":
        return low_data_subset(train, fraction, seed)
    logger.info("%s: validation = %d training image(s) held out (val_from_train %s, seed %d); test = the test set",
                key, len(val), share, seed)  # fmt: skip
    return val


def canonical_source_name(dataset: str, data_list_file_path: Any = None) -> str:
    """``"datalist"`` when ``data_list_file_path`` is set, ``"folder"``, else the preset key of ``dataset``."""
    if data_list_file_path:
        return "datalist"
    if str(dataset).lower() in DATA_SOURCES:
        return str(dataset).lower()
    return canonical_dataset_name(dataset)


def build_datalist(
    dataset: str,
    dataset_dir: str | os.PathLike | None,
    split: str = "train",
    fraction: float = 1.0,
    seed: int = 0,
    data_list_file_path: str | os.PathLike | None = None,
    val_fraction: float = 0.2,
    label_classes: Any = None,
    **preset_kwargs: Any,
) -> list[dict]:
    """The datalist of every 2D source (the one entry point of the ``spectraflow_2d_segmentation`` bundle).

    Args:
        dataset: ``"folder"``, a preset (``"kvasir"``, ``"isic2016"``, ``"glas"``, ``"synthetic"``) or
            ``"datalist"``; ignored when ``data_list_file_path`` is given (logged).
        dataset_dir: the data folder (JSON: the base of relative paths, None: the JSON's folder).
        split: ``"train"``, ``"val"``, ``"test"`` or ``"all"`` (presets: ``"test"`` = ``"val"``). Defaults to
            ``"train"``.
        fraction: kept fraction of the training split (low-data runs). Defaults to 1.0.
        seed: seed of the hold-out and of ``fraction``. Defaults to 0.
        data_list_file_path: a Decathlon-style datalist JSON; when set it is the source. Defaults to None.
        val_fraction: share of the training entries held out for validation when the source has no validation
            list (JSON, folder). Defaults to 0.2.
        label_classes: None: binary masks; else the classes of the label maps (:func:`label_mode`); presets are
            binary. Defaults to None.
        preset_kwargs: source arguments: ``check_images``, ``check_masks``, ``label_threshold`` (own data),
            ``mask_suffix`` (folder), the preset arguments (``split_dir``, ``generate``, ...), ``val_from_train``
            (ISIC-2016 / GlaS: validate on this share of training instead of the test set).

    Raises:
        SettingError: an unknown source or argument. DatasetError: see the sources.
    """
    if data_list_file_path:
        bad = sorted(set(preset_kwargs) - set(OWN_DATA_KWARGS))
        if bad:
            raise SettingError(
                f"datalist_kwargs {bad} do not apply to a datalist JSON (accepted: {list(OWN_DATA_KWARGS)})."
            )
        if str(dataset).lower() not in ("datalist", "synthetic"):
            logger.info("data_list_file_path is set: the datalist JSON is the data source, not dataset %r", dataset)
        return decathlon_datalist(
            data_list_file_path, dataset_dir, split, fraction, seed, val_fraction, label_classes, **preset_kwargs
        )
    source = str(dataset).lower()
    if source == "datalist":
        raise SettingError("dataset 'datalist' needs data_list_file_path (the datalist JSON), got None.")
    if source == "folder":
        bad = sorted(set(preset_kwargs) - {*OWN_DATA_KWARGS, "mask_suffix"})
        if bad:
            raise SettingError(f"datalist_kwargs {bad} do not apply to dataset 'folder'.")
        return folder_datalist(dataset_dir, split, fraction, seed, val_fraction, label_classes, **preset_kwargs)
    key = canonical_source_name(dataset)
    if label_classes is not None:
        raise SettingError(f"label_classes must be null for the binary preset {key!r}, got {brief(label_classes)}.")
    val_from_train = preset_kwargs.pop("val_from_train", None)
    return _preset_datalist(key, dataset_dir, split, fraction, seed, val_from_train, **preset_kwargs)


class DataSource:
    """The data source of one run of the ``spectraflow_2d_segmentation`` bundle: every datalist it reads.

    The bundle's data settings, gathered once, so that its configs name a split instead of repeating the settings
    (``"$@data_source.datalist('train')"``). The synthetic preset is generated into ``dataset_dir`` on first use
    with ``synthetic_size``.

    Args:
        dataset: the source: ``"folder"``, a preset (``"kvasir"``, ``"isic2016"``, ``"glas"``, ``"synthetic"``);
            ignored when ``data_list_file_path`` is given.
        dataset_dir: the data folder (for a datalist JSON: the base of its relative paths).
        data_list_file_path: a Decathlon-style datalist JSON, the source when set. Defaults to None.
        fraction: kept fraction of the training split (low-data runs); other splits are whole. Defaults to 1.0.
        seed: seed of the hold-out and of ``fraction``. Defaults to 0.
        val_fraction: share of the training entries held out when the source has no validation list.
            Defaults to 0.2.
        label_classes: None (binary masks) or the classes of the label maps. Defaults to None.
        synthetic_size: ``{"num_train": ..., "num_val": ...}`` of the synthetic preset. Defaults to None (the
            preset's defaults).
        options: source arguments (``check_images``, ``check_masks``, ``label_threshold``, ``mask_suffix``, preset
            arguments such as ``split_dir``). Defaults to None.
        allow_empty_masks: a training datalist whose masks are all background is trained on with a warning instead
            of stopping the run (:func:`~spectraflow_monai.apps.workflow.datalist`). Defaults to False.

    Raises:
        SettingError: an unknown source (at construction) or an argument the source does not take.
    """

    def __init__(
        self,
        dataset: str,
        dataset_dir: str | os.PathLike | None,
        data_list_file_path: str | os.PathLike | None = None,
        fraction: float = 1.0,
        seed: int = 0,
        val_fraction: float = 0.2,
        label_classes: Any = None,
        synthetic_size: dict | None = None,
        options: dict | None = None,
        allow_empty_masks: bool = False,
    ) -> None:
        self.name = canonical_source_name(dataset, data_list_file_path)
        self.dataset, self.dataset_dir, self.data_list_file_path = dataset, dataset_dir, data_list_file_path
        self.fraction, self.seed, self.val_fraction, self.label_classes = fraction, seed, val_fraction, label_classes
        self.options = dict(options or {})
        self.allow_empty_masks = bool(allow_empty_masks)
        if self.name == "synthetic":
            self.options = {"generate": True, **dict(synthetic_size or {}), **self.options}

    @classmethod
    def from_settings(cls, data: Any, model: Any, run: Any) -> DataSource:
        """The source of a run's settings objects: ``data`` (a :class:`~spectraflow_monai.utils.settings.
        DataSettings`: the source, selection, ``allow_empty_masks`` and its ``data_options``: ``datalist_kwargs``,
        ``synthetic_size``), ``model`` (its ``label_classes``) and ``run`` (its ``dataset_dir``)."""
        options = dict(data.data_options or {})
        return cls(
            data.dataset, run.dataset_dir, data.data_list_file_path, fraction=data.data_fraction, seed=data.data_seed,
            val_fraction=data.val_fraction, label_classes=model.label_classes,
            synthetic_size=options.get("synthetic_size"), options=options.get("datalist_kwargs"),
            allow_empty_masks=data.allow_empty_masks,
        )  # fmt: skip

    def datalist(self, split: str) -> list[dict]:
        """The entries of ``split`` (``"train"``, ``"val"``, ``"test"`` or ``"all"``); see :func:`build_datalist`."""
        fraction = self.fraction if split == "train" else 1.0
        return build_datalist(
            self.dataset,
            self.dataset_dir,
            split,
            fraction,
            self.seed,
            data_list_file_path=self.data_list_file_path,
            val_fraction=self.val_fraction,
            label_classes=self.label_classes,
            **self.options,
        )
