"""Training engines of SpectraFlow: the Stage-1 trainers (MeanFlow, MAE) as ``monai.engines.Trainer`` subclasses, and
their options as small frozen objects (:mod:`spectraflow_monai.engines.config`).

Learning-rate schedules are in :mod:`spectraflow_monai.optimizers`, the encoder export handler in
:mod:`spectraflow_monai.handlers`.
"""

from .config import DispersiveConfig, EMAConfig, GradientConfig, MAEConfig, MeanFlowConfig
from .mae import MAEPretrainer, encode_visible, random_masking
from .meanflow import STAGE1_OUTPUT_KEYS, MeanFlowPretrainer, normalize_latent
from .stage1 import Stage1Trainer
from .utils import (
    PrepareBatchMixedDomain,
    PrepareBatchTransform,
    accumulation_flags,
    all_reduce_gradients,
    broadcast_modules,
)

__all__ = [
    "DispersiveConfig",
    "EMAConfig",
    "GradientConfig",
    "MAEConfig",
    "MAEPretrainer",
    "MeanFlowConfig",
    "MeanFlowPretrainer",
    "PrepareBatchMixedDomain",
    "PrepareBatchTransform",
    "STAGE1_OUTPUT_KEYS",
    "Stage1Trainer",
    "accumulation_flags",
    "all_reduce_gradients",
    "broadcast_modules",
    "encode_visible",
    "normalize_latent",
    "random_masking",
]
