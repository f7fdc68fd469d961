"""The data source of one run of the ``spectraflow_synapse_segmentation`` bundle: every datalist it reads.

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from spectraflow_monai.apps.synapse.bundle import synapse_split
from spectraflow_monai.apps.synapse.cache import slice_cache_dir
from spectraflow_monai.apps.synapse.readers import check_synapse_h5, is_h5
from spectraflow_monai.apps.synapse.settings import SynapseDataSettings
from spectraflow_monai.utils.errors import DataError

logger = logging.getLogger(__name__)

__all__ = ["SynapseDataSource", "check_test_volumes"]


class SynapseDataSource:
    """The data settings of a Synapse bundle run, gathered once into one
    :class:`~spectraflow_monai.apps.synapse.SynapseDataSettings` (``.settings``, the bundle's names kept), so that its
    configs name a split and its cases instead of repeating every setting (``{_target_:
    spectraflow_monai.apps.workflow.datalist, source: '@data_source', split: train, cases: '@train_cases',
    exclude_cases: '@val_cases'}``).

    Args:
        dataset: ``"synthetic"`` (the phantom, generated into ``dataset_dir`` on first use with
            ``synthetic_size``), ``"btcv"`` or ``"transunet"``; ignored when ``data_list_file_path`` is given.
        dataset_dir: the data folder (for a datalist JSON: the base of its relative paths).
        cache_dir: the slice cache of the training / validation slices.
        image_size: side of the cached slices.
        hu_window: the CT window ``(low, high)`` in HU. Defaults to ``(-125, 275)`` (TransUNet).
        data_list_file_path: a Decathlon datalist JSON of one's own volumes. Defaults to None.
        label_map: source label -> class (None: the BTCV map of the presets, the identity for a JSON).
        num_classes: classes of the network (background included). Defaults to None (9).
        unmapped_labels: ``"error"`` or ``"background"`` for source labels the map does not name.
        val_fraction: share of a JSON's training cases held out when it has no validation list. Defaults to 0.2.
        data_fraction: kept fraction of the training cases (low-data runs); other splits are whole. Defaults to 1.0.
        data_seed: seed of the hold-out and of ``data_fraction``. Defaults to 0.
        synthetic_size: ``generate_synthetic_ct`` arguments of the phantom (``dataset="synthetic"`` only).
        progress: show the slice-extraction progress bar. Defaults to True.
        nonfinite: ``"error"`` or ``"replace"`` for NaN / inf voxels; ``nonfinite_value`` replaces them.
        allow_empty_masks: a training datalist whose masks are all background is trained on with a warning instead
            of stopping the run (:func:`~spectraflow_monai.apps.workflow.datalist`). Defaults to False.
        class_names: the classes, background first, that 3D Slicer segmentation labels (``.seg.nrrd``) are matched
            with by segment name. Defaults to None (:func:`~spectraflow_monai.apps.synapse.synapse_class_names`).

    See :func:`~spectraflow_monai.apps.synapse.build_synapse_datalist` for the checks and errors.
    """

    def __init__(
        self,
        dataset: str,
        dataset_dir: str | os.PathLike,
        cache_dir: str | os.PathLike,
        image_size: int,
        hu_window: Sequence[float] = (-125.0, 275.0),
        data_list_file_path: str | os.PathLike | None = None,
        label_map: Mapping[int, int] | None = None,
        num_classes: int | None = None,
        unmapped_labels: str = "error",
        val_fraction: float = 0.2,
        data_fraction: float = 1.0,
        data_seed: int = 0,
        synthetic_size: Mapping[str, Any] | None = None,
        progress: bool = True,
        nonfinite: str = "error",
        nonfinite_value: float | None = None,
        allow_empty_masks: bool = False,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.allow_empty_masks = bool(allow_empty_masks)
        generate = synthetic_size if dataset == "synthetic" and not data_list_file_path else None
        self.settings = SynapseDataSettings(
            dataset=dataset,
            dataset_dir=dataset_dir,
            cache_dir=cache_dir,
            image_size=image_size,
            hu_window=hu_window,
            data_list_file_path=data_list_file_path,
            label_map=label_map,
            num_classes=num_classes,
            unmapped_labels=unmapped_labels,
            val_fraction=val_fraction,
            data_fraction=data_fraction,
            data_seed=data_seed,
            synthetic_size=generate,
            nonfinite=nonfinite,
            nonfinite_value=nonfinite_value,
            progress=progress,
            class_names=class_names,
        )

    @classmethod
    def from_settings(cls, data: Any, model: Any, run: Any) -> Any:
        """The source of a run's settings objects: ``data`` (a :class:`~spectraflow_monai.utils.settings.
        DataSettings`: the source, selection, ``allow_empty_masks`` and its
        :class:`~spectraflow_monai.apps.synapse.SynapseDataOptions`: ``unmapped_labels``, ``synthetic_size``),
        ``model`` (image size, CT window, label map, classes and their names, the non-finite rule) and ``run`` (``dataset_dir``, the
        slice ``cache_dir``: None for :func:`~spectraflow_monai.apps.synapse.slice_cache_dir` under ``bundle_root``,
        ``progress_bar``)."""
        options = dict(data.data_options or {})
        cache_dir = run.cache_dir
        if cache_dir is None:
            cache_dir = slice_cache_dir(run.bundle_root, data.dataset, model.image_size, data.data_list_file_path)
        return cls(
            data.dataset, run.dataset_dir, cache_dir, model.image_size, hu_window=model.hu_window,
            data_list_file_path=data.data_list_file_path, label_map=model.label_map, num_classes=model.num_classes,
            unmapped_labels=options.get("unmapped_labels", "error"), val_fraction=data.val_fraction,
            data_fraction=data.data_fraction, data_seed=data.data_seed, synthetic_size=options.get("synthetic_size"),
            progress=run.progress_bar, nonfinite=model.nonfinite, nonfinite_value=model.nonfinite_value,
            allow_empty_masks=data.allow_empty_masks, class_names=model.class_names,
        )  # fmt: skip

    def datalist(
        self,
        split: str,
        cases: Sequence[int | str] | None = None,
        exclude_cases: Sequence[int | str] | None = None,
        slices: bool = True,
    ) -> list[dict[str, Any]]:
        """The entries of ``split``: cached axial slices (``slices=True``) or whole volumes (evaluation)."""
        return synapse_split(self.settings, split, cases=cases, exclude_cases=exclude_cases, slices=slices)



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
