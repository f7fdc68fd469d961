"""Run folders of the SpectraFlow MONAI Label app's training requests (docs/monailabel.md, "Requests over HTTP").

Every training request is a new run of the bundle's ``configs/train.yaml`` on the datastore's current labels. Its
resumable checkpoints, its run record and its best model go to a folder of its own in the served copy of the bundle,
``runs/<date>-<time>-<pid>-<n>/`` (:func:`open_run`): the bundle's own run-record logic
(:func:`spectraflow_monai.utils.run_record.record_run`, :func:`spectraflow_monai.utils.checkpoint.resume_checkpoint`)
then always meets a new folder and starts a new run, so nothing of an earlier request (optimizer, learning-rate
plateau, early stopping, best score on an earlier validation set) is continued. When the run ends, its best model
becomes the served pair (:func:`serve_run_model`; the pair it replaces is kept aside as
``models/model.pt.bak-<time>`` and ``models/model.json.bak-<time>``, as for an upload) and the model backups in
``models/`` (:func:`spectraflow_monai.utils.checkpoint.set_aside`) are pruned to ``--conf kept_model_backups``, the
one bound of the served copy's backups; then its folder is removed (:func:`end_run`), also after a failed run.

A run stopped by ``DELETE /train`` or a server kill cannot remove its folder. Each folder therefore records its owner
(``owner.json``: host, boot id, PID namespace, PID) and gets a heartbeat file touched every :data:`RUN_HEARTBEAT`
seconds; the server removes the folders of stopped runs at its start and before each new run
(:func:`remove_stale_runs`): a run of this host and PID namespace when its process has ended, a run of another host
or PID namespace (a container, a server on shared storage) when its heartbeat is older than :data:`RUN_STALE_AFTER`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from typing import Any

from spectraflow_monai.utils.settings import model_settings_path

from .infers import DEFAULT_WEIGHTS
from .served import KeptAside, replace_served_model, replace_served_pair

__all__ = [
    "KEPT_RUN_LOGS",
    "RUN_HEARTBEAT",
    "RUN_OWNER_FILE",
    "RUN_STALE_AFTER",
    "active_runs",
    "end_run",
    "open_run",
    "remove_stale_runs",
    "run_owner",
    "serve_run_model",
]

logger = logging.getLogger(__name__)

_RUNS = itertools.count()
_ACTIVE_RUNS: dict[str, threading.Event] = {}  # run folders of this process that are training now -> stops its beat
# a run folder: runs/<date>-<time>-<pid>-<n> (open_run)
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


def active_runs() -> list[str]:
    """The names of the run folders this process is training in now."""
    return list(_ACTIVE_RUNS)


def open_run(bundle_path: str) -> tuple[str, str, str]:
    """Start a new run in the served copy ``bundle_path``: the folders of stopped runs are removed
    (:func:`remove_stale_runs`), the newest :data:`KEPT_RUN_LOGS` - 1 log folders kept, and a new folder
    ``runs/<date>-<time>-<pid>-<n>/`` made, owned by this process with a heartbeat until :func:`end_run`.

    Returns:
        the run's id, its folder and its log folder (``logs/<id>``, not made here).
    """
    remove_stale_runs(bundle_path)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_RUNS)}"
    run_dir = os.path.join(bundle_path, "runs", run_id)
    log_dir = os.path.join(bundle_path, "logs", run_id)
    _prune_logs(os.path.dirname(log_dir), KEPT_RUN_LOGS - 1)
    os.makedirs(run_dir)
    _start_run(run_dir)
    return run_id, run_dir, log_dir


def serve_run_model(run_dir: str, bundle_path: str, kept_backups: int) -> KeptAside | None:
    """Serve the best model of the run in ``run_dir`` as the served copy's ``models/model.pt``, its record
    ``model.json`` first (each atomically: the inference task reloads the pair at its next request; the replaced
    pair is kept aside as ``*.bak-<time>`` with one stamp), then prune the model backups of ``models/`` to
    ``kept_backups`` (:func:`lib.served.replace_served_pair`). The training task logs it.

    Args:
        run_dir: the run's folder (:func:`open_run`), holding its best model ``model.pt``.
        bundle_path: the served copy of the bundle.
        kept_backups: ``--conf kept_model_backups``.

    Returns:
        what was kept aside (:class:`lib.served.KeptAside`: the stamp and the served files kept, ``model.pt``
        alone when the run left no ``model.json``) when a served model was replaced, else None.

    Raises:
        RuntimeError: the run saved no model (no validation pair, or no finite validation score); the served
            model is kept.
    """
    name = os.path.basename(bundle_path)
    best = os.path.join(run_dir, DEFAULT_WEIGHTS)
    if not os.path.isfile(best):
        raise RuntimeError(
            f"{name}: training run {os.path.basename(run_dir)} saved no model (it needs validation pairs: "
            "val_split > 0 and enough labelled images); the served model is unchanged."
        )
    served = os.path.join(bundle_path, "models", DEFAULT_WEIGHTS)
    record = model_settings_path(best)
    if os.path.isfile(record):  # the settings the model was trained with (model.json), with the model's digest
        return replace_served_pair(best, record, served, kept_backups)
    return replace_served_model(best, served, kept_backups)


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
