"""Synapse multi-organ CT (BTCV) data for the 3D experiment of SpectraFlow.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") reports organ-wise DSC on the Synapse multi-organ CT data set (MICCAI 2015 "Multi-Atlas Labeling
Beyond the Cranial Vault", BTCV) following the protocol of TransUNet (Chen et al., arXiv:2102.04306):

- 30 labelled abdominal CT volumes, 18 for training (:data:`SYNAPSE_TRAIN_CASES`) and 12 for testing
  (:data:`SYNAPSE_TEST_CASES`);
- CT numbers clipped to [-125, 275] HU and rescaled to [0, 1];
- the 13 BTCV organ labels reduced to 8 (:data:`BTCV_TO_SYNAPSE`; channel names :data:`SYNAPSE_ORGANS`);
- training on 2D axial slices, evaluation on the 3D volumes.

Two on-disk layouts are understood by :func:`synapse_datalist`:

``raw`` (the BTCV release)::

    <root>/RawData/Training/img/img0001.nii.gz
    <root>/RawData/Training/label/label0001.nii.gz

``transunet`` (TransUNet's preprocessed release; already windowed and label-mapped)::

    <root>/train_npz/case0005_slice000.npz       keys image, label; (H, W)
    <root>/test_vol_h5/case0001.npy.h5           keys image, label; (D, H, W); needs h5py

:func:`extract_slices` turns raw volumes (and TransUNet's test volumes) into a cache of TransUNet-like ``.npz``
slices (read once, reused on later calls), loaded by :class:`spectraflow_monai.transforms.LoadSynapseSliced`.
:func:`build_synapse_datalist` is the entry point of the ``spectraflow_synapse_segmentation`` bundle (data set
presets, the synthetic phantom generated on first use, volume checks, the slice cache).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.transforms import ScaleIntensityRange

from spectraflow_monai.data.label_map import LABEL_MAP_UNMAPPED, apply_label_map, check_label_map
from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.utils.errors import DataError, SettingError
from spectraflow_monai.utils.files import atomic_path, write_text_atomic
from spectraflow_monai.utils.settings import check_image_size

__all__ = [
    "SYNAPSE_TRAIN_CASES",
    "SYNAPSE_TEST_CASES",
    "BTCV_TO_SYNAPSE",
    "BTCV_LABEL_NAMES",
    "SYNAPSE_ORGANS",
    "format_case_id",
    "synapse_datalist",
    "map_btcv_labels",
    "check_volume_pair",
    "check_synapse_labels",
    "load_synapse_h5",
    "extract_slices",
    "SYNAPSE_BUNDLE_DATASETS",
]

logger = logging.getLogger(__name__)

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

_NUM_BTCV_LABELS = len(BTCV_LABEL_NAMES)
_LUT = np.zeros(_NUM_BTCV_LABELS, dtype=np.uint8)
for _k, _v in BTCV_TO_SYNAPSE.items():
    _LUT[_k] = _v

_RAW_IMAGE = "RawData/Training/img/img{case}.nii.gz"
_RAW_LABEL = "RawData/Training/label/label{case}.nii.gz"
_TU_TRAIN_DIR = "train_npz"
_TU_TEST = "test_vol_h5/case{case}.npy.h5"
_TU_SLICE = re.compile(r"^case(\d+)_slice(\d+)\.npz$")
_CASE_ID = re.compile(r"^(?:case|img|label)?(\d+)$")
_NIFTI_SUFFIX = re.compile(r"\.nii(\.gz)?$")
_INDEX_NAME = "index.json"
_INDEX_VERSION = 1
_AFFINE_TOL = 1e-3


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
        m = _CASE_ID.match(case.strip())
        if m:
            return f"{int(m.group(1)):04d}"
    raise ValueError(f"case id must be an int or a digit string such as '0005' or 'case0005', got {case!r}.")


def _case_list(cases: Sequence[int | str] | None, split: str) -> list[str]:
    if cases is None:
        cases = SYNAPSE_TRAIN_CASES if split == "train" else SYNAPSE_TEST_CASES
    elif isinstance(cases, (str, int)):
        cases = [cases]
    ids = [format_case_id(c) for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"cases contains duplicates: {list(cases)!r}.")
    return ids


def _resolve_layout(root: Path, split: str, layout: str) -> str:
    if layout != "auto":
        return layout
    if (root / "RawData" / "Training").is_dir():
        return "raw"
    tu_dir = root / (_TU_TRAIN_DIR if split == "train" else os.path.dirname(_TU_TEST))
    if tu_dir.is_dir():
        return "transunet"
    raise DatasetError(
        f"cannot detect the Synapse layout under {str(root)!r}: expected the raw BTCV folder "
        f"{str(root / 'RawData' / 'Training')!r} or TransUNet's {str(tu_dir)!r}."
    )


def _missing_error(split: str, missing: list[tuple[str, str]]) -> DatasetError:
    shown = "; ".join(f"case {c}: {p!r}" for c, p in missing[:5])
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    return DatasetError(f"Synapse {split} split: {len(missing)} case(s) missing, expected {shown}{more}.")


def synapse_datalist(
    root: str | os.PathLike,
    split: str = "train",
    layout: str = "auto",
    cases: Sequence[int | str] | None = None,
) -> list[dict[str, Any]]:
    """Build the MONAI datalist of a Synapse split.

    Args:
        root: folder holding the data set (``RawData/`` for the raw layout; ``train_npz/`` / ``test_vol_h5/`` for
            the TransUNet layout).
        split: ``"train"`` or ``"test"``; selects the TransUNet case list when ``cases`` is None (and, for the
            TransUNet layout, the ``train_npz`` slices or the ``test_vol_h5`` volumes). Defaults to ``"train"``.
        layout: ``"raw"``, ``"transunet"`` or ``"auto"`` (raw when ``<root>/RawData/Training`` exists, else
            TransUNet). Defaults to ``"auto"``.
        cases: case ids to list instead of the split's official ones (ints or strings such as ``"0005"``).
            Defaults to None.

    Returns:
        - raw: one entry per volume ``{"image": img.nii.gz, "label": label.nii.gz, "case": "0005"}``;
        - TransUNet train: one entry per slice ``{"image": npz, "label": npz, "case": "0005", "slice": 0}``
          (load with :class:`spectraflow_monai.transforms.LoadSynapseSliced`);
        - TransUNet test: one entry per volume ``{"image": h5, "label": h5, "case": "0001"}`` (read with
          :func:`load_synapse_h5`).

    Raises:
        ValueError: bad ``split`` / ``layout`` / ``cases``.
        DatasetError: ``root`` or a case of the split is missing (the message names the case and the path).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    if layout not in ("auto", "raw", "transunet"):
        raise ValueError(f"layout must be 'auto', 'raw' or 'transunet', got {layout!r}.")
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"Synapse root {str(root)!r} is not a directory.")
    ids = _case_list(cases, split)
    layout = _resolve_layout(root, split, layout)
    missing: list[tuple[str, str]] = []
    out: list[dict[str, Any]] = []
    if layout == "raw":
        for c in ids:
            img, lbl = root / _RAW_IMAGE.format(case=c), root / _RAW_LABEL.format(case=c)
            for p in (img, lbl):
                if not p.is_file():
                    missing.append((c, str(p)))
            out.append({"image": str(img), "label": str(lbl), "case": c})
    elif split == "test":
        for c in ids:
            p = root / _TU_TEST.format(case=c)
            if not p.is_file():
                missing.append((c, str(p)))
            out.append({"image": str(p), "label": str(p), "case": c})
    else:
        folder = root / _TU_TRAIN_DIR
        slices: dict[str, list[tuple[int, str]]] = {}
        if folder.is_dir():
            for name in os.listdir(folder):
                m = _TU_SLICE.match(name)
                if m:
                    slices.setdefault(f"{int(m.group(1)):04d}", []).append((int(m.group(2)), str(folder / name)))
        for c in ids:
            if c not in slices:
                missing.append((c, str(folder / f"case{c}_slice*.npz")))
                continue
            for k, p in sorted(slices[c]):
                out.append({"image": p, "label": p, "case": c, "slice": k})
    if missing:
        raise _missing_error(split, missing)
    return out


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
        bad = (idx < 0) | (idx >= _NUM_BTCV_LABELS)
        if lab.is_floating_point():
            bad |= idx.to(lab.dtype) != lab
        if bool(bad.any()):
            vals = torch.unique(lab[bad]).cpu().numpy()
            raise ValueError(f"BTCV label{where} has values outside 0..13 or non-integral values: {_fmt(vals)}.")
        out = torch.as_tensor(_LUT, device=lab.device)[idx]
        return out.to(dtype if dtype is not None else label.dtype)
    arr = np.asarray(label)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating) or arr.dtype == bool):
        raise ValueError(f"BTCV label{where} must be a numeric array, got dtype {arr.dtype}.")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        bad_range = lo < 0 or hi >= _NUM_BTCV_LABELS
        bad_frac = np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.rint(arr))
        if bad_range or bad_frac:
            bad = (arr < 0) | (arr >= _NUM_BTCV_LABELS) | (arr != np.rint(arr))
            raise ValueError(
                f"BTCV label{where} has values outside 0..13 or non-integral values: {_fmt(np.unique(arr[bad]))}."
            )
    out_np = _LUT[arr.astype(np.intp, copy=False)]
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
        raise ValueError(f"label{' of ' + where if where else ''} must be a numeric array, got dtype {arr.dtype}.")
    if arr.size:
        lo, hi = arr.min(), arr.max()
        frac = np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.rint(arr))
        if lo < 0 or hi >= num_classes or frac:
            bad = np.unique(arr[(arr < 0) | (arr >= num_classes) | (arr != np.rint(arr))])
            raise ValueError(
                f"label{' of ' + where if where else ''} has values outside the expected classes 0..{num_classes - 1} "
                f"or non-integral values: {_fmt(bad)}."
            )
    return label


def _fmt(values: np.ndarray, limit: int = 10) -> str:
    vals = [v.item() for v in np.asarray(values).ravel()[:limit]]
    more = f" ... ({values.size - limit} more)" if values.size > limit else ""
    return f"{vals}{more}"


def _nib() -> Any:
    import nibabel  # a core dependency, imported where used to keep the module light

    return nibabel


def _load_nifti(path: str | os.PathLike, case: str | None, what: str) -> Any:
    nib = _nib()
    path = os.fspath(path)
    where = f"case {case}: " if case is not None else ""
    if not os.path.isfile(path):
        raise DatasetError(f"{where}{what} file {path!r} does not exist.")
    try:
        return nib.load(path)
    except Exception as e:  # nibabel raises ImageFileError, OSError, EOFError, ...
        raise DatasetError(f"{where}{what} file {path!r} is not a readable NIfTI image: {e}") from e


def _volume_shape(img: Any, path: str, case: str | None, what: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in img.shape)
    while len(shape) > 3 and shape[-1] == 1:  # (H, W, D, 1) is a volume
        shape = shape[:-1]
    where = f"case {case}: " if case is not None else ""
    if len(shape) != 3 or min(shape) < 2:
        raise DatasetError(
            f"{where}{what} file {path!r} is 2D or not a volume (shape {tuple(img.shape)}); expected a 3D volume "
            "(H, W, D) with at least 2 voxels along each axis."
        )
    return shape


def check_volume_pair(
    image_path: str | os.PathLike, label_path: str | os.PathLike | None, case: str | None = None
) -> dict[str, Any]:
    """Check that a CT volume and its label map are 3D and share shape and affine (reads headers only).

    Args:
        image_path: the image NIfTI file.
        label_path: the label NIfTI file, or None to check the image alone.
        case: case id used in error messages. Defaults to None.

    Returns:
        ``{"shape": (H, W, D), "spacing": (sx, sy, sz), "affine": 4x4 array}`` of the image.

    Raises:
        DatasetError (a ``ValueError``): a file is missing or unreadable, is 2D, or the label's shape or
            affine (tolerance 1e-3) differs from the image's; the message names the case, the files and the
            problem.
    """
    img = _load_nifti(image_path, case, "image")
    lbl = _load_nifti(label_path, case, "label") if label_path is not None else None
    return _check_loaded_pair(img, lbl, image_path, label_path, case)


def _check_loaded_pair(
    img: Any, lbl: Any, image_path: str | os.PathLike, label_path: str | os.PathLike | None, case: str | None
) -> dict[str, Any]:
    where = f"case {case}: " if case is not None else ""
    shape = _volume_shape(img, os.fspath(image_path), case, "image")
    affine = np.asarray(img.affine, dtype=np.float64)
    if lbl is not None and label_path is not None:
        lshape = _volume_shape(lbl, os.fspath(label_path), case, "label")
        if lshape != shape:
            raise DatasetError(
                f"{where}label {os.fspath(label_path)!r} has shape {lshape} but image {os.fspath(image_path)!r} "
                f"has shape {shape}."
            )
        laffine = np.asarray(lbl.affine, dtype=np.float64)
        diff = float(np.abs(laffine - affine).max())
        if diff > _AFFINE_TOL:
            raise DatasetError(
                f"{where}label {os.fspath(label_path)!r} and image {os.fspath(image_path)!r} have different affines "
                f"(max abs difference {diff:.4g} > {_AFFINE_TOL}):\nimage\n{affine}\nlabel\n{laffine}"
            )
    spacing = tuple(float(z) for z in img.header.get_zooms()[:3])
    return {"shape": shape, "spacing": spacing, "affine": affine}


def load_synapse_h5(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a TransUNet test volume ``test_vol_h5/caseXXXX.npy.h5``.

    The file stores ``image`` (windowed to [0, 1]) and ``label`` (Synapse classes) as ``(D, H, W)``; they are
    returned as ``(H, W, D)`` so that the axial axis is last, as for RAS NIfTI volumes (use
    ``monai.inferers.SliceInferer(spatial_dim=2)`` after adding channel and batch dimensions).

    Args:
        path: the ``.h5`` file.

    Raises:
        ImportError: h5py is not installed (``pip install spectraflow_monai[h5]``).
        DatasetError: the file is missing, unreadable, or lacks the ``image`` / ``label`` datasets.
    """
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
        with h5py.File(path, "r") as f:
            missing = [k for k in ("image", "label") if k not in f]
            if missing:
                raise DatasetError(f"TransUNet volume {path!r} lacks dataset(s) {missing} (has {sorted(f)}).")
            image, label = np.asarray(f["image"][()]), np.asarray(f["label"][()])
    except OSError as e:
        raise DatasetError(f"TransUNet volume {path!r} is not a readable HDF5 file: {e}") from e
    if image.ndim != 3 or image.shape != label.shape:
        raise DatasetError(
            f"TransUNet volume {path!r}: image and label must both be (D, H, W), got {image.shape} and {label.shape}."
        )
    return {"image": np.moveaxis(image, 0, -1), "label": np.moveaxis(label, 0, -1)}


# ----------------------------------------------------------------------------------------------------- slice cache
def _atomic_write_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1))


def _atomic_write_npz(path: Path, **arrays: np.ndarray) -> None:
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _file_signature(path: str | os.PathLike | None) -> dict[str, Any] | None:
    if path is None:
        return None
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return {"path": p, "mtime_ns": None, "size": None}
    return {"path": p, "mtime_ns": st.st_mtime_ns, "size": st.st_size}


def _confined(folder: Path, rel: Any, index_path: Path, entry: str) -> str:
    """Return ``rel`` when it names a file inside ``folder``: a relative path without ``..`` whose real path (links
    resolved) lies inside the real path of ``folder``; else raise :class:`DatasetError` naming the index file and
    the entry. Every path read from the slice cache index goes through here before it is read or removed."""
    problem = None
    if not isinstance(rel, str) or not rel.strip():
        problem = "not a relative file path"
    elif os.path.isabs(rel) or rel.startswith(("/", "\\")):
        problem = "an absolute path"
    elif ".." in re.split(r"[\\/]", rel):
        problem = "a path with '..'"
    else:
        base = os.path.realpath(folder)
        full = os.path.realpath(os.path.join(base, rel))
        if full == base or os.path.commonpath([base, full]) != base:
            problem = "a path outside the cache folder"
    if problem is not None:
        raise DatasetError(
            f"slice cache index {os.fspath(index_path)!r}: entry {entry} = {rel!r} is {problem} (the index may only "
            f"list files inside {os.fspath(folder)!r}); refusing to use it. Delete that index.json (or the whole "
            "cache folder) to rebuild the cache."
        )
    return rel


def _read_index(path: Path) -> dict[str, Any]:
    """Read the slice cache index; an unreadable or unknown index is rebuilt, one listing a file outside the cache
    folder (an absolute path, ``..``, a link leading out) is refused with a :class:`DatasetError`."""
    if not path.is_file():
        return {"version": _INDEX_VERSION, "volumes": {}}
    try:
        with open(path) as f:
            index = json.load(f)
        known = isinstance(index, dict) and index.get("version") == _INDEX_VERSION
        if known and isinstance(index.get("volumes"), dict):
            for case, rec in index["volumes"].items():
                files = rec.get("files") if isinstance(rec, dict) else None
                if not isinstance(files, list):
                    raise DatasetError(
                        f"slice cache index {os.fspath(path)!r}: entry volumes[{case!r}] has no list of files "
                        f"({rec!r}); delete that index.json (or the whole cache folder) to rebuild the cache."
                    )
                for i, rel in enumerate(files):
                    _confined(path.parent, rel, path, f"volumes[{case!r}].files[{i}]")
            return index
        logger.warning("slice cache index %s has an unknown format; rebuilding the cache.", path)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        logger.warning("slice cache index %s is unreadable (%s); rebuilding the cache.", path, e)
    return {"version": _INDEX_VERSION, "volumes": {}}


def _case_of(entry: Mapping[str, Any]) -> str:
    if entry.get("case") is not None:
        case = str(entry["case"])
        try:
            return format_case_id(case)
        except ValueError:
            return case
    name = _NIFTI_SUFFIX.sub("", os.path.basename(os.fspath(entry["image"])))
    try:
        return format_case_id(name)
    except ValueError:
        return name


def _resize_slices(vol: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """Resize each axial slice of ``vol`` (H, W, D) to ``size``."""
    t = torch.from_numpy(np.ascontiguousarray(np.moveaxis(vol, -1, 0)))[:, None].float()  # (D, 1, H, W)
    kwargs = {"align_corners": False} if mode == "bilinear" else {}
    t = torch.nn.functional.interpolate(t, size=size, mode=mode, **kwargs)
    return np.moveaxis(t[:, 0].numpy(), 0, -1)


def _is_h5(path: str | os.PathLike) -> bool:
    return os.fspath(path).lower().endswith(".h5")


def _finite_image(image: np.ndarray, path: str, case: str, params: Mapping[str, Any], default: float) -> np.ndarray:
    """Apply the ``nonfinite`` setting of ``params`` to a volume just read (before the HU window hides ``inf``)."""
    from spectraflow_monai.transforms.finite import check_finite  # lazy: transforms imports this module

    mode, value = "error", default
    if params.get("nonfinite") is not None:
        mode = params["nonfinite"]["mode"]
        value = default if params["nonfinite"]["value"] is None else params["nonfinite"]["value"]
    try:
        return check_finite(image, path, mode=mode, value=value)
    except DataError as e:
        raise DatasetError(f"case {case}: {e}") from e


def _read_h5_volume(
    image_path: str, label_path: str | None, case: str, params: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a TransUNet ``test_vol_h5`` volume (already windowed to [0, 1] and mapped to the Synapse classes)."""
    if label_path is not None and os.path.abspath(label_path) != os.path.abspath(image_path):
        raise ValueError(
            f"case {case}: a TransUNet .h5 volume holds its own label; 'label' must be the same file as 'image' "
            f"({image_path!r}), got {label_path!r}."
        )
    data = load_synapse_h5(image_path)
    image = _finite_image(data["image"].astype(np.float32, copy=False), image_path, case, params, 0.0)
    label = None
    if label_path is not None:
        label = check_synapse_labels(data["label"], where=f"case {case} ({image_path})").astype(np.uint8)
    return image, label


def _read_nifti_volume(
    image_path: str, label_path: str | None, case: str, params: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a raw BTCV NIfTI pair: RAS+ (``canonical``), HU window to [0, 1], BTCV ids mapped (``map_labels``)."""
    nib = _nib()
    img = _load_nifti(image_path, case, "image")  # headers only; the data is read once below
    lbl = _load_nifti(label_path, case, "label") if label_path is not None else None
    _check_loaded_pair(img, lbl, image_path, label_path, case)
    try:
        if params["canonical"]:
            img = nib.as_closest_canonical(img)
        image = np.asarray(img.get_fdata(dtype=np.float32))
    except Exception as e:  # truncated / corrupt data: zlib, EOF, OS errors
        raise DatasetError(f"case {case}: cannot read the image data of {image_path!r}: {e}") from e
    image = _finite_image(image.reshape(image.shape[:3]), image_path, case, params, params["window"][0])
    # the HU window to [0, 1]: what transforms.CTWindow does (MONAI's ScaleIntensityRange, clipped); the transform
    # itself is not imported here, because transforms.ct builds on this module
    low, high = params["window"]
    image = np.asarray(ScaleIntensityRange(low, high, 0.0, 1.0, clip=True, dtype=np.float32)(image))
    label = None
    if lbl is not None:
        try:
            if params["canonical"]:
                lbl = nib.as_closest_canonical(lbl)
            label = np.asanyarray(lbl.dataobj)
        except Exception as e:
            raise DatasetError(f"case {case}: cannot read the label data of {label_path!r}: {e}") from e
        label = label.reshape(label.shape[:3])
        if params.get("label_map") is not None:  # a label map of the user's data (recorded in the cache index)
            where = f"of case {case} ({label_path})"
            try:
                label = apply_label_map(label, params["label_map"], params.get("unmapped", "error"), where=where)
            except DataError as e:
                raise DatasetError(str(e)) from e
        elif params["map_labels"]:
            label = map_btcv_labels(label, case=f"{case} ({label_path})", dtype=np.uint8)
        else:  # stored as they are: integers that fit the uint8 cache
            label = check_synapse_labels(label, num_classes=256, where=f"case {case} ({label_path})").astype(np.uint8)
    return image, label


def _extract_volume(entry: Mapping[str, Any], case: str, cache: Path, params: Mapping[str, Any]) -> dict[str, Any]:
    """Write the slices of one volume; return its index record (paths relative to ``cache``)."""
    image_path = os.fspath(entry["image"])
    label_path = os.fspath(entry["label"]) if entry.get("label") is not None else None
    if _is_h5(image_path):
        image, label = _read_h5_volume(image_path, label_path, case, params)
    else:
        image, label = _read_nifti_volume(image_path, label_path, case, params)
    if params["spatial_size"] is not None:
        size = tuple(params["spatial_size"])
        image = _resize_slices(image, size, "bilinear")
        if label is not None:
            label = _resize_slices(label, size, "nearest-exact").astype(np.uint8)
    image = image.astype(params["image_dtype"], copy=False)
    (cache / f"case{case}").mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(image.shape[-1]):
        rel = f"case{case}/case{case}_slice{k:03d}.npz"
        arrays = {"image": np.ascontiguousarray(image[..., k])}
        if label is not None:
            arrays["label"] = np.ascontiguousarray(label[..., k])
        _atomic_write_npz(cache / rel, **arrays)
        files.append(rel)
    return {"files": files, "has_label": label is not None, "shape": list(image.shape)}


def extract_slices(
    datalist: Sequence[Mapping[str, Any]],
    cache_dir: str | os.PathLike,
    window: Sequence[float] = (-125.0, 275.0),
    spatial_size: Sequence[int] | None = None,
    image_dtype: str = "float32",
    map_labels: bool = True,
    canonical: bool = True,
    progress: bool = True,
    nonfinite: str = "error",
    nonfinite_value: float | None = None,
    label_map: Mapping[int, int] | None = None,
    unmapped_labels: str = "error",
) -> list[dict[str, Any]]:
    """Cache the axial slices of CT volumes as TransUNet-like ``.npz`` files and return a slice datalist.

    Each volume is read once: the image is windowed to [0, 1] (TransUNet: clip to [-125, 275] HU, then rescale;
    :class:`spectraflow_monai.transforms.CTWindow`), the label is mapped from BTCV ids to the 9 Synapse classes
    (:func:`map_btcv_labels`), and every axial slice is written (atomically) to
    ``<cache_dir>/case<id>/case<id>_slice<k>.npz`` with arrays ``image`` (H, W) and ``label`` (H, W, uint8). An
    index (``<cache_dir>/index.json``, updated after every volume) records each source's path, modification time
    and size and the extraction settings; a later call skips every volume whose record still matches, so an
    interrupted extraction resumes where it stopped. The axial axis is the last axis of the volume after
    reorientation to the closest RAS+ orientation (``canonical=True``), so the slices match a 3D evaluation
    pipeline ``LoadImaged -> EnsureChannelFirstd -> Orientationd(axcodes="RAS")`` with
    ``monai.inferers.SliceInferer(spatial_dim=2)``.

    TransUNet's test volumes (``test_vol_h5/caseXXXX.npy.h5`` entries of :func:`synapse_datalist`; ``"label"``
    the same file or absent) are cached the same way, except that they are already windowed and mapped: the
    window, ``map_labels`` and ``canonical`` do not apply to them and their labels must be Synapse classes 0..8.

    Every image volume is checked for NaN and infinite voxels as it is read (``nonfinite``). The index lists only
    files inside ``cache_dir``: an index naming an absolute path, a path with ``..`` or a link leading out of the
    folder is refused (a :class:`DatasetError` naming the index and the entry), so that no file outside the cache
    is ever read or removed.

    Args:
        datalist: entries ``{"image": nifti, "label": nifti (optional), "case": id (optional)}``, e.g. from
            :func:`synapse_datalist` with the raw layout, or TransUNet ``.h5`` volumes. Without ``"case"``, the id
            is taken from the file name.
        cache_dir: folder of the cache (created if needed).
        window: HU window ``(a_min, a_max)``. Defaults to ``(-125, 275)``.
        spatial_size: optional ``(H, W)`` every slice is resized to (image bilinear, label nearest). Defaults to
            None (native size).
        image_dtype: ``"float32"`` or ``"float16"`` (halves the cache size). Defaults to ``"float32"``.
        map_labels: map BTCV ids to Synapse classes; False stores the label ids as they are. Defaults to True.
        canonical: reorient each volume to the closest RAS+ orientation before slicing. Defaults to True.
        progress: show a progress bar (tqdm) while extracting. Defaults to True.
        nonfinite: what to do with NaN / infinite image voxels: ``"error"`` stops with a :class:`DatasetError`
            naming the case, the file and the count; ``"replace"`` replaces them by ``nonfinite_value`` before the
            window and logs the file and the count (see :mod:`spectraflow_monai.transforms.finite`). Defaults to
            ``"error"``.
        nonfinite_value: the replacement for ``"replace"``, in the units of the file; None: the window's lower
            bound ``a_min`` for NIfTI volumes (HU) and 0 for TransUNet's windowed ``.h5`` volumes, i.e. black after
            windowing. Defaults to None.
        label_map: ``{source label value: class}`` applied to NIfTI labels instead of the BTCV map (and instead
            of ``map_labels``), e.g. for a Decathlon data set (:mod:`spectraflow_monai.data.label_map`); it is
            recorded in the cache index, so a changed map re-extracts the volumes. Not applied to TransUNet's
            ``.h5`` volumes. Defaults to None.
        unmapped_labels: with ``label_map``: label values the map does not list stop with a :class:`DatasetError`
            naming the case, the file and the values (``"error"``) or become background 0 (``"background"``).
            Defaults to ``"error"``.

    Returns:
        the slice datalist ``[{"image": npz, "label": npz, "case": "0005", "slice": k}, ...]`` (``"label"`` only
        when the entry had one), in datalist order; load it with
        :class:`spectraflow_monai.transforms.LoadSynapseSliced`.

    Raises:
        ValueError: bad arguments, entries without ``"image"``, a case id that is not a plain file name part, two
            entries with the same case id, label values outside the expected set (the message names the case).
        DatasetError: a volume is missing, unreadable, 2D, mismatched with its label, or holds non-finite voxels
            (``nonfinite="error"``); the cache index lists a path outside ``cache_dir``.
    """
    from spectraflow_monai.transforms.finite import check_nonfinite_args  # lazy: transforms imports this module

    if len(window) != 2:
        raise ValueError(f"window must be (a_min, a_max), got {window!r}.")
    a_min, a_max = float(window[0]), float(window[1])
    if not a_max > a_min:
        raise ValueError(f"window must satisfy a_min < a_max, got {window!r}.")
    if spatial_size is not None:
        if len(spatial_size) != 2 or any(int(s) != s or s < 1 for s in spatial_size):
            raise ValueError(f"spatial_size must be None or two positive ints (H, W), got {spatial_size!r}.")
        spatial_size = [int(s) for s in spatial_size]
    if image_dtype not in ("float32", "float16"):
        raise ValueError(f"image_dtype must be 'float32' or 'float16', got {image_dtype!r}.")
    if nonfinite_value is not None:
        nonfinite_value = check_nonfinite_args(nonfinite, nonfinite_value, "nonfinite", "nonfinite_value")
    else:
        check_nonfinite_args(nonfinite, 0.0, "nonfinite", "nonfinite_value")
    if unmapped_labels not in LABEL_MAP_UNMAPPED:
        raise ValueError(f"unmapped_labels must be one of {list(LABEL_MAP_UNMAPPED)}, got {unmapped_labels!r}.")
    if label_map is not None:
        label_map = check_label_map(label_map, 256)
    cases: dict[str, str] = {}
    for i, entry in enumerate(datalist):
        if not isinstance(entry, Mapping) or "image" not in entry:
            raise ValueError(f"datalist[{i}] must be a mapping with an 'image' path, got {entry!r}.")
        case = _case_of(entry)
        if not case or case in (".", "..") or "/" in case or "\\" in case:
            raise ValueError(
                f"datalist[{i}] has the case id {case!r}: case ids name the cache files (case<id>/...) and must not "
                "hold '/', '\\' or be '.' / '..'."
            )
        src = os.path.abspath(os.fspath(entry["image"]))
        if cases.setdefault(case, src) != src:
            raise ValueError(f"datalist has two volumes with case id {case!r}: {cases[case]!r} and {src!r}.")
    params = {
        "window": [a_min, a_max],
        "spatial_size": spatial_size,
        "image_dtype": image_dtype,
        "map_labels": bool(map_labels),
        "canonical": bool(canonical),
    }
    if nonfinite == "replace":  # recorded only then, so that caches built before the option existed stay valid
        params["nonfinite"] = {"mode": "replace", "value": nonfinite_value}
    if label_map is not None:  # likewise: a changed map (or unmapped rule) re-extracts the volumes
        params["label_map"] = [[k, v] for k, v in sorted(label_map.items())]
        params["unmapped"] = unmapped_labels
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    index_path = cache / _INDEX_NAME
    index = _read_index(index_path)
    volumes: dict[str, Any] = index["volumes"]

    todo = []
    for entry in datalist:
        case = _case_of(entry)
        source = {"image": _file_signature(entry["image"]), "label": _file_signature(entry.get("label"))}
        rec = volumes.get(case)
        if (
            rec is not None
            and rec.get("source") == source
            and rec.get("params") == params
            and "has_label" in rec
            and all((cache / f).is_file() for f in rec["files"])
        ):
            continue
        todo.append((entry, case, source))

    bar = None
    if progress and todo:
        from monai.utils import optional_import

        tqdm, has_tqdm = optional_import("tqdm", name="tqdm")
        if has_tqdm:
            bar = tqdm(total=len(todo), desc="extracting Synapse slices", unit="volume")
    try:
        for entry, case, source in todo:
            logger.info("extracting axial slices of case %s from %s", case, entry["image"])
            old = volumes.pop(case, None)
            rec = _extract_volume(entry, case, cache, params)
            if old is not None:  # drop stale slices of an earlier extraction
                for f in set(old.get("files", [])) - set(rec["files"]):
                    if (cache / f).is_file():
                        os.remove(cache / f)
            volumes[case] = {"source": source, "params": params, **rec}
            _atomic_write_json(index_path, index)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if todo:
        logger.info("extracted %d volume(s) into %s; %d reused", len(todo), cache, len(datalist) - len(todo))
    out: list[dict[str, Any]] = []
    for entry in datalist:
        case = _case_of(entry)
        rec = volumes[case]
        for k, f in enumerate(rec["files"]):
            item: dict[str, Any] = {"image": str(cache / f), "case": case, "slice": k}
            if rec["has_label"]:
                item["label"] = str(cache / f)
            out.append(item)
    return out


# ---------------------------------------------------------------------------------------------- bundle entry point
#: the data sets of the ``spectraflow_synapse_segmentation`` bundle (see :func:`build_synapse_datalist`).
SYNAPSE_BUNDLE_DATASETS: tuple[str, ...] = ("synthetic", "btcv", "transunet")
