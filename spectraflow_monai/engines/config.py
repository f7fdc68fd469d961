"""The options of the Stage-1 trainers, grouped by concern into small frozen objects.

:class:`~spectraflow_monai.engines.Stage1Trainer` takes the arguments of a MONAI ``Trainer`` (device, data, handlers,
``amp``, ...) one by one, and what is its own in three objects: the dispersive term (:class:`DispersiveConfig`), the
EMA of the encoder (:class:`EMAConfig`) and how the gradients of the mini-batches become an optimizer step
(:class:`GradientConfig`). The objectives add theirs: :class:`MeanFlowConfig` (``MeanFlowPretrainer``) and
:class:`MAEConfig` (``MAEPretrainer``). Each object checks its values where it is built and raises a ``ValueError``
naming the object, the argument and the value.

Example::

    MeanFlowPretrainer(
        "cuda", 300, loader, encoder, head, optimizer,
        meanflow=MeanFlowConfig(latent_norm=True),
        dispersive=DispersiveConfig(weight=0.4),
        ema=EMAConfig(decay=0.999),
        gradients=GradientConfig(accumulation_steps=2),
    )
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["DispersiveConfig", "EMAConfig", "GradientConfig", "MAEConfig", "MeanFlowConfig"]


def _is_number(value: Any) -> bool:
    """A real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_callable(owner: str, name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise ValueError(f"{owner}: {name} must be callable or None, got {type(value).__name__}.")


@dataclass(frozen=True)
class DispersiveConfig:
    """The dispersive term ``λ·L_Disp`` of SpectraFlow's eq. 4 (Wang & He 2025, "Diffuse and Disperse").

    Args:
        weight: ``λ``, a finite number ``>= 0``; 0 disables the term. Defaults to 0.4 (the paper's).
        loss: the dispersive loss on the pooled penultimate-block features, ``loss(pooled)``. None:
            ``DispersiveLoss()`` when ``weight > 0``. Defaults to None.

    Raises:
        ValueError: ``weight`` is not a finite number ``>= 0``, or ``loss`` is not callable.
    """

    weight: float = 0.4
    loss: Callable | None = None

    def __post_init__(self) -> None:
        if not (_is_number(self.weight) and math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"DispersiveConfig: weight must be a finite number >= 0, got {self.weight!r}.")
        _check_callable("DispersiveConfig", "loss", self.loss)


@dataclass(frozen=True)
class EMAConfig:
    """The exponential moving average of the encoder (ignite's ``EMAHandler``), the weights Stage-2 starts from.

    Args:
        decay: EMA decay in ``(0, 1)``; the handler's momentum is ``1 - decay``. Defaults to 0.999 (the paper's).
        encoder: a module of the encoder's architecture that holds the EMA weights (they are overwritten with the
            encoder's), so that other objects can reference the EMA model before the trainer exists. None: a deep
            copy of the encoder. Defaults to None.

    Raises:
        ValueError: ``decay`` is not in ``(0, 1)``, or ``encoder`` is not an ``nn.Module``.
    """

    decay: float = 0.999
    encoder: nn.Module | None = None

    def __post_init__(self) -> None:
        if not (_is_number(self.decay) and 0 < self.decay < 1):
            raise ValueError(f"EMAConfig: decay must be a number in (0, 1), got {self.decay!r}.")
        if self.encoder is not None and not isinstance(self.encoder, nn.Module):
            raise ValueError(f"EMAConfig: encoder must be an nn.Module or None, got {type(self.encoder).__name__}.")


@dataclass(frozen=True)
class GradientConfig:
    """How the gradients of the mini-batches become one optimizer step: accumulated over ``accumulation_steps``
    mini-batches, then (multi-process) averaged across the processes as ``DistributedDataParallel`` does.

    Global batch = ``batch_size × accumulation_steps × world_size`` (the paper uses 8).

    Args:
        accumulation_steps: mini-batches per optimizer step, a positive int. Defaults to 1.
        distributed: all-reduce the gradients across processes. None: when ``torch.distributed`` is initialised
            with world size > 1 (checked at the start of every run); True: require an initialised process group;
            False: never. Defaults to None.
        bucket_mb: size of the flat gradient buckets of the all-reduce, in MiB, ``> 0``. Defaults to 25.

    Raises:
        ValueError: a value of the wrong type or out of range, named with its value.
    """

    accumulation_steps: int = 1
    distributed: bool | None = None
    bucket_mb: float = 25.0

    def __post_init__(self) -> None:
        if not (_is_int(self.accumulation_steps) and self.accumulation_steps >= 1):
            raise ValueError(
                f"GradientConfig: accumulation_steps must be a positive int, got {self.accumulation_steps!r}."
            )
        if self.distributed is not None and not isinstance(self.distributed, bool):
            raise ValueError(f"GradientConfig: distributed must be None, True or False, got {self.distributed!r}.")
        if not (_is_number(self.bucket_mb) and math.isfinite(self.bucket_mb) and self.bucket_mb > 0):
            raise ValueError(f"GradientConfig: bucket_mb must be a finite number > 0, got {self.bucket_mb!r}.")


@dataclass(frozen=True)
class MeanFlowConfig:
    """The MeanFlow objective of :class:`~spectraflow_monai.engines.MeanFlowPretrainer` (SpectraFlow eqs. 1-3).

    Args:
        loss: the MeanFlow loss ``loss(head, z0, domain=...)``; its ``compute`` method (returning ``{"loss",
            "mse"}``) is used when present. None: ``MeanFlowLoss()``. Defaults to None.
        latent_norm: normalise ``z0`` per token (:func:`~spectraflow_monai.engines.normalize_latent`), so that it
            has the unit scale of the noise; False regresses the raw final token map, eq. 1 as printed (bundle
            setting ``latent_norm``). Defaults to True.
        condition_on_domain: pass the image/mask domain flag to the head. None: when the head has
            ``num_domains > 0``. Defaults to None.

    Raises:
        ValueError: ``loss`` is not callable, or a flag is not a bool (``condition_on_domain``: or None).
    """

    loss: Callable | None = None
    latent_norm: bool = True
    condition_on_domain: bool | None = None

    def __post_init__(self) -> None:
        _check_callable("MeanFlowConfig", "loss", self.loss)
        if not isinstance(self.latent_norm, bool):
            raise ValueError(f"MeanFlowConfig: latent_norm must be True or False, got {self.latent_norm!r}.")
        if self.condition_on_domain is not None and not isinstance(self.condition_on_domain, bool):
            raise ValueError(
                f"MeanFlowConfig: condition_on_domain must be None, True or False, got {self.condition_on_domain!r}."
            )


@dataclass(frozen=True)
class MAEConfig:
    """The masked-autoencoder objective of :class:`~spectraflow_monai.engines.MAEPretrainer` (He et al. 2022).

    Args:
        loss: ``loss(pred, images, mask)``. None: ``MAELoss(patch_size=<the encoder's>, check_mask=False)``.
            Defaults to None.
        mask_ratio: fraction of the patches removed per sample, in ``(0, 1)`` (MAE: 0.75). Not the mixed-domain
            ratio of masks in a batch, which the data loader sets. Defaults to 0.75.

    Raises:
        ValueError: ``loss`` is not callable, or ``mask_ratio`` is not in ``(0, 1)``.
    """

    loss: Callable | None = None
    mask_ratio: float = 0.75

    def __post_init__(self) -> None:
        _check_callable("MAEConfig", "loss", self.loss)
        if not (_is_number(self.mask_ratio) and 0 < self.mask_ratio < 1):
            raise ValueError(f"MAEConfig: mask_ratio must be a number in (0, 1), got {self.mask_ratio!r}.")
