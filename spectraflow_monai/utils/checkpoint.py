"""Atomic checkpoint writing helpers.

Every checkpoint of the bundles (the resumable training checkpoints, ``models/model.pt`` and the SpectraFlow
Stage-1 encoder export, Chen et al., "SpectraFlow", Sec. "Implementation Details") is written by
:func:`atomic_torch_save`: the object is serialised to a temporary file in the destination folder, flushed to disk
and moved over the destination with ``os.replace``, so an interrupted run never leaves a truncated file behind and
readers see either the old or the new file. :func:`check_finite_state` refuses to let a non-finite tensor reach a
checkpoint, and :func:`resume_checkpoint` decides, at the start of a run, whether it continues from the run
folder's latest checkpoint or starts over (setting earlier results aside).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spectraflow_monai.utils.errors import SettingError, TrainingError
from spectraflow_monai.utils.files import atomic_path
from spectraflow_monai.utils.distributed import process_rank
from spectraflow_monai.utils.settings import as_bool, model_settings_path

__all__ = [
    "RECORD_FILE",
    "SET_ASIDE_KEPT",
    "NonFiniteStateError",
    "atomic_torch_save",
    "check_finite_state",
    "cpu_state_dict",
    "latest_checkpoint",
    "resume_checkpoint",
    "set_aside",
]

logger = logging.getLogger(__name__)

_EPOCH_FILE = re.compile(r"^checkpoint_epoch=(\d+)\.pt$")
_FINAL_FILE = "checkpoint_final.pt"
#: name of the run record in a run's checkpoint folder (:func:`spectraflow_monai.utils.run_record.record_run`)
RECORD_FILE = "run_record.json"
#: how many earlier versions of one file or run folder :func:`set_aside` keeps (``<name>.bak-<time>``); older ones
#: that it set aside are removed, so that repeated starts (e.g. MONAI Label's ``/train``) stay bounded on disk
SET_ASIDE_KEPT = 3
_SET_ASIDE_SUFFIX = r"\.bak-\d{8}-\d{6}(?:-\d+)?"
# the files a run writes into its folder: checkpoints, its record and the earlier records it set aside
_RUN_FILE = re.compile(
    r"checkpoint_epoch=\d+\.pt|" + re.escape(_FINAL_FILE) + "|" + re.escape(RECORD_FILE) + f"(?:{_SET_ASIDE_SUFFIX})?"
)


class NonFiniteStateError(TrainingError):
    """A state to be saved holds a NaN or infinite value; nothing was written."""


def cpu_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """Detached CPU copy of a state dict (tensors cloned, other values kept).

    Args:
        state: a ``state_dict()``-like mapping.

    Returns:
        a new dict whose tensors are detached, contiguous CPU clones, safe to save while training continues.
    """
    return {
        k: (v.detach().to("cpu", copy=True).contiguous() if isinstance(v, torch.Tensor) else v)
        for k, v in state.items()
    }


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (temporary file in the same folder, fsync, ``os.replace``).

    The parent folder is created when missing. On any failure the temporary file is removed and the destination
    is left untouched.

    Args:
        obj: anything ``torch.save`` accepts (a state dict of tensors is loadable with ``weights_only=True``).
        path: destination file.

    Returns:
        the destination as a ``Path``.

    Raises:
        ValueError: ``path`` is an existing directory.
        OSError: the file could not be written (with the destination named in the message).
    """
    dest = Path(os.fspath(path)).expanduser()
    try:
        with atomic_path(dest, suffix=".tmp") as tmp, open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise OSError(f"could not write '{dest}': {exc}") from exc
    return dest


def _first_non_finite(obj: Any, prefix: str = "") -> str | None:
    """Key path of the first floating-point tensor (or float) of ``obj`` holding NaN/inf, or ``None``."""
    if isinstance(obj, torch.Tensor):
        if (obj.is_floating_point() or obj.is_complex()) and not bool(torch.isfinite(obj).all()):
            return prefix or "<tensor>"
        return None
    if isinstance(obj, float):
        return None  # plain numbers (best scores, mode_worse = inf of ReduceLROnPlateau) are bookkeeping
    if isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = _first_non_finite(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


def check_finite_state(state: Any, what: str = "checkpoint") -> None:
    """Raise :class:`NonFiniteStateError` when a floating-point tensor of ``state`` holds NaN or inf.

    Args:
        state: a tensor, or a (nested) mapping / sequence of them (state dicts, checkpoints).
        what: what would have been written (a file name), for the message.

    Raises:
        NonFiniteStateError: naming ``what`` and the key of the first non-finite tensor.
    """
    found = _first_non_finite(state)
    if found is not None:
        raise NonFiniteStateError(
            f"{what}: not written, its tensor {found!r} holds NaN or inf values (the training diverged); the "
            "files written before are kept."
        )


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The newest resumable checkpoint of ``folder``, or ``None``.

    Candidates are MONAI ``CheckpointSaver`` files ``checkpoint_epoch=<N>.pt`` (the highest ``N`` wins) and
    ``checkpoint_final.pt``, which wins when it is newer than that (it is written at the end of a run).
    """
    folder = Path(os.fspath(folder)).expanduser()
    if not folder.is_dir():
        return None
    epochs = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _EPOCH_FILE.match(p.name)) and p.is_file()]
    best = max(epochs, key=lambda e: e[0])[1] if epochs else None
    final = folder / _FINAL_FILE
    if final.is_file() and (best is None or final.stat().st_mtime_ns >= best.stat().st_mtime_ns):
        best = final
    return best


def set_aside(path: str | os.PathLike, stamp: str | None = None, copy: bool = False) -> Path:
    """Keep ``path`` (a file or folder) as ``<path>.bak-<timestamp>`` and log it as a warning; returns the new path.

    With ``copy=False`` the path is renamed; with ``copy=True`` (files only) a copy is written atomically and the
    original stays in place, so that a run may still read it (e.g. fine-tuning that starts from ``model.pt``).

    The newest :data:`SET_ASIDE_KEPT` versions of ``path`` are kept; older ``<name>.bak-<time>`` files are removed,
    and older folders lose the files a run writes there (checkpoints, the run record), the folder itself only when
    nothing else is in it (a file someone else put there keeps it, with a warning).
    """
    path = Path(os.fspath(path))
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.bak-{stamp}-{n}")
        n += 1
    if copy:
        with atomic_path(target) as tmp:
            shutil.copy2(path, tmp)
        logger.warning(f"starting over: kept a copy of the earlier '{path}' as '{target}'; this run may replace it.")
    else:
        os.replace(path, target)
        logger.warning(f"starting over: kept the earlier '{path}' aside as '{target}'.")
    _prune_set_aside(path, SET_ASIDE_KEPT)
    return target


def _prune_set_aside(path: Path, keep: int) -> None:
    """Remove the versions of ``path`` that :func:`set_aside` made, but the newest ``keep`` (see there)."""
    pattern = re.compile(re.escape(path.name) + _SET_ASIDE_SUFFIX + "$")
    versions = sorted(p for p in path.parent.iterdir() if pattern.match(p.name))  # the time stamps sort by name
    for old in versions[: max(len(versions) - keep, 0)]:
        if old.is_file():
            old.unlink()
        elif old.is_dir():
            for f in old.iterdir():
                if f.is_file() and _RUN_FILE.fullmatch(f.name):
                    f.unlink()
            if any(old.iterdir()):
                logger.warning(f"'{old}' holds files a run did not write there: it is kept.")
                continue
            old.rmdir()
        logger.info(f"removed '{old}' (only the newest {keep} set-aside versions of '{path.name}' are kept).")


def resume_checkpoint(
    checkpoint_dir: str | os.PathLike,
    resume: bool | str = True,
    resume_from: str | os.PathLike | None = None,
    protect: Sequence[str | os.PathLike] = (),
) -> str | None:
    """Decide at the start of a run where it continues from, and keep earlier results from being overwritten.

    - ``resume_from`` (an explicit checkpoint file) is returned as it is;
    - else, with ``resume`` true, the newest checkpoint of ``checkpoint_dir`` (:func:`latest_checkpoint`) is
      returned: the run continues from it (model, optimizer, schedules, early stopping, best metric, epoch, RNG);
    - else (``resume`` false, or no checkpoint to continue from) the run starts over: the checkpoints of
      ``checkpoint_dir`` are renamed to ``<name>.bak-<timestamp>`` and every existing file of ``protect``
      (``models/model.pt``, the best model of an earlier run) is copied to ``<name>.bak-<timestamp>``, with a
      warning, so that the new run never replaces them silently while a fine-tuning run can still read
      ``model.pt``; ``None`` is returned.

    In a distributed run only rank 0 renames files; every rank returns the same answer.

    Args:
        checkpoint_dir: the run's folder of resumable checkpoints.
        resume: continue from ``checkpoint_dir`` when it holds a checkpoint (``true``/``false``, also as text).
        resume_from: an explicit checkpoint file to continue from, or ``None``.
        protect: files of an earlier run to keep aside when starting over.

    Raises:
        SettingError: ``resume`` is not a boolean, or ``resume_from`` is not an existing file.
    """
    resume = as_bool(resume, "resume")
    if resume_from:
        if not os.path.isfile(resume_from):
            raise SettingError(f"resume_from: {os.fspath(resume_from)!r} is not an existing checkpoint file.")
        logger.warning(f"resuming from the checkpoint '{resume_from}' (resume_from).")
        return os.fspath(resume_from)
    latest = latest_checkpoint(checkpoint_dir) if resume else None
    if latest is not None:
        logger.warning(f"resuming from '{latest}' (the newest checkpoint of this run; --resume false starts over).")
        return os.fspath(latest)
    if process_rank() == 0:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = Path(os.fspath(checkpoint_dir))
        if latest_checkpoint(folder) is not None:
            set_aside(folder, stamp)
        for path in protect:  # with the settings written beside a model file (model.pt -> model.json)
            for file in (os.fspath(path), model_settings_path(path)):
                if os.path.isfile(file):
                    set_aside(file, stamp, copy=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return None
