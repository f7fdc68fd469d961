"""Training task of the SpectraFlow MONAI Label app and the training options a request may set.

MONAI Label's ``BundleTrainTask`` turns request values into bundle config overrides (``train#trainer#max_epochs``,
``device``, ``tracking_uri``, ...), and MONAI's config parser evaluates a string that starts with ``$`` as Python and
resolves ``@`` / ``%`` references and ``_target_`` objects. A request may therefore set only the options of
:data:`TRAIN_OPTIONS`, each of a checked type and range; anything else is refused before the bundle is read.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import os
import re
import shutil
import socket
import threading
import time
from typing import Any, Callable

from monai.bundle import ConfigParser
from monailabel.tasks.train.bundle import BundleTrainTask
from monailabel.utils.others.generic import device_map

from spectraflow_monai.data.validation import check_foreground
from spectraflow_monai.utils.bundles import bundle_config_files
from spectraflow_monai.utils.precision import PRECISION_SETTINGS
from spectraflow_monai.utils.run_record import read_model_settings
from spectraflow_monai.utils.settings import ModelSettings, model_settings_path

from .infers import DEFAULT_WEIGHTS, has_volume_format, weight_files
from .options import check_bool, check_device, check_gpus, config_syntax, first_item, show_value
from .served import kept_backups, prune_backups, replace_served_model, replace_served_pair

__all__ = [
    "KEPT_RUN_LOGS",
    "MAX_EPOCHS",
    "PRECISION_CHOICES",
    "RECORDED_SETTINGS",
    "RUN_HEARTBEAT",
    "RUN_OWNER_FILE",
    "RUN_STALE_AFTER",
    "TRAIN_OPTIONS",
    "WEIGHT_SETTINGS",
    "SpectraFlowTrainTask",
    "check_train_options",
    "config_syntax",
    "end_run",
    "precision_setting",
    "remove_stale_runs",
    "run_owner",
    "weight_settings",
]

logger = logging.getLogger(__name__)

MAX_EPOCHS = 10000
_MAX_TEXT = 200
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.pt")
_NONE = (None, "", "None", "none")
_RUNS = itertools.count()
_ACTIVE_RUNS: dict[str, threading.Event] = {}  # run folders of this process that are training now -> stops its beat
# a run folder: runs/<date>-<time>-<pid>-<n> (new_run)
_RUN_NAME = re.compile(r"\d{8}-\d{6}-(\d+)-\d+")
#: the record of who runs a run folder (host, PID namespace, PID), written when the run starts
RUN_OWNER_FILE = "owner.json"
#: seconds between two touches of a running run's heartbeat file (``runs/<id>/alive``)
RUN_HEARTBEAT = 60.0
#: a run folder of another host or PID namespace (whose PID cannot be checked here) is stopped when its heartbeat is
#: older than this many seconds
RUN_STALE_AFTER = 15 * 60.0
_HEARTBEAT_FILE = "alive"
#: log folders of earlier runs kept in the served copy's logs/ (older ones are removed when a run starts)
KEPT_RUN_LOGS = 5
#: the values of the bundles' ``precision`` setting
PRECISION_CHOICES = PRECISION_SETTINGS
#: the model settings that fine-tuning a served model takes from its record (``models/model.json``) as bundle
#: settings of the same names: its architecture and the preprocessing it was trained with (2D: size and
#: normalisation; Synapse: CT window, label map, non-finite rule), whatever the bundle's ``train.yaml`` says
RECORDED_SETTINGS = (
    "architecture", "network_kwargs", "encoder_name", "encoder_kwargs", "fusion", "refine", "image_size",
    "image_mean", "image_std", "hu_window", "label_map", "nonfinite", "nonfinite_value",
)  # fmt: skip
_show = show_value
_first = first_item
_bool = check_bool
_device = check_device


def _max_epochs(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_EPOCHS:
        raise ValueError(f"must be an integer from 1 to {MAX_EPOCHS}")
    return value


def _val_split(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("must be a number >= 0 and < 1")
    if not 0.0 <= value < 1.0:
        raise ValueError("must be a number >= 0 and < 1")
    return float(value)


def _tracking(value: Any) -> str:
    if _first(value) not in _NONE:
        raise ValueError("must be 'None': experiment tracking (MLflow) is not available in this app")
    return "None"


def _text(value: Any) -> None:
    # accepted for MONAI Label clients that send every option back; unused, since tracking is always off
    if value is not None and (not isinstance(value, str) or len(value) > _MAX_TEXT or config_syntax(value)):
        raise ValueError(f"must be a plain string of at most {_MAX_TEXT} characters")
    return None


def _run_id(value: Any) -> None:
    if value not in (*_NONE, "run"):
        raise ValueError("must be 'run' (the bundle's training workflow)")
    return None


def _precision(value: Any) -> str:
    value = _first(value)
    if not isinstance(value, str) or value.strip().lower() not in PRECISION_CHOICES:
        raise ValueError(f"must be one of {list(PRECISION_CHOICES)}")
    return value.strip().lower()


_MODEL_FILENAME_RULE = "must be the name of a .pt file in the bundle's models/ folder, such as 'model.pt'"


def _model_filename(value: Any) -> str:
    value = _first(value)
    if value in _NONE:
        return DEFAULT_WEIGHTS
    if not isinstance(value, str) or not _FILE_NAME.fullmatch(value) or ".." in value:
        raise ValueError(_MODEL_FILENAME_RULE)
    return value


def _local_rank(value: Any) -> None:
    # added by MONAI Label's task subprocess (monailabel.interfaces.utils.app) to every queued training request
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1024:
        raise ValueError("must be a process rank (an integer >= 0)")
    return None


# option -> (check returning the value to use, or None to leave the option out; what it means)
TRAIN_OPTIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "max_epochs": (_max_epochs, f"integer 1..{MAX_EPOCHS}: epochs to run (default 50)"),
    "val_split": (_val_split, "number in [0, 1): fraction of the datastore pairs used for validation (default 0.2)"),
    "device": (_device, "'cpu', 'cuda', 'cuda:<index>' or a GPU name (default 'cuda', 'cpu' without a GPU)"),
    "pretrained": (_bool, "true/false: start from models/<model_filename> when it exists (default true)"),
    "model_filename": (_model_filename, "a .pt file name in the bundle's models/ folder (default 'model.pt')"),
    "multi_gpu": (_bool, "true/false: torchrun on the GPUs of 'gpus' when there are several (default true)"),
    "force_multi_gpu": (_bool, "true/false: torchrun even with one GPU (default false)"),
    "gpus": (check_gpus, "'all' or GPU indices such as '0,1' (default 'all')"),
    "tracking": (_tracking, "'None' only (no MLflow)"),
    "tracking_uri": (_text, "ignored (tracking is off)"),
    "tracking_experiment_name": (_text, "ignored (tracking is off)"),
    "tracking_run_name": (_text, "ignored (tracking is off)"),
    "run_id": (_run_id, "'run' only"),
    "precision": (_precision, "'auto', 'bf16', 'fp16' (CUDA) or 'fp32' (default: the app's --conf precision, "
                  "else the bundle's 'auto')"),
    # added by MONAI Label itself: its client sends client_id, its task subprocess adds local_rank
    "client_id": (_text, "ignored (MONAI Label's client adds it)"),
    "local_rank": (_local_rank, "ignored (MONAI Label's task subprocess adds it)"),
}
# options whose refusal does not repeat the value: a path is answered as an unknown name
_QUIET = ("model_filename",)


# app settings (--conf KEY VALUE) passed to every bundle's training as the bundle settings of the same name
WEIGHT_SETTINGS = ("pretrained_weights", "encoder_init")


def weight_settings(conf: dict[str, Any]) -> dict[str, str]:
    """The encoder-weight settings of the app (``--conf pretrained_weights ...``, ``--conf encoder_init ...``) as
    bundle config overrides for training; settings left out keep the bundle's values (``timm`` / ``auto``).

    Args:
        conf: the app settings.

    Raises:
        ValueError: ``encoder_init`` is not one of ``auto`` / ``stage1`` / ``pretrained`` / ``random``, or
            ``pretrained_weights`` is not a plain string (``timm``, ``none`` or a file path on the server).
    """
    from spectraflow_monai.apps.encoder_init import ENCODER_INIT_CHOICES

    settings: dict[str, str] = {}
    for key in WEIGHT_SETTINGS:
        value = conf.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip() or len(value) > 4096 or config_syntax(value):
            raise ValueError(f"--conf {key} must be a plain, non-empty string, got {_show(value)}.")
        value = value.strip()
        if key == "encoder_init" and value.lower() not in ENCODER_INIT_CHOICES:
            raise ValueError(f"--conf encoder_init must be one of {list(ENCODER_INIT_CHOICES)}, got {_show(value)}.")
        settings[key] = value.lower() if key == "encoder_init" or value.lower() in ("timm", "none") else value
    return settings


def precision_setting(conf: dict[str, Any]) -> dict[str, str]:
    """The app's ``--conf precision`` (``auto`` | ``bf16`` | ``fp16`` | ``fp32``) as the bundle config override
    ``{"precision": ...}`` of inference and training; ``{}`` when it is not set (the bundles' ``auto``).

    Raises:
        ValueError: a value that is not one of :data:`PRECISION_CHOICES`, named with the value.
    """
    value = conf.get("precision")
    if value is None:
        return {}
    try:
        return {"precision": _precision(value)}
    except ValueError as e:
        raise ValueError(f"--conf precision {e}, got {_show(value)}.") from None


def check_train_options(request: dict[str, Any], bundle_path: str | None = None) -> dict[str, Any]:
    """The training request as ``BundleTrainTask`` may use it, or ValueError naming the first refused option.

    Args:
        request: ``model`` (the bundle name), ``bundle_path`` (added by MONAI Label; must be the bundle's folder)
            and options of :data:`TRAIN_OPTIONS`.
        bundle_path: the folder of the bundle being trained; ``None`` refuses any ``bundle_path`` in the request.
            Default ``None``.

    Returns:
        a new request with the checked values (options that are unused or at their default left out).

    Raises:
        ValueError: an option that is not in :data:`TRAIN_OPTIONS` (bundle config ids such as
            ``train#trainer#max_epochs`` included), a value of the wrong type or out of range, or a string that the
            bundle config parser would evaluate (``$``, ``@``, ``%``, ``_target_``, ...).
    """
    if not isinstance(request, dict):
        raise ValueError(f"the training request must be a JSON object, got {type(request).__name__}.")
    checked: dict[str, Any] = {}
    for key, value in request.items():
        if not isinstance(key, str):
            raise ValueError(f"train option {_show(key)} is not a name.")
        if isinstance(value, str) and config_syntax(value):
            raise ValueError(
                f"train option {key!r}: {_show(value)} would be evaluated by the bundle config parser "
                "(it starts with $, @ or % or holds _target_, #, ::); only plain values are accepted."
            )
        if key == "model":
            if not isinstance(value, str):
                raise ValueError(f"train option 'model' must be a bundle name, got {_show(value)}.")
            checked[key] = value
        elif key == "bundle_path":
            if bundle_path is None or not isinstance(value, str) or os.path.realpath(value) != os.path.realpath(
                bundle_path
            ):
                raise ValueError("train option 'bundle_path' is set by the server and cannot be chosen.")
        elif key in TRAIN_OPTIONS:
            check, _ = TRAIN_OPTIONS[key]
            try:
                value = check(value)
            except ValueError as e:
                shown = "" if key in _QUIET else f", got {_show(value)}"
                raise ValueError(f"train option {key!r} {e}{shown}.") from None
            if value is not None:
                checked[key] = value
        else:
            raise ValueError(
                f"train option {_show(key)} is not accepted; a request may set only {sorted(TRAIN_OPTIONS)} "
                "(bundle settings are server settings: --conf overrides)."
            )
    return checked


class SpectraFlowTrainTask(BundleTrainTask):
    """``BundleTrainTask`` with bundle config overrides (MONAI Label's own data/epochs/device settings win) and a
    request that may set only the options of :data:`TRAIN_OPTIONS`.

    Args:
        path: bundle folder.
        conf: the app settings.
        overrides: bundle config id -> value, passed to ``monai.bundle.run``. Default ``None``.
        kwargs: passed to ``BundleTrainTask``.
    """

    def __init__(self, path: str, conf: dict[str, str], overrides: dict[str, Any] | None = None, **kwargs: Any):
        self.overrides = dict(overrides or {})
        self._request_overrides: dict[str, Any] = {}
        self.kept_backups = kept_backups(conf or {})
        kwargs.setdefault("load_strict", True)
        super().__init__(path, conf, **kwargs)
        remove_stale_runs(path)  # the folders of runs that a stop or a kill ended before their clean-up
        self.volume_input = has_volume_format(path)
        self._train_handlers = (
            copy.deepcopy(self.bundle_config.get(self.const.key_train_handlers(), [])) if self.is_valid() else []
        )

    def check_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """:func:`check_train_options` for this bundle (raises ValueError naming a refused option); a
        ``model_filename`` must also be a file of the bundle's ``models/`` folder, or ``model.pt`` (which, while it
        does not exist yet, means the bundle's initial weights). A path and an unknown name get the same answer."""
        checked = check_train_options(request, getattr(self, "bundle_path", None))
        name = checked.get("model_filename", DEFAULT_WEIGHTS)
        if name != DEFAULT_WEIGHTS and name not in weight_files(self.bundle_path):
            raise ValueError(f"train option 'model_filename' {_MODEL_FILENAME_RULE}.")
        precision = checked.get("precision", self.overrides.get("precision", "auto"))
        if precision == "fp16" and not _uses_cuda(checked.get("device")):
            source = "train option 'precision'" if "precision" in checked else "the server's --conf precision"
            raise ValueError(
                f"{source} 'fp16' needs a CUDA device (float16 training needs a gradient scaler), and this run would "
                "train on the CPU; choose 'bf16', 'fp32' or 'auto', or a CUDA device."
            )
        return checked

    def __call__(self, request: dict[str, Any], datastore: Any) -> Any:
        """One training request: a new run on the datastore's current labels (:meth:`new_run`), whose best model
        then replaces the served ``models/model.pt`` (:meth:`promote`)."""
        request = self.check_request(request)
        # the request's precision becomes the bundle setting of this run (over the app's --conf precision)
        self._request_overrides = {"precision": request["precision"]} if "precision" in request else {}
        run_dir = self.new_run(request)
        try:
            result = super().__call__(request, datastore)
            self.promote(run_dir)
        finally:
            self._request_overrides = {}
            end_run(run_dir)
        return result

    def new_run(self, request: dict[str, Any]) -> str:
        """Prepare a new run: its own folder ``runs/<time>-<pid>-<n>/`` for the resumable checkpoints and the best
        model, nothing resumed (an earlier request's run, its optimizer, early stopping and best score are never
        continued), and the bundle's own training handlers (MONAI Label inserts its checkpoint loader into them). The
        folder records its owner and gets a heartbeat (:func:`remove_stale_runs`) until :func:`end_run`.

        Returns:
            the run folder.
        """
        name = os.path.basename(self.bundle_path)
        start = os.path.join("models", request.get("model_filename", DEFAULT_WEIGHTS))
        fine_tuning = request.get("pretrained", True) and os.path.isfile(os.path.join(self.bundle_path, start))
        recorded = self.recorded_settings(os.path.join(self.bundle_path, start)) if fine_tuning else {}
        remove_stale_runs(self.bundle_path)
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_RUNS)}"
        run_dir = os.path.join(self.bundle_path, "runs", run_id)
        log_dir = os.path.join(self.bundle_path, "logs", run_id)
        _prune_logs(os.path.dirname(log_dir), KEPT_RUN_LOGS - 1)
        os.makedirs(run_dir)
        _start_run(run_dir)
        self._request_overrides.update(
            {
                "stage2_dir": os.path.join(run_dir, "checkpoints"),  # a new folder: nothing to resume
                "model_path": os.path.join(run_dir, DEFAULT_WEIGHTS),  # the run's best model, promoted when done
                "log_dir": log_dir,
            }
        )
        self._request_overrides.update(recorded)  # over the server's --conf overrides: the model was trained so
        self.bundle_config[self.const.key_train_handlers()] = copy.deepcopy(self._train_handlers)
        if fine_tuning:
            origin = f"fine-tuning from {start}"
            if recorded:
                shown = ", ".join(f"{k} {v!r}" for k, v in recorded.items())
                origin += f" with its recorded settings ({os.path.basename(model_settings_path(start))}): {shown}"
        else:
            origin = "the bundle's initial weights (encoder_init; decoder from scratch)"
        logger.info(f"+++ {name}: new training run {run_id} on the datastore's labels, starting from {origin}")
        return run_dir

    def recorded_settings(self, model_file: str) -> dict[str, Any]:
        """The settings of :data:`RECORDED_SETTINGS` that the record beside ``model_file`` holds (read with
        :func:`~spectraflow_monai.utils.run_record.read_model_settings`, checked as a
        :class:`~spectraflow_monai.utils.settings.ModelSettings`) and that are settings of this bundle, as bundle
        overrides; ``{}`` without a record. A server ``--conf`` override that differs is named in a warning (the
        record's value is used: the model was trained with it).

        Raises:
            ValueError: the record cannot be read or holds a value out of its range, naming the file.
        """
        recorded = read_model_settings(model_file)
        if not recorded:
            return {}
        settings = ModelSettings.from_dict(recorded, source=model_settings_path(model_file))
        values = {}
        for key in RECORDED_SETTINGS:
            value = getattr(settings, key)
            if key not in recorded or value is None or key not in self.bundle_config:
                continue
            values[key] = list(value) if isinstance(value, tuple) else value
            given = self.overrides.get(key)
            if given is not None and not _same_setting(settings, key, given):
                logger.warning(
                    f"+++ {os.path.basename(self.bundle_path)}: --conf override {key} {given!r} differs from "
                    f"{recorded[key]!r} recorded in {model_settings_path(model_file)}; fine-tuning this model uses the "
                    "recorded value"
                )
        return values

    def promote(self, run_dir: str) -> None:
        """Replace the served ``models/model.pt`` with the best model of the run in ``run_dir`` (atomically: the
        inference task reloads it at its next request), its settings record ``model.json`` first (inference reads
        the model's normalisation and size from it).

        Raises:
            RuntimeError: the run saved no model (no validation pair, or no finite validation score); the served
                model is kept.
        """
        name = os.path.basename(self.bundle_path)
        best = os.path.join(run_dir, DEFAULT_WEIGHTS)
        if not os.path.isfile(best):
            raise RuntimeError(
                f"{name}: training run {os.path.basename(run_dir)} saved no model (it needs validation pairs: "
                "val_split > 0 and enough labelled images); the served model is unchanged."
            )
        served = os.path.join(self.bundle_path, "models", DEFAULT_WEIGHTS)
        record = model_settings_path(best)
        if os.path.isfile(record):  # the settings the model was trained with (model.json), with the model's digest
            replaced = replace_served_pair(best, record, served)
        else:
            replaced = replace_served_model(best, served)
        prune_backups(os.path.dirname(served), self.kept_backups)
        kept = " (it replaced the previous one); the previous one is kept as models/model.pt.previous"
        logger.info(
            f"+++ {name}: the best model of training run {os.path.basename(run_dir)} now serves as models/model.pt"
            f"{kept if replaced else ''}"
        )

    def config(self) -> dict[str, Any]:
        options = super().config()
        options["tracking"] = ["None"]  # MLflow is not part of this app
        options["run_id"] = "run"
        default = self.overrides.get("precision", "auto")
        options["precision"] = [default] + [p for p in PRECISION_CHOICES if p != default]  # first: the default
        return options

    def run_single_gpu(self, request: dict[str, Any], overrides: dict[str, Any]) -> None:
        # the bundle's `run` list holds every step (setup, run record, encoder weights, training): MONAI Label's
        # init_id=None skips nothing; `finalize` leaves a multi-process group
        import monai.bundle

        monai.bundle.run(
            run_id=request.get("run_id", "run"),
            init_id=None,
            final_id="finalize",
            meta_file=self.bundle_metadata_path,
            config_file=self.config_files,
            **overrides,
        )

    def _load_bundle_config(self, path: str, config: str) -> ConfigParser:
        # the bundle's configs/train.yaml is the whole Stage-2 run (checked as the bundle's commands check it)
        self.config_files = [str(f) for f in bundle_config_files(path, [os.path.basename(config)])]
        parser = ConfigParser()
        parser.read_config(self.config_files)
        parser.config.update({self.const.key_bundle_root(): path})  # as MONAI Label's own version
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

    def _to_bundle_data(self, datalist: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Datastore pairs -> the entries the bundle's training reads.

        The datastore holds label maps (0 background, 1..N classes). A slice-wise bundle (its metadata has
        ``volume_data_format``: 3D volumes in, a 2D network) gets the volumes as they are, named by their image id:
        the bundle's own ``volume_slices`` (:class:`spectraflow_monai.apps.synapse.VolumeSlices`, the ``prepare``
        step of its training and validation datasets) slices them once into its cache with the run's window, size
        and non-finite rule, as for MONAI Label's stock bundle trainer (labels kept as they are, they are already the
        bundle's classes; another value stops the run naming the file); a 2D bundle reads the images directly, with
        foreground = label >= 1.
        """
        if not datalist:
            return datalist
        if self.volume_input:
            return [{"image": d["image"], "label": d["label"], "case": _image_id(d["image"])} for d in datalist]
        return [dict(d, label_threshold=1) for d in datalist]

    def _update_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        for key, value in self.overrides.items():
            overrides.setdefault(key, value)
        overrides.update(getattr(self, "_request_overrides", {}))
        for key in (self.const.key_train_dataset_data(), self.const.key_validate_dataset_data()):
            if key in overrides:
                if key == self.const.key_validate_dataset_data():
                    check_foreground(overrides[key], "the validation pairs of this run", role="validation")
                overrides[key] = self._to_bundle_data(overrides[key])
        return overrides


def _same_setting(settings: ModelSettings, key: str, value: Any) -> bool:
    """Whether ``value`` of model setting ``key`` equals that of ``settings`` once checked (``[-200, 300]`` is the
    recorded ``[-200.0, 300.0]``); a value the setting refuses differs."""
    try:
        return getattr(settings.replace(**{key: value}), key) == getattr(settings, key)
    except ValueError:
        return False


def _uses_cuda(device: str | None) -> bool:
    # the device a run gets (MONAI Label's name_to_device): the request's, else cuda; cuda without a GPU is the CPU
    import torch

    device = device or "cuda"
    device = device_map().get(device, device)
    return str(device).startswith("cuda") and torch.cuda.is_available()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux: one namespace
        return ""


def _boot_id() -> str:
    # differs between hosts (and boots) whose host names or namespace numbers agree
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def run_owner(pid: int | None = None) -> dict[str, Any]:
    """Who runs a run folder: this host (its name and boot id), this PID namespace and ``pid`` (default: this
    process)."""
    return {
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_namespace": _pid_namespace(),
        "pid": os.getpid() if pid is None else pid,
    }


def _last_activity(path: str) -> float:
    """The newest modification time of run folder ``path``, its entries and theirs (checkpoints are written there)."""
    newest = os.path.getmtime(path)
    for entry in os.scandir(path):
        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        if entry.is_dir(follow_symlinks=False):
            for inner in os.scandir(entry.path):
                newest = max(newest, inner.stat(follow_symlinks=False).st_mtime)
    return newest


def _beat(path: str, stop: threading.Event) -> None:
    while True:
        try:
            os.utime(path)
        except OSError:  # the folder is gone: the run has ended
            return
        if stop.wait(RUN_HEARTBEAT):
            return


def _start_run(run_dir: str) -> None:
    """Record this process as the owner of ``run_dir`` and touch its heartbeat file every :data:`RUN_HEARTBEAT`
    seconds until :func:`end_run`."""
    with open(os.path.join(run_dir, RUN_OWNER_FILE), "w") as f:
        json.dump(run_owner(), f)
    heartbeat = os.path.join(run_dir, _HEARTBEAT_FILE)
    open(heartbeat, "w").close()
    stop = threading.Event()
    _ACTIVE_RUNS[os.path.basename(run_dir)] = stop
    threading.Thread(target=_beat, args=(heartbeat, stop), name="spectraflow-run-heartbeat", daemon=True).start()


def end_run(run_dir: str) -> None:
    """End the run of ``run_dir``: its heartbeat stops and its folder is removed (a run is never continued by a later
    request: its checkpoints go, whether it ended well or not)."""
    stop = _ACTIVE_RUNS.pop(os.path.basename(run_dir), None)
    if stop is not None:
        stop.set()
    shutil.rmtree(run_dir, ignore_errors=True)


def _stopped(path: str, name: str, pid: int) -> bool:
    """Whether the run of folder ``path`` has stopped. Its process is checked where it can be (this host and PID
    namespace); a run of another host or PID namespace (a container, a server on shared storage), or of a folder
    without an owner record, has stopped when its heartbeat (else the newest file of the folder) is older than
    :data:`RUN_STALE_AFTER` seconds."""
    try:
        with open(os.path.join(path, RUN_OWNER_FILE)) as f:
            owner = json.load(f)
    except (OSError, ValueError):
        owner = None
    heartbeat = os.path.join(path, _HEARTBEAT_FILE)
    try:
        last = os.path.getmtime(heartbeat) if os.path.isfile(heartbeat) else _last_activity(path)
    except OSError:  # (removed meanwhile, or unreadable: left as it is)
        return False
    silent = time.time() - last > RUN_STALE_AFTER
    here = run_owner(pid)
    if isinstance(owner, dict) and all(owner.get(k) == v for k, v in here.items()):
        if pid == os.getpid():
            return name not in _ACTIVE_RUNS
        return not _pid_alive(pid) or silent  # (a live PID with a silent heartbeat: the PID was reused)
    return silent


def remove_stale_runs(bundle_path: str) -> list[str]:
    """Remove the run folders (``runs/<date>-<time>-<pid>-<n>``) of the served copy whose run has stopped.

    A run removes its folder when it ends (:func:`end_run`); a run stopped by ``DELETE /train`` or a server kill
    cannot, so the server removes them at its start and before each new run. A folder whose run may still go on is
    kept: its process runs (this host and PID namespace, as its ``owner.json`` says), or, for a run of another host or
    PID namespace, its heartbeat is younger than :data:`RUN_STALE_AFTER` seconds (:func:`_stopped`).

    Args:
        bundle_path: the served copy of a bundle.

    Returns:
        the names of the removed folders.
    """
    runs = os.path.join(bundle_path, "runs")
    if not os.path.isdir(runs):
        return []
    removed = []
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name)
        match = _RUN_NAME.fullmatch(name)
        if not os.path.isdir(path) or os.path.islink(path) or match is None:
            continue
        if not _stopped(path, name, int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    if removed:
        logger.info(f"+++ {os.path.basename(bundle_path)}: removed {len(removed)} folder(s) of stopped runs: {removed}")
    return removed


def _prune_logs(logs: str, keep: int) -> None:
    """Keep the newest ``keep`` run log folders of ``logs`` (named as the runs, so their names sort by time)."""
    if not os.path.isdir(logs):
        return
    folders = sorted(n for n in os.listdir(logs) if _RUN_NAME.fullmatch(n) and os.path.isdir(os.path.join(logs, n)))
    for name in folders[: max(0, len(folders) - keep)]:
        shutil.rmtree(os.path.join(logs, name), ignore_errors=True)


def _image_id(path: str) -> str:
    name = os.path.basename(path)
    for ext in (".nii.gz", ".nii", ".nrrd", ".png", ".jpg", ".jpeg"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return os.path.splitext(name)[0]
