"""Volumes as the bundles read them: NIfTI and NRRD files, DICOM series folders; labels of any of the file kinds,
3D Slicer segmentations (``.seg.nrrd``) mapped to the bundle's classes by segment name.

Labels come from several places: the data sets (NIfTI), 3D Slicer (``.nrrd`` label maps and ``.seg.nrrd``
segmentations), a PACS (DICOM SEG, which MONAI Label stores as NRRD). One set of readers serves every path of the
bundles (the datalists' header checks, the Synapse slice cache, MONAI Label's training pairs, evaluation and
inference):

- :func:`volume_format` says what a path is: ``"nifti"`` (``.nii``, ``.nii.gz``), ``"nrrd"`` (``.nrrd``,
  ``.seg.nrrd``, ``.nhdr``) or ``"dicom"`` (a folder holding one DICOM series, :mod:`spectraflow_monai.data.dicom`);
- :func:`volume_header` reads the shape and the voxel -> RAS affine without reading voxels;
  :func:`check_label_grid` refuses a label that is not on its image's grid (other size or geometry) in one line
  naming both files;
- :class:`VolumeReader` is a MONAI ``ImageReader`` for ``LoadImage(d)`` over all three (MONAI's ``NibabelReader``,
  ``NrrdReader`` and, after :func:`~spectraflow_monai.data.dicom.check_dicom_series`, ``PydicomReader``), so that
  one pipeline takes every kind of input; :func:`read_volume` and :func:`read_label_volume` read a file with it.

A segmentation (an NRRD file whose header holds 3D Slicer's ``Segment<N>_Name`` / ``Segment<N>_LabelValue`` keys,
one layer) is mapped by the NAME of each segment, never by its number or order: the segment named like class ``c``
of ``class_names`` (case, spaces, ``-`` and ``_`` ignored: ``Right Kidney`` is ``right_kidney``) becomes ``c``, or
``values[c]`` when the caller's labels carry source values (the inverse of a label map). A segment whose name is no
class, voxels that no segment names, several layers (overlapping segments) are refused naming the file and the
segment. Other files keep their stored values.

NRRD needs pynrrd and DICOM needs pydicom, both installed with the ``label`` extra
(``pip install 'spectraflow_monai[label]'``); they are imported where used and a missing one is an ``ImportError``
naming what to install. NIfTI needs nibabel only (a dependency of the package).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from monai.data import ImageReader
from monai.utils import MetaKeys, SpaceKeys, ensure_tuple

from spectraflow_monai.data.dicom import check_dicom_series
from spectraflow_monai.utils.errors import DatasetError

__all__ = [
    "AFFINE_TOLERANCE",
    "LABEL_SUFFIXES",
    "VOLUME_FORMATS",
    "VolumeHeader",
    "VolumeReader",
    "canonical_volume",
    "check_label_grid",
    "import_nrrd",
    "is_seg_nrrd",
    "read_label_volume",
    "read_volume",
    "segment_classes",
    "segment_key",
    "volume_format",
    "volume_header",
    "volume_name",
]

#: what :func:`volume_format` tells apart
VOLUME_FORMATS: tuple[str, ...] = ("nifti", "nrrd", "dicom")
#: the label file names the datalists accept (besides DICOM series folders for images)
LABEL_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii", ".seg.nrrd", ".nrrd", ".nhdr")
#: largest difference of two affines' entries (mm) for one grid
AFFINE_TOLERANCE = 1e-3
_NIFTI = re.compile(r"\.nii(\.gz)?$", re.IGNORECASE)
_NRRD = re.compile(r"(\.seg)?\.(nrrd|nhdr)$", re.IGNORECASE)
_SEGMENT = re.compile(r"^Segment(\d+)_(Name|LabelValue|Layer)$")
_SPACE_SIGNS = {"left": (0, -1.0), "right": (0, 1.0), "posterior": (1, -1.0), "anterior": (1, 1.0)}
_SPACE_SIGNS.update({"inferior": (2, -1.0), "superior": (2, 1.0)})


def import_nrrd() -> Any:
    """``nrrd`` (pynrrd), or an ``ImportError`` naming what to install."""
    try:
        import nrrd
    except ImportError as e:
        raise ImportError(
            "reading NRRD files (.nrrd, .seg.nrrd) needs pynrrd: pip install 'spectraflow_monai[label]' (or pip "
            "install pynrrd)."
        ) from e
    return nrrd


def volume_format(path: str | os.PathLike) -> str:
    """``"nifti"``, ``"nrrd"`` or ``"dicom"`` (a folder: one DICOM series) for ``path``, by its name.

    Raises:
        DatasetError: any other file name, naming it and the accepted kinds.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return "dicom"
    name = os.path.basename(path)
    if _NIFTI.search(name):
        return "nifti"
    if _NRRD.search(name):
        return "nrrd"
    raise DatasetError(
        f"{path!r} is not a volume this bundle reads: give a NIfTI file (.nii, .nii.gz), an NRRD file (.nrrd, "
        ".seg.nrrd) or a folder holding one DICOM series."
    )


def is_seg_nrrd(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named as 3D Slicer names a segmentation (``.seg.nrrd``)."""
    return os.fspath(path).lower().endswith(".seg.nrrd")


def volume_name(path: str | os.PathLike) -> str:
    """The name of a volume without its extension (``ct_01.nii.gz`` -> ``ct_01``, ``a.seg.nrrd`` -> ``a``); a DICOM
    series folder keeps its whole name (series UIDs hold dots)."""
    path = os.fspath(path).rstrip("/\\")
    name = os.path.basename(path)
    if os.path.isdir(path):
        return name
    for pattern in (_NIFTI, _NRRD):
        stem = pattern.sub("", name)
        if stem != name:
            return stem
    return os.path.splitext(name)[0]


@dataclasses.dataclass(frozen=True)
class VolumeHeader:
    """What :func:`volume_header` reads: the path, its :func:`volume_format`, the spatial ``shape`` and the voxel ->
    RAS ``affine`` (4x4, mm)."""

    path: str
    format: str
    shape: tuple[int, ...]
    affine: np.ndarray

    @property
    def spacing(self) -> tuple[float, ...]:
        """Voxel size (mm) along each axis."""
        return tuple(float(v) for v in np.linalg.norm(self.affine[:3, :3], axis=0))


def _where(case: Any) -> str:
    return f"case {case}: " if case is not None else ""


def _nrrd_affine(header: Mapping[str, Any], path: str) -> np.ndarray:
    """voxel -> RAS of an NRRD header, as MONAI's ``NrrdReader`` builds it (space LPS when not given)."""
    directions = header.get("space directions")
    sizes = list(header["sizes"])
    if directions is None:
        spacings = header.get("spacings", [1.0] * len(sizes))
        directions = np.diag([float(s) if np.isfinite(float(s)) else 1.0 for s in spacings])
    rows = [np.asarray(r, dtype=np.float64) for r in directions]
    domain = [r for r in rows if r is not None and r.ndim == 1 and np.isfinite(r).all()]
    ndim = len(domain)
    affine = np.eye(4)
    for axis, vec in enumerate(domain[:3]):
        affine[: min(len(vec), 3), axis] = vec[:3]
    origin = np.asarray(header.get("space origin", np.zeros(ndim)), dtype=np.float64)
    affine[: min(len(origin), 3), 3] = origin[:3]
    space = str(header.get("space", "left-posterior-superior")).lower()
    words = space.split("-")
    if all(w in _SPACE_SIGNS for w in words) and len(words) == 3:
        flip = np.ones(4)
        for w in words:
            axis, sign = _SPACE_SIGNS[w]
            flip[axis] = sign
        affine = np.diag(flip) @ affine
    if not np.isfinite(affine).all():
        raise DatasetError(f"NRRD file {path!r} has a non-finite geometry (space directions / origin).")
    return affine


def _squeeze_shape(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    while len(shape) > 3 and shape[-1] == 1:  # (H, W, D, 1) is a volume
        shape = shape[:-1]
    return shape


def volume_header(path: str | os.PathLike, what: str = "image", case: Any = None) -> VolumeHeader:
    """Shape and geometry of a volume from its header (no voxel is read; a DICOM series is checked,
    :func:`~spectraflow_monai.data.dicom.check_dicom_series`).

    Args:
        path: a NIfTI or NRRD file, or a DICOM series folder.
        what: ``"image"`` or ``"label"``, for messages. Defaults to ``"image"``.
        case: case id for messages. Defaults to None.

    Raises:
        ImportError: pynrrd / pydicom missing for an NRRD file / DICOM folder (naming what to install).
        DatasetError: a missing or unreadable file, another kind of file, a bad DICOM series; naming it.
    """
    path = os.fspath(path)
    where = _where(case)
    if not os.path.exists(path):
        raise DatasetError(f"{where}{what} file {path!r} does not exist.")
    kind = volume_format(path)
    if kind == "dicom":
        try:
            series = check_dicom_series(path)
        except DatasetError as e:
            raise DatasetError(f"{where}{e}") from e
        return VolumeHeader(path, kind, series.shape, series.affine)
    if kind == "nifti":
        import nibabel as nib

        try:
            img = nib.load(path)
        except Exception as e:  # nibabel raises ImageFileError, OSError, EOFError, ...
            raise DatasetError(f"{where}{what} file {path!r} is not a readable NIfTI image: {e}") from e
        return VolumeHeader(path, kind, _squeeze_shape(img.shape), np.asarray(img.affine, dtype=np.float64))
    nrrd = import_nrrd()
    try:
        header = nrrd.read_header(path)
    except Exception as e:  # pynrrd raises NRRDError, OSError, UnicodeDecodeError, ...
        raise DatasetError(f"{where}{what} file {path!r} is not a readable NRRD file: {e}") from e
    layers = _layer_axis(header)
    shape = [int(s) for i, s in enumerate(header["sizes"]) if i != layers]
    if layers is not None and int(header["sizes"][layers]) > 1:
        raise DatasetError(
            f"{where}{what} file {path!r} holds {int(header['sizes'][layers])} layers (overlapping segments); "
            "save the segmentation as one layer (3D Slicer: Segmentations > Export to files, as a labelmap)."
        )
    return VolumeHeader(path, kind, _squeeze_shape(shape), _nrrd_affine(header, path))


def _layer_axis(header: Mapping[str, Any]) -> int | None:
    """The non-spatial axis of an NRRD (3D Slicer's segment layers, a list axis), or None."""
    kinds = [str(k).lower() for k in header.get("kinds", [])]
    for i, k in enumerate(kinds):
        if k in ("list", "vector", "complex", "point", "covariant-vector", "normal"):
            return i
    directions = header.get("space directions")
    if directions is not None:
        for i, row in enumerate(directions):
            if row is None or not np.isfinite(np.asarray(row, dtype=np.float64)).all():
                return i
    return None


def check_label_grid(image: VolumeHeader, label: VolumeHeader, case: Any = None) -> None:
    """Refuse a label that is not on its image's grid: another shape, or an affine more than
    :data:`AFFINE_TOLERANCE` mm away (one line naming both files).

    Raises:
        DatasetError: naming the case, both files and both values.
    """
    where = _where(case)
    if label.shape != image.shape:
        raise DatasetError(
            f"{where}label {label.path!r} has shape {label.shape} but image {image.path!r} has shape {image.shape}; "
            "a label must lie on its image's grid (export it with the image as reference)."
        )
    diff = float(np.abs(label.affine - image.affine).max())
    if diff > AFFINE_TOLERANCE:
        with np.printoptions(precision=4, suppress=True):
            raise DatasetError(
                f"{where}label {label.path!r} and image {image.path!r} have different affines (max abs difference "
                f"{diff:.4g} > {AFFINE_TOLERANCE}): image {image.affine[:3].tolist()} label "
                f"{label.affine[:3].tolist()}."
            )


def segment_key(name: Any) -> str:
    """A name as segment names are compared with class names: case folded, spaces / ``-`` / ``_`` as one ``_``."""
    return re.sub(r"[\s_\-]+", "_", str(name).strip()).casefold()


def _segments(header: Mapping[str, Any]) -> dict[int, dict[str, str]]:
    found: dict[int, dict[str, str]] = {}
    for key, value in header.items():
        m = _SEGMENT.match(str(key))
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = str(value)
    return found


def segment_classes(
    header: Mapping[str, Any],
    class_names: Sequence[str],
    values: Sequence[int] | None = None,
    path: str = "segmentation",
) -> dict[int, int]:
    """``{stored label value: class value}`` of a 3D Slicer segmentation header, by segment NAME.

    Args:
        header: the NRRD header (``Segment<N>_Name``, ``Segment<N>_LabelValue``, ``Segment<N>_Layer``).
        class_names: the classes, background first (the bundle's ``class_names`` / ``channel_def``).
        values: the value written for each class (the inverse of a label map); None: the class index.
            Defaults to None.
        path: the file, for messages.

    Raises:
        DatasetError: no segment, a segment without a name or label value, a segment on another layer, a
            segment name that is no class (naming it and the classes).
    """
    names = [str(n) for n in class_names]
    keys = {segment_key(n): i for i, n in enumerate(names)}
    if values is not None and len(values) != len(names):
        raise ValueError(f"values must hold one value per class ({len(names)}), got {list(values)!r}.")
    segments = _segments(header)
    if not segments:
        raise DatasetError(f"segmentation {path!r} names no segment (no Segment0_Name in its header).")
    out: dict[int, int] = {}
    for number in sorted(segments):
        seg = segments[number]
        if "Name" not in seg or "LabelValue" not in seg:
            missing = [k for k in ("Name", "LabelValue") if k not in seg]
            raise DatasetError(
                f"segmentation {path!r}: segment {number} has no {' / '.join(f'Segment{number}_{k}' for k in missing)}"
                " (save it with 3D Slicer 4.11 or later)."
            )
        if seg.get("Layer", "0").strip() not in ("", "0"):
            raise DatasetError(
                f"segmentation {path!r}: segment {seg['Name']!r} lies on layer {seg['Layer']} (overlapping "
                "segments); save the segmentation as one layer."
            )
        cls = keys.get(segment_key(seg["Name"]))
        if cls is None:
            raise DatasetError(
                f"segmentation {path!r}: segment {seg['Name']!r} is not a class of the model (classes: "
                f"{', '.join(names)}); rename or remove the segment."
            )
        try:
            stored = int(float(seg["LabelValue"]))
        except ValueError as e:
            raise DatasetError(
                f"segmentation {path!r}: segment {seg['Name']!r} has the label value {seg['LabelValue']!r}, not an "
                "integer."
            ) from e
        if stored in out and out[stored] != (cls if values is None else int(values[cls])):
            raise DatasetError(f"segmentation {path!r}: two segments share the label value {stored}.")
        out[stored] = cls if values is None else int(values[cls])
    return out


def _map_segments(array: np.ndarray, mapping: Mapping[int, int], path: str) -> np.ndarray:
    """The values of ``array`` through ``mapping`` (0 stays 0); a non-zero value no segment names is refused."""
    present = np.unique(array)
    if np.issubdtype(present.dtype, np.floating) and not np.array_equal(present, np.rint(present)):
        raise DatasetError(f"segmentation {path!r} holds non-integral values.")
    stray = [int(v) for v in present if int(v) != 0 and int(v) not in mapping]
    if stray:
        raise DatasetError(
            f"segmentation {path!r} holds the value(s) {stray[:10]} that no segment of its header names."
        )
    top = max([0, *mapping.values()])
    out = np.zeros(array.shape, dtype=np.uint8 if top < 256 else np.uint16 if top < 65536 else np.int32)
    for stored, value in mapping.items():
        if value:
            out[array == stored] = value
    return out


class VolumeReader(ImageReader):
    """MONAI image reader for every volume a bundle takes: NIfTI (MONAI's ``NibabelReader``), NRRD (MONAI's
    ``NrrdReader``, pynrrd) and DICOM series folders (checked with
    :func:`~spectraflow_monai.data.dicom.check_dicom_series`, then MONAI's ``PydicomReader``). Arrays and affines are
    MONAI's (RAS), so ``LoadImaged(keys, reader=VolumeReader())`` followed by the bundle's transforms and ``Invertd``
    gives a prediction on the input's own grid.

    Args:
        kind: ``"image"`` or ``"label"``. A label that is a 3D Slicer segmentation is mapped to ``class_names`` by
            segment name (see the module docstring). Defaults to ``"image"``.
        class_names: the classes, background first; needed to read a segmentation. Defaults to None.
        values: the value written for each class of a segmentation (the inverse of a label map); None: the class
            index. Defaults to None.
        modality: the modality a DICOM series must have. Defaults to ``"CT"``.

    Raises:
        ValueError: bad ``kind``, or ``values`` of another length than ``class_names``.
    """

    def __init__(
        self,
        kind: str = "image",
        class_names: Sequence[str] | None = None,
        values: Sequence[int] | None = None,
        modality: str | None = "CT",
    ) -> None:
        super().__init__()
        if kind not in ("image", "label"):
            raise ValueError(f"kind must be 'image' or 'label', got {kind!r}.")
        if class_names is not None and values is not None and len(values) != len(class_names):
            raise ValueError(f"values must hold one value per class ({len(class_names)}), got {list(values)!r}.")
        self.kind, self.modality = kind, modality
        self.class_names = None if class_names is None else [str(n) for n in class_names]
        self.values = None if values is None else [int(v) for v in values]

    def verify_suffix(self, filename: Sequence[str | os.PathLike] | str | os.PathLike) -> bool:
        """Whether every path of ``filename`` is a NIfTI / NRRD file or a folder."""
        try:
            for f in ensure_tuple(filename):
                volume_format(f)
        except DatasetError:
            return False
        return True

    def read(self, data: Sequence[str | os.PathLike] | str | os.PathLike, **kwargs: Any) -> Any:
        """The path (one volume); reading happens in :meth:`get_data`, so that a
        :class:`~spectraflow_monai.utils.errors.DataError` naming the file reaches the caller."""
        names = [os.fspath(n) for n in ensure_tuple(data)]
        if len(names) != 1:
            raise DatasetError(f"{names}: one volume is read at a time.")
        volume_format(names[0])
        return names[0]

    def get_data(self, img: Any) -> tuple[np.ndarray, dict]:
        """The voxels (float32 images; labels as stored, segmentations mapped) and MONAI's metadata (affine, spatial
        shape, no channel).

        Raises:
            DatasetError: naming the file or folder when it cannot be read or mapped.
        """
        path = os.fspath(img)
        kind = volume_format(path)
        if kind == "dicom":
            from monai.data import PydicomReader

            try:
                check_dicom_series(path, self.modality)
                reader = PydicomReader()
                array, meta = reader.get_data(reader.read(path))
            except (DatasetError, ImportError):
                raise
            except Exception as e:  # noqa: BLE001 (pydicom / MONAI raise many types on damaged pixel data)
                raise DatasetError(f"DICOM series {path!r} cannot be read: {type(e).__name__}: {e}") from e
            return np.asarray(array, dtype=np.float32), meta
        if kind == "nifti":
            from monai.data import NibabelReader

            try:
                reader = NibabelReader()
                array, meta = reader.get_data(reader.read(path))
            except Exception as e:  # noqa: BLE001 (nibabel raises ImageFileError, OSError, EOFError, zlib errors)
                raise DatasetError(f"{self.kind} file {path!r} is not a readable NIfTI image: {e}") from e
            return array, meta
        return self._nrrd(path)

    def _nrrd(self, path: str) -> tuple[np.ndarray, dict]:
        nrrd = import_nrrd()
        header = volume_header(path, self.kind)  # layers refused, geometry read
        try:
            array, full = nrrd.read(path, index_order="F")
        except Exception as e:  # noqa: BLE001 (pynrrd raises NRRDError, OSError, zlib errors)
            raise DatasetError(f"{self.kind} file {path!r} is not a readable NRRD file: {e}") from e
        array = np.asarray(array)
        layers = _layer_axis(full)
        if layers is not None:
            array = np.take(array, 0, axis=layers)
        array = array.reshape(header.shape)
        segmented = bool(_segments(full))
        if self.kind == "label" and segmented:
            if self.class_names is None:
                raise DatasetError(
                    f"segmentation {path!r} maps to classes by segment name, but no class names were given."
                )
            array = _map_segments(array, segment_classes(full, self.class_names, self.values, path), path)
        elif self.kind == "image":
            array = array.astype(np.float32, copy=False)
        meta: dict[str, Any] = {
            MetaKeys.AFFINE: header.affine.copy(),
            MetaKeys.ORIGINAL_AFFINE: header.affine.copy(),
            MetaKeys.SPATIAL_SHAPE: np.asarray(header.shape),
            MetaKeys.SPACE: SpaceKeys.RAS,
            MetaKeys.ORIGINAL_CHANNEL_DIM: float("nan"),
        }
        return array, meta


def read_volume(path: str | os.PathLike, case: Any = None, modality: str | None = "CT") -> tuple[np.ndarray, np.ndarray]:
    """The voxels (float32, in the file's units: HU for CT) and the voxel -> RAS affine of a NIfTI / NRRD file or a
    DICOM series folder (:class:`VolumeReader`).

    Raises:
        DatasetError: naming the file when it cannot be read (``case`` first when given).
    """
    reader = VolumeReader("image", modality=modality)
    try:
        array, meta = reader.get_data(reader.read(path))
    except DatasetError as e:
        raise DatasetError(f"{_where(case)}{e}") from e
    array = np.asarray(array, dtype=np.float32)
    return array.reshape(_squeeze_shape(array.shape)), np.asarray(meta[MetaKeys.AFFINE], dtype=np.float64)


def read_label_volume(
    path: str | os.PathLike,
    class_names: Sequence[str] | None = None,
    values: Sequence[int] | None = None,
    case: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The values and the voxel -> RAS affine of a label file: NIfTI or NRRD as stored, a 3D Slicer segmentation
    (``.seg.nrrd``) mapped to ``class_names`` by segment name (the class index, or ``values[class]``).

    This is the reader for labels that come back from 3D Slicer or a PACS (MONAI Label's app reads its datastore's
    ``.nrrd`` / ``.seg.nrrd`` labels with it): a liver segment is the liver class whatever its number in the file.

    Args:
        path: the label file.
        class_names: the classes, background first (needed for a segmentation). Defaults to None.
        values: the value of each class (the inverse of a label map); None: class indices. Defaults to None.
        case: case id for messages. Defaults to None.

    Raises:
        DatasetError: naming the file: unreadable, several layers, a segment that is no class (naming it), voxels no
            segment names.
    """
    reader = VolumeReader("label", class_names=class_names, values=values)
    try:
        array, meta = reader.get_data(reader.read(path))
    except DatasetError as e:
        raise DatasetError(f"{_where(case)}{e}") from e
    array = np.asarray(array)
    return array.reshape(_squeeze_shape(array.shape)), np.asarray(meta[MetaKeys.AFFINE], dtype=np.float64)


def canonical_volume(array: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``array`` and ``affine`` reoriented to the closest RAS+ orientation (axes permuted and flipped, no
    resampling), as ``nibabel.as_closest_canonical`` does for a NIfTI image."""
    import nibabel as nib

    ornt = nib.orientations.io_orientation(affine)
    if np.array_equal(ornt, [[0, 1], [1, 1], [2, 1]]):
        return array, affine
    out = nib.orientations.apply_orientation(array, ornt)
    new_affine = affine @ nib.orientations.inv_ornt_aff(ornt, array.shape[:3])
    return np.ascontiguousarray(out), new_affine
