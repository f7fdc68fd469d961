from .datasets2d import (
    DATASET_PRESETS,
    build_datalist,
    glas_datalist,
    isic2016_datalist,
    kvasir_seg_datalist,
    low_data_subset,
    synthetic_datalist,
)
from .synthetic2d import generate_synthetic_dataset
from .validation import DatasetError, validate_datalist

__all__: list[str] = []

__all__ += [
    "DATASET_PRESETS",
    "DatasetError",
    "build_datalist",
    "generate_synthetic_dataset",
    "glas_datalist",
    "isic2016_datalist",
    "kvasir_seg_datalist",
    "low_data_subset",
    "synthetic_datalist",
    "validate_datalist",
]
