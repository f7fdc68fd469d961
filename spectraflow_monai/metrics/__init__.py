"""SpectraFlow metrics, MONAI style: ``compute_*`` functions and metric classes (their ignite handlers are in
:mod:`spectraflow_monai.handlers`).

- :mod:`~spectraflow_monai.metrics.surface`: the one surface-distance core behind every HD95 (both definitions);
- :mod:`~spectraflow_monai.metrics.per_image` / :mod:`~spectraflow_monai.metrics.segmentation`: the per-image
  protocol of the paper and the suite that averages and reports it;
- :mod:`~spectraflow_monai.metrics.volume` / :mod:`~spectraflow_monai.metrics.volume_table`: organ-wise Synapse
  metrics and their table;
- :mod:`~spectraflow_monai.metrics.hd95`: HD95 of batches, with missed structures scored as the image diagonal;
- :mod:`~spectraflow_monai.metrics.frequency`: the frequency-band error;
- :mod:`~spectraflow_monai.metrics.uncertainty`: how unsure a model is of an unlabelled image (active learning): the
  flip-averaged entropy the MONAI Label app scores with, and Wang et al.'s test-time-augmentation vote entropy.
"""

from .frequency import (
    DEFAULT_BAND_EDGES,
    FREQUENCY_BAND_MODES,
    FrequencyBandError,
    check_band_edges,
    compute_frequency_band_error,
    frequency_band_masks,
    radial_frequency,
)
from .hd95 import HD95EmptyAsDiagonalMetric, HD95Metric, compute_hd95, reduce_defined
from .per_image import EMPTY_CONVENTIONS, METRIC_KEYS, binarize_prediction, compute_segmentation_metrics
from .segmentation import SegmentationMetricSuite, evaluate_segmentation
from .surface import (
    HD95_DEFINITIONS,
    HD95_SHORT_LABELS,
    hd95,
    hd95_by_definition,
    hd95_monai,
    hd95_pooled,
    image_diagonal,
    mask_surfaces,
    surface_distances,
    transunet_case_metrics,
)
from .uncertainty import (
    DIHEDRAL_2D,
    FLIPS_2D,
    FlipEntropy,
    TTAVoteEntropy,
    compute_flip_entropy,
    compute_vote_entropy,
)
from .volume import VOLUME_METRIC_KEYS, organ_metrics
from .volume_table import VolumeMetricTable

__all__ = [
    "DEFAULT_BAND_EDGES",
    "DIHEDRAL_2D",
    "EMPTY_CONVENTIONS",
    "FLIPS_2D",
    "FREQUENCY_BAND_MODES",
    "FlipEntropy",
    "FrequencyBandError",
    "HD95_DEFINITIONS",
    "HD95_SHORT_LABELS",
    "HD95EmptyAsDiagonalMetric",
    "METRIC_KEYS",
    "SegmentationMetricSuite",
    "TTAVoteEntropy",
    "VOLUME_METRIC_KEYS",
    "VolumeMetricTable",
    "binarize_prediction",
    "check_band_edges",
    "compute_flip_entropy",
    "compute_vote_entropy",
    "compute_frequency_band_error",
    "compute_hd95",
    "reduce_defined",
    "HD95Metric",
    "compute_segmentation_metrics",
    "evaluate_segmentation",
    "frequency_band_masks",
    "hd95",
    "hd95_by_definition",
    "hd95_monai",
    "hd95_pooled",
    "image_diagonal",
    "mask_surfaces",
    "organ_metrics",
    "radial_frequency",
    "surface_distances",
    "transunet_case_metrics",
]
