"""What the SpectraFlow MONAI Label app accepts from a client, checked before anything runs.

- Images: the id of a datastore image, the file uploaded with this very request, or the image of the client's
  session. Any other string (a server-side path, absolute or with ``..``, existing or not) is answered exactly as an
  unknown id is (HTTP 404, :data:`UNKNOWN_IMAGE`), so that answers reveal nothing about the server's files.
- Training: only the options of :data:`lib.trainers.TRAIN_OPTIONS`; anything else is answered with HTTP 422
  naming the option, before a training task is queued.

MONAI Label's endpoints do not tell the app whether a request carried an upload, and they queue training in a
background process whose failure the client never sees as an HTTP status. :func:`install_server_checks` (called by
the app once the server runs it, ``server_mode(True)``) therefore wraps two MONAI Label 0.8.5 endpoint helpers:
``monailabel.endpoints.infer.run_inference`` records what the request carries (:func:`client_request`), and the
``AsyncTask`` of ``monailabel.endpoints.train`` checks the training options with the app first.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

from fastapi import HTTPException

from monailabel.utils.async_tasks.task import AsyncTask

__all__ = [
    "UNKNOWN_IMAGE",
    "CheckedAsyncTask",
    "ClientRequest",
    "client_request",
    "current_client_request",
    "install_server_checks",
    "resolve_image",
]

# the one answer to an image that is not a datastore id: it names neither the id nor any server path
UNKNOWN_IMAGE = "image not found: give the id of a datastore image (GET /datastore/?output=all lists them) or upload it"


@dataclass(frozen=True)
class ClientRequest:
    """What the current inference request carries besides its image id.

    Args:
        upload: the endpoint saved a file uploaded with this request and passes its temporary path as the image.
        session_id: the session the request names (its image is a file of MONAI Label's session store).
    """

    upload: bool = False
    session_id: str = ""


_CLIENT_REQUEST: contextvars.ContextVar[ClientRequest] = contextvars.ContextVar(
    "spectraflow_client_request", default=ClientRequest()
)


def current_client_request() -> ClientRequest:
    """The :class:`ClientRequest` of the request being served (nothing uploaded, no session outside one)."""
    return _CLIENT_REQUEST.get()


@contextlib.contextmanager
def client_request(upload: bool = False, session_id: str = "") -> Iterator[ClientRequest]:
    """Serve the code inside as a request that carries an upload and/or names a session.

    Args:
        upload: the image path given to ``infer`` is the temporary file of an upload. Default ``False``.
        session_id: the session named by the request. Default ``""``.
    """
    value = ClientRequest(upload=bool(upload), session_id=str(session_id or ""))
    token = _CLIENT_REQUEST.set(value)
    try:
        yield value
    finally:
        _CLIENT_REQUEST.reset(token)


def _is_upload(path: str) -> bool:
    # MONAI Label saves an upload as tempfile.NamedTemporaryFile(suffix=<the file's suffixes>).name
    temp_dir = os.path.realpath(tempfile.gettempdir())
    return os.path.dirname(os.path.realpath(path)) == temp_dir and os.path.isfile(path)


def _could_be_id(image: str) -> bool:
    return not any(c in image for c in ("/", "\\", "\x00")) and image not in (".", "..")


def resolve_image(image: str, datastore: Any, sessions: Any = None) -> tuple[str, str]:
    """The file to read for the image string of an inference request, and how to name it in messages.

    Args:
        image: the request's ``image``.
        datastore: the app's datastore (``get_image_uri``).
        sessions: MONAI Label's session store (``get_session``), or None when sessions are off. Default ``None``.

    Returns:
        ``(path, shown)``: the file and ``"the uploaded file"``, ``"the session image"`` or ``"image '<id>'"``.

    Raises:
        HTTPException: 404 with :data:`UNKNOWN_IMAGE` for anything but a datastore id, the upload of this request
            or the image of its session.
    """
    served = current_client_request()
    if served.upload and _is_upload(image):
        return image, "the uploaded file"
    if served.session_id and sessions is not None:
        session = sessions.get_session(served.session_id)
        if session is not None and getattr(session, "image", None) == image:
            return image, "the session image"
    uri = datastore.get_image_uri(image) if _could_be_id(image) else ""
    if not uri:
        raise HTTPException(status_code=404, detail=UNKNOWN_IMAGE)
    return uri, f"image {image!r}"


class CheckedAsyncTask(AsyncTask):
    """MONAI Label's ``AsyncTask`` that has the app check a training request before it is run or queued (the
    app's ``check_train_request`` raises ``HTTPException``, answered with its 4xx status)."""

    @staticmethod
    def run(method: str, request: Any = None, params: Any = None, force_sync: bool = False, enqueue: bool = False):
        if method == "train":
            from monailabel.interfaces.utils.app import app_instance

            check = getattr(app_instance(), "check_train_request", None)
            if check is not None:
                merged = dict(request or {})
                if params is not None and not isinstance(params, dict):
                    raise HTTPException(status_code=422, detail="the training options must be a JSON object")
                merged.update(params or {})
                check(merged)
        return AsyncTask.run(method, request=request, params=params, force_sync=force_sync, enqueue=enqueue)


def install_server_checks() -> None:
    """Wrap MONAI Label's inference and training endpoint helpers (see the module docstring); idempotent."""
    from monailabel.endpoints import infer as infer_endpoint
    from monailabel.endpoints import train as train_endpoint

    run_inference = infer_endpoint.run_inference
    if not getattr(run_inference, "spectraflow_checked", False):

        @functools.wraps(run_inference)
        def checked_run_inference(background_tasks, model, image="", session_id="", params="{}", file=None,
                                  label=None, output=None):  # fmt: skip
            try:
                options = json.loads(params) if params else {}
            except (TypeError, ValueError):
                options = {}
            # an "image" in params replaces the upload's path: it is then an id like any other
            replaced = isinstance(options, dict) and "image" in options
            with client_request(upload=bool(file) and not replaced, session_id=session_id):
                return run_inference(background_tasks, model, image, session_id, params, file, label, output)

        checked_run_inference.spectraflow_checked = True
        infer_endpoint.run_inference = checked_run_inference
    if not (isinstance(train_endpoint.AsyncTask, type) and issubclass(train_endpoint.AsyncTask, CheckedAsyncTask)):
        train_endpoint.AsyncTask = CheckedAsyncTask
