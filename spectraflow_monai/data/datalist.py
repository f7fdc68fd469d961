"""One datalist contract for every 2D data source of SpectraFlow: presets, a Decathlon datalist JSON, folder pairs.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") is evaluated on Kvasir-SEG, ISIC-2016 and GlaS; the ``spectraflow_2d_segmentation`` bundle reads those
as presets (:mod:`spectraflow_monai.apps.seg2d.presets`) and, through :func:`build_datalist`, any set of 2D images with
masks:

- ``data_list_file_path``: a Decathlon-style JSON (as the MONAI model zoo's ``--data_list_file_path``)::

      {"training":   [{"image": "images/a.tif", "label": "masks/a.png"}, ...],
       "validation": [{"image": ..., "label": ...}, ...],     optional: else a seeded hold-out of training
       "test":       [{"image": ..., "label": ...}, ...]}     optional

  relative paths start at ``dataset_dir`` (None: the JSON's folder), resolved by
  :func:`monai.data.load_decathlon_datalist`;
- ``dataset="folder"``: ``<dataset_dir>/images`` and ``<dataset_dir>/masks``, paired by file stem; a mask may carry
  one suffix of :data:`MASK_SUFFIXES` (``a.tif`` + ``a_mask.png``) and be an image or an NRRD file (``a.nrrd``, 3D
  Slicer's ``a.seg.nrrd``: segments matched with the classes by name, see :mod:`spectraflow_monai.data.readers`);
  optional split lists ``<dataset_dir>/splits/{train,val,test}.txt`` (one id per line), else the seeded hold-out;
  optional field-of-view /
  ignore masks ``<dataset_dir>/fov/<id>[<suffix>].<ext>`` (entry key ``fov``: evaluation scores only their non-zero
  pixels), as a JSON entry's ``"fov"``.

Every source returns entries ``{"image": path, "label": path, "name": id, "label_threshold": t}`` (the contract
of the presets). Splits: ``"train"``, ``"val"`` (aliases ``validation``, ``valid``), ``"test"`` and ``"all"``. The
hold-out (no ``validation`` list, no ``splits/val.txt``): ``round(val_fraction * N)`` entries (at least 1, at most
N - 1) of the training entries sorted by name, drawn with ``numpy.random.RandomState(seed)``, logged with their
names. ``"test"``: the JSON's ``test`` list (or ``splits/test.txt``) when there is one, else the validation split
(logged). ``fraction`` (low-data runs) then keeps a nested subset of ``"train"``
(:func:`~spectraflow_monai.data.low_data_subset`).

Masks (see :func:`spectraflow_monai.data.label_mode`): with ``label_classes`` None they are binary: 0/1 or 0/255
masks (:func:`~spectraflow_monai.transforms.label.binary_mask_threshold`), or, with ``label_threshold`` given,
foreground = value >= ``label_threshold`` (``1``: every non-zero value). With ``label_classes`` every mask is a label
map whose values must be the named classes. Every file is decoded before training (``check_images`` /
``check_masks``); a problem raises :class:`~spectraflow_monai.data.validation.DatasetError` naming the file.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from spectraflow_monai.data.label_mode import LabelMode, label_mode
from spectraflow_monai.data.subsets import holdout, low_data_subset
from spectraflow_monai.data.validation import (
    IMAGE_EXTENSIONS,
    MASK_EXTENSIONS,
    DatasetError,
    check_pairs,
    list_images,
)
from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "DATA_SOURCES",
    "MASK_SUFFIXES",
    "decathlon_datalist",
    "default_dataset_dir",
    "folder_datalist",
    "inference_files",
    "OWN_DATA_KWARGS",
]

logger = logging.getLogger(__name__)

#: the sources of :func:`build_datalist` besides the presets (``datalist``: chosen by ``data_list_file_path``).
DATA_SOURCES: tuple[str, ...] = ("folder", "datalist")
#: mask name suffixes the folder source recognises (``<id><suffix>.<ext>``), tried in this order.
MASK_SUFFIXES: tuple[str, ...] = ("_mask", "_masks", "_anno", "_label", "_labels", "_seg", "_segmentation", "_gt")
FOLDER_LAYOUT = (
    "<dataset_dir>/images/<id>.<ext>, <dataset_dir>/masks/<id>[<suffix>].<ext> (suffix one of "
    f"{', '.join(MASK_SUFFIXES)}), optional <dataset_dir>/splits/{{train,val,test}}.txt, optional "
    "<dataset_dir>/fov/<id>[<suffix>].<ext> (field-of-view masks)"
)
_SPLITS = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val"}
_SPLITS.update({"test": "test", "all": "all"})
OWN_DATA_KWARGS = ("label_threshold", "check_images", "check_masks", "group_pattern")


def _check_split(split: Any) -> str:
    s = _SPLITS.get(str(split).lower()) if isinstance(split, str) else None
    if s is None:
        raise SettingError(f"split must be 'train', 'val', 'test' or 'all', got {split!r}.")
    return s


def _check_dir(dataset_dir: Any, what: str) -> str:
    if not isinstance(dataset_dir, (str, os.PathLike)) or not os.fspath(dataset_dir):
        raise SettingError(f"dataset_dir must be a folder path, got {dataset_dir!r}.")
    path = os.fspath(dataset_dir)
    if not os.path.exists(path):
        raise DatasetError(f"dataset_dir {path!r} does not exist ({what}).")
    if not os.path.isdir(path):
        raise DatasetError(f"dataset_dir {path!r} is a file, not a folder ({what}).")
    return path


def _name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _check_unique(entries: Sequence[Mapping[str, Any]], what: str) -> None:
    seen: dict[str, str] = {}
    for e in entries:
        if e["name"] in seen:
            raise DatasetError(
                f"{what}: two images share the name {e['name']!r} ({seen[e['name']]!r} and {e['image']!r}); "
                "evaluation outputs are named after it: rename one."
            )
        seen[e["name"]] = e["image"]


def _finish(
    entries: list[dict],
    split: str,
    what: str,
    fraction: float,
    seed: int,
    mode: LabelMode,
    label_threshold: Any,
    check_images: bool,
    check_masks: bool,
) -> list[dict]:
    if not entries:
        raise DatasetError(f"empty split: the {split} split of {what} has no images.")
    if split == "train":
        entries = low_data_subset(entries, fraction, seed)
        if fraction < 1.0:
            logger.info("data_fraction %s (seed %d): %d training image(s) kept", fraction, seed, len(entries))
    for e in entries:
        e.setdefault("label_threshold", mode.default_threshold(label_threshold))
    mode.validate(entries, f"{what} ({split} split)", check_images=check_images, check_masks=check_masks)
    logger.info("%s: %d image(s) in the %s split", what, len(entries), split)
    return entries


def _assign_groups(entries: list[dict], group_pattern: Any, what: str) -> None:
    """Set ``entry["group"]`` from ``group_pattern`` (first group of the match in the id, else the whole match) for
    the entries without a ``group`` of their own."""
    if group_pattern is None:
        return
    try:
        pattern = re.compile(group_pattern)
    except (TypeError, re.error) as e:
        raise SettingError(f"group_pattern must be a regular expression, got {group_pattern!r} ({e}).") from e
    for e in entries:
        if "group" in e:
            continue
        m = pattern.search(str(e["name"]))
        if m is None:
            raise DatasetError(
                f"{what}: group_pattern {group_pattern!r} does not match the image id {e['name']!r} ({e['image']!r}); "
                "every id must name its group (patient, video)."
            )
        e["group"] = m.group(1) if pattern.groups else m.group(0)


def _split_entries(
    train: list[dict], val: list[dict] | None, test: list[dict] | None, split: str, what: str, val_fraction: float,
    seed: int,
) -> list[dict]:  # fmt: skip
    if split == "all":
        return train + (val or []) + (test or [])
    if split == "test" and test is not None:
        logger.info("%s: the test split is its test list (%d image(s))", what, len(test))
        return test
    if val is None:
        train, val = holdout(train, val_fraction, seed)
        if split != "train":
            logger.info(
                "%s has no validation list: %d of %d training image(s) held out for validation (val_fraction %s, "
                "seed %d): %s", what, len(val), len(train) + len(val), val_fraction, seed, [e["name"] for e in val],
            )  # fmt: skip
            groups = sorted({str(e["group"]) for e in val if "group" in e})
            if groups:
                logger.info("%s: whole groups held out (no group in both splits): %s", what, groups)
    if split == "test":
        logger.info("%s has no test list: the test split is the validation split", what)
    return train if split == "train" else val


def default_dataset_dir(bundle_root: str | os.PathLike, data_list_file_path: str | os.PathLike | None = None) -> str:
    """The default ``dataset_dir`` of the bundles: the datalist JSON's own folder when ``data_list_file_path`` is set
    (its relative paths start there, as in :func:`decathlon_datalist` with ``dataset_dir=None``), else
    ``<bundle_root>/data/synthetic`` (where the synthetic preset is generated). A ``dataset_dir`` given on the
    command line replaces it.
    """
    if data_list_file_path:
        return os.path.dirname(os.path.abspath(os.fspath(data_list_file_path)))
    return os.path.join(os.fspath(bundle_root), "data", "synthetic")


def decathlon_datalist(
    data_list_file_path: str | os.PathLike,
    dataset_dir: str | os.PathLike | None = None,
    split: str = "train",
    fraction: float = 1.0,
    seed: int = 0,
    val_fraction: float = 0.2,
    label_classes: Any = None,
    label_threshold: float | None = None,
    check_images: bool = True,
    check_masks: bool = True,
    group_pattern: str | None = None,
) -> list[dict]:
    """The entries of one split of a Decathlon-style datalist JSON of 2D images (see the module docstring).

    Args:
        data_list_file_path: the JSON (``training``; optional ``validation`` and ``test``; entries
            ``{"image", "label"}``, other keys kept).
        dataset_dir: base of relative paths; None: the JSON's folder. Defaults to None.
        split: ``"train"``, ``"val"``, ``"test"`` or ``"all"``. Defaults to ``"train"``.
        fraction: kept fraction of ``"train"`` (low-data runs). Defaults to 1.0.
        seed: seed of the hold-out and of ``fraction``. Defaults to 0.
        val_fraction: share of ``training`` held out when there is no ``validation`` list. Defaults to 0.2.
        label_classes: None (binary masks) or the classes (:func:`~spectraflow_monai.data.label_mode`).
        label_threshold: binary masks: None (0/1 or 0/255 masks) or the grey level from which a value is
            foreground (1: non-zero). Defaults to None.
        check_images: decode every image and mask and compare sizes. Defaults to True.
        check_masks: check the mask values. Defaults to True.
        group_pattern: grouped hold-out (images of one patient or video in one split): a regular expression
            whose first group (else the whole match) in each image id is its group, e.g. ``"^(\\d+)_"`` for
            ``12_3`` (video 12, frame 3). An entry's own ``"group"`` field is used as it is. None: entries are
            grouped only by their ``"group"`` fields (none: one image per group). Defaults to None.

    Raises:
        SettingError: bad arguments. DatasetError: the JSON or a file it names is missing or unusable, an empty
            list or split, a size mismatch, mask values the mode does not expect; the message names the file.
    """
    from monai.data import load_decathlon_datalist

    split, mode = _check_split(split), label_mode(label_classes)
    if not isinstance(data_list_file_path, (str, os.PathLike)) or not os.fspath(data_list_file_path):
        raise SettingError(f"data_list_file_path must be the path of a JSON file, got {data_list_file_path!r}.")
    path = os.fspath(data_list_file_path)
    if not os.path.isfile(path):
        raise DatasetError(f"datalist {path!r} {'is not a file' if os.path.exists(path) else 'does not exist'}.")
    base = os.path.dirname(os.path.abspath(path))
    if dataset_dir is not None:
        base = _check_dir(dataset_dir, f"base of {path!r}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"datalist {path!r} is not a readable JSON file: {e}") from e
    if not isinstance(data, dict) or "training" not in data:
        raise DatasetError(f"datalist {path!r} must hold a JSON object with a 'training' list.")
    lists: dict[str, list[dict] | None] = {}
    for key in ("training", "validation", "test"):
        items = data.get(key)
        if items is None:
            lists[key] = None
            continue
        if not isinstance(items, list) or not items:
            raise DatasetError(
                f"datalist {path!r}: the '{key}' list is empty or not a list; an empty split is unusable."
            )
        for i, item in enumerate(items):
            if not (isinstance(item, dict) and all(isinstance(item.get(f), str) for f in ("image", "label"))):
                raise DatasetError(
                    f"datalist {path!r}: {key}[{i}] must be an object with 'image' and 'label' paths, "
                    f"got {item!r:.100}."
                )
        entries = load_decathlon_datalist(path, is_segmentation=True, data_list_key=key, base_dir=base)
        for i, e in enumerate(entries):
            for field in ("image", "label"):
                if not os.path.isfile(e[field]):
                    why = "does not exist" if not os.path.exists(e[field]) else "is not a file"
                    raise DatasetError(
                        f"datalist {path!r}: {key}[{i}] {field} {e[field]!r} {why} (relative paths start at "
                        f"dataset_dir {base!r})."
                    )
                e[field] = os.path.abspath(e[field])
            if "fov" in e:  # field-of-view / ignore mask (scored pixels non-zero), relative paths as image / label
                # the JSON's own value: MONAI joins any other key to base_dir already when that path exists
                fov = items[i]["fov"]
                if not isinstance(fov, str) or not fov:
                    raise DatasetError(f"datalist {path!r}: {key}[{i}] fov must be a mask file path, got {fov!r}.")
                fov = fov if os.path.isabs(fov) else os.path.join(base, fov)
                if not os.path.isfile(fov):
                    raise DatasetError(
                        f"datalist {path!r}: {key}[{i}] fov {fov!r} does not exist (relative paths start at "
                        f"dataset_dir {base!r})."
                    )
                e["fov"] = os.path.abspath(fov)
            e.setdefault("name", _name(e["image"]))
        lists[key] = entries
    what = f"datalist {path!r}"
    _check_unique((lists["training"] or []) + (lists["validation"] or []), what)
    _assign_groups(lists["training"] or [], group_pattern, what)
    entries = _split_entries(
        lists["training"] or [], lists["validation"], lists["test"], split, what, val_fraction, seed
    )
    return _finish(entries, split, what, fraction, seed, mode, label_threshold, check_images, check_masks)


def _read_ids(path: str) -> list[str]:
    with open(path) as f:
        ids = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    if not ids:
        raise DatasetError(f"empty split: the split file {path!r} lists no image ids.")
    return [_name(i) if os.path.splitext(i)[1] else i for i in ids]


def _pair_masks(images: Mapping[str, str], mask_dir: str, mask_suffix: str | None) -> dict[str, str]:
    """id -> mask path; a mask is ``<id><suffix>.<ext>`` (``mask_suffix``, or no suffix or one of
    :data:`MASK_SUFFIXES`). A mask matching no image, or an image with two masks, raises :class:`DatasetError`."""
    suffixes = [mask_suffix] if mask_suffix is not None else ["", *MASK_SUFFIXES]
    found: dict[str, str] = {}
    orphans: list[str] = []
    for stem, mpath in list_images(mask_dir, extensions=MASK_EXTENSIONS).items():
        ids = (stem[: len(stem) - len(s)] for s in suffixes if stem.endswith(s))
        key = next((i for i in ids if i in images), None)
        if key is None:
            orphans.append(mpath)
        elif key in found:
            raise DatasetError(f"image {images[key]!r} has two masks: {found[key]!r} and {mpath!r}.")
        else:
            found[key] = mpath
    if orphans:
        hint = f"mask_suffix {mask_suffix!r}" if mask_suffix is not None else f"suffixes {list(MASK_SUFFIXES)}"
        raise DatasetError(
            f"folder: {len(orphans)} mask(s) without an image (stems compared with {hint}): "
            f"{', '.join(sorted(orphans)[:10])}."
        )
    return found


def folder_datalist(
    dataset_dir: str | os.PathLike,
    split: str = "train",
    fraction: float = 1.0,
    seed: int = 0,
    val_fraction: float = 0.2,
    label_classes: Any = None,
    mask_suffix: str | None = None,
    label_threshold: float | None = None,
    check_images: bool = True,
    check_masks: bool = True,
    group_pattern: str | None = None,
) -> list[dict]:
    """The entries of one split of an ``images/`` + ``masks/`` folder pair (see the module docstring).

    Args:
        dataset_dir: the folder holding ``images/``, ``masks/`` and optionally ``splits/``.
        split, fraction, seed, val_fraction, label_classes, label_threshold, check_images, check_masks,
            group_pattern: as :func:`decathlon_datalist`.
        mask_suffix: the suffix of every mask stem (e.g. ``"_mask"``; ``""``: same stem as the image); None: the
            same stem or one of :data:`MASK_SUFFIXES`. Defaults to None.

    Raises:
        SettingError: bad arguments. DatasetError: a missing folder, an image without its mask (or the reverse),
            an id of a split file without an image, and the problems of :func:`decathlon_datalist`.
    """
    split, mode = _check_split(split), label_mode(label_classes)
    root = _check_dir(dataset_dir, "dataset folder")
    if mask_suffix is not None and not isinstance(mask_suffix, str):
        raise SettingError(f"mask_suffix must be a string or None, got {mask_suffix!r}.")
    image_dir, mask_dir = os.path.join(root, "images"), os.path.join(root, "masks")
    for d in (image_dir, mask_dir):
        if not os.path.isdir(d):
            raise DatasetError(f"folder: {d!r} not found. Expected layout: {FOLDER_LAYOUT}")
    images = list_images(image_dir)
    masks = _pair_masks(images, mask_dir, mask_suffix)
    check_pairs(images, masks, f"folder {root!r}")
    entries = {k: {"image": images[k], "label": masks[k], "name": k} for k in sorted(images)}
    fov_dir = os.path.join(root, "fov")  # optional field-of-view / ignore masks, paired like the masks
    if os.path.isdir(fov_dir):
        fovs = _pair_masks(images, fov_dir, None)
        for k, path in fovs.items():
            entries[k]["fov"] = path
        logger.info("folder %r: field-of-view masks for %d of %d image(s) (%s)", root, len(fovs), len(images), fov_dir)
    lists: dict[str, list[dict] | None] = {}
    for part in ("train", "val", "test"):
        file = os.path.join(root, "splits", f"{part}.txt")
        if not os.path.isfile(file):
            lists[part] = None
            continue
        ids = _read_ids(file)
        missing = [i for i in ids if i not in entries]
        if missing:
            raise DatasetError(f"folder: id(s) of {file!r} have no image in {image_dir!r}: {', '.join(missing[:10])}.")
        lists[part] = [dict(entries[i]) for i in ids]
    if lists["train"] is None:
        lists["train"] = [dict(e) for e in entries.values()]
    what = f"folder {root!r}"
    _assign_groups(lists["train"], group_pattern, what)
    chosen = _split_entries(lists["train"], lists["val"], lists["test"], split, what, val_fraction, seed)
    if split == "all":
        chosen = [dict(e) for e in entries.values()]
    return _finish(chosen, split, what, fraction, seed, mode, label_threshold, check_images, check_masks)


def inference_files(
    input_dir: str | os.PathLike | None,
    input_pattern: str = "*.*",
    data_list_file_path: str | os.PathLike | None = None,
    dataset_dir: str | os.PathLike | None = None,
    require_any: bool = False,
) -> list[str]:
    """The images ``configs/inference.yaml`` of the 2D bundle segments.

    With ``data_list_file_path``: the ``test`` list of that Decathlon-style JSON (entries ``"path"`` or
    ``{"image": path, ...}``; labels are not read), relative paths starting at ``dataset_dir`` (None: the JSON's
    folder). Else the files of ``input_dir`` matching ``input_pattern`` with an image extension
    (:data:`~spectraflow_monai.data.validation.IMAGE_EXTENSIONS`), sorted. The files are decoded afterwards by
    :class:`~spectraflow_monai.data.validation.InputCheck`, which skips (and lists) the unreadable ones.

    With ``require_any``, a folder without a matching image stops the run (naming the folder and the pattern).

    Raises:
        DatasetError: the JSON is missing, not valid JSON, has no ``test`` list or a ``test`` entry without an image
            path; ``input_dir`` is not a folder.
        FileNotFoundError: (``require_any``) ``input_dir`` holds no matching image.
    """
    if data_list_file_path:
        path = os.fspath(data_list_file_path)
        if not os.path.isfile(path):
            raise DatasetError(f"data_list_file_path {path!r} is not a file.")
        try:
            with open(path) as f:
                content = json.load(f)
        except ValueError as e:
            raise DatasetError(f"datalist {path!r} is not valid JSON: {e}") from e
        tests = content.get("test") if isinstance(content, dict) else None
        if not tests:
            raise DatasetError(
                f"datalist {path!r} has no 'test' list to segment; add one, or give --inference_settings#input_dir "
                "<folder of images> without data_list_file_path."
            )
        files = [e if isinstance(e, str) else e.get("image") if isinstance(e, Mapping) else None for e in tests]
        if any(not isinstance(f, str) for f in files):
            bad = [e for e, f in zip(tests, files) if not isinstance(f, str)][:3]
            raise DatasetError(f"datalist {path!r}: 'test' entries must be a path or {{'image': path}}, got {bad!r}.")
        base = os.fspath(dataset_dir) if dataset_dir else os.path.dirname(os.path.abspath(path))
        logger.info("inference on the 'test' list of %s (%d image(s))", path, len(files))
        return [f if os.path.isabs(f) else os.path.normpath(os.path.join(base, f)) for f in files]
    if input_dir is None or not os.path.isdir(os.fspath(input_dir)):
        raise DatasetError(f"input_dir {input_dir!r} is not a folder of images.")
    found = sorted(glob.glob(os.path.join(os.fspath(input_dir), input_pattern)))
    images = [f for f in found if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
    if require_any and not images:
        raise FileNotFoundError(
            f"no image matches {input_pattern!r} in {os.fspath(input_dir)!r} (image extensions: "
            f"{', '.join(sorted(IMAGE_EXTENSIONS))}); give --inference_settings#input_dir and #input_pattern."
        )
    return images
