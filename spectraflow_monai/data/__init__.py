from .datalist import (
    DATA_SOURCES,
    MASK_SUFFIXES,
    decathlon_datalist,
    default_dataset_dir,
    folder_datalist,
    inference_files,
)
from .device_cache import (
    CACHE_DEVICES,
    DeviceCache,
    DeviceCacheLoader,
    resolve_cache_device,
    single_thread_worker_init,
)
from .label_map import (
    LABEL_MAP_UNMAPPED,
    apply_label_map,
    check_class_names,
    check_label_map,
    identity_label_map,
    inverse_label_map,
)
from .label_mode import LabelMode, label_mode
from .readers import Image2DReader, read_2d
from .subsets import holdout, low_data_subset
from .validation import DatasetError, validate_datalist
from .volumes import (
    VolumeReader,
    check_label_grid,
    read_label_volume,
    read_volume,
    volume_format,
    volume_header,
)

__all__ = [
    "CACHE_DEVICES",
    "DATA_SOURCES",
    "DeviceCache",
    "DeviceCacheLoader",
    "DatasetError",
    "Image2DReader",
    "LABEL_MAP_UNMAPPED",
    "LabelMode",
    "MASK_SUFFIXES",
    "apply_label_map",
    "check_class_names",
    "check_label_map",
    "decathlon_datalist",
    "default_dataset_dir",
    "folder_datalist",
    "inference_files",
    "holdout",
    "identity_label_map",
    "inverse_label_map",
    "label_mode",
    "low_data_subset",
    "resolve_cache_device",
    "single_thread_worker_init",
    "read_2d",
    "validate_datalist",
    "VolumeReader",
    "check_label_grid",
    "read_label_volume",
    "read_volume",
    "volume_format",
    "volume_header",
]
