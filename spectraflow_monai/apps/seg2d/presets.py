"""Datalists for the 2D binary benchmarks of SpectraFlow: Kvasir-SEG, ISIC-2016, GlaS, and a synthetic stand-in.

SpectraFlow (Chen et al., Sec. "Datasets and Metrics") follows the official splits: Kvasir-SEG 880/120
(Jha et al., MMM 2020), GlaS 85/80 (Sirinukunwattana et al., MedIA 2017) and ISIC-2016 900/379 (Gutman et al.,
2016); the foreground is the polyp, gland or skin lesion, everything else is background. Images are resized to
224x224 by the transforms, not here.

Each builder returns MONAI's list-of-dicts form::

    {"image": "/path/img.jpg", "label": "/path/mask.jpg", "name": "<id>", "label_threshold": 128}

``label_threshold`` is the raw grey level from which a stored mask pixel is foreground (``value >= threshold``):
128 for 0/255 masks (Kvasir-SEG's JPEG masks carry compression noise, so ``> 0`` would be wrong), 1 for GlaS
instance label maps (foreground = label > 0). :class:`spectraflow_monai.transforms.BinarizeLabeld` reads it per
sample. Every builder validates the files first (:mod:`spectraflow_monai.data.validation`) and raises
:class:`~spectraflow_monai.data.validation.DatasetError` naming the file(s) and the problem; a wrong argument (preset,
split, fraction) raises :class:`~spectraflow_monai.utils.errors.SettingError`. Both are ``ValueError`` subclasses.

Split names: ``"train"``, ``"val"``/``"test"`` (the paper calls the official test sets of ISIC-2016 and GlaS its
validation sets, so ``"val"`` and ``"test"`` are aliases for every preset) and ``"all"``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from spectraflow_monai.data.subsets import low_data_subset
from spectraflow_monai.data.validation import (
    DatasetError,
    check_folder,
    check_pairs,
    list_images,
    validate_datalist,
)
from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "DATASET_PRESETS",
    "KVASIR_SPLIT_DIR",
    "canonical_dataset_name",
    "glas_datalist",
    "isic2016_datalist",
    "kvasir_seg_datalist",
    "synthetic_datalist",
]

logger = logging.getLogger(__name__)

#: the 880/120 Kvasir-SEG split lists shipped with the package (used when the data set folder has no ``splits``).
KVASIR_SPLIT_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "resources", "kvasir_seg_splits"
)
KVASIR_LAYOUT = (
    "<root>/Kvasir-SEG/images/<id>.jpg, <root>/Kvasir-SEG/masks/<id>.jpg (or <root>/images, <root>/masks), "
    "split lists <root>/splits/{train,val}.txt with one id per line (default: the 880/120 lists shipped with the "
    "package)"
)
ISIC_LAYOUT = (
    "<root>/ISBI2016_ISIC_Part1_{Training,Test}_Data/ISIC_XXXXXXX.jpg and "
    "<root>/ISBI2016_ISIC_Part1_{Training,Test}_GroundTruth/ISIC_XXXXXXX_Segmentation.png"
)
GLAS_LAYOUT = (
    "<root> (or one sub-folder, e.g. 'Warwick QU Dataset (Released 2016_07_08)') holding train_N.bmp + "
    "train_N_anno.bmp, testA_N.bmp + testA_N_anno.bmp, testB_N.bmp + testB_N_anno.bmp"
)
SYNTHETIC_LAYOUT = "<root>/images/<id>.png, <root>/masks/<id>.png, <root>/splits/{train,val}.txt"

#: official split sizes, for information messages
OFFICIAL_SIZES = {
    "kvasir": {"train": 880, "val": 120},
    "isic2016": {"train": 900, "test": 379},
    "glas": {"train": 85, "test": 80},
}
_SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "val",
    "all": "all",
}


def _split(split: str, preset: str) -> str:
    s = _SPLIT_ALIASES.get(str(split).lower())
    if s is None:
        raise SettingError(f"split must be 'train', 'val' (alias 'test') or 'all' for {preset}, got {split!r}.")
    return s


def _natural_key(s: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _entries(ids: Sequence[str], images: Mapping[str, str], masks: Mapping[str, str], threshold: int) -> list[dict]:
    return [{"image": images[i], "label": masks[i], "name": i, "label_threshold": threshold} for i in ids]


def _finish(
    datalist: list[dict],
    what: str,
    fraction: float,
    seed: int,
    check_images: bool,
    check_masks: bool,
) -> list[dict]:
    if len(datalist) == 0:
        raise DatasetError(f"empty split: no images in {what}.")
    subset = low_data_subset(datalist, fraction, seed)
    if check_images or check_masks:
        validate_datalist(subset, what, check_images=check_images, check_masks=check_masks)
    return subset


def _read_split_file(path: str, preset: str, layout: str) -> list[str]:
    if not os.path.isfile(path):
        raise DatasetError(f"{preset}: split file not found: {path!r}. Expected layout: {layout}")
    with open(path) as f:
        ids = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    ids = [os.path.splitext(i)[0] if os.path.splitext(i)[1].lower() in (".jpg", ".png", ".jpeg") else i for i in ids]
    if not ids:
        raise DatasetError(f"{preset}: empty split: the split file {path!r} lists no image ids.")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise DatasetError(f"{preset}: split file {path!r} repeats id(s): {', '.join(dup[:10])}.")
    return ids


def _folder_pair_datalist(
    base: str,
    split: str,
    split_dir: str | None,
    preset: str,
    layout: str,
    fraction: float,
    seed: int,
    check_images: bool,
    check_masks: bool,
) -> list[dict]:
    """images/ + masks/ folders with split lists (Kvasir-SEG and the synthetic set)."""
    image_dir, mask_dir = os.path.join(base, "images"), os.path.join(base, "masks")
    check_folder(image_dir, preset, layout)
    check_folder(mask_dir, preset, layout)
    images, masks = list_images(image_dir), list_images(mask_dir)
    check_pairs(images, masks, preset)
    if split == "all":
        ids = sorted(images)
        what = f"{preset} images folder {image_dir!r}"
    else:
        split_file = os.path.join(split_dir, f"{split}.txt")  # type: ignore[arg-type]
        ids = _read_split_file(split_file, preset, layout)
        missing = [i for i in ids if i not in images]
        if missing:
            raise DatasetError(
                f"{preset}: {len(missing)} id(s) of {split_file!r} have no image in {image_dir!r}: "
                f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}."
            )
        what = f"{preset} split file {split_file!r}"
    return _finish(_entries(ids, images, masks, 128), what, fraction, seed, check_images, check_masks)


def kvasir_seg_datalist(
    root: str | os.PathLike,
    split: str = "train",
    split_dir: str | os.PathLike | None = None,
    fraction: float = 1.0,
    seed: int = 0,
    check_images: bool = True,
    check_masks: bool = True,
) -> list[dict]:
    """Kvasir-SEG datalist (Jha et al., "Kvasir-SEG: A Segmented Polyp Dataset", MMM 2020).

    Layout: ``<root>/Kvasir-SEG/images/<id>.jpg`` and ``<root>/Kvasir-SEG/masks/<id>.jpg`` (``<root>`` may also be the
    ``Kvasir-SEG`` folder itself), split lists ``<root>/splits/{train,val}.txt`` (one id per line). Without a
    ``<root>/splits`` folder the lists shipped with the package (:data:`KVASIR_SPLIT_DIR`) are used: the widely used
    880/120 split SpectraFlow evaluates on, so the public release works as downloaded. Masks are JPEG, binarised at
    128 (``label_threshold``).

    Args:
        root: dataset root.
        split: ``"train"``, ``"val"`` (alias ``"test"``) or ``"all"`` (every image, no split file needed).
            Defaults to ``"train"``.
        split_dir: folder of the split lists. Defaults to ``<root>/splits`` when it exists, else
            :data:`KVASIR_SPLIT_DIR`.
        fraction: kept fraction (:func:`low_data_subset`). Defaults to 1.0.
        seed: seed of the subset. Defaults to 0.
        check_images: verify that every image/mask opens and sizes match. Defaults to ``True``.
        check_masks: decode every mask and check it is binary. Defaults to ``True``.
    """
    root = os.fspath(root)
    split = _split(split, "kvasir")
    check_folder(root, "kvasir", KVASIR_LAYOUT)
    base = os.path.join(root, "Kvasir-SEG")
    if not os.path.isdir(base) and os.path.isdir(os.path.join(root, "images")):
        base = root
    if split_dir is None:
        split_dir = os.path.join(root, "splits")
        if split != "all" and not os.path.isdir(split_dir):
            logger.info(f"kvasir: no split folder {split_dir!r}, using the 880/120 split lists of {KVASIR_SPLIT_DIR!r}")
            split_dir = KVASIR_SPLIT_DIR
    split_dir = os.fspath(split_dir)
    out = _folder_pair_datalist(
        base, split, split_dir, "kvasir", KVASIR_LAYOUT, fraction, seed, check_images, check_masks
    )
    _log_size("kvasir", split, out, fraction)
    return out


def synthetic_datalist(
    root: str | os.PathLike,
    split: str = "train",
    fraction: float = 1.0,
    seed: int = 0,
    check_images: bool = True,
    check_masks: bool = True,
    generate: bool = False,
    **generate_kwargs: Any,
) -> list[dict]:
    """Datalist of the synthetic set written by :func:`spectraflow_monai.apps.seg2d.synthetic.generate_synthetic_dataset`.

    Layout: ``<root>/images/<id>.png``, ``<root>/masks/<id>.png`` (0/255), ``<root>/splits/{train,val}.txt``.

    Args:
        root: folder of the synthetic set.
        split: ``"train"``, ``"val"`` or ``"all"``. Defaults to ``"train"``.
        fraction: kept fraction (:func:`low_data_subset`). Defaults to 1.0.
        seed: seed of the subset (not of the generator). Defaults to 0.
        check_images: verify that every image/mask opens. Defaults to ``True``.
        check_masks: decode every mask and check it is binary. Defaults to ``True``.
        generate: generate the set first when it is not there (idempotent). Defaults to ``False``.
        generate_kwargs: arguments of ``generate_synthetic_dataset`` (``num_train``, ``num_val``, ``size``, ...).
    """
    root = os.fspath(root)
    split = _split(split, "synthetic")
    if generate:
        from spectraflow_monai.apps.seg2d.synthetic import generate_synthetic_dataset

        generate_synthetic_dataset(root, **generate_kwargs)
    elif generate_kwargs:
        raise SettingError(f"generator arguments {sorted(generate_kwargs)} need generate=True.")
    check_folder(
        root,
        "synthetic",
        SYNTHETIC_LAYOUT + " (create it with generate=True or "
        "spectraflow synthetic-2d --output DIR)",
    )
    return _folder_pair_datalist(
        root,
        split,
        os.path.join(root, "splits"),
        "synthetic",
        SYNTHETIC_LAYOUT,
        fraction,
        seed,
        check_images,
        check_masks,
    )


def isic2016_datalist(
    root: str | os.PathLike,
    split: str = "train",
    fraction: float = 1.0,
    seed: int = 0,
    check_images: bool = True,
    check_masks: bool = True,
) -> list[dict]:
    """ISIC-2016 lesion segmentation (Part 1) datalist (Gutman et al., ISBI 2016 challenge), official 900/379 split.

    Layout (the official folders): ``ISBI2016_ISIC_Part1_Training_Data/ISIC_XXXXXXX.jpg`` with
    ``ISBI2016_ISIC_Part1_Training_GroundTruth/ISIC_XXXXXXX_Segmentation.png``, and the same with ``Test``.
    Masks are 0/255 PNGs (``label_threshold`` 128).

    Args:
        root: folder holding the four official folders.
        split: ``"train"``, ``"test"`` (alias ``"val"``) or ``"all"``. Defaults to ``"train"``.
        fraction: kept fraction (:func:`low_data_subset`). Defaults to 1.0.
        seed: seed of the subset. Defaults to 0.
        check_images: verify that every image/mask opens and sizes match. Defaults to ``True``.
        check_masks: decode every mask and check it is binary. Defaults to ``True``.
    """
    root = os.fspath(root)
    split = _split(split, "isic2016")
    check_folder(root, "isic2016", ISIC_LAYOUT)
    parts = {"train": ["Training"], "val": ["Test"], "all": ["Training", "Test"]}[split]
    out: list[dict] = []
    whats = []
    for part in parts:
        image_dir = os.path.join(root, f"ISBI2016_ISIC_Part1_{part}_Data")
        mask_dir = os.path.join(root, f"ISBI2016_ISIC_Part1_{part}_GroundTruth")
        check_folder(image_dir, "isic2016", ISIC_LAYOUT)
        check_folder(mask_dir, "isic2016", ISIC_LAYOUT)
        images = list_images(image_dir)
        masks = list_images(mask_dir, suffix="_Segmentation")
        stray = sorted(set(list_images(mask_dir)) - {f"{k}_Segmentation" for k in masks})
        if stray:
            raise DatasetError(
                f"isic2016: file(s) in {mask_dir!r} not named <id>_Segmentation.png: {', '.join(stray[:10])}."
            )
        check_pairs(images, masks, "isic2016")
        out += _entries(sorted(images), images, masks, 128)
        whats.append(repr(image_dir))
    out = _finish(out, "isic2016 folder " + " + ".join(whats), fraction, seed, check_images, check_masks)
    _log_size("isic2016", "test" if split == "val" else split, out, fraction)
    return out


def _glas_base(root: str) -> str:
    def has_glas(d: str) -> bool:
        return any(re.fullmatch(r"(train|testA|testB)_\d+_anno\.bmp", f) for f in os.listdir(d))

    if has_glas(root):
        return root
    subs = [os.path.join(root, d) for d in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, d))]
    found = [d for d in subs if has_glas(d)]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise DatasetError(f"glas: several folders under {root!r} hold GlaS files: {', '.join(found)}; pass one.")
    raise DatasetError(f"glas: no GlaS files (train_N_anno.bmp, ...) found in {root!r}. Expected layout: {GLAS_LAYOUT}")


def glas_datalist(
    root: str | os.PathLike,
    split: str = "train",
    fraction: float = 1.0,
    seed: int = 0,
    check_images: bool = True,
    check_masks: bool = True,
) -> list[dict]:
    """GlaS datalist (Sirinukunwattana et al., "Gland segmentation in colon histology images: The GlaS challenge
    contest", MedIA 2017), Warwick QU release, official 85/80 split (test = testA 60 + testB 20).

    Layout: ``train_N.bmp`` + ``train_N_anno.bmp``, ``testA_N.bmp`` + ``testA_N_anno.bmp``, ``testB_N.bmp`` +
    ``testB_N_anno.bmp`` in ``<root>`` or in one sub-folder of it. Annotations are instance label maps; foreground is
    ``anno > 0`` (``label_threshold`` 1).

    Args:
        root: the Warwick QU folder or its parent.
        split: ``"train"``, ``"test"`` (alias ``"val"``) or ``"all"``. Defaults to ``"train"``.
        fraction: kept fraction (:func:`low_data_subset`). Defaults to 1.0.
        seed: seed of the subset. Defaults to 0.
        check_images: verify that every image/mask opens and sizes match. Defaults to ``True``.
        check_masks: decode every annotation and check it is a label map. Defaults to ``True``.
    """
    root = os.fspath(root)
    split = _split(split, "glas")
    check_folder(root, "glas", GLAS_LAYOUT)
    base = _glas_base(root)
    exts = (".bmp", ".png", ".tif", ".tiff")
    images = {k: v for k, v in list_images(base, extensions=exts).items() if not k.endswith("_anno")}
    images = {k: v for k, v in images.items() if re.fullmatch(r"(train|testA|testB)_\d+", k)}
    masks = {
        k: v
        for k, v in list_images(base, suffix="_anno", extensions=exts).items()
        if re.fullmatch(r"(train|testA|testB)_\d+", k)
    }
    check_pairs(images, masks, "glas")
    prefixes = {"train": ("train_",), "val": ("testA_", "testB_"), "all": ("train_", "testA_", "testB_")}[split]
    ids = sorted((k for k in images if k.startswith(prefixes)), key=_natural_key)
    what = f"glas {'test' if split == 'val' else split} split in {base!r}"
    out = _finish(_entries(ids, images, masks, 1), what, fraction, seed, check_images, check_masks)
    _log_size("glas", "test" if split == "val" else split, out, fraction)
    return out


def _log_size(preset: str, split: str, datalist: list[dict], fraction: float) -> None:
    expected = OFFICIAL_SIZES.get(preset, {}).get(split)
    if expected is not None and fraction >= 1.0 and len(datalist) != expected:
        logger.info("%s %s split has %d images (official: %d).", preset, split, len(datalist), expected)


DATASET_PRESETS = {
    "kvasir": kvasir_seg_datalist,
    "isic2016": isic2016_datalist,
    "glas": glas_datalist,
    "synthetic": synthetic_datalist,
}
_PRESET_ALIASES = {"kvasir-seg": "kvasir", "kvasir_seg": "kvasir", "isic": "isic2016", "isic-2016": "isic2016"}


def canonical_dataset_name(dataset: str) -> str:
    """The preset key of ``dataset`` (``"Kvasir-SEG"`` -> ``"kvasir"``); ValueError naming unknown presets."""
    key = _PRESET_ALIASES.get(str(dataset).lower(), str(dataset).lower())
    if key not in DATASET_PRESETS:
        raise SettingError(f"dataset must be one of {sorted(DATASET_PRESETS)}, got {dataset!r}.")
    return key
