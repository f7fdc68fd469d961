"""Where the bundles shipped with the package are: the MONAI bundles and the MONAI Label app."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

__all__ = ["BUNDLE_NAMES", "bundle_command", "bundle_parser", "bundle_path", "run_bundle_configs"]

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


def bundle_command(configs: list[str], overrides: dict[str, Any]) -> str:
    """The ``python -m monai.bundle run`` command line that runs ``configs`` with ``overrides`` (for the logs)."""
    files = "[" + ",".join(f"'configs/{c}'" for c in configs) + "]"
    args = " ".join(f"--{k} {shlex.quote(repr(v) if not isinstance(v, str) else v)}" for k, v in overrides.items())
    return f"python -m monai.bundle run --config_file \"{files}\" {args}"


def bundle_parser(bundle: Path, configs: list[str], overrides: dict[str, Any]) -> Any:
    """A ``monai.bundle.ConfigParser`` of bundle ``configs`` (merged in order) with ``overrides`` applied, for
    building a run's objects in Python (its ``network_def``, ``data_source``, transforms) as the run built them.

    A config is a file name under ``<bundle>/configs`` or a path (as in :func:`run_bundle_configs`).
    """
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    files = [bundle / "configs" / c for c in configs]  # an absolute path stays itself
    parser.read_config([str(f) for f in files])
    parser.read_meta(str(bundle / "configs" / "metadata.json"))
    parser.update(dict(overrides))
    return parser


def run_bundle_configs(bundle: Path, configs: list[str], overrides: dict[str, Any], title: str) -> float:
    """Run bundle ``configs`` (file names under ``<bundle>/configs``, merged in order) with ``overrides`` through
    ``monai.bundle.run`` in this process, printing the equivalent command first; returns the wall time in seconds.

    The working directory is the bundle folder while it runs (its configs address their logging and metadata files
    relative to it) and is restored afterwards.
    """
    from monai.bundle import run

    from spectraflow_monai.utils.quiet import trusted_bundle_configs

    print(f"\n=== {title}\n(cd {bundle} && {bundle_command(configs, overrides)})", flush=True)
    start = time.perf_counter()
    cwd = os.getcwd()
    try:
        os.chdir(bundle)  # the configs and their logging/metadata files are addressed relative to the bundle
        with trusted_bundle_configs():
            run(
                config_file=[str(bundle / "configs" / c) for c in configs],
                meta_file=str(bundle / "configs" / "metadata.json"),
                logging_file=str(bundle / "configs" / "logging.conf"),
                **overrides,
            )
    finally:
        os.chdir(cwd)
    elapsed = time.perf_counter() - start
    print(f"=== {title}: done in {elapsed:.0f} s", flush=True)
    return elapsed
