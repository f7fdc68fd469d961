"""Scoring runs in the server process (docs/monailabel.md, "Next sample by uncertainty" and "Serving safely").

MONAI Label 0.8.5 runs every scoring request in a task subprocess: the request body is merged into the task's request,
so a client could name the folder put on the subprocess's ``PYTHONPATH`` (``bundle_path``) and have a file it
uploaded imported there; the subprocess then wrote the whole datastore record after every image from its own stale
copy, losing the labels and infos annotators saved meanwhile; and every *Next Sample* could queue another run.

The app serves the scoring routes with :class:`ScoringRuns` instead (:func:`install_scoring_routes`):

- a request may set only :data:`SCORING_OPTIONS` (``force``, a JSON boolean; MONAI Label's ``client_id``): anything
  else (``bundle_path``, ``gpus``, a method's name in the body, ...) is 422, a body over
  :data:`lib.checks.MAX_TASK_BODY_BYTES` is 413, NaN or Infinity is 422 (``lib.checks.check_json_value``), in
  ``POST /scoring/<method>`` and in the deprecated ``POST /scoring/``;
- a run scores in the server process on a worker thread, with the models the server serves, and writes its scores
  through the server's datastore (a few images at a time, one write of the record each: its cost per image does not
  grow with the datastore);
- at most one run is running at a time: an automatic run (at start, after a training, after a *Next Sample*) while one
  runs is that run (nothing queued), a client's request is 429 naming the running one (decided under a lock);
  ``?run_sync=true`` is 422 (a run on the server's event loop would freeze every other request);
- ``GET /scoring/`` answers the newest run (``all``: the last :data:`KEPT_RECORDS`; ``check_if_running``: 404 when none
  runs) and ``DELETE /scoring/`` stops the running one after its current image.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import HTTPException

from .checks import check_task_body, plain_name

__all__ = [
    "KEPT_RECORDS",
    "SCORING_OPTIONS",
    "ScoringRuns",
    "check_scoring_options",
    "install_scoring_routes",
]

logger = logging.getLogger(__name__)

#: the options a scoring request may set: ``force`` (score again the images the served model scored) and the
#: ``client_id`` MONAI Label's clients send
SCORING_OPTIONS = ("force", "client_id")
#: run records kept for ``GET /scoring/?all=true``
KEPT_RECORDS = 20


def _now() -> str:
    return datetime.datetime.today().strftime("%Y-%m-%d %H:%M:%S")


def check_scoring_options(params: Any) -> dict[str, Any]:
    """The options of a scoring request (:data:`SCORING_OPTIONS`), else HTTP 422 naming the first refused one (or
    413 for a body that is too large).

    Returns:
        ``{"force": bool}`` plus ``client_id`` when given.
    """
    params = check_task_body(params, "scoring")
    refused = sorted(str(k) for k in params if k not in SCORING_OPTIONS)
    if refused:
        shown = ", ".join(repr(k[:64]) for k in refused[:5]) + (f" ... and {len(refused) - 5} more" if len(refused) > 5
                                                                else "")  # fmt: skip
        raise HTTPException(
            status_code=422,
            detail=f"scoring option(s) {shown} not accepted; a scoring request may set only {list(SCORING_OPTIONS)}",
        )
    force = params.get("force", False)
    if not isinstance(force, bool):
        raise HTTPException(status_code=422, detail="scoring option 'force' must be true or false (a JSON boolean)")
    options: dict[str, Any] = {"force": force}
    client_id = params.get("client_id")
    if client_id is not None:
        if not (isinstance(client_id, str) and len(client_id) <= 256 and plain_name(client_id)):
            raise HTTPException(status_code=422, detail="scoring option 'client_id' must be a plain name")
        options["client_id"] = client_id
    return options


class ScoringRuns:
    """The server's scoring runs: one at a time, on a worker thread of the server process (see the module docstring).

    Args:
        score: runs one scoring request: ``score(request, stop)`` with the checked request (``method`` and the
            options) and a ``threading.Event`` set when the run is to stop; returns the run's result (JSON).
        kept: run records kept for ``GET /scoring/?all=true``. Defaults to :data:`KEPT_RECORDS`.

    Raises:
        ValueError: ``kept`` < 1.
    """

    def __init__(self, score: Callable[[dict[str, Any], threading.Event], Any], kept: int = KEPT_RECORDS) -> None:
        if int(kept) < 1:
            raise ValueError(f"kept must be >= 1, got {kept!r}.")
        self._score = score
        self._lock = threading.Lock()
        self._records: collections.deque[dict[str, Any]] = collections.deque(maxlen=int(kept))
        self._running: tuple[dict[str, Any], threading.Event, threading.Thread] | None = None

    def _active(self) -> dict[str, Any] | None:
        if self._running is not None and self._running[2].is_alive():
            return self._running[0]
        return None

    def start(self, request: Mapping[str, Any], automatic: bool = False) -> dict[str, Any]:
        """Start a run of ``request`` (``method`` and checked options) unless one runs.

        Args:
            request: the checked request.
            automatic: a run the server starts itself (at start, after a training or a next sample): while one runs,
                that run is answered. Defaults to False (a client's request: 429 while one runs).

        Returns:
            the run's record (a copy).

        Raises:
            HTTPException: 429 naming the running run, for a client's request while one runs.
        """
        with self._lock:
            active = self._active()
            if active is not None:
                if automatic:
                    return dict(active)
                raise HTTPException(
                    status_code=429,
                    detail=f"a scoring run is running (id {active['id']}, started {active['start_ts']}): GET /scoring/ "
                    "reports it, DELETE /scoring/ stops it",
                )
            record = {"id": str(uuid.uuid4()), "status": "RUNNING", "request": dict(request), "start_ts": _now(),
                      "details": []}  # fmt: skip
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(record, stop), name="scoring", daemon=True)
            self._records.append(record)
            self._running = (record, stop, thread)
            thread.start()
            return dict(record)

    def _run(self, record: dict[str, Any], stop: threading.Event) -> None:
        try:
            result = self._score(dict(record["request"]), stop)
            status = "STOPPED" if stop.is_set() else "DONE"
            details = [f"scoring {status.lower()}: {json.dumps(result, default=str)[:2000]}"]
        except Exception as e:  # a failed run is reported by GET /scoring/, the server keeps serving
            logger.exception(f"scoring run {record['id']} failed")
            first = str(e).splitlines()[0][:500] if str(e) else ""
            result, status, details = None, "ERROR", [f"{type(e).__name__}: {first}"]
        with self._lock:
            record.update({"status": "STOPPED" if record["status"] == "STOPPED" else status, "result": result,
                           "end_ts": _now(), "details": details})  # fmt: skip

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the running run (if any) ends, at most ``timeout`` seconds (tests, shutdown)."""
        running = self._running
        if running is not None:
            running[2].join(timeout)

    def status(self, all: bool = False, check_if_running: bool = False) -> Any:
        """``GET /scoring/``: the newest record, every kept one (``all``), or the running one (``check_if_running``).

        Raises:
            HTTPException: 404 when there is no record (or, with ``check_if_running``, none runs).
        """
        with self._lock:
            if check_if_running:
                active = self._active()
                if active is None:
                    raise HTTPException(status_code=404, detail="No Scoring Tasks are currently Running")
                return dict(active)
            if not self._records:
                raise HTTPException(status_code=404, detail="No Scoring Tasks Found")
            return [dict(r) for r in self._records] if all else dict(self._records[-1])

    def stop(self) -> Any:
        """``DELETE /scoring/``: the running run stops after its current image; returns its record (None: none runs)."""
        with self._lock:
            active = self._active()
            if active is None or self._running is None:
                return None
            self._running[1].set()
            active.update({"status": "STOPPED", "end_ts": _now()})
            return dict(active)


def install_scoring_routes() -> None:
    """Serve MONAI Label's scoring routes with the app's :class:`ScoringRuns` (``app.scoring_runs``): the helpers
    ``run``, ``run_method``, ``status`` and ``stop`` of ``monailabel.endpoints.scoring``; idempotent."""
    from monailabel.endpoints import scoring as scoring_endpoint
    from monailabel.interfaces.utils.app import app_instance

    if getattr(scoring_endpoint.run_method, "spectraflow_checked", False):
        return

    def runs() -> ScoringRuns:
        return app_instance().scoring_runs

    def no_sync(run_sync: Any) -> None:
        if run_sync:
            raise HTTPException(
                status_code=422,
                detail="run_sync is not accepted for scoring: a run scores in the background; GET /scoring/ reports it",
            )

    def run_method(method: Any, params: Any = None, run_sync: Any = False) -> Any:
        app = app_instance()
        app.check_scoring_request({"method": method})
        no_sync(run_sync)
        return runs().start({"method": method, **check_scoring_options(params)})

    def run(params: Any = None, run_sync: Any = False) -> Any:
        app = app_instance()
        no_sync(run_sync)
        params = check_task_body(params, "scoring")
        methods = sorted(app.info()["scoring"])
        unknown = [str(k)[:64] for k in params if k not in methods]
        if unknown:
            raise HTTPException(
                status_code=422,
                detail=f"the scoring options are given by method name ({methods}); {unknown[:5]} not accepted",
            )
        checked = {m: check_scoring_options(params.get(m)) for m in methods}
        return {m: {"result": runs().start({"method": m, **checked[m]}), "detail": None} for m in methods}

    def status(all: Any = False, check_if_running: Any = False) -> Any:
        return runs().status(bool(all), bool(check_if_running))

    def stop() -> Any:
        return runs().stop()

    for name, helper in (("run", run), ("run_method", run_method), ("status", status), ("stop", stop)):
        helper.spectraflow_checked = True
        setattr(scoring_endpoint, name, helper)
