"""Running the bundles for an experiment: one folder per run, one done marker per step, finished steps skipped.

Every experiment of :mod:`spectraflow_monai.experiments` is a set of runs of the ``spectraflow_2d_segmentation``
bundle, each step (Stage-1, Stage-2, one evaluation) a ``monai.bundle.run`` of the bundle's own configs with
overrides, so every experiment setting is a bundle setting. A step that finished writes
``<run>/<step>.done.json`` (its configs, overrides and time); a later call with the same settings skips it, so an
interrupted experiment resumes where it stopped (an interrupted Stage-1 / Stage-2 also resumes inside the step, from
the bundle's own checkpoints). Changed settings run the step again.

Encoder weights: every experiment starts from the bundle's ``pretrained_weights`` default (``timm``: the paper's
DINOv2 weights) unless told otherwise. :func:`resolve_encoder_weights` loads them once before any step, so an
unreachable hub or a missing file stops the experiment before training with :class:`EncoderWeightsError`, naming the
setting and the ways forward; random initialisation (``pretrained_weights: none``) runs only when asked for, and
:func:`experiment_title` then says so in the title of every table and figure.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectraflow_monai.utils.bundles import bundle_parser, bundle_path, run_bundle_configs
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.files import atomic_path, write_text_atomic

__all__ = [
    "EXPERIMENT_METRICS",
    "METRIC_HEADERS",
    "RANDOM_INIT_NOTE",
    "SCALES",
    "EncoderWeightsError",
    "ExperimentRunner",
    "encoder_start_text",
    "experiment_settings",
    "experiment_title",
    "metric_cells",
    "read_summary",
    "resolve_encoder_weights",
    "settings_text",
    "write_csv",
]

logger = logging.getLogger(__name__)

#: the summary entries every experiment table reports, as the paper's Tables 2-3 do: mDSC, mIoU and HD95 (MONAI's
#: definition, a missed structure scored as the image diagonal, so that a model that misses lesions is not flattered).
EXPERIMENT_METRICS: tuple[str, ...] = ("mDSC", "mIoU", "hd95_monai_empty_as_diagonal")
#: the Markdown table header of each :data:`EXPERIMENT_METRICS` entry.
METRIC_HEADERS: dict[str, str] = {
    "mDSC": "mDSC (%)",
    "mIoU": "mIoU (%)",
    "hd95_monai_empty_as_diagonal": "HD95 (px, missed = diagonal)",
}

#: bundle overrides of each experiment scale: ``small`` (112 px, a multiple of the ViT patch 14 and of the UNet's total
#: stride 16; Stage-1 2 epochs; Stage-2 up to 8 epochs) finishes a run in minutes on 2 CPU cores with a real data set;
#: ``paper`` keeps the bundle's own (the paper's) settings. The small scale's Stage-1 EMA decay is 0.9 (paper 0.999):
#: the Stage-1 export is the EMA encoder, and over the few hundred iterations of 2 epochs an EMA of 0.999 would still
#: be ~80 % the starting encoder (all of it for a small subset), so every Stage-1 variant would export the same weights.
SCALES: dict[str, dict[str, Any]] = {
    "small": {"image_size": 112, "stage1_epochs": 2, "max_epochs": 8, "ema_decay": 0.9},
    "paper": {},
}


#: what the title of every table and figure of an experiment adds when its encoder starts from random weights.
RANDOM_INIT_NOTE = "random encoder initialisation, not the paper's DINOv2 weights"


class EncoderWeightsError(SettingError):
    """The encoder weights of an experiment (``pretrained_weights``) could not be loaded; nothing was trained."""


def _weights_error(value: Any, encoder_name: str, exc: BaseException) -> EncoderWeightsError:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return EncoderWeightsError(
        f"pretrained_weights={value!r} (the experiments' --pretrained-weights; default: the bundle's 'timm', the "
        f"paper's DINOv2 weights) could not be loaded into {encoder_name}, so nothing was trained:\n"
        f"  {type(exc).__name__}: {first}\n"
        "Ways forward:\n"
        "  - on a machine with internet access keep the default: timm downloads the weights once into the Hugging "
        "Face cache, and later runs read them from there;\n"
        "  - pass a local copy: --pretrained-weights /path/dinov2_vits14_pretrain.pth (the official facebookresearch "
        f"checkpoint of the paper) or a timm state dict of {encoder_name};\n"
        "  - opt into random initialisation: --pretrained-weights none (not the paper's setting; every table and "
        "figure title then says so)."
    )


def resolve_encoder_weights(common: Mapping[str, Any], bundle: str | os.PathLike | None = None) -> dict[str, Any]:
    """The settings ``common`` with ``pretrained_weights`` made explicit, after loading those weights once.

    The weights are ``common["pretrained_weights"]`` when set, else the bundle's default (``timm``, the paper's DINOv2
    weights). They are loaded into an encoder built from the runs' settings (``encoder_name``, ``image_size``,
    ``encoder_kwargs``) before any step runs, so an experiment without access to them stops before training.

    Args:
        common: the bundle overrides of every step of the experiment.
        bundle: the bundle folder. Defaults to the installed ``spectraflow_2d_segmentation``.

    Returns:
        ``common`` with ``pretrained_weights`` set: ``"timm"``, the file path, or ``"none"`` (random initialisation,
        logged as a warning).

    Raises:
        EncoderWeightsError: the weights could not be loaded (no hub access, a missing or unfitting file); the message
            names the setting and the ways forward.
    """
    from spectraflow_monai.networks import DINOv2Encoder
    from spectraflow_monai.networks.weights import normalize_weights_source

    bundle = Path(bundle) if bundle is not None else bundle_path("spectraflow_2d_segmentation")
    parser = bundle_parser(bundle, ["train.yaml"], dict(common))
    if "pretrained_weights" in common:
        value = common["pretrained_weights"]
    else:
        value = parser.get_parsed_content("stage2_settings").pretrained_weights  # the bundle's default
    source = normalize_weights_source(value)
    if source is None:
        logger.warning("encoder weights: none: every run starts from a random encoder (%s)", RANDOM_INIT_NOTE)
        return {**common, "pretrained_weights": "none"}
    model = parser.get_parsed_content("model_settings")
    name = model.encoder_name
    try:
        encoder = DINOv2Encoder(name, img_size=model.image_size, model_kwargs=model.encoder_kwargs)
        encoder.load_pretrained(source)
    except (ValueError, OSError) as exc:  # SettingError (the hub), FileNotFoundError, a file that does not fit
        raise _weights_error(value, name, exc) from exc
    return {**common, "pretrained_weights": source}


def experiment_settings(
    data: Mapping[str, Any], scale: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The bundle overrides of every step of an experiment: ``data``, then the ``scale``'s, then ``overrides`` (each
    winning over the one before; no progress bars), with the encoder weights made explicit and loaded once by
    :func:`resolve_encoder_weights` (so that no weights means no training)."""
    return resolve_encoder_weights({"progress_bar": False, **dict(data), **dict(scale), **dict(overrides or {})})


def _random_init(settings: Mapping[str, Any]) -> bool:
    from spectraflow_monai.networks.weights import normalize_weights_source

    return "pretrained_weights" in settings and normalize_weights_source(settings["pretrained_weights"]) is None


def experiment_title(title: str, settings: Mapping[str, Any]) -> str:
    """``title`` of a table or figure, with :data:`RANDOM_INIT_NOTE` when ``settings`` start from random weights."""
    return f"{title}: {RANDOM_INIT_NOTE}" if _random_init(settings) else title


def settings_text(scale: str, settings: Mapping[str, Any]) -> str:
    """The report line that names an experiment's scale and bundle settings."""
    shown = ", ".join(f"`{k}={v}`" for k, v in settings.items() if k != "progress_bar")
    return f"Scale `{scale}`; bundle settings: {shown}."


def metric_cells(row: Mapping[str, Any], suffix: str = "") -> list[str]:
    """The Markdown cells of :data:`EXPERIMENT_METRICS` in ``row`` (``<metric><suffix>``): mDSC and mIoU in percent,
    HD95 in pixels, two decimals; with ``suffix="_change"`` signed (a change from the clean score)."""
    sign = "+" if suffix else ""
    return [f"{(1 if m.startswith('hd95') else 100) * row[f'{m}{suffix}']:{sign}.2f}" for m in EXPERIMENT_METRICS]


def _plain(value: Any) -> Any:
    """``value`` as JSON would store it (tuples as lists, paths as strings), to compare settings with a marker."""
    return json.loads(json.dumps(value, default=str))


def read_summary(eval_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``summary.json`` an evaluation wrote into ``eval_dir``; FileNotFoundError naming it when absent."""
    path = Path(eval_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"no evaluation summary at {path}: the evaluation step did not finish.")
    return json.loads(path.read_text())


def encoder_start_text(model_file: str | os.PathLike) -> str:
    """Where the encoder of ``model_file`` started, as a table row states it, read from the record beside it
    (``models/model.json``, its ``encoder_start``): ``Stage-1 export``, ``pretrained (timm)`` / ``pretrained
    (<file>)``, ``random`` (``random (pretrained_weights none)`` when the pretrained weights were none), ``none (no
    encoder)`` for a network without one; ``not recorded`` for a record written before the start was recorded, and
    ``unknown (no model.json)`` without a record."""
    from spectraflow_monai.utils.settings import ModelSettings, model_settings_path

    path = Path(model_settings_path(model_file))
    if not path.is_file():
        return "unknown (no model.json)"
    content = json.loads(path.read_text())
    start = content.get("encoder_start")
    if start is None:
        model = ModelSettings.from_dict(content.get("model") or {}, source=str(path))
        return "not recorded" if model.has_encoder else "none (no encoder)"
    weights = start.get("weights")
    if start.get("start") == "stage1":
        return "Stage-1 export"
    if start.get("start") == "pretrained" and weights is not None:
        return f"pretrained ({weights if weights == 'timm' else Path(weights).name})"
    return "random" if start.get("start") == "random" else "random (pretrained_weights none)"


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write ``rows`` (dicts with the same keys) as a CSV file, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


class ExperimentRunner:
    """The runs of one experiment under ``<output>/<experiment>/<run>/``.

    Args:
        output: the experiment output folder (also where ``report.md`` goes).
        experiment: the experiment name (a sub-folder of ``output``).
        common: bundle overrides of every step (data, scale, precision, ...).
        bundle: the bundle folder. Defaults to the installed ``spectraflow_2d_segmentation``.

    Raises:
        ValueError: ``common`` sets ``bundle_root`` (each run has its own).
    """

    def __init__(
        self,
        output: str | os.PathLike,
        experiment: str,
        common: Mapping[str, Any],
        bundle: str | os.PathLike | None = None,
    ) -> None:
        if "bundle_root" in common:
            raise ValueError("common must not set 'bundle_root': every run of an experiment has its own folder.")
        self.output = Path(output).resolve()
        self.root = self.output / experiment
        self.common = dict(common)
        self.bundle = Path(bundle) if bundle is not None else bundle_path("spectraflow_2d_segmentation")
        self.executed: list[str] = []  # "<run>/<step>" of the steps this call ran (not skipped)

    def run_dir(self, run: str) -> Path:
        """The ``bundle_root`` of ``run``."""
        return self.root / run

    def _record(
        self, run: str, step: str, configs: Sequence[str], overrides: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any], dict[str, Any], Path]:
        """The settings of ``run``'s ``step``, what its done marker records, and the marker's path."""
        run_dir = self.run_dir(run)
        settings = {**self.common, **dict(overrides or {}), "bundle_root": str(run_dir)}
        return settings, {"configs": list(configs), "overrides": _plain(settings)}, run_dir / f"{step}.done.json"

    def is_done(
        self, run: str, step: str, configs: Sequence[str], overrides: Mapping[str, Any] | None = None
    ) -> bool:
        """Whether ``run``'s ``step`` finished with these configs and settings (its done marker says so)."""
        _, record, marker = self._record(run, step, configs, overrides)
        if not marker.is_file():
            return False
        done = json.loads(marker.read_text())
        return {k: done.get(k) for k in record} == record

    def step(self, run: str, step: str, configs: Sequence[str], overrides: Mapping[str, Any] | None = None) -> Path:
        """Run bundle ``configs`` for ``run`` unless this step already finished with the same settings.

        Args:
            run: the run name (its folder).
            step: the step name (its marker ``<step>.done.json``).
            configs: config file names of the bundle, merged in order.
            overrides: overrides of this step, over :attr:`common`.

        Returns:
            The run folder.
        """
        settings, record, marker = self._record(run, step, configs, overrides)
        if self.is_done(run, step, configs, overrides):
            logger.info("%s/%s: finished before (%s), skipped", run, step, marker)
            return marker.parent
        if marker.is_file():  # a finished step with other settings: start over (its run record would refuse a resume)
            logger.info("%s/%s: settings changed since %s, running it again from the start", run, step, marker)
            settings = {**settings, "resume": False}
        marker.parent.mkdir(parents=True, exist_ok=True)
        seconds = run_bundle_configs(self.bundle, list(configs), settings, f"{self.root.name} / {run} / {step}")
        write_text_atomic(marker, json.dumps({**record, "seconds": round(seconds, 1)}, indent=1) + "\n")
        self.executed.append(f"{run}/{step}")
        return marker.parent

    def evaluate(
        self, run: str, configs: Sequence[str], tag: str = "clean", overrides: Mapping[str, Any] | None = None
    ) -> dict[str, float]:
        """Evaluate ``run``'s ``models/model.pt`` with ``configs`` + ``evaluate.yaml`` into ``<run>/eval/<tag>``;
        returns the :data:`EXPERIMENT_METRICS` of its summary."""
        eval_dir = self.run_dir(run) / "eval" / tag
        self.step(run, f"eval_{tag}", [*configs, "evaluate.yaml"], self._eval_settings(run, tag, overrides))
        summary = read_summary(eval_dir)
        return {m: float(summary[m]) for m in EXPERIMENT_METRICS}

    def evaluated(
        self, run: str, configs: Sequence[str], tag: str = "clean", overrides: Mapping[str, Any] | None = None
    ) -> bool:
        """Whether :meth:`evaluate` with these arguments finished before (it would not run again)."""
        return self.is_done(run, f"eval_{tag}", [*configs, "evaluate.yaml"], self._eval_settings(run, tag, overrides))

    def network_facts(
        self, run: str, configs: Sequence[str], overrides: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """What the ``network_def`` of ``run`` (built from ``configs`` with :attr:`common` and ``overrides``, random
        weights) is: ``{"parameters": its parameter count, "norm": the names of its normalisation layer classes,
        comma-separated, or "none"}``, so that a table can name the size and normalisation of each model beside it."""
        settings, _, _ = self._record(run, "network", configs, overrides)
        network = bundle_parser(self.bundle, list(configs), settings).get_parsed_content("network_def", lazy=False)
        norms = sorted({type(m).__name__ for m in network.modules() if "Norm" in type(m).__name__})
        return {"parameters": sum(p.numel() for p in network.parameters()), "norm": ", ".join(norms) or "none"}

    def encoder_start(self, run: str) -> str:
        """Where the encoder of ``run``'s model started (:func:`encoder_start_text` of its ``models/model.pt``)."""
        return encoder_start_text(self.run_dir(run) / "models" / "model.pt")

    def _eval_settings(self, run: str, tag: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**dict(overrides or {}), "output_dir": str(self.run_dir(run) / "eval" / tag)}
