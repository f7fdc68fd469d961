"""Ignite handlers used by the SpectraFlow bundles."""

from .checkpoint import (
    AtomicFiniteSaver,
    GradScalerState,
    RecordedCheckpointLoader,
    ResumableEarlyStopHandler,
    SafeCheckpointSaver,
)
from .deep_supervision import FinalHeadHandler
from .nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from .progress import ProgressBarHandler
from .random_state import RandomStateHandler
from .stats import RunStatsHandler
from .training_log import BoundaryWeightRamp, EpochSummaryHandler, LossTermsHandler

__all__ = [
    "AtomicFiniteSaver",
    "BoundaryWeightRamp",
    "EpochSummaryHandler",
    "FinalHeadHandler",
    "GradScalerState",
    "LossTermsHandler",
    "NonFiniteLossError",
    "ProgressBarHandler",
    "RandomStateHandler",
    "RecordedCheckpointLoader",
    "ResumableEarlyStopHandler",
    "RunStatsHandler",
    "SafeCheckpointSaver",
    "StopOnNonFiniteLoss",
]

from .encoder_export import EncoderExportHandler, encoder_export_state_dict, save_encoder_export  # noqa: E402

__all__ += ["EncoderExportHandler", "encoder_export_state_dict", "save_encoder_export"]

from .frequency import FrequencyBandErrorHandler  # noqa: E402
from .hd95 import HD95, HD95EmptyAsDiagonal  # noqa: E402
from .metric_suite import MetricSuiteHandler, name_from_path  # noqa: E402
from .volume_metrics import SPACING_UNITS_KEY, VolumeMetricsHandler, spacing_from_affine  # noqa: E402

__all__ += ["FrequencyBandErrorHandler", "HD95", "HD95EmptyAsDiagonal", "MetricSuiteHandler", "VolumeMetricsHandler"]
__all__ += ["SPACING_UNITS_KEY", "name_from_path", "spacing_from_affine"]
