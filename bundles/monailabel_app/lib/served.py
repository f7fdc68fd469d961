"""The server's own copy of each bundle (docs/monailabel.md, "Serving safely").

The app never trains or reads configs from the installed bundle folder, nor from a folder that a request can write
to: at start it makes (or refreshes) a copy of each served bundle under its model folder (``--conf model_dir``,
default ``<app>/model``), and serves and trains that copy:

- ``configs/`` (and ``scripts/`` when the bundle has one) mirror the installed bundle at every start: changed files
  are replaced atomically, files the installed bundle does not have are removed, so that the configs the server
  runs are always the installed ones;
- ``models/``: files of the installed ``models/`` that the copy lacks are copied once (the initial ``model.pt``, a
  Stage-1 export); after that the copy's ``models/model.pt`` is the served model, which training replaces;
- everything a run writes (``logs/``, ``runs/``, the slice cache) stays in the copy;
- a new served model (a training run's best model, an upload of ``PUT /model/<name>``) replaces ``models/model.pt``
  atomically and the model it replaces is kept as ``models/model.pt.previous``, one step back
  (:func:`replace_served_model`); ``DELETE /model/<name>`` moves the served model there
  (:func:`set_aside_served_model`).

- model backups, ``models/<file>.bak-<date>-<time>`` (what a bundle run that starts over keeps aside, e.g. a run in
  the installed bundle with ``resume`` false), are bounded: the installed bundle's are not copied (nor its ledger of
  them), and the served copy keeps the newest ``--conf kept_model_backups`` of each file or run folder (default
  :data:`DEFAULT_KEPT_BACKUPS`), pruned at start and after each training run (:func:`prune_backups`, each removal
  logged). Only the backups that the bundle runs in the served copy made are removed (those recorded in
  ``models/.spectraflow-set-aside.json``, :func:`spectraflow_monai.utils.checkpoint.prune_set_aside`); a file,
  folder or link that is only named like one is never removed.

Each bundle folder stands alone (its ``configs/`` are plain files), and so does its served copy.

The model folder must not overlap the studies folder (the only folder requests write to).
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
from typing import Any

from spectraflow_monai.utils.checkpoint import (
    SET_ASIDE_LEDGER,
    is_set_aside_name,
    prune_set_aside,
)
from spectraflow_monai.utils.files import atomic_path

__all__ = [
    "DEFAULT_KEPT_BACKUPS",
    "MIRRORED",
    "PREVIOUS_SUFFIX",
    "check_apart",
    "kept_backups",
    "prune_backups",
    "replace_served_model",
    "served_copy",
    "set_aside_served_model",
]

logger = logging.getLogger(__name__)

#: bundle folders that are code: mirrored from the installed bundle at every start
MIRRORED = ("configs", "scripts")
#: the model a new served model replaced: ``models/model.pt`` -> ``models/model.pt.previous`` (not a ``*.pt`` file,
#: so no request can choose it as ``model_filename``)
PREVIOUS_SUFFIX = ".previous"
#: model backups kept per file in the served copy's ``models/`` (``--conf kept_model_backups``)
DEFAULT_KEPT_BACKUPS = 2


def kept_backups(conf: dict[str, Any]) -> int:
    """``--conf kept_model_backups``: how many backups of each model file the served copy keeps (an integer >= 0;
    default :data:`DEFAULT_KEPT_BACKUPS`).

    Raises:
        ValueError: naming the setting and the value.
    """
    text = conf.get("kept_model_backups")
    if text in (None, ""):
        return DEFAULT_KEPT_BACKUPS
    try:
        value = int(str(text).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"--conf kept_model_backups must be an integer >= 0, got {text!r}.")
    return value


def prune_backups(folder: str, keep: int) -> list[str]:
    """Keep the newest ``keep`` backups of each file (or run folder) that the bundle runs made in ``folder`` (the
    served copy's ``models/``); returns the names removed (each removal logged).

    The backups are the versions that :func:`spectraflow_monai.utils.checkpoint.set_aside` recorded in ``folder``
    (``<name>.bak-<date>-<time>[-<n>]``), and only those still as it made them are removed
    (:func:`spectraflow_monai.utils.checkpoint.prune_set_aside`): a file, folder or link that is only named like a
    backup, or a backup replaced since, is never removed and not counted; links are never followed; of a run folder
    only the files a run writes there are removed, the folder itself only when that leaves it empty.
    """
    removed = prune_set_aside(folder, keep)
    if removed:
        logger.info(f"{folder}: removed {len(removed)} older model backup(s), {keep} of each kept: {removed}")
    return removed


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_apart(folder: str, what: str, studies: str) -> None:
    """Refuse a ``folder`` that lies inside the studies folder or holds it.

    Args:
        folder: a folder the server reads code or weights from (its model folder, an installed bundle).
        what: how to name it in the message (the setting).
        studies: the studies folder; a URL (DICOMweb) is not checked.

    Raises:
        ValueError: naming both folders.
    """
    if studies.startswith(("http://", "https://")):
        return
    if _inside(folder, studies) or _inside(studies, folder):
        raise ValueError(
            f"{what} {folder!r} and the studies folder {studies!r} overlap: requests write to the studies folder, "
            "so the server must not read configs or weights from there. Choose folders apart."
        )


def _copy_file(src: str, dest: str) -> bool:
    if os.path.isfile(dest) and filecmp.cmp(src, dest, shallow=False):
        return False
    with atomic_path(dest, suffix=".tmp") as tmp:
        shutil.copyfile(src, tmp)
    return True


def _mirror(src: str, dest: str) -> list[str]:
    """Make folder ``dest`` hold exactly the files of ``src``; returns the files written or removed."""
    changed = []
    wanted = set()
    for root, _, files in os.walk(src):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), src)
            wanted.add(rel)
            if _copy_file(os.path.join(root, name), os.path.join(dest, rel)):
                changed.append(rel)
    for root, dirs, files in os.walk(dest, topdown=False):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), dest)
            if rel not in wanted:
                os.remove(os.path.join(root, name))
                changed.append(rel)
        for name in dirs:
            path = os.path.join(root, name)
            if not os.listdir(path):
                os.rmdir(path)
    return changed


def served_copy(installed: str, dest: str, keep_backups: int = DEFAULT_KEPT_BACKUPS) -> str:
    """Create or refresh the server's copy ``dest`` of the bundle at ``installed`` (see the module docstring).

    Args:
        installed: the installed bundle folder (read only).
        dest: the copy, e.g. ``<model_dir>/<bundle name>``.
        keep_backups: model backups kept per file in the copy's ``models/`` (:func:`prune_backups`). Default
            :data:`DEFAULT_KEPT_BACKUPS`.

    Returns:
        ``dest`` as an absolute path.
    """
    dest = os.path.abspath(dest)
    if _inside(dest, installed) or _inside(installed, dest):
        raise ValueError(f"the served copy {dest!r} and the installed bundle {installed!r} must be apart.")
    os.makedirs(dest, exist_ok=True)
    for folder in MIRRORED:
        src = os.path.join(installed, folder)
        if os.path.isdir(src):
            changed = _mirror(src, os.path.join(dest, folder))
            if changed:
                logger.info(f"served copy {dest}: {folder}/ refreshed from {installed} ({len(changed)} files)")
        elif os.path.isdir(os.path.join(dest, folder)):
            shutil.rmtree(os.path.join(dest, folder))
    models = os.path.join(installed, "models")
    if os.path.isdir(models):
        for name in sorted(os.listdir(models)):
            src, target = os.path.join(models, name), os.path.join(dest, "models", name)
            backup = is_set_aside_name(name) or name == SET_ASIDE_LEDGER
            if os.path.isfile(src) and not os.path.exists(target) and not backup:
                _copy_file(src, target)
                logger.info(f"served copy {dest}: models/{name} copied from {installed}")
    prune_backups(os.path.join(dest, "models"), keep_backups)
    return dest


def _keep_previous(served: str) -> None:
    """Make ``<served>.previous`` a copy of ``served`` (a hard link where the file system allows), atomically."""
    previous = served + PREVIOUS_SUFFIX
    with atomic_path(previous, suffix=".tmp") as tmp:
        os.remove(tmp)
        try:
            os.link(served, tmp)
        except OSError:
            shutil.copyfile(served, tmp)


def replace_served_model(new: str, served: str) -> bool:
    """Serve ``new`` as ``served`` (``models/model.pt``): the current file is kept as ``<served>.previous`` (one step
    back; the one before it is dropped) and ``new`` replaces ``served`` atomically, so a reader sees the old or the
    new model, never a part of one. ``new`` is moved when it is on the same file system, else copied first.

    Args:
        new: the checked model file.
        served: the served model file.

    Returns:
        whether a served model was replaced (else ``served`` did not exist).
    """
    os.makedirs(os.path.dirname(served), exist_ok=True)
    replaced = os.path.isfile(served)
    if replaced:
        _keep_previous(served)
    with atomic_path(served, suffix=".tmp") as tmp:
        try:
            os.replace(new, tmp)
        except OSError:  # another file system (the upload's temporary folder)
            shutil.copyfile(new, tmp)
    return replaced


def set_aside_served_model(served: str) -> bool:
    """Stop serving ``served``: it becomes ``<served>.previous`` (replacing the one kept there).

    Returns:
        whether there was a served model.
    """
    if not os.path.isfile(served):
        return False
    os.replace(served, served + PREVIOUS_SUFFIX)
    return True
