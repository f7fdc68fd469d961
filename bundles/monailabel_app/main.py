"""MONAI Label app that serves the SpectraFlow bundles of this repository.

SpectraFlow (Chen, Wang, Zou, Wu, *SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical
Image Segmentation*) is packaged as MONAI bundles in the folder next to this app (``bundles/``). This app registers,
for every selected bundle, MONAI Label's ``BundleInferTask`` (automatic segmentation) and ``BundleTrainTask``
(fine-tuning from the labels saved in the datastore, ``labels/final``), and nothing that needs the network: no model
zoo look-up, no download, no SAM2.

Start it with::

    monailabel start_server --app bundles/monailabel_app --studies /data/studies \\
        --conf models spectraflow_synapse_segmentation,spectraflow_2d_segmentation

Settings (``--conf KEY VALUE``):

- ``models``: comma-separated bundle names (default: every bundle found in ``bundles_dir``). A name that is not a
  bundle there stops the server with the list of the bundles that are.
- ``bundles_dir``: folder that holds the bundles (default: the parent folder of this app, i.e. ``bundles/``).
- ``overrides``: a JSON object of bundle config ids and values applied to every served bundle, for both inference
  and training, in the same form as ``python -m monai.bundle run --<id> <value>``; use it to serve a model trained
  with non-default network settings, e.g. ``'{"encoder_name": "vit_base_patch14_dinov2"}'``.
- ``overrides.<bundle name>``: the same for one bundle (applied after ``overrides``).
- ``skip_trainers``: ``true`` to register no training task.
- ``preload``: ``true`` to load the networks at start-up instead of at the first request.

A bundle needs ``models/model.pt`` (a state dict, as written by its ``configs/train.yaml``) to infer; a bundle
without it is served for training only, and an inference request for it is answered with HTTP 404 and the reason.
Bad requests are answered with a 4xx status and a message (unknown model: 404, unknown image id: 404, a file that
cannot be read as an image: 415, a 2D image sent to a volume model or the reverse: 422) and the server keeps
serving.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import numpy as np
import torch
from fastapi import HTTPException
from monai.bundle import ConfigParser
from monai.data import MetaTensor
from monai.transforms import LoadImage, LoadImaged, MapTransform

import monailabel
from monailabel.datastore.local import LocalDatastore
from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.infer_v2 import InferTask
from monailabel.interfaces.tasks.strategy import Strategy
from monailabel.interfaces.tasks.train import TrainTask
from monailabel.tasks.activelearning.first import First
from monailabel.tasks.activelearning.random import Random
from monailabel.tasks.infer.bundle import BundleInferTask
from monailabel.tasks.train.bundle import BundleTrainTask
from monailabel.utils.others.generic import strtobool

import spectraflow_monai

__all__ = [
    "DropSingletonChanneld",
    "SpectraFlowApp",
    "SpectraFlowInferTask",
    "SpectraFlowTrainTask",
    "find_bundles",
    "image_problem",
    "parse_overrides",
]

logger = logging.getLogger(__name__)

INFER_CONFIGS = ("inference.json", "inference.yaml")
_MAX_REASON = 400


def find_bundles(bundles_dir: str) -> dict[str, str]:
    """Bundles in ``bundles_dir``: sub-folders with ``configs/metadata.json`` and an inference config.

    Args:
        bundles_dir: folder to search (not recursive).

    Returns:
        bundle name -> absolute bundle path, sorted by name.
    """
    if not os.path.isdir(bundles_dir):
        raise ValueError(f"bundles_dir {bundles_dir!r} is not a folder.")
    found = {}
    for name in sorted(os.listdir(bundles_dir)):
        path = os.path.join(bundles_dir, name)
        configs = os.path.join(path, "configs")
        if os.path.isfile(os.path.join(configs, "metadata.json")) and any(
            os.path.isfile(os.path.join(configs, c)) for c in INFER_CONFIGS
        ):
            found[name] = os.path.abspath(path)
    return found


def parse_overrides(conf: dict[str, str], name: str) -> dict[str, Any]:
    """Bundle config overrides for bundle ``name`` from the app settings ``overrides`` and ``overrides.<name>``.

    Args:
        conf: the app settings (``--conf KEY VALUE`` pairs, values are strings).
        name: bundle name.

    Returns:
        config id -> value; ``overrides.<name>`` wins over ``overrides``.
    """
    merged: dict[str, Any] = {}
    for key in ("overrides", f"overrides.{name}"):
        text = conf.get(key)
        if not text:
            continue
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as e:
            raise ValueError(f"--conf {key} must be a JSON object of bundle config ids and values, got {text!r} ({e}).")
        if not isinstance(value, dict):
            raise ValueError(f"--conf {key} must be a JSON object of bundle config ids and values, got {text!r}.")
        if "bundle_root" in value:
            raise ValueError(f"--conf {key} must not set 'bundle_root': the app sets it to the bundle folder.")
        merged.update(value)
    return merged


def _short(exc: BaseException) -> str:
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
        return 415, _short(e)
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


def _has_volume_format(bundle_path: str) -> bool:
    return bool((_metadata(bundle_path).get("volume_data_format") or {}).get("inputs"))


def _image_id(path: str) -> str:
    name = os.path.basename(path)
    for ext in (".nii.gz", ".nii", ".nrrd", ".png", ".jpg", ".jpeg"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return os.path.splitext(name)[0]


def _input_rank(bundle_path: str) -> int:
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


def _state_dict(path: str) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("model"), dict):
        checkpoint = checkpoint["model"]
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path} is not a state dict (got {type(checkpoint).__name__}).")
    return checkpoint


def _check_weights(path: str, network: torch.nn.Module, name: str) -> None:
    """Fail at start-up, naming the file and the keys, when ``model.pt`` does not fit the configured network."""
    state = _state_dict(path)
    expected = network.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or wrong:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)):
            if keys:
                parts.append(f"{label}: {keys[:5]}{' ...' if len(keys) > 5 else ''} ({len(keys)})")
        raise ValueError(
            f"{path} does not fit the network of bundle {name!r} ({'; '.join(parts)}). Serve it with the network "
            'settings it was trained with, e.g. --conf overrides \'{"encoder_name": ..., "encoder_kwargs": ...}\'.'
        )


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
    size (2D images included).

    Args:
        path: bundle folder.
        conf: the app settings.
        overrides: bundle config id -> value, applied after reading the inference config. Default ``None``.
        kwargs: passed to ``BundleInferTask``.
    """

    def __init__(self, path: str, conf: dict[str, str], overrides: dict[str, Any] | None = None, **kwargs: Any):
        self.overrides = dict(overrides or {})
        kwargs.setdefault("load_strict", True)
        super().__init__(path, conf, **kwargs)
        if self.is_valid():
            # the rank of what a client sends (a slice-wise 3D bundle takes volumes although its network is 2D)
            self.input_rank = _input_rank(path)
            self.dimension = self.input_rank

    def _load_bundle_config(self, path: str, config: str) -> ConfigParser:
        parser = super()._load_bundle_config(path, config)
        if self.overrides:
            parser.update(self.overrides)
        return parser

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

    def writer(self, data: dict[str, Any], extension: str | None = None, dtype: Any = None) -> tuple[Any, Any]:
        # label maps are small integers: uint8 keeps the files small and PNG (2D images) cannot hold float32
        return super().writer(data, extension=extension, dtype=dtype or data.get("result_dtype") or np.uint8)


class SpectraFlowTrainTask(BundleTrainTask):
    """``BundleTrainTask`` with bundle config overrides (MONAI Label's own data/epochs/device settings win).

    Args:
        path: bundle folder.
        conf: the app settings.
        overrides: bundle config id -> value, passed to ``monai.bundle.run``. Default ``None``.
        kwargs: passed to ``BundleTrainTask``.
    """

    def __init__(self, path: str, conf: dict[str, str], overrides: dict[str, Any] | None = None, **kwargs: Any):
        self.overrides = dict(overrides or {})
        kwargs.setdefault("load_strict", True)
        super().__init__(path, conf, **kwargs)
        self.volume_input = _has_volume_format(path)

    def _load_bundle_config(self, path: str, config: str) -> ConfigParser:
        parser = super()._load_bundle_config(path, config)
        if self.overrides:
            parser.update(self.overrides)
        return parser

    def _load_checkpoint(self, model_pytorch: str, pretrained: bool, train_handlers: list) -> None:
        # MONAI Label's version expects every handler to be a dict (the bundles also list '@id' references) and
        # fails for pretrained=False; fine-tuning starts from models/<model_filename> when it exists
        if not pretrained or not os.path.isfile(model_pytorch):
            return
        for handler in train_handlers:
            if isinstance(handler, dict) and str(handler.get("_target_", "")).endswith("CheckpointLoader"):
                return
        logger.info(f"Fine-tuning from {model_pytorch}")
        train_handlers.insert(
            0,
            {
                "_target_": "CheckpointLoader",
                "load_path": model_pytorch,
                "load_dict": {self.model_dict_key: f"$@{self.const.key_network()}"},
                "strict": self.load_strict,
                "map_location": "cpu",
            },
        )

    def _config_value(self, key: str, default: Any) -> Any:
        return self.bundle_config.get_parsed_content(key) if key in self.bundle_config else default

    def _to_bundle_data(self, datalist: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Datastore pairs -> the entries the bundle's training reads.

        The datastore holds label maps (0 background, 1..N classes). A slice-wise bundle (its metadata has
        ``volume_data_format``: 3D volumes in, a 2D network) trains on cached axial slices, extracted once per
        volume with :func:`spectraflow_monai.data.extract_slices` (labels kept as they are, they are already the
        bundle's classes); a 2D bundle reads the images directly, with foreground = label >= 1.
        """
        if not datalist:
            return datalist
        if self.volume_input:
            from spectraflow_monai.data import extract_slices

            image_size = int(self._config_value("image_size", 224))
            entries = [{"image": d["image"], "label": d["label"], "case": _image_id(d["image"])} for d in datalist]
            return extract_slices(
                entries,
                os.path.join(self.bundle_path, "cache", f"monailabel_{image_size}"),
                window=self._config_value("hu_window", (-125.0, 275.0)),
                spatial_size=(image_size, image_size),
                map_labels=False,
                progress=False,
            )
        return [dict(d, label_threshold=1) for d in datalist]

    def _update_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        for key, value in self.overrides.items():
            overrides.setdefault(key, value)
        for key in (self.const.key_train_dataset_data(), self.const.key_validate_dataset_data()):
            if key in overrides:
                overrides[key] = self._to_bundle_data(overrides[key])
        return overrides


class _CheckedLocalDatastore(LocalDatastore):
    """Local datastore that refuses an uploaded image MONAI cannot read (HTTP 415) instead of storing it."""

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        problem = image_problem(image_filename)
        if problem is not None:
            raise HTTPException(status_code=415, detail=f"the upload is not a readable image ({problem[1]})")
        return super().add_image(image_id, image_filename, image_info)


class SpectraFlowApp(MONAILabelApp):
    """MONAI Label app serving the SpectraFlow bundles (automatic segmentation and fine-tuning).

    Args:
        app_dir: this app's folder.
        studies: the datastore (a local folder of images with ``labels/final``, or a DICOMweb URL).
        conf: settings, see the module docstring.
    """

    def __init__(self, app_dir: str, studies: str, conf: dict[str, str]):
        conf = dict(conf or {})
        self.bundles_dir = os.path.abspath(conf.get("bundles_dir") or os.path.join(app_dir, os.pardir))
        available = find_bundles(self.bundles_dir)
        requested = [m.strip() for m in (conf.get("models") or "").split(",") if m.strip()]
        if not requested:
            requested = list(available)
        unknown = [m for m in requested if m not in available]
        if unknown:
            raise ValueError(
                f"--conf models: {unknown} not found in {self.bundles_dir} (bundles there: {sorted(available)}). "
                "This app serves local bundles only and downloads nothing."
            )
        if not requested:
            raise ValueError(f"no bundle (configs/metadata.json + configs/inference.*) found in {self.bundles_dir}.")
        self.bundles = {m: available[m] for m in requested}
        self.overrides = {m: parse_overrides(conf, m) for m in self.bundles}
        self.untrained: dict[str, str] = {}
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="SpectraFlow segmentation",
            description="SpectraFlow bundles (DINOv2 + MeanFlow/dispersive pretraining, DAF/FDConv decoder)",
            version=f"{spectraflow_monai.__version__} (MONAI Label {monailabel.__version__})",
        )

    # ------------------------------------------------------------------ tasks
    def init_datastore(self) -> Datastore:
        if self.studies.startswith(("http://", "https://")):
            return super().init_datastore()
        from monailabel.config import settings

        return _CheckedLocalDatastore(
            self.studies,
            extensions=settings.MONAI_LABEL_DATASTORE_FILE_EXT,
            auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
            read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY,
        )

    def init_infers(self) -> dict[str, InferTask]:
        infers: dict[str, InferTask] = {}
        for name, path in self.bundles.items():
            model_pt = os.path.join(path, "models", "model.pt")
            model_ts = os.path.join(path, "models", "model.ts")
            if not (os.path.isfile(model_pt) or os.path.isfile(model_ts)):
                self.untrained[name] = (
                    f"bundle {name!r} has no trained weights ({model_pt} is missing): train it first "
                    f"(POST /train/{name}, or configs/train.yaml with --bundle_root {path}) or copy a model.pt there"
                )
                logger.warning(f"+++ {self.untrained[name]}; serving it for training only")
                continue
            task = SpectraFlowInferTask(path, self.conf, overrides=self.overrides[name])
            if not task.is_valid():
                raise ValueError(f"bundle {name!r} at {path} cannot be served for inference (see the log above).")
            if os.path.isfile(model_pt):
                _check_weights(model_pt, task.network, name)
            logger.info(f"+++ Adding Inferer:: {name} => {path} (labels {task.labels})")
            infers[name] = task
        return infers

    def init_trainers(self) -> dict[str, TrainTask]:
        trainers: dict[str, TrainTask] = {}
        if strtobool(self.conf.get("skip_trainers", "false")):
            return trainers
        for name, path in self.bundles.items():
            task = SpectraFlowTrainTask(path, self.conf, overrides=self.overrides[name])
            if task.is_valid():
                logger.info(f"+++ Adding Trainer:: {name} => {path}")
                trainers[name] = task
        return trainers

    def init_strategies(self) -> dict[str, Strategy]:
        return {"random": Random(), "first": First()}

    # ------------------------------------------------------------------ requests
    def infer(self, request: dict[str, Any], datastore: Datastore | None = None) -> dict[str, Any]:
        """``MONAILabelApp.infer`` answering bad requests with 4xx ``HTTPException`` s instead of server errors."""
        model = request.get("model")
        if model not in self._infers:
            if model in self.untrained:
                raise HTTPException(status_code=404, detail=self.untrained[model])
            raise HTTPException(
                status_code=404, detail=f"model {model!r} is not loaded; loaded models: {sorted(self._infers)}"
            )
        datastore = datastore if datastore else self.datastore()
        image = request.get("image")
        path = None
        if isinstance(image, str):
            if not image:
                raise HTTPException(status_code=400, detail="no image: give an image id, a file or a session id")
            path = image if os.path.exists(image) else datastore.get_image_uri(image)
            if not path:
                raise HTTPException(status_code=404, detail=f"image {image!r} is not in the datastore ({self.studies})")
        try:
            return super().infer(request, datastore)
        except HTTPException:
            raise
        except Exception:
            if path is not None:
                task = self._infers[model]
                loader = task.image_loader() if isinstance(task, SpectraFlowInferTask) else None
                if path == image and os.path.dirname(os.path.abspath(path)) == os.path.abspath(tempfile.gettempdir()):
                    shown = "the uploaded file"
                else:
                    shown = f"image {image!r}"
                problem = image_problem(path, loader, getattr(task, "input_rank", None))
                if problem is not None and problem[0] == 415:
                    detail = f"{shown} cannot be read as an image by model {model!r} ({problem[1]})"
                    raise HTTPException(status_code=415, detail=detail)
                if problem is not None:
                    detail = f"{shown} does not suit model {model!r}: {problem[1]}"
                    raise HTTPException(status_code=problem[0], detail=detail)
            raise
