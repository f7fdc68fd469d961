"""The settings of a run as typed objects, and the checks of single settings.

A bundle's ``configs/train.yaml`` builds one object of each kind as a MONAI component whose arguments are its values
(``model_settings: {_target_: ...ModelSettings, image_size: 224, ...}``, overridden on the command line as
``--model_settings#image_size 112``; a field the config does not give keeps its default here, and is recorded like
the others): :class:`ModelSettings` (what builds the network and normalises its input),
:class:`DataSettings` (which data), :class:`Stage2Settings` and :class:`Stage1Settings` (how each stage trains);
``configs/inference.yaml`` builds an :class:`InferenceSettings` (what it segments and where it writes).
Each value is checked once, where the object is built, and a wrong one stops the run before any data is read,
naming the setting and the value. The run record and ``model.json`` are these objects written whole
(:func:`settings_dict`), and evaluation, inference and the MONAI Label app read them back
(:meth:`ModelSettings.from_dict`), as nnU-Net reads its ``plans.json``: nothing is listed by hand.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from spectraflow_monai.utils.architectures import ARCHITECTURES, PATCH_SIZE, Architecture, architecture
from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "ARCHITECTURES",
    "CACHE_DEVICES",
    "CORRUPTION_KINDS",
    "DATA_PATHS",
    "DataSettings",
    "DISTANCE_BACKENDS",
    "ENCODER_FIELDS",
    "ENCODER_RECORD",
    "ENCODER_INITS",
    "FUSION_MODES",
    "NONFINITE_MODES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "InferenceSettings",
    "ModelSettings",
    "REFINE_MODES",
    "RunSettings",
    "STAGE1_OBJECTIVES",
    "SettingsObject",
    "Stage1Settings",
    "Stage2Settings",
    "settings_dict",
    "CORRUPTION_SEVERITIES",
    "MAX_SEVERITY",
    "PATCH_SIZE",
    "PRECISION_SETTINGS",
    "as_bool",
    "check_image_size",
    "check_precision_setting",
    "model_settings_path",
]

#: the values of the ``precision`` setting (:func:`spectraflow_monai.utils.resolve_precision` reads them); here, away
#: from torch, so that command lines list them without loading it
PRECISION_SETTINGS: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
#: parameter of each corruption kind at severity 0..5 (:mod:`spectraflow_monai.transforms.corruptions` says what each
#: means; the ``corruption`` / ``corruption_severity`` settings of evaluate.yaml, ``spectraflow experiment robustness``)
CORRUPTION_SEVERITIES: dict[str, tuple[float, ...]] = {
    "brightness": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    "contrast": (1.0, 0.4, 0.3, 0.2, 0.1, 0.05),
    "gaussian_blur": (0.0, 1.0, 2.0, 3.0, 4.0, 6.0),
    "gaussian_noise": (0.0, 0.08, 0.12, 0.18, 0.26, 0.38),
}
#: the corruption kinds of paper Fig. 5.
CORRUPTION_KINDS: tuple[str, ...] = tuple(CORRUPTION_SEVERITIES)
#: the highest severity level.
MAX_SEVERITY = 5

logger = logging.getLogger(__name__)

#: DINOv2's (ImageNet) normalisation, the default ``image_mean`` / ``image_std``
IMAGENET_MEAN: tuple[float, ...] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, ...] = (0.229, 0.224, 0.225)
#: skip fusion of the decoder (paper Table 3: DAF, concatenation, addition)
FUSION_MODES: tuple[str, ...] = ("daf", "concat", "add")
#: refinement of the decoder (paper Table 3: FDConv, a standard convolution; CBAM variants)
REFINE_MODES: tuple[str, ...] = ("fdconv", "standard", "cbam", "fdconv_cbam")
#: the encoder fields of :class:`ModelSettings`: an architecture without an encoder (the baselines ``unet``,
#: ``unetpp``; :attr:`~spectraflow_monai.utils.architectures.Architecture.has_encoder`) does not read them (recorded as
#: None). The networks a model may hold are :data:`~spectraflow_monai.utils.architectures.ARCHITECTURES`.
ENCODER_FIELDS: tuple[str, ...] = ("encoder_name", "encoder_kwargs", "fusion", "refine")
#: the fields of the encoder part of :class:`ModelSettings` (the Stage-1 export's record, :meth:`ModelSettings.encoder`)
ENCODER_RECORD: tuple[str, ...] = ("encoder_name", "encoder_kwargs", "image_size", "image_mean", "image_std")
#: what a CT input's NaN / infinite voxels do (the Synapse bundle's ``nonfinite``)
NONFINITE_MODES: tuple[str, ...] = ("error", "replace")
#: the training data path: MONAI's per-sample loader, or the cache on the training device with batched augmentation
DATA_PATHS: tuple[str, ...] = ("monai", "device")
#: where Stage-2's encoder starts (``auto``: the Stage-1 export when there is one, else ``pretrained``)
ENCODER_INITS: tuple[str, ...] = ("auto", "stage1", "pretrained", "random")
#: the Stage-1 objective: the paper's Mixed-Domain MeanFlow, or the mixed-domain MAE of the Table 2 ablation
STAGE1_OBJECTIVES: tuple[str, ...] = ("meanflow", "mae")
#: where the device data path's cache lives (``cache_device``; :mod:`spectraflow_monai.data.device_cache`)
CACHE_DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: where the boundary loss's signed distance maps are computed (``distance_backend``; :mod:`spectraflow_monai.utils.
#: distance`)
DISTANCE_BACKENDS: tuple[str, ...] = ("auto", "torch", "cucim", "scipy")


def check_precision_setting(value: Any) -> str:
    """``value`` as one of :data:`PRECISION_SETTINGS` (case and surrounding spaces ignored).

    Raises:
        SettingError: (a ``ValueError``) any other value, named.
    """
    if not isinstance(value, str) or value.strip().lower() not in PRECISION_SETTINGS:
        raise SettingError(f"precision must be one of {', '.join(PRECISION_SETTINGS)}, got {value!r}.")
    return value.strip().lower()


def check_image_size(value: Any, name: str = "image_size", multiple: int = PATCH_SIZE) -> int:
    """Return ``value`` as an ``int`` when it is a positive integer multiple of ``multiple``.

    Args:
        value: the setting's value (an int; numpy integers are accepted, booleans and strings are not).
        name: the setting's name for the message. Defaults to ``"image_size"``.
        multiple: the value must be a multiple of it (the ViT patch size). Defaults to 14.

    Raises:
        SettingError: (a ``ValueError``) naming the setting and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SettingError(f"{name} must be a positive int multiple of {multiple} (e.g. 224), got {value!r}.")
    if value <= 0 or value % multiple:
        raise SettingError(f"{name} must be a positive int multiple of {multiple} (e.g. 224), got {value!r}.")
    return int(value)


def as_bool(value: Any, name: str) -> bool:
    """A boolean setting as a ``bool``: ``True`` / ``False``, 1 / 0, or the strings ``true``, ``false``, ``yes``,
    ``no``, ``1``, ``0`` (any case), as a command line passes them.

    Raises:
        SettingError: naming the setting and the value.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise SettingError(f"{name} must be true or false, got {value!r}.")


def model_settings_path(model_file: Any) -> str:
    """The settings record beside a model file: ``models/model.pt`` -> ``models/model.json``."""
    return os.path.splitext(os.fspath(model_file))[0] + ".json"


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingError(f"{name} must be one of {list(choices)}, got {value!r}.")
    return value


def _number(name: str, value: Any, low: float = 0.0, high: float = math.inf, low_open: bool = False,
            integer: bool = False) -> Any:
    """``value`` when it is a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``), else a
    :class:`SettingError` naming the setting and the value."""
    kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    bad = isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(float(value))
    if bad or float(value) > high or float(value) < low or (low_open and float(value) == low):
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise SettingError(f"{name} must be {'an int' if integer else 'a number'} in {interval}, got {value!r}.")
    return int(value) if integer else float(value)


def _plain_value(value: Any) -> Any:
    """``value`` as JSON data: tuples as lists, numpy scalars as numbers, mappings with string keys."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_value(v) for v in value]
    return value


def settings_dict(settings: Any) -> dict[str, Any]:
    """A settings object (:class:`ModelSettings`, :class:`DataSettings`, :class:`Stage1Settings`,
    :class:`Stage2Settings`) as JSON data: every field, by name. This is what run records and ``model.json`` hold."""
    return {f.name: _plain_value(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


class SettingsObject:
    """Shared behaviour of the settings objects: whole-object JSON form and reading it back."""

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON data (:func:`settings_dict`)."""
        return settings_dict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "the record") -> Any:
        """The object of recorded ``values`` (its :meth:`to_dict`); fields missing from an earlier version's record
        take their defaults; a name the object does not know, or a value it refuses (an unknown architecture), is a
        :class:`SettingError` naming ``source``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise SettingError(
                f"{source}: unknown {cls.__name__} {unknown} (written by another version of spectraflow_monai?)."
            )
        try:
            return cls(**dict(values))
        except SettingError as err:
            raise SettingError(f"{source}: {err}") from err

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (checked as when built)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class ModelSettings(SettingsObject):
    """What builds a model and prepares its input (Chen et al., Sec. 4): the record beside every model file
    (``models/model.json``, ``models/encoder_stage1.json``). Evaluation, inference and the MONAI Label app build the
    network, normalise images and write predictions from it, so that a model is served as it was trained.

    The network is the registered ``architecture``'s (:data:`~spectraflow_monai.utils.architectures.ARCHITECTURES`,
    :attr:`architecture_entry`): a SpectraFlowNet (``spectraflow``: the encoder, fusion and refinement fields) or one
    of the 2D bundle's baselines (``unet``: MONAI's ``UNet``; ``unetpp``:
    :class:`~spectraflow_monai.networks.UNetPlusPlus`), built from ``network_kwargs``; the encoder fields of an
    architecture without an encoder are None. The image side follows the architecture's rule: a multiple of the
    DINOv2 patch (14), of 16 for U-Net++ (four poolings), of the product of the strides for the UNet.

    Args:
        encoder_name: timm DINOv2 model name. Defaults to ``"vit_small_patch14_dinov2"``.
        encoder_kwargs: extra ``timm.create_model`` arguments (e.g. ``{"depth": 2}``), or None.
        image_size: the network's input side. Defaults to 224.
        fusion: skip fusion, one of :data:`FUSION_MODES`. Defaults to ``"daf"`` (eqs. 8-9).
        refine: refinement, one of :data:`REFINE_MODES`. Defaults to ``"fdconv"`` (eqs. 10-11).
        image_mean: per-channel mean subtracted from images in [0, 1] (also the masks shown to Stage-1). Defaults
            to DINOv2's ImageNet mean.
        image_std: per-channel divisor (> 0). Defaults to DINOv2's ImageNet std.
        in_channels: image channels. Defaults to 3.
        out_channels: output channels of the network (1: a binary sigmoid output). Defaults to 1.
        label_classes: the 2D bundle's ``label_classes`` (None: binary masks). Defaults to None.
        num_classes: the Synapse bundle's number of classes, background included (None elsewhere).
        architecture: a name of :data:`~spectraflow_monai.utils.architectures.ARCHITECTURES`. Defaults to
            ``"spectraflow"``.
        network_kwargs: the arguments of the architecture's network besides its channels and what it takes from
            these settings (e.g. U-Net++'s ``features``, ``norm``), or None (SpectraFlow takes none). Defaults to
            None.
        hu_window: the Synapse bundle's CT window ``[a_min, a_max]`` in HU (None elsewhere).
        label_map: the Synapse bundle's ``{source label value: class}`` (None: the presets' BTCV map, or the
            identity); predictions carry the source values back.
        class_names: the name of every class, background first (the Synapse bundle's ``class_names``), or None.
        nonfinite: the Synapse bundle's rule for NaN / infinite voxels, one of :data:`NONFINITE_MODES`, or None.
        nonfinite_value: the replacement of ``nonfinite: replace`` (None: the window's lower bound).

    Raises:
        SettingError: (a ``ValueError``) a value out of its range, naming the setting and the value.
    """

    encoder_name: Any = "vit_small_patch14_dinov2"
    encoder_kwargs: Any = None
    image_size: int = 224
    fusion: Any = "daf"
    refine: Any = "fdconv"
    image_mean: tuple[float, ...] = IMAGENET_MEAN
    image_std: tuple[float, ...] = IMAGENET_STD
    in_channels: int = 3
    out_channels: int = 1
    label_classes: Any = None
    num_classes: Any = None
    architecture: str = "spectraflow"
    network_kwargs: Any = None
    hu_window: Any = None
    label_map: Any = None
    class_names: Any = None
    nonfinite: Any = None
    nonfinite_value: Any = None

    def __post_init__(self) -> None:
        entry = architecture(self.architecture)
        if self.network_kwargs is not None and not isinstance(self.network_kwargs, Mapping):
            raise SettingError(f"network_kwargs must be a mapping or null, got {self.network_kwargs!r}.")
        entry.check_network_kwargs(self.network_kwargs)
        if entry.has_encoder:
            if not isinstance(self.encoder_name, str) or not self.encoder_name:
                raise SettingError(f"encoder_name must be a timm model name, got {self.encoder_name!r}.")
            if self.encoder_kwargs is not None and not isinstance(self.encoder_kwargs, Mapping):
                raise SettingError(f"encoder_kwargs must be a mapping or null, got {self.encoder_kwargs!r}.")
            _choice("fusion", self.fusion, FUSION_MODES)
            _choice("refine", self.refine, REFINE_MODES)
        else:  # no DINOv2 encoder: its settings are not read, and recorded as null
            for name in ENCODER_FIELDS:
                object.__setattr__(self, name, None)
        check_image_size(self.image_size, multiple=self.size_multiple())
        _number("in_channels", self.in_channels, 1, integer=True)
        _number("out_channels", self.out_channels, 1, integer=True)
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or len(value) != self.in_channels:
                raise SettingError(
                    f"{name} must be a list of {self.in_channels} numbers (one per channel), got {value!r}."
                )
            numbers = tuple(_number(name, v, -math.inf if name == "image_mean" else 0.0, low_open=name == "image_std")
                            for v in value)
            object.__setattr__(self, name, numbers)
        object.__setattr__(self, "image_size", int(self.image_size))
        for name in ("encoder_kwargs", "network_kwargs", "label_classes", "class_names"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _plain_value(getattr(self, name)))
        self._check_preprocessing()

    def _check_preprocessing(self) -> None:
        """The Synapse bundle's preprocessing fields (None: not this bundle's)."""
        if self.hu_window is not None:
            window = self.hu_window
            if isinstance(window, (str, bytes)) or not isinstance(window, (list, tuple)) or len(window) != 2:
                raise SettingError(f"hu_window must be [a_min, a_max], got {window!r}.")
            low, high = (_number("hu_window", v, -math.inf) for v in window)
            if low >= high:
                raise SettingError(f"hu_window must be [a_min, a_max] with a_min < a_max, got {window!r}.")
            object.__setattr__(self, "hu_window", (low, high))
        if self.label_map is not None:
            if not isinstance(self.label_map, Mapping):
                raise SettingError(f"label_map must be a mapping {{source value: class}}, got {self.label_map!r}.")
            try:
                mapping = {int(k): int(v) for k, v in self.label_map.items()}
            except (TypeError, ValueError) as exc:
                raise SettingError(f"label_map must map integers to integers, got {self.label_map!r}.") from exc
            object.__setattr__(self, "label_map", mapping)
        if self.nonfinite is not None:
            _choice("nonfinite", self.nonfinite, NONFINITE_MODES)
        if self.nonfinite_value is not None:
            object.__setattr__(self, "nonfinite_value", _number("nonfinite_value", self.nonfinite_value, -math.inf))

    @property
    def architecture_entry(self) -> Architecture:
        """The registered architecture (:func:`~spectraflow_monai.utils.architectures.architecture`): its network
        class and arguments, size rule, encoder and export support."""
        return architecture(self.architecture)

    @property
    def has_encoder(self) -> bool:
        """Whether the network has a DINOv2 encoder (the architecture's; SpectraFlowNet has, the baselines have none):
        only then do the encoder fields, an encoder start (Stage-1 export, pretrained, random) and Stage-1 apply."""
        return self.architecture_entry.has_encoder

    def size_multiple(self) -> int:
        """What the image side must be a multiple of, by the architecture's rule: the DINOv2 patch (14) for
        SpectraFlow, 16 for U-Net++ (four poolings by 2), the product of the strides for the UNet."""
        return self.architecture_entry.size_multiple(dict(self.network_kwargs or {}))

    def encoder(self) -> dict[str, Any]:
        """The encoder part of the record: what builds the encoder alone and normalises its input (encoder name and
        arguments, image size, mean and std). Stage-1 writes it beside its export (``encoder_stage1.json``); Stage-2
        compares its own with it before it starts from the export."""
        return {name: _plain_value(getattr(self, name)) for name in ENCODER_RECORD}


@dataclasses.dataclass(frozen=True)
class DataSettings(SettingsObject):
    """Which data a run reads: the source and its selection (the bundle README's "Your own data").

    Args:
        dataset: the data set preset (``synthetic``, ``kvasir``, ``folder``, ``btcv``, ...).
        data_list_file_path: a Decathlon-style datalist JSON (then the data source), or None.
        data_fraction: share of the training images used (low-data runs), in (0, 1].
        val_fraction: share of the training images held out for validation when the source has no validation
            list, in [0, 1).
        data_seed: the seed of the data selection and of the run's determinism.
        data_options: the bundle's own data settings (reader options; the Synapse bundle's
            :class:`~spectraflow_monai.apps.synapse.SynapseDataOptions`), recorded whole.
        allow_empty_masks: train on masks that are all background (a warning instead of an error).
        data_path: ``monai`` (per-sample augmentation in worker processes) or ``device`` (the cache on the training
            device, batched augmentation there); the two draw different random numbers, so a run records it.
    """

    dataset: str = "synthetic"
    data_list_file_path: Any = None
    data_fraction: float = 1.0
    val_fraction: float = 0.2
    data_seed: int = 0
    data_options: Any = None
    allow_empty_masks: bool = False
    data_path: str = "monai"

    def __post_init__(self) -> None:
        _number("data_fraction", self.data_fraction, 0.0, 1.0, low_open=True)
        if _number("val_fraction", self.val_fraction, 0.0, 1.0) >= 1.0:
            raise SettingError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}.")
        _number("data_seed", self.data_seed, -(2**63), 2**63, integer=True)
        if self.data_list_file_path is not None:
            object.__setattr__(self, "data_list_file_path", str(self.data_list_file_path))
        options = self.data_options.to_dict() if isinstance(self.data_options, SettingsObject) else self.data_options
        object.__setattr__(self, "data_options", _plain_value(dict(options or {})))
        _choice("data_path", self.data_path, DATA_PATHS)
        if not isinstance(self.allow_empty_masks, bool):
            raise SettingError(f"allow_empty_masks must be true or false, got {self.allow_empty_masks!r}.")


@dataclasses.dataclass(frozen=True)
class Stage2Settings(SettingsObject):
    """How Stage-2 fine-tunes (Chen et al., Sec. 4.2 and 5.2): encoder start, optimisation, the boundary weight.

    Args:
        pretrained_weights: where the encoder's weights come from when ``encoder_init`` is ``pretrained`` (or
            ``auto`` without a Stage-1 export): ``timm`` | a DINOv2 checkpoint file | ``none``.
        encoder_init: ``auto`` (the Stage-1 export when there is one, else ``pretrained_weights``; the run logs and
            records which) | ``stage1`` (the Stage-1 export; an error when it is missing) | ``pretrained`` |
            ``random``.
        trainable_blocks: encoder blocks trained (the paper: 1, the last; ``all``).
        batch_size: mini-batch size (> 1: DAF's global branch has BatchNorm).
        learning_rate, weight_decay: AdamW's (the 2D bundle's ``configs/unetpp_zhou_literal_baseline.yaml`` uses
            ``weight_decay`` as the L2 coefficient of the convolution kernels under Adam).
        min_learning_rate, lr_factor, lr_patience: the plateau schedule on validation Dice.
        boundary_beta, boundary_beta_max, boundary_ramp_epochs: the boundary term's weight ramp (eq. 7).
    """

    pretrained_weights: Any = "timm"
    encoder_init: str = "auto"
    trainable_blocks: Any = 1
    batch_size: int = 8
    learning_rate: float = 1e-4
    weight_decay: float = 1e-4
    min_learning_rate: float = 1e-6
    lr_factor: float = 0.5
    lr_patience: int = 5
    boundary_beta: float = 0.01
    boundary_beta_max: float = 0.1
    boundary_ramp_epochs: int = 20

    def __post_init__(self) -> None:
        _choice("encoder_init", self.encoder_init, ENCODER_INITS)
        if self.trainable_blocks != "all":
            _number("trainable_blocks", self.trainable_blocks, 0, integer=True)
        _number("batch_size", self.batch_size, 2, integer=True)
        _number("learning_rate", self.learning_rate, 0.0, low_open=True)
        _number("weight_decay", self.weight_decay)
        _number("min_learning_rate", self.min_learning_rate)
        _number("lr_factor", self.lr_factor, 0.0, 1.0, low_open=True)
        _number("lr_patience", self.lr_patience, 0, integer=True)
        _number("boundary_beta", self.boundary_beta)
        _number("boundary_beta_max", self.boundary_beta_max)
        _number("boundary_ramp_epochs", self.boundary_ramp_epochs, 0, integer=True)
        object.__setattr__(self, "pretrained_weights", str(self.pretrained_weights))


def _path(name: str, value: Any) -> str:
    """A folder or file setting as a ``str``: a non-empty text or path, else a :class:`SettingError` naming it."""
    if isinstance(value, (str, os.PathLike)) and os.fspath(value) != "":
        return os.fspath(value)
    raise SettingError(f"{name} must be a path, got {value!r}.")


def _check_device(value: Any) -> None:
    """``value`` names a torch device (a ``torch.device`` or a text such as ``cpu``, ``cuda:1``), else a
    :class:`SettingError` naming it (torch is imported here, where a run's settings are built)."""
    import torch

    try:
        if isinstance(value, bool) or not isinstance(value, (str, torch.device)):
            raise TypeError
        torch.device(value)
    except (TypeError, RuntimeError, ValueError):
        raise SettingError(
            f"device must be a torch device or its name (e.g. 'cpu', 'cuda:0'), got {value!r}."
        ) from None


@dataclasses.dataclass(frozen=True)
class RunSettings(SettingsObject):
    """How and where a run executes, as opposed to what it computes: the device, data loading, logging, resuming,
    the folders it writes and its budgets. A run records them but a restart may change them (more epochs, another
    device, more workers), so the run record does not compare them.

    Args:
        bundle_root: the bundle's run folder. Defaults to ``"."``.
        device: the training device (a ``torch.device`` or its name). Defaults to ``"cpu"``.
        precision: one of :data:`PRECISION_SETTINGS` (``auto``: bf16 where the device computes it natively, else
            fp32 on the CPU and fp16 on CUDA); the stage programs resolve it on ``device``
            (:func:`~spectraflow_monai.utils.resolve_precision`, logged) and record the resolved precision, which a
            restart compares. Defaults to ``"auto"``.
        num_workers: data loading processes. Defaults to 2.
        cache_rate: share of the data cached. Defaults to 1.0.
        cache_device: with ``data_path: device``, where the cache lives, one of :data:`CACHE_DEVICES`: ``auto`` |
            ``cpu`` | ``cuda``. Defaults to ``"auto"``.
        progress_bar: show progress bars. Defaults to True.
        log_every: iterations between reads of the loss on the host (1: every iteration). Defaults to 1.
        resume: continue from the newest checkpoint of the run folder (false: start over, the earlier run set
            aside); ``true`` / ``false``, also as a command line's text, made a ``bool`` here, once. The run record
            and the checkpoint loader follow one decision of it
            (:func:`~spectraflow_monai.utils.run_record.decide_restart`). Defaults to True.
        resume_from: Stage-1: an explicit checkpoint file to continue from (an existing file), or None (an empty
            text reads as None). Defaults to None.
        dataset_dir: the data's folder (the data themselves are compared by their fingerprints), a path or None.
            Defaults to None.
        cache_dir: where the bundle caches data derived from them (the Synapse bundle's slice cache), a path or None.
        log_dir: TensorBoard and error logs. Defaults to ``"logs"``.
        model_path: Stage-2's best model (its :class:`ModelSettings` beside it, ``model.json``).
        stage1_encoder: the Stage-1 encoder export (Stage-2's start; its settings beside it).
        stage1_dir, stage2_dir: each stage's resumable checkpoints and run record.
        val_interval: epochs between validations. Defaults to 1.
        val_batch_size: validation batch size. Defaults to 8.
        early_stop_patience: epochs without a better validation Dice before Stage-2 stops. Defaults to 15.
        stage2_checkpoints_kept: Stage-2 checkpoints kept while it runs. Defaults to 2.
        stage1_epochs: Stage-1's epochs (a finished run given more trains on). Defaults to 300.
        stage1_checkpoint_interval: epochs between Stage-1 checkpoints. Defaults to 1.
        stage1_checkpoints_kept: Stage-1 checkpoints kept while it runs. Defaults to 2.
        distance_backend: the boundary loss's signed distance maps, one of :data:`DISTANCE_BACKENDS`: ``auto`` |
            ``torch`` | ``cucim`` | ``scipy`` (all exact, equal within 1e-5). Defaults to ``"auto"``.

    Every field is checked here, where the object is built: ``device`` must name a torch device (a
    ``torch.device`` or its name, e.g. ``cuda:1``).

    Raises:
        SettingError: (a ``ValueError``) a value out of its range or of the wrong kind, naming the setting and the
            value.
    """

    bundle_root: Any = "."
    device: Any = "cpu"
    precision: str = "auto"
    num_workers: int = 2
    cache_rate: float = 1.0
    cache_device: str = "auto"
    progress_bar: bool = True
    log_every: int = 1
    resume: Any = True
    resume_from: Any = None
    dataset_dir: Any = None
    cache_dir: Any = None
    log_dir: Any = "logs"
    model_path: Any = os.path.join("models", "model.pt")
    stage1_encoder: Any = os.path.join("models", "encoder_stage1.pt")
    stage1_dir: Any = os.path.join("models", "stage1")
    stage2_dir: Any = os.path.join("models", "stage2")
    val_interval: int = 1
    val_batch_size: int = 8
    early_stop_patience: int = 15
    stage2_checkpoints_kept: int = 2
    stage1_epochs: int = 300
    stage1_checkpoint_interval: int = 1
    stage1_checkpoints_kept: int = 2
    distance_backend: str = "auto"

    def __post_init__(self) -> None:
        _check_device(self.device)
        check_precision_setting(self.precision)
        _choice("cache_device", self.cache_device, CACHE_DEVICES)
        _choice("distance_backend", self.distance_backend, DISTANCE_BACKENDS)
        object.__setattr__(self, "resume", as_bool(self.resume, "resume"))
        resume_from = self.resume_from if self.resume_from in (None, "") else _path("resume_from", self.resume_from)
        resume_from = resume_from or None
        if resume_from is not None and not os.path.isfile(resume_from):
            raise SettingError(f"resume_from: {resume_from!r} is not an existing checkpoint file.")
        object.__setattr__(self, "resume_from", resume_from)
        for name in ("dataset_dir", "cache_dir"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _path(name, getattr(self, name)))
        _number("num_workers", self.num_workers, 0, integer=True)
        _number("cache_rate", self.cache_rate, 0.0, 1.0)
        object.__setattr__(self, "progress_bar", as_bool(self.progress_bar, "progress_bar"))
        _number("log_every", self.log_every, 1, integer=True)
        for name in ("val_interval", "val_batch_size", "stage1_epochs", "stage1_checkpoint_interval"):
            _number(name, getattr(self, name), 1, integer=True)
        for name in ("early_stop_patience", "stage2_checkpoints_kept", "stage1_checkpoints_kept"):
            _number(name, getattr(self, name), 0, integer=True)
        for name in ("bundle_root", "log_dir", "model_path", "stage1_encoder", "stage1_dir", "stage2_dir"):
            object.__setattr__(self, name, _path(name, getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON data (the device and folders by name)."""
        return {name: value if value is None or isinstance(value, (bool, int, float)) else str(value)
                for name, value in settings_dict(self).items()}


@dataclasses.dataclass(frozen=True)
class InferenceSettings(SettingsObject):
    """What an inference run (a bundle's ``configs/inference.yaml``) segments and where it writes, as one object
    that the run's datalist and writers read (``inference_settings: {_target_: ..., input_dir: ...}``, given on the
    command line as ``--inference_settings#input_dir /data/images``). Each bundle adds what its outputs need
    (:class:`~spectraflow_monai.apps.seg2d.ImageInferenceSettings`,
    :class:`~spectraflow_monai.apps.synapse.VolumeInferenceSettings`); the model's own settings come from its
    record, never from here.

    Args:
        input_dir: the folder of inputs, or None when ``data_list_file_path`` is given (then it is not read).
            Defaults to None.
        input_pattern: glob of the inputs in ``input_dir``. Defaults to ``"*"``.
        data_list_file_path: a Decathlon datalist JSON whose ``test`` list is segmented instead of ``input_dir``, or
            None (an empty text reads as None). Defaults to None.
        dataset_dir: base of the JSON's relative paths (None: the JSON's folder). Defaults to None.
        output_dir: the folder the predictions are written into. Defaults to ``"predictions"``.

    Raises:
        SettingError: (a ``ValueError``) a value of the wrong kind, or neither ``input_dir`` nor
            ``data_list_file_path`` given, naming the setting and the value.
    """

    input_dir: Any = None
    input_pattern: str = "*"
    data_list_file_path: Any = None
    dataset_dir: Any = None
    output_dir: Any = "predictions"

    def __post_init__(self) -> None:
        for name in ("input_dir", "data_list_file_path", "dataset_dir"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value in (None, "") else _path(name, value))
        if self.input_dir is None and self.data_list_file_path is None:
            raise SettingError("give input_dir (a folder of inputs) or data_list_file_path (a datalist JSON).")
        if not isinstance(self.input_pattern, str) or not self.input_pattern:
            raise SettingError(f"input_pattern must be a glob pattern such as '*.png', got {self.input_pattern!r}.")
        object.__setattr__(self, "output_dir", _path("output_dir", self.output_dir))

    #: the bundle's listing of its inputs, ``(input_dir, input_pattern, data_list_file_path, dataset_dir,
    #: require_any=...) -> list`` (set by each bundle's settings class)
    list_inputs: ClassVar[Any] = None

    def inputs(self, require_any: bool = True) -> list:
        """What the run segments: the ``test`` list of ``data_list_file_path`` when given, else the inputs of
        ``input_dir`` matching ``input_pattern`` (the bundle's :attr:`list_inputs`); ``require_any``: none found stops
        the run naming where nothing was found."""
        if self.list_inputs is None:
            raise NotImplementedError(f"{type(self).__name__} does not say how its inputs are listed (list_inputs).")
        return self.list_inputs(
            self.input_dir, self.input_pattern, self.data_list_file_path, self.dataset_dir, require_any=require_any
        )


@dataclasses.dataclass(frozen=True)
class Stage1Settings(SettingsObject):
    """How Stage-1 pretrains (Chen et al., Sec. 4.1 and 5.2): Mixed-Domain MeanFlow + dispersive loss, or the
    mixed-domain MAE of the Table 2 ablation (``stage1_objective: mae``).

    Args:
        pretrained_weights: where the encoder starts: ``timm`` (the paper's DINOv2 weights) | a file | ``none``.
        stage1_objective: one of :data:`STAGE1_OBJECTIVES`.
        stage1_batch_size, stage1_accumulation_steps: per-process mini-batch and gradient accumulation (global
            batch = their product times the processes; the paper: 8).
        stage1_start_lr, stage1_end_lr, stage1_weight_decay: AdamW with a linear decay from start to end.
        mask_ratio: share of every mini-batch shown as masks (0: image-only MeanFlow).
        stage1_views: ``either`` (each pair as its image or its mask) | ``both``.
        dispersive_weight, dispersive_variant, dispersive_tau, dispersive_normalize: lambda and the form of eq. 4-5.
        meanflow_ratio_unequal, meanflow_adaptive_p, meanflow_adaptive_c: MeanFlow's time sampling and weight.
        ema_decay: the exported encoder's EMA.
        head_hidden_channels, head_num_blocks, head_condition_on_domain: the MeanFlow head.
        latent_norm: per-token normalisation of z0 (an extension of eq. 1).
        mae_mask_ratio, mae_norm_pix_loss, mae_decoder_hidden_size, mae_decoder_num_layers, mae_decoder_num_heads,
            mae_dispersive_weight: the MAE objective's (read with ``stage1_objective: mae`` only).
    """

    pretrained_weights: Any = "timm"
    stage1_objective: str = "meanflow"
    stage1_batch_size: int = 8
    stage1_accumulation_steps: int = 1
    stage1_start_lr: float = 1e-5
    stage1_end_lr: float = 1e-6
    stage1_weight_decay: float = 0.05
    mask_ratio: float = 0.5
    stage1_views: str = "either"
    dispersive_weight: float = 0.4
    dispersive_variant: str = "infonce_l2"
    dispersive_tau: float = 0.5
    dispersive_normalize: Any = "dim"
    meanflow_ratio_unequal: float = 0.25
    meanflow_adaptive_p: float = 1.0
    meanflow_adaptive_c: float = 0.01
    ema_decay: float = 0.999
    head_hidden_channels: int = 256
    head_num_blocks: int = 2
    head_condition_on_domain: bool = False
    latent_norm: bool = True
    mae_mask_ratio: float = 0.75
    mae_norm_pix_loss: bool = True
    mae_decoder_hidden_size: int = 256
    mae_decoder_num_layers: int = 2
    mae_decoder_num_heads: int = 8
    mae_dispersive_weight: float = 0.0

    def __post_init__(self) -> None:
        _choice("stage1_objective", self.stage1_objective, STAGE1_OBJECTIVES)
        _choice("stage1_views", self.stage1_views, ("either", "both"))
        _number("stage1_batch_size", self.stage1_batch_size, 2, integer=True)
        _number("stage1_accumulation_steps", self.stage1_accumulation_steps, 1, integer=True)
        _number("stage1_start_lr", self.stage1_start_lr, 0.0, low_open=True)
        _number("stage1_end_lr", self.stage1_end_lr)
        _number("stage1_weight_decay", self.stage1_weight_decay)
        _number("mask_ratio", self.mask_ratio, 0.0, 1.0)
        _number("dispersive_weight", self.dispersive_weight)
        _number("meanflow_ratio_unequal", self.meanflow_ratio_unequal, 0.0, 1.0)
        _number("ema_decay", self.ema_decay, 0.0, 1.0)
        _number("mae_mask_ratio", self.mae_mask_ratio, 0.0, 1.0)
        for name in ("head_condition_on_domain", "latent_norm", "mae_norm_pix_loss"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        object.__setattr__(self, "pretrained_weights", str(self.pretrained_weights))
