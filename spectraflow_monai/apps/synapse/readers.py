"""Readers and checks of Synapse / BTCV volumes: NIfTI and TransUNet h5 files, label mapping, image/label pairs.

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from monai.transforms import ScaleIntensityRange

from spectraflow_monai.apps.synapse.constants import (
    BTCV_LUT,
    BTCV_TO_SYNAPSE,
    NUM_BTCV_LABELS,
    SYNAPSE_ORGANS,
)
from spectraflow_monai.data.label_map import apply_label_map, inverse_label_map
from spectraflow_monai.data.volumes import (
    VolumeHeader,
    canonical_volume,
    check_label_grid,
    read_label_volume,
    read_volume,
    volume_format,
    volume_header,
)
from spectraflow_monai.transforms.finite import check_finite
from spectraflow_monai.utils.errors import DataError, DatasetError

__all__ = [
    "finite_image",
    "is_h5",
    "read_h5_volume",
    "read_nifti_volume",
    "read_raw_volume",
    "segment_values",
    "class_values",
    "check_loaded_pair", "check_synapse_h5", "check_synapse_labels", "check_volume_pair", "import_nibabel",
    "load_nifti", "load_synapse_h5", "map_btcv_labels"]

def map_btcv_labels(label: Any, case: str | None = None, dtype: Any = None) -> Any:
    """Map BTCV label ids (0..13) to the 9 Synapse classes with a look-up table (:data:`BTCV_TO_SYNAPSE`).

    1 spleen -> 1, 2 right kidney -> 2, 3 left kidney -> 3, 4 gallbladder -> 4, 6 liver -> 5, 7 stomach -> 6,
    8 aorta -> 7, 11 pancreas -> 8, all other ids -> 0 (TransUNet protocol used by SpectraFlow, Chen et al.).

    Args:
        label: integer-valued ``np.ndarray`` or ``torch.Tensor`` of any shape.
        case: case id or file name used in error messages. Defaults to None.
        dtype: output dtype (numpy or torch, matching the input type); None keeps the input dtype.
            Defaults to None.

    Raises:
        ValueError: ``label`` holds values outside 0..13 or non-integral values (the message names ``case`` and
            the offending values).
    """
    where = f" of case {case}" if case is not None else ""
    if isinstance(label, torch.Tensor):
        lab = label.as_tensor() if hasattr(label, "as_tensor") else label
        idx = lab.round().long() if lab.is_floating_point() else lab.long()
        bad = (idx < 0) | (idx >= NUM_BTCV_LABELS)
        if lab.is_floating_point():
            bad |= idx.to(lab.dtype) != lab
        if bool(bad.any()):
            vals = torch.unique(lab[bad]).cpu().numpy()
            raise DataError(f"BTCV label{where} has values outside 0..13 or non-integral values: {_fmt(vals)}.")
        out = torch.as_tensor(BTCV_LUT, device=lab.device)[idx]
        return out.to(dtype if dtype is not None else label.dtype)
    arr = np.asarray(label)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating) or arr.dtype == bool):
        raise DataError(f"BTCV label{where} must be a numeric array, got dtype {arr.dtype}.")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        bad_range = lo < 0 or hi >= NUM_BTCV_LABELS
        bad_frac = np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.rint(arr))
        if bad_range or bad_frac:
            bad = (arr < 0) | (arr >= NUM_BTCV_LABELS) | (arr != np.rint(arr))
            raise DataError(
                f"BTCV label{where} has values outside 0..13 or non-integral values: {_fmt(np.unique(arr[bad]))}."
            )
    out_np = BTCV_LUT[arr.astype(np.intp, copy=False)]
    return out_np.astype(dtype if dtype is not None else arr.dtype, copy=False)


def check_synapse_labels(label: Any, num_classes: int = len(SYNAPSE_ORGANS), where: str | None = None) -> Any:
    """Check that ``label`` holds integer class ids in ``[0, num_classes)``; return it unchanged.

    Used for label maps that are already in Synapse classes (TransUNet's ``train_npz`` / ``test_vol_h5`` files),
    where a value outside 0..8 would otherwise fail later inside a one-hot conversion without naming the file.

    Args:
        label: ``np.ndarray`` or ``torch.Tensor`` of any shape.
        num_classes: number of classes including background. Defaults to 9 (Synapse).
        where: case id or file name used in error messages (e.g. ``"case 0001 (.../case0001.npy.h5)"``).
            Defaults to None.

    Raises:
        ValueError: values outside ``[0, num_classes)`` or non-integral values; the message names ``where`` and
            the offending values.
    """
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}.")
    arr = label
    if isinstance(arr, torch.Tensor):
        arr = (arr.as_tensor() if hasattr(arr, "as_tensor") else arr).detach().cpu().numpy()
    arr = np.asarray(arr)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise DataError(f"label{' of ' + where if where else ''} must be a numeric array, got dtype {arr.dtype}.")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        frac = np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.rint(arr))
        if lo < 0 or hi >= num_classes or frac:
            bad = np.unique(arr[(arr < 0) | (arr >= num_classes) | (arr != np.rint(arr))])
            raise DataError(
                f"label{' of ' + where if where else ''} has values outside the expected classes 0..{num_classes - 1} "
                f"or non-integral values: {_fmt(bad)}."
            )
    return label


def _fmt(values: np.ndarray, limit: int = 10) -> str:
    vals = [v.item() for v in np.asarray(values).ravel()[:limit]]
    more = f" ... ({values.size - limit} more)" if values.size > limit else ""
    return f"{vals}{more}"


def import_nibabel() -> Any:
    import nibabel  # a core dependency, imported where used to keep the module light

    return nibabel


def load_nifti(path: str | os.PathLike, case: str | None, what: str) -> Any:
    nib = import_nibabel()
    path = os.fspath(path)
    where = f"case {case}: " if case is not None else ""
    if not os.path.isfile(path):
        raise DatasetError(f"{where}{what} file {path!r} does not exist.")
    try:
        return nib.load(path)
    except Exception as e:  # nibabel raises ImageFileError, OSError, EOFError, ...
        raise DatasetError(f"{where}{what} file {path!r} is not a readable NIfTI image: {e}") from e


def _check_3d(header: VolumeHeader, case: str | None, what: str) -> None:
    if len(header.shape) != 3 or min(header.shape) < 2:
        where = f"case {case}: " if case is not None else ""
        raise DatasetError(
            f"{where}{what} file {header.path!r} is 2D or not a volume (shape {header.shape}); expected a 3D volume "
            "(H, W, D) with at least 2 voxels along each axis."
        )


def check_volume_pair(
    image_path: str | os.PathLike, label_path: str | os.PathLike | None, case: str | None = None
) -> dict[str, Any]:
    """Check that a CT volume and its label map are 3D and share shape and affine (reads headers only).

    The image is a NIfTI or NRRD file or a DICOM series folder (checked:
    :func:`~spectraflow_monai.data.dicom.check_dicom_series`), the label a NIfTI or NRRD file (3D Slicer's
    ``.seg.nrrd`` too) on the image's grid (:func:`~spectraflow_monai.data.volumes.check_label_grid`).

    Args:
        image_path: the image file (or DICOM series folder).
        label_path: the label file, or None to check the image alone.
        case: case id used in error messages. Defaults to None.

    Returns:
        ``{"shape": (H, W, D), "spacing": (sx, sy, sz), "affine": 4x4 array}`` of the image.

    Raises:
        DatasetError (a ``ValueError``): a file is missing or unreadable, is 2D, a DICOM series is bad, or the
            label's shape or affine (tolerance 1e-3) differs from the image's; the message names the case, the files
            and the problem.
        ImportError: an NRRD file or DICOM folder without pynrrd / pydicom (naming what to install).
    """
    image = volume_header(image_path, "image", case)
    _check_3d(image, case, "image")
    if label_path is not None:
        label = volume_header(label_path, "label", case)
        _check_3d(label, case, "label")
        check_label_grid(image, label, case)
    return {"shape": image.shape, "spacing": image.spacing, "affine": image.affine}


def check_loaded_pair(
    img: Any, lbl: Any, image_path: str | os.PathLike, label_path: str | os.PathLike | None, case: str | None
) -> dict[str, Any]:
    """:func:`check_volume_pair` of two NIfTI images loaded with nibabel already (``lbl`` may be None)."""

    def header(loaded: Any, path: str | os.PathLike) -> VolumeHeader:
        shape = tuple(int(v) for v in loaded.shape)
        while len(shape) > 3 and shape[-1] == 1:  # (H, W, D, 1) is a volume
            shape = shape[:-1]
        return VolumeHeader(os.fspath(path), "nifti", shape, np.asarray(loaded.affine, dtype=np.float64))

    image = header(img, image_path)
    _check_3d(image, case, "image")
    if lbl is not None and label_path is not None:
        label = header(lbl, label_path)
        _check_3d(label, case, "label")
        check_label_grid(image, label, case)
    spacing = tuple(float(z) for z in img.header.get_zooms()[:3])
    return {"shape": image.shape, "spacing": spacing, "affine": image.affine}


def _open_h5(path: str | os.PathLike) -> Any:
    """``h5py.File(path, "r")`` of a TransUNet volume; a missing or unreadable file raises :class:`DatasetError`."""
    try:
        import h5py
    except ImportError as e:
        raise ImportError(
            "reading TransUNet's test_vol_h5 files needs h5py: pip install spectraflow_monai[h5] (or pip install h5py)."
        ) from e
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DatasetError(f"TransUNet volume {path!r} does not exist.")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"TransUNet volume {path!r} is not a readable HDF5 file: {e}") from e


def _check_h5_datasets(f: Any, path: str) -> None:
    missing = [k for k in ("image", "label") if k not in f]
    if missing:
        raise DatasetError(f"TransUNet volume {path!r} lacks dataset(s) {missing} (has {sorted(f)}).")
    shapes = tuple(f["image"].shape), tuple(f["label"].shape)
    if len(shapes[0]) != 3 or shapes[0] != shapes[1]:
        raise DatasetError(
            f"TransUNet volume {path!r}: image and label must both be (D, H, W), got {shapes[0]} and {shapes[1]}."
        )


def check_synapse_h5(path: str | os.PathLike) -> None:
    """Check a TransUNet test volume from its structure only (no voxel is read): an HDF5 file holding ``image`` and
    ``label`` datasets of one (D, H, W) shape, as :func:`load_synapse_h5` needs.

    Raises:
        ImportError: h5py is not installed (``pip install spectraflow_monai[h5]``).
        DatasetError: the file is missing, unreadable, lacks a dataset or holds other shapes; naming it.
    """
    with _open_h5(path) as f:
        _check_h5_datasets(f, os.fspath(path))


def load_synapse_h5(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a TransUNet test volume ``test_vol_h5/caseXXXX.npy.h5``.

    The file stores ``image`` (windowed to [0, 1]) and ``label`` (Synapse classes) as ``(D, H, W)``; they are
    returned as ``(H, W, D)`` so that the axial axis is last, as for RAS NIfTI volumes (use
    ``monai.inferers.SliceInferer(spatial_dim=2)`` after adding channel and batch dimensions).

    Args:
        path: the ``.h5`` file.

    Raises:
        ImportError: h5py is not installed (``pip install spectraflow_monai[h5]``).
        DatasetError: the file is missing, unreadable, or lacks the ``image`` / ``label`` datasets
            (:func:`check_synapse_h5`).
    """
    path = os.fspath(path)
    with _open_h5(path) as f:
        _check_h5_datasets(f, path)
        try:
            image, label = np.asarray(f["image"][()]), np.asarray(f["label"][()])
        except OSError as e:
            raise DatasetError(f"TransUNet volume {path!r} is not a readable HDF5 file: {e}") from e
    return {"image": np.moveaxis(image, 0, -1), "label": np.moveaxis(label, 0, -1)}


# ----------------------------------------------------------------------------------------------------- slice cache


def is_h5(path: str | os.PathLike) -> bool:
    return os.fspath(path).lower().endswith(".h5")


def finite_image(image: np.ndarray, path: str, case: str, params: Mapping[str, Any], default: float) -> np.ndarray:
    """Apply the ``nonfinite`` setting of ``params`` to a volume just read (before the HU window hides ``inf``)."""

    mode, value = "error", default
    if params.get("nonfinite") is not None:
        mode = params["nonfinite"]["mode"]
        value = default if params["nonfinite"]["value"] is None else params["nonfinite"]["value"]
    try:
        return check_finite(image, path, mode=mode, value=value)
    except DataError as e:
        raise DatasetError(f"case {case}: {e}") from e


def read_h5_volume(
    image_path: str, label_path: str | None, case: str, params: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a TransUNet ``test_vol_h5`` volume (already windowed to [0, 1] and mapped to the Synapse classes)."""
    if label_path is not None and os.path.abspath(label_path) != os.path.abspath(image_path):
        raise DatasetError(
            f"case {case}: a TransUNet .h5 volume holds its own label; 'label' must be the same file as 'image' "
            f"({image_path!r}), got {label_path!r}."
        )
    data = load_synapse_h5(image_path)
    image = finite_image(data["image"].astype(np.float32, copy=False), image_path, case, params, 0.0)
    label = None
    if label_path is not None:
        label = check_synapse_labels(data["label"], where=f"case {case} ({image_path})").astype(np.uint8)
    return image, label


def _window(image: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
    # the HU window to [0, 1]: what CTWindow does (MONAI's ScaleIntensityRange, clipped); CTWindow itself lives above
    # this module (apps/synapse/transforms.py builds on the readers)
    low, high = params["window"]
    return np.asarray(ScaleIntensityRange(low, high, 0.0, 1.0, clip=True, dtype=np.float32)(image))


def _map_label(label: np.ndarray, label_path: str, case: str, params: Mapping[str, Any]) -> np.ndarray:
    """The label values of a volume as classes: the run's ``label_map``, else the BTCV map (``map_labels``), else
    stored as they are (integers that fit the uint8 cache)."""
    label = label.reshape(label.shape[:3])
    if params.get("label_map") is not None:  # a label map of the user's data (recorded in the cache index)
        where = f"of case {case} ({label_path})"
        try:
            return apply_label_map(label, params["label_map"], params.get("unmapped", "error"), where=where)
        except DataError as e:
            raise DatasetError(str(e)) from e
    if params["map_labels"]:
        return map_btcv_labels(label, case=f"{case} ({label_path})", dtype=np.uint8)
    return check_synapse_labels(label, num_classes=256, where=f"case {case} ({label_path})").astype(np.uint8)


def class_values(label_map: Any, btcv: bool, num_classes: int) -> list[int] | None:
    """The source value of every class (the inverse of ``label_map``, or of the BTCV map when ``btcv``), or None
    (class indices): what a 3D Slicer segmentation's class is written as before a run maps its labels to classes, so
    that the mapping gives the class back (liver -> BTCV 6 -> class 5)."""
    if label_map is not None:
        return inverse_label_map(label_map, num_classes)
    if btcv and num_classes == len(SYNAPSE_ORGANS):
        return inverse_label_map({0: 0, **BTCV_TO_SYNAPSE}, num_classes)
    return None


def segment_values(params: Mapping[str, Any]) -> list[int] | None:
    """:func:`class_values` of the slice cache's ``params`` (``label_map``, ``map_labels``, ``class_names``)."""
    names = params.get("class_names")
    if names is None:
        return None
    return class_values(params.get("label_map"), bool(params["map_labels"]), len(names))


def read_nifti_volume(
    image_path: str, label_path: str | None, case: str, params: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a raw BTCV NIfTI pair: RAS+ (``canonical``), HU window to [0, 1], BTCV ids mapped (``map_labels``)."""
    nib = import_nibabel()
    img = load_nifti(image_path, case, "image")  # headers only; the data is read once below
    lbl = load_nifti(label_path, case, "label") if label_path is not None else None
    check_loaded_pair(img, lbl, image_path, label_path, case)
    try:
        if params["canonical"]:
            img = nib.as_closest_canonical(img)
        image = np.asarray(img.get_fdata(dtype=np.float32))
    except Exception as e:  # truncated / corrupt data: zlib, EOF, OS errors
        raise DatasetError(f"case {case}: cannot read the image data of {image_path!r}: {e}") from e
    image = finite_image(image.reshape(image.shape[:3]), image_path, case, params, params["window"][0])
    image = _window(image, params)
    label = None
    if lbl is not None and label_path is not None:
        try:
            if params["canonical"]:
                lbl = nib.as_closest_canonical(lbl)
            label = np.asanyarray(lbl.dataobj)
        except Exception as e:
            raise DatasetError(f"case {case}: cannot read the label data of {label_path!r}: {e}") from e
        label = _map_label(label, label_path, case, params)
    return image, label


def read_raw_volume(
    image_path: str, label_path: str | None, case: str, params: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a CT volume in HU and its label for the slice cache, whatever their kinds: NIfTI pairs as
    :func:`read_nifti_volume`; NRRD files and DICOM series folders through
    :class:`~spectraflow_monai.data.volumes.VolumeReader` (a 3D Slicer segmentation mapped to ``params["class_names"]``
    by segment name, :func:`segment_values`). Both are checked to lie on one grid, reoriented to RAS+
    (``canonical``), the image windowed, the label mapped to the classes as NIfTI labels are.

    Raises:
        DatasetError: naming the case and the file: unreadable, not on one grid, a bad DICOM series, a segment that
            is no class, values the label map does not list.
    """
    nifti = volume_format(image_path) == "nifti" and (label_path is None or volume_format(label_path) == "nifti")
    if nifti:
        return read_nifti_volume(image_path, label_path, case, params)
    check_volume_pair(image_path, label_path, case)
    image, affine = read_volume(image_path, case)
    if params["canonical"]:
        image, _ = canonical_volume(image, affine)
    image = _window(finite_image(image, image_path, case, params, params["window"][0]), params)
    label = None
    if label_path is not None:
        label, label_affine = read_label_volume(label_path, params.get("class_names"), segment_values(params), case)
        if params["canonical"]:
            label, _ = canonical_volume(label, label_affine)
        label = _map_label(label, label_path, case, params)
    return image, label
