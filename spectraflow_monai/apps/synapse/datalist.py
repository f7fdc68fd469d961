"""Your own 3D data for the Synapse bundle: a Decathlon-style datalist JSON of NIfTI volumes with any label map.

SpectraFlow's 3D experiment (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for
Medical Image Segmentation") trains a 2D network on axial CT slices and scores whole volumes (TransUNet protocol).
The ``spectraflow_synapse_segmentation`` bundle reads the BTCV / TransUNet layouts as presets; this module lets it
read any set of NIfTI volumes listed the way the Medical Segmentation Decathlon (and MONAI's
:func:`monai.data.load_decathlon_datalist`, and the MONAI model zoo's ``--data_list_file_path``) lists them::

    {"training":   [{"image": "imagesTr/ct_01.nii.gz", "label": "labelsTr/ct_01.nii.gz"}, ...],
     "validation": [{"image": ..., "label": ...}, ...],        optional: else a seeded fraction of training
     "test":       [{"image": ..., "label": ...}, ...]}        optional; entries may be bare image paths

Relative paths are resolved against ``dataset_dir`` (default: the JSON's folder), as MONAI does. Case ids are the
file names without ``.nii.gz`` / ``.nii``. :func:`decathlon_synapse_datalist` returns the same datalist contract as
the presets of :func:`spectraflow_monai.apps.synapse.synapse_split` (which calls it when ``data_list_file_path``
is given): volumes ``{"image", "label", "case"}``, or cached axial slices ``{"image", "label", "case", "slice"}``.
Splits: ``"train"`` (``training`` minus the validation hold-out), ``"val"`` (the ``validation`` list, else the
hold-out: ``round(val_fraction * N)`` training volumes, at least 1, drawn with ``numpy.random.RandomState(seed)``
from the case ids sorted by name) and ``"test"`` (the ``test`` list when every entry has a label, else the
validation split; which one is logged).
"""

from __future__ import annotations

import glob as _glob
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectraflow_monai.apps.synapse.cache import slice_with_settings
from spectraflow_monai.apps.synapse.constants import format_case_id
from spectraflow_monai.apps.synapse.readers import check_volume_pair
from spectraflow_monai.apps.synapse.settings import check_datalist_base, resolve_label_map
from spectraflow_monai.data.subsets import holdout, low_data_subset
from spectraflow_monai.data.validation import DatasetError, InputCheck
from spectraflow_monai.data.volumes import volume_name
from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "DECATHLON_LISTS",
    "nifti_case_id",
    "read_decathlon_datalist",
    "holdout_split",
    "case_fraction",
    "decathlon_synapse_datalist",
    "synapse_inference_datalist",
    "volume_input_check",
]

logger = logging.getLogger(__name__)

#: the lists of a Decathlon datalist JSON read by :func:`read_decathlon_datalist`.
DECATHLON_LISTS: tuple[str, ...] = ("training", "validation", "test")


def nifti_case_id(path: str | os.PathLike) -> str:
    """The case id of a volume: its file name without ``.nii.gz`` / ``.nii`` / ``.nrrd`` / ``.seg.nrrd``
    (``/d/ct_01.nii.gz`` -> ``ct_01``), or the whole name of a DICOM series folder (series UIDs hold dots)."""
    return volume_name(path)


def read_decathlon_datalist(
    data_list_file_path: str | os.PathLike, dataset_dir: str | os.PathLike | None = None
) -> dict[str, list[dict[str, Any]] | None]:
    """Read and check a Decathlon-style datalist JSON of volumes.

    Args:
        data_list_file_path: the JSON file (``training`` / optional ``validation`` / optional ``test`` lists).
        dataset_dir: the folder relative paths start from; None: the JSON's folder (as
            :func:`monai.data.load_decathlon_datalist`). Defaults to None.

    Returns:
        ``{"training": [...], "validation": [...] or None, "test": [...] or None}``; entries
        ``{"image": abs path, "label": abs path (test: when given), "case": id}`` plus any other keys of the JSON
        entry (resolved as MONAI does).

    Raises:
        DatasetError: (a ``ValueError``) the JSON or ``dataset_dir`` is missing or not what it should be, the JSON
            is unreadable, a list is missing (``training``), empty or malformed, an entry names a missing file, or
            two volumes of ``training`` + ``validation`` (or of ``test``) have the same case id; the message names
            the JSON, the list, the entry and the file.
    """
    from monai.data import load_decathlon_datalist

    path, base = check_datalist_base(data_list_file_path, dataset_dir)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"datalist {str(path)!r} is not a readable JSON file: {e}") from e
    if not isinstance(data, dict):
        raise DatasetError(f"datalist {str(path)!r} must hold a JSON object with a 'training' list, got {data!r:.80}.")
    if "training" not in data:
        raise DatasetError(f"datalist {str(path)!r} has no 'training' list (keys: {sorted(data)}).")
    out: dict[str, list[dict[str, Any]] | None] = {}
    for key in DECATHLON_LISTS:
        if key not in data:
            out[key] = None
            continue
        items = data[key]
        if not isinstance(items, list) or not items:
            hint = " to hold out a fraction of training" if key == "validation" else ""
            raise DatasetError(
                f"datalist {str(path)!r}: the '{key}' list is empty or not a list ({items!r:.60}); an empty split "
                f"cannot be used (remove the key{hint})."
            )
        for i, item in enumerate(items):
            bare = key == "test" and isinstance(item, str)
            if not bare and not (isinstance(item, dict) and isinstance(item.get("image"), str)):
                raise DatasetError(
                    f"datalist {str(path)!r}: {key}[{i}] must be an object with an 'image' path, got {item!r:.80}."
                )
            if key != "test" and not isinstance(item.get("label"), str):
                raise DatasetError(f"datalist {str(path)!r}: {key}[{i}] has no 'label' path ({item!r:.80}).")
        if key == "test" and len({isinstance(i, str) for i in items}) > 1:
            raise DatasetError(
                f"datalist {str(path)!r}: the 'test' list mixes bare image paths and objects; use one form."
            )
        entries = load_decathlon_datalist(path, is_segmentation=True, data_list_key=key, base_dir=base)
        for i, entry in enumerate(entries):
            for field in ("image", "label"):  # an image may be a folder holding one DICOM series
                ok = field in entry and (os.path.isfile(entry[field]) or field == "image" and os.path.isdir(entry[field]))
                if field in entry and not ok:
                    what = "does not exist" if not os.path.exists(entry[field]) else "is not a file"
                    raise DatasetError(
                        f"datalist {str(path)!r}: {key}[{i}] {field} {entry[field]!r} {what} (relative paths start "
                        f"at dataset_dir {str(base)!r})."
                    )
            entry["image"] = os.path.abspath(entry["image"])
            if "label" in entry:
                entry["label"] = os.path.abspath(entry["label"])
            entry["case"] = nifti_case_id(entry["image"])
        out[key] = entries
    _check_unique(path, (out["training"] or []) + (out["validation"] or []), "training + validation")
    _check_unique(path, out["test"] or [], "test")
    return out


def _check_unique(path: Path, entries: list[dict[str, Any]], what: str) -> None:

    def norm(case: str) -> str:  # the slice cache names volumes by the normalised id ("img0005" -> "0005")
        try:
            return format_case_id(case)
        except ValueError:
            return case

    seen: dict[str, list[str]] = {}
    for e in entries:
        seen.setdefault(norm(e["case"]), []).append(e["image"])
    dup = {k: v for k, v in seen.items() if len(v) > 1}
    if dup:
        shown = "; ".join(f"{k}: {v}" for k, v in list(dup.items())[:5])
        raise DatasetError(
            f"datalist {str(path)!r}: case ids (file names without .nii.gz) must be unique in {what}; duplicated: "
            f"{shown}. Rename the files."
        )


def holdout_split(
    entries: Sequence[Mapping[str, Any]], fraction: float, seed: int = 0, key: str = "case"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split ``entries`` into (kept, held out): ``round(fraction * N)`` held out (at least 1, at most N - 1).

    The one hold-out of every data source, :func:`spectraflow_monai.data.subsets.holdout`, keyed on the case id:
    the entries are sorted by ``key`` and permuted with ``numpy.random.RandomState(seed)``, so the split depends on
    the ids and the seed only, not on the list order; both parts keep the input order.

    Raises:
        SettingError: ``fraction`` is not in (0, 1).
        DatasetError: fewer than 2 entries (nothing could be left for training).
    """

    return holdout(entries, fraction, seed, key=key)


def case_fraction(
    entries: Sequence[Mapping[str, Any]], fraction: float, seed: int = 0, what: str = "training"
) -> list[dict[str, Any]]:
    """Keep a seeded, nested fraction of the *cases* of ``entries`` (volumes, or the slices of whole cases).

    Uses :func:`spectraflow_monai.data.low_data_subset` on the sorted case ids (``round(fraction * cases)``, at least
    one; for one seed 10 % lies within 20 % within 50 %); logs the kept cases when ``fraction < 1``.
    """

    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise SettingError(f"data_fraction must be a number in (0, 1], got {fraction!r}.")
    if fraction >= 1.0:
        return [dict(e) for e in entries]
    cases = sorted({str(e["case"]) for e in entries})
    kept = {d["name"] for d in low_data_subset([{"name": c} for c in cases], fraction, seed)}
    logger.info(
        "data_fraction %s (seed %d): %d of %d %s case(s) kept: %s", fraction, seed, len(kept), len(cases), what,
        sorted(kept),
    )  # fmt: skip
    return [dict(e) for e in entries if str(e["case"]) in kept]


def _select(entries: list[dict[str, Any]], cases: Any, path: Path, what: str) -> list[dict[str, Any]]:
    """The entries whose case id is in ``cases`` (ids as in the file names; ints match their digits)."""

    def norm(c: Any) -> str:
        try:
            return format_case_id(c)
        except ValueError:
            return str(c)

    wanted = [cases] if isinstance(cases, (str, int)) else list(cases)
    by_id = {norm(e["case"]): e for e in entries}
    unknown = [c for c in wanted if norm(c) not in by_id]
    if unknown:
        raise DatasetError(
            f"datalist {str(path)!r}: case(s) {unknown} are not in its {what} list (case ids: {sorted(by_id)[:20]})."
        )
    keep = {norm(c) for c in wanted}
    return [e for e in entries if norm(e["case"]) in keep]


def _split(
    lists: Mapping[str, Any],
    split: str,
    path: Path,
    cases: Any,
    exclude_cases: Any,
    val_fraction: float,
    seed: int,
) -> list[dict[str, Any]]:
    training = lists["training"]
    if split == "test":
        test = lists["test"]
        if test is not None and all("label" in e for e in test):
            entries = test
            logger.info("evaluating on the 'test' list of %s (%d volume(s))", path, len(test))
        else:
            why = "has no 'test' list" if test is None else "has a 'test' list without labels"
            logger.info("datalist %s %s: evaluating on the validation split instead", path, why)
            entries = _split(lists, "val", path, None, None, val_fraction, seed)
        return [dict(e) for e in (entries if cases is None else _select(entries, cases, path, "test"))]
    if split == "val" and cases is not None:
        return [dict(e) for e in _select(training, cases, path, "training")]
    if exclude_cases:
        held_ids = {e["case"] for e in _select(training, exclude_cases, path, "training")}
        kept = [dict(e) for e in training if e["case"] not in held_ids]
        held: list[dict[str, Any]] = []
    elif lists["validation"] is not None:
        kept, held = [dict(e) for e in training], [dict(e) for e in lists["validation"]]
    else:
        kept, held = holdout_split(training, val_fraction, seed)
        if split == "val":
            logger.info(
                "datalist %s has no 'validation' list: %d of %d training volume(s) held out for validation "
                "(val_fraction %s, seed %d): %s", path, len(held), len(training), val_fraction, seed,
                [e["case"] for e in held],
            )  # fmt: skip
    if split == "val":
        return held
    if cases is not None:
        kept = _select(kept, cases, path, "training (after the validation hold-out)")
    if not kept:
        raise DatasetError(f"datalist {str(path)!r}: no training volume is left after the validation hold-out.")
    return kept


def decathlon_synapse_datalist(
    source: Any,
    split: str = "train",
    cases: Sequence[int | str] | None = None,
    exclude_cases: Sequence[int | str] | None = None,
    slices: bool = False,
) -> list[dict[str, Any]]:
    """The datalist of one split of a Decathlon JSON of NIfTI volumes (the ``datalist`` source of the Synapse bundle).

    Args:
        source: the run's :class:`~spectraflow_monai.apps.synapse.SynapseDataSource`: its
            ``data_list_file_path`` (see the module docstring) with ``dataset_dir`` as the base of the relative paths
            (None: the JSON's folder); for ``slices``, ``cache_dir``, ``image_size``, ``hu_window``, ``nonfinite``
            and its value, ``label_map`` (None: the identity over ``0..num_classes-1``) and ``unmapped_labels``;
            ``val_fraction``, ``data_fraction`` and ``data_seed`` for the splits.
        split: ``"train"``, ``"val"`` or ``"test"`` (see the module docstring). Defaults to ``"train"``.
        cases: case ids (file names without ``.nii.gz``) to keep from the split. For ``"val"``: the training
            volumes to validate on (held out of ``"train"`` by passing them as ``exclude_cases`` there), instead of
            the ``validation`` list / the seeded hold-out. Defaults to None (all).
        exclude_cases: training case ids held out of ``"train"`` (instead of the ``validation`` list / the seeded
            hold-out). Defaults to None.
        slices: True: one entry per cached axial slice (:func:`spectraflow_monai.apps.synapse.extract_slices`, windowed,
            labels mapped with ``label_map``, resized to ``image_size``); False: volumes, header-checked (3D, label
            shape and affine equal to the image's). Defaults to False.

    Raises:
        SettingError: bad arguments (``split``, ``label_map``, ``val_fraction``, ...).
        DatasetError: any problem of the JSON or its files (see :func:`read_decathlon_datalist`), an empty split, an
            image / label shape or affine mismatch, a 2D or unreadable volume, non-finite voxels, label values the
            map does not list (``slices=True``); the message names the file and the problem.
    """
    s = source
    if split not in ("train", "val", "test"):
        raise SettingError(f"split must be 'train', 'val' or 'test', got {split!r}.")
    mapping = resolve_label_map(s.label_map, True, s.num_classes)
    lists = read_decathlon_datalist(s.data_list_file_path, s.dataset_dir or None)
    path = Path(s.data_list_file_path)
    entries = _split(lists, split, path, cases, exclude_cases, s.val_fraction, s.data_seed)
    if split == "train":
        entries = case_fraction(entries, s.data_fraction, s.data_seed)
    if not entries:
        raise DatasetError(f"datalist {str(path)!r}: the {split} split is empty.")
    for e in entries:  # headers of every volume before any file is written
        check_volume_pair(e["image"], e.get("label"), case=e["case"])
    if not slices:
        return entries
    return slice_with_settings(entries, s, mapping)


def synapse_inference_datalist(
    input_dir: str | os.PathLike | None,
    input_pattern: str = "*.nii*",
    data_list_file_path: str | os.PathLike | None = None,
    dataset_dir: str | os.PathLike | None = None,
    require_any: bool = False,
    check_volumes: bool = False,
) -> list[dict[str, Any]]:
    """The volumes ``configs/inference.yaml`` segments: the ``test`` list of a datalist JSON (when
    ``data_list_file_path`` is given; labels, if any, are not read), else the files of ``input_dir`` matching
    ``input_pattern`` and its sub-folders that hold DICOM files (one DICOM series each), sorted; ``input_dir``
    itself when it holds DICOM files (one series). Returns ``[{"image": path}, ...]``.

    Args:
        input_dir: the folder of input volumes (not read when ``data_list_file_path`` is given).
        input_pattern: glob of the input files in ``input_dir``. Defaults to ``"*.nii*"``.
        data_list_file_path: a Decathlon datalist JSON whose ``test`` list is segmented, or None. Defaults to None.
        dataset_dir: base of the JSON's relative paths; None: the JSON's folder. Defaults to None.
        require_any: an empty list (a JSON with an empty ``test`` list) stops the run, naming where nothing was
            found. Defaults to False.
        check_volumes: every volume is checked from its header before any is segmented
            (:func:`~spectraflow_monai.apps.synapse.check_volume_pair`: a readable 3D NIfTI / NRRD volume or one
            complete DICOM series), so that a bad file stops the run naming it. Defaults to False.

    Raises:
        DatasetError: the JSON has no ``test`` list (or another problem, see :func:`read_decathlon_datalist`),
            ``input_dir`` is not a folder, or nothing matches ``input_pattern``; (``check_volumes``) a file is
            missing, unreadable or not a 3D volume, naming it.
        FileNotFoundError: (``require_any``) the ``test`` list is empty.
    """
    if data_list_file_path:
        lists = read_decathlon_datalist(data_list_file_path, dataset_dir)
        if lists["test"] is None:
            raise DatasetError(
                f"datalist {os.fspath(data_list_file_path)!r} has no 'test' list to segment; add one, or pass "
                "--inference_settings#input_dir <folder of volumes> without data_list_file_path."
            )
        logger.info("inference on the 'test' list of %s (%d volume(s))", data_list_file_path, len(lists["test"]))
        items = [{"image": e["image"]} for e in lists["test"]]
        where = f"the 'test' list of {os.fspath(data_list_file_path)!r}"
    else:
        if input_dir is None or not os.path.isdir(os.fspath(input_dir)):
            raise DatasetError(f"input_dir {input_dir!r} is not a folder of volumes.")
        folder = os.fspath(input_dir)
        files = [f for f in _glob.glob(os.path.join(folder, input_pattern)) if os.path.isfile(f)]
        series = [] if files else [folder] if _holds_dicom(folder) else []
        if not series:
            subs = (os.path.join(folder, n) for n in os.listdir(folder) if not n.startswith("."))
            series = [d for d in subs if os.path.isdir(d) and _holds_dicom(d)]
        if not files and not series:
            raise DatasetError(
                f"no image matches {input_pattern!r} in {folder!r}, and no sub-folder holds a DICOM series."
            )
        if series:
            logger.info("%d DICOM series folder(s) in %s", len(series), folder)
        items = [{"image": f} for f in sorted(files + series)]
        where = f"{folder!r} (input_pattern {input_pattern!r})"
    if require_any and not items:
        raise FileNotFoundError(f"no volume to segment in {where}.")
    if check_volumes:
        for item in items:  # headers only: a 2D file or an unreadable one stops the run before any is segmented
            check_volume_pair(item["image"], None)
    return items


def _holds_dicom(folder: str) -> bool:
    """Whether ``folder`` holds a DICOM file (a Part 10 file: ``DICM`` after the 128-byte preamble)."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                if f.read(132)[128:] == b"DICM":
                    return True
        except OSError:
            continue
    return False


def _check_volume(path: str) -> None:
    check_volume_pair(path, None)


def volume_input_check(datalist: Sequence[Mapping[str, Any]], require_readable: bool = True) -> InputCheck:
    """Every inference volume checked from its header (a readable 3D NIfTI / NRRD volume, or a DICOM series folder
    holding one complete CT series, :func:`~spectraflow_monai.apps.synapse.check_volume_pair`) before any is
    segmented; a bad one (two series mixed in one folder, a missing slice, another modality, ...) is skipped with a
    warning naming it, not stopping the others (:class:`~spectraflow_monai.data.validation.InputCheck`).

    ``configs/inference.yaml`` segments :meth:`InputCheck.dataset` (which also skips a volume whose loading fails,
    e.g. NaN voxels with ``nonfinite: error``) and then calls :meth:`InputCheck.raise_failures`: the run exits
    non-zero with the list of the skipped volumes after writing the prediction of every other one.

    Args:
        datalist: ``[{"image": path}, ...]`` (:func:`synapse_inference_datalist`).
        require_readable: stop at once when no volume passes the header check. Defaults to True.
    """
    return InputCheck(datalist, require_readable=require_readable, check=_check_volume, noun="input volume(s)")
