"""Values a request may send to the SpectraFlow MONAI Label app: the checks shared by inference and training, the
inference options (``params`` of ``POST /infer/<model>``) and the training options (the body of ``POST /train/...``).

MONAI Label copies an inference request's ``params`` into the task's data and writes ``device`` into the bundle
config (``BundleInferTask._update_device``); an unchecked value reaches ``torch.device``, ``numpy`` or the logger
and fails there as a bare HTTP 500. :func:`check_infer_options` accepts a JSON object only, checks the options of
:data:`INFER_OPTIONS` (type and range) and refuses any string that MONAI's config parser would read as more than a
plain string, so that nothing a request sends is evaluated.

MONAI Label's ``BundleTrainTask`` turns request values into bundle config overrides (``train#trainer#max_epochs``,
``device``, ``tracking_uri``, ...), and MONAI's config parser evaluates a string that starts with ``$`` as Python and
resolves ``@`` / ``%`` references and ``_target_`` objects. A training request may therefore set only the options of
:data:`TRAIN_OPTIONS`, each of a checked type and range (:func:`check_train_options`); anything else is refused
before the bundle is read.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable

from monailabel.utils.others.generic import device_map

from spectraflow_monai.utils.precision import PRECISION_SETTINGS

from .infers import DEFAULT_WEIGHTS

__all__ = [
    "INFER_OPTIONS",
    "MAX_EPOCHS",
    "MODEL_FILENAME_RULE",
    "PRECISION_CHOICES",
    "RESULT_DTYPES",
    "TRAIN_OPTIONS",
    "check_bool",
    "check_device",
    "check_gpus",
    "check_infer_options",
    "check_precision",
    "check_train_options",
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


MAX_EPOCHS = 10000
_MAX_TEXT = 200
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.pt")
#: the values of the bundles' ``precision`` setting
PRECISION_CHOICES = PRECISION_SETTINGS
#: the answer to every ``model_filename`` that is not a weight file of the bundle (a path and an unknown name alike)
MODEL_FILENAME_RULE = "must be the name of a .pt file in the bundle's models/ folder, such as 'model.pt'"


def _max_epochs(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_EPOCHS:
        raise ValueError(f"must be an integer from 1 to {MAX_EPOCHS}")
    return value


def _val_split(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("must be a number >= 0 and < 1")
    if not 0.0 <= value < 1.0:
        raise ValueError("must be a number >= 0 and < 1")
    return float(value)


def _tracking(value: Any) -> str:
    if first_item(value) not in _NONE:
        raise ValueError("must be 'None': experiment tracking (MLflow) is not available in this app")
    return "None"


def _text(value: Any) -> None:
    # accepted for MONAI Label clients that send every option back; unused, since tracking is always off
    if value is not None and (not isinstance(value, str) or len(value) > _MAX_TEXT or config_syntax(value)):
        raise ValueError(f"must be a plain string of at most {_MAX_TEXT} characters")
    return None


def _run_id(value: Any) -> None:
    if value not in (*_NONE, "run"):
        raise ValueError("must be 'run' (the bundle's training workflow)")
    return None


def check_precision(value: Any) -> str:
    """A ``precision`` setting (a list: its first item), case-insensitive, as one of :data:`PRECISION_CHOICES`.

    Raises:
        ValueError: any other value.
    """
    value = first_item(value)
    if not isinstance(value, str) or value.strip().lower() not in PRECISION_CHOICES:
        raise ValueError(f"must be one of {list(PRECISION_CHOICES)}")
    return value.strip().lower()


def _model_filename(value: Any) -> str:
    value = first_item(value)
    if value in _NONE:
        return DEFAULT_WEIGHTS
    if not isinstance(value, str) or not _FILE_NAME.fullmatch(value) or ".." in value:
        raise ValueError(MODEL_FILENAME_RULE)
    return value


def _local_rank(value: Any) -> None:
    # added by MONAI Label's task subprocess (monailabel.interfaces.utils.app) to every queued training request
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1024:
        raise ValueError("must be a process rank (an integer >= 0)")
    return None


# option -> (check returning the value to use, or None to leave the option out; what it means)
TRAIN_OPTIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "max_epochs": (_max_epochs, f"integer 1..{MAX_EPOCHS}: epochs to run (default 50)"),
    "val_split": (_val_split, "number in [0, 1): fraction of the datastore pairs used for validation (default 0.2)"),
    "device": (check_device, "'cpu', 'cuda', 'cuda:<index>' or a GPU name (default 'cuda', 'cpu' without a GPU)"),
    "pretrained": (check_bool, "true/false: start from models/<model_filename> when it exists (default true)"),
    "model_filename": (_model_filename, "a .pt file name in the bundle's models/ folder (default 'model.pt')"),
    "multi_gpu": (check_bool, "true/false: torchrun on the GPUs of 'gpus' when there are several (default true)"),
    "force_multi_gpu": (check_bool, "true/false: torchrun even with one GPU (default false)"),
    "gpus": (check_gpus, "'all' or GPU indices such as '0,1' (default 'all')"),
    "tracking": (_tracking, "'None' only (no MLflow)"),
    "tracking_uri": (_text, "ignored (tracking is off)"),
    "tracking_experiment_name": (_text, "ignored (tracking is off)"),
    "tracking_run_name": (_text, "ignored (tracking is off)"),
    "run_id": (_run_id, "'run' only"),
    "precision": (check_precision, "'auto', 'bf16', 'fp16' (CUDA) or 'fp32' (default: the app's --conf precision, "
                  "else the bundle's 'auto')"),
    # added by MONAI Label itself: its client sends client_id, its task subprocess adds local_rank
    "client_id": (_text, "ignored (MONAI Label's client adds it)"),
    "local_rank": (_local_rank, "ignored (MONAI Label's task subprocess adds it)"),
}
# options whose refusal does not repeat the value: a path is answered as an unknown name
_QUIET = ("model_filename",)


def check_train_options(request: dict[str, Any], bundle_path: str | None = None) -> dict[str, Any]:
    """The training request as ``BundleTrainTask`` may use it, or ValueError naming the first refused option.

    Args:
        request: ``model`` (the bundle name), ``bundle_path`` (added by MONAI Label; must be the bundle's folder)
            and options of :data:`TRAIN_OPTIONS`.
        bundle_path: the folder of the bundle being trained; ``None`` refuses any ``bundle_path`` in the request.
            Default ``None``.

    Returns:
        a new request with the checked values (options that are unused or at their default left out).

    Raises:
        ValueError: an option that is not in :data:`TRAIN_OPTIONS` (bundle config ids such as
            ``train#trainer#max_epochs`` included), a value of the wrong type or out of range, or a string that the
            bundle config parser would evaluate (``$``, ``@``, ``%``, ``_target_``, ...).
    """
    if not isinstance(request, dict):
        raise ValueError(f"the training request must be a JSON object, got {type(request).__name__}.")
    checked: dict[str, Any] = {}
    for key, value in request.items():
        if not isinstance(key, str):
            raise ValueError(f"train option {show_value(key)} is not a name.")
        if isinstance(value, str) and config_syntax(value):
            raise ValueError(
                f"train option {key!r}: {show_value(value)} would be evaluated by the bundle config parser "
                "(it starts with $, @ or % or holds _target_, #, ::); only plain values are accepted."
            )
        if key == "model":
            if not isinstance(value, str):
                raise ValueError(f"train option 'model' must be a bundle name, got {show_value(value)}.")
            checked[key] = value
        elif key == "bundle_path":
            if bundle_path is None or not isinstance(value, str) or os.path.realpath(value) != os.path.realpath(
                bundle_path
            ):
                raise ValueError("train option 'bundle_path' is set by the server and cannot be chosen.")
        elif key in TRAIN_OPTIONS:
            check, _ = TRAIN_OPTIONS[key]
            try:
                value = check(value)
            except ValueError as e:
                shown = "" if key in _QUIET else f", got {show_value(value)}"
                raise ValueError(f"train option {key!r} {e}{shown}.") from None
            if value is not None:
                checked[key] = value
        else:
            raise ValueError(
                f"train option {show_value(key)} is not accepted; a request may set only {sorted(TRAIN_OPTIONS)} "
                "(bundle settings are server settings: --conf overrides)."
            )
    return checked
