"""Export of the Stage-1 encoder for Stage-2: a timm-layout state dict written atomically, by hand or by a handler.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Sec. "Stage-2: Segmentation Finetuning") initialises the Stage-2 encoder from Stage-1 and discards the
MeanFlow head (or the MAE decoder). :func:`save_encoder_export` writes the encoder's weights in the layout of timm's
``VisionTransformer``, which ``DINOv2Encoder(pretrained=path)`` loads; :class:`EncoderExportHandler` does it from a
Stage-1 trainer (:class:`~spectraflow_monai.engines.MeanFlowPretrainer`,
:class:`~spectraflow_monai.engines.MAEPretrainer`) during and at the end of training.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import EMAHandler
from torch import nn

from spectraflow_monai.utils.checkpoint import atomic_torch_save, check_finite_state, cpu_state_dict
from spectraflow_monai.utils.run_record import write_model_settings

__all__ = ["EncoderExportHandler", "encoder_export_state_dict", "save_encoder_export"]

_PARALLEL_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def encoder_export_state_dict(encoder: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copy of an encoder's weights in timm layout (``encoder.vit.state_dict()`` when it has ``vit``).

    Args:
        encoder: a :class:`spectraflow_monai.networks.encoders.DINOv2Encoder` (its timm ``vit`` is exported), an
            ignite ``EMAHandler`` (its ``ema_model`` is exported) or any module (its own state dict).
    """
    if isinstance(encoder, EMAHandler):
        encoder = encoder.ema_model
    if isinstance(encoder, _PARALLEL_WRAPPERS):
        encoder = encoder.module
    if not isinstance(encoder, nn.Module):
        raise ValueError(f"encoder must be an nn.Module or an EMAHandler, got {type(encoder).__name__}.")
    module = encoder.vit if isinstance(getattr(encoder, "vit", None), nn.Module) else encoder
    return cpu_state_dict(module.state_dict())


def save_encoder_export(encoder: nn.Module, path: str | os.PathLike, settings: Mapping | None = None) -> Path:
    """Atomically write :func:`encoder_export_state_dict` of ``encoder`` to ``path``.

    The file is a plain state dict of tensors (loadable with ``torch.load(..., weights_only=True)``) that
    ``DINOv2Encoder(model_name=..., pretrained=path)`` and ``DINOv2Encoder.load_weights(path)`` accept. With
    ``settings`` (the encoder settings of the run), they are written beside it (``encoder_stage1.pt`` ->
    ``encoder_stage1.json``), so that Stage-2 can name a setting that does not fit the export.

    Raises:
        NonFiniteStateError: a weight holds NaN or inf; nothing is written (an earlier export is kept).
    """
    state = encoder_export_state_dict(encoder)
    check_finite_state(state, os.fspath(path))
    saved = atomic_torch_save(state, path)
    if settings is not None:
        write_model_settings(path, settings)
    return saved


class EncoderExportHandler:
    """Ignite handler writing the Stage-1 encoder for Stage-2 fine-tuning (SpectraFlow, Chen et al.).

    SpectraFlow Stage-2 initialises its encoder "from Stage-1"; the MeanFlow head is discarded. This handler saves
    the encoder (by default the EMA encoder of a Stage-1 trainer, i.e. the EMA-0.999-stabilised weights)
    as a timm-layout state dict, atomically (temporary file + ``os.replace``), on rank 0 only, at
    ``Events.COMPLETED`` and, when ``epoch_level``, every ``interval`` epochs. ``DINOv2Encoder(pretrained=path)``
    loads the file.

    Args:
        encoder: the module to export: a ``DINOv2Encoder``, an ignite ``EMAHandler`` (its ``ema_model``) or any
            module. ``None`` resolves at save time to ``engine.ema_encoder`` when the engine has one (EMA enabled),
            else ``engine.encoder``. Defaults to ``None``.
        path: destination file. Defaults to ``"encoder_stage1.pt"``.
        epoch_level: also save after every ``interval`` epochs (the file is overwritten). Defaults to True.
        interval: epoch interval when ``epoch_level``, ``>= 1``. Defaults to 1.
        settings: the encoder settings of the run, written beside the export (:func:`save_encoder_export`).
            Defaults to None.

    Example (bundle config)::

        {"_target_": "spectraflow_monai.handlers.EncoderExportHandler", "path": "$@ckpt_dir + '/encoder_ema.pt'"}
    """

    def __init__(
        self,
        encoder: nn.Module | EMAHandler | None = None,
        path: str | os.PathLike = "encoder_stage1.pt",
        epoch_level: bool = True,
        interval: int = 1,
        settings: Mapping | None = None,
    ) -> None:
        if encoder is not None and not isinstance(encoder, (nn.Module, EMAHandler)):
            raise ValueError(f"encoder must be None, an nn.Module or an EMAHandler, got {type(encoder).__name__}.")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"path must be a non-empty file path, got {path!r}.")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be a positive int, got {interval!r}.")
        self.encoder = encoder
        self.path = Path(os.fspath(path)).expanduser()
        self.epoch_level = bool(epoch_level)
        self.interval = interval
        self._last_saved_iteration: int | None = None
        self.settings = settings

    def attach(self, engine: Engine) -> None:
        """Register the save events on ``engine``."""
        if self.epoch_level:
            engine.add_event_handler(Events.EPOCH_COMPLETED(every=self.interval), self)
        engine.add_event_handler(Events.COMPLETED, self)

    def _resolve(self, engine: Engine) -> nn.Module:
        if self.encoder is not None:
            return self.encoder.ema_model if isinstance(self.encoder, EMAHandler) else self.encoder
        for attr in ("ema_encoder", "encoder"):
            module = getattr(engine, attr, None)
            if isinstance(module, nn.Module):
                return module
        raise ValueError(
            "EncoderExportHandler(encoder=None) needs an engine with an `ema_encoder` or `encoder` module "
            f"(e.g. MeanFlowPretrainer or MAEPretrainer), got {type(engine).__name__}; pass the encoder explicitly."
        )

    def __call__(self, engine: Engine) -> None:
        """Save the encoder unless it was already saved at this iteration (last epoch + completion)."""
        iteration = int(engine.state.iteration)
        if self._last_saved_iteration == iteration and self.path.is_file():
            return
        module = self._resolve(engine)
        if idist.get_rank() == 0:
            save_encoder_export(module, self.path, self.settings)
            engine.logger.info(f"encoder exported to {self.path} (iteration {iteration}).")
        self._last_saved_iteration = iteration
