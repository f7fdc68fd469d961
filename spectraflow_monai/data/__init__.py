from .datasets2d import (
    DATASET_PRESETS,
    KVASIR_SPLIT_DIR,
    build_datalist,
    canonical_dataset_name,
    glas_datalist,
    isic2016_datalist,
    kvasir_seg_datalist,
    low_data_subset,
    synthetic_datalist,
)
from .synthetic2d import generate_synthetic_dataset
from .synapse import (
    BTCV_LABEL_NAMES,
    BTCV_TO_SYNAPSE,
    SYNAPSE_BUNDLE_DATASETS,
    SYNAPSE_ORGANS,
    SYNAPSE_TEST_CASES,
    SYNAPSE_TRAIN_CASES,
    build_synapse_datalist,
    check_synapse_labels,
    check_synapse_settings,
    check_volume_pair,
    extract_slices,
    format_case_id,
    load_synapse_h5,
    map_btcv_labels,
    synapse_datalist,
)
from .synthetic_ct import DEFAULT_SYNTHETIC_CASES, generate_synthetic_ct, synthetic_ct_volume
from .validation import DatasetError, validate_datalist

__all__: list[str] = []

__all__ += [
    "DATASET_PRESETS",
    "DatasetError",
    "KVASIR_SPLIT_DIR",
    "build_datalist",
    "canonical_dataset_name",
    "generate_synthetic_dataset",
    "glas_datalist",
    "isic2016_datalist",
    "kvasir_seg_datalist",
    "low_data_subset",
    "synthetic_datalist",
    "validate_datalist",
]

__all__ += [
    "BTCV_LABEL_NAMES",
    "BTCV_TO_SYNAPSE",
    "DEFAULT_SYNTHETIC_CASES",
    "SYNAPSE_ORGANS",
    "SYNAPSE_TEST_CASES",
    "SYNAPSE_TRAIN_CASES",
    "SYNAPSE_BUNDLE_DATASETS",
    "build_synapse_datalist",
    "check_synapse_labels",
    "check_synapse_settings",
    "check_volume_pair",
    "extract_slices",
    "format_case_id",
    "generate_synthetic_ct",
    "load_synapse_h5",
    "map_btcv_labels",
    "synapse_datalist",
    "synthetic_ct_volume",
]
