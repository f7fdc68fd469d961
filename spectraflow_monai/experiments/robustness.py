"""Robustness to distribution shift (SpectraFlow paper, Fig. 5): Dice, IoU and HD95 under corrupted test images.

SpectraFlow (Chen et al.) evaluates trained models on test images shifted by brightness, contrast, Gaussian blur and
Gaussian noise at increasing severity and reports how far each model falls from its clean score; its baseline is
U-Net++. Here both models are trained by the 2D bundle's Stage-2 config on the same data: SpectraFlow (Stage-1 then
Stage-2) and the baseline, U-Net++ with Zhou et al.'s widths and up-sampling and batch norm (the bundle's
``configs/unetpp_baseline.yaml``: widths 32-512, batch norm, ReLU, no dropout, 9.05 M parameters, deep supervision off
unless ``unetpp_deep_supervision`` is set; batch norm is a labelled deviation from Zhou et al.'s reference code, see
docs/method.md; any MONAI network through another override file). Extra arms (:data:`EXTRA_BASELINES`) are MONAI's 2D
UNet, the U-Net++ of MONAI's ``BasicUNetPlusPlus`` defaults (widths 32-256, instance norm, 2.41 M parameters) and
U-Net++ as Zhou et al.'s reference code builds it (no normalisation, dropout 0.5 after every convolution, L2 1e-4 on
the kernels under Adam, 9.04 M parameters). Each model is then evaluated by ``configs/evaluate.yaml`` once on the
clean test split and once per corruption and severity (``corruption`` / ``corruption_severity``,
:class:`~spectraflow_monai.transforms.Corruptiond`, applied in [0, 1] before normalisation). The table has mDSC, mIoU
and HD95 (MONAI's definition, a missed structure scored as the image diagonal) per model, corruption and severity, and
the change from clean; it names each baseline's parameters and normalisation.

Every model trains with the bundle's augmentation of its data set, on Kvasir-SEG (``colour_augmentation`` ``kvasir``
of ``configs/train.yaml``) a random gamma contrast (gamma 0.7-1.5, probability 0.3), an intensity scaling (x 0.85-1.15,
0.3) and a Gaussian blur (sigma 0.25-1 pixel, 0.1) beside the geometric transforms. Two of the four test corruptions
are of kinds seen in training: ``contrast`` (a linear contrast reduction, factor 0.4 to 0.05, where training applied
gamma changes) and ``gaussian_blur`` (sigma 1 at severity 1 is within the training range, 2-6 beyond it);
``brightness`` (an added offset) and ``gaussian_noise`` are not. All models see the same augmentation, so the
comparison between them is fair, but their drops under contrast and blur are not those of models trained without it.
``--override 'colour_augmentation#kvasir=[]'`` trains every model without it (geometric augmentation only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectraflow_monai.experiments.runner import (
    EXPERIMENT_METRICS,
    METRIC_HEADERS,
    SCALES,
    ExperimentRunner,
    experiment_settings,
    experiment_title,
    metric_cells,
    settings_text,
    write_csv,
)
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.utils.settings import CORRUPTION_KINDS, MAX_SEVERITY
from spectraflow_monai.visualize.utils import save_figure

__all__ = [
    "EXTRA_BASELINES",
    "ROBUSTNESS_BASELINE",
    "ROBUSTNESS_DATASET",
    "ROBUSTNESS_SCALES",
    "ROBUSTNESS_TITLE",
    "model_label",
    "robustness_markdown",
    "run_robustness",
]

#: the data set of the paper's Fig. 5 (a bundle ``dataset``) and its baseline, U-Net++ (a bundle config).
ROBUSTNESS_DATASET = "kvasir"
ROBUSTNESS_BASELINE = "unetpp_baseline.yaml"
#: optional extra arms: name -> bundle config merged over ``train.yaml`` (the command line's ``--extra-arms``): MONAI's
#: 2D UNet; U-Net++ at MONAI's ``BasicUNetPlusPlus`` defaults (the configuration this experiment used before it
#: followed Zhou et al.'s widths: 32-256, instance norm, LeakyReLU, 2.41 M parameters); U-Net++ as Zhou et al.'s
#: reference code builds it (no normalisation, dropout 0.5, L2 1e-4 on the convolution kernels under Adam, 9.04 M).
EXTRA_BASELINES: dict[str, str] = {
    "unet": "unet_baseline.yaml",
    "unetpp_monai": "unetpp_monai_baseline.yaml",
    "unetpp_zhou_literal": "unetpp_zhou_literal_baseline.yaml",
}
ROBUSTNESS_TITLE = "Robustness to distribution shift (paper Fig. 5)"

#: bundle overrides and severities of each scale: ``small`` finishes in tens of minutes on 2 CPU cores with a real
#: data set; ``paper`` keeps the bundle's own (the paper's) settings.
ROBUSTNESS_SCALES: dict[str, dict[str, Any]] = {
    "small": {"overrides": SCALES["small"], "severities": (1, 3, 5)},
    "paper": {"overrides": SCALES["paper"], "severities": tuple(range(1, MAX_SEVERITY + 1))},
}


def _check(kinds: Sequence[str], severities: Sequence[int]) -> None:
    bad = [k for k in kinds if k not in CORRUPTION_KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {list(CORRUPTION_KINDS)}, got {list(kinds)!r}.")
    if not severities or any(isinstance(s, bool) or not 1 <= int(s) <= MAX_SEVERITY for s in severities):
        raise ValueError(f"severities must be levels 1..{MAX_SEVERITY}, got {list(severities)!r}.")


def run_robustness(
    output: str | os.PathLike,
    data: Mapping[str, Any],
    scale: str = "small",
    kinds: Sequence[str] = CORRUPTION_KINDS,
    severities: Sequence[int] | None = None,
    baseline_config: str = ROBUSTNESS_BASELINE,
    overrides: Mapping[str, Any] | None = None,
    extra_baselines: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Train SpectraFlow and the baselines, evaluate each under every corruption; write the CSV, figure and report.

    Args:
        output: the experiment folder (``robustness/`` runs, ``robustness.csv``, ``robustness.png``, ``report.md``).
        data: the data settings of the bundle (``dataset``, ``dataset_dir``, ``data_list_file_path``, ...).
        scale: ``"small"`` or ``"paper"`` (:data:`ROBUSTNESS_SCALES`). Defaults to ``"small"``.
        kinds: corruptions (default all four of Fig. 5).
        severities: levels 1..5 (default: the scale's). Severity 0 is the clean evaluation, always run.
        baseline_config: a config of the bundle (or a path) merged over ``train.yaml`` to train the baseline (the
            model ``baseline``). Defaults to the paper's U-Net++ (``unetpp_baseline.yaml``).
        overrides: more bundle overrides of every step (they win over the scale's).
        extra_baselines: more arms, model name -> bundle config (e.g. :data:`EXTRA_BASELINES`), trained and evaluated
            as the baseline. Defaults to none.

    Returns:
        One row per model, corruption and severity (``clean`` / 0 included).
    """
    if scale not in ROBUSTNESS_SCALES:
        raise ValueError(f"scale must be one of {list(ROBUSTNESS_SCALES)}, got {scale!r}.")
    preset = ROBUSTNESS_SCALES[scale]
    severities = tuple(preset["severities"] if severities is None else severities)
    _check(kinds, severities)
    extra = dict(extra_baselines or {})
    clash = [name for name in extra if name in ("spectraflow", "baseline")]
    if clash or any(not isinstance(v, str) or not v for v in extra.values()):
        raise ValueError(f"extra_baselines must map new model names to bundle configs, got {extra!r}.")
    common = experiment_settings(data, preset["overrides"], overrides)
    runner = ExperimentRunner(output, "robustness", common)
    models = {"spectraflow": ["train.yaml"], "baseline": ["train.yaml", baseline_config]}
    models.update({name: ["train.yaml", config] for name, config in extra.items()})
    runner.step("spectraflow", "stage1", ["train.yaml", "train_stage1.yaml"])
    for name, configs in models.items():  # SpectraFlow's Stage-2 requires its Stage-1 export (never "auto")
        runner.step(name, "stage2", configs, {"encoder_init": "stage1"} if name == "spectraflow" else None)
    rows: list[dict[str, Any]] = []
    shifts = [("clean", 0)] + [(k, s) for k in kinds for s in severities]
    facts = {name: {**runner.network_facts(name, configs), "encoder_start": runner.encoder_start(name)}
             for name, configs in models.items()}  # fmt: skip
    for name, configs in models.items():
        clean: dict[str, float] = {}
        for kind, severity in shifts:
            tag = "clean" if kind == "clean" else f"{kind}_{severity}"
            corruption = None if kind == "clean" else kind
            scores = runner.evaluate(name, configs, tag, {"corruption": corruption, "corruption_severity": severity})
            row: dict[str, Any] = {"model": name, **facts[name], "corruption": kind, "severity": severity}
            for metric, value in scores.items():
                clean.setdefault(metric, value)
                row[metric] = value
                row[f"{metric}_change"] = value - clean[metric]  # mDSC falls, HD95 rises under a harmful shift
            rows.append(row)
    out = Path(output)
    write_csv(out / "robustness.csv", rows)
    labels = {name: model_label(name, configs[-1] if name != "spectraflow" else None, facts[name])
              for name, configs in models.items()}  # fmt: skip
    _plot(out / "robustness.png", rows, kinds, experiment_title(ROBUSTNESS_TITLE, common), labels)
    section = robustness_markdown(rows, scale, common, labels)
    write_text_atomic(out / "robustness.md", section)
    return rows


def model_label(name: str, config: str | None, facts: Mapping[str, Any]) -> str:
    """The name a table gives model ``name``: with its config (a baseline's), parameter count, normalisation and where
    its encoder started (``facts["encoder_start"]``, when known), e.g. ``baseline (unetpp_baseline; 9.05 M
    parameters; BatchNorm2d; encoder start none (no encoder))``."""
    parts = ([Path(config).stem] if config else []) + [f"{facts['parameters'] / 1e6:.2f} M parameters", facts["norm"]]
    parts += [f"encoder start {facts['encoder_start']}"] if facts.get("encoder_start") else []
    return f"{name} ({'; '.join(parts)})"


def _plot(
    path: Path, rows: Sequence[Mapping[str, Any]], kinds: Sequence[str], title: str, labels: Mapping[str, str]
) -> None:
    """mDSC against severity, one panel per corruption, one line per model (severity 0 = clean)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * len(kinds), 3))
    axes = fig.subplots(1, len(kinds), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        for model in dict.fromkeys(r["model"] for r in rows):
            mine = [r for r in rows if r["model"] == model and r["corruption"] in (kind, "clean")]
            pts = [(r["severity"], 100 * r["mDSC"]) for r in mine]
            ax.plot(*zip(*sorted(pts)), marker="o", label=labels.get(model, model))
        ax.set_title(kind.replace("_", " "))
        ax.set_xlabel("severity")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mDSC (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def robustness_markdown(
    rows: Sequence[Mapping[str, Any]],
    scale: str,
    settings: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
) -> str:
    """The report section: the table of mDSC / mIoU / HD95 and their change from clean per model, corruption, severity
    (``labels``: model -> the name the table shows, e.g. with its config)."""
    labels = dict(labels or {})
    lines = [
        f"## {experiment_title(ROBUSTNESS_TITLE, settings)}",
        "",
        settings_text(scale, settings),
        "",
        "| model | corruption | severity | "
        + " | ".join(f"{METRIC_HEADERS[m]} | change ({'px' if m.startswith('hd95') else 'points'})"
                     for m in EXPERIMENT_METRICS) + " |",  # fmt: skip
        "| --- | --- | ---: |" + " ---: | ---: |" * len(EXPERIMENT_METRICS),
    ]
    for r in rows:
        cells = [f"{value} | {change}" for value, change in zip(metric_cells(r), metric_cells(r, "_change"))]
        lines.append(f"| {labels.get(r['model'], r['model'])} | {r['corruption']} | {r['severity']} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    lines += ["", "![robustness](robustness.png)", ""]
    return "\n".join(lines)
