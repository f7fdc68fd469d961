"""Where the bundles shipped with the package are (the MONAI bundles and the MONAI Label app), and which config
files a run of a bundle layers."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterable, Mapping
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
    "check_setting_names",
    "merged_config",
    "setting_ids",
    "settings_overrides",
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


#: the arguments of ``python -m monai.bundle run`` that are not config overrides
RUN_ARGUMENTS = ("config_file", "meta_file", "logging_file", "run_id", "init_id", "final_id", "tracking", "args_file")


def merged_config(files: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """The raw config of ``files`` layered as MONAI layers them (``ConfigParser.load_config_files``: a later file's
    top-level id replaces an earlier one's), nothing resolved."""
    from monai.bundle import ConfigParser

    return dict(ConfigParser.load_config_files([str(f) for f in files]))


def check_run_configs(argv: Sequence[str] | None = None) -> None:
    """The first step of every bundle run: under ``python -m monai.bundle run``, the ``--config_file`` list of the
    command line must be one that runs (:func:`bundle_config_files`), else the run stops with one line naming the
    commands that work (a list in the wrong order would otherwise run another stage, or fail deep in MONAI's config
    resolution). Runs started from Python (``monai.bundle.run(...)``, the demo, the MONAI Label app) check their
    lists themselves; then there is no ``--config_file`` and nothing is checked. A setting given by its bare field name
    where the config holds it in a settings object (``--image_size`` for ``--model_settings#image_size``) is refused
    naming the id to give (:func:`check_setting_names`).

    Args:
        argv: the command line. Defaults to ``sys.argv``.

    Raises:
        SettingError: the list cannot run.
    """
    import ast

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
        files = bundle_config_files(bundle if bundle.parts else Path("."), [p.name for p in paths])
        names = [a[2:] for a in argv if a.startswith("--") and a[2:] not in RUN_ARGUMENTS]
        check_setting_names(merged_config(files), names, where=", ".join(p.name for p in paths))


#: the component that reads a model's settings from its record in the serving configs (evaluation, inference): a
#: model setting given to such a run is an entry of its ``given`` mapping
RECORD_READER = "spectraflow_monai.apps.pipelines.ModelPipeline.from_record"


def _settings_class(target: Any) -> Any:
    """The settings class (a dataclass of :mod:`spectraflow_monai.utils.settings` or a bundle's data options) that a
    component's ``_target_`` names, else None."""
    import dataclasses

    from monai.utils import optional_import

    if not isinstance(target, str) or not target.startswith("spectraflow_monai.") or not target[:1].isalpha():
        return None
    module, _, name = target.rpartition(".")
    found, ok = optional_import(module, name=name)
    return found if ok and isinstance(found, type) and dataclasses.is_dataclass(found) else None


def setting_ids(config: Mapping[str, Any]) -> dict[str, str]:
    """Where a merged bundle config takes the value of each field of the settings objects it builds: the id to
    override (``--<id> <value>``) for each field name.

    A settings object is a top-level component whose ``_target_`` is a settings dataclass
    (``model_settings: {_target_: ...ModelSettings, image_size: 224}``): its field ``image_size`` is given as
    ``model_settings#image_size``, or as the top-level id it forwards (``device: '@device'``: ``device``). In the
    serving configs the model's settings are its record's (:data:`RECORD_READER`): a model setting given there is an
    entry of the mapping the reader's ``given`` names (``given: '@model_settings'``, ``model_settings: {}``: the same
    ``model_settings#image_size`` as in training), which must agree with the record.

    Args:
        config: the merged config of a run's files (``monai.bundle.ConfigParser.load_config_files``).
    """
    import dataclasses

    ids: dict[str, str] = {}
    for key, value in config.items():
        if not isinstance(value, Mapping):
            continue
        target = value.get("_target_")
        if target == RECORD_READER:
            from spectraflow_monai.utils.settings import ModelSettings

            root = _given_root(key, value)
            ids.update({f.name: f"{root}#{f.name}" for f in dataclasses.fields(ModelSettings)})
            continue
        cls = _settings_class(target)
        for field in dataclasses.fields(cls) if cls is not None else ():
            given = value.get(field.name)
            forwarded = isinstance(given, str) and given == f"@{field.name}" and field.name in config
            ids.setdefault(field.name, field.name if forwarded else f"{key}#{field.name}")
    return ids


def settings_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` with each setting named by its field (``{"image_size": 112}``, as Python callers write them)
    given at the id that holds it in ``config`` (:func:`setting_ids`: ``{"model_settings#image_size": 112}``); ids
    (``train#trainer#max_epochs``) and top-level ids of ``config`` are kept as they are. In a serving config a key
    inside a model setting's value (``network_kwargs#features``) is left out: the record holds the whole value."""
    ids = setting_ids(config)
    given = {k: _setting_id(config, ids, k) for k in overrides}
    # a key inside a model setting's value given to a serving config (network_kwargs#features): the record holds the
    # whole value, which the model was trained with; a part of it is not checked against it
    readers = [(k, v) for k, v in config.items() if isinstance(v, Mapping) and v.get("_target_") == RECORD_READER]
    roots = {_given_root(k, v) for k, v in readers}

    def inside_given(key: str) -> bool:
        return any(key.startswith(f"{r}#") and key.count("#") > r.count("#") + 1 for r in roots)

    return {given[k]: v for k, v in overrides.items() if not (k != given[k] and inside_given(given[k]))}


def _given_root(key: str, reader: Mapping[str, Any]) -> str:
    """The id of the mapping of model settings given to a serving config: the one the record reader's ``given``
    names (``'@model_settings'``), else its own ``given`` entry."""
    given = reader.get("given")
    if isinstance(given, str) and given.startswith("@") and not given.startswith("@@"):
        return given[1:]
    return f"{key}#given"


def _setting_id(config: Mapping[str, Any], ids: Mapping[str, str], key: str) -> str:
    """The id of override ``key``: a top-level id or a path into a mapping of ``config`` as it is; a field name, or
    ``<object>#<field>`` where ``<object>`` is not a component of its values here (the serving configs' model
    settings are the record's), the id that holds that field (:func:`setting_ids`); ``<field>#<key>`` (a key inside
    a setting's value, ``network_kwargs#features``) that key of the value at the field's id."""
    head, _, field = key.rpartition("#")
    if not head:
        return key if key in config else ids.get(key, key)
    top, _, rest = key.partition("#")
    if "#" not in head and not isinstance(config.get(top), Mapping) and field in ids:
        return ids[field]
    if top not in config and top in ids:  # a key inside a setting's value: network_kwargs#features
        return f"{ids[top]}#{rest}"
    return key


def check_setting_names(config: Mapping[str, Any], names: Iterable[str], where: str) -> None:
    """Refuse a setting given by its bare field name where the config holds it in a settings object (MONAI would add
    a top-level id that nothing reads: the run would silently train with the config's value), or given inside an id
    that holds no mapping of values here (``--<object>#<field>`` where ``<object>`` is an expression), naming the id
    that holds the field.

    Raises:
        SettingError: naming the id to give instead.
    """
    ids = setting_ids(config)
    for name in names:
        given = _setting_id(config, ids, name)
        if given != name:
            raise SettingError(f"{where}: --{name} is not read by this config; give --{given}.")


def bundle_command(bundle: str | os.PathLike, configs: list[str], overrides: dict[str, Any]) -> str:
    """The ``python -m monai.bundle run`` command line, run from the ``bundle`` folder, that runs ``configs`` (layered
    as :func:`bundle_config_files` says) with ``overrides`` (for the logs)."""
    root = Path(os.path.abspath(bundle))
    paths = [
        os.path.relpath(f, root) if Path(os.path.abspath(f)).is_relative_to(root) else str(f)
        for f in bundle_config_files(bundle, configs)
    ]
    files = "[" + ",".join(f"'{p}'" for p in paths) + "]"
    overrides = settings_overrides(merged_config(bundle_config_files(bundle, configs)), overrides)
    args = " ".join(f"--{k} {shlex.quote(repr(v) if not isinstance(v, str) else v)}" for k, v in overrides.items())
    return f"python -m monai.bundle run --config_file \"{files}\" {args}"


def bundle_parser(bundle: Path, configs: list[str], overrides: dict[str, Any]) -> Any:
    """A ``monai.bundle.ConfigParser`` of bundle ``configs`` (checked by :func:`bundle_config_files`) with
    ``overrides`` applied, for building a run's objects in Python (its ``network_def``, ``data_source``, transforms)
    as the run built them.
    """
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    files = bundle_config_files(bundle, configs)
    parser.read_config([str(f) for f in files])
    parser.read_meta(str(bundle / "configs" / "metadata.json"))
    parser.update(settings_overrides(parser.config, overrides))
    return parser


def run_bundle_configs(bundle: Path, configs: list[str], overrides: dict[str, Any], title: str) -> float:
    """Run bundle ``configs`` (checked by :func:`bundle_config_files`) with ``overrides`` (a setting named by its field
    or by its id, :func:`settings_overrides`) through ``monai.bundle.run`` in this process, printing the equivalent
    command first; returns the wall time in seconds.

    The working directory is the bundle folder while it runs (its configs address their logging and metadata files
    relative to it) and is restored afterwards.
    """
    from monai.bundle import run

    from spectraflow_monai.utils.quiet import trusted_bundle_configs

    print(f"\n=== {title}\n(cd {bundle} && {bundle_command(bundle, configs, overrides)})", flush=True)
    files = bundle_config_files(bundle, configs)
    overrides = settings_overrides(merged_config(files), overrides)
    start = time.perf_counter()
    cwd = os.getcwd()
    try:
        os.chdir(bundle)  # the configs and their logging/metadata files are addressed relative to the bundle
        with trusted_bundle_configs():
            run(
                config_file=[str(f) for f in files],
                meta_file=str(bundle / "configs" / "metadata.json"),
                logging_file=str(bundle / "configs" / "logging.conf"),
                **overrides,
            )
    finally:
        os.chdir(cwd)
    elapsed = time.perf_counter() - start
    print(f"=== {title}: done in {elapsed:.0f} s", flush=True)
    return elapsed
