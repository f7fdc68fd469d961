"""DICOM SEG: a label volume written as a segmentation of its DICOM series, and read back by segment label.

A PACS keeps labels as DICOM Segmentation objects (SEG) that reference the images they segment. What the bundles
and the MONAI Label app write and read (the anchor is MONAI Deploy's ``DICOMSegmentationWriterOperator``: segment
descriptions by class):

- :func:`write_dicom_seg`: one segment per class present in the label, numbered 1, 2, ... in class order, its
  ``SegmentLabel`` the class name (``class_names``, the bundle's ``channel_def``), SNOMED CT codes for the Synapse
  organs (a private code for other classes), frames referencing the series' slices (written with pydicom-seg's
  ``MultiClassWriter``);
- :func:`read_dicom_seg`: the class of every voxel, found by each segment's LABEL (never by its number, which
  depends on the classes present), on the series' grid (or that of a volume file on it) when one is given.

Segment labels are compared with class names by :func:`~spectraflow_monai.data.volumes.segment_key` (case, spaces,
``-`` and ``_`` ignored), the rule 3D Slicer segmentations are read by too: one rule for every segment name. The
Synapse bundle's ``output_format: dicom_seg`` and the MONAI Label app (``output=dicom_seg``, labels saved to and
read back from a PACS) write and read their SEGs with these two functions.

Both need pydicom and pydicom-seg (``pip install 'spectraflow_monai[label]'`` and ``pip install --no-deps
pydicom-seg==0.4.1``, as docs/monailabel.md says), imported where used; a missing one is an ``ImportError`` naming
what to install.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from spectraflow_monai.data.dicom import LPS_RAS, DicomSeries, check_dicom_series, import_pydicom
from spectraflow_monai.data.volumes import segment_key, volume_header
from spectraflow_monai.utils.errors import DataError, DatasetError

__all__ = [
    "SEG_SUFFIX",
    "SNOMED_ORGANS",
    "import_pydicom_seg",
    "read_dicom_seg",
    "seg_segment_labels",
    "write_dicom_seg",
]

logger = logging.getLogger(__name__)

#: the file name ending of a written SEG (``<name>_seg.dcm`` beside ``<name>_seg.nii.gz``)
SEG_SUFFIX = ".dcm"
#: SNOMED CT codes (code value, meaning) of the Synapse organs (segment property types)
SNOMED_ORGANS: dict[str, tuple[str, str]] = {
    "spleen": ("78961009", "Spleen"),
    "right_kidney": ("9846003", "Right kidney"),
    "left_kidney": ("18639004", "Left kidney"),
    "gallbladder": ("28231008", "Gallbladder"),
    "liver": ("10200004", "Liver"),
    "stomach": ("69695003", "Stomach"),
    "aorta": ("15825003", "Aorta"),
    "pancreas": ("15776009", "Pancreas"),
}
_ANATOMY = {"CodeValue": "91723000", "CodingSchemeDesignator": "SCT", "CodeMeaning": "Anatomical Structure"}
_PRIVATE_SCHEME = "99SPECTRAFLOW"
_COLOURS = [(221, 130, 101), (144, 238, 144), (255, 255, 0), (128, 174, 128), (241, 214, 145), (177, 122, 101),
            (216, 101, 79), (183, 156, 220), (111, 184, 210), (220, 245, 20)]  # fmt: skip


def import_pydicom_seg() -> Any:
    """``pydicom_seg``, or an ``ImportError`` naming what to install."""
    try:
        import pydicom_seg
    except ImportError as e:
        raise ImportError(
            "writing and reading DICOM SEG needs pydicom-seg: pip install 'spectraflow_monai[label]' and pip install "
            "--no-deps pydicom-seg==0.4.1."
        ) from e
    return pydicom_seg


def _series(series: Any) -> DicomSeries:
    if isinstance(series, DicomSeries):
        return series
    return check_dicom_series(series, modality=None)


def _as_array(label: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """``label`` as a numpy array and its affine when it carries one (a MONAI ``MetaTensor``)."""
    affine = getattr(label, "affine", None)
    if hasattr(label, "detach"):
        label = label.detach().cpu().numpy()
    arr = np.asarray(label)
    while arr.ndim > 3 and arr.shape[0] == 1:  # channel first
        arr = arr[0]
    if affine is not None:
        affine = np.asarray(affine.detach().cpu().numpy() if hasattr(affine, "detach") else affine, np.float64)
    return arr, affine


def _on_series_grid(arr: np.ndarray, affine: np.ndarray | None, series: DicomSeries, where: str) -> np.ndarray:
    """``arr`` in the series' array order (columns, rows, slices); with ``affine``, reoriented there first."""
    if affine is not None:
        import nibabel as nib

        if arr.ndim != 3:
            raise DataError(f"{where}: the label must be a 3D volume, got shape {arr.shape}.")
        transform = nib.orientations.ornt_transform(
            nib.orientations.io_orientation(affine), nib.orientations.io_orientation(series.affine)
        )
        shape = arr.shape
        arr = nib.orientations.apply_orientation(arr, transform)
        affine = affine @ nib.orientations.inv_ornt_aff(transform, shape)
        if arr.shape == series.shape and float(np.abs(affine - series.affine).max()) > 1e-3:
            raise DataError(
                f"{where}: the label is not on the grid of the series {series.folder!r} (its affine differs by "
                f"{float(np.abs(affine - series.affine).max()):.4g} mm)."
            )
    if arr.shape != series.shape:
        raise DataError(
            f"{where}: the label has shape {arr.shape} but the series {series.folder!r} is {series.shape} "
            "(columns, rows, slices); a SEG is written on its series' grid."
        )
    return arr


def _with_grid(image: Any, affine: np.ndarray) -> Any:
    """The SimpleITK ``image`` given the geometry of the voxel -> RAS ``affine`` (SimpleITK speaks LPS)."""
    lps = LPS_RAS @ np.asarray(affine, dtype=np.float64)
    spacing = np.linalg.norm(lps[:3, :3], axis=0)
    image.SetSpacing([float(s) for s in spacing])
    image.SetOrigin([float(v) for v in lps[:3, 3]])
    image.SetDirection([float(v) for v in (lps[:3, :3] / spacing).ravel()])
    return image


def _grid(reference: Any) -> tuple[tuple[int, ...], np.ndarray]:
    """The shape and voxel -> RAS affine of ``reference``: a NIfTI / NRRD volume file (its header), else a DICOM
    series (folder, files, :class:`~spectraflow_monai.data.dicom.DicomSeries`)."""
    if isinstance(reference, (str, os.PathLike)) and os.path.isfile(reference):
        header = volume_header(reference, "reference")
        if len(header.shape) != 3:
            raise DataError(f"{header.path!r}: a SEG is read onto a 3D grid, got shape {header.shape}.")
        return header.shape, header.affine
    series = _series(reference)
    return series.shape, series.affine


def _segment(number: int, cls: int, name: str) -> dict[str, Any]:
    code = SNOMED_ORGANS.get(segment_key(name))
    kind = {"CodeValue": code[0], "CodingSchemeDesignator": "SCT", "CodeMeaning": code[1]} if code else {
        "CodeValue": f"C{cls}", "CodingSchemeDesignator": _PRIVATE_SCHEME, "CodeMeaning": name[:64],
    }  # fmt: skip
    return {
        "labelID": number,
        "SegmentLabel": name[:64],
        "SegmentDescription": name[:64],
        "SegmentAlgorithmType": "AUTOMATIC",
        "SegmentAlgorithmName": "SpectraFlow",
        "SegmentedPropertyCategoryCodeSequence": dict(_ANATOMY),
        "SegmentedPropertyTypeCodeSequence": kind,
        "recommendedDisplayRGBValue": list(_COLOURS[(cls - 1) % len(_COLOURS)]),
    }


def write_dicom_seg(
    label: Any,
    series_files: Any,
    class_names: Sequence[str],
    path: str | os.PathLike,
    affine: Any = None,
    series_description: str = "SpectraFlow segmentation",
) -> str:
    """Write ``label`` as a DICOM SEG of its series; one segment per class present, labelled with its class name.

    Args:
        label: class indices (0 = background) on the series' grid: a ``MetaTensor`` (its affine is used), or an
            array with ``affine``, or an array in the series' own order ``(columns, rows, slices)`` (MONAI's
            ``PydicomReader`` order of the series, :class:`~spectraflow_monai.data.dicom.DicomSeries`). A leading
            channel of size 1 is dropped.
        series_files: the series: its folder, its files, or a checked
            :class:`~spectraflow_monai.data.dicom.DicomSeries`.
        class_names: the name of every class, background first (the bundle's ``class_names`` / ``channel_def``).
        path: the SEG file to write (its folder is created).
        affine: voxel -> RAS of ``label`` when it is a plain array on another axis order. Defaults to None.
        series_description: the SEG's ``SeriesDescription``. Defaults to ``"SpectraFlow segmentation"``.

    Returns:
        ``path`` as a string.

    Raises:
        ImportError: pydicom / pydicom-seg are not installed (naming what to install).
        DataError: the label is not on the series' grid, holds values that are no class, or no class at all (a SEG
            holds at least one segment); naming the file.
        DatasetError: the series is not one readable DICOM series.
    """
    pydicom_seg = import_pydicom_seg()
    import SimpleITK as sitk

    path = os.fspath(path)
    names = [str(n) for n in class_names]
    if len(names) < 2:
        raise ValueError(f"class_names must name the background and at least one class, got {names!r}.")
    series = _series(series_files)
    arr, own_affine = _as_array(label)
    arr = _on_series_grid(arr, own_affine if affine is None else np.asarray(affine, np.float64), series, path)
    if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.rint(arr)):
        raise DataError(f"{path}: the label holds non-integral values; a SEG is written from class indices.")
    present = [int(v) for v in np.unique(arr) if int(v) != 0]
    bad = [v for v in present if not 0 < v < len(names)]
    if bad:
        raise DataError(f"{path}: the label holds values {bad[:10]} that are no class (classes 0..{len(names) - 1}).")
    if not present:
        raise DataError(f"{path}: the label holds no class but background; a DICOM SEG needs at least one segment.")
    numbers = {cls: i + 1 for i, cls in enumerate(present)}  # DICOM: segments numbered 1, 2, ... without gaps
    segments = np.zeros(arr.shape, dtype=np.uint8 if len(present) < 256 else np.uint16)
    for cls, number in numbers.items():
        segments[arr == cls] = number
    image = _with_grid(sitk.GetImageFromArray(np.ascontiguousarray(segments.transpose(2, 1, 0))), series.affine)
    metainfo = {
        "ContentCreatorName": "SpectraFlow",
        "ClinicalTrialSeriesID": "1",
        "ClinicalTrialTimePointID": "1",
        "ClinicalTrialCoordinatingCenterName": "spectraflow_monai",
        "SeriesDescription": series_description[:64],
        "SeriesNumber": "300",
        "InstanceNumber": "1",
        "BodyPartExamined": "",
        "segmentAttributes": [[_segment(numbers[c], c, names[c]) for c in present]],
        "ContentLabel": "SEGMENTATION",
        "ContentDescription": "SpectraFlow segmentation",
    }
    with warnings.catch_warnings():  # pydicom-seg 0.4 validates with jsonschema's deprecated RefResolver
        warnings.simplefilter("ignore", DeprecationWarning)
        template = pydicom_seg.template.from_dcmqi_metainfo(metainfo)
    writer = pydicom_seg.MultiClassWriter(template, inplane_cropping=False, skip_empty_slices=True)
    dataset = writer.write(image, list(series.files))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    dataset.save_as(path)
    logger.info("wrote the DICOM SEG %s (%s) of the series %s", path, ", ".join(names[c] for c in present), series.folder)
    return path


def seg_segment_labels(dataset: Any) -> dict[int, str]:
    """``{segment number: SegmentLabel}`` of a SEG dataset (``pydicom.Dataset``) or file."""
    if isinstance(dataset, (str, os.PathLike)):
        dataset = import_pydicom().dcmread(os.fspath(dataset), stop_before_pixels=True)
    return {int(s.SegmentNumber): str(getattr(s, "SegmentLabel", "")) for s in getattr(dataset, "SegmentSequence", [])}


def read_dicom_seg(
    path: str | os.PathLike, class_names: Sequence[str], series: Any = None, values: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The classes of a DICOM SEG, found by segment LABEL, and their voxel -> RAS affine.

    Args:
        path: the SEG file.
        class_names: the classes, background first; each segment's ``SegmentLabel`` must name one (case, spaces,
            ``-`` and ``_`` ignored).
        series: the grid to return the classes on: the segmented series (folder, files or
            :class:`~spectraflow_monai.data.dicom.DicomSeries`: ``(columns, rows, slices)``, the series' affine), or
            a NIfTI / NRRD volume file on the series' grid (its voxel order and affine, e.g. the series converted to
            NIfTI, as the MONAI Label app keeps it); None: the SEG's own frames. Defaults to None.
        values: the value written for each class (the inverse of a label map); None: class indices. Defaults to
            None.

    Returns:
        ``(classes, affine)``; overlapping segments: the later class wins.

    Raises:
        ImportError: pydicom / pydicom-seg missing. DatasetError: not a SEG, a segment label that is no class
            (naming it and the classes), an unreadable grid (a bad series or volume file). DataError: a volume file
            that is not 3D.
    """
    pydicom = import_pydicom()
    pydicom_seg = import_pydicom_seg()
    import SimpleITK as sitk

    path = os.fspath(path)
    names = [str(n) for n in class_names]
    try:
        dataset = pydicom.dcmread(path)
    except Exception as e:  # noqa: BLE001 (pydicom raises many types on a damaged file)
        raise DatasetError(f"DICOM SEG {path!r} is unreadable: {e}") from e
    if getattr(dataset, "Modality", None) != "SEG":
        raise DatasetError(f"{path!r} is not a DICOM SEG (Modality {getattr(dataset, 'Modality', None)!r}).")
    keys = {segment_key(n): i for i, n in enumerate(names)}
    classes: dict[int, int] = {}
    for number, name in seg_segment_labels(dataset).items():
        if segment_key(name) not in keys:
            raise DatasetError(
                f"DICOM SEG {path!r}: segment {number} {name!r} is not a class of the model (classes: "
                f"{', '.join(names)})."
            )
        cls = keys[segment_key(name)]
        classes[number] = cls if values is None else int(values[cls])
    result = pydicom_seg.SegmentReader().read(dataset)
    reference = None
    if series is not None:
        shape, grid_affine = _grid(series)
        reference = _with_grid(sitk.Image([int(s) for s in shape], sitk.sitkUInt8), grid_affine)
    out: np.ndarray | None = None
    grid = reference
    for number in sorted(result.available_segments, key=lambda n: classes[n]):
        image = result.segment_image(number)
        if grid is None:
            grid = image
        elif reference is not None or image.GetSize() != grid.GetSize():
            image = sitk.Resample(image, grid, sitk.Transform(), sitk.sitkNearestNeighbor, 0, image.GetPixelID())
        mask = sitk.GetArrayFromImage(image).transpose(2, 1, 0) > 0
        if out is None:
            top = max([0, *classes.values()])
            out = np.zeros(mask.shape, dtype=np.uint8 if top < 256 else np.uint16)
        out[mask] = classes[number]
    if grid is None:
        raise DatasetError(f"DICOM SEG {path!r} holds no segment frames.")
    if out is None:
        out = np.zeros(tuple(int(s) for s in grid.GetSize()), dtype=np.uint8)
    direction = np.asarray(grid.GetDirection(), dtype=np.float64).reshape(3, 3)
    affine_lps = np.eye(4)
    affine_lps[:3, :3] = direction * np.asarray(grid.GetSpacing(), dtype=np.float64)
    affine_lps[:3, 3] = grid.GetOrigin()
    return out, LPS_RAS @ affine_lps
