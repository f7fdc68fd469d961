"""Ignite handlers used by the SpectraFlow bundles."""

from .checkpoint import AtomicFiniteSaver, GradScalerState, ResumableEarlyStopHandler, SafeCheckpointSaver
from .nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from .progress import ProgressBarHandler
from .random_state import RandomStateHandler
from .training_log import BoundaryWeightRamp, EpochSummaryHandler, LossTermsHandler

__all__ = [
    "AtomicFiniteSaver",
    "BoundaryWeightRamp",
    "EpochSummaryHandler",
    "GradScalerState",
    "LossTermsHandler",
    "NonFiniteLossError",
    "ProgressBarHandler",
    "RandomStateHandler",
    "ResumableEarlyStopHandler",
    "SafeCheckpointSaver",
    "StopOnNonFiniteLoss",
]
