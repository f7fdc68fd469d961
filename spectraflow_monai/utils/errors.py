"""Errors about the user's inputs (data files, bundle settings) and a short report of them at the end of a run.

MONAI's bundle runner wraps every exception raised inside a config expression
(``RuntimeError("Failed to evaluate ...") from e``), so the message of a data check ends up dozens of lines above
the end of the output. The checks of this package raise :class:`DataError` (a file is missing, unreadable, not a
binary mask, holds NaN, ...) or :class:`SettingError` (a bundle setting is invalid); both are ``ValueError``
subclasses. :func:`install_excepthook` replaces ``sys.excepthook`` by one that prints the usual traceback and then,
when the exception or one of its causes is such an error, one last line::

    error: <file>: <problem>

The bundles install it by listing ``$import spectraflow_monai.utils.excepthook`` under ``imports``.
"""

from __future__ import annotations

import os
import re
import sys
from types import TracebackType
from typing import Any

__all__ = [
    "DatasetError",
    "DataError",
    "SUMMARY_ITEMS",
    "SettingError",
    "TrainingError",
    "brief",
    "error_summary",
    "find_input_error",
    "install_excepthook",
    "set_error_log_dir",
    "worker_input_error",
]


#: items of a list or mapping that :func:`brief` shows before "... and N more"
BRIEF_ITEMS = 8
#: characters of one shown value at most
BRIEF_CHARS = 200


def brief(value: Any, items: int = BRIEF_ITEMS, chars: int = BRIEF_CHARS) -> str:
    """``repr(value)`` bounded for a message: a list, tuple, set or mapping shows its first ``items`` entries and
    "... and N more"; any text longer than ``chars`` is cut with "...". A value of 100,000 classes makes a line of a
    few hundred characters, not hundreds of kilobytes.

    Args:
        value: what to show.
        items: entries of a collection shown. Defaults to :data:`BRIEF_ITEMS`.
        chars: the longest text of one entry (and of a value that is not a collection). Defaults to
            :data:`BRIEF_CHARS`.
    """

    def cut(text: str) -> str:
        return text if len(text) <= chars else text[: chars - 3] + "..."

    if isinstance(value, dict):
        shown = [f"{cut(repr(k))}: {cut(repr(v))}" for k, v in list(value.items())[:items]]
        more = f", ... and {len(value) - items} more" if len(value) > items else ""
        return "{" + ", ".join(shown) + more + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        entries = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
        shown = [cut(repr(v)) for v in entries[:items]]
        more = f", ... and {len(entries) - items} more" if len(entries) > items else ""
        left, right = ("[", "]") if isinstance(value, list) else ("(", ")") if isinstance(value, tuple) else ("{", "}")
        return left + ", ".join(shown) + more + right
    return cut(repr(value))


class DataError(ValueError):
    """A data file is missing, unreadable or unusable; the message names the file(s) and the problem."""


class DatasetError(DataError):
    """A dataset on disk is missing, incomplete or corrupt; the message names the file(s) and the problem.

    A :class:`spectraflow_monai.utils.errors.DataError` (so a ``ValueError``): bundle runs end with a one-line
    ``error: ...`` report of it."""


class SettingError(ValueError):
    """A setting (a bundle config value or an argument) is invalid; the message names the setting and the value."""


class TrainingError(RuntimeError):
    """Training cannot go on safely (a non-finite loss, a non-finite state to be saved); the message says why."""


_REPORTED = (DataError, SettingError, TrainingError)


def find_input_error(exc: BaseException | None) -> BaseException | None:
    """The first :class:`DataError`, :class:`SettingError` or :class:`TrainingError` in the chain of ``exc`` (itself,
    then its causes and contexts), or ``None``. An exception a ``DataLoader`` worker process raised reaches the main
    process as text (PyTorch re-raises it with the worker's traceback as its message): such an error named in that
    text is returned too, rebuilt from it (:func:`worker_input_error`)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, _REPORTED):
            return exc if _WORKER not in str(exc).split("\n", 1)[0] else worker_input_error(str(exc)) or exc
        found = worker_input_error(str(exc))
        if found is not None:
            return found
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


_WORKER = "in DataLoader worker process"
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)\.([A-Za-z_]\w*): (.*)$")


def worker_input_error(text: str) -> BaseException | None:
    """The user's mistake (:class:`DataError`, :class:`SettingError`, :class:`TrainingError` or a subclass) named in
    the message of an exception re-raised from a ``DataLoader`` worker (``"Caught ... in DataLoader worker process
    N. Original Traceback ..."``), rebuilt with its message; None when ``text`` is no such message or names none.
    Only classes of modules already imported are considered (nothing is imported because a text names it)."""
    lines = text.splitlines()
    if not lines or _WORKER not in lines[0]:
        return None
    for i, line in enumerate(lines):
        match = _ERROR_LINE.match(line)
        cls = getattr(sys.modules.get(match.group(1)), match.group(2), None) if match else None
        if not (isinstance(cls, type) and issubclass(cls, _REPORTED)):
            continue
        body = [match.group(3)]
        for following in lines[i + 1 :]:
            if not following.strip():
                break
            body.append(following)
        try:
            return cls("\n".join(body))
        except Exception:  # noqa: BLE001 (a subclass with other arguments: its base)
            return next(base for base in _REPORTED if issubclass(cls, base))("\n".join(body))
    return None


#: the listed items (message lines indented by two spaces, e.g. one bad file each) :func:`error_summary` names
SUMMARY_ITEMS = 3


def error_summary(exc: BaseException | None) -> str | None:
    """One line ``"error: <message>"`` for the :class:`DataError` / :class:`SettingError` in the chain of ``exc``
    (line breaks of the message become ``"; "``), or ``None`` when the chain holds neither. A message listing many
    items (lines indented by two spaces, e.g. one bad file each) names the first :data:`SUMMARY_ITEMS` and the
    count of the others, which the full message (in the traceback file) lists."""
    found = find_input_error(exc)
    if found is None:
        return None
    lines = [p for p in str(found).splitlines() if p.strip()]
    items = [i for i, p in enumerate(lines) if p.startswith("  ")]
    if len(items) > SUMMARY_ITEMS + 1:
        dropped = set(items[SUMMARY_ITEMS:])
        lines = [p for i, p in enumerate(lines) if i not in dropped]
        lines.insert(items[SUMMARY_ITEMS], f"and {len(dropped)} more (the full message lists every one)")
    parts = [p.strip() for p in lines]
    text = "; ".join(parts) if parts else type(found).__name__
    return f"error: {text.replace(':; ', ': ')}"


#: set (to anything but ``""`` / ``0``) to see the traceback of a user's mistake on screen as well
TRACEBACK_ENV = "SPECTRAFLOW_TRACEBACK"


_ERROR_LOG_DIR: list[str] = []  # the run's log folder, once a bundle run has named it (set_error_log_dir)


def set_error_log_dir(path: str | os.PathLike | None) -> None:
    """Send the traceback of a user's mistake that ends this process to ``<path>/error-<time>-<pid>.log`` (the run's
    log folder, created when the file is written) instead of the temp folder; None: back to the temp folder. Every
    bundle run calls it before its work (its ``error_log`` component, with its ``log_dir``): an early step of the
    ``run`` list of training and evaluation, the first of inference's ``initialize`` list."""
    _ERROR_LOG_DIR[:] = [] if path is None else [os.fspath(path)]


def _write_traceback(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str | None:
    """The full traceback into the run's log folder (:func:`set_error_log_dir`), else (or when that cannot be
    written) ``<temp dir>/spectraflow-error-<pid>.log``; its path, or None when neither can be written."""
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(exc_type, exc, tb))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidates = [os.path.join(d, f"error-{stamp}-{os.getpid()}.log") for d in _ERROR_LOG_DIR]
    candidates.append(os.path.join(tempfile.gettempdir(), f"spectraflow-error-{os.getpid()}.log"))
    for path in candidates:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            continue
        return os.path.abspath(path)
    return None


def _hook(previous: Any) -> Any:
    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            line = error_summary(exc)
        except Exception:  # the report must never hide the original error
            line = None
        if not line or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            previous(exc_type, exc, tb)
        elif (path := _write_traceback(exc_type, exc, tb)) is not None:
            line += f" (traceback: {path})"
        else:
            previous(exc_type, exc, tb)
        if line:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    excepthook._spectraflow_previous = previous  # type: ignore[attr-defined]
    return excepthook


def install_excepthook() -> None:
    """Make an uncaught user's mistake (a :class:`DataError` or :class:`SettingError` in the exception's chain) end
    the output with the one line of :func:`error_summary`, without the Python traceback on screen: the traceback is
    written to the run's log folder (:func:`set_error_log_dir`; before a run names it: ``<temp
    dir>/spectraflow-error-<pid>.log``), named at the end of the line (``SPECTRAFLOW_TRACEBACK=1``
    prints it on screen as well). Other exceptions keep the previous ``sys.excepthook`` (the usual traceback).
    Idempotent.
    """
    if getattr(sys.excepthook, "_spectraflow_previous", None) is not None:
        return
    sys.excepthook = _hook(sys.excepthook)
