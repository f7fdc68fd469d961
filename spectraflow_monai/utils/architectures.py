"""The network architectures a model may have, by name: the values of the ``architecture`` model setting.

A model's record (``models/model.json``) names its architecture and the arguments of its network
(``network_kwargs``), as nnU-Net's ``plans.json`` names ``network_arch_class_name`` and its kwargs. Each name here is
one :class:`Architecture` entry of :data:`ARCHITECTURES`: the class that builds the network (a dotted path, imported
by the builder, :func:`~spectraflow_monai.apps.workflow.recorded_network`), how its constructor arguments come from
the model settings (:class:`~spectraflow_monai.utils.settings.ModelSettings`), and its own rules: what the image side
must be a multiple of, whether it has a DINOv2 encoder (then the encoder fields, an encoder start and Stage-1 apply),
and whether ``spectraflow export-onnx`` takes it. An architecture is added with one entry.

This module is at the bottom of the package (names, dotted paths and plain rules; it imports no network).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "PATCH_SIZE",
    "architecture",
    "patch_multiple",
    "pooling_multiple",
    "stride_product",
]

#: patch size of the DINOv2 encoders: the image side of a SpectraFlowNet must be a multiple of it
PATCH_SIZE = 14
#: the arguments every network takes from the settings' channels, never from ``network_kwargs``
CHANNEL_ARGUMENTS: tuple[str, ...] = ("in_channels", "out_channels")


def patch_multiple(network_kwargs: Mapping[str, Any]) -> int:
    """The size rule of a ViT encoder: a multiple of the DINOv2 patch (:data:`PATCH_SIZE`)."""
    return PATCH_SIZE


def pooling_multiple(poolings: int) -> Callable[[Mapping[str, Any]], int]:
    """The size rule of a network with ``poolings`` fixed poolings by 2: a multiple of ``2 ** poolings``."""

    def rule(network_kwargs: Mapping[str, Any]) -> int:
        return 2**poolings

    return rule


def stride_product(default: tuple[int, ...]) -> Callable[[Mapping[str, Any]], int]:
    """The size rule of a network downsampling by its ``strides`` argument (MONAI's ``UNet``): a multiple of their
    product (``default`` when ``network_kwargs`` gives none); a stride may be a number or one per dimension."""

    def rule(network_kwargs: Mapping[str, Any]) -> int:
        multiple = 1
        for stride in network_kwargs.get("strides", default):
            multiple *= math.prod(stride) if isinstance(stride, (list, tuple)) else int(stride)
        return int(multiple)

    return rule


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One architecture of :data:`ARCHITECTURES`: what builds its network from the model settings, and its rules.

    The network is ``network_class(in_channels=..., out_channels=..., **fixed_arguments, <settings arguments>,
    **network_kwargs, <training arguments>)`` (:meth:`arguments`).

    Args:
        name: the value of the ``architecture`` setting (recorded in ``model.json``).
        network_class: the dotted path of the network class (e.g. ``"monai.networks.nets.UNet"``).
        description: what it is, in a few words (listed with the names).
        settings_arguments: ``{constructor argument: ModelSettings field}`` the network takes from the settings
            (SpectraFlowNet: ``{"img_size": "image_size", "encoder": "encoder_name", ...}``). Defaults to none.
        fixed_arguments: constructor arguments that are the same for every model of it (``{"spatial_dims": 2}``).
            Defaults to none.
        network_kwargs: whether the settings' ``network_kwargs`` are passed to the constructor (a baseline's widths,
            norm, ...); False: the architecture takes none, and a non-null ``network_kwargs`` is refused. Defaults to
            True.
        required_kwargs: arguments ``network_kwargs`` must hold (the constructor has no default for them). Defaults
            to none.
        training_arguments: arguments a training stage may add that are not model settings (SpectraFlow's
            ``trainable_blocks``); another architecture is built without them. Defaults to none.
        size_multiple: the image-size rule: ``network_kwargs -> the multiple the image side must be of``.
        has_encoder: whether the network has a DINOv2 encoder: the encoder fields of the settings, an encoder start
            (Stage-1 export, pretrained, random) and Stage-1 apply only then. Defaults to False.
        export: None when ``spectraflow export-onnx`` takes the network, else why it refuses it (one sentence).
            Defaults to None.
    """

    name: str
    network_class: str
    description: str
    size_multiple: Callable[[Mapping[str, Any]], int]
    settings_arguments: Mapping[str, str] = dataclasses.field(default_factory=dict)
    fixed_arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    network_kwargs: bool = True
    required_kwargs: tuple[str, ...] = ()
    training_arguments: tuple[str, ...] = ()
    has_encoder: bool = False
    export: str | None = None

    def check_network_kwargs(self, network_kwargs: Mapping[str, Any] | None) -> None:
        """Refuse ``network_kwargs`` this architecture does not take: any when it takes none, one that another
        source gives (the channels, the settings' and the fixed arguments), a missing required one.

        Raises:
            SettingError: naming the argument and the architecture.
        """
        if not self.network_kwargs:
            if network_kwargs:
                fields = ", ".join(self.settings_arguments.values())
                raise SettingError(f"network_kwargs: architecture {self.name!r} takes none (its arguments are the "
                                   f"settings {fields}), got {dict(network_kwargs)!r}; give null.")  # fmt: skip
            return
        given = dict(network_kwargs or {})
        taken = {*CHANNEL_ARGUMENTS, *self.settings_arguments, *self.fixed_arguments, *self.training_arguments}
        clash = sorted(taken & set(given))
        if clash:
            raise SettingError(f"network_kwargs must not hold {clash} for architecture {self.name!r}: the network "
                               "takes them from the model settings (in_channels, out_channels, ...) or fixes them.")
        missing = [k for k in self.required_kwargs if k not in given]
        if missing:
            raise SettingError(f"network_kwargs must give {missing} for architecture {self.name!r} "
                               f"({self.network_class} has no default for them), got {given!r}.")  # fmt: skip

    def arguments(
        self,
        settings: Any,
        in_channels: int,
        out_channels: int,
        image_size: int | None = None,
        **training: Any,
    ) -> dict[str, Any]:
        """The constructor arguments of the network of ``settings``.

        Args:
            settings: the model settings (a :class:`~spectraflow_monai.utils.settings.ModelSettings` or an object
                with its fields as attributes).
            in_channels: input channels.
            out_channels: output channels.
            image_size: replaces the settings' ``image_size`` when given (a value checked against the record).
            training: :attr:`training_arguments` (None: not given); others are not this architecture's and are left
                out.
        """
        values: dict[str, Any] = {"in_channels": in_channels, "out_channels": out_channels, **self.fixed_arguments}
        for argument, field in self.settings_arguments.items():
            values[argument] = image_size if field == "image_size" and image_size is not None else getattr(
                settings, field
            )
        if self.network_kwargs:
            values.update(dict(getattr(settings, "network_kwargs", None) or {}))
        values.update({k: v for k, v in training.items() if k in self.training_arguments and v is not None})
        return values


#: the registered architectures by name: SpectraFlowNet (the paper's), MONAI's UNet and U-Net++ (the 2D bundle's
#: baselines, ``configs/unet_baseline.yaml``, ``configs/unetpp*_baseline.yaml``)
ARCHITECTURES: dict[str, Architecture] = {
    entry.name: entry
    for entry in (
        Architecture(
            name="spectraflow",
            network_class="spectraflow_monai.networks.SpectraFlowNet",
            description="SpectraFlowNet: DINOv2 encoder, DAF / FDConv decoder",
            settings_arguments={"encoder": "encoder_name", "img_size": "image_size", "encoder_kwargs": "encoder_kwargs",
                                "fusion": "fusion", "refine": "refine"},  # fmt: skip
            network_kwargs=False,
            training_arguments=("trainable_blocks",),
            size_multiple=patch_multiple,
            has_encoder=True,
        ),
        Architecture(
            name="unet",
            network_class="monai.networks.nets.UNet",
            description="MONAI's 2D UNet",
            fixed_arguments={"spatial_dims": 2},
            required_kwargs=("channels", "strides"),
            size_multiple=stride_product((2, 2, 2, 2)),
        ),
        Architecture(
            name="unetpp",
            network_class="spectraflow_monai.networks.UNetPlusPlus",
            description="U-Net++ (Zhou et al.) on MONAI's BasicUNetPlusPlus",
            fixed_arguments={"spatial_dims": 2},
            size_multiple=pooling_multiple(4),
        ),
    )
}


def architecture(name: Any, source: str | None = None) -> Architecture:
    """The registered architecture ``name`` (:data:`ARCHITECTURES`).

    Args:
        name: the ``architecture`` setting.
        source: where the name was read (a record file), for the message. Defaults to None.

    Raises:
        SettingError: an unknown name, in one line listing the registered ones.
    """
    entry = ARCHITECTURES.get(name) if isinstance(name, str) else None
    if entry is None:
        where = f"{source}: " if source else ""
        raise SettingError(f"{where}architecture must be one of the registered architectures {list(ARCHITECTURES)} "
                           f"(spectraflow_monai.utils.architectures), got {name!r}.")  # fmt: skip
    return entry
