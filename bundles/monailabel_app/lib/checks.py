"""What the SpectraFlow MONAI Label app accepts from a client, checked before anything runs.

- Images: the id of a datastore image, the file uploaded with this very request, or the image of the client's
  session. Any other string (a server-side path, absolute or with ``..``, existing or not) is answered exactly as an
  unknown id is (HTTP 404, :data:`UNKNOWN_IMAGE`), so that answers reveal nothing about the server's files.
- Training: only the options of :data:`lib.trainers.TRAIN_OPTIONS`; anything else is answered with HTTP 422
  naming the option, before a training task is queued.
- Datastore: every image and label id is a plain name (:func:`check_id`) and every label tag ``final``,
  ``original`` or a simple name (:func:`check_tag`): no path separator, ``..``, absolute path or empty name, so
  that no request reads or writes a file outside the studies folder (MONAI Label 0.8.5's ``LocalDatastore`` joins
  both into file paths unchecked). Anything else is answered with HTTP 400 before a file is written.
- Sessions: session ids are plain names too, an uploaded archive is not unpacked (``uncompress``), and session
  answers name files without their folders.
- Answers name no server path: reader messages are stripped of paths (:func:`redact_paths`), and the training
  status (``GET /train/``) shows neither the server's bundle folder nor the paths of its log lines.

MONAI Label's endpoints do not tell the app whether a request carried an upload, and they queue training in a
background process whose failure the client never sees as an HTTP status. :func:`install_server_checks` (called by
the app once the server runs it, ``server_mode(True)``) therefore wraps MONAI Label 0.8.5 endpoint helpers:
``monailabel.endpoints.infer.run_inference`` records what the request carries (:func:`client_request`), the
``AsyncTask`` of ``monailabel.endpoints.train`` checks the training options with the app first, its ``status``
answers without server paths, ``add_image`` / ``save_label`` of ``monailabel.endpoints.datastore`` check the id
and tag before the upload is buffered (the app's datastore checks them again, for every route), and the helpers of
``monailabel.endpoints.session`` check session ids.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import pathlib
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

from fastapi import HTTPException

from monailabel.utils.async_tasks.task import AsyncTask

__all__ = [
    "LABEL_TAGS",
    "UNKNOWN_IMAGE",
    "CheckedAsyncTask",
    "ClientRequest",
    "check_id",
    "check_tag",
    "client_request",
    "current_client_request",
    "install_server_checks",
    "redact_paths",
    "resolve_image",
]

# the one answer to an image that is not a datastore id: it names neither the id nor any server path
UNKNOWN_IMAGE = "image not found: give the id of a datastore image (GET /datastore/?output=all lists them) or upload it"


#: MONAI Label's own label tags; any other tag must match :data:`TAG_PATTERN`
LABEL_TAGS = ("final", "original")
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_MAX_ID = 255
# an absolute POSIX path or a Windows drive path inside a message (a token that starts at "/" or "X:\\")
_PATH_IN_TEXT = re.compile(r"(?<![\w.:/-])(?:/|[A-Za-z]:\\)[^\s'\"(),;]+")


def _plain_name(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_ID
        and value.strip() == value
        and not any(c in value for c in ("/", "\\", ":"))
        and ".." not in value
        and value != "."
        and all(c.isprintable() for c in value)
    )


def check_id(value: Any, what: str = "image") -> str:
    """``value`` when it is a plain image / label id, else HTTP 400.

    A plain id is a non-empty printable name of at most 255 characters without a path separator (``/``, ``\\``),
    a drive colon, ``..``, surrounding blanks or the name ``.``: the datastore joins it into a file name of the
    studies folder, so it can name no file elsewhere.

    Args:
        value: the id from the request.
        what: what it is in the answer (``image``, ``label``). Default ``"image"``.

    Raises:
        HTTPException: 400 naming ``what`` (never the value).
    """
    if not _plain_name(value):
        raise HTTPException(
            status_code=400,
            detail=f"{what} id must be a plain name (no '/', '\\', ':' or '..', not empty, at most {_MAX_ID} "
            "characters); GET /datastore/?output=all lists the ids",
        )
    return value


def check_tag(value: Any) -> str:
    """``value`` when it is a label tag the app accepts (``final``, ``original`` or letters, digits, ``_`` and ``-``,
    at most 64, starting with a letter or digit), else HTTP 400.

    Raises:
        HTTPException: 400 (the answer does not repeat the value).
    """
    if not (isinstance(value, str) and (value in LABEL_TAGS or TAG_PATTERN.fullmatch(value))):
        raise HTTPException(
            status_code=400,
            detail="label tag must be 'final', 'original' or a simple name (letters, digits, '_', '-'; at most 64)",
        )
    return value


def redact_paths(text: str, names: dict[str, str] | None = None) -> str:
    """``text`` without server paths: each of ``names`` (path -> what to show) is replaced first, then any other
    absolute path by ``<path>``.

    Args:
        text: a message (a reader error, a log line).
        names: paths to show by a name, e.g. ``{"/tmp/tmpab12.png": "the uploaded file"}``. Default ``None``.
    """
    for path, shown in sorted((names or {}).items(), key=lambda item: -len(item[0])):
        if path:
            text = text.replace(path, shown)
    return _PATH_IN_TEXT.sub("<path>", text)


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
    if served.session_id and _plain_name(served.session_id) and sessions is not None:
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


def _upload_id(image: Any, file: Any) -> Any:
    # the id MONAI Label 0.8.5's PUT /datastore/image gives an upload (endpoints/datastore.py, add_image)
    if image:
        return image
    name = getattr(file, "filename", None)
    if not name:
        return ""
    return os.path.basename(name).replace("".join(pathlib.PurePath(name).suffixes), "")


def _relative_pair(pair: Any) -> Any:
    from monailabel.interfaces.utils.app import app_instance

    root = getattr(app_instance().datastore(), "_datastore_path", None)
    if not isinstance(pair, dict):
        return pair
    root = os.path.realpath(root) if root else None
    shown = {}
    for key, value in pair.items():
        if isinstance(value, str) and os.path.isabs(value):
            real = os.path.realpath(value)
            inside = root is not None and real.startswith(root + os.sep)
            value = os.path.relpath(real, root) if inside else os.path.basename(value)
        shown[key] = value
    return shown


def _public_task(task: Any) -> Any:
    """A training task record as ``GET /train/`` shows it: without the server's bundle folder and log paths."""
    if isinstance(task, list):
        return [_public_task(t) for t in task]
    if not isinstance(task, dict):
        return task
    shown = dict(task)
    if isinstance(shown.get("request"), dict):
        shown["request"] = {k: v for k, v in shown["request"].items() if k != "bundle_path"}
    if shown.get("details") is not None:
        shown["details"] = [redact_paths(str(line)) for line in shown["details"]]
    return shown


def _public_session(answer: Any) -> Any:
    # MONAI Label's session answers carry the session folder and the image's path on the server: names only
    if isinstance(answer, dict):
        answer = dict(answer)
        if isinstance(answer.get("session_info"), dict):
            answer["session_info"] = _public_session(answer["session_info"])
        for key in ("path", "image"):
            if isinstance(answer.get(key), str):
                answer[key] = os.path.basename(answer[key].rstrip("/\\"))
    return answer


def _install_session_checks() -> None:
    """Session ids are plain names (MONAI Label joins them into the session folder's paths, and removes that
    folder), answers name no server path, and archives are not unpacked (``uncompress``: MONAI Label unpacks an
    uploaded archive with ``shutil.unpack_archive``, whose tar members may point anywhere)."""
    from monailabel.endpoints import session as session_endpoint

    get_session = session_endpoint.get_session
    if getattr(get_session, "spectraflow_checked", False):
        return

    @functools.wraps(get_session)
    def checked_get_session(session_id, update_ts=False, image=False):
        check_id(session_id, "session")
        answer = get_session(session_id, update_ts, image)
        return answer if image else _public_session(answer)

    remove_session = session_endpoint.remove_session

    @functools.wraps(remove_session)
    def checked_remove_session(session_id):
        return _public_session(remove_session(check_id(session_id, "session")))

    create_session = session_endpoint.create_session

    @functools.wraps(create_session)
    def checked_create_session(background_tasks, uncompress=False, expiry=0, files=None):
        if uncompress:
            raise HTTPException(
                status_code=422,
                detail="uncompress is not accepted: upload the image file, or the files of a DICOM series, as they are",
            )
        return _public_session(create_session(background_tasks, uncompress, expiry, files))

    for wrapper in (checked_get_session, checked_remove_session, checked_create_session):
        wrapper.spectraflow_checked = True
    session_endpoint.get_session = checked_get_session
    session_endpoint.remove_session = checked_remove_session
    session_endpoint.create_session = checked_create_session


def install_server_checks() -> None:
    """Wrap MONAI Label's inference, training and datastore endpoint helpers (see the module docstring);
    idempotent."""
    from monailabel.endpoints import datastore as datastore_endpoint
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
            if session_id and not _plain_name(session_id):  # MONAI Label would read <session store>/<id>/meta.info
                raise HTTPException(status_code=404, detail=UNKNOWN_IMAGE)
            # an "image" in params replaces the upload's path: it is then an id like any other
            replaced = isinstance(options, dict) and "image" in options
            with client_request(upload=bool(file) and not replaced, session_id=session_id):
                return run_inference(background_tasks, model, image, session_id, params, file, label, output)

        checked_run_inference.spectraflow_checked = True
        infer_endpoint.run_inference = checked_run_inference
    if not (isinstance(train_endpoint.AsyncTask, type) and issubclass(train_endpoint.AsyncTask, CheckedAsyncTask)):
        train_endpoint.AsyncTask = CheckedAsyncTask

    status = train_endpoint.status
    if not getattr(status, "spectraflow_checked", False):

        @functools.wraps(status)
        def public_status(all: bool = False, check_if_running: bool = False):  # noqa: A002 (MONAI Label's name)
            return _public_task(status(all, check_if_running))

        public_status.spectraflow_checked = True
        train_endpoint.status = public_status

    listing = datastore_endpoint.datastore
    if not getattr(listing, "spectraflow_checked", False):

        @functools.wraps(listing)
        def public_listing(output=None):
            # ?output=train lists the training pairs: file names relative to the studies folder, not server paths
            result = listing(output)
            if isinstance(result, list):
                result = [_relative_pair(pair) for pair in result]
            return result

        public_listing.spectraflow_checked = True
        datastore_endpoint.datastore = public_listing

    _install_session_checks()

    # ids and tags are checked before MONAI Label buffers the upload in a temporary file
    add_image = datastore_endpoint.add_image
    if not getattr(add_image, "spectraflow_checked", False):

        @functools.wraps(add_image)
        def checked_add_image(background_tasks, image=None, params="{}", file=None, user=None):
            check_id(_upload_id(image, file))
            return add_image(background_tasks, image, params, file, user)

        checked_add_image.spectraflow_checked = True
        datastore_endpoint.add_image = checked_add_image
    save_label = datastore_endpoint.save_label
    if not getattr(save_label, "spectraflow_checked", False):

        @functools.wraps(save_label)
        def checked_save_label(background_tasks, image, params="{}", tag="final", label=None, user=None):
            check_id(image)
            check_tag(tag or "final")
            return save_label(background_tasks, image, params, tag, label, user)

        checked_save_label.spectraflow_checked = True
        datastore_endpoint.save_label = checked_save_label
