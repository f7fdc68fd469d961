"""Checks that a 2D segmentation dataset on disk is complete and readable before any training starts.

The datalist builders of :mod:`spectraflow_monai.apps.seg2d.presets` call these checks, so that a wrong path, a missing
mask, a corrupt file or a non-binary mask fails at once with a :class:`DatasetError` that names the file(s) and the
problem, instead of an obscure error in a data-loader worker hours later.

Checks and their cost:

- folder layout (a missing folder or split file names the expected path and the preset's layout) and image/mask
  pairing (an image without a mask or a mask without an image names the files): directory listings only;
- ``check_images=True``: every image and mask is ``verify()``-ed with PIL (headers; PNG chunk CRCs; a JPEG must end
  with its end-of-image marker) and then fully decoded, so a truncated file of any format (JPEG, PNG, BMP, TIFF)
  is caught here and not in a data-loader worker; floating-point images (32-bit TIFF) must hold finite values
  only (NaN or infinite pixels stop the run naming the file); image and mask sizes must match. Decoding costs about
  as long as one epoch of data loading (see the bundle README for the Kvasir-SEG timing);
- ``check_masks=True``: every mask must be a binary mask (:func:`binary_mask_threshold`):

  * a colour image is rejected: more than ``max_grey_fraction`` of its pixels have RGB channels differing by more
    than 32 grey levels;
  * for masks binarised at a grey level (``label_threshold > 1``): a mask whose values are all 0 or 1 is a 0/1
    mask (its entry gets ``label_threshold`` 1); otherwise the values must lie near 0 and near 255 (JPEG noise
    included: Kvasir-SEG's masks hold 0..8 and 246..255) with at most ``max_grey_fraction`` (default 1 %) of the
    pixels strictly between 32 and 224, and some value >= 224. Any other set of values (``{0, 1, 2}``,
    ``{0, 128, 255}``, a grey-level picture) stops the run naming the file and the values found;
  * instance label maps (``label_threshold == 1``, GlaS: foreground = label > 0) get the colour check only.

  Pass ``check_images=False`` / ``check_masks=False`` to skip the checks for very large sets.

:class:`InputCheck` does the image checks for inference inputs, keeping the readable files and listing the others.
All errors are :class:`DatasetError`, a :class:`spectraflow_monai.utils.errors.DataError`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from spectraflow_monai.data.readers import (
    NRRD_LABEL_EXTENSIONS,
    check_finite,
    check_image_readable,
    decode_image,
    is_nrrd_label,
    read_nrrd_label,
    tiff_fallback,
)
from spectraflow_monai.transforms.label import binary_mask_threshold
from spectraflow_monai.utils.errors import DataError, DatasetError, find_input_error

logger = logging.getLogger(__name__)

__all__ = [
    "DatasetError",
    "IMAGE_EXTENSIONS",
    "MASK_EXTENSIONS",
    "InputCheck",
    "SkippingDataset",
    "binary_mask_threshold",
    "check_binary_mask",
    "check_finite",
    "check_folder",
    "check_foreground",
    "check_image_readable",
    "check_pairs",
    "has_foreground",
    "list_images",
    "validate_datalist",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff")
#: mask files: the image extensions and NRRD (``.nrrd``, 3D Slicer's ``.seg.nrrd``, whose id drops the ``.seg``)
MASK_EXTENSIONS = IMAGE_EXTENSIONS + NRRD_LABEL_EXTENSIONS
_MAX_LISTED = 10


def _listing(paths: Sequence[str], total: int | None = None) -> str:
    total = len(paths) if total is None else total
    shown = ", ".join(str(p) for p in paths[:_MAX_LISTED])
    more = f" and {total - _MAX_LISTED} more" if total > _MAX_LISTED else ""
    return f"{shown}{more}"


def check_folder(path: str | os.PathLike, preset: str, layout: str) -> str:
    """Raise :class:`DatasetError` when the folder ``path`` does not exist, or is a file (not a folder).

    Args:
        path: the expected folder.
        preset: dataset name for the message (e.g. ``"kvasir"``).
        layout: a short description of the expected layout for the message.

    Returns:
        ``path`` as a string.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise DatasetError(
            f"{preset}: {path!r} is not a folder (it is a file): give the folder that holds the data set "
            f"(dataset_dir). Expected layout: {layout}"
        )
    if not os.path.isdir(path):
        raise DatasetError(f"{preset}: dataset folder not found: {path!r}. Expected layout: {layout}")
    return path


def list_images(folder: str | os.PathLike, suffix: str = "", extensions: Sequence[str] = IMAGE_EXTENSIONS) -> dict:
    """Map id -> path for the image files in ``folder`` whose stem ends with ``suffix`` (the id excludes it).

    Hidden files and files with other extensions are ignored; a 3D Slicer segmentation ``a.seg.nrrd`` has the id
    ``a``. Raises :class:`DatasetError` when two files share an id (e.g. ``a.jpg`` and ``a.png``).
    """
    out: dict[str, str] = {}
    folder = os.fspath(folder)
    for fname in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(fname)
        if ext.lower() == ".nrrd" and stem.lower().endswith(".seg"):
            stem = stem[:-4]
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


def _nrrd_mask(path: str, label_mode: Any) -> np.ndarray:
    """The (H, W) values of an NRRD mask (:func:`~spectraflow_monai.data.readers.read_nrrd_label`), errors as
    :class:`DatasetError`."""
    try:
        return read_nrrd_label(path, label_mode)
    except DataError as e:
        raise DatasetError(str(e)) from e


def _mask_info(
    path: str, label_threshold: float, max_grey_fraction: float, label_mode: Any = None
) -> tuple[float, tuple[int, int]]:
    """(threshold, (width, height)) of the mask at ``path``, decoded once; see :func:`check_binary_mask`."""
    from PIL import ImageChops

    arr = _nrrd_mask(path, label_mode) if is_nrrd_label(path) else tiff_fallback(path)
    if arr is not None:  # an NRRD mask, or a TIFF only tifffile reads: the same rules on its array
        check_finite(arr, path)
        size = (arr.shape[1], arr.shape[0])
        if arr.ndim == 3:
            spread = arr.astype(np.float64).max(axis=-1) - arr.astype(np.float64).min(axis=-1)
            colour = float(np.mean(spread > 32 * (257 if arr.dtype == np.uint16 else 1)))
            if colour > max_grey_fraction:
                raise DatasetError(
                    f"not a binary mask: {path!r} is a colour image ({100 * colour:.1f}% of pixels coloured)."
                )
            arr = arr.mean(axis=-1)
        if label_threshold <= 1:
            return label_threshold, size
        return binary_mask_threshold(arr, path, max_grey_fraction), size
    try:
        im = decode_image(path)
    except DatasetError as e:
        raise DatasetError(str(e).replace("unreadable image", "unreadable mask", 1)) from e
    with im:
        size = im.size
        if im.mode == "P":  # palette: grey palettes are read as grey levels, others as label indices
            palette = np.asarray(im.getpalette() or [], dtype=np.int16).reshape(-1, 3)
            grey_palette = bool(np.all(palette.max(axis=1) == palette.min(axis=1)))
            arr = np.asarray(im.convert("L") if grey_palette else im)
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
            arr = np.asarray(rgb.convert("L"))
        else:
            arr = np.asarray(im)
    if label_threshold <= 1:
        return label_threshold, size
    return binary_mask_threshold(arr, path, max_grey_fraction), size


def check_binary_mask(
    path: str | os.PathLike, label_threshold: float = 128, max_grey_fraction: float = 0.01
) -> float:
    """Decode the mask at ``path``, raise :class:`DatasetError` when it is not a binary mask, return its threshold.

    Args:
        path: mask file.
        label_threshold: the grey level the mask is binarised at (foreground = value >= threshold). Above 1 the
            mask must be a 0/1 or a 0/255 mask (:func:`binary_mask_threshold`); with 1 (instance label maps) only
            the colour check applies. Defaults to 128.
        max_grey_fraction: largest tolerated fraction of mid-grey (32 < v < 224) or colour pixels. Defaults to 0.01.

    Returns:
        The threshold to binarise this mask at: 1 for a 0/1 mask, 128 for a 0/255 mask, ``label_threshold`` for a
        label map.
    """
    return _mask_info(os.fspath(path), label_threshold, max_grey_fraction)[0]


def validate_datalist(
    datalist: Sequence[MutableMapping[str, Any]],
    what: str,
    check_images: bool = True,
    check_masks: bool = True,
    max_grey_fraction: float = 0.01,
    label_mode: Any = None,
) -> None:
    """Run the per-file checks on a datalist (entries with ``image``, ``label`` and ``label_threshold``).

    All files are checked and the problems are reported together, one line each (the one-line report of a bundle
    run, :func:`~spectraflow_monai.utils.errors.error_summary`, names the first few and the count). With
    ``check_masks``, an entry whose mask turns out to be a 0/1 mask (``label_threshold`` above 1 but every value 0
    or 1) gets ``label_threshold`` 1, so that its foreground is not read as background.

    Args:
        datalist: entries as produced by the builders of :mod:`spectraflow_monai.apps.seg2d.presets` (updated in place).
        what: description of the split for messages (e.g. the split file).
        check_images: fully decode images and masks (truncated files, NaN / infinite pixels) and compare their
            sizes. Defaults to ``True``.
        check_masks: check that masks are 0/1 or 0/255 masks (:func:`binary_mask_threshold`; label maps: colour
            check only). Defaults to ``True``.
        max_grey_fraction: see :func:`binary_mask_threshold`. Defaults to 0.01.
        label_mode: the run's :class:`~spectraflow_monai.data.LabelMode`: the classes that the segments of 3D
            Slicer segmentation masks (``.seg.nrrd``) are matched with by name. Defaults to None.

    Raises:
        DatasetError: when the datalist is empty or any file fails a check.
    """
    if len(datalist) == 0:
        raise DatasetError(f"empty split: no images in {what}.")
    problems: list[str] = []
    for entry in datalist:
        try:
            size_i = check_image_readable(entry["image"]) if check_images else None
            if check_masks:
                threshold, size_m = _mask_info(
                    os.fspath(entry["label"]), entry.get("label_threshold", 128), max_grey_fraction, label_mode
                )
                if threshold != entry.get("label_threshold", 128):
                    entry["label_threshold"] = threshold
            elif check_images and is_nrrd_label(entry["label"]):
                arr = _nrrd_mask(os.fspath(entry["label"]), label_mode)
                size_m = (arr.shape[1], arr.shape[0])
            elif check_images:
                size_m = check_image_readable(entry["label"])
            if check_images and size_i != size_m:
                raise DatasetError(
                    f"image {entry['image']!r} is {size_i[0]}x{size_i[1]} but its mask {entry['label']!r} "
                    f"is {size_m[0]}x{size_m[1]}."
                )
        except DatasetError as e:
            problems.append(str(e))
    if problems:  # every one listed: the run's one-line report names the first few and the count
        raise DatasetError(f"{what}: {len(problems)} bad file(s):\n  " + "\n  ".join(problems))


def _mask_array(path: str) -> np.ndarray | None:
    """The values of a mask file (2D image, ``.npz`` slice with a ``label`` array, ``.npy``, NIfTI / NRRD), or
    None when it cannot be read here (the other checks report unreadable files)."""
    lower = path.lower()
    try:
        if lower.endswith(".npz"):
            with np.load(path, allow_pickle=False) as npz:
                return np.asarray(npz["label"] if "label" in npz.files else npz[npz.files[0]])
        if lower.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        if lower.endswith(IMAGE_EXTENSIONS):
            return np.asarray(decode_image(path))
        if lower.endswith((".nii", ".nii.gz", ".nrrd", ".mha", ".mhd")):
            from monai.transforms import LoadImage

            return np.asarray(LoadImage(image_only=True)(path))
    except Exception:  # noqa: BLE001 (unreadable: not this check's to report)
        return None
    return None


def has_foreground(path: str | os.PathLike, label_threshold: float | None = None) -> bool | None:
    """Whether the mask at ``path`` has a foreground pixel: a value >= ``label_threshold`` (binary masks), or > 0
    when it is None (label maps); None when the file cannot be read here.

    Args:
        path: mask or label-map file (2D image, ``.npz`` slice, ``.npy``, NIfTI / NRRD).
        label_threshold: the entry's ``label_threshold``; None: any non-zero value. Defaults to None.
    """
    values = _mask_array(os.fspath(path))
    if values is None:
        return None
    return bool(np.any(values > 0) if label_threshold is None else np.any(values >= label_threshold))


def check_foreground(
    datalist: Sequence[Mapping[str, Any]],
    what: str,
    role: str = "training",
    allow_empty: bool = False,
    label_key: str = "label",
) -> bool:
    """Report a datalist whose masks are all background before any training starts.

    Masks are read in order until one has foreground (usually the first: the check costs one read), so only a set
    with no foreground at all is read whole. Such a set cannot train a segmentation model (a training set) or select
    one (a validation set: the Dice is 0, or undefined, every epoch):

    - ``role="training"``: a :class:`DatasetError` naming the set, the number of masks and the first of them, unless
      ``allow_empty`` (then a warning);
    - ``role="validation"``: a warning (the best-model saver then keeps the newest of the equally scored models,
      :class:`spectraflow_monai.handlers.SafeCheckpointSaver`).

    Args:
        datalist: entries with a mask path under ``label_key`` and optionally ``label_threshold``.
        what: the set in messages (e.g. ``"Kvasir-SEG (train split)"``).
        role: ``"training"`` or ``"validation"``. Defaults to ``"training"``.
        allow_empty: train on all-background masks with a warning instead of an error. Defaults to False.
        label_key: key of the mask path. Defaults to ``"label"``.

    Returns:
        True when some mask has foreground (or no mask could be read here), False when all are background.

    Raises:
        ValueError: ``role`` is neither ``"training"`` nor ``"validation"``.
        DatasetError: a training set without foreground and ``allow_empty`` False.
    """
    if role not in ("training", "validation"):
        raise ValueError(f"role must be 'training' or 'validation', got {role!r}.")
    masks = [e for e in datalist if isinstance(e.get(label_key), (str, os.PathLike))]
    if not masks:
        return True
    for entry in masks:
        if has_foreground(entry[label_key], entry.get("label_threshold")) is not False:
            return True
    first = os.fspath(masks[0][label_key])
    if role == "validation":
        logger.warning(
            "%s: every validation mask (%d, e.g. %r) is background only: the validation Dice is 0 (or undefined) "
            "every epoch and cannot select a model; the newest of the equally scored models is kept.",
            what, len(masks), first,
        )  # fmt: skip
        return False
    message = (
        f"{what}: every training mask ({len(masks)}, e.g. {first!r}) is background only, so the model would learn "
        "to predict nothing. Check the masks and their label_threshold, or set allow_empty_masks true to train on "
        "them anyway."
    )
    if not allow_empty:
        raise DatasetError(message)
    logger.warning("%s (allow_empty_masks is set: training anyway)", message.split(" Check the masks")[0])
    return False


class InputCheck:
    """Check every inference input up front; keep the usable ones, list the others at the end of the run.

    A folder of inputs with one bad file must not stop the others: the bundles' ``inference.yaml`` run on
    :attr:`datalist` (the files that passed the check), or on a :class:`SkippingDataset` of it, which also skips
    (and records) an input whose loading fails with a :class:`~spectraflow_monai.utils.errors.DataError` (a CT
    volume with NaN voxels, found only when it is read whole), and call :meth:`raise_failures` at the end, which
    raises a :class:`DatasetError` listing the failed files, so the run exits non-zero after writing every other
    output.
    Each failure is also logged as a warning when found.

    Args:
        paths: the input files, or datalist entries holding them under ``key``.
        key: the datalist key of the input. Defaults to ``"image"``.
        require_readable: raise :meth:`raise_failures`' error at once when no input at all passes the check
            (nothing would be segmented). Defaults to False.
        check: called with each path; raises a :class:`~spectraflow_monai.utils.errors.DataError` (e.g.
            :class:`DatasetError`) for an unusable file. Defaults to None: :func:`check_image_readable` (2D images,
            fully decoded).
        noun: what the inputs are, in the final message. Defaults to ``"input image(s)"``.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike | Mapping[str, Any]],
        key: str = "image",
        require_readable: bool = False,
        check: Callable[[str], Any] | None = None,
        noun: str = "input image(s)",
    ) -> None:
        self.key, self.noun = key, noun
        self.paths = [os.fspath(p[key] if isinstance(p, Mapping) else p) for p in paths]
        self.good: list[str] = []
        self.failures: list[str] = []
        for path in self.paths:
            try:
                (check or check_image_readable)(path)
                self.good.append(path)
            except DataError as e:
                self.fail(path, e)
        self.datalist = [{key: p} for p in self.good]
        if require_readable and not self.good:
            self.raise_failures()

    def fail(self, path: str, error: BaseException) -> None:
        """Record that the input ``path`` failed with ``error`` (its message names the file), and log it."""
        logger.warning("skipping %s", error)
        if path in self.good:
            self.good.remove(path)
        self.failures.append(str(error))

    def raise_failures(self) -> None:
        """Raise :class:`DatasetError` listing the files that failed the check (nothing when all passed)."""
        if self.failures:  # every one listed: the run's one-line report names the first few and the count
            raise DatasetError(
                f"{len(self.failures)} of {len(self.paths)} {self.noun} could not be read; the outputs of the other "
                f"{len(self.good)} were written:\n  " + "\n  ".join(self.failures)
            )


class SkippingDataset(IterableDataset):
    """The inputs of an :class:`InputCheck` (its :attr:`~InputCheck.datalist`), each loaded with ``transform``
    when iterated; an input whose loading fails with a :class:`~spectraflow_monai.utils.errors.DataError` is
    recorded in the check (:meth:`InputCheck.fail`, listed by :meth:`InputCheck.raise_failures`) and skipped, so
    the inputs after it are still segmented. Iterate it in the main process (``num_workers=0``): the failures are
    recorded there.

    Args:
        check: the inputs and where failures are recorded.
        transform: loads one datalist entry (a MONAI ``Compose``). Defaults to None (the entries as they are).
    """

    def __init__(self, check: InputCheck, transform: Callable | None = None) -> None:
        super().__init__()
        self.check, self.transform = check, transform

    def __iter__(self) -> Iterator[Any]:
        for entry in list(self.check.datalist):
            try:
                yield entry if self.transform is None else self.transform(dict(entry))
            except Exception as e:  # noqa: BLE001 (a data error is recorded, anything else raised)
                found = find_input_error(e)
                if not isinstance(found, DataError):
                    raise
                self.check.fail(entry[self.check.key], found)
