"""Atomic checkpoint writing helpers.

Every checkpoint of the bundles (the resumable training checkpoints, ``models/model.pt`` and the SpectraFlow
Stage-1 encoder export, Chen et al., "SpectraFlow", Sec. "Implementation Details") is written by
:func:`atomic_torch_save`: the object is serialised to a temporary file in the destination folder, flushed to disk
and moved over the destination with ``os.replace``, so an interrupted run never leaves a truncated file behind and
readers see either the old or the new file. :func:`check_finite_state` refuses to let a non-finite tensor reach a
checkpoint, and :func:`resume_checkpoint` follows the run's one :class:`RestartDecision` (taken with its run record,
:func:`spectraflow_monai.utils.run_record.decide_restart`): continue from a checkpoint, or start a new run with the
earlier results set aside.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spectraflow_monai.utils.distributed import process_rank
from spectraflow_monai.utils.errors import TrainingError
from spectraflow_monai.utils.files import atomic_path, write_text_atomic
from spectraflow_monai.utils.settings import model_settings_path

__all__ = [
    "CONTINUE",
    "NEW",
    "RECORD_FILE",
    "SET_ASIDE_KEPT",
    "SET_ASIDE_LEDGER",
    "NonFiniteStateError",
    "RestartDecision",
    "atomic_torch_save",
    "check_finite_state",
    "cpu_state_dict",
    "folder_lock",
    "is_set_aside_name",
    "latest_checkpoint",
    "prune_set_aside",
    "resume_checkpoint",
    "set_aside",
]

logger = logging.getLogger(__name__)

_EPOCH_FILE = re.compile(r"^checkpoint_epoch=(\d+)\.pt$")
_FINAL_FILE = "checkpoint_final.pt"
#: the two ways a run starts (:class:`RestartDecision`): it continues from a checkpoint, or a new run starts
CONTINUE = "continue"
NEW = "new"
#: name of the run record in a run's checkpoint folder (:func:`spectraflow_monai.utils.run_record.record_run`)
RECORD_FILE = "run_record.json"
#: how many earlier versions of one file or run folder :func:`set_aside` keeps (``<name>.bak-<time>``); older ones
#: that it made are removed, so that repeated starts (e.g. MONAI Label's ``/train``) stay bounded on disk
SET_ASIDE_KEPT = 3
#: the ledger in a folder of the versions :func:`set_aside` made there (name, file or folder, device and inode
#: numbers, status change time): the only versions :func:`prune_set_aside` ever removes
SET_ASIDE_LEDGER = ".spectraflow-set-aside.json"
_SET_ASIDE_SUFFIX = r"\.bak-\d{8}-\d{6}(?:-\d+)?"
_VERSION = re.compile(f"(.+){_SET_ASIDE_SUFFIX}")
# what a ledger entry records of a version besides its name and kind (os.lstat right after it was made)
_IDENTITY = ("dev", "ino", "ctime_ns")
_GONE = "it is no longer there"
_LEDGER_ABOUT = (
    "versions that spectraflow_monai.utils.checkpoint.set_aside made in this folder; only these are ever removed, "
    "and only while each is still the file or folder it made (kind, device and inode numbers, status change time)"
)
# the files a run writes into its folder: checkpoints, its record, the earlier records it set aside and their ledger
_RUN_FILE = re.compile(
    r"checkpoint_epoch=\d+\.pt|"
    + "|".join(map(re.escape, (_FINAL_FILE, SET_ASIDE_LEDGER)))
    + "|"
    + re.escape(RECORD_FILE)
    + f"(?:{_SET_ASIDE_SUFFIX})?"
)
# folders are pruned through a handle opened without following links (POSIX)
_DIR_FD = (
    hasattr(os, "O_NOFOLLOW")
    and hasattr(os, "O_DIRECTORY")
    and os.unlink in os.supports_dir_fd
    and os.scandir in os.supports_fd
    and os.listdir in os.supports_fd
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


def is_set_aside_name(name: str) -> bool:
    """Whether ``name`` has the form :func:`set_aside` gives the versions it makes: ``<name>.bak-<date>-<time>[-<n>]``.

    The form alone proves nothing (anyone may name a file so); only the versions recorded in the folder's
    :data:`SET_ASIDE_LEDGER` are ever removed (:func:`prune_set_aside`).
    """
    return _VERSION.fullmatch(name) is not None


def set_aside(
    path: str | os.PathLike,
    stamp: str | None = None,
    copy: bool = False,
    keep: int | None = SET_ASIDE_KEPT,
    log: bool = True,
) -> Path:
    """Keep ``path`` (a file or folder) as ``<path>.bak-<timestamp>``; returns the new path.

    With ``log`` (the default) it is logged as a warning in the words of a bundle run that starts over (resume false,
    a new run): ``starting over: kept the earlier '<path>' aside as '<path>.bak-<timestamp>'``. A caller that keeps
    a file aside for another reason (a served model replaced by an upload, deleted) passes ``log=False`` and says
    what happened itself.

    With ``copy=False`` the path is renamed; with ``copy=True`` (files only) a copy is written atomically and the
    original stays in place, so that a run may still read it (e.g. fine-tuning that starts from ``model.pt``).

    The version is recorded in the folder's ledger (:data:`SET_ASIDE_LEDGER`: its name, whether it is a file or a
    folder, its device and inode numbers and status change time, taken right after the rename or copy), and then
    :func:`prune_set_aside` keeps the newest ``keep`` versions of ``path`` that ``set_aside`` made: older ones are
    removed (a folder loses the files a run writes there and is removed when that leaves it empty). Nothing else is
    ever removed: not a file or folder that is only named like a version (a user's own
    ``model.pt.bak-20200101-000000``), not a link, not a version replaced since by another file of the same name;
    such names are not counted among the kept versions either. A link at ``path`` is renamed but not recorded.

    Args:
        path: the file or folder to keep aside.
        stamp: the ``<timestamp>`` of the name (``<date>-<time>``; ``-<n>`` is added while the name is taken).
            Defaults to now; give one stamp to several files to keep them together (a model and its record).
        copy: keep a copy and leave ``path`` in place (files only). Defaults to False (renamed).
        keep: how many versions of ``path`` stay (an integer >= 0); ``None``: nothing is pruned here (the caller
            prunes with :func:`prune_set_aside`, e.g. once a replacement is in place). Defaults to
            :data:`SET_ASIDE_KEPT`.
        log: log the version kept as a run that starts over (above); False: the caller logs why it was kept.
            Defaults to True.

    Raises:
        ValueError: ``keep`` is neither None nor an integer >= 0.
    """
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise ValueError(f"keep must be None or an integer >= 0, got {keep!r}.")
    path = Path(os.fspath(path))
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    with folder_lock(path.parent):
        target = path.with_name(f"{path.name}.bak-{stamp}")
        n = 1
        while os.path.lexists(target):
            target = path.with_name(f"{path.name}.bak-{stamp}-{n}")
            n += 1
        if copy:
            with atomic_path(target) as tmp:
                shutil.copy2(path, tmp)
            if log:
                logger.warning(
                    f"starting over: kept a copy of the earlier '{path}' as '{target}'; this run may replace it."
                )
        else:
            os.replace(path, target)
            if log:
                logger.warning(f"starting over: kept the earlier '{path}' aside as '{target}'.")
        made = _identify(target)
        versions, rewrite = _read_ledger(path.parent)
        if made is None:
            logger.info(f"'{target}' is a link: it is not recorded as a set-aside version and is never removed.")
        elif rewrite is not None:
            versions = [v for v in versions if v["name"] != target.name] + [{"name": target.name, **made}]
            rewrite = True
        if keep is not None:
            _prune(path.parent, keep, versions, of=path.name, rewrite=rewrite)
        elif rewrite:
            _write_ledger(path.parent, versions)
    return target


def prune_set_aside(folder: str | os.PathLike, keep: int, of: str | None = None) -> list[str]:
    """Remove the versions that :func:`set_aside` made in ``folder``, but the newest ``keep`` of each name.

    Only the versions recorded in ``folder``'s ledger (:data:`SET_ASIDE_LEDGER`) are considered, newest = the last
    recorded. A recorded version is removed only when the entry of that name is still the one ``set_aside`` made:
    not a link (it is never followed), of the recorded kind (file or folder), with the recorded device and inode
    numbers and status change time. Anything else of that name is left alone, dropped from the ledger and logged as
    not ours. Of a folder only the files a run writes there (checkpoints, its record, the records it set aside and
    their ledger) are removed, links inside it are not followed, and the folder itself is removed only when that
    leaves it empty; else it is kept, with a warning, and no longer counted. Files, folders and links that are only
    named like versions (``<name>.bak-<date>-<time>``) and are not in the ledger are never removed and not counted.
    A ledger that is not JSON is ignored, and so is each entry that names anything but a version in ``folder``
    itself (``../x``, ``/abs/x``, ``a/b``) or has values of the wrong type, with a warning; a ledger that is not a
    file (a link) is neither read nor written.

    Args:
        folder: the folder holding the versions (and the ledger).
        keep: how many versions of each name to keep (an integer >= 0).
        of: only the versions of this name (e.g. ``model.pt``); ``None`` for every name of the ledger.

    Returns:
        the names removed, sorted (each removal is logged).

    Raises:
        ValueError: ``keep`` is not an integer >= 0.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be an integer >= 0, got {keep!r}.")
    folder = Path(os.fspath(folder))
    if not os.path.isdir(folder):
        return []
    with folder_lock(folder):
        versions, rewrite = _read_ledger(folder)
        return _prune(folder, keep, versions, of=of, rewrite=rewrite)


def _identify(path: Path) -> dict[str, Any] | None:
    """What the ledger records of an entry ``set_aside`` just made: its kind, device and inode numbers and the time
    of its last status change (which no one can set back: an inode number used again is told apart); ``None`` for a
    link."""
    st = os.lstat(path)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else None
    return None if kind is None else {"type": kind, "dev": st.st_dev, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


@contextmanager
def folder_lock(folder: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (POSIX ``flock`` on the folder itself, across processes; elsewhere, or on
    a file system without it, none). :func:`set_aside` and :func:`prune_set_aside` hold it while they read and write
    the folder's ledger; a caller that sets aside files of ``folder`` holds another folder's lock (a lock is not taken
    twice by one process)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the ledger is still written atomically
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: the ledger is still written atomically
            pass
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _ledger_entry(entry: Any) -> str | None:
    """Why ``entry`` is not a valid ledger entry, or ``None``."""
    if not isinstance(entry, dict):
        return "not an object"
    name = entry.get("name")
    if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", "..") or "\0" in name:
        return f"name {name!r} is not a plain name in this folder"
    if any(sep and sep in name for sep in ("/", "\\", os.sep, os.altsep)):
        return f"name {name!r} is not a plain name in this folder"
    if not is_set_aside_name(name):
        return f"name {name!r} is not a set-aside version (<name>.bak-<date>-<time>)"
    if entry.get("type") not in ("file", "dir"):
        return f"type {entry.get('type')!r} is neither 'file' nor 'dir'"
    for key in _IDENTITY:
        if isinstance(entry.get(key), bool) or not isinstance(entry.get(key), int) or entry[key] < 0:
            return f"{key} {entry.get(key)!r} is not an integer >= 0"
    return None


def _read_ledger(folder: Path) -> tuple[list[dict[str, Any]], bool | None]:
    """The valid entries of ``folder``'s ledger, oldest first, and whether the ledger is to be written again (it held
    an entry that is ignored; ``None``: it is not a file, so it is never written). A bad ledger or entry is ignored
    with a warning."""
    ledger = folder / SET_ASIDE_LEDGER
    try:
        st = os.lstat(ledger)
    except FileNotFoundError:
        return [], False
    if not stat.S_ISREG(st.st_mode):
        logger.warning(
            f"'{ledger}' is not a file: it is left alone and nothing set aside in '{folder}' is recorded or removed."
        )
        return [], None
    try:
        with open(ledger, encoding="utf-8") as f:
            versions = json.load(f).get("versions")
        if not isinstance(versions, list):
            raise TypeError("no list 'versions'")
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        logger.warning(
            f"'{ledger}' is not a set-aside ledger ({type(exc).__name__}): ignored; the versions it listed are "
            "left alone (only versions recorded from now on are removed)."
        )
        return [], True
    valid, names = [], set()
    for entry in versions:
        problem = _ledger_entry(entry)
        if problem is None and entry["name"] in names:
            problem = f"name {entry['name']!r} is listed twice"
        if problem is not None:
            logger.warning(f"'{ledger}': an entry is ignored, {problem}; nothing is removed for it.")
            continue
        names.add(entry["name"])
        valid.append({key: entry[key] for key in ("name", "type", *_IDENTITY)})
    return valid, len(valid) < len(versions)


def _write_ledger(folder: Path, versions: list[dict[str, Any]]) -> None:
    text = json.dumps({"about": _LEDGER_ABOUT, "versions": versions}, indent=1) + "\n"
    try:
        write_text_atomic(folder / SET_ASIDE_LEDGER, text)
    except (OSError, ValueError) as exc:
        logger.warning(f"could not write '{folder / SET_ASIDE_LEDGER}' ({exc}): the versions not recorded are kept.")


def _not_ours(path: Path, version: dict[str, Any]) -> str | None:
    """Why the entry at ``path`` is not the version ``set_aside`` recorded, or ``None`` when it is (never follows
    a link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return _GONE
    if stat.S_ISLNK(st.st_mode):
        return "it is a link now"
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    if kind != version["type"]:
        return f"it is a {'folder' if kind == 'dir' else kind} now, a {version['type']} was set aside"
    if (st.st_dev, st.st_ino, st.st_ctime_ns) != tuple(version[key] for key in _IDENTITY):
        return "it was replaced by another of that name, or changed since"
    return None


def _remove_version(path: Path, version: dict[str, Any]) -> bool:
    """Remove the version at ``path`` (checked by :func:`_not_ours`); ``False`` when a folder is kept."""
    if version["type"] == "file":
        os.unlink(path)
        return True
    # a folder: opened without following a link and checked again, its run files removed through that handle
    handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW) if _DIR_FD else None
    try:
        if handle is not None:
            st = os.fstat(handle)
            if (st.st_dev, st.st_ino, st.st_ctime_ns) != tuple(version[key] for key in _IDENTITY):
                logger.info(f"'{path}' was replaced by another folder of that name: it is not ours and is kept.")
                return False
        with os.scandir(path if handle is None else handle) as entries:
            run_files = [e.name for e in entries if e.is_file(follow_symlinks=False) and _RUN_FILE.fullmatch(e.name)]
        for name in run_files:
            if handle is None:
                os.unlink(path / name)
            else:
                os.unlink(name, dir_fd=handle)
        others = sorted(os.listdir(path if handle is None else handle))
    finally:
        if handle is not None:
            os.close(handle)
    if others:
        logger.warning(
            f"'{path}' holds files a run did not write there ({', '.join(others[:5])}"
            f"{', ...' if len(others) > 5 else ''}): the run's files in it were removed, the folder is kept and no "
            "longer counted among the set-aside versions."
        )
        return False
    os.rmdir(path)
    return True


def _prune(
    folder: Path, keep: int, versions: list[dict[str, Any]], of: str | None = None, rewrite: bool | None = False
) -> list[str]:
    """:func:`prune_set_aside` on the ledger entries ``versions`` (read, and locked, by the caller); writes the
    ledger back when ``rewrite`` (an entry was added or ignored) or an entry is dropped, never when ``rewrite`` is
    ``None`` (the ledger is not a file)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for version in versions:
        groups.setdefault(_VERSION.fullmatch(version["name"]).group(1), []).append(version)
    removed, dropped = [], []
    for name, group in groups.items():
        if of is not None and name != of:
            continue
        ours = []
        for version in group:
            why = _not_ours(folder / version["name"], version)
            if why is None:
                ours.append(version)
                continue
            dropped.append(version)
            if why == _GONE:
                logger.info(f"'{folder / version['name']}' (set aside) is no longer there: no longer counted.")
            else:
                logger.warning(
                    f"'{folder / version['name']}' is not the version set_aside made ({why}): it is not ours, left "
                    "alone and no longer counted."
                )
        for version in ours[: max(len(ours) - keep, 0)]:
            try:
                gone = _remove_version(folder / version["name"], version)
            except OSError as exc:
                logger.warning(f"could not remove '{folder / version['name']}' ({exc}): it is kept for now.")
                continue
            dropped.append(version)
            if gone:
                removed.append(version["name"])
                logger.info(
                    f"removed '{folder / version['name']}' (only the newest {keep} set-aside versions of '{name}' "
                    "are kept)."
                )
    if rewrite is not None and (rewrite or dropped):
        _write_ledger(folder, [v for v in versions if v not in dropped])
    return sorted(removed)


@dataclasses.dataclass(frozen=True)
class RestartDecision:
    """What a run does at its start, decided once (:func:`~spectraflow_monai.utils.run_record.decide_restart`) and
    followed by everything that touches its folder: the run record (:func:`~spectraflow_monai.utils.run_record.
    record_run` writes it and keeps the earlier run aside) and the checkpoint loader (:func:`resume_checkpoint`).
    The third way, refusing to continue a run of other settings, is a
    :class:`~spectraflow_monai.utils.errors.SettingError` instead of a decision.

    Args:
        run_dir: the run's checkpoint folder.
        action: :data:`CONTINUE` (from ``checkpoint``) or :data:`NEW` (a new run; an earlier one is kept aside).
        checkpoint: the checkpoint the run continues from (``action`` continue), else None.
        reason: why, in words (logged).
        set_aside_earlier: whether an earlier run in ``run_dir`` (its checkpoints and record) is kept aside
            (``new``; ``continue`` from an explicit checkpoint outside the folder's own run). Defaults to False.
        stamp: the time of the decision, the ``.bak-<stamp>`` of everything it keeps aside. Defaults to now.
        record: the run record written with it (:func:`~spectraflow_monai.utils.run_record.record_run`), or None.

    Raises:
        ValueError: an unknown ``action``, or ``continue`` without a ``checkpoint``.
    """

    run_dir: str
    action: str
    checkpoint: str | None = None
    reason: str = ""
    set_aside_earlier: bool = False
    stamp: str = dataclasses.field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S"))
    record: dict | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.action not in (CONTINUE, NEW):
            raise ValueError(f"action must be {CONTINUE!r} or {NEW!r}, got {self.action!r}.")
        if (self.action == CONTINUE) != (self.checkpoint is not None):
            raise ValueError(f"checkpoint must be given with action {CONTINUE!r} only, got {self.checkpoint!r}.")
        object.__setattr__(self, "run_dir", os.fspath(self.run_dir))
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", os.fspath(self.checkpoint))

    @property
    def continues(self) -> bool:
        """Whether the run continues from :attr:`checkpoint`."""
        return self.action == CONTINUE


def resume_checkpoint(decision: RestartDecision, protect: Sequence[str | os.PathLike] = ()) -> str | None:
    """Follow the restart ``decision`` (:func:`~spectraflow_monai.utils.run_record.decide_restart`, taken once at
    the start of the run, when its record is written): where the run continues from, or ``None`` for a new run.

    - ``continue``: the decision's checkpoint is returned; the run continues from it (model, optimizer, schedules,
      early stopping, best metric, epoch, RNG);
    - ``new``: checkpoints still in the run folder are renamed to ``<name>.bak-<stamp>`` (the run record's writer
      has usually kept the earlier run aside already) and every existing file of ``protect`` (``models/model.pt``,
      the best model of an earlier run, with its record beside it) is copied to ``<name>.bak-<stamp>``, with a
      warning, so that the new run never replaces them silently while a fine-tuning run can still read
      ``model.pt``; ``None`` is returned.

    In a distributed run only rank 0 renames files; every rank returns the same answer.

    Args:
        decision: the run's :class:`RestartDecision`.
        protect: files of an earlier run to keep aside when starting a new run.

    Raises:
        ValueError: ``decision`` is not a :class:`RestartDecision`.
    """
    if not isinstance(decision, RestartDecision):
        raise ValueError(f"decision must be a RestartDecision (run_record.decide_restart), got {decision!r}.")
    if decision.continues:
        logger.warning(f"resuming from '{decision.checkpoint}' ({decision.reason or 'the restart decision'}).")
        return decision.checkpoint
    if process_rank() == 0:
        folder = Path(decision.run_dir)
        if latest_checkpoint(folder) is not None:
            set_aside(folder, decision.stamp)
        for path in protect:  # with the settings written beside a model file (model.pt -> model.json)
            for file in (os.fspath(path), model_settings_path(path)):
                if os.path.isfile(file):
                    set_aside(file, decision.stamp, copy=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return None
