"""DICOM SEG with the bundle's class names, both ways (docs/monailabel.md, "Serving from a PACS").

A label map of the Synapse bundle holds class values (0 background, 1 spleen, ..., 8 pancreas: the ``channel_def`` of
its ``configs/metadata.json``). MONAI Label 0.8.5 names the i-th label value present after ``label_info[i]`` (a client
listing all classes in class order stored the liver as "right_kidney"), and reads a SEG back as its segment NUMBERS
(1..n in the order of the values present). Here both directions go by value and name:

- :func:`segment_names` gives each label value present its class name; a client's ``label_info`` may repeat the
  classes (in class order, or with each entry's ``idx``) and is refused (422) when it names a value otherwise;
- :func:`write_seg` writes the SEG with dcmqi's ``itkimage2segimage`` (one segment per value present, segment label
  = class name, coded anatomy where the class has a SNOMED CT code), every file in a folder of the caller;
- :func:`read_seg` maps a SEG's segments back to class values by their segment labels (never by segment number) on
  the grid of a reference image; a segment whose label is not a class of the bundle is refused, naming it;
- :func:`provide_dcmqi` finds ``itkimage2segimage`` without downloading it (PATH, the app's ``bin/``, the PyPI wheel
  ``dcmqi``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fastapi import HTTPException

__all__ = [
    "DCMQI_TOOL",
    "SegmentError",
    "bundle_classes",
    "check_label_values",
    "class_key",
    "provide_dcmqi",
    "read_seg",
    "segment_names",
    "seg_template",
    "write_seg",
]

logger = logging.getLogger(__name__)

#: dcmqi's converter of a label image into a DICOM SEG, run by MONAI Label and by :func:`write_seg`
DCMQI_TOOL = "itkimage2segimage"
#: SNOMED CT codes of the Synapse classes (DICOM PS3.16 CID 7710 / 4031 anatomy); other classes are coded as
#: "Anatomical structure" with their name as the code meaning
_SCT_CODES = {
    "spleen": "78961009", "right_kidney": "9846003", "left_kidney": "18639004", "gallbladder": "28231008",
    "liver": "10200004", "stomach": "69695003", "aorta": "15825003", "pancreas": "15776009",
}  # fmt: skip
_ANATOMICAL_STRUCTURE = "91723000"
_PALETTE = (
    (157, 108, 162), (185, 102, 83), (212, 126, 151), (0, 145, 30), (221, 130, 101), (216, 132, 105),
    (240, 0, 0), (249, 180, 111), (128, 174, 128), (241, 214, 145), (177, 122, 101), (111, 184, 210),
)  # fmt: skip
_RUN_TIMEOUT = 600.0


class SegmentError(ValueError):
    """A DICOM SEG that cannot be read back as the bundle's classes (its message names the segment)."""


def class_key(name: Any) -> str:
    """A class or segment name compared case-blind, with blanks and hyphens as ``_`` ("Right Kidney" =
    "right_kidney")."""
    return "_".join(str(name).strip().lower().replace("-", " ").split())


def bundle_classes(bundle_path: str) -> dict[int, str]:
    """The classes of a bundle's label maps: ``{value: name}`` of its output's ``channel_def`` (``configs/
    metadata.json``, ``network_data_format.outputs``), background (0) left out."""
    with open(os.path.join(bundle_path, "configs", "metadata.json")) as f:
        meta = json.load(f)
    outputs = (meta.get("network_data_format") or {}).get("outputs") or {}
    for output in outputs.values():
        channels = output.get("channel_def") or {}
        classes = {int(k): str(v) for k, v in channels.items() if str(k).isdigit() and int(k) != 0}
        if classes:
            return dict(sorted(classes.items()))
    return {}


def check_label_values(values: Sequence[int], classes: Mapping[int, str], what: str = "the label map") -> None:
    """HTTP 422 naming the values of ``values`` that are not 0 or a class value."""
    outside = sorted(int(v) for v in values if int(v) != 0 and int(v) not in classes)
    if outside:
        shown = outside[:8] + (["..."] if len(outside) > 8 else [])
        raise HTTPException(
            status_code=422,
            detail=f"{what} holds values {shown} that are no class: the classes are 0 background, "
            + ", ".join(f"{v} {n}" for v, n in sorted(classes.items())),
        )


def _entry_name(entry: Any, index: int) -> str:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"].strip():
        raise HTTPException(status_code=422, detail=f"label_info[{index}] must be an object with a 'name'")
    if len(entry["name"]) > 256:
        raise HTTPException(status_code=422, detail=f"label_info[{index}]'s name is longer than 256 characters")
    return entry["name"]


def segment_names(values: Sequence[int], classes: Mapping[int, str], label_info: Any = None) -> dict[int, str]:
    """The segment name of each label value in ``values``: its class name.

    A client's ``label_info`` (what MONAI Label clients send) is checked against the classes and gives the same
    names: a list of objects with ``name``, either each with ``idx`` (the label value it names) or in class order
    (entry ``i`` names class ``i + 1``, as a client lists the model's labels from ``/info/``); a name that is not the
    class of its value, an ``idx`` that is no class, or more entries than classes is refused.

    Args:
        values: the label values present (0 is left out).
        classes: ``{value: class name}`` (:func:`bundle_classes`).
        label_info: the client's ``label_info``, or None.

    Returns:
        ``{value: class name}`` for the values present.

    Raises:
        HTTPException: 422 naming the value or entry that is no class or contradicts one.
    """
    check_label_values(values, classes)
    if label_info not in (None, [], {}):
        if not isinstance(label_info, list):
            raise HTTPException(status_code=422, detail="label_info must be a list of objects with a 'name'")
        if len(label_info) > len(classes):
            raise HTTPException(
                status_code=422,
                detail=f"label_info lists {len(label_info)} entries; the model has {len(classes)} classes: "
                f"{list(classes.values())}",
            )
        order = sorted(classes)
        for i, entry in enumerate(label_info):
            name = _entry_name(entry, i)
            idx = entry.get("idx")
            if idx is not None and (isinstance(idx, bool) or not isinstance(idx, int) or idx not in classes):
                raise HTTPException(
                    status_code=422, detail=f"label_info[{i}]'s idx {repr(idx)[:32]} is no class value: {dict(classes)}"
                )
            value = idx if idx is not None else order[i]
            if class_key(name) != class_key(classes[value]):
                how = f"idx {value}" if idx is not None else f"position {i} (class order)"
                raise HTTPException(
                    status_code=422,
                    detail=f"label_info[{i}] names {name[:64]!r} at {how}, but value {value} is "
                    f"{classes[value]!r}; send label_info in class order ({list(classes.values())}) or leave it out",
                )
    return {int(v): classes[int(v)] for v in sorted({int(v) for v in values}) if int(v) != 0}


def seg_template(names: Mapping[int, str], series_description: str) -> dict[str, Any]:
    """dcmqi's SEG description (its JSON ``--inputMetadata``): one segment per value, ``labelID`` = the value,
    ``SegmentLabel`` = the class name."""
    segments = []
    for i, (value, name) in enumerate(sorted(names.items())):
        code = _SCT_CODES.get(class_key(name))
        segments.append({
            "labelID": int(value),
            "SegmentLabel": name,
            "SegmentDescription": name,
            "SegmentAlgorithmType": "AUTOMATIC",
            "SegmentAlgorithmName": "SpectraFlow",
            "SegmentedPropertyCategoryCodeSequence": {
                "CodeValue": "123037004", "CodingSchemeDesignator": "SCT", "CodeMeaning": "Anatomical Structure",
            },
            "SegmentedPropertyTypeCodeSequence": {
                "CodeValue": code or _ANATOMICAL_STRUCTURE, "CodingSchemeDesignator": "SCT", "CodeMeaning": name,
            },
            "recommendedDisplayRGBValue": list(_PALETTE[i % len(_PALETTE)]),
        })  # fmt: skip
    return {
        "ContentCreatorName": "SpectraFlow",
        "ClinicalTrialSeriesID": "Session1",
        "ClinicalTrialTimePointID": "1",
        "SeriesDescription": series_description[:64],
        "SeriesNumber": "300",
        "InstanceNumber": "1",
        "segmentAttributes": [segments],
        "ContentLabel": "SEGMENTATION",
        "ContentDescription": "SpectraFlow segmentation"[:64],
        "ClinicalTrialCoordinatingCenterName": "MONAI",
        "BodyPartExamined": "",
    }


def write_seg(series_dir: str, label_file: str, names: Mapping[int, str], folder: str, description: str) -> str:
    """Write the DICOM SEG of ``label_file`` (class values on the grid of the series in ``series_dir``) into
    ``folder`` with dcmqi's ``itkimage2segimage``; the caller removes ``folder``.

    Args:
        series_dir: the folder of the image series' DICOM files.
        label_file: the label image (NIfTI / NRRD) on the series' grid.
        names: ``{value: segment name}`` of the values present (:func:`segment_names`); not empty.
        folder: where the SEG and dcmqi's description are written.
        description: the SEG's series description (the model's name).

    Returns:
        the SEG file's path.

    Raises:
        RuntimeError: dcmqi failed (its last output lines).
    """
    if not names:
        raise ValueError("names must hold at least one segment (the label map is all background).")
    meta = os.path.join(folder, "seg.json")
    out = os.path.join(folder, "seg.dcm")
    with open(meta, "w") as f:
        json.dump(seg_template(names, description), f)
    tool = shutil.which(DCMQI_TOOL) or DCMQI_TOOL
    args = [tool, "--inputImageList", label_file, "--inputDICOMDirectory", series_dir, "--outputDICOM", out,
            "--inputMetadata", meta]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=_RUN_TIMEOUT, cwd=folder)
    if done.returncode != 0 or not os.path.isfile(out):
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"{DCMQI_TOOL} failed (exit {done.returncode}): {tail[:500]}")
    _stamp(out)
    return out


def _stamp(path: str) -> None:
    """Give the SEG its creation time to the microsecond (dcmqi writes whole seconds): the newest SEG of a series is
    its label, also for two saves within one second."""
    import datetime

    import pydicom

    ds = pydicom.dcmread(path)
    now = datetime.datetime.now()
    ds.ContentDate = ds.InstanceCreationDate = now.strftime("%Y%m%d")
    ds.ContentTime = ds.InstanceCreationTime = now.strftime("%H%M%S.%f")
    ds.save_as(path)


def read_seg(seg_file: str, reference: str, classes: Mapping[int, str]) -> Any:
    """The class-value label image of a DICOM SEG on the grid of ``reference``.

    Each segment maps to the class whose name is its segment label (:func:`class_key`), never by its number.

    Args:
        seg_file: the SEG instance.
        reference: the image the label belongs to (its size, spacing, origin and direction are the label's).
        classes: ``{value: class name}``.

    Returns:
        a SimpleITK ``UInt8`` image of class values.

    Raises:
        SegmentError: a segment whose label is no class of the bundle (naming it and the classes), or a file that is
            no SEG.
    """
    import pydicom
    import pydicom_seg
    import SimpleITK as sitk

    ds = pydicom.dcmread(seg_file)
    if getattr(ds, "Modality", None) != "SEG" or "SegmentSequence" not in ds:
        raise SegmentError("the file is no DICOM SEG (no SegmentSequence)")
    by_name = {class_key(n): v for v, n in classes.items()}
    lut = np.zeros(max([int(s.SegmentNumber) for s in ds.SegmentSequence] + [0]) + 1, np.uint8)
    for segment in ds.SegmentSequence:
        label = str(getattr(segment, "SegmentLabel", "") or "")
        value = by_name.get(class_key(label))
        if value is None:
            raise SegmentError(
                f"segment {int(segment.SegmentNumber)} {label[:64]!r} of SEG {getattr(ds, 'SeriesInstanceUID', '?')} "
                f"is no class of the model ({list(classes.values())}); store it with the class names, or remove it"
            )
        lut[int(segment.SegmentNumber)] = value
    numbers = pydicom_seg.MultiClassReader().read(ds).image
    array = sitk.GetArrayFromImage(numbers)
    if array.size and int(array.max()) >= len(lut):
        raise SegmentError(f"SEG {getattr(ds, 'SeriesInstanceUID', '?')} holds segment numbers it does not describe")
    values = sitk.GetImageFromArray(lut[array])
    values.CopyInformation(numbers)
    ref = sitk.ReadImage(reference) if isinstance(reference, str) else reference
    return sitk.Resample(values, ref, sitk.Transform(), sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)


def provide_dcmqi(app_dir: str) -> str:
    """Where ``itkimage2segimage`` (dcmqi) is, without downloading it: on ``PATH``, in the app's ``bin/`` (where
    MONAI Label looks), or in the PyPI wheel ``dcmqi`` (``dcmqi/bin``, installed by the ``label`` extra), whose folder
    is then added to ``PATH`` so that MONAI Label and the task processes find it too.

    Raises:
        ValueError: it is nowhere, naming the fix.
    """
    found = shutil.which(DCMQI_TOOL)
    if found:
        return found
    local = os.path.join(app_dir, "bin", DCMQI_TOOL)
    if os.path.isfile(local) and os.access(local, os.X_OK):
        return local
    spec = importlib.util.find_spec("dcmqi")
    if spec is not None and spec.origin:
        folder = os.path.join(os.path.dirname(spec.origin), "bin")
        tool = os.path.join(folder, DCMQI_TOOL)
        if os.path.isfile(tool) and os.access(tool, os.X_OK):
            os.environ["PATH"] = os.pathsep.join([p for p in (os.environ.get("PATH", ""), folder) if p])
            return tool
    raise ValueError(
        f"{DCMQI_TOOL} (dcmqi) is needed to store labels as DICOM SEG and is not installed: pip install dcmqi "
        f"(the 'label' extra installs it), or put {DCMQI_TOOL} on PATH or into {os.path.join(app_dir, 'bin')}; "
        "this app downloads nothing."
    )
