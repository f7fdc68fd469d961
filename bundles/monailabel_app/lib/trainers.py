"""Training task of the SpectraFlow MONAI Label app (docs/monailabel.md, "Requests over HTTP").

:class:`SpectraFlowTrainTask` is MONAI Label's ``BundleTrainTask`` running the bundle's ``configs/train.yaml`` whole
(its ``run`` list, as MONAI Label's own ``monaibundle`` app runs it), in the server's copy of the bundle, on the
datastore's image / label pairs, with what the app adds:

- a request sets only the options of :data:`lib.options.TRAIN_OPTIONS` (``lib/options.py``);
- every request is a new run in a folder of its own whose best model then serves (``lib/runs.py``);
- fine-tuning a served model trains with the settings its record holds (:data:`RECORDED_SETTINGS`);
- the datastore's pairs reach the bundle as its training reads them (volumes for a slice-wise bundle, label maps with
  their foreground threshold for a 2D bundle), the validation pairs checked for foreground.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from monailabel.tasks.train.bundle import BundleTrainTask
from monailabel.utils.others.generic import device_map

from spectraflow_monai.data.validation import check_foreground
from spectraflow_monai.utils.bundles import bundle_config_files, setting_ids, settings_overrides
from spectraflow_monai.utils.run_record import read_model_settings
from spectraflow_monai.utils.settings import ModelSettings, model_settings_path

from .infers import DEFAULT_WEIGHTS, has_volume_format, weight_files
from .options import MODEL_FILENAME_RULE, PRECISION_CHOICES, check_train_options
from .runs import end_run, open_run, remove_stale_runs, serve_run_model
from .served import kept_backups, kept_text

__all__ = ["LABEL_SETUP", "RECORDED_SETTINGS", "SpectraFlowTrainTask"]

logger = logging.getLogger(__name__)

#: the model settings that describe the labels (channels, classes): the bundle's data and label setup decide them for
#: a run, and a served model whose record disagrees does not load strictly
LABEL_SETUP = ("in_channels", "out_channels", "label_classes", "num_classes", "class_names")
#: the model settings that fine-tuning a served model takes from its record (``models/model.json``) as bundle
#: settings of the same names: every field of :class:`~spectraflow_monai.utils.settings.ModelSettings` but the label
#: setup, i.e. its architecture and the preprocessing it was trained with (2D: size and normalisation; Synapse: CT
#: window, label map, non-finite rule), whatever the bundle's ``train.yaml`` says
RECORDED_SETTINGS = tuple(f.name for f in dataclasses.fields(ModelSettings) if f.name not in LABEL_SETUP)


class SpectraFlowTrainTask(BundleTrainTask):
    """``BundleTrainTask`` with bundle config overrides (MONAI Label's own data/epochs/device settings win) and a
    request that may set only the options of :data:`lib.options.TRAIN_OPTIONS`.

    Of ``BundleTrainTask``'s methods it overrides the public ``__call__``, ``config`` and ``run_single_gpu``, and two
    private ones that MONAI Label 0.8.5 offers no public hook for: ``_update_overrides`` (its own extension point,
    "allow derived class to update further overrides", the one place that both the single-process and the
    ``torchrun`` run read after it) and ``_load_checkpoint`` (called unconditionally from ``__call__``; its version
    fails for ``pretrained`` false and for the bundles' ``'@id'`` handler references). The bundle's config is read
    by ``BundleTrainTask`` itself; the app's overrides are applied to it after (no ``_load_bundle_config``).

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
        if self.is_valid():
            # the bundle's configs/train.yaml is the whole Stage-2 run (checked as the bundle's commands check it)
            self.config_files = [str(f) for f in bundle_config_files(path, [os.path.basename(self.bundle_config_path)])]
            if self.overrides:
                self.bundle_config.update(settings_overrides(self.bundle_config.config, self.overrides))
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
            raise ValueError(f"train option 'model_filename' {MODEL_FILENAME_RULE}.")
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
        then replaces the served ``models/model.pt`` (:func:`lib.runs.serve_run_model`)."""
        request = self.check_request(request)
        # the request's precision becomes the bundle setting of this run (over the app's --conf precision)
        self._request_overrides = {"precision": request["precision"]} if "precision" in request else {}
        run_dir = self.new_run(request)
        try:
            result = super().__call__(request, datastore)
            aside = serve_run_model(run_dir, self.bundle_path, self.kept_backups)
            kept = f" (it replaced the previous one); {kept_text(aside)}" if aside else ""
            logger.info(
                f"+++ {os.path.basename(self.bundle_path)}: the best model of training run {os.path.basename(run_dir)} "
                f"now serves as models/model.pt{kept}"
            )
        finally:
            self._request_overrides = {}
            end_run(run_dir)
        return result

    def new_run(self, request: dict[str, Any]) -> str:
        """Prepare a new run: its own folder ``runs/<time>-<pid>-<n>/`` for the resumable checkpoints and the best
        model, nothing resumed (an earlier request's run, its optimizer, early stopping and best score are never
        continued), and the bundle's own training handlers (MONAI Label inserts its checkpoint loader into them). The
        folder records its owner and gets a heartbeat until :func:`lib.runs.end_run` (:func:`lib.runs.open_run`).

        Returns:
            the run folder.
        """
        name = os.path.basename(self.bundle_path)
        start = os.path.join("models", request.get("model_filename", DEFAULT_WEIGHTS))
        fine_tuning = request.get("pretrained", True) and os.path.isfile(os.path.join(self.bundle_path, start))
        recorded = self.recorded_settings(os.path.join(self.bundle_path, start)) if fine_tuning else {}
        run_id, run_dir, log_dir = open_run(self.bundle_path)
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
        bundle_settings = _listed_settings(self.bundle_config.config)
        for key in RECORDED_SETTINGS:
            value = getattr(settings, key)
            if key not in recorded or value is None or key not in bundle_settings:
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

    def split(self, pairs: list[dict[str, Any]], val_split: float) -> tuple[list[dict[str, Any]], Any]:
        """MONAI Label's split of ``pairs`` into training and validation pairs (``val_split`` of them validate), as
        a run of this task makes it (``BundleTrainTask``'s own partition, unshuffled)."""
        return self._partition_datalist(pairs, {"val_split": val_split})

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

    def _load_checkpoint(self, model_pytorch: str, pretrained: bool, train_handlers: list) -> None:
        # private, kept: BundleTrainTask.__call__ calls it whatever the request, and MONAI Label 0.8.5 has no public
        # hook for it; its version expects every handler to be a dict (the bundles also list '@id' references) and
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
        # private, kept: BundleTrainTask's own hook for derived classes (MONAI Label 0.8.5 has no public one), the
        # last step before both the single-process run (run_single_gpu) and the torchrun config file
        for key, value in self.overrides.items():
            overrides.setdefault(key, value)
        overrides.update(getattr(self, "_request_overrides", {}))
        for key in (self.const.key_train_dataset_data(), self.const.key_validate_dataset_data()):
            if key in overrides:
                if key == self.const.key_validate_dataset_data():
                    check_foreground(overrides[key], "the validation pairs of this run", role="validation")
                overrides[key] = self._to_bundle_data(overrides[key])
        # a setting by its field name: at its id; in place, as BundleTrainTask.__call__ ignores the returned mapping
        translated = settings_overrides(self.bundle_config.config, overrides)
        overrides.clear()
        overrides.update(translated)
        return overrides


def _listed_settings(config: Mapping[str, Any]) -> set[str]:
    """The settings that ``config`` gives a value: the fields its settings objects list (``model_settings:
    {image_size: 224}``) or forward from a top-level id (:func:`~spectraflow_monai.utils.bundles.setting_ids`); a field
    an object takes its default for (the Synapse bundle's ``architecture``) is not a setting of the bundle."""
    listed = set()
    for field, key in setting_ids(config).items():
        head, _, name = key.rpartition("#")
        holder = config.get(head) if head else None
        if (not head and key in config) or (isinstance(holder, Mapping) and name in holder):
            listed.add(field)
    return listed


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


def _image_id(path: str) -> str:
    name = os.path.basename(path)
    for ext in (".nii.gz", ".nii", ".nrrd", ".png", ".jpg", ".jpeg"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return os.path.splitext(name)[0]
