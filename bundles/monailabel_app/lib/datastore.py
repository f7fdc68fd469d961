"""The local datastore as the SpectraFlow app serves it (docs/monailabel.md, "Serving safely").

MONAI Label 0.8.5's ``LocalDatastore`` keeps its record (``datastore_v2.json``: every image, label and their infos)
in memory and writes the whole of it after each change. :class:`CheckedLocalDatastore` makes the server the only
writer of that record and keeps what annotators save:

- **one writer, whole records.** Every change of the record (an upload, a label, an info, a removal, a reload after a
  file appeared) runs under one lock of the server process and MONAI Label's file lock, and the file is replaced
  atomically (written beside it, then renamed): a reader sees the old record or the new one, never a part of one. A
  reload from the file never leaves the record without its folder (MONAI Label set the folder after swapping the
  record in, so a label saved in between was written relative to the server's working folder, and answered 500).
  Scores are written through the server too (:meth:`CheckedLocalDatastore.update_image_infos`, many images at a
  time, one file write), never by a task process from its own stale copy of the record.
- **requests checked.** Ids are plain names and tags simple names (``lib.checks``: 400), unknown ids and labels are
  404, an uploaded image or label is refused before it is stored when its id is one of the datastore's own names or
  too long for a file name (400), its extension is not an image format of the datastore (415), or MONAI cannot read
  it (415); a label map has its image's size, and a volume's label values are 0 or classes of the served volume model
  (422); a ``.bin`` (raw voxels) or a Slicer ``.seg.nrrd`` label is written on its image's grid first
  (``lib/labels.py``).
- **one pair per id.** An image uploaded again under its id keeps its format (another extension would leave two files
  for one id: 409), and an image with labels keeps its size (another size would leave its labels misaligned: 409).
- **bounded infos.** The info of an image or a label holds at most :data:`MAX_INFO_BYTES` of JSON (413), whatever
  the number of requests that add to it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from typing import Any

from fastapi import HTTPException
from filelock import FileLock
from monai.transforms import LoadImage

from monailabel.datastore.local import LocalDatastore, LocalDatastoreModel

from .checks import (
    IMAGE_EXTENSIONS,
    LABEL_EXTENSIONS,
    check_id,
    check_json_value,
    check_new_id,
    check_tag,
    finite_json,
    redact_paths,
    upload_extension,
)
from .infers import short_reason
from .labels import CONVERTED_LABEL_EXTENSIONS, read_label_upload, spatial_shape, write_on_grid
from .uploads import datastore_extensions

__all__ = ["MAX_INFO_BYTES", "CheckedLocalDatastore", "info_size", "spatial_shape"]

logger = logging.getLogger(__name__)

#: the largest info (JSON, in bytes) of one image or label; 30 requests of a megabyte each grew MONAI Label's record
#: (rewritten whole after every change) by 27 MB
MAX_INFO_BYTES = 64 * 1024


def info_size(info: dict[str, Any]) -> int:
    """The size of an info as JSON, in bytes."""
    return len(json.dumps(info, default=str).encode("utf-8"))


class CheckedLocalDatastore(LocalDatastore):
    """MONAI Label's ``LocalDatastore`` with the server as the one careful writer of its record (see the module
    docstring). Same arguments as ``LocalDatastore``."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._image_shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # path -> (file version, size)
        # the server's requests, the file watcher and the scoring runs change the record from several threads
        self._mutex = threading.RLock()
        #: ``{value: class name}`` a volume's label values must belong to (the served volume model's; the app sets
        #: it); empty: values are not checked
        self.label_classes: dict[int, str] = {}
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ the record: one writer, whole files
    def _init_from_datastore_file(self, throw_exception: bool = False) -> None:
        """Reload the record from its file when the file changed; the new record has its folder before it is used."""
        with self._mutex:
            try:
                with FileLock(self._lock_file):
                    if not os.path.exists(self._datastore_config_path):
                        return
                    ts = os.stat(self._datastore_config_path).st_mtime
                    if self._config_ts == ts:
                        return
                    with open(self._datastore_config_path) as fp:
                        record = LocalDatastoreModel.model_validate_json(fp.read())
                    record.base_path = self._datastore_path
                    self._datastore, self._config_ts = record, ts
            except ValueError as e:
                logger.error(f"+++ Failed to load datastore => {e}")
                if throw_exception:
                    raise

    def _update_datastore_file(self, lock: bool = True) -> None:
        """Write the whole record atomically: a temporary file beside it, then one rename."""
        with self._mutex:
            if lock:
                with FileLock(self._lock_file):
                    self._write_record()
            else:
                self._write_record()

    def _write_record(self) -> None:
        text = json.dumps(self._datastore.model_dump(exclude={"base_path"}), indent=2, default=str)
        tmp = f"{self._datastore_config_path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._datastore_config_path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self._config_ts = os.stat(self._datastore_config_path).st_mtime

    def refresh(self) -> None:
        with self._mutex:
            super().refresh()

    def _on_any_event(self, event: Any) -> None:
        """The file watcher's call after a change under the studies folder: the record follows the folder. A folder
        gone under it (``labels`` removed while the server runs) is logged and the watcher goes on; raised
        here, the error would end the watcher's thread and the record would silently stop following the folder."""
        with self._mutex:
            try:
                super()._on_any_event(event)
            except OSError as e:
                logger.warning(f"the datastore did not follow a change in its studies folder ({short_reason(e)}); "
                               "it follows the next one")  # fmt: skip

    def _on_modify_event(self, event: Any) -> None:
        with self._mutex:
            super()._on_modify_event(event)

    # ------------------------------------------------------------------ uploads
    def _read_upload(self, filename: str, what: str) -> tuple[int, ...]:
        """The spatial size of the uploaded image or label map at ``filename``; HTTP 415 when MONAI cannot read it."""
        try:
            image = LoadImage(image_only=True)(filename)
        except Exception as e:  # every reader failure means "not an image"
            reason = redact_paths(short_reason(e), {filename: "the upload", os.path.realpath(filename): "the upload"})
            raise HTTPException(status_code=415, detail=f"the upload is not a readable {what} ({reason})") from None
        return spatial_shape(image)

    def image_shape(self, image_id: str) -> tuple[int, ...]:
        """The spatial size of datastore image ``image_id`` (read once per version of its file)."""
        path = self.get_image_uri(image_id)
        stat = os.stat(path)
        version = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
        cached = self._image_shapes.get(path)
        if cached is None or cached[0] != version:
            cached = self._image_shapes[path] = (version, spatial_shape(LoadImage(image_only=True)(path)))
        return cached[1]

    def _new_file(self, image_id: str, filename: str, allowed: tuple[str, ...], what: str) -> tuple[str, str]:
        """The checked id and extension of a new datastore file from ``filename``."""
        name_id, ext = self._to_id(os.path.basename(filename))
        upload_extension(f"x{ext}", datastore_extensions(self, allowed), what)
        return check_new_id(image_id or name_id, ext, "image" if what == "image" else "label"), ext

    def require_image(self, image_id: str) -> None:
        """HTTP 404 unless ``image_id`` is an image of the datastore."""
        if image_id not in self._datastore.objects:
            raise HTTPException(status_code=404, detail="image not found: GET /datastore/?output=all lists the ids")

    def _require_label(self, label_id: str, label_tag: str) -> None:
        if self._datastore.label(label_id, label_tag) is None:
            raise HTTPException(status_code=404, detail="label not found: GET /datastore/?output=all lists the ids")

    def _check_replacement(self, image_id: str, ext: str, shape: tuple[int, ...]) -> None:
        """HTTP 409 when an upload under the id of a stored image would leave two files for one id (another
        extension) or labels of another size (another size, the image having labels)."""
        obj = self._datastore.objects.get(image_id)
        if obj is None:
            return
        if obj.image.ext != ext:
            raise HTTPException(
                status_code=409,
                detail=f"image {image_id!r} is stored as {obj.image.ext!r}; an upload as {ext!r} would leave two files "
                f"for one id: delete the image first (DELETE /datastore/image?id={image_id}) or upload it as "
                f"{obj.image.ext!r}",
            )
        stored = self.image_shape(image_id)
        if obj.labels and shape != stored:
            raise HTTPException(
                status_code=409,
                detail=f"image {image_id!r} has labels ({sorted(obj.labels)}) of its size {list(stored)}; an image of "
                f"size {list(shape)} would leave them misaligned: delete the image with its labels first "
                f"(DELETE /datastore/image?id={image_id}) or upload it at its size",
            )

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        image_id, ext = self._new_file(image_id, image_filename, IMAGE_EXTENSIONS, "image")
        self._check_info(check_json_value(image_info, "params"), "params")
        shape = self._read_upload(image_filename, "image")
        with self._mutex:
            self._check_replacement(image_id, ext, shape)
            return super().add_image(image_id, image_filename, image_info)

    def remove_image(self, image_id: str) -> None:
        with self._mutex:
            self.require_image(check_id(image_id))
            return super().remove_image(image_id)

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any]) -> str:
        """Check a label map and store it: its image's size (422), a volume's values 0 or classes of
        :attr:`label_classes` (422); a ``.bin`` (raw voxels) or a Slicer ``.seg.nrrd`` is first written on the image's
        grid in the image's format (``lib/labels.py``)."""
        check_tag(label_tag)
        self.require_image(check_id(image_id))
        self._check_info(check_json_value(label_info, "params"), "params")
        ext = upload_extension(os.path.basename(label_filename), (*LABEL_EXTENSIONS, *CONVERTED_LABEL_EXTENSIONS),
                               "label map")  # fmt: skip
        expected = self.image_shape(image_id)
        classes = self.label_classes if len(expected) == 3 else None
        with tempfile.TemporaryDirectory() as folder:
            if ext in CONVERTED_LABEL_EXTENSIONS or classes:
                array = read_label_upload(label_filename, ext, image_id, expected, classes)
                if ext in CONVERTED_LABEL_EXTENSIONS:
                    image = self.get_image_uri(image_id)
                    own = self._datastore.objects[image_id].image.ext
                    out = own if own in LABEL_EXTENSIONS else (".nii.gz" if len(expected) == 3 else ".png")
                    label_filename = write_on_grid(array, image, os.path.join(folder, f"label{out}"))
            self._new_file(image_id, label_filename, LABEL_EXTENSIONS, "label map")
            shape = self._read_upload(label_filename, "label map")
            if shape != expected:
                raise HTTPException(
                    status_code=422,
                    detail=f"the label map's size {list(shape)} differs from the size {list(expected)} of image "
                    f"{image_id!r} (spatial dimensions, as MONAI reads them): a label map has its image's size and "
                    "number of dimensions",
                )
            with self._mutex:
                self.require_image(image_id)  # removed meanwhile
                return super().save_label(image_id, label_filename, label_tag, label_info)

    def remove_label(self, label_id: str, label_tag: str) -> None:
        with self._mutex:
            self._require_label(check_id(label_id, "label"), check_tag(label_tag))
            return super().remove_label(label_id, label_tag)

    # ------------------------------------------------------------------ reads
    def get_image(self, image_id: str, params: Any = None) -> Any:
        return super().get_image(check_id(image_id), params)

    def get_image_uri(self, image_id: str) -> str:
        return super().get_image_uri(check_id(image_id))

    def get_image_info(self, image_id: str) -> dict[str, Any]:
        with self._mutex:
            self.require_image(check_id(image_id))
            info = finite_json(super().get_image_info(image_id))
        info.pop("path", None)  # the server path of the file: the answer shows ids only
        return info

    def get_label(self, label_id: str, label_tag: str, params: Any = None) -> Any:
        return super().get_label(check_id(label_id, "label"), check_tag(label_tag), params)

    def get_label_uri(self, label_id: str, label_tag: str) -> str:
        return super().get_label_uri(check_id(label_id, "label"), check_tag(label_tag))

    def get_label_info(self, label_id: str, label_tag: str) -> dict[str, Any]:
        with self._mutex:
            self._require_label(check_id(label_id, "label"), check_tag(label_tag))
            return finite_json(super().get_label_info(label_id, label_tag))

    def get_labels_by_image_id(self, image_id: str) -> dict[str, str]:
        return super().get_labels_by_image_id(check_id(image_id))

    def datalist(self, full_path: bool = True) -> list[dict[str, Any]]:
        with self._mutex:
            return super().datalist(full_path)

    def get_unlabeled_images(self, label_tag: str | None = None, labels: list[str] | None = None) -> list[str]:
        with self._mutex:
            return super().get_unlabeled_images(label_tag, labels)

    def get_labeled_images(self, label_tag: str | None = None, labels: list[str] | None = None) -> list[str]:
        with self._mutex:
            return super().get_labeled_images(label_tag, labels)

    def json(self) -> Any:
        with self._mutex:
            return super().json()

    # ------------------------------------------------------------------ infos
    @staticmethod
    def _check_info(info: dict[str, Any], what: str) -> None:
        size = info_size(info)
        if size > MAX_INFO_BYTES:
            raise HTTPException(
                status_code=413,
                detail=f"{what} would hold {size} bytes of JSON; an image or label info holds at most {MAX_INFO_BYTES}",
            )

    def update_image_info(self, image_id: str, info: dict[str, Any]) -> None:
        check_json_value(info, "info")
        with self._mutex:
            self.require_image(check_id(image_id))
            self._check_info({**self._datastore.objects[image_id].image.info, **info}, "the image's info")
            return super().update_image_info(image_id, info)

    def update_label_info(self, label_id: str, label_tag: str, info: dict[str, Any]) -> None:
        check_json_value(info, "info")
        with self._mutex:
            self._require_label(check_id(label_id, "label"), check_tag(label_tag))
            self._check_info({**self._datastore.label(label_id, label_tag).info, **info}, "the label's info")
            return super().update_label_info(label_id, label_tag, info)

    def update_image_infos(self, infos: dict[str, dict[str, Any]], write: bool = True) -> int:
        """Merge ``{image id: info}`` into the images' infos (a scoring run's scores), in one step for all of them.

        Images removed meanwhile and infos that would exceed :data:`MAX_INFO_BYTES` are skipped (logged).

        Args:
            infos: image id -> the info keys to set.
            write: write the record to its file now (else the caller does, :meth:`write_record`). Defaults to True.

        Returns:
            how many images were updated.
        """
        with self._mutex:
            done = 0
            for image_id, info in infos.items():
                obj = self._datastore.objects.get(image_id)
                if obj is None:
                    continue
                merged = {**obj.image.info, **info}
                if info_size(merged) > MAX_INFO_BYTES:
                    logger.warning(f"{image_id}: info not updated, it would exceed {MAX_INFO_BYTES} bytes")
                    continue
                obj.image.info.update(info)
                done += 1
            if done and write:
                self._update_datastore_file()
            return done

    def write_record(self) -> None:
        """Write the record (``datastore_v2.json``) to its file now, atomically."""
        self._update_datastore_file()
