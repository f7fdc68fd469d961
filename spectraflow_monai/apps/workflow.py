"""The training program both bundles share, as functions the bundle configs call in one line each.

The configs keep the settings, ``network_def`` and short references (MONAI model-zoo style); what would otherwise
be chains of config expressions lives here, once for both bundles:

- :func:`prepare_run`: the first steps of every training ``initialize`` list (image size check, determinism, run
  folders);
- :func:`segmentation_metrics`: the key and additional metric handlers of a trainer or evaluator;
- :func:`trainable_parameters`: the optimizer's parameters (frozen encoder blocks left out);
- :func:`start_training`: the ``run`` list of Stage-2 (early stopping bound to the trainer, resume, checkpoints).

Importing this module also imports the modules the configs name in their expressions (``apps.seg2d``,
``apps.synapse``, ``data``, ``engines``, ``networks``, ``handlers``, ``utils``), so a config's ``imports`` list is
``os``, ``spectraflow_monai`` and this module (plus the error hook).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import monai
import torch.nn as nn
from ignite.engine import Engine
from monai.handlers import HausdorffDistance, MeanDice, MeanIoUHandler, from_engine

import spectraflow_monai.apps.seg2d  # noqa: F401  (named by the configs' expressions)
import spectraflow_monai.apps.synapse  # noqa: F401
import spectraflow_monai.data  # noqa: F401
import spectraflow_monai.engines  # noqa: F401
import spectraflow_monai.networks.utils  # noqa: F401
import spectraflow_monai.utils.checkpoint  # noqa: F401
import spectraflow_monai.utils.distributed  # noqa: F401
import spectraflow_monai.utils.run_record  # noqa: F401
from spectraflow_monai.handlers import HD95EmptyAsDiagonal
from spectraflow_monai.utils.settings import check_image_size

__all__ = ["prepare_run", "segmentation_metrics", "start_training", "trainable_parameters"]


def prepare_run(seed: int, folders: Sequence[str | os.PathLike] = (), image_size: int | None = None) -> None:
    """Check ``image_size`` (when given), make the run deterministic (``monai.utils.set_determinism(seed)``) and
    create ``folders``."""
    if image_size is not None:
        check_image_size(image_size)
    monai.utils.set_determinism(seed=seed)
    for folder in folders:
        os.makedirs(folder, exist_ok=True)


def segmentation_metrics(
    prefix: str,
    which: str = "key",
    include_background: bool = False,
    output_transform: Callable | None = None,
    label_setup: Any = None,
    hd95: bool = True,
) -> dict[str, Any]:
    """The metric handlers of the bundles' trainers and evaluators (MONAI's handlers, named ``<prefix>_<metric>``).

    Args:
        prefix: ``"train"`` or ``"val"``.
        which: ``"key"``: ``{<prefix>_mean_dice: MeanDice}``; ``"additional"``: mean IoU, HD95 (MONAI's definition,
            unless ``hd95`` is False) and HD95 with a missed structure scored as the image diagonal.
        include_background: of every handler (True for a single binary channel). Defaults to False.
        output_transform: maps ``engine.state.output`` to ``(pred, label)``. Defaults to
            ``from_engine(["pred", "label"])``.
        label_setup: a :class:`~spectraflow_monai.apps.seg2d.LabelSetup`: its ``include_background`` and
            ``metric_output`` replace the two arguments above. Defaults to None.
        hd95: include MONAI's HD95 among the additional metrics. Defaults to True.
    """
    if label_setup is not None:
        include_background, output_transform = label_setup.include_background, label_setup.metric_output
    transform = output_transform or from_engine(["pred", "label"])
    if which == "key":
        return {f"{prefix}_mean_dice": MeanDice(include_background=include_background, output_transform=transform)}
    if which != "additional":
        raise ValueError(f"which must be 'key' or 'additional', got {which!r}.")
    metrics = {f"{prefix}_mean_iou": MeanIoUHandler(include_background=include_background, output_transform=transform)}
    if hd95:
        metrics[f"{prefix}_hd95"] = HausdorffDistance(
            include_background=include_background, percentile=95, output_transform=transform
        )
    # a missed lesion (organ) scores the image (slice) diagonal instead of leaving the mean
    metrics[f"{prefix}_hd95_empty_as_diagonal"] = HD95EmptyAsDiagonal(
        include_background=include_background, output_transform=transform
    )
    return metrics


def trainable_parameters(network: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``network`` that require gradient (frozen encoder blocks are left out of the optimizer)."""
    return [p for p in network.parameters() if p.requires_grad]


def start_training(
    trainer: Engine,
    checkpoint_saver: Any,
    checkpoint_loader: Any = None,
    resume_path: str | None = None,
    early_stop: Any = None,
) -> None:
    """The ``run`` list of a bundle's Stage-2: bind early stopping to the trainer, continue from ``resume_path``
    (the checkpoint chosen by :func:`~spectraflow_monai.utils.checkpoint.resume_checkpoint`), attach the
    checkpoint saver, and train."""
    if early_stop is not None:
        early_stop.set_trainer(trainer)
    if resume_path and checkpoint_loader is not None:
        checkpoint_loader.attach(trainer)
    checkpoint_saver.attach(trainer)
    trainer.run()
