"""The upload routes of MONAI Label 0.8.5 as the SpectraFlow app serves them (docs/monailabel.md, "Serving safely").

MONAI Label copies every upload into a named temporary file first and removes it in a background task that runs only
after a successful answer: each refused upload (an unknown image id, an unreadable file, a failing inference, an
unknown model) stayed in the temporary folder for good. These functions replace the endpoint helpers of
``monailabel.endpoints`` (``datastore.add_image``, ``datastore.save_label``, ``infer.run_inference``,
``model.update_model``, ``model.delete_model``, ``session.create_session``, ``wsi_infer.run_wsi_inference``;
installed by :func:`install_server_checks`). Each one:

- checks what it can before the upload is copied: the model (404), the image id and label tag (400), the file name's
  extension (415: :data:`lib.checks.IMAGE_EXTENSIONS`, :data:`lib.checks.LABEL_EXTENSIONS`, ``.pt`` / ``.pth`` for
  weights), the options (422) and the size (413: ``--conf max_upload_mb``, checked again while copying);
- copies the upload into one temporary file (:func:`buffered_upload`) and removes it whatever the answer.

A model upload is checked before it replaces anything (the app's ``replace_model``: loaded weights-only and strictly
against the served network, 422 naming why) and replaces the served ``models/model.pt`` and ``models/model.json``
atomically, the replaced pair kept as ``models/model.pt.bak-<time>`` and ``models/model.json.bak-<time>``
(:func:`lib.served.replace_served_pair`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import zipfile
from typing import Any, Callable, Iterator

from fastapi import HTTPException

from .checks import (
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    MAX_JSON_DEPTH,
    UNKNOWN_IMAGE,
    CheckedAsyncTask,
    check_id,
    check_json_value,
    check_new_id,
    check_tag,
    client_request,
    finite_json,
    install_session_checks,
    plain_name,
    public_answer,
    public_session,
    relative_pair,
    upload_extension,
    upload_id,
)
from .dicomseg import segment_names
from .labels import CONVERTED_LABEL_EXTENSIONS, VOLUME_LABEL_EXTENSIONS
from .scoring_runs import install_scoring_routes
from .sessions import check_expiry

__all__ = [
    "DEFAULT_MAX_UPLOAD_MB",
    "MODEL_EXTENSIONS",
    "MODEL_PAIR",
    "SESSION_EXTENSIONS",
    "add_image",
    "buffered_upload",
    "create_session",
    "datastore_extensions",
    "delete_model",
    "dicom_seg_answer",
    "download_dataset",
    "install_proxy_check",
    "install_server_checks",
    "is_remote",
    "json_object",
    "MAX_PROXY_QUERY",
    "proxy_target",
    "run_wsi_inference",
    "save_label",
    "session_file_name",
    "update_image_info",
    "update_label_info",
    "unpack_model_pair",
    "update_model",
    "upload_limit",
    "wrap_run_inference",
]

#: the largest upload the server takes by default, in MB (``--conf max_upload_mb``)
DEFAULT_MAX_UPLOAD_MB = 2048.0
#: extensions a session keeps of its files' names (:func:`session_file_name`): images and DICOM files
SESSION_EXTENSIONS = (*IMAGE_EXTENSIONS, ".dcm")
#: extensions of weights alone, which ``PUT /model/<name>`` refuses (a model is served with its record)
MODEL_EXTENSIONS = (".pt", ".pth")
#: what the ZIP of ``PUT /model/<name>`` holds: the weights and their record
MODEL_PAIR = ("model.pt", "model.json")
_CHUNK = 1 << 20


def _app() -> Any:
    from monailabel.interfaces.utils.app import app_instance

    return app_instance()


def upload_limit(app: Any) -> int:
    """The largest upload ``app`` takes, in bytes (its ``max_upload_bytes``, else :data:`DEFAULT_MAX_UPLOAD_MB`)."""
    return int(getattr(app, "max_upload_bytes", DEFAULT_MAX_UPLOAD_MB * 1e6))


def _too_large(limit: int) -> HTTPException:
    return HTTPException(
        status_code=413,
        detail=f"the upload is larger than this server takes ({limit / 1e6:g} MB, --conf max_upload_mb)",
    )


@contextlib.contextmanager
def buffered_upload(upload: Any, suffix: str, limit: int) -> Iterator[str]:
    """Copy an upload into a new temporary file ending with ``suffix``; the file is removed when the block ends,
    whatever happened.

    Args:
        upload: FastAPI's ``UploadFile`` (its ``size``, when known, is checked before anything is copied).
        suffix: the file's extension (readers choose the format from it).
        limit: the largest size in bytes; a larger upload is HTTP 413, checked again while copying.

    Yields:
        the temporary file's path.
    """
    size = getattr(upload, "size", None)
    if isinstance(size, int) and size > limit:
        raise _too_large(limit)
    fd, path = tempfile.mkstemp(suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as out:
            total = 0
            while chunk := upload.file.read(_CHUNK):
                total += len(chunk)
                if total > limit:
                    raise _too_large(limit)
                out.write(chunk)
        yield path
    finally:
        if os.path.isfile(path):
            os.remove(path)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_object(text: Any, what: str = "params") -> dict[str, Any]:
    """The JSON object in form field ``what`` (empty: ``{}``), else HTTP 422 naming the field: not JSON, not an
    object, NaN or Infinity in it, or nested deeper than :data:`lib.checks.MAX_JSON_DEPTH`
    (:func:`lib.checks.check_json_value`)."""
    if text in (None, ""):
        return {}
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (TypeError, ValueError) as e:
        nan = "not a JSON number" in str(e)
        detail = "holds NaN or Infinity (JSON numbers are finite)" if nan else "must be a JSON object"
        raise HTTPException(status_code=422, detail=f"{what} {detail}") from None
    except RecursionError:
        raise HTTPException(status_code=422, detail=f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(value, dict):
        raise HTTPException(status_code=422, detail=f"{what} must be a JSON object")
    return check_json_value(value, what)


def datastore_extensions(datastore: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The extensions of ``allowed`` that the datastore lists (its ``MONAI_LABEL_DATASTORE_FILE_EXT`` patterns)."""
    patterns = getattr(datastore, "_extensions", None)
    if not patterns:
        return allowed
    listed = {str(p).lstrip("*").lower() for p in patterns}
    return tuple(e for e in allowed if e in listed)


def is_remote(store: Any) -> bool:
    """Whether ``store`` is the app's DICOMweb datastore (a PACS; ``lib/dicomweb.py``)."""
    return bool(getattr(store, "remote", False))


def _checked_datastore(app: Any) -> Any:
    store = app.datastore()
    return store if hasattr(store, "require_image") else None


# ---------------------------------------------------------------- the endpoint helpers
def add_image(background_tasks: Any, image: Any = None, params: str = "{}", file: Any = None, user: Any = None):
    """``PUT /datastore/image``: id, extension, params and size checked, then one temporary copy, always removed."""
    app = _app()
    store = _checked_datastore(app)
    if is_remote(store):
        raise HTTPException(
            status_code=422, detail="images come from the PACS (DICOMweb): store them there, not through this server"
        )
    if file is None:
        raise HTTPException(status_code=422, detail="no file: upload the image as the form field 'file'")
    image_id = check_id(upload_id(image, file))
    ext = upload_extension(file.filename, datastore_extensions(store or app.datastore(), IMAGE_EXTENSIONS))
    check_new_id(image_id, ext)
    save_params = json_object(params)
    if user:
        save_params["user"] = user
    with buffered_upload(file, ext, upload_limit(app)) as path:
        image_id = app.datastore().add_image(image_id, path, save_params)
    return {"image": image_id}


def save_label(background_tasks: Any, image: Any, params: str = "{}", tag: Any = "final", label: Any = None,
               user: Any = None):  # fmt: skip
    """``PUT /datastore/label``: image id (known: else 404), tag, extension, params and size checked, then one
    temporary copy, always removed."""
    app = _app()
    store = app.datastore()
    check_id(image)
    tag = check_tag(tag or "final")
    if label is None:
        raise HTTPException(status_code=422, detail="no label: upload the label map as the form field 'label'")
    allowed = VOLUME_LABEL_EXTENSIONS if is_remote(store) else (
        *datastore_extensions(store, LABEL_EXTENSIONS), *CONVERTED_LABEL_EXTENSIONS)  # fmt: skip
    ext = upload_extension(label.filename, allowed, "label map")
    check_new_id(image, ext, "label")
    if hasattr(store, "require_image"):
        store.require_image(image)
    save_params = json_object(params)
    if user:
        save_params["user"] = user
    with buffered_upload(label, ext, upload_limit(app)) as path:
        label_id = store.save_label(image, path, tag, save_params)
    answer = app.on_save_label(image, label_id) or {}
    answer.update({"image": image, "label": label_id})
    return answer


def update_image_info(image: Any, info: Any = "{}", user: Any = None):
    """``PUT /datastore/image/info``: ``info`` a JSON object of finite numbers (else 422), the image known (404)."""
    record = json_object(info, "info")
    if user:
        record["user"] = user
    return _app().datastore().update_image_info(check_id(image), record)


def update_label_info(label: Any, tag: Any, info: Any = "{}", user: Any = None):
    """``PUT /datastore/label/info``: ``info`` a JSON object of finite numbers (else 422), the label known (404)."""
    record = json_object(info, "info")
    if user:
        record["user"] = user
    return _app().datastore().update_label_info(check_id(label, "label"), check_tag(tag), record)


def download_dataset(limit_cases: Any = None):
    """``GET /datastore/dataset``: the ZIP of the labelled images (MONAI Label's), removed once it is sent (MONAI
    Label left one in the temporary folder per request); 404 while no image has a label."""
    from starlette.background import BackgroundTask
    from starlette.responses import FileResponse

    store = _app().datastore()
    if not store.datalist():
        raise HTTPException(status_code=404, detail="no image has a label yet (labels/final): nothing to download")
    if limit_cases is not None and (isinstance(limit_cases, bool) or not isinstance(limit_cases, int)):
        raise HTTPException(status_code=422, detail="limit_cases must be a number of images")
    path = store.get_dataset_archive(limit_cases)
    return FileResponse(
        path, media_type="application/zip", filename="dataset.zip", background=BackgroundTask(_remove, path)
    )


def _remove(path: str) -> None:
    if os.path.isfile(path):
        os.remove(path)


def wrap_run_inference(original: Callable) -> Callable:
    """MONAI Label's ``run_inference`` behind the checks below, given the upload as a checked temporary file."""

    def run_inference(background_tasks: Any, model: Any, image: Any = "", session_id: Any = "", params: Any = "{}",
                      file: Any = None, label: Any = None, output: Any = None):  # fmt: skip
        """``POST /infer/<model>``: params (a JSON object, else 422), model (404), session id, extension and size
        checked before the upload is copied; the copy is removed whatever the answer."""
        options = json_object(params)
        app = _app()
        require = getattr(app, "require_infer_model", None)
        if require is not None:
            require(model)
        if session_id and not plain_name(session_id):  # MONAI Label would read <session store>/<id>/meta.info
            raise HTTPException(status_code=404, detail=UNKNOWN_IMAGE)
        if label:
            raise HTTPException(
                status_code=422, detail="this server's models take no label upload (form field 'label')"
            )
        if output == "dicom_seg" and not is_remote(app.datastore()):
            raise HTTPException(
                status_code=422, detail="output dicom_seg needs a DICOMweb datastore; use image or json"
            )
        if not (file or image or session_id or options.get("image")):
            raise HTTPException(status_code=400, detail="no image: give an image id, a file or a session id")
        if output == "dicom_seg":
            if file or session_id:
                raise HTTPException(
                    status_code=422,
                    detail="output dicom_seg segments a series of the PACS: give its series instance UID as image "
                    "(no upload, no session)",
                )
            return dicom_seg_answer(app, model, options.get("image") or image, options)
        if not file:
            with client_request(upload=False, session_id=session_id):
                return original(background_tasks, model, image, session_id, params, None, None, output)
        ext = upload_extension(file.filename, IMAGE_EXTENSIONS)
        # an "image" in params replaces the upload's path: it is then an id like any other
        with buffered_upload(file, ext, upload_limit(app)) as path, client_request(
            upload="image" not in options, session_id=session_id
        ):
            return original(background_tasks, model, path, session_id, params, None, None, output)

    return run_inference


def dicom_seg_answer(app: Any, model: str, image: Any, options: dict[str, Any]) -> Any:
    """``POST /infer/<model>?output=dicom_seg``: the model's label of PACS series ``image`` as a DICOM SEG whose
    segments are the classes present, named after the model's ``channel_def`` (the datastore's ``write_seg``:
    ``spectraflow_monai.data.dicom_seg.write_dicom_seg``, the converter of the bundles' ``dicom_seg`` output); a
    client's ``label_info`` is checked against the classes (422 when it contradicts them) and needs not be sent. The
    label file and the SEG are removed once the answer is sent."""
    from starlette.background import BackgroundTask
    from starlette.responses import FileResponse

    store = app.datastore()
    check_id(image)
    store.require_image(image)
    request = {**options, "model": model, "image": image}
    label_info = request.pop("label_info", None)
    classes = app.model_classes(model)
    segment_names([], classes, label_info)  # a contradicting label_info: 422 before the model runs
    with client_request(upload=False):
        result = app.infer(request)
    label = result.get("file") or result.get("label") if isinstance(result, dict) else None
    folder = store.work_folder()
    try:
        if not label or not os.path.isfile(label):
            raise HTTPException(status_code=500, detail="the model wrote no label")
        from monai.transforms import LoadImage

        import numpy as np

        values = np.unique(np.asarray(LoadImage(image_only=True)(label))).tolist()
        names = segment_names(values, classes, label_info)
        if not names:
            raise HTTPException(
                status_code=422, detail=f"model {model!r} found no class in series {image}: there is no segment to "
                "store as DICOM SEG (output=image gives the empty label)",
            )
        seg = store.write_seg(image, label, folder, model)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        if label and os.path.isfile(label):
            os.remove(label)
    return FileResponse(seg, media_type="application/dicom", filename=f"{image}.seg.dcm",
                        background=BackgroundTask(shutil.rmtree, folder, True))  # fmt: skip


def run_wsi_inference(background_tasks: Any, model: Any, image: Any = "", session_id: Any = "", file: Any = None,
                      wsi: Any = None, output: Any = None):  # fmt: skip
    """``POST /infer/wsi/<model>``, ``/infer/wsi_v2/<model>``: refused (422) before an upload is copied; no model of
    this app segments whole-slide images tile by tile."""
    _app().require_infer_model(model)
    raise HTTPException(
        status_code=422, detail=f"model {model!r} does not run whole-slide (WSI) inference: use POST /infer/{model}"
    )


def unpack_model_pair(archive: str, folder: str, limit: int) -> tuple[str, str]:
    """Unpack the model archive of ``PUT /model/<name>`` into ``folder``: a ZIP of exactly :data:`MODEL_PAIR`
    (``model.pt`` and its record ``model.json``) at its top level, each at most ``limit`` bytes once unpacked.

    Returns:
        the paths of the unpacked ``model.pt`` and ``model.json``.

    Raises:
        HTTPException: 422 for a file that is not such an archive (naming what it holds instead), 413 for a member
            over ``limit`` (checked against the archive's sizes and again while unpacking).
    """
    try:
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.infolist() if not m.is_dir()]
            names = sorted(m.filename for m in members)
            if names != sorted(MODEL_PAIR):
                shown = [n[:64] for n in names[:5]] + ([f"... and {len(names) - 5} more"] if len(names) > 5 else [])
                raise HTTPException(
                    status_code=422,
                    detail=f"the model archive must hold exactly {list(MODEL_PAIR)} at its top level, it holds {shown}",
                )
            os.makedirs(folder, exist_ok=True)
            for member in members:
                if member.file_size > limit:
                    raise _too_large(limit)
                total = 0
                with zf.open(member) as src, open(os.path.join(folder, member.filename), "wb") as out:
                    while chunk := src.read(_CHUNK):
                        total += len(chunk)
                        if total > limit:
                            raise _too_large(limit)
                        out.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, OSError) as e:
        raise HTTPException(status_code=422, detail=f"the model archive cannot be read as a ZIP ({type(e).__name__})")
    return os.path.join(folder, MODEL_PAIR[0]), os.path.join(folder, MODEL_PAIR[1])


def update_model(background_tasks: Any, model: Any, file: Any):
    """``PUT /model/<model>``: model (404), extension and size checked before the upload is copied; weights alone
    (``.pt``) are 422 naming the record they need; the app's ``replace_model`` checks the pair in the ZIP (422 naming
    why) and replaces the served pair."""
    app = _app()
    app.require_bundle(model)
    name = getattr(file, "filename", None)
    ext = upload_extension(name, (".zip", *MODEL_EXTENSIONS), "model") if name else ".zip"
    if ext in MODEL_EXTENSIONS:
        raise HTTPException(
            status_code=422,
            detail="weights alone are not served: a model is served with its record. Upload a ZIP of model.pt and the "
            "model.json its training wrote beside it (e.g. zip -j model.zip models/model.pt models/model.json)",
        )
    with buffered_upload(file, ".zip", upload_limit(app)) as path:
        return app.replace_model(model, path)


def delete_model(model: Any):
    """``DELETE /model/<model>``: the served pair is set aside as ``models/model.pt.bak-<time>`` and
    ``models/model.json.bak-<time>`` (404 without one; :func:`lib.served.set_aside_served_model`)."""
    _app().delete_model(model)
    return {}


def create_session(background_tasks: Any, uncompress: Any = False, expiry: Any = 0, files: Any = None):
    """``PUT /session/``: no archive unpacked (422), expiry checked (422) and capped, size checked; the received files
    are moved into the session or removed."""
    if uncompress:
        raise HTTPException(
            status_code=422,
            detail="uncompress is not accepted: upload the image file, or the files of a DICOM series, as they are",
        )
    app = _app()
    sessions = app.sessions()
    if sessions is None:
        raise HTTPException(status_code=406, detail="Session Feature is Not Enabled")
    expiry = check_expiry(expiry, sessions.expiry)
    if not files:
        raise HTTPException(status_code=400, detail="no file: upload the image as the form field 'files'")
    limit, total = upload_limit(app), 0
    received = tempfile.mkdtemp()
    try:
        for i, upload in enumerate(files):
            name = session_file_name(upload.filename, i)
            with buffered_upload(upload, "", limit - total) as path:
                total += os.path.getsize(path)
                shutil.move(path, os.path.join(received, name))
        names = os.listdir(received)
        source = os.path.join(received, names[0]) if len(names) == 1 else received
        session_id, info = sessions.add_session(source, expiry, False)
    finally:
        shutil.rmtree(received, ignore_errors=True)
    return public_session({"session_id": session_id, "session_info": info.to_json()})


def session_file_name(filename: Any, index: int) -> str:
    """The name a session keeps an uploaded file under: the client's file name when it is a plain name ending with
    an image extension (:data:`lib.checks.IMAGE_EXTENSIONS`) or ``.dcm``, else ``file<index>`` (a member of a DICOM
    series without extension). No other name is kept, so that no session file can be a Python module, package data
    or anything else a process would load code from."""
    base = os.path.basename(str(filename or "").replace("\\", "/"))
    if plain_name(base) and not base.startswith(".") and base.lower().endswith(SESSION_EXTENSIONS):
        if len(base) > len(next(e for e in SESSION_EXTENSIONS if base.lower().endswith(e))):
            return base
    return f"file{int(index)}"


def install_server_checks() -> None:
    """Wrap MONAI Label's inference, training and datastore endpoint helpers (see the module docstring);
    idempotent."""
    from monailabel.endpoints import batch_infer as batch_endpoint
    from monailabel.endpoints import datastore as datastore_endpoint
    from monailabel.endpoints import infer as infer_endpoint
    from monailabel.endpoints import model as model_endpoint
    from monailabel.endpoints import session as session_endpoint
    from monailabel.endpoints import train as train_endpoint
    from monailabel.endpoints import wsi_infer as wsi_endpoint

    # every upload route: checked before the upload is copied, its temporary file removed whatever the answer
    run_inference = infer_endpoint.run_inference
    if not getattr(run_inference, "spectraflow_checked", False):
        run_inference = wrap_run_inference(run_inference)
    for module, name, replacement in (
        (infer_endpoint, "run_inference", run_inference),
        (datastore_endpoint, "add_image", add_image),
        (datastore_endpoint, "save_label", save_label),
        (datastore_endpoint, "update_image_info", update_image_info),
        (datastore_endpoint, "update_label_info", update_label_info),
        (datastore_endpoint, "download_dataset", download_dataset),
        (model_endpoint, "update_model", update_model),
        (model_endpoint, "delete_model", delete_model),
        (session_endpoint, "create_session", create_session),
        (wsi_endpoint, "run_wsi_inference", run_wsi_inference),
    ):
        replacement.spectraflow_checked = True
        setattr(module, name, replacement)
    for module in (train_endpoint, batch_endpoint):
        if not (isinstance(module.AsyncTask, type) and issubclass(module.AsyncTask, CheckedAsyncTask)):
            module.AsyncTask = CheckedAsyncTask
        for name in ("status", "stop"):  # the task records of GET and DELETE without the server's folders
            helper = getattr(module, name)
            if not getattr(helper, "spectraflow_checked", False):
                public = public_answer(helper)
                public.spectraflow_checked = True
                setattr(module, name, public)

    listing = datastore_endpoint.datastore
    if not getattr(listing, "spectraflow_checked", False):

        @functools.wraps(listing)
        def public_listing(output=None):
            # ?output=train lists the training pairs: file names relative to the studies folder, not server paths;
            # records saved with NaN or Infinity before they were checked are answered with null in their place
            result = finite_json(listing(output))
            if isinstance(result, list):
                result = [relative_pair(pair) for pair in result]
            return result

        public_listing.spectraflow_checked = True
        datastore_endpoint.datastore = public_listing

    install_session_checks()
    install_scoring_routes()
    install_proxy_check()


#: the longest query string the DICOMweb proxy forwards
MAX_PROXY_QUERY = 4096


def proxy_target(op: str, path: str, query: Any) -> tuple[str, str]:
    """The operation and path (with its query string) the DICOMweb proxy forwards for ``/proxy/dicom/<op>/<path>``.

    MONAI Label 0.8.5 forwards the path without its query string, so every QIDO-RS filter (``PatientID``,
    ``StudyInstanceUID``, ``limit``, ...) was dropped and OHIF listed every study of the PACS. The query's parameters
    are forwarded again, each re-encoded (no character of the client's reaches the PACS's URL unescaped, but the
    QIDO-RS wildcards ``*`` and ``?`` and the list separator ``,``: Orthanc's DICOMweb plugin 1.7 matches the values
    undecoded, and OHIF's study list filters with ``*<text>*``); a QIDO-RS ``metadata`` request goes to WADO-RS (as
    MONAI Label does, also with a query).

    Args:
        op: ``qido``, ``wado``, ``stow`` or ``""``.
        path: the path after the operation.
        query: the request's query parameters (Starlette's ``request.query_params``: ``multi_items()``) or pairs.

    Raises:
        HTTPException: 400 for a path with a ``.`` or ``..`` segment (it would leave the DICOMweb root), 414 for a
            query over :data:`MAX_PROXY_QUERY` characters.
    """
    from urllib.parse import urlencode

    if any(part in (".", "..") for part in str(path).replace("\\", "/").split("/")):
        raise HTTPException(status_code=400, detail="the DICOMweb path must not hold '.' or '..' segments")
    items = list(query.multi_items() if hasattr(query, "multi_items") else query or [])
    encoded = urlencode(items, safe="*?,")
    if len(encoded) > MAX_PROXY_QUERY:
        raise HTTPException(status_code=414, detail=f"the query string is longer than {MAX_PROXY_QUERY} characters")
    if op == "qido" and str(path).endswith("metadata"):
        op = "wado"
    return op, f"{path}?{encoded}" if encoded else str(path)


def install_proxy_check() -> None:
    """``/proxy/dicom/...`` answers 404 on a local datastore (MONAI Label forwarded the request to the studies
    folder's path as a URL: a bare 500); a DICOMweb datastore is proxied as MONAI Label does, with the request's
    query string (:func:`proxy_target`). Idempotent."""
    from monailabel.config import settings
    from monailabel.endpoints import proxy as proxy_endpoint

    forward = proxy_endpoint.proxy_dicom
    if getattr(forward, "spectraflow_checked", False):
        return

    @functools.wraps(forward)
    async def proxy_dicom(request: Any, op: str, path: str) -> Any:
        if not str(settings.MONAI_LABEL_STUDIES).startswith(("http://", "https://")):
            raise HTTPException(
                status_code=404,
                detail="the DICOMweb proxy serves a DICOMweb datastore; this server's studies are a local folder",
            )
        op, target = proxy_target(op, path, request.query_params)
        return await forward(request, op, target)

    proxy_dicom.spectraflow_checked = True
    proxy_endpoint.proxy_dicom = proxy_dicom
