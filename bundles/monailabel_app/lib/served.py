"""The server's own copy of each bundle (docs/monailabel.md, "Serving safely").

The app never trains or reads configs from the installed bundle folder, nor from a folder that a request can write
to: at start it makes (or refreshes) a copy of each served bundle under its model folder (``--conf model_dir``,
default ``<app>/model``), and serves and trains that copy:

- ``configs/`` (and ``scripts/`` when the bundle has one) mirror the installed bundle at every start: changed files
  are replaced atomically, files the installed bundle does not have are removed, so that the configs the server
  runs are always the installed ones;
- ``models/``: each file of the installed ``models/`` is copied once, when the copy first meets it (the initial
  ``model.pt`` with its ``model.json``, a Stage-1 export; the names copied are listed in ``models/`` under
  :data:`COPIED_LEDGER`); after that the copy's ``models/model.pt`` is the served model, which training replaces. A
  served model that ``DELETE /model/<name>`` set aside is not copied back by a later start or a task process;
- everything a run writes (``logs/``, ``runs/``, the slice cache) stays in the copy;
- a new served model (a training run's best model, an upload of ``PUT /model/<name>``) replaces ``models/model.pt``
  and its record ``models/model.json`` together (:func:`replace_served_pair`), one replacement at a time (the served
  copy's folder locked, across the server and its task processes): the served pair is first kept aside as
  ``models/model.pt.bak-<date>-<time>`` and ``models/model.json.bak-<date>-<time>``, copies with ONE stamp (so the two
  files that belonged together are found together), recorded in the folder's ledger
  (:func:`spectraflow_monai.utils.checkpoint.set_aside`); then the record and the model are replaced, each
  atomically. ``DELETE /model/<name>`` renames the served pair so
  (:func:`set_aside_served_model`). The record holds the SHA-256 of the model file (``model_sha256``), so a model is
  never served with another model's record (:func:`spectraflow_monai.utils.run_record.check_model_digest`). To go
  back one step, put the newest pair back (both files carry the same ``<date>-<time>``): with the server stopped,
  copy ``models/model.pt.bak-<time>`` to ``models/model.pt`` and ``models/model.json.bak-<time>`` to
  ``models/model.json``; or, while it runs, copy them as ``model.pt`` and ``model.json`` into a folder of your own,
  zip them and upload the ZIP (``PUT /model/<name>``: checked, and the served pair kept aside in turn);
- model backups, ``models/<file>.bak-<date>-<time>`` (the served pairs replaced or deleted, an export that was not
  the served pair's, what a bundle run that starts over keeps aside, e.g. a run in the installed bundle with
  ``resume`` false), are bounded by ONE setting: the installed bundle's are not copied (nor its ledger of them), and
  the served copy keeps the newest ``--conf kept_model_backups`` of each file or run folder (default
  :data:`DEFAULT_KEPT_BACKUPS`; 0 keeps none: a replaced pair is removed once the new pair is in place, a deleted
  one at once), pruned at start and after each replacement of the served pair (:func:`prune_backups`, each removal
  logged). Only the backups recorded in ``models/.spectraflow-set-aside.json`` are removed
  (:func:`spectraflow_monai.utils.checkpoint.prune_set_aside`), and only while each is still the file it recorded;
  a file, folder or link that is only named like one (a user's ``model.pt.bak-20200101-000000``) is never removed
  nor counted, and a link at ``models/model.pt`` is renamed aside, never followed nor removed.

Each bundle folder stands alone (its ``configs/`` are plain files), and so does its served copy.

The model folder must not overlap the studies folder (the only folder requests write to).

With ``--conf runtime onnx`` (:func:`serving_runtime`) inference and uncertainty scoring run the served model through
onnxruntime: its export ``models/<stem>.onnx`` beside it (:func:`served_onnx`), which the server writes itself
(``export-onnx --variant cpu``) when it is missing or not the export of the served pair (a model trained or uploaded
since); an export is served only with the digests of the very ``model.pt`` and ``model.json`` beside it.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import shutil
import threading
import time
from typing import Any, NamedTuple

from spectraflow_monai.utils.checkpoint import (
    SET_ASIDE_LEDGER,
    folder_lock,
    is_set_aside_name,
    prune_set_aside,
    set_aside,
)
from spectraflow_monai.utils.files import atomic_path, write_text_atomic
from spectraflow_monai.utils.settings import model_settings_path

__all__ = [
    "COPIED_LEDGER",
    "DEFAULT_KEPT_BACKUPS",
    "KeptAside",
    "MIRRORED",
    "RUNTIMES",
    "check_apart",
    "kept_backups",
    "kept_text",
    "prune_backups",
    "replace_served_model",
    "replace_served_pair",
    "served_copy",
    "served_onnx",
    "serving_runtime",
    "set_aside_served_model",
]

logger = logging.getLogger(__name__)
#: one export at a time per served model file (an inference request and a scoring run may ask for it together)
_EXPORT_LOCKS: dict[str, threading.Lock] = {}
_EXPORT_LOCKS_GUARD = threading.Lock()

#: bundle folders that are code: mirrored from the installed bundle at every start
MIRRORED = ("configs", "scripts")
#: the names of the installed ``models/`` files the served copy has copied (each is copied once), in its ``models/``
COPIED_LEDGER = ".spectraflow-copied.json"
#: model backups kept per file in the served copy's ``models/`` (``--conf kept_model_backups``)
DEFAULT_KEPT_BACKUPS = 2
#: ``--conf runtime``: what runs the served network for inference and uncertainty scoring (the first: the default)
RUNTIMES = ("pytorch", "onnx")


class KeptAside(NamedTuple):
    """What a replacement of the served pair or ``DELETE /model`` set aside, for the line that logs it
    (:func:`kept_text`).

    Attributes:
        stamp: the ``<date>-<time>`` of the backups (one for the pair).
        kept: ``(name, backup)`` of each served file kept aside and still there (``("model.pt",
            "model.pt.bak-<stamp>")``), the model file first.
        removed: the names of the served files whose backup was removed at once (``--conf kept_model_backups 0``).
    """

    stamp: str
    kept: tuple[tuple[str, str], ...] = ()
    removed: tuple[str, ...] = ()


def serving_runtime(conf: dict[str, Any]) -> str:
    """``--conf runtime``: ``pytorch`` (default) or ``onnx`` (onnxruntime on the CPU, :func:`served_onnx`).

    Raises:
        ValueError: naming the setting and the value; ``onnx`` where onnxruntime is not installed (naming the extra).
    """
    text = conf.get("runtime")
    value = RUNTIMES[0] if text in (None, "") else str(text).strip().lower()
    if value not in RUNTIMES:
        raise ValueError(f"--conf runtime must be one of {', '.join(RUNTIMES)}, got {text!r}.")
    if value == "onnx":
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as e:
            raise ValueError(f'--conf runtime onnx needs the onnx extra: pip install "spectraflow_monai[onnx]" ({e}).')
    return value


def served_onnx(model_file: str, threads: int | None = None) -> Any:
    """The served model ``model_file`` (``models/model.pt`` of the served copy) as an onnxruntime network.

    Its export ``models/<stem>.onnx`` is served when it carries the digests of ``model_file`` and of the record
    beside it (:class:`~spectraflow_monai.networks.export.OnnxNetwork` checks them); when it is missing, unreadable
    or the export of another model (trained or uploaded since), the file there is kept aside
    (:func:`~spectraflow_monai.utils.checkpoint.set_aside`: ``<stem>.onnx.bak-<time>``, the newest few kept; a link is
    renamed, never followed) and the server writes the export again with the CPU variant
    (:func:`~spectraflow_monai.apps.onnx_export.export_model_file`, ``variant="cpu"``: fused attention, int8
    encoder; about a minute for ViT-S/14 on two cores), logged.

    Args:
        model_file: the served model file; its ``model.json`` must be beside it.
        threads: onnxruntime's intra-op threads; None: its default (one per physical core).

    Returns:
        an :class:`~spectraflow_monai.networks.export.OnnxNetwork`.

    Raises:
        SettingError, DataError: no record beside ``model_file``, or one written for another model file.
    """
    from spectraflow_monai.apps.onnx_export import CPU_ATOL, export_model_file
    from spectraflow_monai.networks.export import OnnxNetwork
    from spectraflow_monai.networks.onnx_runtime import (
        CPU_SESSION_CONFIG,
        RECOMMENDED_CPU_VARIANT,
    )
    from spectraflow_monai.utils.errors import DataError, SettingError
    from spectraflow_monai.utils.run_record import check_model_digest

    check_model_digest(model_file)  # the record beside it was written for this very file
    onnx_file = os.path.splitext(model_file)[0] + ".onnx"
    with _EXPORT_LOCKS_GUARD:
        lock = _EXPORT_LOCKS.setdefault(os.path.abspath(onnx_file), threading.Lock())
    with lock:
        try:
            return OnnxNetwork(onnx_file, threads=threads, model_file=model_file, session_config=CPU_SESSION_CONFIG)
        except (SettingError, DataError) as e:
            logger.info(f"{onnx_file}: exporting the served model ({RECOMMENDED_CPU_VARIANT} variant): {e}")
        if os.path.lexists(onnx_file):  # not the served pair's export: kept aside (a link renamed, never followed)
            aside = set_aside(onnx_file, log=False)
            logger.warning(f"{onnx_file} is not the served pair's export: kept aside as '{aside}'")
        export_model_file(model_file, onnx_file, atol=CPU_ATOL, variant=RECOMMENDED_CPU_VARIANT)
        return OnnxNetwork(onnx_file, threads=threads, model_file=model_file, session_config=CPU_SESSION_CONFIG)


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
    _copy_installed_models(os.path.join(installed, "models"), os.path.join(dest, "models"))
    prune_backups(os.path.join(dest, "models"), keep_backups)
    return dest


def _copied(ledger: str) -> set[str] | None:
    """The names listed in the copy ledger, None when there is none (a copy made by an earlier version)."""
    try:
        with open(ledger) as f:
            names = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        logger.warning(f"{ledger} cannot be read: the installed model files the copy lacks are copied again")
        return None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None


def _copy_installed_models(models: str, target_dir: str) -> None:
    """Copy each file of the installed ``models`` folder that the copy has not copied before (its ledger,
    :data:`COPIED_LEDGER`), never a backup or a ledger of backups, and list it there."""
    if not os.path.isdir(models):
        return
    ledger = os.path.join(target_dir, COPIED_LEDGER)
    copied = _copied(ledger)
    listed = set(copied or ())
    for name in sorted(os.listdir(models)):
        src, target = os.path.join(models, name), os.path.join(target_dir, name)
        if not os.path.isfile(src) or is_set_aside_name(name) or name in (SET_ASIDE_LEDGER, COPIED_LEDGER):
            continue
        if name in listed:
            continue  # copied before: what the copy holds now (trained, uploaded, set aside) is its own
        if not os.path.exists(target):
            _copy_file(src, target)
            logger.info(f"served copy: models/{name} copied from {models}")
        listed.add(name)
    if listed != (copied or set()):
        os.makedirs(target_dir, exist_ok=True)
        write_text_atomic(ledger, json.dumps(sorted(listed), indent=1) + "\n")


def _pair_lock(models: str) -> Any:
    """One replacement of the served pair in ``models`` at a time, across the server and its task processes: the
    served copy's folder (the parent of ``models``) is locked (:func:`~spectraflow_monai.utils.checkpoint.folder_lock`;
    ``models`` itself is the folder that ``set_aside`` locks while it records a backup)."""
    return folder_lock(os.path.dirname(os.path.abspath(models)))


def _free_stamp(files: list[str]) -> str:
    """Now as ``<date>-<time>``, with ``-<n>`` above every ``<n>`` taken in that second, such that no
    ``<file>.bak-<stamp>`` of ``files`` exists: the versions of a pair kept aside together carry one stamp, and of
    two pairs the later one sorts last."""
    now = time.strftime("%Y%m%d-%H%M%S")
    taken = -1
    for file in files:
        folder, name = os.path.split(file)
        prefix = f"{name}.bak-{now}"
        for entry in os.listdir(folder or "."):
            if entry == prefix:
                taken = max(taken, 0)
            elif entry.startswith(prefix + "-") and entry[len(prefix) + 1 :].isdigit():
                taken = max(taken, int(entry[len(prefix) + 1 :]))
    return now if taken < 0 else f"{now}-{taken + 1}"


def _keep_aside(path: str, stamp: str, copy: bool) -> tuple[str, str] | None:
    """Keep ``path`` aside as ``<path>.bak-<stamp>`` (:func:`~spectraflow_monai.utils.checkpoint.set_aside`, recorded
    in the folder's ledger; nothing pruned here, nothing logged: the caller says what happened): a copy when ``copy``
    (``path`` stays readable until it is replaced), else renamed. A link is renamed, never followed, recorded or
    removed. Returns ``(name, backup name)``, None when there was no file (or link) at ``path``."""
    if os.path.islink(path):
        return os.path.basename(path), set_aside(path, stamp, keep=None, log=False).name
    if not os.path.isfile(path):
        return None
    return os.path.basename(path), set_aside(path, stamp, copy=copy, keep=None, log=False).name


def _kept_aside(stamp: str, made: list[tuple[str, str] | None], removed: list[str]) -> KeptAside | None:
    """The :class:`KeptAside` of the files ``made`` (:func:`_keep_aside`, the model file first) once the folder's
    backups were pruned (``removed``: the backup names :func:`prune_backups` removed); None when none was made."""
    made = [m for m in made if m is not None]
    if not made:
        return None
    kept = tuple(m for m in made if m[1] not in removed)
    return KeptAside(stamp, kept, tuple(name for name, backup in made if backup in removed))


def _move_into_place(new: str, target: str) -> None:
    """Put ``new`` at ``target`` atomically (moved on the same file system, else copied first); a link at
    ``target`` is replaced, never followed."""
    with atomic_path(target, suffix=".tmp") as tmp:
        try:
            os.replace(new, tmp)
        except OSError:  # another file system (the upload's temporary folder)
            shutil.copyfile(new, tmp)


def _replace_files(files: list[tuple[str, str]], keep: int) -> KeptAside | None:
    """Replace each ``(new, target)`` of ``files`` in this order, under :func:`_pair_lock`: every ``target`` is
    first kept aside as a copy with one stamp, then each is replaced atomically, then the folder's backups are
    pruned to ``keep`` (:func:`prune_backups`); so with ``keep`` 0 the replaced files go only once the new ones are
    in place. Returns what was kept aside (the last ``target``, the model file, first), None when no ``target``
    existed."""
    folder = os.path.dirname(files[-1][1])
    os.makedirs(folder, exist_ok=True)
    with _pair_lock(folder):
        stamp = _free_stamp([target for _, target in files])
        made = [_keep_aside(target, stamp, copy=True) for _, target in files]
        for new, target in files:
            _move_into_place(new, target)
        removed = prune_backups(folder, keep)
    return _kept_aside(stamp, made[::-1], removed)


def replace_served_model(new: str, served: str, keep: int) -> KeptAside | None:
    """Serve ``new`` as ``served`` (``models/model.pt``) without touching its record: the current file is kept aside
    as ``<served>.bak-<stamp>`` (a copy, so that it stays readable until ``new`` replaces it atomically: a reader sees
    the old or the new model, never a part of one), then the backups of the folder are pruned to ``keep``.
    ``new`` is moved when it is on the same file system, else copied first.

    Args:
        new: the checked model file.
        served: the served model file.
        keep: ``--conf kept_model_backups`` (:func:`kept_backups`).

    Returns:
        what was kept aside (:class:`KeptAside`: the ``<stamp>`` and ``model.pt``, or with ``keep`` 0 what was
        removed) when a served model was replaced, else None.
    """
    return _replace_files([(new, served)], keep)


def replace_served_pair(new: str, new_record: str, served: str, keep: int) -> KeptAside | None:
    """Serve the model file ``new`` and its record ``new_record`` (``model.json``, which holds the digest of ``new``)
    as ``served`` and the record beside it.

    Under one lock (:func:`_pair_lock`): the served pair is kept aside as ``<served>.bak-<stamp>`` and
    ``<record>.bak-<stamp>`` (copies with ONE stamp, recorded in the folder's ledger), the record is replaced, then the
    model, each atomically, and the backups of the folder are pruned to ``keep`` (:func:`prune_backups`: the pair
    kept just now is the newest; with ``keep`` 0 nothing is kept, and the replaced pair goes only once the new one
    is in place). A reader that meets the new record with the old model in between refuses the pair (its digest
    differs) rather than serving it. To go back one step, copy the newest ``<served>.bak-<stamp>`` and
    ``<record>.bak-<stamp>`` back (or upload them as a ZIP).

    Args:
        new: the checked model file.
        new_record: its record.
        served: the served model file.
        keep: ``--conf kept_model_backups`` (:func:`kept_backups`).

    Returns:
        what was kept aside (:class:`KeptAside`: the ``<stamp>`` and the files of the served pair there were, or
        with ``keep`` 0 those removed), None when there was no served model nor record.
    """
    return _replace_files([(new_record, model_settings_path(served)), (new, served)], keep)


def set_aside_served_model(served: str, keep: int) -> KeptAside | None:
    """Stop serving ``served`` and its record: under :func:`_pair_lock` they are renamed to ``<served>.bak-<stamp>``
    and ``<record>.bak-<stamp>`` (one stamp, recorded in the folder's ledger), then the backups of the folder are
    pruned to ``keep`` (with ``keep`` 0 the pair is removed).

    Args:
        served: the served model file.
        keep: ``--conf kept_model_backups`` (:func:`kept_backups`).

    Returns:
        what was set aside (:class:`KeptAside`: the ``<stamp>`` and the files of the pair there were, or with
        ``keep`` 0 those removed) when there was a served model, else None (nothing changed).
    """
    if not (os.path.isfile(served) or os.path.islink(served)):
        return None
    folder, record = os.path.dirname(served), model_settings_path(served)
    with _pair_lock(folder):
        stamp = _free_stamp([served, record])
        made = [_keep_aside(served, stamp, copy=False), _keep_aside(record, stamp, copy=False)]
        removed = prune_backups(folder, keep)
    return _kept_aside(stamp, made, removed)


def _names(names: list[str]) -> str:
    return " and ".join(f"models/{name}" for name in names) + (" is" if len(names) == 1 else " are")


def kept_text(aside: KeptAside | None, what: str = "replaced") -> str:
    """What became of the served files that a replacement or ``DELETE /model`` set aside (``aside``), for a log line,
    naming only those: ``the replaced models/model.pt and models/model.json are kept as models/model.pt.bak-<stamp>
    and models/model.json.bak-<stamp>``, or ``... not kept (--conf kept_model_backups 0)``; empty when ``aside`` is
    None (nothing was set aside). ``what``: how the files are named (``replaced``, ``deleted``)."""
    if aside is None:
        return ""
    parts = []
    if aside.kept:
        backups = " and ".join(f"models/{backup}" for _, backup in aside.kept)
        parts.append(f"the {what} {_names([name for name, _ in aside.kept])} kept as {backups}")
    if aside.removed:
        parts.append(f"the {what} {_names(list(aside.removed))} not kept (--conf kept_model_backups 0)")
    return "; ".join(parts)
