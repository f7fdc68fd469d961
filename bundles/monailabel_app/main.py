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

Settings (``--conf KEY VALUE``; read in ``lib/conf.py``, ``lib/served.py``, ``lib/scoring.py``):

- ``models``: comma-separated bundle names (default: every bundle found in ``bundles_dir``). A name that is not a
  bundle there stops the server with the list of the bundles that are.
- ``bundles_dir``: folder that holds the bundles (default: the parent folder of this app, i.e. ``bundles/``).
- ``model_dir``: where the server keeps its own copy of each served bundle (default: ``model/`` inside this app's
  folder). The server never reads configs from the installed bundle while serving nor writes to it: at every start
  ``<model_dir>/<bundle>/configs`` is made identical to the installed bundle's, and the installed ``models/`` files
  the copy lacks are copied (``lib/served.py``); the copy's ``models/model.pt`` is the served model, which every
  training request replaces. It must not overlap the studies folder.
- ``overrides``: a JSON object of bundle config ids and values applied to every served bundle, for both inference
  and training, in the same form as ``python -m monai.bundle run --<id> <value>``; a setting may be named by its
  field, and is given at the id that holds it in each config (``image_size``: ``model_settings#image_size``, in
  inference a value that must agree with the served model's record,
  :func:`spectraflow_monai.utils.bundles.settings_overrides`);
  use it to serve a model trained with non-default network settings, e.g.
  ``'{"encoder_name": "vit_base_patch14_dinov2"}'``.
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
so (``lib/trainers.py``, ``lib/runs.py``). Bad requests are answered with a 4xx status and a message (``lib/policy.py``;
unknown model: 404, unknown image id or label: 404, a file that cannot be read as an image or has no image
extension: 415, an upload over ``max_upload_mb``: 413, a 2D image sent to a volume model or the reverse: 422, a
training or inference option that is not accepted: 422, weights that do not fit the network their record describes or
cannot serve (sparse, meta, quantized, NaN, all zero; ``lib/weights.py``), weights without their record, a record
written for other weights or edited: 422, a served model whose
files on disk are not a pair: 503, a label map of another size than its image or, for a volume, with values that are no
class: 422, a series the PACS does not list: 404, an image uploaded again at another
size (with labels) or extension: 409, an info over 64 KB: 413, a task body with NaN / Infinity or a key that is not an
option (``bundle_path`` included): 422, over 64 KB: 413, a scoring request while a run runs: 429, ``params`` / ``info``
with NaN, Infinity or nesting deeper than 32: 422, a split that leaves no validation pair or too few training pairs:
422, an unknown active learning strategy, scoring method or batch inference model: 404) and the server keeps serving.
Every upload's temporary file is removed whatever the answer (``lib/uploads.py``); an uploaded model (a ZIP of
``model.pt`` and its ``model.json``) replaces the served pair once it is checked, the replaced pair kept as
``models/model.pt.bak-<time>`` / ``models/model.json.bak-<time>`` (one stamp, the newest ``kept_model_backups``
pairs kept); scoring runs in the server process, one run at a time,
and the server is the only writer of the datastore's record (``lib/scoring_runs.py``, ``lib/datastore.py``); the folders
of stopped training runs are removed at start and before each run (a run of another host or PID namespace once its
heartbeat is 15 minutes old); sessions live at most a day, and only the session folders the app created (marked) are
ever removed (``lib/sessions.py``).

What a client may send (``lib/checks.py``): an image is the id of a datastore image, a file uploaded with the
request, or the image of its session; a server-side path is answered exactly as an unknown id (404, same body).
Datastore ids are plain names and label tags ``final``, ``original`` or a simple name, on every datastore route
(else 400, nothing read or written). ``model_filename`` names a ``.pt`` file of the bundle's ``models/`` folder (else
one and the same 422 answer). A training request may set only the options of ``lib.options.TRAIN_OPTIONS`` (types
and ranges checked), never a string that the bundle config parser would evaluate (``$``, ``@``, ``%``,
``_target_``, ...). No answer shows a server path. Label maps are written losslessly (PNG for 2D images, JPEG inputs
included; NIfTI/NRRD for volumes). See docs/monailabel.md, "Serving safely".
"""

from __future__ import annotations

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
from spectraflow_monai.utils.bundles import settings_overrides
from spectraflow_monai.utils.errors import DataError, SettingError
from spectraflow_monai.utils.fingerprint import file_digest
from spectraflow_monai.utils.run_record import MODEL_DIGEST_KEY, check_model_digest
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

from lib import policy  # noqa: E402
from lib.checks import (  # noqa: E402
    check_id,
    check_tag,
    client_request,
    redact_paths,
    resolve_image,
)
from lib.conf import (  # noqa: E402
    INFER_CONFIGS,
    find_bundles,
    max_upload_bytes,
    parse_overrides,
    positive_int,
    precision_setting,
    weight_settings,
)
from lib.datastore import CheckedLocalDatastore  # noqa: E402
from lib.dicomseg import bundle_classes, provide_dcmqi  # noqa: E402
from lib.dicomweb import DEFAULT_CACHE_SERIES, CheckedDICOMWebDatastore, open_dicomweb_datastore  # noqa: E402
from lib.infers import (  # noqa: E402
    DEFAULT_WEIGHTS,
    DropSingletonChanneld,
    SpectraFlowInferTask,
    image_problem,
    input_rank,
    short_reason,
)
from lib.options import TRAIN_OPTIONS, check_infer_options, check_train_options  # noqa: E402
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
    kept_text,
    replace_served_pair,
    served_copy,
    set_aside_served_model,
)
from lib.sessions import CappedSessions  # noqa: E402
from lib.trainers import SpectraFlowTrainTask  # noqa: E402
from lib.uploads import install_server_checks, unpack_model_pair  # noqa: E402
from lib.weights import check_weights, pair_problem  # noqa: E402

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
        self.max_upload_bytes = max_upload_bytes(conf)
        self.allow_empty_masks = strtobool(str(conf.get("allow_empty_masks", "false")))
        self.scoring_settings = scoring_settings(conf)
        self.cache_series = positive_int(conf, "dicomweb_cache_series", DEFAULT_CACHE_SERIES)
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
        """The PACS as MONAI Label reaches it, served by :class:`lib.dicomweb.CheckedDICOMWebDatastore`
        (:func:`lib.dicomweb.open_dicomweb_datastore`); dcmqi found without a download."""
        self.studies = self.studies.rstrip("/").strip()
        self._download_dcmqi_tools()
        return open_dicomweb_datastore(self.studies, self.label_classes, self.cache_series)

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
            check_weights(model_pt, task.network, name)
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
        model cannot be served (see :meth:`_serve_trained`; :func:`lib.policy.require_infer_model`)."""
        self._serve_trained()
        policy.require_infer_model(model, self._infers, self.unusable, self.untrained)

    def require_bundle(self, model: Any) -> None:
        """HTTP 404 naming the served bundles unless ``model`` is one of them."""
        policy.require_bundle(model, self.bundles)

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
        parser.update(settings_overrides(parser.config, {**self.overrides[name], **self.precision}))
        return parser.get_parsed_content("network_def", instantiate=True)

    def _pair_problem(self, name: str, folder: str) -> str | None:
        """Why the model pair in ``folder/models`` cannot serve as bundle ``name``'s, or None
        (:func:`lib.weights.pair_problem`, the network built as inference builds it from the pair's record)."""
        volume = input_rank(self.bundles[name]) == 3
        return pair_problem(folder, name, volume, lambda: self._network(name, bundle_root=folder))

    def replace_model(self, model: str, path: str) -> dict[str, Any]:
        """Serve the model of the archive at ``path`` (``PUT /model/<model>``: a ZIP of ``model.pt`` and the
        ``model.json`` its training wrote beside it) as bundle ``model``'s served pair.

        The pair is checked first (:meth:`_pair_problem`); then it replaces the served pair (the record first, each
        atomically), the replaced one kept as ``models/model.pt.bak-<time>`` and ``models/model.json.bak-<time>``
        (one stamp; the newest ``--conf kept_model_backups`` kept, ``lib/served.py``), and the next request serves
        the new model with its record's preprocessing.

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
            aside = replace_served_pair(weights, record, served, self.kept_backups)
        kept = f"; {kept_text(aside)}" if aside else ""
        logger.info(f"+++ {model}: an uploaded model now serves as models/model.pt with its models/model.json{kept}")
        self._serve_trained()
        stat = os.stat(served)
        return {"checksum": file_checksum(served), "modified_time": int(stat.st_mtime),
                MODEL_DIGEST_KEY: file_digest(served)}  # fmt: skip

    def delete_model(self, model: str) -> None:
        """Stop serving bundle ``model``'s ``models/model.pt`` (``DELETE /model/<model>``): it and its record are
        renamed ``models/model.pt.bak-<time>`` and ``models/model.json.bak-<time>`` (one stamp; the newest
        ``--conf kept_model_backups`` kept, with 0 the pair is removed); inference answers 404 until a model is
        uploaded or trained, and no start or task process copies the installed model back.

        Raises:
            HTTPException: 404 when the bundle is not served or has no served model.
        """
        self.require_bundle(model)
        aside = set_aside_served_model(self._served_model(model), self.kept_backups)
        if aside is None:
            raise HTTPException(status_code=404, detail=f"model {model!r} has no served weights (models/model.pt)")
        logger.info(f"+++ {model}: models/model.pt is no longer served (DELETE /model); {kept_text(aside, 'deleted')}")
        self._serve_trained()

    def info(self, request: Any = None) -> dict[str, Any]:
        """MONAI Label's ``/info/`` (and its task process's ``info`` method) with the models served now."""
        self._serve_trained()
        return super().info()

    def next_sample(self, request: dict[str, Any]) -> dict[str, Any]:
        """MONAI Label's next sample without the server path of the image (clients download it by its id).

        Raises:
            HTTPException: 404 naming the strategies for an unknown strategy (:func:`lib.policy.check_strategy`).
        """
        strategy = policy.check_strategy(request, self._strategies)
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
            answer = policy.infer_failure(self._infers[model], model, path, shown)
            if answer is not None:
                raise answer from None
            raise

    def check_train_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """The training request with checked options (:func:`lib.policy.check_train_request`).

        Raises:
            HTTPException: 404 for a model without a training task (all of them with ``skip_trainers``), 422 naming
                the first option that is not accepted.
        """
        skip = strtobool(self.conf.get("skip_trainers", "false"))
        return policy.check_train_request(request, self._trainers, skip)

    def check_batch_infer_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """A batch inference request (``POST /batch/infer/<model>``) before it is run or queued
        (:func:`lib.policy.check_batch_infer_request`).

        Raises:
            HTTPException: 404 for a model that is not served for inference, 422 for options that are not accepted.
        """
        if not isinstance(request, dict):
            raise HTTPException(status_code=422, detail="the batch inference options must be a JSON object")
        self.require_infer_model(request.get("model"))
        # MONAI Label sets bundle_path for the task process: the served copy
        return policy.check_batch_infer_request(request, self.bundle_path(request.get("model")), self.datastore())

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
        policy.check_scoring_request(request, self._scoring_methods)

    def check_train_data(self, request: dict[str, Any] | None = None) -> None:
        """HTTP 422 when the datastore's labels cannot train (none, all background unless ``--conf
        allow_empty_masks true``) or, with the checked ``request``, its split cannot
        (:func:`lib.policy.check_train_data`)."""
        task = self._trainers.get(request.get("model")) if isinstance(request, dict) else None
        policy.check_train_data(self.datastore(), self.studies, self.allow_empty_masks, task, request)

    def train(self, request: dict[str, Any]) -> Any:
        """``MONAILabelApp.train`` with the options (:meth:`check_train_request`) and the labels
        (:meth:`check_train_data`) checked first."""
        request = self.check_train_request(request)
        self.check_train_data(request)
        return super().train(request)
