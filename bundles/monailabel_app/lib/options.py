"""Values a request may send to the SpectraFlow MONAI Label app: the checks shared by inference and training, and the
inference options (``params`` of ``POST /infer/<model>``).

MONAI Label copies an inference request's ``params`` into the task's data and writes ``device`` into the bundle
config (``BundleInferTask._update_device``); an unchecked value reaches ``torch.device``, ``numpy`` or the logger
and fails there as a bare HTTP 500. :func:`check_infer_options` accepts a JSON object only, checks the options of
:data:`INFER_OPTIONS` (type and range) and refuses any string that MONAI's config parser would read as more than a
plain string, so that nothing a request sends is evaluated.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from monailabel.utils.others.generic import device_map

__all__ = [
    "INFER_OPTIONS",
    "RESULT_DTYPES",
    "check_bool",
    "check_device",
    "check_gpus",
    "check_infer_options",
    "config_syntax",
    "first_item",
    "show_value",
]

# what MONAI's config parser treats as an expression, a reference, a macro or a special key
_CONFIG_PREFIXES = ("$", "@", "%")
_CONFIG_MARKERS = ("_target_", "_requires_", "_disabled_", "_mode_", "_desc_", "#", "::")
_DEVICE = re.compile(r"cpu|cuda(:\d{1,2})?")
_NONE = (None, "", "None", "none")
_GPUS = re.compile(r"\d{1,2}(,\d{1,2}){0,15}")
#: ``result_dtype`` values of an inference request (the label map's integer or float type)
RESULT_DTYPES = ("uint8", "uint16", "int16", "int32", "int64", "float32")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_MAX_TIMEOUT = 3600
_MAX_PLAIN = 1000


def config_syntax(text: str) -> bool:
    """Whether MONAI's config parser would read ``text`` as more than a plain string (an expression ``$``, a
    reference ``@``, a macro ``%``, a special key such as ``_target_``, or an id path with ``#`` / ``::``)."""
    stripped = text.strip()
    return stripped.startswith(_CONFIG_PREFIXES) or any(m in stripped for m in _CONFIG_MARKERS)


def show_value(value: Any) -> str:
    """``repr(value)``, shortened to 80 characters for a message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def first_item(value: Any) -> Any:
    """The choice in a value that MONAI Label clients send back as the option list of ``config()``: its first item."""
    return value[0] if isinstance(value, (list, tuple)) and value else value


def check_device(value: Any) -> str | None:
    """``cpu``, ``cuda``, ``cuda:<index>`` or a GPU name of ``GET /info/`` (a list: its first item); None when left
    out (the server's default).

    Raises:
        ValueError: any other value.
    """
    value = first_item(value)
    if value in _NONE:
        return None
    if not isinstance(value, str) or not (_DEVICE.fullmatch(value) or value in device_map()):
        raise ValueError("must be 'cpu', 'cuda', 'cuda:<index>' or a GPU name listed by GET /info/")
    return value


def check_gpus(value: Any) -> str:
    """``gpus`` of a task (MONAI Label's ``CUDA_VISIBLE_DEVICES``): ``"all"`` (also for null / empty) or
    comma-separated GPU indices such as ``"0,1"``, else ValueError."""
    if value in _NONE or value == "all":
        return "all"
    if not (isinstance(value, str) and _GPUS.fullmatch(value)):
        raise ValueError("must be 'all' or comma-separated GPU indices such as '0,1'")
    return value


def check_bool(value: Any) -> bool:
    """``value`` when it is a JSON boolean, else ValueError."""
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _choice(choices: tuple[str, ...], upper: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        value = first_item(value)
        if value in _NONE:
            return None
        text = value.strip().upper() if upper and isinstance(value, str) else value
        if text not in choices:
            raise ValueError(f"must be one of {list(choices)}")
        return text

    return check


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"must be a number of seconds from 1 to {_MAX_TIMEOUT}")
    if not 1 <= value <= _MAX_TIMEOUT:
        raise ValueError(f"must be a number of seconds from 1 to {_MAX_TIMEOUT}")
    return value


def _never(value: Any) -> None:
    raise ValueError("is set by the server")


def _no_skip(value: Any) -> bool:
    if value not in (False, None, "false", "False"):
        raise ValueError("must be false: the answer is the label map")
    return False


def _plain(value: Any) -> Any:
    # options this app does not use (clients send their whole option panel back): JSON scalars only, no syntax
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= _MAX_PLAIN and not config_syntax(value):
        return value
    if isinstance(value, (list, tuple)) and len(value) <= 64:
        return [_plain(v) for v in value]
    if isinstance(value, dict) and len(value) <= 256 and not any(config_syntax(str(k)) for k in value):
        return {str(k): _plain(v) for k, v in value.items()}
    raise ValueError("must be a plain JSON value (no expression, reference or special key)")


# option -> check returning the value to use (None: leave the option out)
INFER_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "device": check_device,
    "result_dtype": _choice(RESULT_DTYPES),
    "result_extension": _choice((".png", ".nii.gz", ".nii", ".nrrd", ".seg.nrrd")),
    "result_compress": check_bool,
    "save_label": check_bool,
    "logging": _choice(_LOG_LEVELS, upper=True),
    "timeout": _timeout,
    "skip_writer": _no_skip,
    # set by MONAI Label from the upload, the session and the task; a request never chooses them (``bundle_path``
    # would go onto a batch inference process's PYTHONPATH: the app's own is taken out before these checks)
    "bundle_path": _never,
    "gpus": check_gpus,
    "label": _never,
    "image_path": _never,
    "description": _never,
}
# options checked elsewhere: the image (lib.checks.resolve_image), the label tag (lib.checks.check_tag), the
# weight file (lib.infers.SpectraFlowInferTask._get_network); the session's record is set by MONAI Label and unused
_CHECKED_ELSEWHERE = ("model", "image", "label_tag", "model_filename", "session")


def check_infer_options(request: Any) -> dict[str, Any]:
    """The inference request with checked options, or ValueError naming the first refused option.

    Args:
        request: the request as the app's ``infer`` receives it (``model``, ``image`` and the client's ``params``).

    Returns:
        a new request; options left at their default are left out.

    Raises:
        ValueError: ``request`` is not a JSON object, an option of :data:`INFER_OPTIONS` has the wrong type or is out
            of range, or a value holds a string that MONAI's config parser would evaluate.
    """
    if not isinstance(request, dict):
        raise ValueError(f"the inference options (params) must be a JSON object, got {type(request).__name__}.")
    checked: dict[str, Any] = {}
    for key, value in request.items():
        if not isinstance(key, str) or config_syntax(key):
            raise ValueError(f"inference option {show_value(key)} is not a plain name.")
        if key in _CHECKED_ELSEWHERE:
            checked[key] = value
            continue
        check = INFER_OPTIONS.get(key, _plain)
        try:
            value = check(value)
        except ValueError as e:
            raise ValueError(f"inference option {key!r} {e}, got {show_value(value)}.") from None
        if value is not None:
            checked[key] = value
    return checked
