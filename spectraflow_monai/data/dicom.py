"""DICOM series as volumes: one folder per series, checked before it is read.

A PACS serves CT as DICOM series (one file per axial slice). The bundles take a folder that holds one series as a
volume (``spectraflow_synapse_segmentation``'s ``configs/inference.yaml``, its datalists and evaluation), read with
MONAI's :class:`monai.data.PydicomReader` after :func:`check_dicom_series` has made sure that the folder is one
complete CT series:

- every DICOM file of the folder belongs to one series (``SeriesInstanceUID``): two series mixed in one folder are
  refused, naming both;
- the modality is the one asked for (``CT``);
- single-frame slices of one size, pixel spacing and orientation, at least two of them;
- the slice positions along the slice normal are evenly spaced (a missing or duplicated slice is refused, naming
  the gap), and the instance numbers run in the order of the positions (MONAI's reader stacks the slices by
  ``InstanceNumber``).

The geometry (:attr:`DicomSeries.affine`) is the one MONAI's reader gives the volume: array axes (column index,
row index, slice in instance-number order), RAS world coordinates (DICOM's LPS with x and y negated), so that a
label predicted on the volume and written as NIfTI lies on the series' grid. :func:`write_dicom_series` writes a
volume as such a series (the phantom as a PACS would serve it; tests).

pydicom is needed (installed with the ``label`` extra: ``pip install 'spectraflow_monai[label]'``); it is imported
where used. Every problem is one :class:`~spectraflow_monai.utils.errors.DatasetError` line naming the folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from spectraflow_monai.utils.errors import DatasetError

__all__ = [
    "DICOM_MODALITIES",
    "SPACING_TOLERANCE",
    "DicomSeries",
    "check_dicom_series",
    "dicom_files",
    "import_pydicom",
    "is_dicom_folder",
    "write_dicom_series",
]

#: the modalities :func:`check_dicom_series` may be asked for
DICOM_MODALITIES: tuple[str, ...] = ("CT", "MR", "PT")
#: the largest relative difference of a slice step from the series' median step (a missing slice doubles a step)
SPACING_TOLERANCE = 0.01
_DIRECTION_TOLERANCE = 1e-4
#: RAS <-> LPS: x and y change sign
LPS_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def import_pydicom() -> Any:
    """``pydicom``, or an ``ImportError`` naming what to install."""
    try:
        import pydicom
    except ImportError as e:
        raise ImportError(
            "reading DICOM series needs pydicom: pip install 'spectraflow_monai[label]' (or pip install pydicom)."
        ) from e
    return pydicom


@dataclasses.dataclass(frozen=True)
class DicomSeries:
    """One checked DICOM series (:func:`check_dicom_series`).

    Attributes:
        folder: the folder holding it.
        files: its files in slice order (ascending ``InstanceNumber``, which runs with the positions).
        series_uid: ``SeriesInstanceUID``; study_uid: ``StudyInstanceUID``; modality: ``Modality``.
        shape: ``(columns, rows, slices)``: the array axes of the volume MONAI's ``PydicomReader`` reads.
        affine: 4x4 voxel -> RAS world (mm) of that array.
    """

    folder: str
    files: tuple[str, ...]
    series_uid: str
    study_uid: str
    modality: str
    shape: tuple[int, int, int]
    affine: np.ndarray

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Voxel size (mm) along the three array axes."""
        return tuple(float(v) for v in np.linalg.norm(self.affine[:3, :3], axis=0))  # type: ignore[return-value]


def is_dicom_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder (a DICOM series is given as its folder); its content is checked on reading."""
    return os.path.isdir(os.fspath(path))


def dicom_files(folder: str | os.PathLike) -> list[str]:
    """The DICOM files directly inside ``folder`` (``pydicom.misc.is_dicom``: the DICM preamble), sorted by name;
    hidden files, sub-folders and other files are left out."""
    pydicom = import_pydicom()
    folder = os.fspath(folder)
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.startswith(".") and os.path.isfile(path) and pydicom.misc.is_dicom(path):
            out.append(path)
    return out


def _floats(ds: Any, tag: str, count: int, folder: str, path: str) -> np.ndarray:
    value = getattr(ds, tag, None)
    try:
        arr = np.asarray([float(v) for v in value], dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.zeros(0)
    if arr.shape != (count,) or not np.isfinite(arr).all():
        raise DatasetError(
            f"DICOM series {folder!r}: {os.path.basename(path)!r} has no valid {tag} ({value!r}); the volume's "
            "geometry cannot be derived."
        )
    return arr


def check_dicom_series(
    folder: str | os.PathLike | Sequence[str | os.PathLike], modality: str | None = "CT"
) -> DicomSeries:
    """Check that ``folder`` holds one complete DICOM series of ``modality`` and return its geometry.

    Reads the headers only (no pixel data). See the module docstring for the rules.

    Args:
        folder: the folder of one series, or the list of its files.
        modality: the required ``Modality`` (one of :data:`DICOM_MODALITIES`), or None for any. Defaults to
            ``"CT"``.

    Raises:
        ValueError: bad ``modality``.
        ImportError: pydicom is not installed (naming what to install).
        DatasetError: one line naming ``folder`` and the problem: no folder, no DICOM file, two series, another
            modality, multi-frame files, slices of different sizes, spacings or orientations, uneven slice
            positions (a missing slice), instance numbers out of the order of the positions, unreadable headers.
    """
    if modality is not None and modality not in DICOM_MODALITIES:
        raise ValueError(f"modality must be None or one of {list(DICOM_MODALITIES)}, got {modality!r}.")
    pydicom = import_pydicom()
    if isinstance(folder, (str, os.PathLike)):
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise DatasetError(f"DICOM series {folder!r} is not a folder.")
        files = dicom_files(folder)
    else:
        files = [os.fspath(f) for f in folder]
        folder = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files]) if files else "[]"
    if not files:
        raise DatasetError(f"DICOM series {folder!r} holds no DICOM file (one folder per series, *.dcm files).")
    headers = []
    for path in files:
        try:
            headers.append((path, pydicom.dcmread(path, stop_before_pixels=True)))
        except Exception as e:  # noqa: BLE001 (pydicom raises many types on a damaged header)
            raise DatasetError(f"DICOM series {folder!r}: {os.path.basename(path)!r} is unreadable: {e}") from e
    headers = [(p, ds) for p, ds in headers if "SOPClassUID" in ds and getattr(ds, "Modality", None) != "SEG"]
    if not headers:
        raise DatasetError(f"DICOM series {folder!r} holds no image slice (only DICOMDIR / SEG files).")
    uids = sorted({str(getattr(ds, "SeriesInstanceUID", "")) for _, ds in headers})
    if len(uids) > 1:
        raise DatasetError(
            f"DICOM series {folder!r} mixes {len(uids)} series ({', '.join(uids[:3])}"
            f"{', ...' if len(uids) > 3 else ''}); put each series in its own folder."
        )
    found = sorted({str(getattr(ds, "Modality", "")) for _, ds in headers})
    if modality is not None and found != [modality]:
        raise DatasetError(
            f"DICOM series {folder!r} has the modality {'/'.join(found) or 'none'}, not {modality}: the model "
            f"segments {modality} volumes."
        )
    frames = [p for p, ds in headers if int(getattr(ds, "NumberOfFrames", 1) or 1) > 1]
    if frames:
        raise DatasetError(
            f"DICOM series {folder!r}: {os.path.basename(frames[0])!r} is a multi-frame file; one single-frame file "
            "per slice is read (export the series as single-frame slices)."
        )
    if len(headers) < 2:
        raise DatasetError(f"DICOM series {folder!r} holds one slice; a volume needs at least 2.")
    first_path, first = headers[0]
    iop = _floats(first, "ImageOrientationPatient", 6, folder, first_path)
    spacing = _floats(first, "PixelSpacing", 2, folder, first_path)
    size = (int(getattr(first, "Rows", 0) or 0), int(getattr(first, "Columns", 0) or 0))
    for path, ds in headers[1:]:
        other = (int(getattr(ds, "Rows", 0) or 0), int(getattr(ds, "Columns", 0) or 0))
        if other != size:
            raise DatasetError(
                f"DICOM series {folder!r}: {os.path.basename(path)!r} is {other[0]}x{other[1]} pixels but "
                f"{os.path.basename(first_path)!r} is {size[0]}x{size[1]}; a volume's slices share one size."
            )
        if np.abs(_floats(ds, "ImageOrientationPatient", 6, folder, path) - iop).max() > _DIRECTION_TOLERANCE:
            raise DatasetError(
                f"DICOM series {folder!r}: {os.path.basename(path)!r} has another slice orientation than "
                f"{os.path.basename(first_path)!r} (a localizer or a tilted series mixed in)."
            )
        if np.abs(_floats(ds, "PixelSpacing", 2, folder, path) - spacing).max() > 1e-4 * max(spacing.max(), 1.0):
            raise DatasetError(
                f"DICOM series {folder!r}: {os.path.basename(path)!r} has another pixel spacing than "
                f"{os.path.basename(first_path)!r}."
            )
    row_dir, col_dir = iop[:3], iop[3:]
    normal = np.cross(row_dir, col_dir)
    if not (abs(np.linalg.norm(row_dir) - 1) < 1e-3 and abs(np.linalg.norm(col_dir) - 1) < 1e-3):
        raise DatasetError(f"DICOM series {folder!r}: ImageOrientationPatient {list(iop)} is not two unit vectors.")
    numbers = []
    for path, ds in headers:
        number = getattr(ds, "InstanceNumber", None)
        if number is None or str(number).strip() == "":
            raise DatasetError(
                f"DICOM series {folder!r}: {os.path.basename(path)!r} has no InstanceNumber; the slices cannot be "
                "ordered."
            )
        numbers.append(int(number))
    if len(set(numbers)) != len(numbers):
        raise DatasetError(f"DICOM series {folder!r}: two slices share an InstanceNumber (a series copied twice?).")
    order = np.argsort(numbers, kind="stable")
    headers = [headers[i] for i in order]
    positions = np.stack([_floats(ds, "ImagePositionPatient", 3, folder, p) for p, ds in headers])
    depth = positions @ normal
    steps = np.diff(depth)
    if np.any(np.abs(steps) < 1e-6):
        raise DatasetError(f"DICOM series {folder!r}: two slices lie at the same position (a duplicated slice).")
    if not (np.all(steps > 0) or np.all(steps < 0)):
        raise DatasetError(
            f"DICOM series {folder!r}: the InstanceNumber order does not follow the slice positions; the slices "
            "cannot be stacked in order."
        )
    median = float(np.median(np.abs(steps)))
    uneven = np.abs(np.abs(steps) - median) > SPACING_TOLERANCE * median
    if uneven.any():
        k = int(np.argmax(uneven))
        raise DatasetError(
            f"DICOM series {folder!r}: uneven slice spacing ({abs(steps[k]):.4g} mm between "
            f"{os.path.basename(headers[k][0])!r} and {os.path.basename(headers[k + 1][0])!r}, {median:.4g} mm "
            "elsewhere): a slice is missing."
        )
    # the array axes of MONAI's PydicomReader (swap_ij): column index, row index, slice; DICOM (LPS) -> RAS
    affine_lps = np.eye(4)
    affine_lps[:3, 0] = row_dir * spacing[1]  # along a row: the column index, PixelSpacing[1] apart
    affine_lps[:3, 1] = col_dir * spacing[0]  # down a column: the row index, PixelSpacing[0] apart
    affine_lps[:3, 2] = (positions[-1] - positions[0]) / (len(headers) - 1)
    affine_lps[:3, 3] = positions[0]
    return DicomSeries(
        folder=folder,
        files=tuple(p for p, _ in headers),
        series_uid=uids[0],
        study_uid=str(getattr(first, "StudyInstanceUID", "")),
        modality=found[0],
        shape=(size[1], size[0], len(headers)),
        affine=LPS_RAS @ affine_lps,
    )


def write_dicom_series(
    image: Any,
    affine: Any,
    folder: str | os.PathLike,
    modality: str = "CT",
    series_uid: str | None = None,
    study_uid: str | None = None,
    patient_id: str = "phantom",
    patient_name: str = "Phantom^CT",
    instance_numbers: Sequence[int] | None = None,
) -> list[str]:
    """Write a volume as a DICOM series, one single-frame file per slice (``<folder>/slice_<k>.dcm``).

    The inverse of the reading side: :func:`check_dicom_series` of the folder gives ``affine`` back, and MONAI's
    ``PydicomReader`` the array. Voxels are stored as signed 16-bit integers with ``RescaleIntercept`` 0 and
    ``RescaleSlope`` 1 (HU for CT).

    Args:
        image: ``(X, Y, Z)`` array: X along a row (columns), Y down a column (rows), Z the slices.
        affine: 4x4 voxel -> RAS (mm) of ``image``; its first two columns are orthogonal.
        folder: where the files go (created).
        modality: the ``Modality`` written. Defaults to ``"CT"``.
        series_uid, study_uid: the UIDs; None draws new ones. Defaults to None.
        patient_id, patient_name: written as given. Defaults to a phantom.
        instance_numbers: the ``InstanceNumber`` of each slice; None: 1..Z. Defaults to None.

    Returns:
        the written files, in slice order.

    Raises:
        ValueError: ``image`` is not 3D, ``affine`` not 4x4, or ``instance_numbers`` of another length.
    """
    pydicom = import_pydicom()
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, MRImageStorage, generate_uid

    arr = np.asarray(image)
    aff = np.asarray(affine, dtype=np.float64)
    if arr.ndim != 3:
        raise ValueError(f"image must be a 3D (X, Y, Z) array, got shape {arr.shape}.")
    if aff.shape != (4, 4):
        raise ValueError(f"affine must be 4x4, got shape {aff.shape}.")
    numbers = list(range(1, arr.shape[2] + 1)) if instance_numbers is None else [int(n) for n in instance_numbers]
    if len(numbers) != arr.shape[2]:
        raise ValueError(f"instance_numbers must hold {arr.shape[2]} numbers, got {len(numbers)}.")
    lps = LPS_RAS @ aff
    spacing = np.linalg.norm(lps[:3, :3], axis=0)
    row_dir, col_dir = lps[:3, 0] / spacing[0], lps[:3, 1] / spacing[1]
    series_uid = series_uid or generate_uid()
    study_uid = study_uid or generate_uid()
    frame_uid = generate_uid()
    sop_class = MRImageStorage if modality == "MR" else CTImageStorage
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    pixels = np.rint(arr).astype(np.int16)
    out = []
    for k in range(arr.shape[2]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = sop_class
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        path = os.path.join(folder, f"slice_{k:04d}.dcm")
        ds = FileDataset(path, {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID = sop_class, meta.MediaStorageSOPInstanceUID
        ds.PatientID, ds.PatientName = patient_id, patient_name
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study_uid, series_uid, frame_uid
        ds.Modality, ds.SeriesNumber, ds.InstanceNumber = modality, 1, numbers[k]
        ds.StudyDate = ds.SeriesDate = "20240101"
        ds.StudyTime = ds.SeriesTime = "120000"
        ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = "1", "", ""
        ds.PatientBirthDate, ds.PatientSex, ds.Manufacturer = "", "O", "spectraflow_monai"
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.ImagePositionPatient = [f"{v:.6f}" for v in (lps @ np.array([0.0, 0.0, k, 1.0]))[:3]]
        ds.ImageOrientationPatient = [f"{v:.8f}" for v in (*row_dir, *col_dir)]
        ds.PixelSpacing = [f"{spacing[1]:.6f}", f"{spacing[0]:.6f}"]  # row spacing, column spacing
        ds.SliceThickness = f"{np.linalg.norm(lps[:3, 2]):.6f}"
        ds.Rows, ds.Columns = int(arr.shape[1]), int(arr.shape[0])
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = "0", "1", "HU"
        ds.PixelData = np.ascontiguousarray(pixels[:, :, k].T).tobytes()  # (rows, columns)
        ds.is_little_endian, ds.is_implicit_VR = True, False
        pydicom.dcmwrite(path, ds, write_like_original=False)
        out.append(path)
    return out
