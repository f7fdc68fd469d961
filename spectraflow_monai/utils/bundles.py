"""Where the bundles shipped with the package are (the MONAI bundles, their shared configs and the MONAI Label app),
and which config files a run of a bundle layers."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

__all__ = [
    "BUNDLE_NAMES",
    "LAYERED_OVER",
    "SHARED_CONFIGS",
    "bundle_command",
    "bundle_config_files",
    "bundle_parser",
    "bundle_path",
    "run_bundle_configs",
]

#: the folders under ``bundles/``: two MONAI bundles, the configs both share (linked into their ``configs/``), the
#: MONAI Label app and the metadata schema.
BUNDLE_NAMES: tuple[str, ...] = (
    "spectraflow_2d_segmentation",
    "spectraflow_synapse_segmentation",
    "common",
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


#: the configs both bundles share, written once in ``bundles/common/<name>`` and linked into each bundle's ``configs/``
#: (``<link in configs/>: <file in bundles/common/>``): the Stage-2 program, Stage-1 and the multi-GPU override
SHARED_CONFIGS: dict[str, str] = {
    "common_train.yaml": "train.yaml",
    "train_stage1.yaml": "train_stage1.yaml",
    "multi_gpu_train.yaml": "multi_gpu_train.yaml",
}

#: a bundle's own config -> the shared one it is layered over
LAYERED_OVER: dict[str, str] = {"train.yaml": "common_train.yaml"}


def bundle_config_files(bundle: str | os.PathLike, configs: Sequence[str]) -> list[Path]:
    """The files that a run of bundle ``configs`` layers, in order, as its ``--config_file`` lists them.

    Each name is ``<bundle>/configs/<name>``; the bundle's ``train.yaml`` (its data) comes after the shared Stage-2
    program it is layered over, ``configs/common_train.yaml``: ``["train.yaml", "train_stage1.yaml"]`` gives
    ``configs/common_train.yaml``, ``configs/train.yaml``, ``configs/train_stage1.yaml``. An absolute path stays
    itself.

    Args:
        bundle: the bundle folder.
        configs: config names (or paths), in layering order.

    Raises:
        FileNotFoundError: a config that does not exist, naming the file (a shared one: how to get it back).
    """
    bundle = Path(bundle)
    files: list[Path] = []
    for name in configs:
        for part in ([LAYERED_OVER[name]] if name in LAYERED_OVER else []) + [name]:
            path = bundle / "configs" / part  # an absolute path stays itself
            if not path.is_file() or _unresolved_link(path):
                problem = f"config {part!r} of bundle {bundle}: {path} is missing, or holds the text of a link"
                if part in SHARED_CONFIGS:
                    problem += (
                        f" (a link to ../../common/{SHARED_CONFIGS[part]}, the configs both bundles share: keep the "
                        "bundles/ folder whole; on Windows, clone with git's core.symlinks=true)"
                    )
                raise FileNotFoundError(problem + ".")
            files.append(path)
    return files


def _unresolved_link(path: Path) -> bool:
    """Whether ``path`` holds the text of a link instead of the file (a checkout without symbolic links)."""
    return path.name in SHARED_CONFIGS and path.stat().st_size < 100 and path.read_text().startswith("../")


def bundle_command(bundle: str | os.PathLike, configs: list[str], overrides: dict[str, Any]) -> str:
    """The ``python -m monai.bundle run`` command line, run from the ``bundle`` folder, that runs ``configs`` (layered
    as :func:`bundle_config_files` says) with ``overrides`` (for the logs)."""
    root = Path(os.path.abspath(bundle))  # the links stay links: the command names configs/common_train.yaml
    paths = [
        os.path.relpath(f, root) if Path(os.path.abspath(f)).is_relative_to(root) else str(f)
        for f in bundle_config_files(bundle, configs)
    ]
    files = "[" + ",".join(f"'{p}'" for p in paths) + "]"
    args = " ".join(f"--{k} {shlex.quote(repr(v) if not isinstance(v, str) else v)}" for k, v in overrides.items())
    return f"python -m monai.bundle run --config_file \"{files}\" {args}"


def bundle_parser(bundle: Path, configs: list[str], overrides: dict[str, Any]) -> Any:
    """A ``monai.bundle.ConfigParser`` of bundle ``configs`` (layered as :func:`bundle_config_files` says) with
    ``overrides`` applied, for building a run's objects in Python (its ``network_def``, ``data_source``, transforms)
    as the run built them.
    """
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([str(f) for f in bundle_config_files(bundle, configs)])
    parser.read_meta(str(bundle / "configs" / "metadata.json"))
    parser.update(dict(overrides))
    return parser


def run_bundle_configs(bundle: Path, configs: list[str], overrides: dict[str, Any], title: str) -> float:
    """Run bundle ``configs`` (layered as :func:`bundle_config_files` says) with ``overrides`` through
    ``monai.bundle.run`` in this process, printing the equivalent command first; returns the wall time in seconds.

    The working directory is the bundle folder while it runs (its configs address their logging and metadata files
    relative to it) and is restored afterwards.
    """
    from monai.bundle import run

    from spectraflow_monai.utils.quiet import trusted_bundle_configs

    print(f"\n=== {title}\n(cd {bundle} && {bundle_command(bundle, configs, overrides)})", flush=True)
    start = time.perf_counter()
    cwd = os.getcwd()
    try:
        os.chdir(bundle)  # the configs and their logging/metadata files are addressed relative to the bundle
        with trusted_bundle_configs():
            run(
                config_file=[str(f) for f in bundle_config_files(bundle, configs)],
                meta_file=str(bundle / "configs" / "metadata.json"),
                logging_file=str(bundle / "configs" / "logging.conf"),
                **overrides,
            )
    finally:
        os.chdir(cwd)
    elapsed = time.perf_counter() - start
    print(f"=== {title}: done in {elapsed:.0f} s", flush=True)
    return elapsed
