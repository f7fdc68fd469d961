"""File helpers: atomic writes, and input checks for bundle configs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spectraflow_monai.utils.errors import DataError

__all__ = ["atomic_path", "require_file", "require_items", "require_weights", "write_text_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[str]:
    """Yield a temporary file path next to ``path``; on success it replaces ``path`` atomically.

    Write the file at the yielded path inside the ``with`` block. When the block ends without error the temporary
    file gets the usual permissions (``0o666`` minus the umask) and is moved over ``path`` with ``os.replace``, so
    readers see either the old or the new file, never a truncated one. On error it is removed and ``path`` is left
    untouched. The parent folder is created when missing.

    Args:
        path: destination file.
        suffix: suffix of the temporary file; ``None`` keeps the destination's (``.nii.gz``, ``.png``) so that
            writers that pick a format from the extension work.

    Raises:
        ValueError: ``path`` is an existing directory.
    """
    dest = Path(os.fspath(path)).expanduser()
    if dest.is_dir():
        raise ValueError(f"path must be a file path, got the existing directory '{dest}'.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix="".join(dest.suffixes) if suffix is None else suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path, suffix=".tmp") as tmp:
        with open(tmp, "w", newline="") as f:
            f.write(text)


def require_file(path: str | os.PathLike, hint: str = "") -> str:
    """Return ``path`` when it is an existing file, else raise ``FileNotFoundError`` naming it (and ``hint``).

    A step for the first items of a bundle config's ``run`` list (``initialize`` in an inference config), so that a
    missing input stops the run before any work starts.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path!r} does not exist" + (f": {hint}" if hint else "."))
    return path


def require_weights(path: str | os.PathLike, hint: str = "") -> str:
    """Return ``path`` when it is a weights file (a dict that ``torch.load(..., weights_only=True)`` reads), else
    raise :class:`~spectraflow_monai.utils.errors.DataError` naming it and the problem (a missing file: with
    ``hint``).

    The evaluation configs call it in their ``run`` list and the inference configs in their ``initialize`` list
    (``weights_check``), before any volume or image is read, so that a missing model, or a ``model.pt`` that is not
    a weights file (a text file, a pickled object, a truncated download), ends the run with one ``error:`` line
    instead of a failure inside MONAI's ``CheckpointLoader``.
    Nothing in the file is executed (``weights_only=True``); zip-format files (what ``torch.save`` writes) are
    memory-mapped, so the check does not read the weights twice.
    """
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataError(f"model file {path!r} does not exist" + (f": {hint}." if hint else "."))
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zip-format file: mmap cannot map it, a plain read decides
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (any failure to read means: not a weights file)
        raise DataError(
            f"model file {path!r} is not a weights file (torch.load(weights_only=True) refused it: "
            f"{type(e).__name__}); replace it with the model.pt that training writes (configs/train.yaml)."
        ) from e
    if not isinstance(obj, dict):
        raise DataError(
            f"model file {path!r} holds a {type(obj).__name__}, not a dict of weights; replace it with the model.pt "
            "that training writes (configs/train.yaml)."
        )
    return path


def require_items(items: list, description: str) -> list:
    """Return ``items`` when it is non-empty, else raise ``FileNotFoundError`` with ``description`` of what is missing."""
    if not items:
        raise FileNotFoundError(description)
    return items
