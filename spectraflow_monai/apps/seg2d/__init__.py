"""The 2D segmentation pipeline of SpectraFlow: the Kvasir-SEG / ISIC-2016 / GlaS presets, the synthetic lesion set,
and the datalist entry point of the ``spectraflow_2d_segmentation`` bundle.
"""

from .datalist import DataSource, build_datalist, canonical_source_name
from .label_setup import LabelSetup, OneHotOutput, label_setup, stage2_loss
from .presets import (
    DATASET_PRESETS,
    KVASIR_SPLIT_DIR,
    canonical_dataset_name,
    glas_datalist,
    isic2016_datalist,
    kvasir_seg_datalist,
    synthetic_datalist,
)
from .synthetic import generate_synthetic_dataset, synthesize_pair

__all__ = [
    "DATASET_PRESETS",
    "KVASIR_SPLIT_DIR",
    "canonical_dataset_name",
    "glas_datalist",
    "isic2016_datalist",
    "kvasir_seg_datalist",
    "synthetic_datalist",
    "generate_synthetic_dataset",
    "synthesize_pair",
    "DataSource",
    "build_datalist",
    "canonical_source_name",
    "LabelSetup",
    "OneHotOutput",
    "label_setup",
    "stage2_loss",
]
