"""A DICOMweb datastore (a PACS) as the SpectraFlow app serves it (docs/monailabel.md, "Serving from a PACS").

:class:`CheckedDICOMWebDatastore` is MONAI Label 0.8.5's ``DICOMWebDatastore`` (image ids = series instance UIDs)
with these differences:

- **nothing is fetched that no request names.** Listing, counting, next sample and scoring counts use QIDO-RS and
  the server's record only; a series is retrieved (WADO-RS) when a request names it (inference, ``output=dicom_seg``,
  a label save, ``GET /datastore/image``, a scoring request) or when training needs the labelled ones.
- **one bounded cache.** A retrieved series (its DICOM files and the NIfTI the models read) lives in the cache folder
  (``MONAI_LABEL_DICOMWEB_CACHE_PATH``, else ``~/.cache/monailabel/dicom``, one sub-folder per DICOMweb URL); at most
  ``max_series`` series without a label are kept (the least recently used go first; one used within the last
  :data:`RECENT_SECONDS` stays). Conversions and SEG files are made in the cache's ``.work/`` folder and removed when
  the request ends: nothing goes to the system's temporary folder.
- **labels in, DICOM SEG out, by class name.** A saved label (``.nii.gz``, ``.nii``, ``.nrrd``, ``.seg.nrrd``,
  ``.bin``: ``lib/labels.py``) is checked (the series' size, class values, a client's ``label_info``) before its SEG
  is written; the SEG is written by :func:`spectraflow_monai.data.dicom_seg.write_dicom_seg` (the converter of the
  bundles' ``output_format: dicom_seg``): its segments are the classes present, named after the bundle's
  ``channel_def``; stored with STOW-RS as a new SEG series (one per save).
- **labels back from the PACS.** For training, the newest SEG of each series is read back to class values by its
  segment labels (never by segment number; :func:`spectraflow_monai.data.dicom_seg.read_dicom_seg`) on the grid of
  the series' NIfTI, kept as ``labels/final/<series>.nii.gz`` in the cache; a segment that is no class is refused,
  naming it.
- **requests checked.** An unknown series UID is 404, ids and tags as on the local datastore (400); images are not
  uploaded, labels not deleted, through this server (422: the PACS holds them).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import HTTPException
from filelock import FileLock

from monailabel.datastore.dicom import DICOMWebDatastore
from monailabel.datastore.local import LocalDatastore
from monailabel.datastore.utils.dicom import dicom_web_download_series
from monailabel.interfaces.datastore import DefaultLabelTag
from monailabel.utils.others.generic import md5_digest

from spectraflow_monai.data.dicom_seg import read_dicom_seg, write_dicom_seg
from spectraflow_monai.utils.errors import DataError, DatasetError

from .checks import UNKNOWN_IMAGE, check_id, check_json_value, check_tag, finite_json, redact_paths, upload_extension
from .datastore import MAX_INFO_BYTES, info_size
from .dicomseg import class_names, data_error, segment_names
from .labels import VOLUME_LABEL_EXTENSIONS, read_label_upload, spatial_shape, write_on_grid

__all__ = [
    "DEFAULT_CACHE_SERIES",
    "RECENT_SECONDS",
    "CheckedDICOMWebDatastore",
    "SegSeries",
    "open_dicomweb_datastore",
]

logger = logging.getLogger(__name__)

#: series without a label the cache keeps by default (``--conf dicomweb_cache_series``)
DEFAULT_CACHE_SERIES = 16
#: a series used within this many seconds is not removed from the cache (a request may be reading it)
RECENT_SECONDS = 300.0
#: how long the list of SEG series is reused before QIDO-RS is asked again (a save renews it at once)
SEG_INDEX_SECONDS = 10.0
_NIFTI = ".nii.gz"


@dataclass(frozen=True)
class SegSeries:
    """A SEG series of the PACS: its UIDs, the series it labels and when it was made (``YYYYMMDDHHMMSS.ffffff``)."""

    uid: str
    study_uid: str
    image_uid: str
    created: str


def _dicom_datetime(ds: Any) -> str:
    for date_tag, time_tag in (("ContentDate", "ContentTime"), ("SeriesDate", "SeriesTime")):
        date = str(getattr(ds, date_tag, "") or "")
        if date:
            return date + str(getattr(ds, time_tag, "") or "")
    return ""


class CheckedDICOMWebDatastore(DICOMWebDatastore):
    """MONAI Label's ``DICOMWebDatastore`` that fetches only what requests name (see the module docstring).

    Args:
        client: the DICOMweb client (MONAI Label's ``DICOMwebClientX``).
        search_filter: the QIDO-RS filter of the image series (MONAI Label's ``{"Modality": "CT"}``).
        classes: ``{value: class name}`` of the served volume model (``lib.dicomseg.bundle_classes``).
        cache_path: the cache's root folder (None: ``~/.cache/monailabel/dicom``).
        fetch_by_frame: MONAI Label's frame-by-frame retrieval. Defaults to False.
        max_series: series without a label kept in the cache (>= 1). Defaults to :data:`DEFAULT_CACHE_SERIES`.

    Raises:
        ValueError: ``max_series`` < 1.
    """

    remote = True
    #: whether this process writes the cache's record (``datastore_v2.json``): the server only (the app sets it when
    #: the server runs it); a task process (a training) keeps its changes in memory, so that it never writes the
    #: record from its own copy over what the server wrote meanwhile (scores, infos)
    writes_record = False

    def __init__(
        self,
        client: Any,
        search_filter: dict[str, Any],
        classes: Mapping[int, str],
        cache_path: str | None = None,
        fetch_by_frame: bool = False,
        max_series: int = DEFAULT_CACHE_SERIES,
    ) -> None:
        if isinstance(max_series, bool) or not isinstance(max_series, int) or max_series < 1:
            raise ValueError(f"max_series must be an integer >= 1, got {max_series!r}.")
        self._client = client
        self._search_filter = search_filter
        self._fetch_by_frame = fetch_by_frame
        self._convert_to_nifti = True
        self.classes = dict(classes)
        self.max_series = max_series
        root = os.path.join(cache_path or os.path.join(os.path.expanduser("~"), ".cache", "monailabel", "dicom"),
                            md5_digest(client.base_url))  # fmt: skip
        self._mutex = threading.RLock()
        self._used: dict[str, float] = {}
        self._seg_meta: dict[str, SegSeries | None] = {}
        self._seg_index: tuple[float, dict[str, SegSeries]] | None = None
        # the server is the only writer of the record: no file watcher; entries of series whose files were removed
        # from the cache keep their infos (scores), so the record is not reconciled with the folder (read_only)
        LocalDatastore.__init__(self, datastore_path=root, extensions=(f"*{_NIFTI}",), auto_reload=False,
                                read_only=True)  # fmt: skip
        self.work = os.path.join(root, ".work")
        os.makedirs(self.work, exist_ok=True)
        for name in os.listdir(self.work):  # left by a killed process (a server, a training process)
            if not _running(name.split("-", 1)[0]):
                shutil.rmtree(os.path.join(self.work, name), ignore_errors=True)
        logger.info(f"DICOMweb cache: {root} (at most {max_series} series without a label)")

    def _update_datastore_file(self, lock: bool = True) -> None:
        """MONAI Label's write of the record, in the server process only (:attr:`writes_record`)."""
        if self.writes_record:
            super()._update_datastore_file(lock)

    def work_folder(self) -> str:
        """A new folder in the cache's ``.work/`` for one request's files (named after this process: a start of
        another process removes only the folders of processes that ended); the caller removes it."""
        return tempfile.mkdtemp(dir=self.work, prefix=f"{os.getpid()}-")

    # ------------------------------------------------------------------ listing: QIDO-RS and the record only
    def require_image(self, image_id: str) -> None:
        """HTTP 404 unless ``image_id`` is an image series of the PACS (QIDO-RS, MONAI Label's cached list)."""
        if image_id not in self.list_images():
            raise HTTPException(status_code=404, detail=UNKNOWN_IMAGE)

    def spatial_rank(self, image_id: str) -> int:
        """3: every image series is a volume (no retrieve needed to know)."""
        return 3

    def _seg_series(self, seg: Mapping[str, Any]) -> SegSeries | None:
        """The SEG series of a QIDO-RS answer, with what it labels (its metadata, asked once per SEG)."""
        from pydicom.dataset import Dataset

        found = Dataset.from_json(dict(seg))
        uid, study = str(found.SeriesInstanceUID), str(found.StudyInstanceUID)
        if uid not in self._seg_meta:
            meta = Dataset.from_json(self._client.retrieve_series_metadata(study, uid)[0])
            refs = meta.get("ReferencedSeriesSequence")
            if not refs:
                logger.warning(f"SEG {uid} names no referenced series: ignored")
                self._seg_meta[uid] = None
            else:
                self._seg_meta[uid] = SegSeries(uid, study, str(refs[0].SeriesInstanceUID), _dicom_datetime(meta))
        return self._seg_meta[uid]

    def seg_index(self, fresh: bool = False) -> dict[str, SegSeries]:
        """The newest SEG series of each image series of the PACS, by image series UID (QIDO-RS, reused for
        :data:`SEG_INDEX_SECONDS`)."""
        with self._mutex:
            if not fresh and self._seg_index is not None and time.monotonic() - self._seg_index[0] < SEG_INDEX_SECONDS:
                return dict(self._seg_index[1])
            images = set(self.list_images())
            newest: dict[str, SegSeries] = {}
            for seg in self._client.search_for_series(search_filters={"Modality": "SEG"}):
                found = self._seg_series(seg)
                if found is None or found.image_uid not in images:
                    continue
                known = newest.get(found.image_uid)
                if known is None or (found.created, found.uid) > (known.created, known.uid):
                    newest[found.image_uid] = found
            self._seg_index = (time.monotonic(), newest)
            return dict(newest)

    def get_labeled_images(self, label_tag: str | None = None, labels: Any = None) -> list[str]:
        return sorted(self.seg_index())

    def get_unlabeled_images(self, label_tag: str | None = None, labels: Any = None) -> list[str]:
        labelled = self.seg_index()
        return [uid for uid in self.list_images() if uid not in labelled]

    def get_image_info(self, image_id: str) -> dict[str, Any]:
        check_id(image_id)
        with self._mutex:
            obj = self._datastore.objects.get(image_id)
            info = finite_json(dict(obj.image.info)) if obj else {}
        info.pop("path", None)
        return info

    def json(self) -> Any:
        """The record with every image series of the PACS (those never fetched with an empty info) and, for each
        labelled one, its newest SEG series."""
        with self._mutex:
            record = json.loads(json.dumps(LocalDatastore.json(self), default=str))
        objects = record.setdefault("objects", {})
        segs = self.seg_index()
        for uid in self.list_images():
            obj = objects.setdefault(uid, {"image": {"ext": _NIFTI, "info": {}}, "labels": {}})
            if uid in segs:
                final = obj["labels"].setdefault(DefaultLabelTag.FINAL.value, {"ext": _NIFTI, "info": {}})
                final["info"]["SeriesInstanceUID"] = segs[uid].uid
        return finite_json(record)

    # ------------------------------------------------------------------ the cache
    def _lock(self) -> FileLock:
        return FileLock(os.path.join(self._datastore_path, ".fetch.lock"))

    def _image_file(self, image_id: str) -> str:
        return os.path.join(self._datastore.image_path(), image_id + _NIFTI)

    def series_dir(self, image_id: str) -> str:
        """The folder of a fetched series' DICOM files in the cache."""
        return os.path.join(self._datastore_path, "series", image_id)

    def _cached(self, image_id: str) -> bool:
        folder = self.series_dir(image_id)
        return (image_id in self._datastore.objects and os.path.isfile(self._image_file(image_id))
                and os.path.isdir(folder) and bool(os.listdir(folder)))  # fmt: skip

    def get_image_uri(self, image_id: str) -> str:
        """The NIfTI of series ``image_id`` in the cache, retrieved (WADO-RS) and converted when it is not there.

        Raises:
            HTTPException: 400 for an id that is not a plain name, 404 for a series the PACS does not list.
        """
        check_id(image_id)
        self.require_image(image_id)
        with self._mutex, self._lock():
            if not self._cached(image_id):
                self._fetch(image_id)
            self._used[image_id] = time.time()
            self._evict()
        return self._image_file(image_id)

    def _fetch(self, image_id: str) -> None:
        import SimpleITK as sitk

        logger.info(f"DICOMweb: retrieving series {image_id}")
        work = self.work_folder()
        try:
            dicom = os.path.join(work, "dicom")
            dicom_web_download_series(None, image_id, dicom, self._client, self._fetch_by_frame)
            reader = sitk.ImageSeriesReader()
            names = reader.GetGDCMSeriesFileNames(dicom)
            if not names:
                raise HTTPException(status_code=422, detail=f"series {image_id} holds no image the server can read")
            reader.SetFileNames(names)
            nifti = os.path.join(work, "image" + _NIFTI)
            sitk.WriteImage(reader.Execute(), nifti, True)
            target = self.series_dir(image_id)
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(dicom, target)
            old = self._datastore.objects.get(image_id)
            info = {**(dict(old.image.info) if old else {}), **self._dicom_info(image_id)}
            labels = dict(old.labels) if old else {}
            LocalDatastore.add_image(self, image_id, nifti, info)
            self._datastore.objects[image_id].labels.update(labels)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _evict(self) -> None:
        """Remove the files of the least recently used series without a label beyond :attr:`max_series` (their record
        entries, with their scores, stay)."""
        labelled = set(self._seg_index[1]) if self._seg_index else set()
        labelled |= set(self._datastore.filter_by_tag(DefaultLabelTag.FINAL))
        cached = [i for i in self._datastore.objects if i not in labelled and os.path.isdir(self.series_dir(i))]
        if len(cached) <= self.max_series:
            return
        now = time.time()
        order = sorted(cached, key=lambda i: self._used.get(i, self._datastore.objects[i].image.info.get("ts", 0)))
        for image_id in order[: len(cached) - self.max_series]:
            if now - self._used.get(image_id, 0) < RECENT_SECONDS:
                continue
            logger.info(f"DICOMweb cache: removing series {image_id} (least recently used)")
            shutil.rmtree(self.series_dir(image_id), ignore_errors=True)
            if os.path.isfile(self._image_file(image_id)):
                os.remove(self._image_file(image_id))
            self._used.pop(image_id, None)

    # ------------------------------------------------------------------ labels: DICOM SEG both ways
    def seg_names(self, values: Any, label_info: Any = None) -> dict[int, str]:
        """``{value: class name}`` of the values present (``lib.dicomseg.segment_names``; 422 when none is
        served)."""
        if not self.classes:
            raise HTTPException(
                status_code=422, detail="no volume model is served: this server cannot name a label's classes"
            )
        return segment_names(values, self.classes, label_info)

    def write_seg(self, image_id: str, label_file: str, folder: str, description: str) -> str:
        """The DICOM SEG of a label file on series ``image_id`` (fetched if needed), written into ``folder`` by
        :func:`spectraflow_monai.data.dicom_seg.write_dicom_seg`: one segment per class present, named after it.

        Args:
            image_id: the series.
            label_file: the label (class values) on the series' grid, with its affine (NIfTI).
            folder: where the SEG is written (the caller removes it).
            description: the SEG's series description.

        Returns:
            the SEG file's path.

        Raises:
            HTTPException: 422 naming why (the label is off the series' grid, holds no class, the series cannot be
                referenced), without server paths.
        """
        self.get_image_uri(image_id)
        series, out = self.series_dir(image_id), os.path.join(folder, "seg.dcm")
        try:
            return write_dicom_seg(_load(label_file), series, class_names(self.classes), out,
                                   series_description=description)  # fmt: skip
        except DataError as e:
            raise data_error(e, {label_file: "the label", out: "the SEG", series: f"series {image_id}"}) from None

    def save_label(
        self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any], label_id: str = ""
    ) -> str:
        """Check a label and store it: tag ``final`` as a new SEG series in the PACS (STOW-RS) and in the cache, other
        tags in the cache only.

        Raises:
            HTTPException: 400 (id, tag), 404 (unknown series), 413 (info), 415 (unreadable), 422 (size, values,
                ``label_info``, a label that is all background).
        """
        import pydicom

        check_tag(label_tag)
        check_id(image_id)
        self.require_image(image_id)
        info = dict(check_json_value(dict(label_info or {}), "params"))
        client_info = info.pop("label_info", None)
        if info_size(info) > MAX_INFO_BYTES:
            raise HTTPException(status_code=413, detail=f"params hold more than {MAX_INFO_BYTES} bytes of JSON")
        ext = upload_extension(os.path.basename(label_filename), VOLUME_LABEL_EXTENSIONS, "label map")
        names = self.seg_names([], client_info)  # the client's label_info checked before anything is read
        image = self.get_image_uri(image_id)
        shape = spatial_shape(_load(image))
        array = read_label_upload(label_filename, ext, image_id, shape, self.classes)
        names = self.seg_names(np.unique(array).tolist(), client_info)
        final = label_tag == DefaultLabelTag.FINAL
        if final and not names:
            raise HTTPException(
                status_code=422, detail="the label map is all background: there is no segment to store as DICOM SEG"
            )
        with tempfile.TemporaryDirectory(dir=self.work, prefix=f"{os.getpid()}-") as folder:
            label = write_on_grid(array, image, os.path.join(folder, "label" + _NIFTI))
            if final:
                seg = self.write_seg(image_id, label, folder, "SpectraFlow label")
                dataset = pydicom.dcmread(seg)
                self._client.store_instances([dataset])
                stored = SegSeries(str(dataset.SeriesInstanceUID), str(dataset.StudyInstanceUID), image_id,
                                   _dicom_datetime(dataset))  # fmt: skip
                with self._mutex:
                    self._seg_meta[stored.uid] = stored
                    self._seg_index = None
                image_info = self.get_image_info(image_id)
                info.update({"SeriesInstanceUID": stored.uid, "Modality": "SEG", "segments": {str(k): v for k, v
                             in names.items()}, "PatientID": image_info.get("PatientID"),
                             "StudyInstanceUID": image_info.get("StudyInstanceUID")})  # fmt: skip
                logger.info(f"DICOMweb: label of {image_id} stored as SEG series {stored.uid} ({list(names.values())})")
            with self._mutex:
                LocalDatastore.save_label(self, image_id, label, label_tag, info)
        return image_id

    def _sync_labels(self) -> None:
        """The cache's ``labels/final`` made the newest SEG of each labelled series, as class values on its grid.

        Raises:
            DatasetError: a SEG that holds no instance or a segment that is no class (naming the SEG's UID).
        """
        index = self.seg_index(fresh=True)
        for image_id, seg in sorted(index.items()):
            with self._mutex:
                local = self._datastore.label(image_id, DefaultLabelTag.FINAL)
                path = LocalDatastore.get_label_uri(self, image_id, DefaultLabelTag.FINAL)
                current = local is not None and local.info.get("SeriesInstanceUID") == seg.uid and os.path.isfile(path)
            image = self.get_image_uri(image_id)  # training reads it: cached, else retrieved
            if current:
                continue
            with tempfile.TemporaryDirectory(dir=self.work, prefix=f"{os.getpid()}-") as folder:
                dicom_web_download_series(seg.study_uid, seg.uid, os.path.join(folder, "seg"), self._client)
                files = sorted(os.listdir(os.path.join(folder, "seg")))
                if not files:
                    raise DatasetError(f"SEG {seg.uid} of series {image_id} holds no instance")
                seg_file = os.path.join(folder, "seg", files[0])
                try:  # by segment label, onto the grid of the series' NIfTI
                    array, _ = read_dicom_seg(seg_file, class_names(self.classes), series=image)
                except DataError as e:
                    raise DatasetError(redact_paths(str(e), {seg_file: seg.uid})) from None
                out = write_on_grid(array, image, os.path.join(folder, "label" + _NIFTI))
                with self._mutex:
                    LocalDatastore.save_label(self, image_id, out, DefaultLabelTag.FINAL,
                                              {"SeriesInstanceUID": seg.uid, "Modality": "SEG"})  # fmt: skip
            logger.info(f"DICOMweb: SEG {seg.uid} read back as the label of {image_id}")
        with self._mutex:
            for image_id in list(self._datastore.filter_by_tag(DefaultLabelTag.FINAL)):
                if image_id not in index:  # its SEG left the PACS (or the search filter)
                    path = LocalDatastore.get_label_uri(self, image_id, DefaultLabelTag.FINAL)
                    if os.path.isfile(path):
                        os.remove(path)
                    self._datastore.objects[image_id].labels.pop(DefaultLabelTag.FINAL, None)
            self._update_datastore_file()

    def datalist(self, full_path: bool = True) -> list[dict[str, Any]]:
        """The labelled series and their labels (the newest SEG of each, read back by class name), fetched into the
        cache as needed.

        Raises:
            DatasetError: a SEG whose segment is no class (naming it).
        """
        self._sync_labels()
        with self._mutex:
            return LocalDatastore.datalist(self, full_path)

    def get_label_uri(self, label_id: str, label_tag: str, image_id: str = "") -> str:
        """The cached label of series ``label_id`` (``""`` when none is cached; training reads the PACS's SEGs)."""
        with self._mutex:
            return LocalDatastore.get_label_uri(self, check_id(label_id, "label"), check_tag(label_tag))

    # ------------------------------------------------------------------ infos
    def update_image_info(self, image_id: str, info: dict[str, Any]) -> None:
        """Merge ``info`` into the series' info in the record (a series never fetched gets an entry without files:
        its scores and strategy marks survive until it is fetched)."""
        from monailabel.datastore.local import DataModel, ImageLabelModel

        check_json_value(info, "info")
        check_id(image_id)
        self.require_image(image_id)
        with self._mutex:
            obj = self._datastore.objects.get(image_id)
            merged = {**(dict(obj.image.info) if obj else {}), **info}
            if info_size(merged) > MAX_INFO_BYTES:
                raise HTTPException(
                    status_code=413, detail=f"the image's info would hold more than {MAX_INFO_BYTES} bytes of JSON"
                )
            if obj is None:
                self._datastore.objects[image_id] = ImageLabelModel(image=DataModel(info=merged, ext=_NIFTI))
            else:
                obj.image.info.update(info)
            self._update_datastore_file()

    # ------------------------------------------------------------------ what the PACS owns
    def _refused(self, what: str) -> HTTPException:
        return HTTPException(
            status_code=422, detail=f"{what} through this server is not possible: the PACS (DICOMweb) holds them"
        )

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        raise self._refused("uploading images")

    def remove_image(self, image_id: str) -> None:
        raise self._refused("removing images")

    def remove_label(self, label_id: str, label_tag: str) -> None:
        raise self._refused("removing labels")

    def update_label_info(self, label_id: str, label_tag: str, info: dict[str, Any]) -> None:
        raise self._refused("changing label infos")


def _running(pid: str) -> bool:
    """Whether process ``pid`` (a number as text) runs on this machine."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by another user
        return True
    return True


def _load(path: str) -> Any:
    from monai.transforms import LoadImage

    return LoadImage(image_only=True)(path)


def open_dicomweb_datastore(url: str, classes: Mapping[int, str], max_series: int) -> CheckedDICOMWebDatastore:
    """The PACS at ``url`` as MONAI Label reaches it (its client, credentials and prefixes: the
    ``MONAI_LABEL_DICOMWEB_*`` settings), served by :class:`CheckedDICOMWebDatastore`.

    Args:
        url: the DICOMweb root (``--studies``), without a trailing ``/``.
        classes: ``{value: class name}`` of the served volume models (the SEG segments).
        max_series: series without a label the cache keeps (``--conf dicomweb_cache_series``).
    """
    from dicomweb_client import DICOMwebClient
    from monailabel.config import settings
    from monailabel.datastore.dicom import DICOMwebClientX
    from monailabel.interfaces import app as app_module

    if "googleapis.com" in url:
        client = DICOMwebClient(url=url, session=app_module.create_session_from_gcp_credentials())
    else:
        session = None
        if settings.MONAI_LABEL_DICOMWEB_USERNAME and settings.MONAI_LABEL_DICOMWEB_PASSWORD:
            session = app_module.create_session_from_user_pass(
                settings.MONAI_LABEL_DICOMWEB_USERNAME, settings.MONAI_LABEL_DICOMWEB_PASSWORD
            )
        client = DICOMwebClientX(
            url=url,
            session=session,
            qido_url_prefix=settings.MONAI_LABEL_QIDO_PREFIX,
            wado_url_prefix=settings.MONAI_LABEL_WADO_PREFIX,
            stow_url_prefix=settings.MONAI_LABEL_STOW_PREFIX,
        )
    cache = (settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or "").strip() or None
    return CheckedDICOMWebDatastore(
        client,
        search_filter=settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER,
        classes=classes,
        cache_path=cache,
        fetch_by_frame=settings.MONAI_LABEL_DICOMWEB_FETCH_BY_FRAME,
        max_series=max_series,
    )
