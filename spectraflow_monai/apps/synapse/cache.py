"""The slice cache of the Synapse pipeline: volumes to TransUNet-like ``.npz`` axial slices, read once.

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spectraflow_monai.apps.synapse.constants import INDEX_NAME, INDEX_VERSION, format_case_id
from spectraflow_monai.apps.synapse.readers import (
    is_h5,
    read_h5_volume,
    read_raw_volume,
)
from spectraflow_monai.data.label_map import LABEL_MAP_UNMAPPED, check_label_map
from spectraflow_monai.data.validation import DatasetError
from spectraflow_monai.data.volumes import volume_format, volume_name
from spectraflow_monai.transforms.finite import check_nonfinite_args
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.files import atomic_path, write_text_atomic

__all__ = ["extract_slices", "slice_cache_dir", "slice_with_settings"]

logger = logging.getLogger(__name__)


def slice_cache_dir(
    bundle_root: str | os.PathLike,
    dataset: Any,
    image_size: Any,
    data_list_file_path: str | os.PathLike | None = None,
) -> str:
    """The bundle's default ``cache_dir``: ``<bundle_root>/cache/<source>_<image_size>``, where the source is the
    data set (``synthetic_224``) or, for a datalist JSON, ``datalist_`` and its file name up to the first dot
    (``/data/own/dataset.json`` -> ``datalist_dataset_224``), so that every source and slice size has its own cache.

    Args:
        bundle_root: the bundle folder.
        dataset: the bundle's ``dataset`` (not read when ``data_list_file_path`` is given).
        image_size: the side of the cached slices.
        data_list_file_path: a Decathlon datalist JSON, or None. Defaults to None.

    Raises:
        SettingError: ``bundle_root`` is not a path, or ``dataset`` is not a name (no datalist JSON given),
            naming the value.
    """
    if not isinstance(bundle_root, (str, os.PathLike)):
        raise SettingError(f"bundle_root must be a folder path, got {bundle_root!r}.")
    if data_list_file_path:
        source = "datalist_" + os.path.basename(os.fspath(data_list_file_path)).split(".")[0]
    elif isinstance(dataset, str) and dataset:
        source = dataset
    else:
        raise SettingError(f"dataset must be the name of a data set, got {dataset!r}.")
    return os.path.join(os.fspath(bundle_root), "cache", f"{source}_{image_size}")


def _atomic_write_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1))


def _atomic_write_npz(path: Path, **arrays: np.ndarray) -> None:
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _file_signature(path: str | os.PathLike | None) -> dict[str, Any] | None:
    if path is None:
        return None
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return {"path": p, "mtime_ns": None, "size": None}
    return {"path": p, "mtime_ns": st.st_mtime_ns, "size": st.st_size}


def _confined(folder: Path, rel: Any, index_path: Path, entry: str) -> str:
    """Return ``rel`` when it names a file inside ``folder``: a relative path without ``..`` whose real path (links
    resolved) lies inside the real path of ``folder``; else raise :class:`DatasetError` naming the index file and
    the entry. Every path read from the slice cache index goes through here before it is read or removed."""
    problem = None
    if not isinstance(rel, str) or not rel.strip():
        problem = "not a relative file path"
    elif os.path.isabs(rel) or rel.startswith(("/", "\\")):
        problem = "an absolute path"
    elif ".." in re.split(r"[\\/]", rel):
        problem = "a path with '..'"
    else:
        base = os.path.realpath(folder)
        full = os.path.realpath(os.path.join(base, rel))
        if full == base or os.path.commonpath([base, full]) != base:
            problem = "a path outside the cache folder"
    if problem is not None:
        raise DatasetError(
            f"slice cache index {os.fspath(index_path)!r}: entry {entry} = {rel!r} is {problem} (the index may only "
            f"list files inside {os.fspath(folder)!r}); refusing to use it. Delete that index.json (or the whole "
            "cache folder) to rebuild the cache."
        )
    return rel


def _read_index(path: Path) -> dict[str, Any]:
    """Read the slice cache index; an unreadable or unknown index is rebuilt, one listing a file outside the cache
    folder (an absolute path, ``..``, a link leading out) is refused with a :class:`DatasetError`."""
    if not path.is_file():
        return {"version": INDEX_VERSION, "volumes": {}}
    try:
        with open(path) as f:
            index = json.load(f)
        known = isinstance(index, dict) and index.get("version") == INDEX_VERSION
        if known and isinstance(index.get("volumes"), dict):
            for case, rec in index["volumes"].items():
                files = rec.get("files") if isinstance(rec, dict) else None
                if not isinstance(files, list):
                    raise DatasetError(
                        f"slice cache index {os.fspath(path)!r}: entry volumes[{case!r}] has no list of files "
                        f"({rec!r}); delete that index.json (or the whole cache folder) to rebuild the cache."
                    )
                for i, rel in enumerate(files):
                    _confined(path.parent, rel, path, f"volumes[{case!r}].files[{i}]")
            return index
        logger.warning("slice cache index %s has an unknown format; rebuilding the cache.", path)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        logger.warning("slice cache index %s is unreadable (%s); rebuilding the cache.", path, e)
    return {"version": INDEX_VERSION, "volumes": {}}


def _case_of(entry: Mapping[str, Any]) -> str:
    if entry.get("case") is not None:
        case = str(entry["case"])
        try:
            return format_case_id(case)
        except ValueError:
            return case
    name = volume_name(entry["image"])
    try:
        return format_case_id(name)
    except ValueError:
        return name


def _is_nrrd(path: Any) -> bool:
    try:
        return path is not None and volume_format(path) == "nrrd"
    except DatasetError:
        return False


def _resize_slices(vol: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """Resize each axial slice of ``vol`` (H, W, D) to ``size``."""
    t = torch.from_numpy(np.ascontiguousarray(np.moveaxis(vol, -1, 0)))[:, None].float()  # (D, 1, H, W)
    kwargs = {"align_corners": False} if mode == "bilinear" else {}
    t = torch.nn.functional.interpolate(t, size=size, mode=mode, **kwargs)
    return np.moveaxis(t[:, 0].numpy(), 0, -1)


def _extract_volume(entry: Mapping[str, Any], case: str, cache: Path, params: Mapping[str, Any]) -> dict[str, Any]:
    """Write the slices of one volume; return its index record (paths relative to ``cache``)."""
    image_path = os.fspath(entry["image"])
    label_path = os.fspath(entry["label"]) if entry.get("label") is not None else None
    if is_h5(image_path):
        image, label = read_h5_volume(image_path, label_path, case, params)
    else:
        image, label = read_raw_volume(image_path, label_path, case, params)
    if params["spatial_size"] is not None:
        size = tuple(params["spatial_size"])
        image = _resize_slices(image, size, "bilinear")
        if label is not None:
            label = _resize_slices(label, size, "nearest-exact").astype(np.uint8)
    image = image.astype(params["image_dtype"], copy=False)
    (cache / f"case{case}").mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(image.shape[-1]):
        rel = f"case{case}/case{case}_slice{k:03d}.npz"
        arrays = {"image": np.ascontiguousarray(image[..., k])}
        if label is not None:
            arrays["label"] = np.ascontiguousarray(label[..., k])
        _atomic_write_npz(cache / rel, **arrays)
        files.append(rel)
    return {"files": files, "has_label": label is not None, "shape": list(image.shape)}


def extract_slices(
    datalist: Sequence[Mapping[str, Any]],
    cache_dir: str | os.PathLike,
    window: Sequence[float] = (-125.0, 275.0),
    spatial_size: Sequence[int] | None = None,
    image_dtype: str = "float32",
    map_labels: bool = True,
    canonical: bool = True,
    progress: bool = True,
    nonfinite: str = "error",
    nonfinite_value: float | None = None,
    label_map: Mapping[int, int] | None = None,
    unmapped_labels: str = "error",
    class_names: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Cache the axial slices of CT volumes as TransUNet-like ``.npz`` files and return a slice datalist.

    Each volume is read once: the image is windowed to [0, 1] (TransUNet: clip to [-125, 275] HU, then rescale;
    :class:`spectraflow_monai.apps.synapse.CTWindow`), the label is mapped from BTCV ids to the 9 Synapse classes
    (:func:`map_btcv_labels`), and every axial slice is written (atomically) to
    ``<cache_dir>/case<id>/case<id>_slice<k>.npz`` with arrays ``image`` (H, W) and ``label`` (H, W, uint8). An
    index (``<cache_dir>/index.json``, updated after every volume) records each source's path, modification time
    and size and the extraction settings; a later call skips every volume whose record still matches, so an
    interrupted extraction resumes where it stopped. The axial axis is the last axis of the volume after
    reorientation to the closest RAS+ orientation (``canonical=True``), so the slices match a 3D evaluation
    pipeline ``LoadImaged -> EnsureChannelFirstd -> Orientationd(axcodes="RAS")`` with
    ``monai.inferers.SliceInferer(spatial_dim=2)``.

    TransUNet's test volumes (``test_vol_h5/caseXXXX.npy.h5`` entries of :func:`synapse_datalist`; ``"label"``
    the same file or absent) are cached the same way, except that they are already windowed and mapped: the
    window, ``map_labels`` and ``canonical`` do not apply to them and their labels must be Synapse classes 0..8.

    Images may be NIfTI or NRRD files or DICOM series folders, labels NIfTI or NRRD files on their image's grid (a 3D
    Slicer segmentation, ``.seg.nrrd``, is mapped to ``class_names`` by segment name: a liver segment is the liver
    class whatever its number in the file; :func:`~spectraflow_monai.apps.synapse.readers.read_raw_volume`).

    Every image volume is checked for NaN and infinite voxels as it is read (``nonfinite``). The index lists only
    files inside ``cache_dir``: an index naming an absolute path, a path with ``..`` or a link leading out of the
    folder is refused (a :class:`DatasetError` naming the index and the entry), so that no file outside the cache
    is ever read or removed.

    Args:
        datalist: entries ``{"image": nifti, "label": nifti (optional), "case": id (optional)}``, e.g. from
            :func:`synapse_datalist` with the raw layout, or TransUNet ``.h5`` volumes. Without ``"case"``, the id
            is taken from the file name.
        cache_dir: folder of the cache (created if needed).
        window: HU window ``(a_min, a_max)``. Defaults to ``(-125, 275)``.
        spatial_size: optional ``(H, W)`` every slice is resized to (image bilinear, label nearest). Defaults to
            None (native size).
        image_dtype: ``"float32"`` or ``"float16"`` (halves the cache size). Defaults to ``"float32"``.
        map_labels: map BTCV ids to Synapse classes; False stores the label ids as they are. Defaults to True.
        canonical: reorient each volume to the closest RAS+ orientation before slicing. Defaults to True.
        progress: show a progress bar (tqdm) while extracting. Defaults to True.
        nonfinite: what to do with NaN / infinite image voxels: ``"error"`` stops with a :class:`DatasetError`
            naming the case, the file and the count; ``"replace"`` replaces them by ``nonfinite_value`` before the
            window and logs the file and the count (see :mod:`spectraflow_monai.transforms.finite`). Defaults to
            ``"error"``.
        nonfinite_value: the replacement for ``"replace"``, in the units of the file; None: the window's lower
            bound ``a_min`` for NIfTI volumes (HU) and 0 for TransUNet's windowed ``.h5`` volumes, i.e. black after
            windowing. Defaults to None.
        label_map: ``{source label value: class}`` applied to NIfTI labels instead of the BTCV map (and instead
            of ``map_labels``), e.g. for a Decathlon data set (:mod:`spectraflow_monai.data.label_map`); it is
            recorded in the cache index, so a changed map re-extracts the volumes. Not applied to TransUNet's
            ``.h5`` volumes. Defaults to None.
        unmapped_labels: with ``label_map``: label values the map does not list stop with a :class:`DatasetError`
            naming the case, the file and the values (``"error"``) or become background 0 (``"background"``).
            Defaults to ``"error"``.
        class_names: the classes, background first, that a segmentation's segment names are matched with; recorded
            in the cache index when a label is an NRRD file. Defaults to None.

    Returns:
        the slice datalist ``[{"image": npz, "label": npz, "case": "0005", "slice": k}, ...]`` (``"label"`` only
        when the entry had one), in datalist order; load it with
        :class:`spectraflow_monai.apps.synapse.LoadSynapseSliced`.

    Raises:
        ValueError: bad arguments, entries without ``"image"``, a case id that is not a plain file name part, two
            entries with the same case id, label values outside the expected set (the message names the case).
        DatasetError: a volume is missing, unreadable, 2D, mismatched with its label, or holds non-finite voxels
            (``nonfinite="error"``); the cache index lists a path outside ``cache_dir``.
    """

    if len(window) != 2:
        raise ValueError(f"window must be (a_min, a_max), got {window!r}.")
    a_min, a_max = float(window[0]), float(window[1])
    if not a_max > a_min:
        raise ValueError(f"window must satisfy a_min < a_max, got {window!r}.")
    if spatial_size is not None:
        if len(spatial_size) != 2 or any(int(s) != s or s < 1 for s in spatial_size):
            raise ValueError(f"spatial_size must be None or two positive ints (H, W), got {spatial_size!r}.")
        spatial_size = [int(s) for s in spatial_size]
    if image_dtype not in ("float32", "float16"):
        raise ValueError(f"image_dtype must be 'float32' or 'float16', got {image_dtype!r}.")
    if nonfinite_value is not None:
        nonfinite_value = check_nonfinite_args(nonfinite, nonfinite_value, "nonfinite", "nonfinite_value")
    else:
        check_nonfinite_args(nonfinite, 0.0, "nonfinite", "nonfinite_value")
    if unmapped_labels not in LABEL_MAP_UNMAPPED:
        raise ValueError(f"unmapped_labels must be one of {list(LABEL_MAP_UNMAPPED)}, got {unmapped_labels!r}.")
    if label_map is not None:
        label_map = check_label_map(label_map, 256)
    cases: dict[str, str] = {}
    for i, entry in enumerate(datalist):
        if not isinstance(entry, Mapping) or "image" not in entry:
            raise ValueError(f"datalist[{i}] must be a mapping with an 'image' path, got {entry!r}.")
        case = _case_of(entry)
        if not case or case in (".", "..") or "/" in case or "\\" in case:
            raise ValueError(
                f"datalist[{i}] has the case id {case!r}: case ids name the cache files (case<id>/...) and must not "
                "hold '/', '\\' or be '.' / '..'."
            )
        src = os.path.abspath(os.fspath(entry["image"]))
        if cases.setdefault(case, src) != src:
            raise ValueError(f"datalist has two volumes with case id {case!r}: {cases[case]!r} and {src!r}.")
    params = {
        "window": [a_min, a_max],
        "spatial_size": spatial_size,
        "image_dtype": image_dtype,
        "map_labels": bool(map_labels),
        "canonical": bool(canonical),
    }
    if nonfinite == "replace":  # recorded only then, so that caches built before the option existed stay valid
        params["nonfinite"] = {"mode": "replace", "value": nonfinite_value}
    if label_map is not None:  # likewise: a changed map (or unmapped rule) re-extracts the volumes
        params["label_map"] = [[k, v] for k, v in sorted(label_map.items())]
        params["unmapped"] = unmapped_labels
    if class_names is not None and any(_is_nrrd(e.get("label")) for e in datalist):  # segment names -> classes
        params["class_names"] = [str(n) for n in class_names]
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    index_path = cache / INDEX_NAME
    index = _read_index(index_path)
    volumes: dict[str, Any] = index["volumes"]

    todo = []
    for entry in datalist:
        case = _case_of(entry)
        source = {"image": _file_signature(entry["image"]), "label": _file_signature(entry.get("label"))}
        rec = volumes.get(case)
        if (
            rec is not None
            and rec.get("source") == source
            and rec.get("params") == params
            and "has_label" in rec
            and all((cache / f).is_file() for f in rec["files"])
        ):
            continue
        todo.append((entry, case, source))

    bar = None
    if progress and todo:
        from monai.utils import optional_import

        tqdm, has_tqdm = optional_import("tqdm", name="tqdm")
        if has_tqdm:
            bar = tqdm(total=len(todo), desc="extracting Synapse slices", unit="volume")
    try:
        for entry, case, source in todo:
            logger.info("extracting axial slices of case %s from %s", case, entry["image"])
            old = volumes.pop(case, None)
            rec = _extract_volume(entry, case, cache, params)
            if old is not None:  # drop stale slices of an earlier extraction
                for f in set(old.get("files", [])) - set(rec["files"]):
                    if (cache / f).is_file():
                        os.remove(cache / f)
            volumes[case] = {"source": source, "params": params, **rec}
            _atomic_write_json(index_path, index)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if todo:
        logger.info("extracted %d volume(s) into %s; %d reused", len(todo), cache, len(datalist) - len(todo))
    out: list[dict[str, Any]] = []
    for entry in datalist:
        case = _case_of(entry)
        rec = volumes[case]
        for k, f in enumerate(rec["files"]):
            item: dict[str, Any] = {"image": str(cache / f), "case": case, "slice": k}
            if rec["has_label"]:
                item["label"] = str(cache / f)
            out.append(item)
    return out


def slice_with_settings(
    entries: Sequence[Mapping[str, Any]],
    source: Any,
    label_map: Mapping[int, int] | None,
    unmapped_labels: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """:func:`extract_slices` of ``entries`` as a run's data source
    (:class:`~spectraflow_monai.apps.synapse.SynapseDataSource`) prepares them: its CT window, slice size,
    non-finite rule, ``unmapped_labels``, class names and progress bar, into ``cache_dir`` (default: the source's
    ``cache_dir``), labels mapped with ``label_map``."""
    return extract_slices(
        entries,
        source.cache_dir if cache_dir is None else cache_dir,
        window=source.hu_window,
        spatial_size=source.spatial_size,
        progress=source.progress,
        nonfinite=source.nonfinite,
        nonfinite_value=source.nonfinite_value,
        label_map=label_map,
        unmapped_labels=source.unmapped_labels if unmapped_labels is None else unmapped_labels,
        class_names=source.class_names,
    )
