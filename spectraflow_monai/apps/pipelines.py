"""The model pipeline: the network, the preprocessing and the postprocessing a model was trained with, built once,
from its :class:`~spectraflow_monai.utils.settings.ModelSettings`.

A model is served exactly as it was trained when the transforms that prepare its input are built from the settings
its record holds (``models/model.json``), not from config values that sit beside them. :class:`ModelPipeline` is
that builder: Stage-2 training builds it from the run's ``model_settings``, evaluation and inference from the record
beside the model file (:meth:`ModelPipeline.from_record`), so the same object supplies, for every use:

- the network of the record's architecture (:meth:`ModelPipeline.network`);
- each preprocessing step by name (:meth:`ModelPipeline.step`; the bundle configs list the steps in order with
  :func:`pipeline_step`): read, channel first, label values, window, resize, normalise, ...;
- the label setup and the postprocessing of the model's outputs.

A bundle config keeps what is not the model's: the augmentation (training only, in the run record), the data
source, the writers. A config key set on a step (``--load_transforms#4#spatial_size 112``) is refused naming the
setting that decides it (``--model_settings#image_size``): a model trained otherwise than its record says could not be
served as it was trained.

The 2D bundle's pipeline is :class:`Image2DPipeline` (RGB images in [0, 1], masks of ``label_classes``); the Synapse
bundle's is :class:`CTSlicePipeline` (CT volumes in HU, windowed, segmented slice by slice). :func:`model_pipeline`
picks the one a settings object describes (a CT window: the Synapse bundle's).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch.nn as nn
from monai.inferers import SimpleInferer
from monai.transforms import (
    EnsureChannelFirstd,
    EnsureTyped,
    LoadImaged,
    NormalizeIntensityd,
    Orientationd,
    RepeatChanneld,
    Resized,
)

from spectraflow_monai.apps.seg2d.labels import LabelSetup
from spectraflow_monai.apps.synapse.label_map import MapLabelsd
from spectraflow_monai.apps.synapse.settings import VolumeLabels, slice_nonfinite_value, volume_nonfinite_value
from spectraflow_monai.apps.synapse.transforms import CTWindowd, LoadSynapseSliced
from spectraflow_monai.apps.workflow import recorded_network
from spectraflow_monai.data.readers import Image2DReader
from spectraflow_monai.data.volumes import VolumeReader
from spectraflow_monai.transforms import CheckFinited
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.inferers import AxialSliceInferer
from spectraflow_monai.utils.precision import AutocastInferer, Precision
from spectraflow_monai.utils.run_record import ModelRecord
from spectraflow_monai.utils.settings import ModelSettings, model_settings_path

__all__ = [
    "CTSlicePipeline",
    "Image2DPipeline",
    "ModelPipeline",
    "model_pipeline",
    "pipeline_step",
]

#: the model setting that decides each argument of a preprocessing step (what a refusal names)
_SETTING_OF_ARGUMENT: dict[str, str] = {
    "spatial_size": "image_size",
    "roi_size": "image_size",
    "subtrahend": "image_mean",
    "divisor": "image_std",
    "a_min": "hu_window",
    "a_max": "hu_window",
    "b_min": "hu_window",
    "b_max": "hu_window",
    "label_map": "label_map",
    "num_classes": "num_classes",
    "value": "nonfinite_value",
    "repeats": "in_channels",
}


class ModelPipeline:
    """The network and the preprocessing of one model, built from its settings (Chen et al., Sec. 4: the DINOv2
    encoder sees ``image_size`` inputs normalised as in its pretraining).

    Subclasses give each step of their modality (:meth:`steps`); this class builds the network, refuses a step's
    argument that the settings decide, and reads a model's record.

    Args:
        settings: the model's :class:`~spectraflow_monai.utils.settings.ModelSettings` (Stage-2's ``model_settings``,
            or the record of a model file).
        record: the record it was read from (:meth:`from_record`), or None. Defaults to None.

    Raises:
        ValueError: ``settings`` is not a ``ModelSettings``.
    """

    def __init__(self, settings: ModelSettings, record: ModelRecord | None = None) -> None:
        if not isinstance(settings, ModelSettings):
            raise ValueError(f"settings must be a ModelSettings, got {type(settings).__name__}.")
        self.settings = settings
        self.record = record

    # ---------------------------------------------------------------- building
    @classmethod
    def from_record(
        cls,
        model_file: str | os.PathLike,
        defaults: Mapping[str, Any] | None = None,
        given: Mapping[str, Any] | None = None,
    ) -> ModelPipeline:
        """The pipeline of the model file ``model_file``: its settings are the record beside it
        (:class:`~spectraflow_monai.utils.run_record.ModelRecord`, ``models/model.json``, digest checked).

        Args:
            model_file: the model file (``models/model.pt``; for ONNX inference, the file the export was made from).
            defaults: settings a record of an earlier version does not hold (a warning names them). Defaults to None.
            given: ``{setting: value}`` given to the run (the serving config's ``model_settings``; None: not
                given); each must agree with the record. Defaults to None.

        Raises:
            SettingError: a given value that differs from the record (naming both), an unreadable or foreign record.
        """
        record = ModelRecord(model_file, defaults=defaults, given=given)
        return model_pipeline(record.settings, record=record)

    def network(self, trainable_blocks: Any = None, **given: Any) -> nn.Module:
        """The network of the settings' architecture
        (:func:`~spectraflow_monai.apps.workflow.recorded_network`); ``trainable_blocks``: Stage-2's."""
        return recorded_network(self.settings, trainable_blocks=trainable_blocks, **given)

    @property
    def model_file(self) -> str | None:
        """The model file whose record this is (None: built from a run's settings)."""
        return None if self.record is None else self.record.model_file

    @property
    def image_size(self) -> int:
        """The network's input side."""
        return int(self.settings.image_size)

    def inferer(self, precision: Precision) -> AutocastInferer:
        """How the network is applied to a prepared input, under the autocast of the run's resolved ``precision``
        (outputs in float32): the whole image (2D), or slice by slice (CT volumes)."""
        return AutocastInferer(SimpleInferer(), precision=precision)

    # ---------------------------------------------------------------- steps
    def steps(self) -> dict[str, Callable[..., Any]]:
        """The preprocessing steps by name: each a function of the data keys (and of the data's own options) that
        returns a MONAI transform built from the settings."""
        return {"normalize": self._normalize, "to_float": self._to_float}

    def step(self, name: str, keys: Any = None, **options: Any) -> Any:
        """The preprocessing step ``name`` (:meth:`steps`) for data ``keys``.

        Args:
            name: the step.
            keys: the data keys it transforms (each step has its default).
            options: the data's own options of that step (e.g. the Synapse data ``layout``); any other argument
                (one a model setting decides, such as a ``spatial_size``) is refused.

        Raises:
            SettingError: an unknown step, or an argument that a model setting decides, naming the setting.
        """
        steps = self.steps()
        if name not in steps:
            raise SettingError(f"{type(self).__name__} has no preprocessing step {name!r}; its steps: {sorted(steps)}.")
        function = steps[name]
        accepted = set(inspect.signature(function).parameters) - {"keys"}
        refused = sorted(set(options) - accepted)
        if refused:
            hints = {
                k: f" (give --model_settings#{_SETTING_OF_ARGUMENT[k]})" if k in _SETTING_OF_ARGUMENT else ""
                for k in refused
            }
            named = ", ".join(f"{k}={options[k]!r}{hints[k]}" for k in refused)
            raise SettingError(
                f"preprocessing step {name!r}: {named}: the model's preprocessing is built from its settings "
                f"(model_settings, recorded in models/model.json) so that inference prepares images as training did; "
                f"this step takes {sorted(accepted) or 'no option'} besides keys."
            )
        return function(**({} if keys is None else {"keys": keys}), **options)

    def _normalize(self, keys: Any = "image") -> NormalizeIntensityd:
        return NormalizeIntensityd(
            keys, subtrahend=list(self.settings.image_mean), divisor=list(self.settings.image_std), channel_wise=True
        )

    def _to_float(self, keys: Any = ("image", "label")) -> EnsureTyped:
        return EnsureTyped(keys, dtype="float32")

    def __repr__(self) -> str:
        source = model_settings_path(self.model_file) if self.model_file else "run settings"
        return f"{type(self).__name__}({source}, {self.settings})"


class Image2DPipeline(ModelPipeline):
    """The 2D bundle's model pipeline: RGB images in [0, 1] by bit depth, resized to ``image_size`` (area), normalised
    by ``image_mean`` / ``image_std``; masks of ``label_classes`` (binary: sigmoid output; classes: softmax), resized
    with nearest neighbours.

    Steps: ``read_image``, ``read_label``, ``channel_first``, ``label_values``, ``resize``, ``normalize``,
    ``to_float``.
    """

    @functools.cached_property
    def label_setup(self) -> LabelSetup:
        """What the masks are (:class:`~spectraflow_monai.apps.seg2d.LabelSetup` of the settings' ``label_classes``)."""
        return LabelSetup.read(self.settings.label_classes)

    def steps(self) -> dict[str, Callable[..., Any]]:
        return {
            **super().steps(),
            "read_image": self._read_image,
            "read_label": self._read_label,
            "channel_first": self._channel_first,
            "label_values": self._label_values,
            "resize": self._resize,
        }

    def _read_image(self, keys: Any = "image") -> LoadImaged:
        return LoadImaged(keys, reader=Image2DReader(kind="image"), image_only=True)

    def _read_label(self, keys: Any = "label") -> LoadImaged:
        return LoadImaged(keys, reader=Image2DReader(kind="label", label_mode=self.label_setup), image_only=True)

    def _channel_first(self, keys: Any = ("image", "label")) -> EnsureChannelFirstd:
        return EnsureChannelFirstd(keys)

    def _label_values(self, keys: Any = "label") -> Any:
        return self.label_setup.label_transform(keys)

    def _resize(self, keys: Any = ("image", "label")) -> Resized:
        keys = [keys] if isinstance(keys, str) else list(keys)
        modes = ["nearest" if k == "label" else "area" for k in keys]
        return Resized(keys, spatial_size=[self.image_size] * 2, mode=modes)


class CTSlicePipeline(ModelPipeline):
    """The Synapse bundle's model pipeline: CT in HU, non-finite voxels named (or replaced) before the window
    ``hu_window`` -> [0, 1], RAS+ axial slices resized to ``image_size``, the CT channel repeated to DINOv2's 3,
    normalised by ``image_mean`` / ``image_std``; labels mapped by ``label_map`` to ``num_classes`` classes.

    Steps: ``read_volume``, ``read_slice``, ``channel_first``, ``check_finite``, ``map_labels``, ``orientation``,
    ``window``, ``resize`` (``volume=True``: each axial slice of a volume), ``repeat_channels``, ``normalize``,
    ``to_float``.
    """

    def steps(self) -> dict[str, Callable[..., Any]]:
        return {
            **super().steps(),
            "read_volume": self._read_volume,
            "read_slice": self._read_slice,
            "channel_first": self._channel_first,
            "check_finite": self._check_finite,
            "map_labels": self._map_labels,
            "orientation": self._orientation,
            "window": self._window,
            "resize": self._resize,
            "repeat_channels": self._repeat_channels,
        }

    @property
    def hu_window(self) -> list[float]:
        """The CT window ``[a_min, a_max]`` in HU."""
        return [float(v) for v in self.settings.hu_window]

    @property
    def num_classes(self) -> int:
        """Classes, background included."""
        return int(self.settings.num_classes or self.settings.out_channels)

    def inferer(self, precision: Precision, sw_batch_size: int = 16, progress: bool = False) -> AutocastInferer:
        """Axial slices of a prepared volume, ``sw_batch_size`` per network call (``AxialSliceInferer``: the logits
        of MONAI's ``SliceInferer`` for whole-slice windows, without its sliding-window cost), under the autocast of
        ``precision``.

        Raises:
            SettingError: ``sw_batch_size`` is not a positive int, naming the setting and the value.
        """
        if isinstance(sw_batch_size, bool) or not isinstance(sw_batch_size, (int, np.integer)) or sw_batch_size < 1:
            raise SettingError(
                f"sw_batch_size must be a positive int (slices per network call), got {sw_batch_size!r}."
            )
        return AutocastInferer(AxialSliceInferer(int(sw_batch_size), progress=progress), precision=precision)

    def _read_volume(self, keys: Any = "image") -> LoadImaged:
        return LoadImaged(keys, reader=VolumeReader(), image_only=True)

    def _read_slice(self, keys: Any = ("image", "label")) -> LoadSynapseSliced:
        return LoadSynapseSliced(keys, num_classes=self.num_classes)

    def _channel_first(self, keys: Any = ("image", "label")) -> EnsureChannelFirstd:
        return EnsureChannelFirstd(keys)

    def _check_finite(self, keys: Any = "image", layout: str = "raw", volume: bool = True) -> CheckFinited:
        nonfinite = self.settings.nonfinite or "error"
        value = self.settings.nonfinite_value
        replacement = volume_nonfinite_value(value, layout, self.hu_window) if volume else slice_nonfinite_value(
            value, layout
        )
        return CheckFinited(keys, mode=nonfinite, value=replacement)

    def labels(self, data_list_file_path: Any = None) -> VolumeLabels:
        """What the label values of volumes are for this model on the data of ``data_list_file_path`` (a datalist
        JSON, or None for a preset): the label map, the class names, the values read and written back."""
        settings = self.settings
        return VolumeLabels(self.num_classes, settings.label_map, settings.class_names, data_list_file_path)

    def _map_labels(self, keys: Any = "label", data_list_file_path: Any = None, unmapped: str = "error") -> MapLabelsd:
        label_map = self.labels(data_list_file_path).resolved_label_map
        return MapLabelsd(keys, label_map=label_map, num_classes=self.num_classes, unmapped=unmapped)

    def _orientation(self, keys: Any = "image") -> Orientationd:
        return Orientationd(keys, axcodes="RAS")

    def _window(self, keys: Any = "image") -> CTWindowd:
        return CTWindowd(keys, a_min=self.hu_window[0], a_max=self.hu_window[1])

    def _resize(self, keys: Any = ("image", "label"), volume: bool = False) -> Resized:
        keys = [keys] if isinstance(keys, str) else list(keys)
        modes = ["nearest" if k == "label" else "bilinear" for k in keys]
        size = [self.image_size, self.image_size, -1] if volume else [self.image_size] * 2
        return Resized(keys, spatial_size=size, mode=modes)

    def _repeat_channels(self, keys: Any = "image") -> RepeatChanneld:
        return RepeatChanneld(keys, repeats=int(self.settings.in_channels))


def model_pipeline(settings: ModelSettings, record: ModelRecord | None = None) -> ModelPipeline:
    """The pipeline of ``settings``: :class:`CTSlicePipeline` for a CT model (one with a ``hu_window``, the Synapse
    bundle's), else :class:`Image2DPipeline`.

    Args:
        settings: the model settings.
        record: the record they were read from, or None. Defaults to None.
    """
    kind = CTSlicePipeline if settings.hu_window is not None else Image2DPipeline
    return kind(settings, record=record)


def pipeline_step(pipeline: ModelPipeline, step: str, keys: Any = None, **options: Any) -> Any:
    """One preprocessing step of ``pipeline`` (:meth:`ModelPipeline.step`), as a bundle config lists it::

        - {_target_: spectraflow_monai.apps.pipelines.pipeline_step, pipeline: '@pipeline', step: resize}

    Raises:
        SettingError: an unknown step, or an argument a model setting decides (``--load_transforms#4#spatial_size``),
            naming the setting to give instead.
    """
    if not isinstance(pipeline, ModelPipeline):
        raise ValueError(f"pipeline must be a ModelPipeline, got {type(pipeline).__name__}.")
    return pipeline.step(step, keys=keys, **options)
