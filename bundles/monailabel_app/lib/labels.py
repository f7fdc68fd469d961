"""Label uploads as the clients send them (docs/monailabel.md, "Serving from a PACS" and "Serving safely").

- NIfTI (``.nii.gz``, ``.nii``) and NRRD (``.nrrd``, Slicer's export) label maps are read by MONAI;
- a Slicer segmentation (``.seg.nrrd``, or a ``.nrrd`` whose header names segments: ``Segment<i>_Name``,
  ``Segment<i>_LabelValue``) is read by the package's
  :func:`~spectraflow_monai.data.volumes.read_label_volume`, the reader of the bundles: each value maps to the class
  of its segment's name (a name that is no class is refused, naming it), so Slicer's own numbering never reaches the
  datastore;
- ``.bin`` is what MONAI Label's OHIF client sends: the raw ``uint8`` voxels of the image it belongs to, in the
  order MONAI Label reads them (first axis fastest), without any geometry: it takes the image's grid.

Every label is checked the same way on every datastore: its size is the image's (spatial dimensions, as MONAI reads
both) and its values are 0 or class values of the served volume model (else 422), before anything is stored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from fastapi import HTTPException
from monai.transforms import LoadImage

from spectraflow_monai.data.volumes import read_label_volume
from spectraflow_monai.utils.errors import DataError

from .checks import redact_paths
from .dicomseg import check_label_values, class_names, data_error
from .infers import short_reason

__all__ = [
    "CONVERTED_LABEL_EXTENSIONS",
    "VOLUME_LABEL_EXTENSIONS",
    "read_label_upload",
    "spatial_shape",
    "write_on_grid",
]

#: label uploads the app converts before a datastore stores them (the image's grid, class values)
CONVERTED_LABEL_EXTENSIONS = (".seg.nrrd", ".bin")
#: label uploads of a volume (CT series, NIfTI or NRRD image)
VOLUME_LABEL_EXTENSIONS = (".nii.gz", ".nii", ".seg.nrrd", ".nrrd", ".bin")
#: label uploads whose header may name segments (3D Slicer)
_SEGMENTED = (".seg.nrrd", ".nrrd")


def spatial_shape(image: Any) -> tuple[int, ...]:
    """The spatial size of an image MONAI's ``LoadImage`` read (its ``spatial_shape`` meta data, else its shape)."""
    meta = getattr(image, "meta", {}) or {}
    shape = meta.get("spatial_shape", image.shape)
    return tuple(int(v) for v in (shape.tolist() if hasattr(shape, "tolist") else shape))


def _size_problem(shape: tuple[int, ...], expected: tuple[int, ...], image_id: str) -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=f"the label map's size {list(shape)} differs from the size {list(expected)} of image {image_id!r} "
        "(spatial dimensions, as MONAI reads them): a label map has its image's size and number of dimensions",
    )


def read_label_upload(
    path: str, ext: str, image_id: str, image_shape: tuple[int, ...], classes: Mapping[int, str] | None
) -> np.ndarray:
    """The label map of an upload as an integer array on its image's grid (the image's spatial shape, axes as MONAI
    reads the image), checked (see the module docstring).

    Args:
        path: the uploaded file.
        ext: its extension (one of :data:`VOLUME_LABEL_EXTENSIONS` or another label format MONAI reads).
        image_id: the image's id (in messages).
        image_shape: the image's spatial shape.
        classes: ``{value: name}`` the values must belong to (0 always may); None checks no values.

    Raises:
        HTTPException: 415 (not readable), 422 (size, values, segments: the package's message, without the path).
    """
    if ext == ".bin":
        size = os.path.getsize(path)
        expected = int(np.prod(image_shape))
        if size != expected:
            raise HTTPException(
                status_code=422,
                detail=f"the .bin label holds {size} bytes; image {image_id!r} of size {list(image_shape)} has "
                f"{expected} voxels (one uint8 each)",
            )
        array = np.fromfile(path, dtype=np.uint8).reshape(image_shape, order="F")
    else:
        try:
            image = LoadImage(image_only=True)(path)
        except Exception as e:  # every reader failure means "not a label map"
            reason = redact_paths(short_reason(e), {path: "the upload", os.path.realpath(path): "the upload"})
            raise HTTPException(status_code=415, detail=f"the upload is not a readable label map ({reason})") from None
        shape = spatial_shape(image)
        if shape != tuple(image_shape):
            raise _size_problem(shape, tuple(image_shape), image_id)
        array = np.asarray(image)
        if array.ndim == len(shape) + 1 and array.shape[0] == 1:
            array = array[0]
        if array.shape != tuple(image_shape):  # channels: not a label map
            raise _size_problem(tuple(array.shape), tuple(image_shape), image_id)
        if not np.all(np.isfinite(array)) or not np.array_equal(array, np.round(array)):
            raise HTTPException(status_code=422, detail="the label map holds values that are not integers")
        array = array.astype(np.int64)
        if ext in _SEGMENTED and classes is not None:
            try:  # segments by name (spectraflow_monai.data.volumes.segment_classes); a plain label map as stored
                segmented, _ = read_label_volume(path, class_names(classes))
            except DataError as e:
                raise data_error(e, {path: "the upload", os.path.realpath(path): "the upload"}) from None
            if segmented.shape != tuple(image_shape):
                raise _size_problem(tuple(segmented.shape), tuple(image_shape), image_id)
            array = segmented.astype(np.int64)
    if classes is not None:
        check_label_values(np.unique(array).tolist(), classes)
    elif array.min() < 0:
        raise HTTPException(status_code=422, detail="the label map holds negative values")
    return array


def write_on_grid(array: np.ndarray, reference: str, out_path: str) -> str:
    """Write a label array (axes as MONAI reads ``reference``) as a ``uint8`` image with ``reference``'s size,
    spacing, origin and direction (NIfTI or NRRD by ``out_path``'s extension; a 2D image as PNG)."""
    if out_path.lower().endswith(".png"):
        from PIL import Image

        Image.fromarray(np.ascontiguousarray(array.astype(np.uint8).T)).save(out_path)
        return out_path
    import SimpleITK as sitk

    ref = sitk.ReadImage(reference)
    label = sitk.GetImageFromArray(np.ascontiguousarray(np.transpose(array.astype(np.uint8))))
    label.CopyInformation(ref)
    sitk.WriteImage(label, out_path, True)
    return out_path
