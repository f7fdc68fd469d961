"""Read the 2D files users have (PNG, JPEG, BMP, GIF, TIFF; 8- or 16-bit; grey, RGB or RGBA) for the 2D bundle.

SpectraFlow's 2D experiments (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation
for Medical Image Segmentation") read 8-bit RGB JPEG/PNG/BMP files; own data come in more forms. Every file is
opened with Pillow first; a TIFF that Pillow cannot open or decode (planar or half-float TIFFs, compressions Pillow
lacks), or would read with less precision (16-bit colour TIFFs, which Pillow turns into 8-bit), is read with
``tifffile``. One rule per kind of file:

- **images** (``kind="image"``) become float32 RGB in [0, 1]: integer pixels are divided by the largest value of
  their type (8-bit by 255, 16-bit by 65535; Pillow's 32-bit ``I`` mode, which it uses for 16-bit PNGs, by
  65535, values above that are an error), boolean pixels become 0/1, floating-point pixels are taken as stored
  (they must be finite). Grey images are repeated to 3 channels; an alpha channel is dropped (RGBA -> RGB,
  grey + alpha -> grey). An 8-bit JPEG therefore reads as ``value / 255``, the scaling the presets always had.
- **labels** (``kind="label"``) keep their stored integer values (no scaling): grey masks, 16-bit label maps,
  palette images (GIF / PNG: a grey palette gives its grey levels, a colour palette the palette indices, which is
  how label maps are commonly stored) and RGB masks (their 3 channels, alpha dropped). The bundle's label
  transforms then binarise them (:class:`spectraflow_monai.transforms.BinarizeLabeld`) or check them against the
  named classes (:class:`spectraflow_monai.transforms.LabelClassesd`). Labels may also be 2D NRRD files (3D
  Slicer's ``.nrrd`` label maps, pynrrd): stored values as they are, and a segmentation (``.seg.nrrd``) mapped by
  segment NAME to the classes of the run's :class:`~spectraflow_monai.data.LabelMode` (binary masks: a segment
  named ``foreground``, read as 255; label maps: the class names of ``label_classes``, read as their source values),
  :func:`~spectraflow_monai.data.volumes.read_label_volume`.

:class:`Image2DReader` is a MONAI ``ImageReader`` with PIL's axis order (``reverse_indexing``: arrays are (W, H[, C])
as with ``PILReader``), for ``LoadImage(d)``. Unreadable files raise
:class:`~spectraflow_monai.utils.errors.DataError` naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from monai.data import ImageReader
from monai.utils import MetaKeys, ensure_tuple

from spectraflow_monai.utils.errors import DataError, DatasetError

__all__ = [
    "NRRD_LABEL_EXTENSIONS",
    "READER_EXTENSIONS",
    "READ_KINDS",
    "Image2DReader",
    "check_finite",
    "check_image_readable",
    "decode_image",
    "is_nrrd_label",
    "read_2d",
    "read_nrrd_label",
    "tiff_fallback",
    "to_rgb_float",
]

#: file extensions :class:`Image2DReader` reads.
READER_EXTENSIONS: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff")
#: ``kind`` values: images (float RGB in [0, 1]) or labels (stored integer values).
READ_KINDS: tuple[str, ...] = ("image", "label")
#: file extensions of labels besides :data:`READER_EXTENSIONS`: NRRD (``.nrrd``, 3D Slicer's ``.seg.nrrd``)
NRRD_LABEL_EXTENSIONS: tuple[str, ...] = (".nrrd",)
_TIFF = (".tif", ".tiff")


def _is_tiff(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in _TIFF


class _NeedsTiffFile(Exception):
    """Pillow opens the file but would lose information (16-bit colour TIFFs become 8-bit)."""


def _pil_array(path: str, kind: str) -> np.ndarray:
    """Decode ``path`` with Pillow into (H, W[, C]); palette, alpha and 1-bit modes resolved for ``kind``."""
    from PIL import Image

    with Image.open(path) as im:
        bits = getattr(im, "tag_v2", {}).get(258) if im.format == "TIFF" else None
        if bits is not None and max(np.atleast_1d(bits)) > 8 and im.mode in ("RGB", "RGBA"):
            raise _NeedsTiffFile(f"Pillow reads this {max(np.atleast_1d(bits))}-bit colour TIFF as 8-bit")
        im.load()
        if im.mode == "P":
            palette = np.asarray(im.getpalette() or [], dtype=np.int16).reshape(-1, 3)
            grey = bool(np.all(palette.max(axis=1) == palette.min(axis=1)))
            if kind == "label":
                return np.asarray(im.convert("L") if grey else im)
            im = im.convert("L" if grey else "RGB")
        elif im.mode == "PA":
            im = im.convert("RGB")
        elif im.mode in ("CMYK", "YCbCr"):
            im = im.convert("RGB")
        return np.asarray(im)


def _tiff_array(path: str) -> np.ndarray:
    """Decode the first page of a TIFF with tifffile into (H, W[, C])."""
    try:
        import tifffile
    except ImportError as e:  # a dependency of the package; only a broken installation lacks it
        raise DataError(f"unreadable image {path!r}: Pillow cannot read it and tifffile is not installed.") from e
    arr = np.asarray(tifffile.imread(path, key=0))
    if arr.ndim == 3 and arr.shape[0] in (1, 2, 3, 4) and arr.shape[-1] not in (1, 2, 3, 4):
        arr = np.moveaxis(arr, 0, -1)  # planar (C, H, W) storage
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (2, 3, 4)):
        raise DataError(f"unreadable image {path!r}: not a 2D grey / RGB(A) image (array shape {arr.shape}).")
    return arr


def is_nrrd_label(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named as an NRRD label (``.nrrd``, ``.seg.nrrd``)."""
    return os.path.splitext(os.fspath(path))[1].lower() in NRRD_LABEL_EXTENSIONS


def read_nrrd_label(path: str | os.PathLike, label_mode: Any = None) -> np.ndarray:
    """The (H, W) values of a 2D NRRD label (or a 3D one of one slice): stored values, or a 3D Slicer segmentation
    mapped by segment name to the classes of ``label_mode`` (a :class:`~spectraflow_monai.data.LabelMode`: its
    ``segment_classes``).

    Raises:
        DataError: naming the file: unreadable, not 2D, a segment that is no class (naming it), a segmentation read
            without ``label_mode``.
        ImportError: pynrrd is not installed (naming what to install).
    """
    from spectraflow_monai.data.volumes import read_label_volume

    path = os.fspath(path)
    names, values = (None, None) if label_mode is None else label_mode.segment_classes
    arr, _ = read_label_volume(path, names, values)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim != 2:
        raise DataError(f"mask {path!r} is not 2D (shape {arr.shape}); a 2D image's mask is one slice.")
    return np.ascontiguousarray(arr.T)  # NRRD (x, y) -> (rows, columns)


def read_2d(path: str | os.PathLike, kind: str = "image", label_mode: Any = None) -> np.ndarray:
    """Decode a 2D image file fully and return its pixels as (H, W) or (H, W, C) with C in 2..4.

    Pillow first; TIFFs that Pillow cannot open or decode are read with ``tifffile`` (first page); labels may be
    NRRD files (:func:`read_nrrd_label`).

    Args:
        path: the file.
        kind: ``"image"`` (palette images become grey / RGB) or ``"label"`` (a colour palette gives its indices).
            Defaults to ``"image"``.
        label_mode: labels: the run's :class:`~spectraflow_monai.data.LabelMode`, whose classes a 3D Slicer
            segmentation's segments are matched with by name. Defaults to None.

    Raises:
        ValueError: bad ``kind``.
        DataError: (a ``ValueError``) naming the file when it is missing or cannot be decoded.
    """
    if kind not in READ_KINDS:
        raise ValueError(f"kind must be one of {list(READ_KINDS)}, got {kind!r}.")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataError(f"unreadable image {path!r}: no such file.")
    if kind == "label" and is_nrrd_label(path):
        return read_nrrd_label(path, label_mode)
    try:
        arr = _pil_array(path, kind)
    except Exception as e:  # Pillow raises many types (UnidentifiedImageError, OSError, SyntaxError, ...)
        if not _is_tiff(path):
            raise DataError(f"unreadable image {path!r}: {type(e).__name__}: {e}") from e
        try:
            arr = _tiff_array(path)
        except Exception as e2:
            why = str(e2).split(": ", 1)[-1] if isinstance(e2, DataError) else f"{type(e2).__name__}: {e2}"
            raise DataError(
                f"unreadable image {path!r}: neither Pillow ({type(e).__name__}: {e}) nor tifffile ({why}) can "
                "decode it."
            ) from e2
    if arr.dtype == bool and kind == "label":  # 1-bit masks: 0/1
        arr = arr.astype(np.uint8)
    if arr.ndim == 3 and arr.shape[-1] == 2:  # grey + alpha
        arr = arr[..., 0]
    elif arr.ndim == 3 and arr.shape[-1] == 4:  # RGBA
        arr = arr[..., :3]
    return arr


def to_rgb_float(arr: np.ndarray, path: str | os.PathLike = "image") -> np.ndarray:
    """(H, W[, 3]) pixels -> float32 (H, W, 3) in [0, 1] by the range of their type (see the module docstring).

    Raises:
        DataError: naming ``path`` for NaN / infinite pixels, 32-bit integers above 65535 or negative, or an
            unsupported type.
    """
    path = os.fspath(path)
    arr = np.asarray(arr)
    if arr.dtype == bool:
        arr = arr.astype(np.float32)
    if np.issubdtype(arr.dtype, np.floating):
        if not bool(np.isfinite(arr).all()):
            n_nan, n_inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
            raise DataError(
                f"non-finite pixels in {path!r}: {n_nan} NaN and {n_inf} infinite value(s) out of {arr.size}; "
                "replace them (e.g. with 0) before using the file."
            )
        out = arr.astype(np.float32)
    elif arr.dtype in (np.uint8, np.uint16):
        out = arr.astype(np.float32) / float(np.iinfo(arr.dtype).max)
    elif np.issubdtype(arr.dtype, np.integer):  # Pillow's "I" mode (16-bit PNG / TIFF), int16 TIFFs
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > 65535:
            raise DataError(
                f"image {path!r} holds {arr.dtype} values {lo}..{hi}: integer images must be 8-bit or 16-bit "
                "(0..65535); convert it to 16-bit or floating point in [0, 1]."
            )
        out = arr.astype(np.float32) / 65535.0
    else:
        raise DataError(f"image {path!r} has pixels of type {arr.dtype}, which is not an image type.")
    if out.ndim == 2:
        out = np.repeat(out[..., None], 3, axis=-1)
    return out


class Image2DReader(ImageReader):
    """MONAI image reader for 2D files: Pillow, and tifffile for the TIFFs Pillow cannot read.

    Output layout as :class:`monai.data.PILReader` (``reverse_indexing``): (W, H) spatial axes, channels last, so
    ``EnsureChannelFirstd`` gives (C, W, H) and ``PILWriter`` writes predictions the right way round. Used by the
    ``spectraflow_2d_segmentation`` bundle as ``LoadImaged(keys, reader=Image2DReader(kind))``.

    Args:
        kind: ``"image"``: float32 RGB in [0, 1] (3 channels); ``"label"``: the stored integer values (see the
            module docstring; NRRD labels too). Defaults to ``"image"``.
        label_mode: labels: the run's :class:`~spectraflow_monai.data.LabelMode` (the bundle's ``label_setup``),
            whose classes a 3D Slicer segmentation's segments are matched with by name. Defaults to None.

    Raises:
        ValueError: bad ``kind``.
    """

    def __init__(self, kind: str = "image", label_mode: Any = None) -> None:
        super().__init__()
        if kind not in READ_KINDS:
            raise ValueError(f"kind must be one of {list(READ_KINDS)}, got {kind!r}.")
        self.kind, self.label_mode = kind, label_mode

    def verify_suffix(self, filename: Sequence[str | os.PathLike] | str | os.PathLike) -> bool:
        """Whether every file of ``filename`` has an extension of :data:`READER_EXTENSIONS` (labels: or
        :data:`NRRD_LABEL_EXTENSIONS`)."""
        extensions = READER_EXTENSIONS + (NRRD_LABEL_EXTENSIONS if self.kind == "label" else ())
        return all(os.path.splitext(os.fspath(f))[1].lower() in extensions for f in ensure_tuple(filename))

    def read(self, data: Sequence[str | os.PathLike] | str | os.PathLike, **kwargs: Any) -> Any:
        """The file path(s); decoding happens in :meth:`get_data`, so that a :class:`DataError` about a 2D file reaches
        the caller (``LoadImage`` would otherwise swallow it and try its other readers). A file without an extension
        of :data:`READER_EXTENSIONS` (a NIfTI volume, ...) raises here: ``LoadImage`` then tries its other readers.
        """
        names = [os.fspath(n) for n in ensure_tuple(data)]
        if not self.verify_suffix(names):
            raise DataError(f"{names}: not a 2D image file (extensions {list(READER_EXTENSIONS)}).")
        return names if len(names) > 1 else names[0]

    def get_data(self, img: Any) -> tuple[np.ndarray, dict]:
        """Decode the file(s): (W, H[, C]) array(s) and metadata (``spatial_shape`` (W, H), ``original_channel_dim``).

        Raises:
            DataError: naming the file when it cannot be decoded (or, for images, holds non-finite pixels).
        """
        items = []
        for name in img if isinstance(img, list) else [img]:
            arr = read_2d(name, self.kind, self.label_mode)
            items.append((name, to_rgb_float(arr, name) if self.kind == "image" else arr))
        arrays = [np.moveaxis(arr, 0, 1) for _, arr in items]
        height, width = items[0][1].shape[:2]
        meta: dict[str, Any] = {"width": width, "height": height, "dtype": str(items[0][1].dtype)}
        meta[MetaKeys.SPATIAL_SHAPE] = np.asarray((width, height))
        if len(arrays) == 1:
            meta[MetaKeys.ORIGINAL_CHANNEL_DIM] = float("nan") if arrays[0].ndim == 2 else -1
            return arrays[0], meta
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise DataError(f"files {[p for p, _ in items]} have different shapes {sorted(shapes)}; cannot stack.")
        meta[MetaKeys.ORIGINAL_CHANNEL_DIM] = 0  # several files: stacked as channels, as MONAI's readers do
        return np.stack(arrays, axis=0), meta


def decode_image(path: str) -> Any:
    """Open ``path`` with PIL, ``verify()`` it (headers, PNG chunk CRCs), then fully decode it; return the image.

    Raises:
        DatasetError: naming the file when it is missing, unreadable or truncated, or holds NaN / infinite pixels.
    """
    from PIL import Image

    try:
        with Image.open(path) as im:
            fmt = im.format
            im.verify()
        if fmt == "JPEG":
            with open(path, "rb") as f:
                f.seek(max(os.path.getsize(path) - 64, 0))
                if b"\xff\xd9" not in f.read():
                    raise DatasetError(f"unreadable image {path!r}: truncated JPEG (no end-of-image marker).")
        im = Image.open(path)
        try:
            im.load()  # decodes every pixel: a truncated BMP/TIFF/JPEG passes verify() but fails here
        except Exception:
            im.close()
            raise
    except DatasetError:
        raise
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, SyntaxError, OSError, ...)
        raise DatasetError(f"unreadable image {path!r}: {type(e).__name__}: {e}") from e
    if im.mode == "F":  # floating-point pixels (e.g. 32-bit TIFF)
        try:
            check_finite(np.asarray(im), path)
        except DatasetError:
            im.close()
            raise
    return im


def check_finite(array: Any, path: str | os.PathLike) -> None:
    """Raise :class:`DatasetError` naming ``path`` when ``array`` holds NaN or infinite values."""
    arr = np.asarray(array)
    if not np.issubdtype(arr.dtype, np.floating) or bool(np.isfinite(arr).all()):
        return
    n_nan, n_inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
    raise DatasetError(
        f"non-finite pixels in {os.fspath(path)!r}: {n_nan} NaN and {n_inf} infinite value(s) out of {arr.size}; "
        "replace them (e.g. with 0) before using the file."
    )


def check_image_readable(path: str | os.PathLike) -> tuple[int, int]:
    """Verify that ``path`` is a readable image and return its (width, height).

    The file is ``verify()``-ed (headers, PNG chunk CRCs, the JPEG end-of-image marker) and then fully decoded, so
    truncated files of every format are caught; floating-point images (e.g. 32-bit TIFF) must hold only finite
    values.

    Raises:
        DatasetError: naming the file when it is missing, unreadable, truncated, or holds NaN / infinite pixels.
    """
    path = os.fspath(path)
    arr = tiff_fallback(path)
    if arr is not None:
        check_finite(arr, path)
        return arr.shape[1], arr.shape[0]
    im = decode_image(path)
    size = im.size
    im.close()
    return size


def tiff_fallback(path: str) -> Any:
    """The pixels of a TIFF that Pillow cannot open or decode, read with tifffile; None for every other file (and
    for TIFFs Pillow reads). Raises :class:`DatasetError` naming the file when neither can read it."""
    if os.path.splitext(path)[1].lower() not in (".tif", ".tiff") or not os.path.isfile(path):
        return None
    try:
        _pil_array(path, "label")
        return None
    except Exception:
        try:
            return read_2d(path, "label")
        except DataError as e:
            raise DatasetError(str(e)) from e
