"""The bundle's classes, a client's ``label_info`` and DICOM SEG errors as HTTP answers (docs/monailabel.md, "Serving
from a PACS").

A label map of the Synapse bundle holds class values (0 background, 1 spleen, ..., 8 pancreas: the ``channel_def`` of
its ``configs/metadata.json``). MONAI Label 0.8.5 names the i-th label value present after ``label_info[i]`` (a client
listing all classes in class order stored the liver as "right_kidney"), and reads a SEG back as its segment NUMBERS
(1..n in the order of the values present). The SEGs themselves are written and read by the package, with the
converter the bundles' ``output_format: dicom_seg`` uses (:func:`spectraflow_monai.data.dicom_seg.write_dicom_seg`,
:func:`~spectraflow_monai.data.dicom_seg.read_dicom_seg`: segments named after the classes, read back by name, names
compared by :func:`spectraflow_monai.data.volumes.segment_key`). What is the app's own:

- :func:`bundle_classes` reads a bundle's classes (``{value: name}``), :func:`class_names` gives them as the package's
  readers and writers take them (background first);
- :func:`segment_names` gives each label value present its class name; a client's ``label_info`` may repeat the
  classes (in class order, or with each entry's ``idx``) and is refused (422) when it names a value otherwise;
  :func:`check_label_values` refuses values that are no class (422);
- :func:`data_error` turns the package's :class:`~spectraflow_monai.utils.errors.DataError` into a 422 without server
  paths;
- :func:`provide_dcmqi` finds ``itkimage2segimage`` without downloading it (PATH, the app's ``bin/``, the PyPI wheel
  ``dcmqi``): MONAI Label 0.8.5 downloads it at every start on a DICOMweb datastore otherwise (its own SEG
  conversions use it; this app's do not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import HTTPException

from spectraflow_monai.data.volumes import segment_key

from .checks import redact_paths

__all__ = [
    "BACKGROUND",
    "DCMQI_TOOL",
    "bundle_classes",
    "check_label_values",
    "class_names",
    "data_error",
    "provide_dcmqi",
    "segment_names",
]

#: dcmqi's converter of a label image into a DICOM SEG, which MONAI Label 0.8.5 looks for at start
DCMQI_TOOL = "itkimage2segimage"
#: the name of value 0 in :func:`class_names`
BACKGROUND = "background"


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


def class_names(classes: Mapping[int, str]) -> list[str]:
    """``{value: name}`` as the package's readers and writers take the classes: a list of names by value, background
    (:data:`BACKGROUND`) first.

    Raises:
        ValueError: the values leave a gap (a ``channel_def`` names every channel of its output).
    """
    top = max(classes, default=0)
    gaps = [v for v in range(1, top + 1) if v not in classes]
    if gaps:
        raise ValueError(f"classes must name every value 1..{top}, got {dict(classes)!r} (no {gaps[:8]}).")
    return [BACKGROUND, *(str(classes[v]) for v in range(1, top + 1))]


def data_error(error: Exception, paths: Mapping[str, str] | None = None) -> HTTPException:
    """HTTP 422 with the message of the package's ``error`` (a ``DataError``), each of ``paths`` (path -> what to
    show) named, any other server path left out."""
    return HTTPException(status_code=422, detail=redact_paths(str(error), dict(paths or {})))


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
            if segment_key(name) != segment_key(classes[value]):
                how = f"idx {value}" if idx is not None else f"position {i} (class order)"
                raise HTTPException(
                    status_code=422,
                    detail=f"label_info[{i}] names {name[:64]!r} at {how}, but value {value} is "
                    f"{classes[value]!r}; send label_info in class order ({list(classes.values())}) or leave it out",
                )
    return {int(v): classes[int(v)] for v in sorted({int(v) for v in values}) if int(v) != 0}


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
        f"{DCMQI_TOOL} (dcmqi) is needed by MONAI Label's start on a DICOMweb datastore and is not installed: pip "
        f"install dcmqi (the 'label' extra installs it), or put {DCMQI_TOOL} on PATH or into "
        f"{os.path.join(app_dir, 'bin')}; this app downloads nothing."
    )
