"""Ignite handlers used by the SpectraFlow bundles."""

from .checkpoint import AtomicFiniteSaver, GradScalerState, ResumableEarlyStopHandler, SafeCheckpointSaver
from .nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from .progress import ProgressBarHandler
from .random_state import RandomStateHandler

__all__ = [
    "AtomicFiniteSaver",
    "GradScalerState",
    "NonFiniteLossError",
    "ProgressBarHandler",
    "RandomStateHandler",
    "ResumableEarlyStopHandler",
    "SafeCheckpointSaver",
    "StopOnNonFiniteLoss",
]
