from .handler import MetricSuiteHandler, name_from_path
from .hd95 import HD95EmptyAsDiagonal, HD95EmptyAsDiagonalMetric
from .segmentation import (
    EMPTY_CONVENTIONS,
    METRIC_KEYS,
    SegmentationMetricSuite,
    binarize_prediction,
    evaluate_segmentation,
)
from .surface import (
    HD95_DEFINITIONS,
    HD95_SHORT_LABELS,
    hd95_monai,
    hd95_pooled,
    image_diagonal,
    transunet_case_metrics,
)
from .volume import ORGAN_DISPLAY_NAMES, PAPER_ORGAN_ORDER, VOLUME_METRIC_KEYS, VolumeMetricTable, organ_metrics
from .volume_handler import VolumeMetricsHandler, spacing_from_affine

__all__: list[str] = []

__all__ += [
    "EMPTY_CONVENTIONS",
    "HD95_DEFINITIONS",
    "HD95_SHORT_LABELS",
    "HD95EmptyAsDiagonal",
    "HD95EmptyAsDiagonalMetric",
    "METRIC_KEYS",
    "MetricSuiteHandler",
    "SegmentationMetricSuite",
    "binarize_prediction",
    "evaluate_segmentation",
    "hd95_monai",
    "hd95_pooled",
    "image_diagonal",
    "name_from_path",
    "transunet_case_metrics",
]

__all__ += ["ORGAN_DISPLAY_NAMES", "PAPER_ORGAN_ORDER", "VOLUME_METRIC_KEYS", "VolumeMetricTable", "organ_metrics"]
__all__ += ["VolumeMetricsHandler", "spacing_from_affine"]

from .frequency import (
    DEFAULT_BAND_EDGES,
    FREQUENCY_BAND_MODES,
    FrequencyBandError,
    FrequencyBandErrorHandler,
    check_band_edges,
    compute_frequency_band_error,
    frequency_band_masks,
    radial_frequency,
)

__all__ += ["DEFAULT_BAND_EDGES", "FREQUENCY_BAND_MODES", "FrequencyBandError", "FrequencyBandErrorHandler"]
__all__ += ["check_band_edges", "compute_frequency_band_error", "frequency_band_masks", "radial_frequency"]
