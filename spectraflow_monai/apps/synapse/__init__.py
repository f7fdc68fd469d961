"""Synapse multi-organ CT (BTCV) data for the 3D experiment of SpectraFlow.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") reports organ-wise DSC on the Synapse multi-organ CT data set (MICCAI 2015 "Multi-Atlas Labeling
Beyond the Cranial Vault", BTCV) following the protocol of TransUNet (Chen et al., arXiv:2102.04306):

- 30 labelled abdominal CT volumes, 18 for training (:data:`SYNAPSE_TRAIN_CASES`) and 12 for testing
  (:data:`SYNAPSE_TEST_CASES`);
- CT numbers clipped to [-125, 275] HU and rescaled to [0, 1];
- the 13 BTCV organ labels reduced to 8 (:data:`BTCV_TO_SYNAPSE`; channel names :data:`SYNAPSE_ORGANS`);
- training on 2D axial slices, evaluation on the 3D volumes.

Two on-disk layouts are understood by :func:`~spectraflow_monai.apps.synapse.layouts.synapse_datalist`:

``raw`` (the BTCV release)::

    <root>/RawData/Training/img/img0001.nii.gz
    <root>/RawData/Training/label/label0001.nii.gz

``transunet`` (TransUNet's preprocessed release; already windowed and label-mapped)::

    <root>/train_npz/case0005_slice000.npz       keys image, label; (H, W)
    <root>/test_vol_h5/case0001.npy.h5           keys image, label; (D, H, W); needs h5py

:func:`extract_slices` turns raw volumes (and TransUNet's test volumes) into a cache of TransUNet-like ``.npz``
slices (read once, reused on later calls), loaded by :class:`spectraflow_monai.apps.synapse.LoadSynapseSliced`.
:class:`SynapseDataSource` is the data source of the ``spectraflow_synapse_segmentation`` bundle, built from the
run's settings objects (:class:`SynapseDataOptions` in its data settings; the CT preprocessing in its model
settings): data set presets, the synthetic phantom generated on first use, volume checks, the slice cache.

One's own volumes may be NIfTI or NRRD files or folders holding one DICOM series each; labels NIfTI or NRRD files
on their image's grid, 3D Slicer segmentations (``.seg.nrrd``) matched to ``class_names`` by segment name
(:mod:`spectraflow_monai.data.volumes`, :mod:`spectraflow_monai.data.dicom`). Inference writes label NIfTI files on
the input's grid and, with ``output_format: dicom_seg``, a DICOM SEG of each DICOM series
(:mod:`spectraflow_monai.data.dicom_seg`).

Modules, bottom to top (each imports only those below it): ``constants`` (protocol constants), ``readers`` (NIfTI /
NRRD / DICOM / h5 readers, label mapping and checks), ``layouts`` (datalists of the two layouts), ``cache`` (the slice cache),
``transforms`` (CT window, label mapping, slice / h5 loading), ``phantom`` (the synthetic CT stand-in),
``datalist`` (a Decathlon datalist JSON of one's own volumes), ``bundle`` (the bundle's entry points), ``source`` (the
run's data source).
"""

from spectraflow_monai._lazy import lazy_exports

#: module -> the names it exports (imported when a name is first used: the command line stays light)
_EXPORTS: dict[str, tuple[str, ...]] = {  # fmt: skip
    ".source": ("SynapseDataSource", "VolumeSlices", "check_test_volumes"),
    ".settings": (
        "LAYOUTS", "OUTPUT_FORMATS", "VAL_SPLITS", "all_class_names", "label_values", "SynapseDataOptions",
        "prediction_values", "resolve_label_map", "synapse_class_names", "VolumeLabels",
        "check_datalist_base", "synapse_layout", "default_val_cases", "volume_nonfinite_value",
        "slice_nonfinite_value",
    ),
    ".label_map": ("MapLabels", "MapLabelsd"),
    ".constants": (
        "AFFINE_TOL", "BTCV_LABEL_NAMES", "BTCV_LUT", "BTCV_TO_SYNAPSE", "CASE_ID", "INDEX_NAME", "INDEX_VERSION",
        "NIFTI_SUFFIX", "NUM_BTCV_LABELS", "RAW_IMAGE", "RAW_LABEL", "SYNAPSE_BUNDLE_DATASETS",
        "ORGAN_DISPLAY_NAMES", "PAPER_ORGAN_ORDER", "SYNAPSE_ORGANS", "SYNAPSE_TEST_CASES", "SYNAPSE_TRAIN_CASES",
        "TU_SLICE", "TU_TEST", "TU_TRAIN_DIR", "format_case_id",
    ),
    ".readers": (
        "check_loaded_pair", "check_synapse_h5", "check_synapse_labels", "check_volume_pair", "import_nibabel",
        "load_nifti", "load_synapse_h5", "map_btcv_labels", "read_raw_volume", "class_values",
    ),
    ".layouts": ("case_list", "synapse_datalist"),
    ".cache": ("extract_slices", "slice_cache_dir", "slice_with_settings"),
    ".transforms": (
        "CTWindow", "CTWindowd", "MapBTCVLabels", "MapBTCVLabelsd", "LoadSynapseSliced", "LoadSynapseH5d",
        "load_slice_npz", "SaveDicomSegd",
    ),
    ".phantom": (
        "DEFAULT_SYNTHETIC_CASES", "PHANTOM_MANIFEST", "phantom_parameters", "synthetic_ct_volume",
        "generate_synthetic_ct", "main",
    ),
    ".datalist": (
        "DECATHLON_LISTS", "nifti_case_id", "read_decathlon_datalist", "holdout_split", "case_fraction",
        "decathlon_synapse_datalist", "synapse_inference_datalist", "volume_input_check",
    ),
    ".bundle": (
        "synapse_split", "VolumeInferenceSettings", "prediction_writer", "series_seg_writer", "volume_label_reader",
        "volume_output_name", "volume_loading",
        "volume_metrics_handler", "volume_postprocessing",
    ),
}

__all__: list[str] = [name for names in _EXPORTS.values() for name in names]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
