"""The 2D segmentation pipeline of SpectraFlow: the Kvasir-SEG / ISIC-2016 / GlaS presets, the synthetic lesion set,
and the datalist entry point of the ``spectraflow_2d_segmentation`` bundle.
"""

from spectraflow_monai._lazy import lazy_exports

#: module -> the names it exports (imported when a name is first used: the command line stays light)
_EXPORTS: dict[str, tuple[str, ...]] = {  # fmt: skip
    ".presets": (
        "DATASET_PRESETS", "KVASIR_SPLIT_DIR", "canonical_dataset_name", "glas_datalist", "isic2016_datalist",
        "kvasir_seg_datalist", "synthetic_datalist",
    ),
    ".synthetic": ("generate_synthetic_dataset", "synthesize_pair"),
    ".datalist": (
        "DataSource", "ImageInferenceSettings", "MASK_EXTENSIONS", "build_datalist", "canonical_source_name",
    ),
    ".augmentation": ("evaluation_corruption", "train_augmentation"),
    ".labels": (
        "LabelSetup", "OneHotOutput", "label_setup", "label_transform", "metric_suite_handler", "postprocessing",
        "prediction_writer",
    ),
}

__all__: list[str] = [name for names in _EXPORTS.values() for name in names]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
