"""A run describes itself: a record of its settings and data beside its checkpoints, and beside every model file.

nnU-Net keeps ``plans.json`` and ``dataset_fingerprint.json`` next to each run; the SpectraFlow bundles do the same
with two small JSON files:

- ``run_record.json`` in a run's checkpoint folder (``models/stage1/``, ``models/stage2/``), written when the run
  starts (:func:`record_run`): the resolved settings, the model settings, the data source with a fingerprint of each
  datalist (file names relative to their common folder, file contents, the other entry fields), the label setup, the
  seed, the precision and the package version, and the components the run trains with as they were built
  (:func:`record_components`: the optimizer the trainer holds, class and hyper-parameters). How a run starts is
  decided once (:func:`decide_restart`: continue, new run, or refuse) and both the record and the checkpoint loader
  follow that decision. A restart in the same folder whose record differs stops before any training, naming each
  differing setting and the two ways forward (``--run_settings#resume false`` starts over in that folder, keeping the
  earlier files aside; or a new ``--bundle_root``);
- ``<model>.json`` beside a model file (``models/model.json`` beside ``model.pt``, ``models/encoder_stage1.json``
  beside the Stage-1 export), written with the file itself (:func:`write_model_settings`): the model settings that
  built it, with two digests that tie the record to its model: ``model_sha256``, the SHA-256 of the model file's
  bytes, and ``settings_sha256``, the SHA-256 of the recorded settings (:func:`settings_digest`); and, for a network
  with an encoder, ``encoder_start``: where its encoder started (:class:`RecordedModel`). Evaluation and
  inference read them (:class:`ModelRecord`): a user gives data, output and device; a model setting given on the
  command line that contradicts the record is an error naming both values. A record whose settings were edited, or
  that was written for another model file (a retrained ``model.pt`` beside an old ``model.json``), is refused in one
  line (:func:`check_model_digest`); a record of an earlier version without the digests is read with a warning.
  Fine-tuning from the Stage-1 export compares its encoder settings the same way
  (:func:`spectraflow_monai.apps.encoder_init.initialize_encoder`), instead of failing with a raw size mismatch.

Settings that may change between restarts (``max_epochs``, ``num_workers``, the device, ...) are recorded under
``not_compared`` and never stop a run.

A run that ended (:func:`record_finished`: its last epoch, and whether early stopping ended it) is not continued
unless it is the same run given more epochs: started again in its folder, with another setting or data, or with no
epochs left to train, a new run starts and the finished one is kept aside, so that a repeated training request (MONAI
Label's ``/train``) always trains.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from spectraflow_monai.utils.architectures import architecture
from spectraflow_monai.utils.checkpoint import CONTINUE, NEW, RECORD_FILE, RestartDecision, latest_checkpoint, set_aside
from spectraflow_monai.utils.distributed import process_rank
from spectraflow_monai.utils.errors import DataError, SettingError
from spectraflow_monai.utils.fingerprint import file_digest
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.utils.settings import (
    ENCODER_FIELDS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ModelSettings,
    SettingsObject,
    model_settings_path,
    settings_dict,
)

__all__ = [
    "MODEL_DIGEST_KEY",
    "RECORD_FILE",
    "RECORD_FORMAT",
    "SETTINGS_DIGEST_KEY",
    "ModelRecord",
    "RecordedModel",
    "check_model_digest",
    "check_model_settings",
    "component_record",
    "data_fingerprint",
    "decide_restart",
    "file_digest",
    "model_exports",
    "model_settings_path",
    "read_model_settings",
    "record_components",
    "record_finished",
    "record_run",
    "set_exports_aside",
    "settings_digest",
    "weights_mismatch",
    "write_model_settings",
]

logger = logging.getLogger(__name__)

#: the layout of run records and model records: 2 = the settings objects written whole (format 1, unnumbered: the
#: settings listed by the bundle configs)
RECORD_FORMAT = 2
# settings an earlier record derives from others (out_channels: num_classes), never reported as missing
_DERIVED = ("out_channels",)
# the parts of a record that must agree for a restart to continue the run
_COMPARED = ("settings", "model", "components", "data", "label_setup", "seed", "precision")
#: the key of a model record (``model.json``) holding the SHA-256 of its model file's bytes (:func:`file_digest`)
MODEL_DIGEST_KEY = "model_sha256"
#: the key of a model record holding the SHA-256 of its own model settings (:func:`settings_digest`)
SETTINGS_DIGEST_KEY = "settings_sha256"
_WARNED: set[tuple[str, str]] = set()  # (record, what): a warning about an earlier record is given once per process


def _version() -> str:
    from spectraflow_monai import __version__

    return __version__


def _plain(value: Any) -> Any:
    """``value`` as JSON-friendly data (tuples as lists, numpy scalars as numbers, other objects by ``repr``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, SettingsObject):  # a settings object: every field, by name
        return settings_dict(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (os.PathLike, torch.device)):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    name = getattr(value, "name", None)  # a resolved precision, an enum member
    if type(value).__repr__ is not object.__repr__ or not hasattr(value, "__dict__"):
        return name if isinstance(name, str) else repr(value)
    # a plain settings object (e.g. a data source): its type and public attributes
    fields = {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}", **fields}


def _file_key(value: Any, root: str) -> Any:
    if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
        path = os.path.abspath(os.fspath(value))
        return [os.path.relpath(path, root), file_digest(path)]
    return _plain(value)


def data_fingerprint(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"items": N, "sha256": ...}`` of a datalist: every field of every entry, files as (path relative to the
    common folder of all files, SHA-256 of the content), so that the same data moved to another folder keeps its
    fingerprint while a different file list, another label file or a file edited in place (same size included)
    changes it. File digests are cached by size and modification time (:mod:`spectraflow_monai.utils.fingerprint`)."""
    files = [
        os.path.abspath(os.fspath(v))
        for e in entries
        for v in e.values()
        if isinstance(v, (str, os.PathLike)) and os.path.isfile(v)
    ]
    root = os.path.commonpath(files) if files else ""
    root = os.path.dirname(root) if files and os.path.isfile(root) else root
    rows = sorted(json.dumps({str(k): _file_key(v, root) for k, v in e.items()}, sort_keys=True) for e in entries)
    return {"items": len(rows), "sha256": hashlib.sha256("\n".join(rows).encode()).hexdigest()}


def _differences(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += _differences(old.get(key, "<not set>"), new.get(key, "<not set>"), name)
        return out
    return [] if old == new else [(prefix, old, new)]


def _added_later(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The settings and model fields and the components of ``new`` that the earlier record ``old`` (of the same
    format) does not hold: fields added to the settings objects since it was written (e.g. ``model.architecture``),
    the optimizer of a record written before components were recorded."""
    parts = {part: old.get(part, {} if part == "components" else None) for part in ("settings", "model", "components")}
    return [
        f"{part}.{key}"
        for part, held in parts.items()
        if isinstance(held, Mapping) and isinstance(new.get(part), Mapping)
        for key in new[part]
        if key not in held
    ]


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise SettingError(f"run record {path!r} cannot be read ({exc}); move it away to start over.") from exc


def _optimizer_record(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer as the run record holds it: its class path, its defaults (the constructor's hyper-parameters)
    and each parameter group's size with the hyper-parameters in which it differs from them (e.g. the kernel-L2
    groups' ``weight_decay``)."""
    defaults = _plain(dict(optimizer.defaults))
    groups = []
    for group in optimizer.param_groups:
        own = {k: _plain(v) for k, v in group.items() if k != "params" and _plain(v) != defaults.get(k, "<not set>")}
        groups.append({"parameters": sum(int(p.numel()) for p in group["params"]), **own})
    kind = type(optimizer)
    return {"class": f"{kind.__module__}.{kind.__qualname__}", "defaults": defaults, "param_groups": groups}


def _module_record(module: torch.nn.Module) -> dict[str, Any]:
    """A module (a loss function) as the run record holds it: its class path and, by name, those of the modules it
    is made of (``monai.losses.DeepSupervisionLoss`` around the bundle's loss). Not its attributes: a loss changes
    some while it trains (the boundary weight's ramp), and the settings that set them are recorded already."""
    kind = type(module)
    children = {name: _module_record(child) for name, child in module.named_children()}
    return {"class": f"{kind.__module__}.{kind.__qualname__}", **({"modules": children} if children else {})}


def component_record(component: Any) -> Any:
    """What the run record holds of a component a run trains with (``components`` of :func:`record_run`): an
    optimizer whole, as it was built (:class:`torch.optim.Optimizer`: class path, defaults and parameter groups), so
    that a config that replaces one (``train#optimizer: {_target_: torch.optim.Adam, ...}``) is recorded as what ran;
    a loss function (a :class:`torch.nn.Module`) by its class path and those of its parts
    (``train#trainer#loss_function: {_target_: monai.losses.DeepSupervisionLoss, ...}``); any other object by its
    class path and public attributes."""
    if isinstance(component, torch.optim.Optimizer):
        return _optimizer_record(component)
    if isinstance(component, torch.nn.Module):
        return _module_record(component)
    return _plain(component)


def _check_earlier_format(old: Mapping[str, Any], path: str) -> None:
    if old.get("format") != RECORD_FORMAT:
        raise SettingError(
            f"{path} was written by spectraflow_monai {old.get('spectraflow_monai', '(unknown)')} in an earlier "
            f"record format: continue that run with that version, or start over here with --run_settings#resume false."
        )


def _record_differences(old: Mapping[str, Any], record: Mapping[str, Any], path: str) -> list[tuple[str, Any, Any]]:
    """The compared parts of ``record`` that differ from the earlier ``old``; a settings or model field or a
    component that ``old`` was written without is named in a warning and not compared."""
    later = _added_later(old, record)
    if later:
        logger.warning(
            f"{path} was written before {', '.join(later)} were recorded: continuing without comparing them."
        )
    return [
        d
        for part in _COMPARED
        if part in record  # components given later (record_components) are compared then
        for d in _differences(old.get(part, {} if part == "components" else None), record[part], part)
        if d[0] not in later
    ]


def _mixed_runs(folder: str, what: str, diffs: list[tuple[str, Any, Any]]) -> SettingError:
    """The refusal of a restart that would continue a run of ``what``, naming each difference and the ways forward."""
    lines = "\n".join(f"  - {name}: recorded {a!r}, now {b!r}" for name, a, b in diffs)
    return SettingError(
        f"{folder} holds a run with {what} ({RECORD_FILE}); continuing it would mix two runs:\n{lines}\nNothing was "
        "trained. Either\n  - start over in this folder: --run_settings#resume false (the earlier checkpoints, the "
        "record and the model files are kept aside as *.bak-<time>), or\n  - train into a new folder: --bundle_root "
        "<another folder>."
    )


def decide_restart(
    run_dir: str | os.PathLike,
    record: Mapping[str, Any] | None = None,
    resume: bool = True,
    resume_from: str | os.PathLike | None = None,
    max_epochs: int | None = None,
) -> RestartDecision:
    """The one decision of how a run starts in ``run_dir``: continue, start a new run, or refuse. The run record's
    writer (:func:`record_run`) and the checkpoint loader
    (:func:`~spectraflow_monai.utils.checkpoint.resume_checkpoint`) both follow it, whatever their order.

    - ``resume`` true and a checkpoint in ``run_dir``: the run continues from the newest checkpoint when the record
      already there agrees with ``record`` on the settings, the model, the components (the optimizer), the data
      fingerprints, the label setup, the seed and the precision; a difference refuses (a :class:`SettingError`
      listing each, recorded value and value now, and the two ways forward). A checkpoint without a record (a run of
      an earlier version) is continued with a warning, and so is a record without a field added since.
    - a run whose record says it finished (:func:`record_finished`) is continued only when it agrees and
      ``max_epochs`` leaves epochs to train (it ended at ``max_epochs``, not by early stopping); otherwise a new run
      starts, with a warning naming why (a finished run of other settings is replaced, never refused).
    - ``resume`` false, or nothing to continue: a new run (the earlier one is kept aside by those who follow).
    - ``resume_from`` (Stage-1's explicit checkpoint file): the run continues from it; the run folder's own run is
      compared as above when ``resume`` is true and it holds a checkpoint, else kept aside (refused when
      ``resume_from`` lies inside the folder that would move).

    It only reads: nothing is moved or written (every process of a distributed run decides alike).

    Args:
        run_dir: the run's checkpoint folder.
        record: the record of the run that starts (:func:`record_run` builds it), compared with the one in
            ``run_dir``; None: not compared. Defaults to None.
        resume: the run settings' ``resume``, a ``bool`` (:class:`~spectraflow_monai.utils.settings.RunSettings`
            makes it one). Defaults to True.
        resume_from: an explicit checkpoint file to continue from, or None. Defaults to None.
        max_epochs: the epochs the run trains to, for a finished run's decision; None: a finished run that agrees
            is continued (a stage whose epochs are not known here). Defaults to None.

    Returns:
        the :class:`~spectraflow_monai.utils.checkpoint.RestartDecision`.

    Raises:
        SettingError: the restart would continue a run of other settings or data, or of an earlier record format;
            ``resume_from`` is not a file, or lies in the folder that a new run keeps aside.
        ValueError: ``resume`` is not a bool, ``max_epochs`` not a positive int.
    """
    if not isinstance(resume, bool):
        raise ValueError(f"resume must be a bool (RunSettings reads a command line's text), got {resume!r}.")
    if max_epochs is not None and (isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1):
        raise SettingError(f"max_epochs must be a positive int, got {max_epochs!r}.")
    folder = os.fspath(run_dir)
    path = os.path.join(folder, RECORD_FILE)
    old = _read_json(path)
    latest = latest_checkpoint(folder)
    resume_from = os.fspath(resume_from) if resume_from not in (None, "") else None
    if resume_from is not None and not os.path.isfile(resume_from):
        raise SettingError(f"resume_from: {resume_from!r} is not an existing checkpoint file.")
    continuing = resume and latest is not None
    reason = "the newest checkpoint of this run; --run_settings#resume false starts over"
    finished = (old or {}).get("finished") if continuing and resume_from is None else None
    no_epoch_left = finished and max_epochs is not None and finished.get("epoch", 0) >= max_epochs
    if finished and (finished.get("stopped_early") or no_epoch_left):
        continuing = False  # nothing left to train: a new run
        why = "stopped early" if finished.get("stopped_early") else f"trained its {finished.get('epoch')} epochs"
        reason = f"a finished run ({why})"
        logger.warning(
            f"{folder} holds a finished run ({why}): a new run starts and the finished one is kept aside (a higher "
            "--max_epochs continues a run that ended at its max_epochs)."
        )
    if continuing and old is None:
        logger.warning(f"{folder} holds checkpoints but no {RECORD_FILE} (an earlier version): continuing unchecked.")
    elif continuing and record is not None:
        _check_earlier_format(old, path)
        diffs = _record_differences(old, record, path)
        if diffs and finished:  # a finished run with other settings or data: nothing of it to continue
            continuing = False
            reason = "a finished run with other settings or data"
            logger.warning(
                f"{folder} holds a finished run with other settings or data ({', '.join(d[0] for d in diffs)}): a new "
                "run starts and the finished one is kept aside."
            )
        elif diffs:
            raise _mixed_runs(folder, "other settings", diffs)
        elif old.get("spectraflow_monai") != record.get("spectraflow_monai"):
            logger.warning(
                f"continuing a run recorded by spectraflow_monai {old.get('spectraflow_monai')} with "
                f"{record.get('spectraflow_monai')}."
            )
    earlier = not continuing and (latest is not None or old is not None)
    if resume_from is not None:
        inside = os.path.commonpath([os.path.abspath(resume_from), os.path.abspath(folder)]) == os.path.abspath(folder)
        if earlier and latest is not None and inside:
            raise SettingError(
                f"resume_from: {resume_from!r} lies in {folder}, which this start keeps aside as a new run "
                "(--run_settings#resume false, or a finished run): give --run_settings#resume true, or a checkpoint "
                "outside that folder."
            )
        return RestartDecision(folder, CONTINUE, resume_from, "resume_from", set_aside_earlier=earlier)
    if continuing:
        return RestartDecision(folder, CONTINUE, os.fspath(latest), reason)
    if not resume:
        reason = "--run_settings#resume false"
    elif latest is None and reason.startswith("the newest"):
        reason = "nothing to continue"
    return RestartDecision(folder, NEW, None, reason, set_aside_earlier=earlier)


def record_run(
    run_dir: str | os.PathLike,
    settings: Mapping[str, Any],
    data_settings: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    data: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    data_source: Any = None,
    label_setup: Any = None,
    seed: Any = None,
    precision: Any = None,
    resume: bool = True,
    not_compared: Mapping[str, Any] | None = None,
    resolved: Mapping[str, Any] | None = None,
    max_epochs: int | None = None,
    components: Mapping[str, Any] | None = None,
    resume_from: str | os.PathLike | None = None,
) -> RestartDecision:
    """Decide how the run that starts in ``run_dir`` starts (:func:`decide_restart`: continue, new run, or refuse
    before anything is written) and write its record.

    A new run keeps the earlier one aside (:func:`~spectraflow_monai.utils.checkpoint.set_aside`): the whole folder
    (``<run_dir>.bak-<time>``, its checkpoints and record), or without checkpoints the earlier record
    (``run_record.json.bak-<time>``). The decision returned is what the checkpoint loader follows
    (:func:`~spectraflow_monai.utils.checkpoint.resume_checkpoint`), so that the record and the checkpoints never
    tell two stories.

    Args:
        run_dir: the run's checkpoint folder (``models/stage2``, ``models/stage1``).
        settings: the stage's settings object (:class:`~spectraflow_monai.utils.settings.Stage2Settings`,
            :class:`~spectraflow_monai.utils.settings.Stage1Settings`), written whole (a mapping is recorded as it is).
        data_settings: the run's :class:`~spectraflow_monai.utils.settings.DataSettings`, written whole under
            ``settings.data``. Defaults to None.
        model: the :class:`~spectraflow_monai.utils.settings.ModelSettings` (also written beside the model files
            by the savers). Defaults to None.
        data: ``{split: datalist}``; each is recorded as :func:`data_fingerprint`. Defaults to None.
        data_source: the data source (recorded by its ``repr``, e.g. the preset and folder). Defaults to None.
        label_setup: what the labels are (recorded by ``repr``). Defaults to None.
        seed: the data / determinism seed. Defaults to None.
        precision: the resolved precision. Defaults to None.
        resume: the run settings' ``resume`` (a bool). Defaults to True.
        not_compared: settings recorded but free to change between restarts (``max_epochs``, ``num_workers``, the
            device). Defaults to None.
        resolved: what the settings resolved to when the run started (Stage-2's ``encoder_start``: where
            ``encoder_init: auto`` started the encoder), recorded and compared under ``settings.resolved``.
            Defaults to None.
        max_epochs: the epochs the run trains to, for a finished run's decision (:func:`decide_restart`). Defaults
            to None.
        components: ``{name: object}`` of the components the run trains with, recorded whole and compared under
            ``components`` (:func:`component_record`: the optimizer that was built, its class and
            hyper-parameters). Defaults to None: recorded once they are built (:func:`record_components`); a
            continued run keeps those of its record until then.
        resume_from: an explicit checkpoint to continue from (Stage-1's). Defaults to None.

    Returns:
        the :class:`~spectraflow_monai.utils.checkpoint.RestartDecision`, with the record written (``.record``).

    Raises:
        SettingError: see :func:`decide_restart`.
    """
    settings = {**_plain(settings), **({} if data_settings is None else {"data": _plain(data_settings)})}
    if resolved:
        settings["resolved"] = _plain(dict(resolved))
    folder = os.fspath(run_dir)
    path = os.path.join(folder, RECORD_FILE)
    record = {
        "settings": settings,
        "model": _plain(model if model is not None else {}),
        **({} if components is None else {"components": {str(k): component_record(v) for k, v in components.items()}}),
        "data": {str(k): data_fingerprint(v) for k, v in (data or {}).items()},
        "data_source": _plain(data_source),
        "label_setup": _plain(label_setup),
        "seed": _plain(seed),
        "precision": _plain(precision),
        "not_compared": _plain(dict(not_compared or {})),
        "format": RECORD_FORMAT,
        "spectraflow_monai": _version(),
    }
    decision = decide_restart(folder, record, resume=resume, resume_from=resume_from, max_epochs=max_epochs)
    if components is None:  # recorded when built (record_components); a continued run keeps those it holds
        earlier = (_read_json(path) or {}).get("components") if decision.continues else None
        record["components"] = dict(earlier or {})
    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        dist.barrier()  # every process has decided before rank 0 moves anything
    if process_rank() == 0:
        if decision.set_aside_earlier and latest_checkpoint(folder) is not None:  # the earlier run, record included
            set_aside(folder, decision.stamp)
        elif decision.set_aside_earlier and os.path.isfile(path):
            set_aside(path, decision.stamp)
        os.makedirs(folder, exist_ok=True)
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    if distributed:
        dist.barrier()  # every process sees the folder as decided
    logger.info(f"run record: {path} ({decision.action}: {decision.reason})")
    return dataclasses.replace(decision, record=record)


def record_components(decision: RestartDecision, **components: Any) -> dict[str, Any]:
    """Record the components a run really trains with (``optimizer=trainer.optimizer``: the optimizer object the
    trainer holds, whatever config built it) in the run record that ``decision`` wrote (:func:`record_run`), whole
    (:func:`component_record`: class path, defaults, parameter groups). A run that continues must train with the
    components its record holds: a difference stops it before any training, naming each (a component its record was
    written without is added with a warning). Rank 0 writes; returns the record.

    Raises:
        SettingError: a continued run's component differs from its record; or the record is missing (the run record
            is written first, :func:`record_run`).
        ValueError: ``decision`` is not a :class:`~spectraflow_monai.utils.checkpoint.RestartDecision`.
    """
    if not isinstance(decision, RestartDecision):
        raise ValueError(f"decision must be a RestartDecision (record_run), got {decision!r}.")
    path = os.path.join(decision.run_dir, RECORD_FILE)
    record = _read_json(path)
    if record is None:
        raise SettingError(f"{path} is missing: the run record is written before training (run_record in `run`).")
    built = {str(k): component_record(v) for k, v in components.items()}
    held = dict(record.get("components") or {})
    if decision.continues:
        diffs = _record_differences({"components": held}, {"components": {**held, **built}}, path)
        if diffs:
            raise _mixed_runs(decision.run_dir, "other components (the optimizer or loss that was built)", diffs)
    record["components"] = {**held, **built}
    if process_rank() == 0:
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return record


def record_finished(run_dir: str | os.PathLike, epoch: int, max_epochs: int) -> None:
    """Note in the run record of ``run_dir`` that its run ended after ``epoch`` of ``max_epochs`` epochs (fewer:
    early stopping ended it), so that a later start decides between continuing it and a new run (:func:`record_run`).
    Not compared; rank 0 writes it."""
    path = os.path.join(os.fspath(run_dir), RECORD_FILE)
    record = _read_json(path)
    if record is None or process_rank() != 0:
        return
    epoch, max_epochs = int(epoch), int(max_epochs)
    record["finished"] = {"epoch": epoch, "max_epochs": max_epochs, "stopped_early": epoch < max_epochs}
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")


def settings_digest(settings: Mapping[str, Any]) -> str:
    """The SHA-256 of model settings as a record holds them: of their canonical JSON
    (``json.dumps(settings, sort_keys=True)``), what ``model.json`` records as ``settings_sha256``."""
    return hashlib.sha256(json.dumps(_plain(settings), sort_keys=True).encode()).hexdigest()


def _warn_once(record: str, what: str, message: str) -> None:
    if (record, what) not in _WARNED:
        _WARNED.add((record, what))
        logger.warning(message)


@dataclasses.dataclass(frozen=True)
class RecordedModel:
    """What a model record (``model.json``) holds of a trained model: its settings and where its encoder started
    (:func:`write_model_settings`). A model saver given one (``model_settings=RecordedModel(...)``) writes both.

    Args:
        settings: the :class:`~spectraflow_monai.utils.settings.ModelSettings` (or their mapping).
        encoder_start: where the encoder started: ``{"start": "stage1" | "pretrained" | "random", "encoder_init":
            the setting, "weights": the Stage-1 export, "timm", a file or None (random initialisation), and
            "weights_sha256" of a file}``; None for a network without an encoder (the baselines): nothing recorded.
            Defaults to None.
    """

    settings: Any
    encoder_start: Mapping[str, Any] | None = None


def write_model_settings(
    model_file: str | os.PathLike, settings: ModelSettings | Mapping[str, Any] | RecordedModel
) -> str:
    """Write the model settings (a :class:`~spectraflow_monai.utils.settings.ModelSettings`, whole) beside
    ``model_file`` (:func:`model_settings_path`), atomically; returns the path.

    The record holds the settings under ``model``, the model file's name, ``model_sha256`` (the SHA-256 of the model
    file's bytes, :func:`file_digest`) and ``settings_sha256`` (:func:`settings_digest` of ``model``), so that a
    reader refuses a record beside another model file or one edited by hand (:func:`check_model_digest`). Given a
    :class:`RecordedModel`, it also holds ``encoder_start``: where the encoder started (the Stage-1 export,
    pretrained weights and which, or random), beside the settings (not one of them: readers of the settings never
    see it; :attr:`ModelRecord.encoder_start` reads it). Write the model file first: a record written while there
    is no model file holds no ``model_sha256`` (with a warning) and its model file is then read unchecked.
    """
    path = model_settings_path(model_file)
    start = settings.encoder_start if isinstance(settings, RecordedModel) else None
    model = _plain(settings.settings if isinstance(settings, RecordedModel) else settings)
    content = {"model": model, "model_file": os.path.basename(os.fspath(model_file))}
    if start is not None:
        content["encoder_start"] = _plain(dict(start))
    if os.path.isfile(model_file):
        content[MODEL_DIGEST_KEY] = file_digest(model_file)
    else:
        logger.warning(f"{path}: written before its model file {os.fspath(model_file)} exists: no {MODEL_DIGEST_KEY} "
                       "recorded.")  # fmt: skip
    content[SETTINGS_DIGEST_KEY] = settings_digest(model)
    content["format"] = RECORD_FORMAT
    content["spectraflow_monai"] = _version()
    write_text_atomic(path, json.dumps(content, indent=2) + "\n")
    return path


def _model_record(model_file: str | os.PathLike) -> dict[str, Any] | None:
    """The record beside ``model_file`` (all of it), its settings checked against its ``settings_sha256``; None when
    there is none."""
    path = model_settings_path(model_file)
    content = _read_json(path)
    if content is None:
        return None
    if not isinstance(content, dict) or not isinstance(content.get("model") or {}, dict):
        raise SettingError(f"{path} is not a model record (no 'model' settings): put the model.json its training wrote "
                           f"beside {os.fspath(model_file)}, or re-train.")  # fmt: skip
    recorded = content.get(SETTINGS_DIGEST_KEY)
    if recorded is None:
        _warn_once(path, SETTINGS_DIGEST_KEY, f"{path} holds no {SETTINGS_DIGEST_KEY} (written by an earlier "
                   "version): its settings are read unchecked; re-train to record it.")  # fmt: skip
    elif recorded != settings_digest(content.get("model") or {}):
        raise SettingError(
            f"{path} was edited after it was written (its model settings no longer match its {SETTINGS_DIGEST_KEY}): "
            f"put the model.json its training wrote beside {os.fspath(model_file)}, or re-train."
        )
    return content


def read_model_settings(model_file: str | os.PathLike) -> dict[str, Any] | None:
    """The model settings recorded beside ``model_file``, or None when there is no record.

    Raises:
        SettingError: the record cannot be read, or its settings were edited after it was written (they differ from
            its ``settings_sha256``; a record without it, of an earlier version, is read with a warning).
    """
    content = _model_record(model_file)
    return None if content is None else dict(content.get("model") or {})


def check_model_digest(model_file: str | os.PathLike) -> None:
    """Refuse a model file that is not the one its record (``model.json`` beside it) was written for.

    The record's ``settings_sha256`` must match its settings (an edited record is refused) and its ``model_sha256``
    the SHA-256 of ``model_file``'s bytes (a record beside a retrained or foreign model file is refused). A record of
    an earlier version without a digest is accepted with a warning naming it; a model file without a record is not
    checked (:class:`ModelRecord` warns about it).

    Args:
        model_file: the model file (``models/model.pt``).

    Raises:
        DataError: ``model_file`` does not exist while a record is beside it.
        SettingError: in one line naming the model file, the record and the fix, when a digest differs.
    """
    model_file = os.fspath(model_file)
    path = model_settings_path(model_file)
    content = _model_record(model_file)
    if content is None:
        return
    if not os.path.isfile(model_file):
        raise DataError(f"model file {model_file!r} does not exist (its record {path} does).")
    recorded = content.get(MODEL_DIGEST_KEY)
    if recorded is None:
        _warn_once(path, MODEL_DIGEST_KEY, f"{path} holds no {MODEL_DIGEST_KEY} (written by an earlier version): "
                   f"{model_file} is not checked against it; re-train to record it.")  # fmt: skip
    elif recorded != file_digest(model_file):
        name = os.path.basename(path)
        raise SettingError(
            f"{model_file}: {path} was written for another {os.path.basename(model_file)} (its {MODEL_DIGEST_KEY} "
            f"is not this file's): put the {name} its training wrote beside it, or re-train."
        )


def weights_mismatch(model_file: str | os.PathLike, error: BaseException) -> SettingError:
    """The one-line :class:`SettingError` of a model file whose weights do not load into the network built from its
    record (``error``: PyTorch's ``Error(s) in loading state_dict``, whose first detail line it quotes), naming the
    model file, the record and the fix."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    detail = lines[1] if len(lines) > 1 else lines[0]
    detail = detail if len(detail) <= 200 else detail[:200] + "..."
    return SettingError(
        f"{os.fspath(model_file)}: its weights do not fit the network its record {model_settings_path(model_file)} "
        f"describes ({detail}): put the model.json its training wrote beside it, or re-train."
    )


def model_exports(model_file: str | os.PathLike) -> list[Path]:
    """The exports of ``model_file`` beside it: ``<stem>.onnx`` and ``<stem>_*.onnx`` / ``<stem>-*.onnx`` /
    ``<stem>.*.onnx`` (e.g. an int8 export ``model_int8.onnx``), regular files only (no links)."""
    model_file = Path(os.fspath(model_file))
    if not model_file.parent.is_dir():
        return []
    pattern = re.compile(re.escape(model_file.stem) + r"(?:[._-][^/]*)?\.onnx")
    return sorted(
        p for p in model_file.parent.iterdir() if pattern.fullmatch(p.name) and p.is_file() and not p.is_symlink()
    )


def set_exports_aside(model_file: str | os.PathLike, stamp: str | None = None) -> list[Path]:
    """Keep the exports of ``model_file`` (:func:`model_exports`) aside as ``<name>.bak-<time>``
    (:func:`~spectraflow_monai.utils.checkpoint.set_aside`), before a new ``model_file`` replaces the one they were
    exported from: no stale export stays beside a new model. Returns the new paths."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    return [set_aside(p, stamp) for p in model_exports(model_file)]


def check_model_settings(
    model_file: str | os.PathLike, given: Mapping[str, Any], what: str = "the model", hint: str = ""
) -> None:
    """Raise :class:`SettingError` naming each of ``given`` that differs from the record beside ``model_file``.

    Settings the record does not hold, the encoder settings of a baseline's record (its architecture does not read
    them), and files without a record, are not checked.
    """
    recorded = read_model_settings(model_file)
    if recorded is None:
        return
    has_encoder = architecture(recorded.get("architecture", "spectraflow"), model_settings_path(model_file)).has_encoder
    unread = () if has_encoder else ENCODER_FIELDS
    checked = {k: v for k, v in given.items() if k in recorded and k not in unread}
    diffs = [d for k, v in checked.items() for d in _differences(recorded[k], _plain(v), k)]
    if diffs:
        lines = "\n".join(f"  - {name}: {a!r} in the record, {b!r} given" for name, a, b in diffs)
        raise SettingError(
            f"{what} '{os.fspath(model_file)}' was built with other settings ({model_settings_path(model_file)}):\n"
            f"{lines}\n{hint or 'Give the recorded values, or leave these settings out.'}"
        )


class ModelRecord:
    """The model settings of a model file, for evaluation and inference: the record beside it.

    A bundle's evaluation / inference config builds the network from this object
    (:func:`~spectraflow_monai.apps.workflow.recorded_network`) and reads the settings its transforms need from it
    (``image_size: "$@model_record.image_size"``). A model setting given on the command line replaces the read one
    and must agree with the record, else a :class:`SettingError` names both values: the settings only the network
    reads come in ``given`` (``null`` in the config: not given), the others are checked by
    :func:`check_model_settings`, a step of the evaluation config's ``run`` list and of the inference config's
    ``initialize`` list.

    The settings are a :class:`~spectraflow_monai.utils.settings.ModelSettings` (``.settings``): its fields are
    this object's attributes (``image_mean`` and ``image_std`` included, so a model trained with its own
    normalisation is evaluated and served with it), the architecture and its arguments (a baseline is rebuilt as
    the network it is), and the Synapse bundle's preprocessing (``hu_window``, ``label_map``, ``class_names``,
    ``nonfinite``, ``nonfinite_value``: a model trained with a label map writes the source label values). A record of
    an earlier version without the normalisation reads as DINOv2's ImageNet normalisation, and one without a
    setting of ``defaults`` reads as that default; a warning names them.

    Args:
        model_file: the model file (``models/model.pt``).
        defaults: values of the settings a record does not hold (an earlier version's record; a warning names
            them), or of a model file without a record (written by hand; a warning says so), over
            :class:`~spectraflow_monai.utils.settings.ModelSettings`'s defaults.
            Defaults to None.
        given: ``{setting: value}`` given on the command line; None values are not given. Each given value is
            checked against the record and replaces the read one. Defaults to None.

    The record must be the one written for ``model_file`` (:func:`check_model_digest`, when the model file is
    there: the ONNX inference reads the record of a model file that may be absent).

    Raises:
        SettingError: a given value differs from the record, naming both; a record that cannot be read, that was
            edited, or that was written for another model file.
    """

    def __init__(
        self,
        model_file: str | os.PathLike,
        defaults: Mapping[str, Any] | None = None,
        given: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_file = os.fspath(model_file)
        content = _model_record(self.model_file)
        self.recorded = None if content is None else dict(content.get("model") or {})
        #: where the model's encoder started (``encoder_start`` of the record: the Stage-1 export, pretrained
        #: weights, random), None for a network without an encoder or a record written before it was recorded
        self.encoder_start: dict[str, Any] | None = None if content is None else content.get("encoder_start")
        # the record must be this model file's; a model file that is not there is the config's weights check's error
        # (or the ONNX inference, which reads the record only)
        if self.recorded is not None and os.path.isfile(self.model_file):
            check_model_digest(self.model_file)
        if self.recorded is None:
            logger.warning(
                f"{self.model_file}: no settings recorded beside it ({model_settings_path(self.model_file)}); the "
                "model settings are the defaults or the values given."
            )
        elif "image_mean" not in self.recorded or "image_std" not in self.recorded:
            logger.warning(
                f"{model_settings_path(self.model_file)} was written before the normalisation was recorded: "
                f"DINOv2's ImageNet image_mean {list(IMAGENET_MEAN)} / image_std {list(IMAGENET_STD)} assumed."
            )
        if self.recorded is not None:
            earlier = {k: v for k, v in (defaults or {}).items() if k not in self.recorded and k not in _DERIVED}
            if earlier:
                logger.warning(
                    f"{model_settings_path(self.model_file)} was written before these settings were recorded: "
                    + ", ".join(f"{k} {_plain(v)!r}" for k, v in earlier.items())
                    + " assumed (the defaults of this config)."
                )
        given = {k: _plain(v) for k, v in (given or {}).items() if v is not None}
        self.check(**given)
        values = {**dict(defaults or {}), **(self.recorded or {}), **given}
        if "out_channels" not in values and values.get("num_classes"):  # a record of an earlier version
            values["out_channels"] = values["num_classes"]
        self.settings = ModelSettings.from_dict(values, source=model_settings_path(self.model_file))

    def __getattr__(self, name: str) -> Any:
        settings = self.__dict__.get("settings")
        if settings is not None and name in settings.to_dict():
            return getattr(settings, name)
        raise AttributeError(f"no model setting {name!r} in {self.__dict__.get('model_file')!r}")

    def check(self, **given: Any) -> dict[str, Any]:
        """Raise :class:`SettingError` naming every ``given`` setting that differs from the record; returns them."""
        check_model_settings(
            self.model_file,
            given,
            hint="Leave these settings out: evaluation and inference read them from the record.",
        )
        return given

    def __repr__(self) -> str:
        return f"ModelRecord({self.model_file!r}, {self.settings})"
