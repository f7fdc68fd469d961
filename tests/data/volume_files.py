"""Small volumes written as the files the bundles read: NIfTI, NRRD, 3D Slicer segmentations, DICOM series."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from spectraflow_monai.apps.synapse import SYNAPSE_ORGANS, map_btcv_labels, synthetic_ct_volume

#: a non-identity geometry: axes swapped and one flipped (no obliquity), spacings 0.9 / 0.7 / 2.5 mm, an offset
ROTATED = np.array([[0.0, -0.7, 0.0, 10.0], [0.9, 0.0, 0.0, -20.0], [0.0, 0.0, 2.5, 30.0], [0.0, 0.0, 0.0, 1.0]])
#: a plain geometry with non-unit spacing
DIAGONAL = np.diag([0.8, 0.8, 2.5, 1.0])
RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def phantom(shape: Sequence[int] = (24, 20, 6), case: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The phantom's image (HU, int16) and its label in the 9 Synapse classes (uint8)."""
    image, label = synthetic_ct_volume(case, shape=tuple(shape))
    return image, map_btcv_labels(label, dtype=np.uint8)


def write_nifti(path: str | os.PathLike, array: np.ndarray, affine: np.ndarray) -> str:
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.asarray(array), affine), str(path))
    return str(path)


def _nrrd_header(affine: np.ndarray) -> dict:
    lps = RAS_TO_LPS @ affine
    return {"space": "left-posterior-superior", "space directions": lps[:3, :3].T, "space origin": lps[:3, 3]}


def write_nrrd(path: str | os.PathLike, array: np.ndarray, affine: np.ndarray) -> str:
    import nrrd

    nrrd.write(str(path), np.asarray(array), _nrrd_header(affine))
    return str(path)


def write_seg_nrrd(
    path: str | os.PathLike, label: np.ndarray, affine: np.ndarray, segments: Mapping[str, int],
    class_names: Sequence[str] = SYNAPSE_ORGANS,
) -> str:  # fmt: skip
    """``label`` (class indices) as 3D Slicer saves a segmentation: the segments listed in the order of ``segments``
    (``{segment name: class index}``), numbered 0, 1, ... in that order, each stored with label value = its number
    + 1 (so the values in the file are NOT the class indices)."""
    import nrrd

    stored = np.zeros(label.shape, np.uint8)
    header = _nrrd_header(affine)
    header["kinds"] = ["domain"] * 3
    for number, (name, cls) in enumerate(segments.items()):
        stored[label == cls] = number + 1
        header[f"Segment{number}_Name"] = name
        header[f"Segment{number}_ID"] = f"Segment_{number + 1}"
        header[f"Segment{number}_LabelValue"] = str(number + 1)
        header[f"Segment{number}_Layer"] = "0"
    nrrd.write(str(path), stored, header)
    return str(path)


def organ_segments(label: np.ndarray, class_names: Sequence[str] = SYNAPSE_ORGANS, reverse: bool = True) -> dict:
    """``{class name: class}`` of the classes present in ``label``, in reverse class order by default (a file whose
    segment numbers are not the class indices)."""
    present = [int(c) for c in np.unique(label) if c]
    order = present[::-1] if reverse else present
    return {class_names[c]: c for c in order}


def write_series(
    folder: str | os.PathLike, image: np.ndarray, affine: np.ndarray, reverse: bool = False, **kwargs
) -> list[str]:
    """``image`` as a DICOM CT series; ``reverse``: instance numbers run against the slice positions."""
    from spectraflow_monai.data.dicom import write_dicom_series

    n = image.shape[2]
    numbers = list(range(n, 0, -1)) if reverse else None
    return write_dicom_series(image, affine, folder, instance_numbers=numbers, **kwargs)


def series_affine(affine: np.ndarray, depth: int, reverse: bool) -> np.ndarray:
    """The geometry of a series written with ``affine``: the same, or, with its slices in reverse instance order,
    the slice axis flipped (origin at the last slice)."""
    if not reverse:
        return np.asarray(affine, np.float64)
    flip = np.eye(4)
    flip[2, 2], flip[2, 3] = -1.0, depth - 1
    return np.asarray(affine, np.float64) @ flip


def in_series_order(array: np.ndarray, reverse: bool) -> np.ndarray:
    return array[..., ::-1] if reverse else array


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
