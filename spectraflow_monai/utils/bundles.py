"""Where the bundles shipped with the package are (the MONAI bundles and the MONAI Label app), and which config
files a run of a bundle layers."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Sequence

from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "BUNDLE_NAMES",
    "COMMANDS",
    "INFERENCE_LAYERS",
    "LAYERED_LAST",
    "bundle_command",
    "check_run_configs",
    "bundle_config_files",
    "bundle_parser",
    "bundle_path",
    "bundle_values",
    "run_bundle_configs",
]

#: the folders under ``bundles/``: two MONAI bundles (each folder stands alone), the MONAI Label app and the metadata
#: schema.
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


#: the configs layered over a bundle's ``configs/train.yaml`` (at most one of each kind, in this order after it; a
#: baseline's network, e.g. ``unetpp_baseline.yaml``, or ``paper_protocol.yaml`` may come before ``evaluate.yaml``)
LAYERED_LAST: tuple[str, ...] = ("train_stage1.yaml", "evaluate.yaml", "multi_gpu_train.yaml")
#: the configs that run alone
STANDALONE: tuple[str, ...] = ("train.yaml", "inference.yaml")
#: the configs layered over ``configs/inference.yaml`` (at most one, after it): inference through onnxruntime
INFERENCE_LAYERS: tuple[str, ...] = ("inference_onnx.yaml",)
#: the runs of a bundle, as its README lists them (what an error about a config list names)
COMMANDS: str = (
    "--config_file configs/train.yaml (Stage-2) | \"['configs/train.yaml','configs/train_stage1.yaml']\" (Stage-1) | "
    "\"['configs/train.yaml','configs/evaluate.yaml']\" (evaluation) | configs/inference.yaml | "
    "\"['configs/inference.yaml','configs/inference_onnx.yaml']\" (inference through onnxruntime); multi-GPU: add "
    "'configs/multi_gpu_train.yaml' last"
)


def bundle_config_files(bundle: str | os.PathLike, configs: Sequence[str]) -> list[Path]:
    """The files of a run of bundle ``configs``, checked: ``configs/<name>`` of each name (an absolute path stays
    itself), in a list that can run.

    A bundle folder stands alone, as model-zoo bundles do: ``train.yaml`` (Stage-2) and ``inference.yaml`` run
    alone; ``train_stage1.yaml``, ``evaluate.yaml`` and ``multi_gpu_train.yaml`` are layered after ``train.yaml``
    (in that order; a baseline network's config in between); ``inference_onnx.yaml`` after ``inference.yaml``.

    Args:
        bundle: the bundle folder.
        configs: config names (or paths), in layering order.

    Raises:
        SettingError: a missing file or a list that cannot run, in one line naming the commands that work.
    """
    bundle = Path(bundle)
    names = [Path(c).name for c in configs]
    files = [bundle / "configs" / c for c in configs]
    for name, path in zip(names, files):
        if not path.is_file():
            raise SettingError(f"config {name!r} of bundle {bundle}: {path} does not exist; the runs are: {COMMANDS}.")
    problem = None
    if not names:
        problem = "no config file was given"
    elif names[0] == "inference.yaml" and len(names) > 1 and names[1:] != list(INFERENCE_LAYERS):
        problem = f"configs/inference.yaml runs alone or with {', '.join(INFERENCE_LAYERS)} after it"
    elif names[0] in INFERENCE_LAYERS:
        problem = f"{names[0]} is layered over configs/inference.yaml, which comes first"
    elif names[0] not in STANDALONE:
        problem = f"{names[0]} is layered over configs/train.yaml, which comes first"
    else:
        rest = names[1:]
        first_last = next((i for i, n in enumerate(rest) if n in LAYERED_LAST), len(rest))
        last = rest[first_last:]
        if any(n not in LAYERED_LAST for n in last) or last != sorted(set(last), key=LAYERED_LAST.index):
            problem = f"the list {names} has {', '.join(LAYERED_LAST)} out of order, repeated or not last"
        elif "train_stage1.yaml" in last and "evaluate.yaml" in last:
            problem = "Stage-1 and evaluation are separate runs"
    if problem:
        raise SettingError(f"bundle {bundle}: {problem}; the runs are: {COMMANDS}.")
    return files


def check_run_configs(argv: Sequence[str] | None = None) -> None:
    """The first step of every bundle run: under ``python -m monai.bundle run``, the ``--config_file`` list of the
    command line must be one that runs (:func:`bundle_config_files`), else the run stops with one line naming the
    commands that work (a list in the wrong order would otherwise run another stage, or fail deep in MONAI's config
    resolution). Runs started from Python (``monai.bundle.run(...)``, the demo, the MONAI Label app) check their
    lists themselves; then there is no ``--config_file`` and nothing is checked.

    Args:
        argv: the command line. Defaults to ``sys.argv``.

    Raises:
        SettingError: the list cannot run.
    """
    import ast
    import sys

    argv = list(sys.argv if argv is None else argv)
    if "--config_file" not in argv[:-1] or not any("monai" in a and "bundle" in a for a in argv[:3]):
        return
    value = argv[argv.index("--config_file") + 1]
    try:
        files = ast.literal_eval(value) if value.strip().startswith("[") else value.split(",")
    except (ValueError, SyntaxError):
        return
    paths = [Path(f) for f in ([files] if isinstance(files, str) else files)]
    if not paths or any(p.parent.name != "configs" for p in paths):
        return
    bundle = paths[0].parent.parent
    if all(p.parent.parent == bundle for p in paths):
        bundle_config_files(bundle if bundle.parts else Path("."), [p.name for p in paths])


def _parsing_resolver() -> Any:
    """The ``monai.bundle.ReferenceResolver`` that is resolving a config item now: the nearest one up the call
    stack (MONAI gives a component only its arguments, not the config it belongs to)."""
    from monai.bundle.reference_resolver import ReferenceResolver

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, ReferenceResolver):
            return candidate
        frame = frame.f_back
    return None


#: the top-level ids being read by :func:`bundle_values` now (a value that needs its own reader is a circle)
_READING: set[str] = set()


def bundle_values(names: Iterable[str], what: str = "a settings object") -> dict[str, Any]:
    """The values of the top-level ids ``names`` of the bundle config that MONAI is resolving, as MONAI resolves a
    reference to each (``@<name>``: command-line overrides applied, expressions evaluated, components built); a name
    the config does not hold is left out.

    This is how a bundle builds its settings objects from its top-level values by field name
    (:meth:`~spectraflow_monai.utils.settings.SettingsObject.from_bundle`): ``model_settings: {_target_:
    ...ModelSettings.from_bundle}`` instead of a line ``<field>: '@<field>'`` per field. It must be called while
    MONAI resolves a config item (``python -m monai.bundle run``, ``monai.bundle.run``, a
    ``ConfigParser.get_parsed_content``).

    Args:
        names: the ids to read (the fields of a settings object).
        what: what reads them, for the messages. Defaults to ``"a settings object"``.

    Raises:
        SettingError: no MONAI config is being resolved, or a value read needs ``what`` itself (a circle).
    """
    resolver = _parsing_resolver()
    if resolver is None:
        raise SettingError(
            f"{what} reads the top-level values of a bundle config by name: build it in a config that MONAI "
            "resolves (python -m monai.bundle run, monai.bundle.ConfigParser), or call the class with the values."
        )
    values: dict[str, Any] = {}
    for name in names:
        if name not in resolver.items:
            continue
        if name in _READING:
            raise SettingError(f"{name}: its value needs {what}, which reads {name} (a circle in the config).")
        _READING.add(name)
        try:
            values[name] = resolver.get_resolved_content(name)
        finally:
            _READING.discard(name)
    return values


def bundle_command(bundle: str | os.PathLike, configs: list[str], overrides: dict[str, Any]) -> str:
    """The ``python -m monai.bundle run`` command line, run from the ``bundle`` folder, that runs ``configs`` (layered
    as :func:`bundle_config_files` says) with ``overrides`` (for the logs)."""
    root = Path(os.path.abspath(bundle))
    paths = [
        os.path.relpath(f, root) if Path(os.path.abspath(f)).is_relative_to(root) else str(f)
        for f in bundle_config_files(bundle, configs)
    ]
    files = "[" + ",".join(f"'{p}'" for p in paths) + "]"
    args = " ".join(f"--{k} {shlex.quote(repr(v) if not isinstance(v, str) else v)}" for k, v in overrides.items())
    return f"python -m monai.bundle run --config_file \"{files}\" {args}"


def bundle_parser(bundle: Path, configs: list[str], overrides: dict[str, Any]) -> Any:
    """A ``monai.bundle.ConfigParser`` of bundle ``configs`` (checked by :func:`bundle_config_files`) with
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
    """Run bundle ``configs`` (checked by :func:`bundle_config_files`) with ``overrides`` through
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
