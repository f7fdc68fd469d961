"""MONAI Label app that serves the SpectraFlow bundles of this repository.

SpectraFlow (Chen, Wang, Zou, Wu, *SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical
Image Segmentation*) is packaged as MONAI bundles in the folder next to this app (``bundles/``). This app registers,
for every selected bundle, MONAI Label's ``BundleInferTask`` (automatic segmentation) and ``BundleTrainTask``
(fine-tuning from the labels saved in the datastore, ``labels/final``), and nothing that needs the network: no model
zoo look-up, no download, no SAM2.

Start it with::

    monailabel start_server --app bundles/monailabel_app --studies /data/studies \\
        --conf models spectraflow_synapse_segmentation,spectraflow_2d_segmentation

or on a PACS (a DICOMweb server; docs/monailabel.md, "Serving from a PACS"; ``lib/dicomweb.py``)::

    monailabel start_server --app bundles/monailabel_app --studies http://127.0.0.1:8042/dicom-web \\
        --conf models spectraflow_synapse_segmentation

Settings (``--conf KEY VALUE``):

- ``models``: comma-separated bundle names (default: every bundle found in ``bundles_dir``). A name that is not a
  bundle there stops the server with the list of the bundles that are.
- ``bundles_dir``: folder that holds the bundles (default: the parent folder of this app, i.e. ``bundles/``).
- ``model_dir``: where the server keeps its own copy of each served bundle (default: ``model/`` inside this app's
  folder). The server never reads configs from the installed bundle while serving nor writes to it: at every start
  ``<model_dir>/<bundle>/configs`` is made identical to the installed bundle's, and the installed ``models/`` files
  the copy lacks are copied (``lib/served.py``); the copy's ``models/model.pt`` is the served model, which every
  training request replaces. It must not overlap the studies folder.
- ``overrides``: a JSON object of bundle config ids and values applied to every served bundle, for both inference
  and training, in the same form as ``python -m monai.bundle run --<id> <value>``; use it to serve a model trained
  with non-default network settings, e.g. ``'{"encoder_name": "vit_base_patch14_dinov2"}'``.
- ``overrides.<bundle name>``: the same for one bundle (applied after ``overrides``).
- ``pretrained_weights``, ``encoder_init``: the encoder weights training starts from, passed to every bundle's
  training as the bundle settings of the same name (README "Encoder weights"): ``pretrained_weights`` is ``timm``,
  a DINOv2 checkpoint file on the server or ``none``; ``encoder_init`` is ``auto`` (the bundle's
  ``models/encoder_stage1.pt`` when it exists, else ``pretrained_weights``), ``stage1`` (that export; an error when
  it is missing), ``pretrained`` or ``random``. Left out: the bundle's values (``timm`` / ``auto``).
  A fine-tuning run that starts from ``models/model.pt`` loads it after this initialisation.
- ``precision``: the bundles' numeric precision setting for inference and training (README "Precision"):
  ``auto`` (the bundles' default: bfloat16 on a CPU with native bfloat16 and on a GPU that supports it, float16
  with a gradient scaler on an older GPU, else float32), ``bf16``, ``fp16`` (CUDA only) or ``fp32``. A training
  request may choose its own (option ``precision``); the choice is logged by every run.
- ``skip_trainers``: ``true`` to register no training task (training disabled: ``/train`` answers 404).
- ``max_upload_mb``: the largest upload in MB (default 2048); a larger one is answered with 413 before it is kept.
- ``allow_empty_masks``: ``true`` to train on datastore labels that are all background (with a warning) instead of
  answering the training request with 422.
- ``preload``: ``true`` to load the networks at start-up instead of at the first request.
- ``kept_model_backups``: model backups (``models/<file>.bak-<date>-<time>``) the served copy keeps per file
  (default 2; an integer >= 0): older ones are removed at start and after each training run (``lib/served.py``),
  only those the bundle runs made (recorded when made); a file, folder or link only named like one is left alone.
- ``dicomweb_cache_series`` (a PACS): series without a label its cache keeps (default 16; the least recently used
  go first). ``scoring_max_series`` (a PACS): series one scoring request retrieves and scores at most (default 8);
  on a PACS scoring never starts by itself (each series scored is one retrieved), and nothing is retrieved that no
  request names. DICOM SEG is written and read by ``spectraflow_monai.data.dicom_seg`` (the bundles' converter);
  dcmqi's ``itkimage2segimage``, which MONAI Label's start asks for, comes from PATH, the app's ``bin/`` or the PyPI
  wheel ``dcmqi`` (the ``label`` extra), never downloaded (``lib/dicomseg.py``).
- ``scoring_max_seconds``, ``scoring_batch_size``, ``uncertainty_hold_seconds``: the uncertainty scoring's time
  budget per run (default 600 s), images or slices per forward pass (default 2 on a CPU, 8 on a GPU; each pass holds
  four flips of each), and how long the ``uncertainty`` strategy holds back an image it or another strategy served
  (default 86400 s, a day, as MONAI Label's Epistemic strategy); docs/monailabel.md, "Next sample by uncertainty".

A bundle needs ``models/model.pt`` (a state dict, as written by its ``configs/train.yaml``) to infer; a bundle without
it is served for training only (an inference request is answered with HTTP 404 and the reason) until a training request
has written it. Every training request is a new run on the datastore's current labels, from the served ``model.pt``
(``pretrained``, default) or the bundle's initial weights; its best model then replaces the served one and the log says
so (``lib/trainers.py``). Bad requests are answered with a 4xx status and a message (unknown model: 404, unknown image
id or label: 404, a file that cannot be read as an image or has no image extension: 415, an upload over
``max_upload_mb``: 413, a 2D image sent to a volume model or the reverse: 422, a training or inference option that is
not accepted: 422, weights that do not fit the network their record describes or cannot serve (sparse, meta, quantized,
NaN, all zero), weights without their record, a record written for other weights or edited: 422, a served model whose
files on disk are not a pair: 503, a label map of another size than its image or, for a volume, with values that are no
class: 422, a series the PACS does not list: 404, an image uploaded again at another
size (with labels) or extension: 409, an info over 64 KB: 413, a task body with NaN / Infinity or a key that is not an
option (``bundle_path`` included): 422, over 64 KB: 413, a scoring request while a run runs: 429, ``params`` / ``info``
with NaN, Infinity or nesting deeper than 32: 422, a split that leaves no validation pair or too few training pairs:
422, an unknown active learning strategy, scoring method or batch inference model: 404) and the server keeps serving.
Every upload's temporary file is removed whatever the answer (``lib/uploads.py``); an uploaded model (a ZIP of
``model.pt`` and its ``model.json``) replaces the served pair once it is checked, the previous pair kept as
``models/model.pt.previous`` / ``models/model.json.previous``; scoring runs in the server process, one run at a time,
and the server is the only writer of the datastore's record (``lib/scoring_runs.py``, ``lib/datastore.py``); the folders
of stopped training runs are removed at start and before each run (a run of another host or PID namespace once its
heartbeat is 15 minutes old); sessions live at most a day, and only the session folders the app created (marked) are
ever removed (``lib/sessions.py``).

What a client may send (``lib/checks.py``): an image is the id of a datastore image, a file uploaded with the
request, or the image of its session; a server-side path is answered exactly as an unknown id (404, same body).
Datastore ids are plain names and label tags ``final``, ``original`` or a simple name, on every datastore route
(else 400, nothing read or written). ``model_filename`` names a ``.pt`` file of the bundle's ``models/`` folder (else
one and the same 422 answer). A training request may set only the options of ``lib.trainers.TRAIN_OPTIONS`` (types
and ranges checked), never a string that the bundle config parser would evaluate (``$``, ``@``, ``%``,
``_target_``, ...). No answer shows a server path. Label maps are written losslessly (PNG for 2D images, JPEG inputs
included; NIfTI/NRRD for volumes). See docs/monailabel.md, "Serving safely".
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
from typing import Any

import torch
from fastapi import HTTPException

import monailabel
from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.infer_v2 import InferTask
from monailabel.interfaces.tasks.scoring import ScoringMethod
from monailabel.interfaces.tasks.strategy import Strategy
from monailabel.interfaces.tasks.train import TrainTask
from monailabel.tasks.activelearning.first import First
from monailabel.utils.others.generic import file_checksum, strtobool

import spectraflow_monai
from spectraflow_monai.utils.errors import DataError, SettingError
from spectraflow_monai.utils.fingerprint import file_digest
from spectraflow_monai.utils.run_record import MODEL_DIGEST_KEY, SETTINGS_DIGEST_KEY, check_model_digest
from spectraflow_monai.utils.settings import model_settings_path


def _import_lib() -> None:
    """Make ``lib`` (next to the real main.py, also when main.py is a link) importable, as MONAI Label apps do."""
    app_dir = os.path.dirname(os.path.realpath(__file__))
    loaded = sys.modules.get("lib")
    if loaded is not None and os.path.dirname(os.path.realpath(getattr(loaded, "__file__", "") or "")) != os.path.join(
        app_dir, "lib"
    ):
        for name in [n for n in sys.modules if n == "lib" or n.startswith("lib.")]:
            del sys.modules[name]
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)


_import_lib()

from lib.checks import (  # noqa: E402
    check_id,
    check_tag,
    client_request,
    redact_paths,
    resolve_image,
)
from lib.datastore import CheckedLocalDatastore  # noqa: E402
from lib.dicomseg import bundle_classes, provide_dcmqi  # noqa: E402
from lib.dicomweb import DEFAULT_CACHE_SERIES, CheckedDICOMWebDatastore  # noqa: E402
from lib.infers import (  # noqa: E402
    DEFAULT_WEIGHTS,
    DropSingletonChanneld,
    SpectraFlowInferTask,
    image_problem,
    input_rank,
    short_reason,
)
from lib.options import check_infer_options  # noqa: E402
from lib.scoring import (  # noqa: E402
    SCORING_NAME,
    STRATEGY_NAME,
    ServedLongestAgoRandom,
    UncertaintyScoring,
    UncertaintyStrategy,
    default_device,
    scoring_settings,
)
from lib.scoring_runs import ScoringRuns  # noqa: E402
from lib.served import (  # noqa: E402
    check_apart,
    kept_backups,
    replace_served_pair,
    served_copy,
    set_aside_served_model,
)
from lib.sessions import CappedSessions  # noqa: E402
from lib.trainers import (  # noqa: E402
    TRAIN_OPTIONS,
    SpectraFlowTrainTask,
    check_train_options,
    precision_setting,
    weight_settings,
)
from lib.uploads import DEFAULT_MAX_UPLOAD_MB, install_server_checks, unpack_model_pair  # noqa: E402

__all__ = [
    "DropSingletonChanneld",
    "SpectraFlowApp",
    "SpectraFlowInferTask",
    "SpectraFlowTrainTask",
    "TRAIN_OPTIONS",
    "check_id",
    "check_tag",
    "check_train_options",
    "client_request",
    "find_bundles",
    "image_problem",
    "parse_overrides",
    "redact_paths",
    "served_copy",
]

logger = logging.getLogger(__name__)

INFER_CONFIGS = ("inference.json", "inference.yaml")


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


def _max_upload_bytes(conf: dict[str, Any]) -> int:
    """``--conf max_upload_mb`` (default :data:`lib.uploads.DEFAULT_MAX_UPLOAD_MB`) in bytes."""
    text = conf.get("max_upload_mb")
    try:
        value = float(text) if text not in (None, "") else DEFAULT_MAX_UPLOAD_MB
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--conf max_upload_mb must be a number of megabytes > 0, got {text!r}.")
    return int(value * 1e6)


def _positive_int(conf: dict[str, Any], key: str, default: int) -> int:
    """``--conf <key>`` as an integer >= 1 (``default`` when left out)."""
    text = conf.get(key)
    try:
        value = int(text) if text not in (None, "") else default
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise ValueError(f"--conf {key} must be an integer >= 1, got {text!r}.")
    return value


def weights_problem(path: str, network: torch.nn.Module) -> str | None:
    """Why the file at ``path`` cannot be loaded into ``network``, or None when it fits.

    The file is loaded weights-only (``torch.load(..., weights_only=True)``: no pickled code runs) and must hold a
    state dict (or ``{"model": state dict}``) with exactly the network's keys and shapes.

    Args:
        path: the weight file.
        network: the served network.

    Returns:
        the reason (naming no path), or None.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # every load failure means "not a weights-only PyTorch file"
        return f"it is not a weights-only PyTorch checkpoint ({redact_paths(short_reason(e))})"
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("model"), dict):
        checkpoint = checkpoint["model"]
    if not isinstance(checkpoint, dict) or not all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return f"it holds a {type(checkpoint).__name__}, not a state dict of tensors"
    expected = network.state_dict()
    missing = sorted(set(expected) - set(checkpoint))
    unexpected = sorted(set(checkpoint) - set(expected))
    wrong = sorted(k for k in set(checkpoint) & set(expected) if tuple(checkpoint[k].shape) != tuple(expected[k].shape))
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)):
        if keys:
            parts.append(f"{label}: {keys[:5]}{' ...' if len(keys) > 5 else ''} ({len(keys)})")
    if parts:
        return f"it does not fit the served network ({'; '.join(parts)})"
    return _tensor_problem(checkpoint, expected)


def _number_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "complex" if dtype.is_complex else "float" if dtype.is_floating_point else "integer"


def _tensor_problem(checkpoint: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> str | None:
    """Why tensors of the right names and shapes still cannot be served: a storage the network cannot compute with
    (sparse, meta, quantized), another kind of number (bool, integer or complex for a float weight), NaN or
    infinite values, or weights that are all zero (an untrained or wiped model)."""
    kinds: dict[str, list[str]] = {}
    nonzero = False
    for key in sorted(expected):
        tensor, wanted = checkpoint[key], expected[key]
        if tensor.layout != torch.strided or tensor.is_meta or tensor.is_quantized:
            kinds.setdefault("not a dense tensor with values (sparse, meta or quantized)", []).append(key)
        elif _number_kind(tensor.dtype) != _number_kind(wanted.dtype):
            kinds.setdefault(f"of another number type than the network's ({wanted.dtype})", []).append(key)
        elif tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
            kinds.setdefault("holding NaN or infinite values", []).append(key)
        elif tensor.dtype.is_floating_point and bool(tensor.any()):
            nonzero = True
    parts = [
        f"{len(keys)} tensor(s) {kind}: {keys[:3]}{' ...' if len(keys) > 3 else ''}"
        for kind, keys in kinds.items()
    ]
    if parts:
        return f"it cannot be served ({'; '.join(parts)})"
    if not nonzero and any(t.dtype.is_floating_point for t in expected.values()):
        return "it cannot be served (every weight is zero: an untrained or wiped model)"
    return None


def _check_weights(path: str, network: torch.nn.Module, name: str) -> None:
    """Fail at start-up, naming the file and the keys, when ``model.pt`` does not fit the configured network."""
    problem = weights_problem(path, network)
    if problem is not None:
        raise ValueError(
            f"{path} does not fit the network of bundle {name!r}: {problem}. Serve it with the network "
            'settings it was trained with, e.g. --conf overrides \'{"encoder_name": ..., "encoder_kwargs": ...}\'.'
        )


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
        # the server's own copy of each bundle (lib/served.py): configs mirrored from the installed bundle at every
        # start, the served model.pt, and everything a training run writes; never a folder requests write to
        self.installed = {m: available[m] for m in requested}
        self.model_dir = os.path.abspath(conf.get("model_dir") or os.path.join(app_dir, "model"))
        check_apart(self.model_dir, "--conf model_dir", studies)
        for name, path in self.installed.items():
            check_apart(path, f"bundle {name!r}", studies)
        self.kept_backups = kept_backups(conf)
        self.bundles = {
            m: served_copy(path, os.path.join(self.model_dir, m), self.kept_backups)
            for m, path in self.installed.items()
        }
        self.overrides = {m: parse_overrides(conf, m) for m in self.bundles}
        self.weight_settings = weight_settings(conf)
        self.precision = precision_setting(conf)
        self.max_upload_bytes = _max_upload_bytes(conf)
        self.allow_empty_masks = strtobool(str(conf.get("allow_empty_masks", "false")))
        self.scoring_settings = scoring_settings(conf)
        self.cache_series = _positive_int(conf, "dicomweb_cache_series", DEFAULT_CACHE_SERIES)
        self.label_classes = self._volume_classes()
        self.untrained: dict[str, str] = {}
        self.unusable: dict[str, tuple[Any, str]] = {}  # bundle -> (stamp of its served pair, why it cannot serve)
        self._serving = threading.RLock()
        # scoring runs in this process, one at a time (lib/scoring_runs.py); MONAI Label's starts one at init
        self.scoring_runs = ScoringRuns(self._run_scoring)
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="SpectraFlow segmentation",
            description="SpectraFlow bundles (DINOv2 + MeanFlow/dispersive pretraining, DAF/FDConv decoder)",
            version=f"{spectraflow_monai.__version__} (MONAI Label {monailabel.__version__})",
        )

    def _volume_classes(self) -> dict[int, str]:
        """``{value: class name}`` of the served volume bundles' label maps (their ``channel_def``): what a volume's
        label values must be and what its DICOM SEG segments are named."""
        classes: dict[int, str] = {}
        for name, path in self.bundles.items():
            if input_rank(path) != 3:
                continue
            own = bundle_classes(path)
            clash = {v: (classes[v], n) for v, n in own.items() if v in classes and classes[v] != n}
            if clash:
                raise ValueError(f"bundle {name!r} names label values otherwise than another served volume bundle "
                                 f"({clash}): serve one of them (--conf models)")  # fmt: skip
            classes.update(own)
        return dict(sorted(classes.items()))

    def model_classes(self, model: str) -> dict[int, str]:
        """``{value: class name}`` of bundle ``model``'s label maps (its ``channel_def``, background left out)."""
        self.require_bundle(model)
        return bundle_classes(self.bundles[model])

    @property
    def remote(self) -> bool:
        """Whether the datastore is a PACS (DICOMweb): nothing is retrieved that no request names."""
        return bool(getattr(self._datastore, "remote", False))

    # ------------------------------------------------------------------ tasks
    def init_datastore(self) -> Datastore:
        from monailabel.config import settings

        if self.studies.startswith(("http://", "https://")):
            if settings.MONAI_LABEL_DATASTORE.lower() in ("xnat", "dsa"):
                return super().init_datastore()
            return self._dicomweb_datastore()
        store = CheckedLocalDatastore(
            self.studies,
            extensions=settings.MONAI_LABEL_DATASTORE_FILE_EXT,
            auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
            read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY,
        )
        store.label_classes = dict(self.label_classes)
        return store

    def _dicomweb_datastore(self) -> CheckedDICOMWebDatastore:
        """The PACS as MONAI Label reaches it (its client, credentials and prefixes: ``MONAI_LABEL_DICOMWEB_*``
        settings), served by :class:`lib.dicomweb.CheckedDICOMWebDatastore`; dcmqi found without a download."""
        from dicomweb_client import DICOMwebClient
        from monailabel.config import settings
        from monailabel.datastore.dicom import DICOMwebClientX
        from monailabel.interfaces import app as app_module

        self.studies = self.studies.rstrip("/").strip()
        self._download_dcmqi_tools()
        if "googleapis.com" in self.studies:
            client = DICOMwebClient(url=self.studies, session=app_module.create_session_from_gcp_credentials())
        else:
            session = None
            if settings.MONAI_LABEL_DICOMWEB_USERNAME and settings.MONAI_LABEL_DICOMWEB_PASSWORD:
                session = app_module.create_session_from_user_pass(
                    settings.MONAI_LABEL_DICOMWEB_USERNAME, settings.MONAI_LABEL_DICOMWEB_PASSWORD
                )
            client = DICOMwebClientX(
                url=self.studies,
                session=session,
                qido_url_prefix=settings.MONAI_LABEL_QIDO_PREFIX,
                wado_url_prefix=settings.MONAI_LABEL_WADO_PREFIX,
                stow_url_prefix=settings.MONAI_LABEL_STOW_PREFIX,
            )
        cache = (settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or "").strip() or None
        return CheckedDICOMWebDatastore(
            client,
            search_filter=settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER,
            classes=self.label_classes,
            cache_path=cache,
            fetch_by_frame=settings.MONAI_LABEL_DICOMWEB_FETCH_BY_FRAME,
            max_series=self.cache_series,
        )

    def _download_dcmqi_tools(self) -> None:
        """dcmqi's ``itkimage2segimage`` from PATH, the app's ``bin/`` or the ``dcmqi`` wheel; never downloaded
        (MONAI Label fetched it from GitHub at every start without it: offline, the start failed)."""
        tool = provide_dcmqi(self.app_dir)
        logger.info(f"+++ dcmqi for MONAI Label: {tool}")

    def _infer_task(self, name: str) -> SpectraFlowInferTask | None:
        """The inference task of bundle ``name`` (its served copy), or None when it has no weights yet."""
        path = self.bundles[name]
        model_pt = os.path.join(path, "models", "model.pt")
        if not (os.path.isfile(model_pt) or os.path.isfile(os.path.join(path, "models", "model.ts"))):
            # the answer names the file relative to the bundle; the server log has the folder
            self.untrained[name] = (
                f"bundle {name!r} has no trained weights (models/model.pt is missing): train it first "
                f"(POST /train/{name}) or put a model.pt into the installed bundle's models/ folder"
            )
            logger.warning(f"+++ {self.untrained[name]} ({path}); serving it for training only")
            return None
        stamp = self._pair_stamp(name)
        if os.path.isfile(model_pt):
            try:
                check_model_digest(model_pt)  # the record beside it was written for this very file
            except (SettingError, DataError) as e:
                raise ValueError(str(e)) from None
        task = SpectraFlowInferTask(path, self.conf, overrides={**self.overrides[name], **self.precision})
        if not task.is_valid():
            raise ValueError(f"bundle {name!r} at {path} cannot be served for inference (see the log above).")
        if os.path.isfile(model_pt):
            _check_weights(model_pt, task.network, name)
        task.served_stamp = stamp
        self.untrained.pop(name, None)
        precision = task.overrides.get("precision", "the bundle's setting")
        logger.info(f"+++ Adding Inferer:: {name} => {path} (labels {task.labels}; precision {precision})")
        return task

    def init_infers(self) -> dict[str, InferTask]:
        infers: dict[str, InferTask] = {}
        for name in self.bundles:
            task = self._infer_task(name)
            if task is not None:
                infers[name] = task
        return infers

    def init_trainers(self) -> dict[str, TrainTask]:
        trainers: dict[str, TrainTask] = {}
        if strtobool(self.conf.get("skip_trainers", "false")):
            return trainers
        weights = ", ".join(f"{k}={v}" for k, v in self.weight_settings.items()) or "the bundle's defaults"
        for name, path in self.bundles.items():
            overrides = {**self.overrides[name], **self.weight_settings, **self.precision}
            task = SpectraFlowTrainTask(path, self.conf, overrides=overrides)
            if task.is_valid():
                logger.info(f"+++ Adding Trainer:: {name} => {path} (encoder weights: {weights})")
                trainers[name] = task
        return trainers

    def init_strategies(self) -> dict[str, Strategy]:
        """MONAI Label's ``random`` (drawing alike when every image was just served: ``ServedLongestAgoRandom``) and
        ``first``, and ``uncertainty``: the unlabelled image the served model is least sure of (``lib/scoring.py``)."""
        hold = {k: v for k, v in self.scoring_settings.items() if k == "hold_seconds"}
        return {"random": ServedLongestAgoRandom(), "first": First(), STRATEGY_NAME: UncertaintyStrategy(**hold)}

    def init_scoring_methods(self) -> dict[str, ScoringMethod]:
        """``uncertainty``: the served models' uncertainty on every unlabelled image (``lib/scoring.py``), after each
        training and on request."""
        kwargs = {k: v for k, v in self.scoring_settings.items() if k != "hold_seconds"}
        return {SCORING_NAME: UncertaintyScoring(self.served_infer_tasks, device=default_device(), **kwargs)}

    def async_scoring(self, method: str | None, params: dict[str, Any] | None = None) -> Any:
        """The scoring run MONAI Label starts by itself (at start, after a training, after each *Next Sample*): in
        the server, a run of :attr:`scoring_runs` (``lib/scoring_runs.py``; while one runs, that one) unless no
        unlabelled image needs a new score. Outside the server (a training's task process) MONAI Label asks the
        server over HTTP; a server that cannot be reached is logged, never raised: the training that triggered it
        has succeeded."""
        if self.remote and method is None:
            logger.info(f"{SCORING_NAME}: not started by itself on a PACS (each series scored is one retrieved); POST "
                        f"/scoring/{SCORING_NAME} scores up to --conf scoring_max_series series")  # fmt: skip
            return {}
        if not self._server_mode:
            try:
                return super().async_scoring(method, params)
            except Exception as e:
                logger.warning(f"scoring was not started ({type(e).__name__}: {e}); POST /scoring/{SCORING_NAME} "
                               "starts it")  # fmt: skip
                return {}
        scoring = self._scoring_methods.get(SCORING_NAME)
        if not isinstance(scoring, UncertaintyScoring) or method not in (None, SCORING_NAME):
            return {}
        try:
            if method is None and scoring.pending(self.datastore()) == 0:
                logger.debug(f"{SCORING_NAME}: every unlabelled image is scored by the served model")
                return {}
        except Exception as e:  # a datastore that cannot be listed: the run reports it
            logger.warning(f"{SCORING_NAME}: could not count the images to score ({type(e).__name__}: {e})")
        record = self.scoring_runs.start({"method": SCORING_NAME, "force": False}, automatic=True)
        return record if method else {SCORING_NAME: record}

    def _run_scoring(self, request: dict[str, Any], stop: threading.Event) -> Any:
        """One scoring run of :attr:`scoring_runs`, in the server process, writing through the server's datastore."""
        scoring = self._scoring_methods[request["method"]]
        if isinstance(scoring, UncertaintyScoring):
            return scoring(request, self.datastore(), stop=stop)
        return scoring(request, self.datastore())

    def served_infer_tasks(self) -> dict[str, InferTask]:
        """The inference tasks of the bundles served now (a model trained or uploaded since start included)."""
        self._serve_trained()
        return dict(self._infers)

    def _load_sessions(self, load: bool = False) -> CappedSessions | None:
        """MONAI Label's sessions with a capped life (``lib/sessions.py``)."""
        if not load:
            return None
        from monailabel.config import settings

        return CappedSessions(settings.MONAI_LABEL_SESSION_PATH, settings.MONAI_LABEL_SESSION_EXPIRY)

    # ------------------------------------------------------------------ requests
    def _served_model(self, name: str) -> str:
        return os.path.join(self.bundles[name], "models", DEFAULT_WEIGHTS)

    def _pair_stamp(self, name: str) -> tuple[Any, ...]:
        """Size and modification time of the served ``models/model.pt`` and its record ``models/model.json``."""
        files = (self._served_model(name), model_settings_path(self._served_model(name)))
        stats = [os.stat(f) if os.path.isfile(f) else None for f in files]
        return tuple((st.st_size, st.st_mtime_ns, st.st_ino) if st is not None else None for st in stats)

    def _serve_trained(self) -> None:
        """Serve each bundle with the model and record it holds now: a bundle that had no weights at start once a
        training run or an upload has written them; a bundle whose ``model.pt`` or ``model.json`` changed is served
        anew from them (network, preprocessing: the record's); a bundle whose served model was deleted
        (``DELETE /model/<name>``) is served for training only; one whose model cannot be served (a record written
        for another model file, an edited record, a file that is not weights of the recorded network) answers 503
        naming why until a model is uploaded or trained."""
        with self._serving:  # requests and the scoring run ask at the same time: one rebuild
            self._serve_pairs()

    def _serve_pairs(self) -> None:
        for name in self.bundles:
            task = self._infers.get(name)
            stamp = self._pair_stamp(name)
            if task is not None and getattr(task, "served_stamp", stamp) == stamp:
                continue
            if task is None and name not in self.untrained and name not in self.unusable:
                continue  # a bundle this app does not serve for inference
            if name in self.unusable and self.unusable[name][0] == stamp:
                continue
            self._infers.pop(name, None)
            self.unusable.pop(name, None)
            if not os.path.isfile(self._served_model(name)) and task is not None:
                self.untrained[name] = (
                    f"model {name!r} has no served weights (models/model.pt was deleted): upload one "
                    f"(PUT /model/{name}) or train it (POST /train/{name})"
                )
                continue
            if not os.path.isfile(self._served_model(name)):
                continue
            try:
                task = self._infer_task(name)
            except Exception as e:  # the reason is answered (503) and logged; the server keeps serving
                reason = redact_paths(short_reason(e).split(": ", 1)[-1], {self.bundles[name]: name})
                logger.error(f"+++ {name}: the served model cannot be served: {e}")
                self.unusable[name] = (stamp, reason)
                continue
            if task is not None:
                self._infers[name] = task
                logger.info(f"+++ {name}: serving models/model.pt with its record models/model.json")

    def require_infer_model(self, model: Any) -> None:
        """HTTP 404 naming the loaded models unless ``model`` is served for inference; 503 naming why when its served
        model cannot be served (see :meth:`_serve_trained`)."""
        self._serve_trained()
        if isinstance(model, str) and model in self._infers:
            return
        if isinstance(model, str) and model in self.unusable:
            raise HTTPException(
                status_code=503,
                detail=f"model {model!r} cannot serve its models/model.pt: {self.unusable[model][1]}; upload a model "
                f"with its record (PUT /model/{model}) or train it (POST /train/{model})",
            )
        if isinstance(model, str) and model in self.untrained:
            raise HTTPException(status_code=404, detail=self.untrained[model])
        raise HTTPException(
            status_code=404, detail=f"model {model!r} is not loaded; loaded models: {sorted(self._infers)}"
        )

    def require_bundle(self, model: Any) -> None:
        """HTTP 404 naming the served bundles unless ``model`` is one of them."""
        if not (isinstance(model, str) and model in self.bundles):
            raise HTTPException(
                status_code=404, detail=f"model {model!r} is not served; models: {sorted(self.bundles)}"
            )

    def _network(self, name: str, bundle_root: str | None = None) -> torch.nn.Module:
        """The network bundle ``name`` serves (its inference config with the app's overrides; the record beside the
        served model, or the one in ``bundle_root``'s ``models/``), without weights."""
        task = self._infers.get(name)
        if bundle_root is None and isinstance(task, SpectraFlowInferTask) and task.network is not None:
            return task.network
        from monai.bundle import ConfigParser

        path = self.bundles[name]
        configs = [os.path.join(path, "configs", c) for c in INFER_CONFIGS]
        config = next(c for c in configs if os.path.isfile(c))
        parser = ConfigParser()
        parser.read_config(config)
        parser.config.update({"bundle_root": bundle_root or path})
        parser.update({**self.overrides[name], **self.precision})
        return parser.get_parsed_content("network_def", instantiate=True)

    def _pair_problem(self, name: str, folder: str) -> str | None:
        """Why the model pair in ``folder/models`` (``model.pt`` and its ``model.json``) cannot serve as bundle
        ``name``'s, or None: the record must hold the digest of these weights and of its own settings, describe a
        model of this bundle's kind (2D images or CT volumes), agree with the app's overrides, and the weights must
        be exactly those of the network it describes (:func:`weights_problem`)."""
        weights = os.path.join(folder, "models", DEFAULT_WEIGHTS)
        record = model_settings_path(weights)
        try:
            with open(record) as f:
                content = json.load(f)
            if not isinstance(content, dict) or not isinstance(content.get("model"), dict):
                return "model.json is not a model record (no 'model' settings)"
            if not content.get(MODEL_DIGEST_KEY) or not content.get(SETTINGS_DIGEST_KEY):
                return (f"model.json holds no {MODEL_DIGEST_KEY} / {SETTINGS_DIGEST_KEY}: upload the model.json that "
                        "training wrote beside this model.pt (this version records both)")  # fmt: skip
            check_model_digest(weights)
            volume = bool(content["model"].get("hu_window"))
            if volume != (input_rank(self.bundles[name]) == 3):
                kind = "CT volumes (a Synapse model)" if volume else "2D images"
                return f"model.json describes a model of {kind}, not of bundle {name!r}"
            network = self._network(name, bundle_root=folder)
        except (ValueError, OSError, RuntimeError) as e:
            return redact_paths(short_reason(e).split(": ", 1)[-1], {folder: "the upload"})
        return weights_problem(weights, network)

    def replace_model(self, model: str, path: str) -> dict[str, Any]:
        """Serve the model of the archive at ``path`` (``PUT /model/<model>``: a ZIP of ``model.pt`` and the
        ``model.json`` its training wrote beside it) as bundle ``model``'s served pair.

        The pair is checked first (:meth:`_pair_problem`); then it replaces the served pair (the record first, each
        atomically), the previous one kept as ``models/model.pt.previous`` and ``models/model.json.previous``
        (``lib/served.py``), and the next request serves the new model with its record's preprocessing.

        Raises:
            HTTPException: 404 for a bundle that is not served; 413 / 422 for an archive that is not exactly the
                pair, 422 naming why the pair cannot serve (the served model is unchanged).
        """
        self.require_bundle(model)
        with tempfile.TemporaryDirectory() as folder:
            weights, record = unpack_model_pair(path, os.path.join(folder, "models"), self.max_upload_bytes)
            problem = self._pair_problem(model, folder)
            if problem is not None:
                raise HTTPException(status_code=422, detail=f"the uploaded model was not served: {problem}")
            served = self._served_model(model)
            replaced = replace_served_pair(weights, record, served)
        kept = " (the previous pair is kept as models/model.pt.previous, models/model.json.previous)"
        logger.info(f"+++ {model}: an uploaded model now serves as models/model.pt with its models/model.json"
                    f"{kept if replaced else ''}")  # fmt: skip
        self._serve_trained()
        stat = os.stat(served)
        return {"checksum": file_checksum(served), "modified_time": int(stat.st_mtime),
                MODEL_DIGEST_KEY: file_digest(served)}  # fmt: skip

    def delete_model(self, model: str) -> None:
        """Stop serving bundle ``model``'s ``models/model.pt`` (``DELETE /model/<model>``): it becomes
        ``models/model.pt.previous`` and its record ``models/model.json.previous``; inference answers 404 until a
        model is uploaded or trained, and no start or task process copies the installed model back.

        Raises:
            HTTPException: 404 when the bundle is not served or has no served model.
        """
        self.require_bundle(model)
        if not set_aside_served_model(self._served_model(model)):
            raise HTTPException(status_code=404, detail=f"model {model!r} has no served weights (models/model.pt)")
        logger.info(f"+++ {model}: models/model.pt and its record set aside as *.previous (DELETE /model)")
        self._serve_trained()

    def info(self, request: Any = None) -> dict[str, Any]:
        """MONAI Label's ``/info/`` (and its task process's ``info`` method) with the models served now."""
        self._serve_trained()
        return super().info()

    def next_sample(self, request: dict[str, Any]) -> dict[str, Any]:
        """MONAI Label's next sample without the server path of the image (clients download it by its id).

        Raises:
            HTTPException: 404 naming the strategies for an unknown strategy.
        """
        strategy = (request.get("strategy") or "random") if isinstance(request, dict) else None
        if not (isinstance(strategy, str) and strategy in self._strategies):
            raise HTTPException(
                status_code=404,
                detail=f"active learning strategy {strategy!r} is not served; strategies: {sorted(self._strategies)}",
            )
        if self.remote:  # MONAI Label retrieved the chosen series to answer its server path
            result = self._strategies[strategy]({**request, "strategy": strategy}, self.datastore())
            return result if isinstance(result, dict) and result.get("id") else {}
        result = super().next_sample(request)
        if isinstance(result, dict):
            result.pop("path", None)
        return result

    def server_mode(self, mode: bool) -> None:
        """Called by the server once it runs this app: install the request checks of ``lib/checks.py``."""
        super().server_mode(mode)
        if mode:
            install_server_checks()
            store = self.datastore()
            if isinstance(store, CheckedDICOMWebDatastore):  # the server is the one writer of the cache's record
                store.writes_record = True
                store._update_datastore_file()

    def infer(self, request: dict[str, Any], datastore: Datastore | None = None) -> dict[str, Any]:
        """``MONAILabelApp.infer`` for datastore ids and uploads only, answering bad requests with 4xx
        ``HTTPException`` s instead of server errors."""
        model = request.get("model") if isinstance(request, dict) else None
        self.require_infer_model(model)
        try:
            request = check_infer_options(request)
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        datastore = datastore if datastore else self.datastore()
        image = request.get("image")
        if not isinstance(image, str) or not image:
            raise HTTPException(status_code=400, detail="no image: give an image id, a file or a session id")
        path, shown = resolve_image(image, datastore, self.sessions())
        try:
            return super().infer(request, datastore)
        except HTTPException:
            raise
        except Exception:
            task = self._infers[model]
            loader = task.image_loader() if isinstance(task, SpectraFlowInferTask) else None
            problem = image_problem(path, loader, getattr(task, "input_rank", None))
            if problem is not None and problem[0] == 415:
                reason = redact_paths(problem[1], {path: shown, os.path.realpath(path): shown})
                detail = f"{shown} cannot be read as an image by model {model!r} ({reason})"
                raise HTTPException(status_code=415, detail=detail)
            if problem is not None:
                detail = f"{shown} does not suit model {model!r}: {problem[1]}"
                raise HTTPException(status_code=problem[0], detail=detail)
            raise

    def check_train_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The training request with checked options (``lib.trainers.check_train_options``).

        Raises:
            HTTPException: 404 for a model without a training task (all of them with ``skip_trainers``), 422 naming
                the first option that is not accepted.
        """
        if not isinstance(request, dict):
            raise HTTPException(status_code=422, detail="the training request must be a JSON object")
        model = request.get("model")
        task = self._trainers.get(model) if isinstance(model, str) else None
        if task is None:
            if strtobool(self.conf.get("skip_trainers", "false")):
                raise HTTPException(status_code=404, detail="training is disabled on this server (skip_trainers)")
            raise HTTPException(
                status_code=404, detail=f"model {model!r} has no training task; trainers: {sorted(self._trainers)}"
            )
        # MONAI Label's deprecated POST /train/ also passes every model's options under the model's name
        own = {k: v for k, v in request.items() if not (k in self._trainers and k != "model" and isinstance(v, dict))}
        try:
            checked = task.check_request(own) if isinstance(task, SpectraFlowTrainTask) else own
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        return checked

    def check_batch_infer_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """A batch inference request (``POST /batch/infer/<model>``) before it is run or queued.

        Raises:
            HTTPException: 404 for a model that is not served for inference, 422 for options that are not accepted.
        """
        if not isinstance(request, dict):
            raise HTTPException(status_code=422, detail="the batch inference options must be a JSON object")
        self.require_infer_model(request.get("model"))
        images = request.get("images", "all")
        own = self.bundle_path(request.get("model"))  # MONAI Label sets it for the task process: the served copy
        if own and isinstance(request.get("bundle_path"), str) and os.path.realpath(request["bundle_path"]) == (
            os.path.realpath(own)
        ):
            request = {k: v for k, v in request.items() if k != "bundle_path"}
        try:
            checked = check_infer_options({k: v for k, v in request.items() if k != "images"})
        except ValueError as e:
            raise HTTPException(status_code=422, detail=str(e)) from None
        if not (images in ("all", "labeled", "unlabeled") or isinstance(images, list)):
            raise HTTPException(status_code=422, detail="images must be 'all', 'labeled', 'unlabeled' or a list of ids")
        store = self.datastore()
        if isinstance(images, list) and hasattr(store, "require_image"):
            for image in images:
                store.require_image(check_id(image))
        return {**checked, "images": images}

    def batch_infer(self, request: dict[str, Any], datastore: Datastore | None = None) -> Any:
        """MONAI Label's batch inference, checked first (:meth:`check_batch_infer_request`); on a server without a
        GPU (or for ``device`` ``cpu``) the images run one after the other on the CPU instead of being spread over
        GPUs that are not there (MONAI Label then divided by zero GPUs)."""
        request = dict(self.check_batch_infer_request(request))
        if not torch.cuda.is_available() or str(request.get("device", "cuda")).startswith("cpu"):
            request.update({"multi_gpu": False, "device": "cpu"})
        return super().batch_infer(request, datastore)

    def check_scoring_request(self, request: dict[str, Any]) -> None:
        """HTTP 404 naming the scoring methods unless the request's ``method`` is one (``uncertainty``)."""
        method = request.get("method") if isinstance(request, dict) else None
        if not (isinstance(method, str) and method in self._scoring_methods):
            raise HTTPException(
                status_code=404,
                detail=f"scoring method {method!r} is not served; scoring methods: {sorted(self._scoring_methods)}",
            )

    def check_train_data(self, request: dict[str, Any] | None = None) -> None:
        """HTTP 422 when no image of the datastore has a label (``labels/final``), or when every label is background
        only, unless the app is started with ``--conf allow_empty_masks true`` (then a warning); see
        :func:`spectraflow_monai.data.validation.check_foreground`. With the checked ``request``: also when its
        ``val_split`` leaves no validation pair (a run serves its best validated model) or, for a 2D bundle, fewer
        than two training pairs (the decoder's batch normalisation needs two samples a batch)."""
        from spectraflow_monai.data.validation import check_foreground
        from spectraflow_monai.utils.errors import DatasetError

        try:
            pairs = self.datastore().datalist()
        except DatasetError as e:  # a SEG of the PACS (lib/dicomweb.py)
            detail = f"the labels in the PACS cannot train this model: {redact_paths(str(e))}"
            raise HTTPException(status_code=422, detail=detail) from None
        if not pairs:
            raise HTTPException(
                status_code=422,
                detail="no image has a label yet (labels/final): save labels (PUT /datastore/label) first",
            )
        try:
            check_foreground(pairs, "the datastore's labels", allow_empty=self.allow_empty_masks)
        except DatasetError as e:
            studies = {self.studies: "studies", os.path.realpath(self.studies): "studies"}
            detail = redact_paths(str(e), studies).replace("set allow_empty_masks true", "start the server with --conf "
                                                  "allow_empty_masks true")  # fmt: skip
            raise HTTPException(status_code=422, detail=detail) from None
        task = self._trainers.get(request.get("model")) if isinstance(request, dict) else None
        if isinstance(task, SpectraFlowTrainTask):
            self._check_split(task, pairs, request)

    @staticmethod
    def _check_split(task: SpectraFlowTrainTask, pairs: list[dict[str, Any]], request: dict[str, Any]) -> None:
        """HTTP 422 when the request's split of ``pairs`` (MONAI Label's, as the run makes it) cannot train."""
        val_split = request.get("val_split", 0.2)
        train, val = task._partition_datalist(pairs, {"val_split": val_split})
        counts = f"{len(pairs)} labelled image(s), val_split {val_split}: {len(train)} to train, {len(val or [])} to "
        if not val:
            raise HTTPException(
                status_code=422,
                detail=f"this run would have no validation pair ({counts}validate); a run serves its best validated "
                "model: choose val_split > 0 that leaves at least one image to validate, or label more images",
            )
        minimum = 1 if task.volume_input else 2
        if len(train) < minimum:
            raise HTTPException(
                status_code=422,
                detail=f"this run would have {len(train)} training pair(s) ({counts}validate); it needs at least "
                f"{minimum}{' (batch normalisation needs two samples a batch)' if minimum > 1 else ''}: label more "
                "images or lower val_split",
            )

    def train(self, request: dict[str, Any]) -> Any:
        """``MONAILabelApp.train`` with the options (:meth:`check_train_request`) and the labels
        (:meth:`check_train_data`) checked first."""
        request = self.check_train_request(request)
        self.check_train_data(request)
        return super().train(request)
