"""The server's own copy of each bundle (docs/monailabel.md, "Serving safely").

The app never trains or reads configs from the installed bundle folder, nor from a folder that a request can write
to: at start it makes (or refreshes) a copy of each served bundle under its model folder (``--conf model_dir``,
default ``<app>/model``), and serves and trains that copy:

- ``configs/`` (and ``scripts/`` when the bundle has one) mirror the installed bundle at every start: changed files
  are replaced atomically, files the installed bundle does not have are removed, so that the configs the server
  runs are always the installed ones;
- ``models/``: files of the installed ``models/`` that the copy lacks are copied once (the initial ``model.pt``, a
  Stage-1 export); after that the copy's ``models/model.pt`` is the served model, which training replaces;
- everything a run writes (``logs/``, ``runs/``, the slice cache) stays in the copy.

The configs both bundles share are links in each installed ``configs/`` (to ``bundles/common``); the copy holds
their contents, so that it stands alone.

The model folder must not overlap the studies folder (the only folder requests write to).
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil

from spectraflow_monai.utils.files import atomic_path

__all__ = ["MIRRORED", "check_apart", "served_copy"]

logger = logging.getLogger(__name__)

#: bundle folders that are code: mirrored from the installed bundle at every start
MIRRORED = ("configs", "scripts")


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_apart(folder: str, what: str, studies: str) -> None:
    """Refuse a ``folder`` that lies inside the studies folder or holds it.

    Args:
        folder: a folder the server reads code or weights from (its model folder, an installed bundle).
        what: how to name it in the message (the setting).
        studies: the studies folder; a URL (DICOMweb) is not checked.

    Raises:
        ValueError: naming both folders.
    """
    if studies.startswith(("http://", "https://")):
        return
    if _inside(folder, studies) or _inside(studies, folder):
        raise ValueError(
            f"{what} {folder!r} and the studies folder {studies!r} overlap: requests write to the studies folder, "
            "so the server must not read configs or weights from there. Choose folders apart."
        )


def _copy_file(src: str, dest: str) -> bool:
    if os.path.isfile(dest) and filecmp.cmp(src, dest, shallow=False):
        return False
    with atomic_path(dest, suffix=".tmp") as tmp:
        shutil.copyfile(src, tmp)
    return True


def _mirror(src: str, dest: str) -> list[str]:
    """Make folder ``dest`` hold exactly the files of ``src``; returns the files written or removed."""
    changed = []
    wanted = set()
    for root, _, files in os.walk(src):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), src)
            wanted.add(rel)
            if _copy_file(os.path.join(root, name), os.path.join(dest, rel)):
                changed.append(rel)
    for root, dirs, files in os.walk(dest, topdown=False):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), dest)
            if rel not in wanted:
                os.remove(os.path.join(root, name))
                changed.append(rel)
        for name in dirs:
            path = os.path.join(root, name)
            if not os.listdir(path):
                os.rmdir(path)
    return changed


def served_copy(installed: str, dest: str) -> str:
    """Create or refresh the server's copy ``dest`` of the bundle at ``installed`` (see the module docstring).

    Args:
        installed: the installed bundle folder (read only).
        dest: the copy, e.g. ``<model_dir>/<bundle name>``.

    Returns:
        ``dest`` as an absolute path.
    """
    dest = os.path.abspath(dest)
    if _inside(dest, installed) or _inside(installed, dest):
        raise ValueError(f"the served copy {dest!r} and the installed bundle {installed!r} must be apart.")
    os.makedirs(dest, exist_ok=True)
    for folder in MIRRORED:
        src = os.path.join(installed, folder)
        if os.path.isdir(src):
            changed = _mirror(src, os.path.join(dest, folder))
            if changed:
                logger.info(f"served copy {dest}: {folder}/ refreshed from {installed} ({len(changed)} files)")
        elif os.path.isdir(os.path.join(dest, folder)):
            shutil.rmtree(os.path.join(dest, folder))
    models = os.path.join(installed, "models")
    if os.path.isdir(models):
        for name in sorted(os.listdir(models)):
            src, target = os.path.join(models, name), os.path.join(dest, "models", name)
            if os.path.isfile(src) and not os.path.exists(target):
                _copy_file(src, target)
                logger.info(f"served copy {dest}: models/{name} copied from {installed}")
    return dest
