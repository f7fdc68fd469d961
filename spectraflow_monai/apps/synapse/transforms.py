"""CT transforms for the Synapse multi-organ experiment of SpectraFlow.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") evaluates on the 3D Synapse multi-organ CT data set with the protocol of TransUNet (Chen et al.,
"TransUNet: Transformers Make Strong Encoders for Medical Image Segmentation", arXiv:2102.04306): the CT numbers are
clipped to the abdominal window [-125, 275] HU and rescaled to [0, 1], the 13 BTCV labels are reduced to 8 organs,
and the network is trained on 2D axial slices.

- :class:`CTWindow` / :class:`CTWindowd`: the HU window, a preset of :class:`monai.transforms.ScaleIntensityRange`.
- :class:`MapBTCVLabels` / :class:`MapBTCVLabelsd`: BTCV label ids (0..13) to the 9 Synapse classes.
- :class:`LoadSynapseSliced`: loads one axial slice stored as ``.npz`` (TransUNet's ``train_npz`` files or the slice
  cache of :func:`spectraflow_monai.apps.synapse.extract_slices`) as channel-first ``MetaTensor`` s.
- :class:`LoadSynapseH5d`: loads one of TransUNet's ``test_vol_h5`` volumes as channel-first ``MetaTensor`` s
  ``(1, H, W, D)`` with unit spacing, for whole-volume evaluation.

To feed the 3-channel DINOv2 encoder, repeat the single CT channel with MONAI's own
:class:`monai.transforms.RepeatChanneld` (``repeats=3``).
"""

from __future__ import annotations

import logging
import os
import re
import zipfile
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.config import DtypeLike, KeysCollection
from monai.data import MetaTensor
from monai.transforms import MapTransform, ScaleIntensityRange, ScaleIntensityRanged, Transform
from monai.utils import convert_to_dst_type

from spectraflow_monai.apps.synapse.readers import check_synapse_labels, load_synapse_h5, map_btcv_labels
from spectraflow_monai.handlers.volume_metrics import SPACING_UNITS_KEY
from spectraflow_monai.utils.errors import DatasetError

__all__ = [
    "CTWindow",
    "CTWindowd",
    "MapBTCVLabels",
    "MapBTCVLabelsd",
    "LoadSynapseSliced",
    "LoadSynapseH5d",
    "load_slice_npz",
    "SaveDicomSegd",
]

logger = logging.getLogger(__name__)

_SLICE_NAME = re.compile(r"case(\d+)_slice(\d+)")
_CASE_NAME = re.compile(r"case(\d+)")


def _check_num_classes(num_classes: int | None) -> None:
    if num_classes is not None and (
        not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1
    ):
        raise ValueError(f"num_classes must be None or a positive integer, got {num_classes!r}.")


def _check_window(a_min: float, a_max: float) -> None:
    if not (np.isfinite(a_min) and np.isfinite(a_max)) or a_max <= a_min:
        raise ValueError(f"a_max must be greater than a_min (both finite), got a_min={a_min!r}, a_max={a_max!r}.")


class CTWindow(ScaleIntensityRange):
    """Clip CT numbers to the window ``[a_min, a_max]`` (HU) and rescale it linearly to ``[0, 1]``.

    The defaults are the abdominal window of the TransUNet Synapse protocol used by SpectraFlow (Chen et al.):
    ``clip(x, -125, 275)`` then ``(x + 125) / 400``. This is :class:`monai.transforms.ScaleIntensityRange` with
    ``b_min=0, b_max=1, clip=True``.

    Args:
        a_min: lower bound of the window in HU. Defaults to -125.
        a_max: upper bound of the window in HU; must be greater than ``a_min``. Defaults to 275.
        dtype: output data type. Defaults to ``np.float32``.
    """

    def __init__(self, a_min: float = -125.0, a_max: float = 275.0, dtype: DtypeLike = np.float32) -> None:
        _check_window(a_min, a_max)
        super().__init__(a_min=a_min, a_max=a_max, b_min=0.0, b_max=1.0, clip=True, dtype=dtype)


class CTWindowd(ScaleIntensityRanged):
    """Dictionary-based :class:`CTWindow`.

    Args:
        keys: keys of the corresponding items to be transformed.
        a_min: lower bound of the window in HU. Defaults to -125.
        a_max: upper bound of the window in HU; must be greater than ``a_min``. Defaults to 275.
        dtype: output data type. Defaults to ``np.float32``.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    def __init__(
        self,
        keys: KeysCollection,
        a_min: float = -125.0,
        a_max: float = 275.0,
        dtype: DtypeLike = np.float32,
        allow_missing_keys: bool = False,
    ) -> None:
        _check_window(a_min, a_max)
        super().__init__(
            keys,
            a_min=a_min,
            a_max=a_max,
            b_min=0.0,
            b_max=1.0,
            clip=True,
            dtype=dtype,
            allow_missing_keys=allow_missing_keys,
        )


def _case_from_meta(img: Any) -> str | None:
    if isinstance(img, MetaTensor):
        name = img.meta.get("filename_or_obj")
        if name:
            return str(name)
    return None


class MapBTCVLabels(Transform):
    """Map BTCV label ids (0..13) to the 9 classes of the Synapse benchmark.

    BTCV id -> Synapse class: 1 spleen -> 1, 2 right kidney -> 2, 3 left kidney -> 3, 4 gallbladder -> 4,
    6 liver -> 5, 7 stomach -> 6, 8 aorta -> 7, 11 pancreas -> 8; esophagus (5), inferior vena cava (9), portal
    and splenic veins (10) and the adrenal glands (12, 13) become background (TransUNet protocol, as used by
    SpectraFlow, Chen et al.). See :func:`spectraflow_monai.apps.synapse.map_btcv_labels`.

    The input type, dtype and metadata are kept. Values outside 0..13 (or non-integral values) raise a
    ``ValueError`` naming the file (from the ``MetaTensor`` metadata) and the offending values.
    """

    backend = [torch.Tensor, np.ndarray]  # type: ignore[assignment]

    def __call__(self, img: Any) -> Any:
        """Apply the mapping to a label array or tensor of any shape."""
        out = map_btcv_labels(img, case=_case_from_meta(img))
        if isinstance(img, (torch.Tensor, np.ndarray)):
            out, *_ = convert_to_dst_type(out, img)
        return out


class MapBTCVLabelsd(MapTransform):
    """Dictionary-based :class:`MapBTCVLabels`.

    Args:
        keys: keys of the label items to be mapped. Defaults to ``"label"``.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
    """

    backend = MapBTCVLabels.backend

    def __init__(self, keys: KeysCollection = "label", allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)
        self.mapper = MapBTCVLabels()

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.mapper(d[key])
        return d


def load_slice_npz(path: str | os.PathLike, fields: Sequence[str] = ("image", "label")) -> dict[str, np.ndarray]:
    """Read the arrays ``fields`` of a 2D slice stored as ``.npz`` (keys ``image`` / ``label``).

    Args:
        path: the ``.npz`` file.
        fields: names of the arrays to read. Defaults to ``("image", "label")``.

    Raises:
        FileNotFoundError: the file does not exist.
        DatasetError: (a ``ValueError``) the file is not a readable ``.npz`` archive or lacks one of ``fields``;
            the run then ends with one ``error:`` line naming the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"slice file {path!r} does not exist.")
    try:
        npz = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise DatasetError(f"slice file {path!r} is not a readable .npz archive: {e}") from e
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DatasetError(f"slice file {path!r} is a single array, not an .npz archive with {list(fields)}.")
    with npz:
        missing = [f for f in fields if f not in npz.files]
        if missing:
            raise DatasetError(f"slice file {path!r} has no array {missing} (it contains {sorted(npz.files)}).")
        try:
            return {f: np.asarray(npz[f]) for f in fields}
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise DatasetError(f"slice file {path!r} is not a readable .npz archive: {e}") from e


class LoadSynapseSliced(MapTransform):
    """Load axial CT slices stored as ``.npz`` into channel-first ``MetaTensor`` s of shape ``(1, H, W)``.

    Works for TransUNet's preprocessed ``train_npz/caseXXXX_sliceNNN.npz`` files and for the slice cache written
    by :func:`spectraflow_monai.apps.synapse.extract_slices` (both store ``image`` and ``label`` arrays of shape
    ``(H, W)`` in one file; the image is already windowed to [0, 1] and the label mapped to the 9 Synapse
    classes). Each distinct path in a data dictionary is read once, so ``{"image": p, "label": p}`` opens ``p`` a
    single time. The metadata carries ``filename_or_obj``, ``case`` and ``slice`` (from the data dictionary, or
    parsed from a ``caseXXXX_sliceNNN`` file name).

    Args:
        keys: keys of the data dictionary holding ``.npz`` paths. Defaults to ``("image", "label")``.
        fields: the array name to read for each key, a mapping ``key -> array name``; keys not listed read the
            array of their own name. Defaults to None.
        dtype: output data type, or None to keep the stored type. Defaults to ``np.float32``.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.
        num_classes: when set, the array loaded for ``label_key`` must hold integer classes in
            ``[0, num_classes)`` (9 for Synapse); other values raise a ``ValueError`` naming the file and the case.
            Defaults to None (no check).
        label_key: the key checked against ``num_classes``. Defaults to ``"label"``.
    """

    def __init__(
        self,
        keys: KeysCollection = ("image", "label"),
        fields: Mapping[str, str] | None = None,
        dtype: DtypeLike | None = np.float32,
        allow_missing_keys: bool = False,
        num_classes: int | None = None,
        label_key: str = "label",
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if fields is not None and not isinstance(fields, Mapping):
            raise ValueError(f"fields must be a mapping key -> array name or None, got {fields!r}.")
        _check_num_classes(num_classes)
        self.fields = dict(fields or {})
        self.dtype = dtype
        self.num_classes = num_classes
        self.label_key = label_key

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        wanted: dict[str, list[tuple[Hashable, str]]] = {}
        for key in self.key_iterator(d):
            path = d[key]
            if not isinstance(path, (str, os.PathLike)):
                raise ValueError(f"LoadSynapseSliced: d[{key!r}] must be a path to a .npz slice, got {type(path)}.")
            wanted.setdefault(os.fspath(path), []).append((key, self.fields.get(str(key), str(key))))
        for path, items in wanted.items():
            arrays = load_slice_npz(path, fields=sorted({f for _, f in items}))
            match = _SLICE_NAME.search(os.path.basename(path))
            case = d.get("case", match.group(1) if match else None)
            slice_idx = d.get("slice", int(match.group(2)) if match else None)
            for key, field in items:
                arr = arrays[field]
                if arr.ndim == 2:
                    arr = arr[None]
                elif arr.ndim != 3 or arr.shape[0] != 1:
                    raise ValueError(
                        f"slice file {path!r}: array {field!r} must have shape (H, W) or (1, H, W), got {arr.shape}."
                    )
                if self.num_classes is not None and key == self.label_key:
                    where = f"case {case} ({path})" if case is not None else path
                    check_synapse_labels(arr, self.num_classes, where=where)
                if self.dtype is not None:
                    arr = arr.astype(self.dtype, copy=False)
                meta: dict[str, Any] = {
                    "filename_or_obj": path,
                    "spatial_shape": np.asarray(arr.shape[1:]),
                    "original_channel_dim": "no_channel",
                }
                if case is not None:  # None would not collate
                    meta["case"] = str(case)
                if slice_idx is not None:
                    meta["slice"] = int(slice_idx)
                d[key] = MetaTensor(torch.from_numpy(np.ascontiguousarray(arr)), affine=torch.eye(3), meta=meta)
        return d


class LoadSynapseH5d(MapTransform):
    """Load a TransUNet test volume ``test_vol_h5/caseXXXX.npy.h5`` as channel-first ``MetaTensor`` s (1, H, W, D).

    TransUNet (Chen et al., arXiv:2102.04306) distributes its Synapse test volumes preprocessed: ``image`` already
    windowed to [0, 1] ([-125, 275] HU) and ``label`` already mapped to the 9 Synapse classes, stored ``(D, H, W)``
    without any geometry. They are returned with the axial axis last (``(1, H, W, D)``, as RAS NIfTI volumes, so
    ``monai.inferers.SliceInferer(spatial_dim=2)`` slices them the same way) and an identity affine: the spacing is
    one voxel, so distances measured on them are in voxels, as in TransUNet's evaluation (used by SpectraFlow, Chen
    et al., for its Synapse table); their metadata say so (``SPACING_UNITS_KEY: "voxels"``, which the volume metrics
    read). Each distinct path is read once (``{"image": p, "label": p}`` opens ``p`` a
    single time); reading needs the optional ``h5py`` (``pip install spectraflow_monai[h5]``).

    Args:
        keys: keys of the data dictionary holding ``.h5`` paths. Defaults to ``("image", "label")``.
        fields: the dataset name to read for each key, a mapping ``key -> "image" | "label"``; keys not listed read
            the dataset of their own name. Defaults to None.
        dtype: output data type, or None to keep the stored type. Defaults to ``np.float32``.
        num_classes: the array loaded for ``label_key`` must hold integer classes in ``[0, num_classes)``; None skips
            the check. Defaults to 9 (Synapse).
        label_key: the key checked against ``num_classes``. Defaults to ``"label"``.
        allow_missing_keys: don't raise exception if key is missing. Defaults to False.

    Raises:
        ImportError: h5py is not installed.
        DatasetError: a file is missing, unreadable, or not ``(D, H, W)``.
        ValueError: label values outside the expected classes (the message names the case and the file).
    """

    def __init__(
        self,
        keys: KeysCollection = ("image", "label"),
        fields: Mapping[str, str] | None = None,
        dtype: DtypeLike | None = np.float32,
        num_classes: int | None = 9,
        label_key: str = "label",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if fields is not None and not isinstance(fields, Mapping):
            raise ValueError(f"fields must be a mapping key -> 'image' | 'label' or None, got {fields!r}.")
        bad = {k: v for k, v in (fields or {}).items() if v not in ("image", "label")}
        if bad:
            raise ValueError(f"fields must map keys to 'image' or 'label' (the datasets of the file), got {bad!r}.")
        _check_num_classes(num_classes)
        self.fields = dict(fields or {})
        self.dtype = dtype
        self.num_classes = num_classes
        self.label_key = label_key

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        loaded: dict[str, dict[str, np.ndarray]] = {}
        for key in self.key_iterator(d):
            path = d[key]
            if not isinstance(path, (str, os.PathLike)):
                raise ValueError(f"LoadSynapseH5d: d[{key!r}] must be a path to a .h5 volume, got {type(path)}.")
            path = os.fspath(path)
            if path not in loaded:
                loaded[path] = load_synapse_h5(path)
            field = self.fields.get(str(key), str(key))
            if field not in ("image", "label"):
                raise ValueError(
                    f"LoadSynapseH5d: key {key!r} reads the dataset {field!r}; a TransUNet volume holds 'image' and "
                    "'label' (map other keys with `fields`)."
                )
            match = _CASE_NAME.search(os.path.basename(path))
            case = d.get("case", match.group(1) if match else None)
            arr = loaded[path][field]
            if self.num_classes is not None and key == self.label_key:
                check_synapse_labels(arr, self.num_classes, where=f"case {case} ({path})" if case else path)
            if self.dtype is not None:
                arr = arr.astype(self.dtype, copy=False)
            meta: dict[str, Any] = {
                "filename_or_obj": path,
                "spatial_shape": np.asarray(arr.shape),
                "original_channel_dim": "no_channel",
            }
            if case is not None:
                meta["case"] = str(case)
            meta[SPACING_UNITS_KEY] = "voxels"  # no geometry: the identity affine below is not a measurement
            tensor = torch.from_numpy(np.ascontiguousarray(arr[None]))
            d[key] = MetaTensor(tensor, affine=torch.eye(4, dtype=torch.float64), meta=meta)
        return d


class SaveDicomSegd(MapTransform):
    """Write each prediction of a DICOM series input as a DICOM SEG of that series, beside its label file:
    ``<output_dir>/<series folder name>_<postfix>.dcm`` (``configs/inference.yaml``, ``output_format: dicom_seg``).

    One segment per class present, labelled with its class name
    (:func:`~spectraflow_monai.data.dicom_seg.write_dicom_seg`, the converter the MONAI Label app uses too). The
    prediction must carry its input's metadata (``filename_or_obj``: the series folder) and lie on the series' grid
    (after ``Invertd``). An input that is no DICOM series (a NIfTI / NRRD file) and a prediction that holds no class
    are logged and get no SEG; the data are returned unchanged.

    Args:
        keys: the prediction key(s). Defaults to ``"pred"``.
        output_dir: the folder the SEG files go to.
        class_names: the name of every class, background first (the model's ``class_names``).
        output_postfix: the name's postfix. Defaults to ``"seg"``.
        allow_missing_keys: as MONAI's. Defaults to False.

    Raises:
        ValueError: ``output_dir`` is not a folder path, or ``class_names`` names fewer than 2 classes.
    """

    def __init__(
        self,
        keys: KeysCollection = "pred",
        output_dir: str | os.PathLike = ".",
        class_names: Sequence[str] = (),
        output_postfix: str = "seg",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
            raise ValueError(f"output_dir must be a folder path, got {output_dir!r}.")
        names = [str(n) for n in class_names]
        if len(names) < 2:
            raise ValueError(f"class_names must name the background and at least one class, got {names!r}.")
        self.output_dir, self.class_names, self.postfix = os.fspath(output_dir), names, str(output_postfix)

    def __call__(self, data: Mapping[Hashable, Any]) -> Mapping[Hashable, Any]:
        from spectraflow_monai.data.dicom_seg import SEG_SUFFIX, write_dicom_seg
        from spectraflow_monai.data.volumes import volume_name

        for key in self.key_iterator(dict(data)):
            pred = data[key]
            source = str(pred.meta.get("filename_or_obj", "")) if isinstance(pred, MetaTensor) else ""
            if not source or not os.path.isdir(source):
                logger.warning("%s is not a DICOM series folder: no DICOM SEG written for it", source or key)
                continue
            if not bool(torch.as_tensor(pred).any()):
                logger.warning("the prediction of %s holds no class: no DICOM SEG written for it", source)
                continue
            path = os.path.join(self.output_dir, f"{volume_name(source)}_{self.postfix}{SEG_SUFFIX}")
            write_dicom_seg(pred, source, self.class_names, path)
        return data
