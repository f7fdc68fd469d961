from .datasets2d import (
    DATASET_PRESETS,
    KVASIR_SPLIT_DIR,
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
    check_synapse_labels,
    check_volume_pair,
    extract_slices,
    format_case_id,
    load_synapse_h5,
    map_btcv_labels,
    synapse_datalist,
)
from .synapse_bundle import build_synapse_datalist, check_synapse_settings
from .synthetic_ct import DEFAULT_SYNTHETIC_CASES, generate_synthetic_ct, synthetic_ct_volume
from .label_map import LABEL_MAP_UNMAPPED, apply_label_map, check_class_names, check_label_map, identity_label_map
from .synapse_datalist import (
    check_own_data_settings,
    decathlon_synapse_datalist,
    holdout_split,
    read_decathlon_datalist,
    resolve_label_map,
    synapse_class_names,
    synapse_inference_datalist,
)
from .validation import DatasetError, validate_datalist
from .readers import Image2DReader, read_2d
from .label_mode import LabelMode, label_mode
from .datalist import (
    DATA_SOURCES,
    MASK_SUFFIXES,
    build_datalist,
    canonical_source_name,
    decathlon_datalist,
    folder_datalist,
    holdout,
)

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

__all__ += ["LABEL_MAP_UNMAPPED", "apply_label_map", "check_class_names", "check_label_map", "identity_label_map"]
__all__ += [
    "check_own_data_settings",
    "decathlon_synapse_datalist",
    "holdout_split",
    "read_decathlon_datalist",
    "resolve_label_map",
    "synapse_class_names",
    "synapse_inference_datalist",
]
__all__ += ["DATA_SOURCES", "MASK_SUFFIXES", "canonical_source_name", "decathlon_datalist", "folder_datalist"]
__all__ += ["holdout"]
__all__ += ["Image2DReader", "LabelMode", "label_mode", "read_2d"]
