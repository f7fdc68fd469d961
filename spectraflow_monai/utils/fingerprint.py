"""Content fingerprints of data files, cached by size, modification and status-change time.

A run record (:mod:`spectraflow_monai.utils.run_record`) fingerprints its data by content: a mask edited in place
in a format that keeps the file size (BMP, uncompressed TIFF, ``.nii``) is a different data set. Hashing every file
at every start would reread a large data set each time, so :func:`file_digest` keeps the SHA-256 of each file in a
cache keyed by the file's real path, size, modification time, status-change time (``st_ctime_ns``, which an edit
changes even when the modification time is set back afterwards) and inode: a file is read again only when one of
them changed.

The cache lives in memory and in one JSON file (:func:`default_cache_file`: ``$SPECTRAFLOW_FINGERPRINT_CACHE``, else
``$XDG_CACHE_HOME/spectraflow_monai/file_digests.json``, else ``~/.cache/spectraflow_monai/file_digests.json``),
written atomically at most every :data:`SAVE_DELAY` seconds while new digests are computed and at exit, and
bounded to :data:`MAX_CACHED` entries (the oldest go first). A cache that cannot be read or written is ignored (the
digests are then computed, not cached). The cache holds digests only, never anything that is run or configured from.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from spectraflow_monai.utils.files import write_text_atomic

__all__ = ["MAX_CACHED", "SAVE_DELAY", "default_cache_file", "file_digest", "file_digests", "flush"]

logger = logging.getLogger(__name__)

#: the most entries the cache file keeps
MAX_CACHED = 200_000
_CHUNK = 1 << 20
_VERSION = 2
_LOCK = threading.Lock()
_MEMORY: dict[str, dict[str, Any]] = {}  # cache file -> {real path: [size, mtime_ns, ctime_ns, inode, digest]}
_UNSAVED: dict[str, float] = {}  # cache file -> when its first unsaved digest was computed
#: seconds a new digest may wait before the cache file is written (all unsaved ones are written at exit)
SAVE_DELAY = 5.0


def default_cache_file() -> str:
    """The cache file: ``$SPECTRAFLOW_FINGERPRINT_CACHE``, else ``<$XDG_CACHE_HOME or ~/.cache>/spectraflow_monai/
    file_digests.json``."""
    given = os.environ.get("SPECTRAFLOW_FINGERPRINT_CACHE")
    if given:
        return os.path.abspath(os.path.expanduser(given))
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "spectraflow_monai", "file_digests.json")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _key(stat: os.stat_result) -> list[int]:
    # ctime: an in-place edit that restores the modification time (os.utime, tar, rsync --times) still changes it
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


_KEY_LENGTH = 4


def _load(cache_file: str) -> dict[str, Any]:
    entries = _MEMORY.get(cache_file)
    if entries is not None:
        return entries
    entries = {}
    try:
        with open(cache_file) as f:
            data = json.load(f)
        if isinstance(data, dict) and data.get("version") == _VERSION and isinstance(data.get("files"), dict):
            entries = {
                str(k): v
                for k, v in data["files"].items()
                if isinstance(v, list) and len(v) == _KEY_LENGTH + 1 and isinstance(v[_KEY_LENGTH], str)
            }
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        logger.warning("file digest cache %s cannot be read (%s); digests are computed again.", cache_file, e)
    _MEMORY[cache_file] = entries
    return entries


def _save(cache_file: str, entries: dict[str, Any]) -> None:
    _UNSAVED.pop(cache_file, None)
    while len(entries) > MAX_CACHED:  # dicts keep insertion order: the oldest entries go first
        entries.pop(next(iter(entries)))
    try:
        write_text_atomic(cache_file, json.dumps({"version": _VERSION, "files": entries}))
    except OSError as e:
        logger.warning("file digest cache %s cannot be written (%s); digests are not kept.", cache_file, e)


def file_digests(paths: Iterable[str | os.PathLike], cache_file: str | None = None) -> dict[str, str]:
    """The SHA-256 of each file's content, read only for files whose size, modification time, status-change time or
    inode changed since they were last hashed (see the module docstring).

    Args:
        paths: files.
        cache_file: the cache file; None: :func:`default_cache_file`. Defaults to None.

    Returns:
        ``{path as given: hex digest}``.

    Raises:
        FileNotFoundError: a path that is not a file, named.
    """
    cache_file = os.path.abspath(cache_file) if cache_file else default_cache_file()
    out: dict[str, str] = {}
    with _LOCK:
        entries = _load(cache_file)
        changed = False
        for given in paths:
            path = os.fspath(given)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} does not exist (needed for the data fingerprint).")
            real = os.path.realpath(path)
            key = _key(os.stat(real))
            cached = entries.get(real)
            if cached is not None and cached[:_KEY_LENGTH] == key:
                out[path] = cached[_KEY_LENGTH]
                continue
            digest = _sha256(real)
            if _key(os.stat(real)) != key:  # written while it was read: hash the file as it is now
                key, digest = _key(os.stat(real)), _sha256(real)
            entries.pop(real, None)
            entries[real] = [*key, digest]
            out[path] = digest
            changed = True
        if changed:
            first = _UNSAVED.setdefault(cache_file, time.monotonic())
            if time.monotonic() - first >= SAVE_DELAY:
                _save(cache_file, entries)
    return out


@atexit.register
def flush() -> None:
    """Write the digests not written yet to their cache files (also run at exit)."""
    with _LOCK:
        for cache_file in list(_UNSAVED):
            _save(cache_file, _MEMORY.get(cache_file, {}))


def file_digest(path: str | os.PathLike, cache_file: str | None = None) -> str:
    """The SHA-256 of one file's content (cached, see :func:`file_digests`)."""
    return file_digests([path], cache_file)[os.fspath(path)]
