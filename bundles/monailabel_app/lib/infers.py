"""Inference task of the SpectraFlow MONAI Label app: ``BundleInferTask`` with bundle config overrides, strict
weight loading and integer label maps at the input's size, always written in a lossless format."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from fastapi import HTTPException
from monai.bundle import ConfigParser
from monai.data import MetaTensor
from monai.transforms import LoadImage, LoadImaged, MapTransform
from monailabel.tasks.infer.bundle import BundleInferTask

from spectraflow_monai.utils.bundles import settings_overrides

from .served import served_onnx, serving_runtime

__all__ = [
    "DEFAULT_WEIGHTS",
    "LABEL_EXTENSIONS_3D",
    "LABEL_EXTENSION_2D",
    "DropSingletonChanneld",
    "SpectraFlowInferTask",
    "has_volume_format",
    "image_problem",
    "input_rank",
    "short_reason",
    "unknown_weights",
    "weight_files",
]

# label maps are written losslessly: PNG for 2D images (whatever the input's format, JPEG included), NIfTI or NRRD
# for volumes (the input's format when it is one of these, else NIfTI)
LABEL_EXTENSION_2D = ".png"
LABEL_EXTENSIONS_3D = (".nii.gz", ".nii", ".nrrd", ".seg.nrrd")
_MAX_REASON = 400
#: the served model of a bundle (``models/model.pt``), the default ``model_filename`` of inference and training
DEFAULT_WEIGHTS = "model.pt"


def weight_files(bundle_path: str) -> list[str]:
    """Names of the weight files a request may choose (``model_filename``): the ``*.pt`` files directly in the
    bundle's ``models/`` folder (links leading out of it excluded), shortest name first as MONAI Label lists them."""
    models = os.path.realpath(os.path.join(bundle_path, "models"))
    if not os.path.isdir(models):
        return []
    names = []
    for name in os.listdir(models):
        path = os.path.join(models, name)
        if name.endswith(".pt") and os.path.isfile(path) and os.path.dirname(os.path.realpath(path)) == models:
            names.append(name)
    return sorted(names, key=lambda n: (len(n), n))


def unknown_weights(bundle_path: str) -> str:
    """The one answer to a ``model_filename`` that is not in :func:`weight_files` (a path, a missing name): it
    lists the names a request may choose and never repeats the value nor shows a server path."""
    return (
        f"model_filename must be the name of a weight file in the model's models/ folder: one of "
        f"{weight_files(bundle_path)}"
    )


def short_reason(exc: BaseException) -> str:
    """``"<exception type>: <first line>"``, at most 400 characters: a reason for an answer."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def image_problem(path: str, loader: Any = None, spatial_rank: int | None = None) -> tuple[int, str] | None:
    """What is wrong with ``path`` as the input of a model, as ``(HTTP status, reason)``, or None when nothing is.

    Args:
        path: image file (or DICOM folder).
        loader: a dictionary loader (``LoadImaged`` on key ``image``) to try; default: ``LoadImage`` with all
            of MONAI's readers.
        spatial_rank: expected number of spatial dimensions (2: an image, 3: a volume); ``None`` does not check.
            Default ``None``.

    Returns:
        ``(415, reason)`` when it cannot be read as an image, ``(422, reason)`` when it is an image of another
        spatial rank, else None.
    """
    try:
        if loader is None:
            image = LoadImage(image_only=True)(path)
        else:
            image = loader({"image": path})["image"]
    except Exception as e:  # every reader failure means "not an image for this model"
        return 415, short_reason(e)
    if spatial_rank is not None:
        shape = tuple(image.shape)
        meta = getattr(image, "meta", {})
        rank = len(meta["spatial_shape"]) if "spatial_shape" in meta else len(shape)
        if rank != spatial_rank:
            kind = {2: "a 2D image", 3: "a 3D volume"}.get(spatial_rank, f"{spatial_rank} spatial dimensions")
            return 422, f"expected {kind}, got an image of {rank} spatial dimensions (array shape {shape})"
    return None


def _metadata(bundle_path: str) -> dict[str, Any]:
    with open(os.path.join(bundle_path, "configs", "metadata.json")) as f:
        return json.load(f)


def has_volume_format(bundle_path: str) -> bool:
    """Whether the bundle's metadata has ``volume_data_format`` (3D volumes in, a 2D network: slice-wise)."""
    return bool((_metadata(bundle_path).get("volume_data_format") or {}).get("inputs"))


def input_rank(bundle_path: str) -> int:
    """Spatial rank of a bundle's inference input: ``volume_data_format`` (the whole-volume input of a slice-wise
    bundle) when the metadata has it, else ``network_data_format``."""
    meta = _metadata(bundle_path)
    for section in ("volume_data_format", "network_data_format"):
        inputs = (meta.get(section) or {}).get("inputs") or {}
        if inputs:
            shape = next(iter(inputs.values())).get("spatial_shape")
            if shape:
                return len(shape)
    return 3


def _extension(path: str) -> str:
    name = os.path.basename(path).lower()
    for ext in LABEL_EXTENSIONS_3D:
        if name.endswith(ext):
            return ext
    return ""


class DropSingletonChanneld(MapTransform):
    """Drop the channel of a one-channel prediction whose spatial rank is that of the reference image.

    ``Restored`` squeezes the channel of 3D volumes only; a 2D image's ``(1, W, H)`` label must become ``(W, H)``
    to be written as a 2D PNG at the input's size.

    Args:
        keys: prediction keys.
        ref_image: key of the loaded input image (its ``spatial_shape`` meta data gives the spatial rank).
    """

    def __init__(self, keys: Any, ref_image: str = "image"):
        super().__init__(keys)
        self.ref_image = ref_image

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        d = dict(data)
        ref = d.get(self.ref_image)
        spatial_shape = ref.meta.get("spatial_shape") if isinstance(ref, MetaTensor) else None
        if spatial_shape is None:
            return d
        for key in self.key_iterator(d):
            x = d[key]
            if x.ndim == len(spatial_shape) + 1 and x.shape[0] == 1:
                d[key] = x[0]
        return d


class SpectraFlowInferTask(BundleInferTask):
    """``BundleInferTask`` with bundle config overrides, strict weight loading and integer label maps at the input's
    size (2D images included), written losslessly: a 2D label map is always a PNG (a JPEG input included; JPEG
    would change the label values), a 3D one NIfTI or NRRD.

    With ``--conf runtime onnx`` (:func:`lib.served.serving_runtime`) the network of inference and of uncertainty
    scoring (both call :meth:`_get_network`) is the chosen model file's onnxruntime export
    (:func:`lib.served.served_onnx`, written by the server when missing or stale); the preprocessing, inferer and
    postprocessing stay the bundle's, and :attr:`network` (the PyTorch network the start checks the weights against)
    is built as with PyTorch.

    Args:
        path: bundle folder.
        conf: the app settings.
        overrides: bundle config id -> value, applied after reading the inference config. Default ``None``.
        kwargs: passed to ``BundleInferTask``.
    """

    def __init__(self, path: str, conf: dict[str, str], overrides: dict[str, Any] | None = None, **kwargs: Any):
        self.overrides = dict(overrides or {})
        self.runtime = serving_runtime(conf)
        self._onnx_networks: dict[str, tuple[tuple[int, int], Any]] = {}
        kwargs.setdefault("load_strict", True)
        super().__init__(path, conf, **kwargs)
        self.input_rank = 3
        if self.is_valid():
            # the rank of what a client sends (a slice-wise 3D bundle takes volumes although its network is 2D)
            self.input_rank = input_rank(path)
            self.dimension = self.input_rank
            if self.runtime == "onnx" and os.path.isfile(os.path.join(path, "models", DEFAULT_WEIGHTS)):
                try:  # the export is made (or found) at start, not at the first click
                    self._served_network("cpu", None, DEFAULT_WEIGHTS)
                except (OSError, ValueError) as e:
                    raise ValueError(f"--conf runtime onnx: the served model of {os.path.basename(path)!r} cannot be "
                                     f"exported: {e}") from None  # fmt: skip

    def _load_bundle_config(self, path: str, config: str) -> ConfigParser:
        parser = super()._load_bundle_config(path, config)
        if self.overrides:
            parser.update(settings_overrides(parser.config, self.overrides))
        return parser

    def _get_network(self, device: str, data: Any) -> Any:
        """MONAI Label's network loading, with the request's ``model_filename`` confined to the bundle's
        ``models/`` folder: a name of :func:`weight_files` (default ``model.pt``); a path or an unknown name is
        answered with HTTP 422 and :func:`unknown_weights` (MONAI Label would join it to the folder unchecked, load
        any file of the server, or silently fall back); a file that does not fit the network: 422 naming it."""
        if not data or not self._config.get("model_filename"):
            return self._served_network(device, data, DEFAULT_WEIGHTS)
        value = data.get("model_filename")
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        value = value if value not in (None, "") else DEFAULT_WEIGHTS
        if not isinstance(value, str) or value not in weight_files(self.bundle_path):
            raise HTTPException(status_code=422, detail=unknown_weights(self.bundle_path))
        try:
            return self._served_network(device, {**data, "model_filename": value}, value)
        except Exception as e:
            if value == DEFAULT_WEIGHTS:
                raise
            raise HTTPException(
                status_code=422, detail=f"model_filename {value!r} does not fit the network of this model"
            ) from e

    def _served_network(self, device: str, data: Any, name: str) -> Any:
        """MONAI Label's network (PyTorch) or, with ``--conf runtime onnx``, the onnxruntime export of the model file
        ``name`` in ``models/`` (kept while the model file's size and time stay the same)."""
        if self.runtime != "onnx":
            return super()._get_network(device, data)
        model_file = os.path.join(self.bundle_path, "models", name)
        stat = os.stat(model_file)
        stamp = (stat.st_size, stat.st_mtime_ns)
        cached = self._onnx_networks.get(name)
        if cached is None or cached[0] != stamp:
            cached = (stamp, served_onnx(model_file))
            self._onnx_networks[name] = cached
        return cached[1]

    def image_loader(self) -> Any:
        """The bundle's own ``LoadImaged`` (the first of its preprocessing), or None."""
        for key in self.const.key_preprocessing():
            if self.bundle_config.get(key):
                transforms = self.bundle_config.get_parsed_content(key, instantiate=True)
                for t in getattr(transforms, "transforms", transforms):
                    if isinstance(t, LoadImaged):
                        return t
        return None

    def post_transforms(self, data: Any = None) -> list:
        post = list(super().post_transforms(data))
        if self.add_post_restore:
            post.append(DropSingletonChanneld(keys=self.key_pred, ref_image=self.key_image))
        return post

    def label_extension(self, data: dict[str, Any]) -> str:
        """The label file's extension: ``.png`` for a 2D model; for a volume model the requested or the input's
        extension when it is lossless (NIfTI, NRRD), else ``.nii.gz``."""
        if self.input_rank == 2:
            return LABEL_EXTENSION_2D
        for candidate in (data.get("result_extension"), data.get("image_path")):
            ext = _extension(candidate) if isinstance(candidate, str) else ""
            if ext:
                return ext
        return LABEL_EXTENSIONS_3D[0]

    def writer(self, data: dict[str, Any], extension: str | None = None, dtype: Any = None) -> tuple[Any, Any]:
        # label maps are small integers: uint8 keeps the files small and PNG (2D images) cannot hold float32; the
        # extension is never taken from a lossy input or request (a JPEG label map would hold other values)
        data["result_extension"] = self.label_extension(data)
        return super().writer(data, extension=None, dtype=dtype or data.get("result_dtype") or np.uint8)
