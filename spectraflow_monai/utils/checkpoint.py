"""Atomic checkpoint writing helpers.

Training checkpoints (model, optimizer, EMA and engine state) go through MONAI's ``CheckpointSaver``, whose ignite
``DiskSaver`` already writes atomically. The helpers here cover the files written outside of it, such as the
SpectraFlow Stage-1 encoder export (Chen et al., "SpectraFlow", Sec. "Implementation Details"): the object is
serialised to a temporary file in the destination folder, flushed to disk and moved over the destination with
``os.replace``, so an interrupted run never leaves a truncated file behind and readers see either the old or the
new file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from spectraflow_monai.utils.files import atomic_path

__all__ = ["atomic_torch_save", "cpu_state_dict"]


def cpu_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """Detached CPU copy of a state dict (tensors cloned, other values kept).

    Args:
        state: a ``state_dict()``-like mapping.

    Returns:
        a new dict whose tensors are detached, contiguous CPU clones, safe to save while training continues.
    """
    return {
        k: (v.detach().to("cpu", copy=True).contiguous() if isinstance(v, torch.Tensor) else v)
        for k, v in state.items()
    }


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (temporary file in the same folder, fsync, ``os.replace``).

    The parent folder is created when missing. On any failure the temporary file is removed and the destination
    is left untouched.

    Args:
        obj: anything ``torch.save`` accepts (a state dict of tensors is loadable with ``weights_only=True``).
        path: destination file.

    Returns:
        the destination as a ``Path``.

    Raises:
        ValueError: ``path`` is an existing directory.
        OSError: the file could not be written (with the destination named in the message).
    """
    dest = Path(os.fspath(path)).expanduser()
    try:
        with atomic_path(dest, suffix=".tmp") as tmp, open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise OSError(f"could not write '{dest}': {exc}") from exc
    return dest
