"""Checks that a 2D segmentation dataset on disk is complete and readable before any training starts.

The datalist builders of :mod:`spectraflow_monai.data.datasets2d` call these checks, so that a wrong path, a missing
mask, a corrupt file or a non-binary mask fails at once with a :class:`DatasetError` that names the file(s) and the
problem, instead of an obscure error in a data-loader worker hours later.

Checks and their cost:

- folder layout (a missing folder or split file names the expected path and the preset's layout) and image/mask
  pairing (an image without a mask or a mask without an image names the files): directory listings only;
- ``check_images=True``: every image and mask is opened with PIL and ``verify()``-ed (headers; PNG chunk CRCs; a
  JPEG must end with its end-of-image marker, which catches truncated downloads), and image and mask sizes must
  match; no pixel decoding;
- ``check_masks=True``: every mask is fully decoded once (about 6 s for the 1000 Kvasir-SEG masks on one core) and
  must be a binary mask:

  * a colour image is rejected: more than ``max_grey_fraction`` of its pixels have RGB channels differing by more
    than 32 grey levels;
  * for masks binarised at a grey level (``label_threshold > 1``, e.g. Kvasir-SEG's JPEG masks at 128), more than
    ``max_grey_fraction`` (default 1 %) of the pixels lying strictly between 32 and 224 means "not a binary mask"
    (JPEG noise at the boundary stays far below this);
  * instance label maps (``label_threshold == 1``, GlaS: foreground = label > 0) are not grey-checked.

  Decoding every mask costs a few seconds per thousand masks; pass ``check_masks=False`` for very large sets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DatasetError",
    "IMAGE_EXTENSIONS",
    "check_binary_mask",
    "check_folder",
    "check_image_readable",
    "check_pairs",
    "list_images",
    "validate_datalist",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
_MAX_LISTED = 10


class DatasetError(ValueError):
    """A dataset on disk is missing, incomplete or corrupt; the message names the file(s) and the problem."""


def _listing(paths: Sequence[str], total: int | None = None) -> str:
    total = len(paths) if total is None else total
    shown = ", ".join(str(p) for p in paths[:_MAX_LISTED])
    more = f" and {total - _MAX_LISTED} more" if total > _MAX_LISTED else ""
    return f"{shown}{more}"


def check_folder(path: str | os.PathLike, preset: str, layout: str) -> str:
    """Raise :class:`DatasetError` when the folder ``path`` does not exist.

    Args:
        path: the expected folder.
        preset: dataset name for the message (e.g. ``"kvasir"``).
        layout: a short description of the expected layout for the message.

    Returns:
        ``path`` as a string.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DatasetError(f"{preset}: dataset folder not found: {path!r}. Expected layout: {layout}")
    return path


def list_images(folder: str | os.PathLike, suffix: str = "", extensions: Sequence[str] = IMAGE_EXTENSIONS) -> dict:
    """Map id -> path for the image files in ``folder`` whose stem ends with ``suffix`` (the id excludes it).

    Hidden files and files with other extensions are ignored. Raises :class:`DatasetError` when two files share an
    id (e.g. ``a.jpg`` and ``a.png``).
    """
    out: dict[str, str] = {}
    folder = os.fspath(folder)
    for fname in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(fname)
        if fname.startswith(".") or ext.lower() not in extensions or not stem.endswith(suffix):
            continue
        key = stem[: len(stem) - len(suffix)] if suffix else stem
        if not key:
            continue
        if key in out:
            raise DatasetError(f"two files share the id {key!r}: {out[key]!r} and {os.path.join(folder, fname)!r}.")
        out[key] = os.path.join(folder, fname)
    return out


def check_pairs(images: Mapping[str, str], masks: Mapping[str, str], preset: str) -> None:
    """Raise :class:`DatasetError` when an image has no mask or a mask has no image (naming the files)."""
    no_mask = sorted(images[k] for k in images.keys() - masks.keys())
    no_image = sorted(masks[k] for k in masks.keys() - images.keys())
    problems = []
    if no_mask:
        problems.append(f"{len(no_mask)} image(s) without a mask: {_listing(no_mask)}")
    if no_image:
        problems.append(f"{len(no_image)} mask(s) without an image: {_listing(no_image)}")
    if problems:
        raise DatasetError(f"{preset}: " + "; ".join(problems) + ".")


def check_image_readable(path: str | os.PathLike) -> tuple[int, int]:
    """Cheaply verify that ``path`` is a readable image (PIL header + ``verify()``); return its (width, height).

    Raises:
        DatasetError: naming the file when it is missing, unreadable, or a truncated JPEG.
    """
    from PIL import Image

    path = os.fspath(path)
    try:
        with Image.open(path) as im:
            size = im.size
            fmt = im.format
            im.verify()
        if fmt == "JPEG":
            with open(path, "rb") as f:
                f.seek(max(os.path.getsize(path) - 64, 0))
                if b"\xff\xd9" not in f.read():
                    raise DatasetError(f"unreadable image {path!r}: truncated JPEG (no end-of-image marker).")
    except DatasetError:
        raise
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, SyntaxError, OSError, ...)
        raise DatasetError(f"unreadable image {path!r}: {type(e).__name__}: {e}") from e
    return size


def check_binary_mask(path: str | os.PathLike, label_threshold: float = 128, max_grey_fraction: float = 0.01) -> None:
    """Decode the mask at ``path`` and raise :class:`DatasetError` when it is not a binary mask.

    Args:
        path: mask file.
        label_threshold: the grey level the mask is binarised at (foreground = value >= threshold). With a threshold
            above 1 the mid-grey check applies; with 1 (instance label maps) only the colour check does.
            Defaults to 128.
        max_grey_fraction: largest tolerated fraction of mid-grey (32 < v < 224) or colour pixels. Defaults to 0.01.
    """
    from PIL import Image, ImageChops

    path = os.fspath(path)
    grey_hist: list[int] | None = None  # 256-bin histogram of the grey levels, when 8-bit
    arr: np.ndarray | None = None
    try:
        with Image.open(path) as im:
            im.load()
            if im.mode == "P":  # palette: grey palettes are read as grey levels, others as label indices
                palette = np.asarray(im.getpalette() or [], dtype=np.int16).reshape(-1, 3)
                grey_palette = bool(np.all(palette.max(axis=1) == palette.min(axis=1)))
                grey_hist = im.convert("L").histogram() if grey_palette else None
            elif im.mode in ("RGB", "RGBA", "LA", "CMYK", "YCbCr"):
                rgb = im.convert("RGB")
                r, g, b = rgb.split()
                spread = ImageChops.lighter(
                    ImageChops.lighter(ImageChops.difference(r, g), ImageChops.difference(g, b)),
                    ImageChops.difference(r, b),
                )
                colour = sum(spread.histogram()[33:]) / float(rgb.width * rgb.height)
                if colour > max_grey_fraction:
                    raise DatasetError(
                        f"not a binary mask: {path!r} is a colour image ({100 * colour:.1f}% of pixels coloured)."
                    )
                grey_hist = rgb.convert("L").histogram()
            elif im.mode == "L":
                grey_hist = im.histogram()
            elif label_threshold > 1:
                arr = np.asarray(im)
    except DatasetError:
        raise
    except Exception as e:
        raise DatasetError(f"unreadable mask {path!r}: {type(e).__name__}: {e}") from e
    if label_threshold <= 1:
        return
    if grey_hist is not None:
        total = float(sum(grey_hist))
        grey = sum(grey_hist[33:224]) / total if total else 0.0
    elif arr is not None and arr.size:  # 16/32-bit or bilevel masks: compare on a 0..255 scale
        arr = np.asarray(arr, dtype=np.float64)
        if float(arr.max()) > 255:
            arr = arr * (255.0 / float(arr.max()))
        grey = float(np.mean((arr > 32) & (arr < 224)))
    else:
        return
    if grey > max_grey_fraction:
        raise DatasetError(
            f"not a binary mask: {path!r} has {100 * grey:.1f}% mid-grey pixels (values in (32, 224)); "
            f"at most {100 * max_grey_fraction:.1f}% are tolerated."
        )


def validate_datalist(
    datalist: Sequence[Mapping[str, Any]],
    what: str,
    check_images: bool = True,
    check_masks: bool = True,
    max_grey_fraction: float = 0.01,
) -> None:
    """Run the per-file checks on a datalist (entries with ``image``, ``label`` and ``label_threshold``).

    All files are checked and the problems are reported together (the first few named).

    Args:
        datalist: entries as produced by the builders of :mod:`spectraflow_monai.data.datasets2d`.
        what: description of the split for messages (e.g. the split file).
        check_images: verify images and masks (headers) and their sizes. Defaults to ``True``.
        check_masks: decode masks and check they are binary. Defaults to ``True``.
        max_grey_fraction: see :func:`check_binary_mask`. Defaults to 0.01.

    Raises:
        DatasetError: when the datalist is empty or any file fails a check.
    """
    if len(datalist) == 0:
        raise DatasetError(f"empty split: no images in {what}.")
    problems: list[str] = []
    for entry in datalist:
        try:
            if check_images:
                size_i = check_image_readable(entry["image"])
                size_m = check_image_readable(entry["label"])
                if size_i != size_m:
                    raise DatasetError(
                        f"image {entry['image']!r} is {size_i[0]}x{size_i[1]} but its mask {entry['label']!r} "
                        f"is {size_m[0]}x{size_m[1]}."
                    )
            if check_masks:
                check_binary_mask(entry["label"], entry.get("label_threshold", 128), max_grey_fraction)
        except DatasetError as e:
            problems.append(str(e))
    if problems:
        more = f" (and {len(problems) - _MAX_LISTED} more problems)" if len(problems) > _MAX_LISTED else ""
        raise DatasetError(f"{what}: {len(problems)} bad file(s){more}:\n  " + "\n  ".join(problems[:_MAX_LISTED]))
