"""A real PACS for the tests: Orthanc with its DICOMweb plugin on loopback, holding CT series written with pydicom.

:func:`running_orthanc` starts Debian's ``Orthanc`` (packages ``orthanc``, ``orthanc-dicomweb``; ``.ci/run`` installs
them) with a configuration in a temporary folder: storage and index in that folder, the DICOMweb plugin at
``/dicom-web/``, a free HTTP port, ``RemoteAccessAllowed`` false, no DICOM server, no WebDAV, no saved jobs. It logs
every HTTP request it serves (``--verbose-http``): :meth:`Pacs.retrieves` reads WADO-RS retrieves from that log, the
measurement of what a client fetched. :func:`write_ct_series` writes a CT phantom volume of
``spectraflow_monai.apps.synapse.synthetic_ct_volume`` as one DICOM file per axial slice with a known geometry.

Tests that use it are skipped, with the reason, where the ``Orthanc`` binary or its DICOMweb plugin is absent
(:data:`requires_orthanc`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

ORTHANC = shutil.which("Orthanc") or ("/usr/sbin/Orthanc" if os.path.isfile("/usr/sbin/Orthanc") else None)
DICOMWEB_PLUGIN = "/usr/share/orthanc/plugins/libOrthancDicomWeb.so"
requires_orthanc = pytest.mark.skipif(
    ORTHANC is None or not os.path.isfile(DICOMWEB_PLUGIN),
    reason="Orthanc with its DICOMweb plugin is not installed (apt-get install --no-install-recommends orthanc "
    "orthanc-dicomweb; .ci/run does)",
)

#: the phantom series: shape (columns, rows, slices) as MONAI reads the volume, spacing (mm), origin (LPS, mm)
SERIES_SHAPE = (64, 56, 12)
SPACING = (0.8, 0.7, 2.5)
ORIGIN = (-20.0, 10.0, 30.0)
PATIENTS = ("PAT-A", "PAT-B")
START_TIMEOUT = 30.0
# a WADO-RS retrieve of a series, an instance or frames (its metadata excepted)
_RETRIEVE = re.compile(r"\(http\) GET (/dicom-web/studies/[^/\s]+/series/[^/\s]+(?:/instances/[^\s]*)?)\s*$")
_UID_ROOT = "1.2.826.0.1.3680043.10.1189"  # a test root; every UID below it is made here


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_UIDS = iter(range(1, 10**9))


def new_uid() -> str:
    """A new DICOM UID of the tests' root (unique in this process and run)."""
    return f"{_UID_ROOT}.{os.getpid()}.{int(time.time())}.{next(_UIDS)}"


@dataclass
class Series:
    """One CT series in the PACS: its UIDs, the HU volume and the class label map (both ``(x, y, z)`` as MONAI reads
    the series), its files."""

    patient_id: str
    study_uid: str
    series_uid: str
    volume: np.ndarray
    label: np.ndarray
    files: list[Path] = field(default_factory=list)


@dataclass
class Pacs:
    """A running Orthanc: ``url`` (its REST API), ``dicomweb`` (the DICOMweb root), the log of its HTTP requests and
    the series uploaded to it by patient id."""

    url: str
    dicomweb: str
    log: Path
    folder: Path
    series: dict[str, Series] = field(default_factory=dict)

    def upload(self, files: list[Path]) -> None:
        """``POST /instances`` each file (200 each)."""
        import requests

        for path in files:
            r = requests.post(f"{self.url}/instances", data=path.read_bytes(), timeout=30)
            assert r.status_code == 200, (path, r.status_code, r.text[:500])

    def add_series(self, patient_id: str, case: int = 1, shape: tuple[int, int, int] = SERIES_SHAPE) -> Series:
        """Write a phantom series for ``patient_id`` (:func:`write_ct_series`) and upload it."""
        series = write_ct_series(self.folder / "series" / patient_id, patient_id, case=case, shape=shape)
        self.upload(series.files)
        self.series[patient_id] = series
        return series

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines() if self.log.is_file() else []

    def retrieves(self) -> list[str]:
        """The paths of the WADO-RS retrieves (series, instances, frames; not metadata) Orthanc has served so far."""
        found = []
        for line in self.log_lines():
            match = _RETRIEVE.search(line)
            if match and not match.group(1).endswith("/metadata"):
                found.append(match.group(1))
        return found

    def retrieved_series(self) -> set[str]:
        """Series instance UIDs whose data (not metadata) Orthanc has served through WADO-RS so far."""
        return {path.split("/series/")[1].split("/")[0] for path in self.retrieves()}

    def requests_of(self, text: str) -> list[str]:
        """The logged HTTP request lines that contain ``text``."""
        return [line for line in self.log_lines() if "(http)" in line and text in line]

    def seg_series(self, study_uid: str | None = None) -> list[dict]:
        """QIDO-RS: the SEG series (of one study, or all)."""
        import requests

        path = f"studies/{study_uid}/series" if study_uid else "series"
        r = requests.get(f"{self.dicomweb}/{path}", params={"Modality": "SEG"}, timeout=30)
        assert r.status_code in (200, 204), r.text
        return r.json() if r.status_code == 200 and r.content else []

    def seg_files(self) -> list[bytes]:
        """Every SEG instance in the PACS (its DICOM file), oldest first."""
        import requests

        r = requests.post(f"{self.url}/tools/find", json={"Level": "Instance", "Query": {"Modality": "SEG"}},
                          timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        files = [requests.get(f"{self.url}/instances/{i}/file", timeout=30).content for i in r.json()]
        return files


def _orthanc_config(folder: Path, port: int) -> dict:
    return {
        "Name": "spectraflow-tests",
        "StorageDirectory": str(folder / "db"),
        "IndexDirectory": str(folder / "db"),
        "Plugins": [DICOMWEB_PLUGIN],
        "HttpPort": port,
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": False,
        "DicomServerEnabled": False,
        "WebDavEnabled": False,
        "SaveJobs": False,
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "EnableWado": False},
    }


@contextlib.contextmanager
def running_orthanc(folder: Path, patients: tuple[str, ...] = PATIENTS) -> Iterator[Pacs]:
    """Orthanc on 127.0.0.1 (a free port) with its storage, configuration and log in ``folder``, holding one phantom
    CT series per patient (cases 1, 2, ...); stopped when the block ends.

    Skips the calling test when Orthanc is not installed.
    """
    if ORTHANC is None or not os.path.isfile(DICOMWEB_PLUGIN):
        pytest.skip("Orthanc with its DICOMweb plugin is not installed (apt-get install orthanc orthanc-dicomweb)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "db").mkdir(exist_ok=True)
    port = _free_port()
    config = folder / "orthanc.json"
    config.write_text(json.dumps(_orthanc_config(folder, port), indent=2))
    log = folder / "orthanc.log"
    pacs = Pacs(url=f"http://127.0.0.1:{port}", dicomweb=f"http://127.0.0.1:{port}/dicom-web", log=log, folder=folder)
    with open(folder / "orthanc.stdout", "wb") as out, serving(
        [ORTHANC, "--verbose-http", f"--logfile={log}", str(config)], f"{pacs.url}/system", START_TIMEOUT, "Orthanc",
        lambda: (folder / "orthanc.stdout").read_text(errors="replace"), stdout=out, stderr=subprocess.STDOUT,
        cwd=folder,
    ):  # fmt: skip
        for case, patient in enumerate(patients, start=1):
            pacs.add_series(patient, case=case)
        yield pacs


@contextlib.contextmanager
def serving(
    cmd: list[str], url: str, timeout: float, what: str, output: Callable[[], str], poll: float = 0.1, **popen: Any
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` until the block ends (terminated, killed after 20 s), once ``GET url`` answers 200.

    Args:
        cmd: the command.
        url: asked until it answers 200.
        timeout: seconds to wait for it.
        what: the process in messages.
        output: returns the process's output for a message.
        poll: seconds between two asks. Defaults to 0.1.
        popen: passed to ``subprocess.Popen``.
    """
    import requests

    proc = subprocess.Popen(cmd, **popen)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}:\n{output()}"
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"{what} not up after {timeout} s:\n{output()}"
            time.sleep(poll)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def write_ct_series(
    folder: Path, patient_id: str, case: int = 1, shape: tuple[int, int, int] = SERIES_SHAPE,
    spacing: tuple[float, float, float] = SPACING, origin: tuple[float, float, float] = ORIGIN,
) -> Series:  # fmt: skip
    """One CT series of the phantom: ``shape[2]`` axial slices of ``shape[0]`` columns and ``shape[1]`` rows, pixel
    spacing ``spacing[:2]``, slices ``spacing[2]`` apart from ``origin`` upwards, axes along the patient's (LPS)
    axes. The volume ``(x, y, z)`` is what MONAI reads from the series (``volume[i, j, k]``: column ``i``, row ``j``
    of slice ``k``).

    Returns:
        the :class:`Series` (HU volume, class labels 0..8, files).
    """
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    from spectraflow_monai.apps.synapse import map_btcv_labels, synthetic_ct_volume

    volume, btcv = synthetic_ct_volume(case, shape=shape)
    label = map_btcv_labels(btcv, dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    study_uid, series_uid, frame_uid = new_uid(), new_uid(), new_uid()
    now = datetime.datetime.now()
    files = []
    ct_storage = "1.2.840.10008.5.1.4.1.1.2"
    for k in range(shape[2]):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = ct_storage
        meta.MediaStorageSOPInstanceUID = new_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = FileDataset(None, {}, file_meta=meta, preamble=b"\0" * 128)
        ds.is_little_endian, ds.is_implicit_VR = True, False
        ds.SOPClassUID, ds.SOPInstanceUID = ct_storage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study_uid, series_uid, frame_uid
        ds.PatientID, ds.PatientName = patient_id, f"Phantom^{patient_id}"
        ds.PatientBirthDate, ds.PatientSex = "19700101", "O"
        ds.StudyDate = ds.SeriesDate = ds.ContentDate = now.strftime("%Y%m%d")
        ds.StudyTime = ds.SeriesTime = ds.ContentTime = now.strftime("%H%M%S")
        ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = "1", f"ACC{case}", ""
        ds.Manufacturer, ds.Modality, ds.BodyPartExamined = "spectraflow-tests", "CT", "ABDOMEN"
        ds.SeriesNumber, ds.InstanceNumber = 1, k + 1
        ds.SeriesDescription = f"phantom case {case}"
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [origin[0], origin[1], origin[2] + k * spacing[2]]
        ds.SliceLocation = origin[2] + k * spacing[2]
        ds.PixelSpacing = [spacing[1], spacing[0]]  # row spacing (between rows: y), column spacing (x)
        ds.SliceThickness = spacing[2]
        ds.Rows, ds.Columns = shape[1], shape[0]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = 0, 1, "HU"
        ds.PixelData = np.ascontiguousarray(volume[:, :, k].T.astype(np.int16)).tobytes()
        path = folder / f"slice_{k:03d}.dcm"
        pydicom.dcmwrite(str(path), ds, write_like_original=False)
        files.append(path)
    return Series(patient_id, study_uid, series_uid, volume.astype(np.int16), label, files)
