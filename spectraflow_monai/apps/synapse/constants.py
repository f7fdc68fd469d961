"""Protocol constants of the Synapse multi-organ CT experiment (TransUNet split, BTCV label map, file layouts).

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["AFFINE_TOL", "ORGAN_DISPLAY_NAMES", "PAPER_ORGAN_ORDER", "BTCV_LABEL_NAMES", "BTCV_LUT", "BTCV_TO_SYNAPSE", "CASE_ID", "INDEX_NAME", "INDEX_VERSION", "NIFTI_SUFFIX", "NUM_BTCV_LABELS", "RAW_IMAGE", "RAW_LABEL", "SYNAPSE_BUNDLE_DATASETS", "SYNAPSE_ORGANS", "SYNAPSE_TEST_CASES", "SYNAPSE_TRAIN_CASES", "TU_SLICE", "TU_TEST", "TU_TRAIN_DIR", "format_case_id"]

#: training cases of the TransUNet split (``lists/lists_Synapse/train.txt``), 18 volumes / 2211 slices.
SYNAPSE_TRAIN_CASES: tuple[int, ...] = (5, 6, 7, 9, 10, 21, 23, 24, 26, 27, 28, 30, 31, 33, 34, 37, 39, 40)
#: test cases of the TransUNet split (``lists/lists_Synapse/test_vol.txt``), 12 volumes.
SYNAPSE_TEST_CASES: tuple[int, ...] = (1, 2, 3, 4, 8, 22, 25, 29, 32, 35, 36, 38)
#: BTCV label id -> Synapse class; every id not listed (esophagus 5, inferior vena cava 9, portal and splenic
#: veins 10, right adrenal 12, left adrenal 13) becomes background 0.
BTCV_TO_SYNAPSE: dict[int, int] = {1: 1, 2: 2, 3: 3, 4: 4, 6: 5, 7: 6, 8: 7, 11: 8}
#: names of the 14 BTCV label ids 0..13.
BTCV_LABEL_NAMES: tuple[str, ...] = (
    "background",
    "spleen",
    "right_kidney",
    "left_kidney",
    "gallbladder",
    "esophagus",
    "liver",
    "stomach",
    "aorta",
    "inferior_vena_cava",
    "portal_and_splenic_veins",
    "pancreas",
    "right_adrenal_gland",
    "left_adrenal_gland",
)
#: the 9 Synapse classes (the bundle's ``channel_def``), index = class id.
SYNAPSE_ORGANS: tuple[str, ...] = (
    "background",
    "spleen",
    "right_kidney",
    "left_kidney",
    "gallbladder",
    "liver",
    "stomach",
    "aorta",
    "pancreas",
)

#: row order of the SpectraFlow Synapse table (``VolumeMetricTable(order=...)``).
PAPER_ORGAN_ORDER: tuple[str, ...] = (
    "aorta",
    "gallbladder",
    "left_kidney",
    "right_kidney",
    "liver",
    "pancreas",
    "spleen",
    "stomach",
)
#: display names of the Synapse organs (as in the SpectraFlow / TransUNet tables).
ORGAN_DISPLAY_NAMES: dict[str, str] = {
    "spleen": "Spleen",
    "right_kidney": "Right kidney",
    "left_kidney": "Left kidney",
    "gallbladder": "Gallbladder",
    "liver": "Liver",
    "stomach": "Stomach",
    "aorta": "Aorta",
    "pancreas": "Pancreas",
}

NUM_BTCV_LABELS = len(BTCV_LABEL_NAMES)
BTCV_LUT = np.zeros(NUM_BTCV_LABELS, dtype=np.uint8)
for _k, _v in BTCV_TO_SYNAPSE.items():
    BTCV_LUT[_k] = _v

RAW_IMAGE = "RawData/Training/img/img{case}.nii.gz"
RAW_LABEL = "RawData/Training/label/label{case}.nii.gz"
TU_TRAIN_DIR = "train_npz"
TU_TEST = "test_vol_h5/case{case}.npy.h5"
TU_SLICE = re.compile(r"^case(\d+)_slice(\d+)\.npz$")
CASE_ID = re.compile(r"^(?:case|img|label)?(\d+)$")
NIFTI_SUFFIX = re.compile(r"\.nii(\.gz)?$")
INDEX_NAME = "index.json"
INDEX_VERSION = 1
AFFINE_TOL = 1e-3


def format_case_id(case: int | str) -> str:
    """Return the 4-digit BTCV case id of ``case`` (``5``, ``"5"``, ``"0005"``, ``"case0005"`` -> ``"0005"``).

    Raises:
        ValueError: ``case`` is not a non-negative integer or such a string.
    """
    if isinstance(case, (bool, np.bool_)):
        raise ValueError(f"case id must be an int or a digit string, got {case!r}.")
    if isinstance(case, (int, np.integer)):
        if case < 0:
            raise ValueError(f"case id must be non-negative, got {case!r}.")
        return f"{int(case):04d}"
    if isinstance(case, str):
        m = CASE_ID.match(case.strip())
        if m:
            return f"{int(m.group(1)):04d}"
    raise ValueError(f"case id must be an int or a digit string such as '0005' or 'case0005', got {case!r}.")


#: the data sets of the ``spectraflow_synapse_segmentation`` bundle (see :func:`synapse_split`).
SYNAPSE_BUNDLE_DATASETS: tuple[str, ...] = ("synthetic", "btcv", "transunet")
