"""Where the bundles shipped with the package are: the MONAI bundles and the MONAI Label app."""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUNDLE_NAMES", "bundle_path"]

#: the folders under ``bundles/``: two MONAI bundles, the MONAI Label app and the metadata schema.
BUNDLE_NAMES: tuple[str, ...] = (
    "spectraflow_2d_segmentation",
    "spectraflow_synapse_segmentation",
    "monailabel_app",
    "schema",
)


def bundle_path(name: str = "spectraflow_2d_segmentation") -> Path:
    """The folder of a bundle shipped with spectraflow_monai.

    A regular install (``pip install .`` or a wheel) carries the bundles inside the package
    (``spectraflow_monai/bundles/<name>``); a clone or an editable install has them at ``<repo>/bundles/<name>``.
    The installed copy is preferred.

    Args:
        name: one of :data:`BUNDLE_NAMES`. Defaults to ``"spectraflow_2d_segmentation"``.

    Raises:
        ValueError: ``name`` is not a shipped bundle.
        FileNotFoundError: neither location holds it (a broken install), naming both places looked at.
    """
    if name not in BUNDLE_NAMES:
        raise ValueError(f"name must be one of {list(BUNDLE_NAMES)}, got {name!r}.")
    package = Path(__file__).resolve().parents[1]
    candidates = (package / "bundles" / name, package.parent / "bundles" / name)
    for path in candidates:
        if path.is_dir():
            return path
    raise FileNotFoundError(
        f"bundle {name!r} not found at {candidates[0]} (installed package) nor at {candidates[1]} (clone): "
        "reinstall spectraflow_monai (pip install .) or run from a clone of the repository."
    )
