"""The paper's ablation tables as experiments: Stage-1 variants, decoder design, fine-tuning depth and the lambda sweep.

SpectraFlow (Chen et al.) ablates its two stages on ISIC-2016: the Stage-1 objective (Table 2: no Stage-1 from the
official DINOv2 weights, image-only MeanFlow, mixed-domain MAE, mixed-domain MeanFlow, + dispersive loss), the decoder
(Table 3: concat or DAF fusion, each with a standard, CBAM or FDConv refinement, on the encoder of Table 2's last row)
and how much of the encoder Stage-2 trains (appendix table: frozen, last block, all blocks); the weight lambda of the
dispersive loss (appendix figure: 0.2 to 1.0) is swept on Kvasir-SEG. :attr:`Ablation.dataset` names the paper's
data set of each (the command line's default ``--dataset``). Each ablation is a list of :class:`Arm` s, each arm a run
of the 2D bundle (Stage-1 when it has one, then Stage-2, then the clean evaluation), so every difference between two
rows of a table is a bundle override that the report names.

Table 2 measures the Stage-1 objectives under Table 3's *baseline* decoder: its last row (88.62 / 80.55 / 17.24) is
Table 3's "Baseline" row digit for digit, concat fusion with the standard refinement block ("the Baseline in Table 3
corresponds to this pretrained encoder"). Every ``stage1`` arm therefore trains Stage-2 with ``fusion: concat``,
``refine: standard`` (:data:`STAGE1_DECODERS` ``"baseline"``); ``decoder="full"`` runs the same objectives under
SpectraFlow's full DAF + FDConv decoder instead (not the paper's Table 2), its Stage-2 runs beside the Stage-1 runs
(``<arm>_full_decoder``, loading the arm's Stage-1 export) and its files named ``stage1_full_decoder.*``.

The ``stage1`` ablation has one row the paper does not: ``paper_literal``, the default Stage-1 with eqs. 1, 3 and 5
as printed (:data:`PAPER_LITERAL_STAGE1`: no latent normalisation, no adaptive MeanFlow weight, raw squared distances
in the dispersive loss, and eq. 3's expectation over t > s: every row has s < t), beside ``mixed_meanflow_dispersive``
(the bundle's defaults, which extend all three and keep s = t in 75 % of the rows, as MeanFlow does).

Arms that differ only after Stage-1 (the decoder and fine-tuning tables) load one shared Stage-1 export (the run
``stage1``), as the paper's rows share one pretrained encoder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from spectraflow_monai.visualize.utils import save_figure

__all__ = [
    "ABLATIONS",
    "DISPERSIVE_WEIGHTS",
    "PAPER_LITERAL_STAGE1",
    "STAGE1_CONFIGS",
    "STAGE1_DECODERS",
    "Ablation",
    "Arm",
    "ablation_markdown",
    "dispersive_weight_ablation",
    "run_ablation",
    "stage2_run",
]

#: the bundle configs of the MeanFlow Stage-1 (merged after ``train.yaml``).
STAGE1_CONFIGS: tuple[str, ...] = ("train.yaml", "train_stage1.yaml")
#: the lambda values of the paper's dispersive-weight figure.
DISPERSIVE_WEIGHTS: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
#: the run whose Stage-1 export the arms with ``shared_stage1`` load.
SHARED_STAGE1_RUN = "stage1"
#: the Stage-1 bundle settings of the paper-literal objective, eqs. 1, 3 and 5 as printed: the raw final token map as
#: z0 (no latent normalisation), the plain per-sample squared error of eq. 3 (adaptive weight power 0) over eq. 3's
#: expectation over t > s (``meanflow_ratio_unequal`` 1.0: every row has s < t; the bundle's default, MeanFlow's 0.25,
#: sets s = t in 75 % of the rows) and the raw squared distances of eq. 5. Times are MeanFlow's in both: two draws of
#: the logit-normal sigmoid(N(-0.4, 1)), t the larger and s the smaller. The one guard that keeps it finite is eq. 5's
#: own epsilon (1e-8), with the log-mean-exp evaluated in log space (``DispersiveLoss``): raw distances of ViT features
#: underflow ``exp``, and the term then sits at ``log(eps)`` with a zero gradient instead of ``log(0)``. Nothing clips
#: or rescales the MeanFlow error; a non-finite loss stops the run (``StopOnNonFiniteLoss``).
PAPER_LITERAL_STAGE1: dict[str, Any] = {
    "latent_norm": False,
    "meanflow_adaptive_p": 0.0,
    "meanflow_ratio_unequal": 1.0,
    "dispersive_normalize": None,
}
#: the Stage-2 decoders the ``stage1`` ablation can train (bundle overrides): ``baseline``, the concat + standard
#: decoder of Table 3's "Baseline" row, which is Table 2's last row (the paper's Table 2); ``full``, SpectraFlow's
#: DAF + FDConv decoder (Table 3's "Full" row; the bundle's default, not the paper's Table 2). The first is the arms'.
STAGE1_DECODERS: dict[str, dict[str, str]] = {
    "baseline": {"fusion": "concat", "refine": "standard"},
    "full": {"fusion": "daf", "refine": "fdconv"},
}


@dataclass(frozen=True)
class Arm:
    """One row of an ablation table.

    Args:
        name: the row's name (its run folder).
        stage2: bundle overrides of its Stage-2 and evaluation.
        stage1: the bundle configs of its own Stage-1; ``None``: no Stage-1 of its own (the row either starts from
            ``pretrained_weights``, ``encoder_init: pretrained``, or loads the shared Stage-1, ``shared_stage1``).
        stage1_overrides: bundle overrides of its Stage-1.
        shared_stage1: load the export of the experiment's one shared Stage-1 run (default configs).
        value: the row's x value in a sweep figure (e.g. lambda), ``None`` for a categorical table.
    """

    name: str
    stage2: Mapping[str, Any] = field(default_factory=dict)
    stage1: tuple[str, ...] | None = STAGE1_CONFIGS
    stage1_overrides: Mapping[str, Any] = field(default_factory=dict)
    shared_stage1: bool = False
    value: float | None = None


@dataclass(frozen=True)
class Ablation:
    """An ablation: its title (the paper's table or figure), the CSV/PNG/Markdown file stem, its arms, the x axis of a
    sweep (``None``: bars for a categorical table), the data set the paper ran it on (a bundle ``dataset``) and the
    Stage-2 decoders its arms can be trained with."""

    title: str
    stem: str
    arms: tuple[Arm, ...]
    x_label: str | None = None
    dataset: str = "isic2016"
    decoders: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Stage-2 decoders the arms can be trained with (name -> bundle overrides; the first is the default, the one
    the arms name); empty: the arms' own Stage-2 settings only."""


def _decoder_arms() -> tuple[Arm, ...]:
    return tuple(
        Arm(f"{fusion}_{refine}", {"fusion": fusion, "refine": refine}, stage1=None, shared_stage1=True)
        for fusion in ("concat", "daf")
        for refine in ("standard", "cbam", "fdconv")
    )


def dispersive_weight_ablation(weights: Sequence[float]) -> Ablation:
    """The lambda sweep (paper appendix) at ``weights`` (each a number >= 0), one Stage-1 + Stage-2 run per value."""
    if not weights or any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in weights):
        raise ValueError(f"weights must be non-negative numbers, got {list(weights)!r}.")
    arms = tuple(Arm(f"lambda_{w:g}", stage1_overrides={"dispersive_weight": float(w)}, value=float(w))
                 for w in weights)  # fmt: skip
    return Ablation("Dispersive loss weight lambda (paper appendix)", "dispersive_weight", arms,
                    x_label="dispersive weight lambda", dataset="kvasir")  # fmt: skip


def _stage1_arms() -> tuple[Arm, ...]:
    """Table 2's rows (and ``paper_literal``), each training Stage-2 with Table 3's baseline decoder."""
    decoder = STAGE1_DECODERS["baseline"]
    return (
        Arm("no_stage1", {"encoder_init": "pretrained", **decoder}, stage1=None),
        Arm("image_meanflow", decoder, stage1_overrides={"mask_ratio": 0.0, "dispersive_weight": 0.0}),
        Arm("mixed_mae", decoder, stage1_overrides={"stage1_objective": "mae"}),
        Arm("mixed_meanflow", decoder, stage1_overrides={"dispersive_weight": 0.0}),
        Arm("mixed_meanflow_dispersive", decoder),
        Arm("paper_literal", decoder, stage1_overrides=PAPER_LITERAL_STAGE1),
    )


#: experiment name -> its :class:`Ablation` (``dispersive-weight`` at the paper's lambda values).
ABLATIONS: dict[str, Ablation] = {
    "stage1": Ablation(
        "Stage-1 objective (paper Table 2)",
        "stage1",
        _stage1_arms(),
        decoders=STAGE1_DECODERS,
    ),
    "decoder": Ablation("Decoder design (paper Table 3)", "decoder", _decoder_arms()),
    "finetune": Ablation(
        "Fine-tuning depth (paper appendix)",
        "finetune",
        (
            Arm("frozen", {"trainable_blocks": 0}, stage1=None, shared_stage1=True),
            Arm("last_block", {"trainable_blocks": 1}, stage1=None, shared_stage1=True),
            Arm("full", {"trainable_blocks": "all"}, stage1=None, shared_stage1=True),
        ),
    ),
    "dispersive-weight": dispersive_weight_ablation(DISPERSIVE_WEIGHTS),
}


def _default_decoder(ablation: Ablation) -> str | None:
    return next(iter(ablation.decoders), None)


def _check_decoder(ablation: Ablation, decoder: str | None) -> str | None:
    """``decoder`` if ``ablation`` offers it (None: the arms' own); ValueError naming it otherwise."""
    if decoder is None or decoder in ablation.decoders:
        return decoder
    if not ablation.decoders:
        raise ValueError(f"decoder must be None for the {ablation.stem!r} ablation (its arms keep their own decoder), "
                         f"got {decoder!r}.")  # fmt: skip
    raise ValueError(f"decoder must be one of {list(ablation.decoders)}, got {decoder!r}.")


def stage2_run(
    runner: ExperimentRunner, ablation: Ablation, arm: Arm, decoder: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The run (folder) and the Stage-2 / evaluation overrides of ``arm`` of ``ablation`` trained with ``decoder``.

    Args:
        runner: the runner of the ablation's runs.
        ablation: the ablation ``arm`` belongs to.
        arm: the row.
        decoder: a name of :attr:`Ablation.decoders`; None or the first (the default): the arm's own settings in the
            arm's own run. Another decoder trains Stage-2 in the run ``<arm>_<decoder>_decoder`` with the decoder's
            overrides, loading the arm's Stage-1 export (the Stage-1 runs are shared).

    Returns:
        ``(run, overrides)``: an arm with ``shared_stage1`` loads the export of the ablation's shared Stage-1 run;
        every arm with a Stage-1 (its own or the shared one) sets ``encoder_init: stage1``, so that a missing export
        stops the run instead of training the "no Stage-1" row under the arm's name.

    Raises:
        ValueError: ``ablation`` does not offer ``decoder``.
    """
    decoder = _check_decoder(ablation, decoder)
    settings = dict(arm.stage2)
    if arm.shared_stage1 or arm.stage1 is not None:  # a row that means Stage-1 requires its export, never "auto"
        settings.setdefault("encoder_init", "stage1")
    if arm.shared_stage1:
        settings = {"stage1_encoder": str(runner.run_dir(SHARED_STAGE1_RUN) / "models" / "encoder_stage1.pt"),
                    **settings}  # fmt: skip
    if decoder is None or decoder == _default_decoder(ablation):
        return arm.name, settings
    settings.update(ablation.decoders[decoder])
    if arm.stage1 is not None:
        settings["stage1_encoder"] = str(runner.run_dir(arm.name) / "models" / "encoder_stage1.pt")
    return f"{arm.name}_{decoder}_decoder", settings


def _files_stem(ablation: Ablation, decoder: str | None) -> str:
    default = decoder is None or decoder == _default_decoder(ablation)
    return ablation.stem if default else f"{ablation.stem}_{decoder}_decoder"


def run_ablation(
    output: str | os.PathLike,
    ablation: str | Ablation,
    data: Mapping[str, Any],
    scale: str = "small",
    overrides: Mapping[str, Any] | None = None,
    arms: Sequence[str] | None = None,
    decoder: str | None = None,
) -> list[dict[str, Any]]:
    """Train and evaluate the arms of ``ablation``; write ``<stem>.csv``, ``<stem>.png`` and ``<stem>.md``.

    Args:
        output: the experiment folder (runs under ``<output>/<stem>/``).
        ablation: a name of :data:`ABLATIONS` or an :class:`Ablation`.
        data: the data settings of the bundle (``dataset``, ``dataset_dir``, ``data_list_file_path``, ...).
        scale: ``"small"`` or ``"paper"`` (:data:`~spectraflow_monai.experiments.runner.SCALES`). Defaults to
            ``"small"``.
        overrides: more bundle overrides of every step (they win over the scale's).
        arms: names of the arms to run, in the ablation's order (default: all).
        decoder: the Stage-2 decoder of the arms, a name of :attr:`Ablation.decoders` (``stage1``: ``"baseline"``,
            concat + standard, the paper's Table 2, or ``"full"``, DAF + FDConv; :data:`STAGE1_DECODERS`). Defaults
            to None: the arms' own. A decoder other than the default writes ``<stem>_<decoder>_decoder.*``.

    Returns:
        One row per arm: ``arm``, ``value``, ``encoder_start`` (where its encoder started, read from its
        ``models/model.json``) and the :data:`~spectraflow_monai.experiments.runner.EXPERIMENT_METRICS`.

    Raises:
        ValueError: an unknown ``ablation``, ``scale``, ``arms`` entry or ``decoder``.
    """
    if isinstance(ablation, str):
        if ablation not in ABLATIONS:
            raise ValueError(f"ablation must be one of {list(ABLATIONS)}, got {ablation!r}.")
        ablation = ABLATIONS[ablation]
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}.")
    decoder = _check_decoder(ablation, decoder)
    if arms is not None:
        names = [arm.name for arm in ablation.arms]
        unknown = [a for a in arms if a not in names]
        if unknown or not arms:
            raise ValueError(f"arms must be a non-empty subset of {names}, got {list(arms)!r}.")
        ablation = replace(ablation, arms=tuple(arm for arm in ablation.arms if arm.name in arms))
    common = experiment_settings(data, SCALES[scale], overrides)
    runner = ExperimentRunner(output, ablation.stem, common)
    if any(arm.shared_stage1 for arm in ablation.arms):
        runner.step(SHARED_STAGE1_RUN, "stage1", list(STAGE1_CONFIGS))
    rows: list[dict[str, Any]] = []
    for arm in ablation.arms:
        if arm.stage1 is not None:
            runner.step(arm.name, "stage1", list(arm.stage1), arm.stage1_overrides)
        run, settings = stage2_run(runner, ablation, arm, decoder)
        runner.step(run, "stage2", ["train.yaml"], settings)
        scores = runner.evaluate(run, ["train.yaml"], "clean", settings)
        rows.append({"arm": arm.name, "value": arm.value, "encoder_start": runner.encoder_start(run), **scores})
    out, stem = Path(output), _files_stem(ablation, decoder)
    write_csv(out / f"{stem}.csv", rows)
    _plot(out / f"{stem}.png", rows, ablation, experiment_title(_title(ablation, decoder), common))
    write_text_atomic(out / f"{stem}.md", ablation_markdown(rows, ablation, scale, common, decoder))
    return rows


def _title(ablation: Ablation, decoder: str | None) -> str:
    """The table's title; a decoder other than the default is named in it."""
    if decoder is None or decoder == _default_decoder(ablation):
        return ablation.title
    names = ", ".join(f"{k} {v}" for k, v in ablation.decoders[decoder].items())
    return f"{ablation.title}, Stage-2 decoder {decoder} ({names})"


def _plot(path: Path, rows: Sequence[Mapping[str, Any]], ablation: Ablation, title: str) -> None:
    """mDSC per arm: bars for a table, a line against the swept value for a sweep."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(3.6, 0.9 * len(rows) + 1.5), 3.2))
    ax = fig.subplots()
    dice = [100 * r["mDSC"] for r in rows]
    if ablation.x_label:
        ax.plot([r["value"] for r in rows], dice, marker="o")
        ax.set_xlabel(ablation.x_label)
    else:
        ax.bar(range(len(rows)), dice, color="tab:blue")
        ax.set_xticks(range(len(rows)), [r["arm"].replace("_", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("mDSC (%)")
    fig.suptitle(title, fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save_figure(fig, path)


def ablation_markdown(
    rows: Sequence[Mapping[str, Any]],
    ablation: Ablation,
    scale: str,
    settings: Mapping[str, Any],
    decoder: str | None = None,
) -> str:
    """The report section: one row per arm with what sets it apart (its overrides, the Stage-2 decoder included),
    where its encoder started (``encoder_start``), mDSC, mIoU and HD95 (``decoder``: that of :func:`run_ablation`)."""
    arms = {arm.name: arm for arm in ablation.arms}
    extra = {} if decoder is None or decoder == _default_decoder(ablation) else dict(ablation.decoders[decoder])
    stem = _files_stem(ablation, decoder)
    lines = [
        f"## {experiment_title(_title(ablation, decoder), settings)}",
        "",
        settings_text(scale, settings),
        "",
        "| arm | Stage-1 | encoder start | Stage-2 overrides | "
        + " | ".join(METRIC_HEADERS[m] for m in EXPERIMENT_METRICS) + " |",
        "| --- | --- | --- | --- |" + " ---: |" * len(EXPERIMENT_METRICS),
    ]
    for r in rows:
        arm = arms[r["arm"]]
        shown = _overrides_text({**arm.stage2, **extra})
        start = r.get("encoder_start", "not recorded")
        lines.append(f"| {arm.name} | {_stage1_text(arm)} | {start} | {shown} | " + " | ".join(metric_cells(r)) + " |")
    return "\n".join([*lines, "", f"![{stem}]({stem}.png)", ""])


def _overrides_text(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in overrides.items()) or "-"


def _stage1_text(arm: Arm) -> str:
    if arm.shared_stage1:
        return "shared (default Stage-1)"
    if arm.stage1 is None:
        return "none"
    parts = [f"`{c}`" for c in arm.stage1 if c not in STAGE1_CONFIGS]
    if dict(arm.stage1_overrides) == PAPER_LITERAL_STAGE1:
        parts.append("eqs. 1, 3, 5 as printed (t > s in every row)")
    if arm.stage1_overrides:
        parts.append(_overrides_text(arm.stage1_overrides))
    return ", ".join(parts) or "default (MeanFlow + dispersive)"
