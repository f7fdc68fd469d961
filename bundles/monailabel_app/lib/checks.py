"""What the SpectraFlow MONAI Label app accepts from a client, checked before anything runs.

- Images: the id of a datastore image, the file uploaded with this very request, or the image of the client's
  session. Any other string (a server-side path, absolute or with ``..``, existing or not) is answered exactly as an
  unknown id is (HTTP 404, :data:`UNKNOWN_IMAGE`), so that answers reveal nothing about the server's files.
- Training: only the options of :data:`lib.options.TRAIN_OPTIONS`; anything else is answered with HTTP 422
  naming the option, before a training task is queued.
- Datastore: every image and label id is a plain name (:func:`check_id`) and every label tag ``final``,
  ``original`` or a simple name (:func:`check_tag`): no path separator, ``..``, absolute path or empty name, so
  that no request reads or writes a file outside the studies folder (MONAI Label 0.8.5's ``LocalDatastore`` joins
  both into file paths unchecked). Anything else is answered with HTTP 400 before a file is written. An upload's
  id is not one of the datastore's own names and its file name fits the file system (:func:`check_new_id`), and
  its extension is an image format of the datastore (:func:`upload_extension`, HTTP 415).
- Sessions: session ids are plain names too, an uploaded archive is not unpacked (``uncompress``), and session
  answers name files without their folders.
- Records: the ``params`` of an upload and the ``info`` of an image or label are JSON objects of finite numbers
  nested at most :data:`MAX_JSON_DEPTH` deep (:func:`check_json_value`, HTTP 422): NaN or Infinity saved into the
  datastore's record made every later listing fail (JSON answers have no NaN); records saved so before are answered
  with ``null`` in their place (:func:`finite_json`).
- Answers name no server path: reader messages are stripped of paths (:func:`redact_paths`), and the training
  status (``GET /train/``) shows neither the server's bundle folder nor the paths of its log lines.

MONAI Label's endpoints do not tell the app whether a request carried an upload, and they queue training in a
background process whose failure the client never sees as an HTTP status. :func:`lib.uploads.install_server_checks`
(called by the app once the server runs it, ``server_mode(True)``) therefore wraps MONAI Label 0.8.5 endpoint helpers:
the upload routes are replaced by those of :mod:`lib.uploads` (checked before the upload is copied, the temporary
file always removed; ``run_inference`` records what the request carries, :func:`client_request`), the
``AsyncTask`` of ``monailabel.endpoints.train`` and ``.batch_infer`` has the app check the request first (unknown
models: 404; the body: :func:`check_task_body`), their answers and those of ``status`` and ``stop`` show no server
path, the scoring routes are served by the app's own runs (``lib/scoring_runs.py``), the info
routes and the dataset download of ``monailabel.endpoints.datastore`` are those of :mod:`lib.uploads`, and the helpers
of ``monailabel.endpoints.session`` check session ids (the app's datastore checks ids and tags again, for every
route).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import os
import pathlib
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

from fastapi import HTTPException

from monailabel.utils.async_tasks.task import AsyncTask

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_EXTENSIONS",
    "LABEL_TAGS",
    "MAX_FILE_NAME_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TASK_BODY_BYTES",
    "RESERVED_IDS",
    "UNKNOWN_IMAGE",
    "CheckedAsyncTask",
    "ClientRequest",
    "check_id",
    "check_json_value",
    "check_new_id",
    "check_tag",
    "check_task_body",
    "client_request",
    "current_client_request",
    "finite_json",
    "install_session_checks",
    "public_answer",
    "relative_pair",
    "redact_paths",
    "resolve_image",
    "upload_extension",
]

# the one answer to an image that is not a datastore id: it names neither the id nor any server path
UNKNOWN_IMAGE = "image not found: give the id of a datastore image (GET /datastore/?output=all lists them) or upload it"


#: MONAI Label's own label tags; any other tag must match :data:`TAG_PATTERN`
LABEL_TAGS = ("final", "original")
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_MAX_ID = 255
#: the longest file name (in bytes, extension included) of the usual file systems
MAX_FILE_NAME_BYTES = 255
#: names of MONAI Label's local datastore in the studies folder (``datastore_v2.json``, ``.lock``, ``labels/``): no
#: upload may take them as its id (ids starting with a dot are refused too)
RESERVED_IDS = ("datastore_v2", "labels", ".lock")
#: extensions of an uploaded image: the image formats of MONAI Label's datastore (its ``*.xml`` and ``*.svs`` are not
#: images these models read); those the datastore does not list (``MONAI_LABEL_DATASTORE_FILE_EXT``) are left out
IMAGE_EXTENSIONS = (".nii.gz", ".nii", ".nrrd", ".png", ".jpg", ".tif")
#: extensions of an uploaded label map: the lossless ones of :data:`IMAGE_EXTENSIONS` (a JPEG changes label values)
LABEL_EXTENSIONS = (".nii.gz", ".nii", ".nrrd", ".png", ".tif")
#: the deepest nesting of objects and lists in a request's ``params`` or ``info``
MAX_JSON_DEPTH = 32
#: the largest task body (a training, batch inference or scoring request's JSON), in bytes
MAX_TASK_BODY_BYTES = 64 * 1024
# an absolute POSIX path or a Windows drive path inside a message (a token that starts at "/" or "X:\\")
_PATH_IN_TEXT = re.compile(r"(?<![\w.:/-])(?:/|[A-Za-z]:\\)[^\s'\"(),;]+")


def plain_name(value: Any) -> bool:
    """Whether ``value`` is a plain id (see :func:`check_id`)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_ID
        and len(value.encode("utf-8", "surrogatepass")) <= _MAX_ID
        and value.strip() == value
        and not any(c in value for c in ("/", "\\", ":"))
        and ".." not in value
        and value != "."
        and all(c.isprintable() for c in value)
    )


def check_id(value: Any, what: str = "image") -> str:
    """``value`` when it is a plain image / label id, else HTTP 400.

    A plain id is a non-empty printable name of at most 255 characters (and UTF-8 bytes) without a path separator
    (``/``, ``\\``),
    a drive colon, ``..``, surrounding blanks or the name ``.``: the datastore joins it into a file name of the
    studies folder, so it can name no file elsewhere.

    Args:
        value: the id from the request.
        what: what it is in the answer (``image``, ``label``). Default ``"image"``.

    Raises:
        HTTPException: 400 naming ``what`` (never the value).
    """
    if not plain_name(value):
        raise HTTPException(
            status_code=400,
            detail=f"{what} id must be a plain name (no '/', '\\', ':' or '..', not empty, at most {_MAX_ID} "
            "characters); GET /datastore/?output=all lists the ids",
        )
    return value


def check_new_id(value: Any, extension: str, what: str = "image") -> str:
    """``value`` when it may name a new datastore file ``<value><extension>``, else HTTP 400 naming the problem.

    On top of :func:`check_id`: not one of the datastore's own names (:data:`RESERVED_IDS`, any name starting with a
    dot), and ``<value><extension>`` at most :data:`MAX_FILE_NAME_BYTES` bytes (UTF-8).

    Args:
        value: the id from the request.
        extension: the extension of the file the datastore will write (e.g. ``.png``).
        what: what it is in the answer (``image``, ``label``). Default ``"image"``.

    Raises:
        HTTPException: 400.
    """
    check_id(value, what)
    if value.startswith(".") or value.lower() in RESERVED_IDS:
        raise HTTPException(
            status_code=400,
            detail=f"{what} id {value!r} is a name of the datastore itself ({', '.join(RESERVED_IDS)} and names "
            "starting with '.' are refused); choose another id",
        )
    size = len((value + extension).encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_NAME_BYTES:
        raise HTTPException(
            status_code=400,
            detail=f"{what} id is too long: its file name (id + {extension!r}) has {size} bytes, at most "
            f"{MAX_FILE_NAME_BYTES} are possible",
        )
    return value


def upload_extension(filename: Any, allowed: tuple[str, ...], what: str = "image") -> str:
    """The extension of an uploaded file's name among ``allowed`` (lower case, the longest that fits), else HTTP 415.

    Args:
        filename: the file name the client sent (``UploadFile.filename``).
        allowed: extensions with their dot, e.g. :data:`IMAGE_EXTENSIONS`.
        what: what the upload is in the answer. Default ``"image"``.

    Raises:
        HTTPException: 415 listing ``allowed`` (the name is not repeated).
    """
    name = filename.lower() if isinstance(filename, str) else ""
    for ext in sorted(allowed, key=len, reverse=True):
        if name.endswith(ext) and len(name) > len(ext):
            return ext
    raise HTTPException(
        status_code=415,
        detail=f"the uploaded {what} must be a file whose name ends with one of {list(allowed)}",
    )


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


def _json_problem(value: Any) -> str | None:
    # iterative: a value nested a thousand deep must not exhaust the interpreter's stack here
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "holds NaN or Infinity (JSON numbers are finite)"
        if isinstance(item, (dict, list, tuple)):
            if depth > MAX_JSON_DEPTH:
                return f"is nested deeper than {MAX_JSON_DEPTH} levels"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None


def check_json_value(value: Any, what: str = "params") -> Any:
    """``value`` when it is a JSON value the datastore can record and answer again, else HTTP 422 naming ``what``.

    Such a value holds finite numbers only (no NaN, no Infinity: a JSON answer cannot carry them) and objects and
    lists nested at most :data:`MAX_JSON_DEPTH` deep.

    Raises:
        HTTPException: 422 naming ``what`` and the problem.
    """
    problem = _json_problem(value)
    if problem is not None:
        raise HTTPException(status_code=422, detail=f"{what} {problem}")
    return value


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite number replaced by ``None`` (records saved before they were checked)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
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
    if served.session_id and plain_name(served.session_id) and sessions is not None:
        session = sessions.get_session(served.session_id)
        if session is not None and getattr(session, "image", None) == image:
            return image, "the session image"
    uri = datastore.get_image_uri(image) if _could_be_id(image) else ""
    if not uri:
        raise HTTPException(status_code=404, detail=UNKNOWN_IMAGE)
    return uri, f"image {image!r}"


def check_task_body(params: Any, what: str) -> dict[str, Any]:
    """The JSON object of a task request (``{}`` for none), else HTTP 422 (not an object, NaN or Infinity, nested too
    deep) or 413 (over :data:`MAX_TASK_BODY_BYTES`)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise HTTPException(status_code=422, detail=f"the {what} options must be a JSON object")
    check_json_value(params, f"the {what} options")
    size = len(json.dumps(params).encode("utf-8"))
    if size > MAX_TASK_BODY_BYTES:
        raise HTTPException(
            status_code=413, detail=f"the {what} options hold {size} bytes; at most {MAX_TASK_BODY_BYTES} are taken"
        )
    return params



class CheckedAsyncTask(AsyncTask):
    """MONAI Label's ``AsyncTask`` that has the app check a request before it is run or queued, and answers without
    the server's bundle folder (:func:`_public_task`).

    - ``train``: the app's ``check_train_request`` and ``check_train_data`` (4xx ``HTTPException``);
    - ``batch_infer``: the app's ``check_batch_infer_request`` (404 for a model that is not served);
    - both: the body is a bounded JSON object of finite numbers (:func:`check_task_body`).

    Scoring does not come here: ``lib.scoring_runs`` serves its routes in the server process.

    MONAI Label itself queues any name and answers ``200 SUBMITTED``; the queued task then fails where no client sees
    it."""

    @staticmethod
    def run(method: str, request: Any = None, params: Any = None, force_sync: bool = False, enqueue: bool = False):
        from monailabel.interfaces.utils.app import app_instance

        app = app_instance()
        params = check_task_body(params, method) if params is not None else None
        merged = {**(request or {}), **(params or {})}
        if method == "train" and getattr(app, "check_train_request", None) is not None:
            checked = app.check_train_request(merged)
            check_data = getattr(app, "check_train_data", None)
            if check_data is not None:
                check_data(checked)
        elif method == "batch_infer" and getattr(app, "check_batch_infer_request", None) is not None:
            app.check_batch_infer_request(merged)
        result, detail = AsyncTask.run(method, request=request, params=params, force_sync=force_sync, enqueue=enqueue)
        return _public_task(result), detail


def upload_id(image: Any, file: Any) -> Any:
    """The id MONAI Label gives an upload: ``image``, else the file name without all its suffixes."""
    # the id MONAI Label 0.8.5's PUT /datastore/image gives an upload (endpoints/datastore.py, add_image)
    if image:
        return image
    name = getattr(file, "filename", None)
    if not name:
        return ""
    return os.path.basename(name).replace("".join(pathlib.PurePath(name).suffixes), "")


def relative_pair(pair: Any) -> Any:
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
    """A task record (training, batch inference, scoring) as the routes answer it: without the server's bundle folder
    and log paths."""
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


def public_answer(helper: Any) -> Any:
    """``helper`` (an endpoint's ``status`` or ``stop``) answering task records through :func:`_public_task`."""

    @functools.wraps(helper)
    def public(*args: Any, **kwargs: Any) -> Any:
        return _public_task(helper(*args, **kwargs))

    return public


def public_session(answer: Any) -> Any:
    """A session answer with file names in place of server paths."""
    # MONAI Label's session answers carry the session folder and the image's path on the server: names only
    if isinstance(answer, dict):
        answer = dict(answer)
        if isinstance(answer.get("session_info"), dict):
            answer["session_info"] = public_session(answer["session_info"])
        for key in ("path", "image"):
            if isinstance(answer.get(key), str):
                answer[key] = os.path.basename(answer[key].rstrip("/\\"))
    return answer


def install_session_checks() -> None:
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
        return answer if image else public_session(answer)

    remove_session = session_endpoint.remove_session

    @functools.wraps(remove_session)
    def checked_remove_session(session_id):
        return public_session(remove_session(check_id(session_id, "session")))

    for wrapper in (checked_get_session, checked_remove_session):
        wrapper.spectraflow_checked = True
    session_endpoint.get_session = checked_get_session
    session_endpoint.remove_session = checked_remove_session
