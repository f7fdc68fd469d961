"""Where a bundle run's encoder starts: the ``encoder_init`` and ``pretrained_weights`` settings resolved and the
weights loaded (the encoder's ``load_pretrained``), once, in the run's steps before any
training, so that a missing Stage-1 export, a missing file or an unreachable hub stops a run before it trains.

- ``pretrained_weights``, where Stage-1 (and a Stage-2 run without Stage-1) starts: ``"timm"``, a local DINOv2
  checkpoint file, or ``"none"`` (random initialisation);
- ``encoder_init``, where Stage-2 starts: ``"auto"`` (the default: the Stage-1 export when there is one, else
  ``pretrained_weights``, a warning naming the paper's "no Stage-1" row; :func:`resolve_encoder_start`; the run
  record and ``models/model.json`` hold which), ``"stage1"`` (this
  bundle's Stage-1 export; an error naming the file when it is absent), ``"pretrained"`` (``pretrained_weights``:
  the paper's "no Stage-1" row) or ``"random"``.

Evaluation and inference load ``models/model.pt`` only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch.nn as nn

from spectraflow_monai.networks import DINOv2Encoder, SpectraFlowNet
from spectraflow_monai.networks.weights import normalize_weights_source
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.run_record import check_model_digest, check_model_settings
from spectraflow_monai.utils.settings import ENCODER_INITS

__all__ = ["ENCODER_INIT_CHOICES", "NO_STAGE1_ROW", "initialize_encoder", "resolve_encoder_init", "resolve_encoder_start"]

#: values of the Stage-2 setting ``encoder_init``
ENCODER_INIT_CHOICES = ENCODER_INITS
#: the paper's row that a Stage-2 run from ``pretrained_weights`` trains (Table 2, Fig. 4: no Stage-1)
NO_STAGE1_ROW = "no Stage-1"

logger = logging.getLogger(__name__)


def _choice(encoder_init: Any) -> str:
    choice = encoder_init.strip().lower() if isinstance(encoder_init, str) else encoder_init
    if choice not in ENCODER_INIT_CHOICES:
        raise SettingError(f"encoder_init must be one of {list(ENCODER_INIT_CHOICES)}, got {encoder_init!r}.")
    return choice


def resolve_encoder_start(encoder_init: str, stage1_export: str | os.PathLike | None) -> str:
    """Where Stage-2's encoder starts, as one of ``"stage1"``, ``"pretrained"``, ``"random"``: ``encoder_init``
    itself, or for ``"auto"`` the Stage-1 export when it is a file, else ``"pretrained"`` (``pretrained_weights``),
    with a WARNING naming the paper's row that then trains (:data:`NO_STAGE1_ROW`). The bundles' ``encoder_start`` (recorded in the run record, loaded by ``encoder_initialization``).

    Raises:
        SettingError: an unknown ``encoder_init``, naming the value.
    """
    choice = _choice(encoder_init)
    if choice != "auto":
        return choice
    export = None if stage1_export is None else os.fspath(stage1_export)
    if export is not None and Path(export).expanduser().is_file():
        logger.info(f"encoder_init auto: Stage-2 starts from the Stage-1 export {export}.")
        return "stage1"
    logger.warning(
        f"encoder_init auto: no Stage-1 export at {export!r}: Stage-2 starts from pretrained_weights, which trains "
        f"the paper's {NO_STAGE1_ROW!r} row (Table 2), not SpectraFlow's two stages; run Stage-1 first to start from "
        "its export, or give --stage2_settings#encoder_init stage1 to require it (--stage2_settings#encoder_init "
        "pretrained to choose this row)."
    )
    return "pretrained"


def resolve_encoder_init(
    encoder_init: str, stage1_export: str | os.PathLike | None, pretrained_weights: Any
) -> str | None:
    """The weights Stage-2 starts from: the Stage-1 export, ``pretrained_weights`` or ``None`` (random).

    Args:
        encoder_init: ``"auto"``, ``"stage1"``, ``"pretrained"`` or ``"random"`` (:func:`resolve_encoder_start`).
        stage1_export: the Stage-1 encoder export of the bundle (``models/encoder_stage1.pt``).
        pretrained_weights: ``"timm"``, a DINOv2 checkpoint file or ``None`` / ``"none"``.

    Returns:
        ``"timm"``, a file path, or ``None`` for random initialisation.

    Raises:
        SettingError: an unknown ``encoder_init``, or ``"stage1"`` while the export does not exist (the message names
            the file and the two ways forward).
    """
    choice = resolve_encoder_start(encoder_init, stage1_export)
    if choice == "random":
        return None
    if choice == "pretrained":
        return normalize_weights_source(pretrained_weights)
    if stage1_export is None or not Path(os.fspath(stage1_export)).expanduser().is_file():
        raise SettingError(
            f"encoder_init='stage1': the Stage-1 encoder export {os.fspath(stage1_export or '<not set>')!r} does "
            "not exist. Either run Stage-1 first (configs/train.yaml + configs/train_stage1.yaml, which writes it), "
            "or start Stage-2 without Stage-1 from pretrained_weights with --stage2_settings#encoder_init pretrained "
            "(the paper's 'no Stage-1' row)."
        )
    return os.fspath(stage1_export)


def initialize_encoder(
    network: nn.Module,
    encoder_init: str = "pretrained",
    pretrained_weights: Any = None,
    stage1_export: str | os.PathLike | None = None,
    model_settings: Mapping[str, Any] | None = None,
) -> str | None:
    """A bundle run's step before training: resolve the settings and load the encoder weights of ``network``.

    Stage-1 calls it with ``encoder_init="pretrained"`` (it starts from ``pretrained_weights``); Stage-2 with the
    bundle's ``encoder_start`` (``encoder_init`` resolved: ``"auto"`` by default). Running it before any data is read means that a missing
    Stage-1 export, a missing file or an unreachable hub stops the run before any training.

    Args:
        network: a :class:`~spectraflow_monai.networks.SpectraFlowNet` (possibly DDP-wrapped) or a
            :class:`~spectraflow_monai.networks.DINOv2Encoder`.
        encoder_init: ``"auto"``, ``"stage1"``, ``"pretrained"`` or ``"random"``. Defaults to ``"pretrained"``.
        pretrained_weights: ``"timm"``, a DINOv2 checkpoint file, or ``None`` / ``"none"``. Defaults to ``None``.
        stage1_export: the Stage-1 encoder export (needed for ``encoder_init="stage1"``).
        model_settings: the model settings of this run; when the Stage-1 export has its settings recorded beside it
            (``encoder_stage1.json``), each one it holds (encoder name and arguments, image size) must agree, else
            a :class:`SettingError` names both values instead of a raw size mismatch; a record written for another
            export is refused (:func:`~spectraflow_monai.utils.run_record.check_model_digest`). Defaults to None.

    Returns:
        the source loaded: ``"timm"``, a file path, or ``None`` (random initialisation).

    Raises:
        SettingError: see :func:`resolve_encoder_init` and
            :meth:`~spectraflow_monai.networks.DINOv2Encoder.load_pretrained`.
        ValueError: ``network`` is neither a SpectraFlowNet nor a DINOv2Encoder.
    """
    choice = resolve_encoder_start(encoder_init, stage1_export)
    source = resolve_encoder_init(choice, stage1_export, pretrained_weights)
    if choice == "stage1":
        label = "stage1"
        check_model_digest(source)  # the export's record (encoder_stage1.json) is this export's
        check_model_settings(
            source,
            dict(model_settings or {}),
            what="the Stage-1 export",
            hint="Run Stage-1 with these settings first, give the export's values, or start Stage-2 from "
            "pretrained_weights (--stage2_settings#encoder_init pretrained).",
        )
    elif choice == "random":
        label = "random (encoder_init)"
    else:
        label = f"pretrained_weights={'none' if source is None else source if source == 'timm' else 'file'}"
    while isinstance(network, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        network = network.module
    if not isinstance(network, (DINOv2Encoder, SpectraFlowNet)):
        raise ValueError(f"expected a DINOv2Encoder or a network with one as .encoder, got {type(network).__name__}.")
    return network.load_pretrained(source, label=label)
