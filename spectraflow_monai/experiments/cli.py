"""``spectraflow experiment <name> [options]``: the paper's experiments as commands (see docs/experiments.md).

Each experiment runs the 2D bundle (every setting is a bundle override), skips steps that finished before (an
interrupted experiment resumes), and writes its CSV, figure and Markdown section into ``--output``, where
``report.md`` collects the sections of every experiment run there. The data set and the encoder weights default to
the paper's: the data set it ran the experiment on (:data:`PAPER_DATASETS`) and the bundle's encoder weights (the
official DINOv2 weights through timm); without access to them an experiment stops before training, naming
``--pretrained-weights`` and the ways forward. The scale does not: ``--scale`` defaults to ``small`` (112 px, Stage-1
2 epochs with EMA 0.9, Stage-2 up to 8 epochs; ``paper`` keeps the bundle's, the paper's, settings). ``--help`` of
every experiment names each default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from spectraflow_monai.experiments.ablations import (
    ABLATIONS,
    DISPERSIVE_WEIGHTS,
    dispersive_weight_ablation,
    run_ablation,
)
from spectraflow_monai.experiments.active_learning import (
    ACTIVE_LEARNING_SCALES,
    ACTIVE_LEARNING_STRATEGIES,
    run_active_learning,
)
from spectraflow_monai.experiments.low_data import LOW_DATA_DATASET, LOW_DATA_SCALES, run_low_data
from spectraflow_monai.experiments.robustness import (
    EXTRA_BASELINES,
    ROBUSTNESS_BASELINE,
    ROBUSTNESS_DATASET,
    ROBUSTNESS_SCALES,
    run_robustness,
)
from spectraflow_monai.experiments.runner import SCALES
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.utils.settings import CORRUPTION_KINDS, PRECISION_SETTINGS

__all__ = ["EXPERIMENTS", "PAPER_DATASETS", "build_parser", "main", "write_report"]

#: experiment name -> the Markdown section file it writes into ``--output`` (report order).
EXPERIMENTS: dict[str, str] = {
    "robustness": "robustness.md",
    "low-data": "low_data.md",
    **{name: f"{ablation.stem}.md" for name, ablation in ABLATIONS.items()},
    "figures": "figures.md",
    "active-learning": "active_learning.md",
}

#: experiment name -> the data set the paper ran it on (the default ``--dataset``): ISIC-2016 for Fig. 4, Tables 2-3
#: and the fine-tuning table, Kvasir-SEG for Fig. 5 and the lambda sweep; the figures reuse the ``stage1`` runs.
PAPER_DATASETS: dict[str, str] = {
    "robustness": ROBUSTNESS_DATASET,
    "low-data": LOW_DATA_DATASET,
    **{name: ablation.dataset for name, ablation in ABLATIONS.items()},
    "figures": ABLATIONS["stage1"].dataset,  # figures.FIGURES_DATASET: they reuse the stage1 runs
    "active-learning": ROBUSTNESS_DATASET,  # not a paper experiment: Kvasir-SEG, as the app's first 2D use
}
#: ablation stem -> its Stage-2 decoders other than the default (each writes ``<stem>_<decoder>_decoder.md``)
_DECODERS: dict[str, list[str]] = {a.stem: list(a.decoders)[1:] for a in ABLATIONS.values() if a.decoders}
#: the data sets whose files the command line needs (``--dataset-dir`` or ``--data-list-file-path``)
_SYNTHETIC = "synthetic"


def write_report(output: str | os.PathLike) -> Path:
    """``<output>/report.md``: the sections of the experiments that ran in ``output``, in :data:`EXPERIMENTS` order
    (an ablation's table under another Stage-2 decoder after its own)."""
    out = Path(output)
    names = [name for file in EXPERIMENTS.values()
             for name in (file, *(f"{file[:-3]}_{d}_decoder.md" for d in _DECODERS.get(file[:-3], ())))]  # fmt: skip
    parts = [(out / name).read_text() for name in names if (out / name).is_file()]
    path = out / "report.md"
    write_text_atomic(path, "# SpectraFlow experiments\n\n" + "\n".join(parts))
    return path


def _override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _common_options(
    parser: argparse.ArgumentParser, scales: Sequence[str], dataset: str, baseline: str | None = "unet_baseline.yaml"
) -> None:
    """The options every experiment shares: output, data (default: the paper's ``dataset``), scale, baseline (where it
    has one, default ``baseline``), weights, precision, overrides."""
    parser.add_argument("--output", required=True, metavar="DIR", help="experiment folder (runs, CSV, PNG, report.md)")
    parser.add_argument("--dataset", default=dataset,
                        help=f"bundle dataset (default {dataset}, the paper's): kvasir | isic2016 | glas | folder | "
                             "synthetic (generated into <output>/data)")
    parser.add_argument("--dataset-dir", help="bundle dataset_dir (default none; for synthetic <output>/data)")
    parser.add_argument("--data-list-file-path",
                        help="a Decathlon datalist JSON (the bundle's data_list_file_path; default none)")
    parser.add_argument("--scale", default="small", choices=sorted(scales), help=_scale_help(scales))
    if baseline:
        parser.add_argument("--baseline-config", default=baseline,
                            help="bundle config (or path) merged over train.yaml for the baseline "
                                 f"(default {baseline})")  # fmt: skip
    parser.add_argument("--pretrained-weights", default=None, metavar="WEIGHTS",
                        help="the bundle's pretrained_weights: default the bundle's (timm: the paper's DINOv2 weights "
                             "from timm's hub), a DINOv2 checkpoint file, or none (random initialisation: every table "
                             "and figure title says so)")
    parser.add_argument("--precision", default="auto", choices=PRECISION_SETTINGS,
                        help=f"the bundle's precision: {' | '.join(PRECISION_SETTINGS)} (default auto)")
    parser.add_argument("--override", action="append", type=_override, default=[], metavar="KEY=VALUE",
                        help="any other bundle override of every step, e.g. --override max_epochs=20 (YAML values; "
                             "default none)")  # fmt: skip


def _scale_help(scales: Mapping[str, Mapping[str, Any]]) -> str:
    """The help of ``--scale``: the default (``small``) and what each scale sets (its bundle overrides and the
    experiment's own levels, e.g. severities or fractions)."""
    parts = []
    for name, preset in scales.items():
        overrides, levels = (preset["overrides"], {k: v for k, v in preset.items() if k != "overrides"}) \
            if "overrides" in preset else (preset, {})  # fmt: skip
        items = [f"{k} {v}" for k, v in overrides.items()] or ["the bundle's settings: the paper's 224 px, epochs, EMA"]
        items += [f"{k} {' '.join(map(str, v)) if isinstance(v, (list, tuple)) else ('all' if v is None else v)}"
                  for k, v in levels.items()]
        parts.append(f"{name}: {', '.join(items)}")
    return "default small; " + "; ".join(parts)


def _data(args: argparse.Namespace, output: str) -> dict:
    data = {"dataset": args.dataset, "precision": args.precision}
    if args.pretrained_weights is not None:  # else the bundle's default
        data["pretrained_weights"] = args.pretrained_weights
    if args.dataset_dir or args.dataset == _SYNTHETIC:
        data["dataset_dir"] = os.path.abspath(args.dataset_dir or os.path.join(output, "data"))
    if args.data_list_file_path:
        data["data_list_file_path"] = os.path.abspath(args.data_list_file_path)
    return data


def build_parser(
    prog: str = "spectraflow experiment",
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser and its sub-parsers by experiment name (every option's help names its default)."""
    parser = argparse.ArgumentParser(prog=prog, description="Run one of the paper's experiments with the 2D bundle.")
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    subs: dict[str, argparse.ArgumentParser] = {}
    rob = subs["robustness"] = sub.add_parser("robustness", prog=f"{prog} robustness",
                         help="Dice / IoU / HD95 under brightness, contrast, blur and noise shifts (paper Fig. 5)")
    _common_options(rob, ROBUSTNESS_SCALES, PAPER_DATASETS["robustness"], ROBUSTNESS_BASELINE)
    rob.add_argument("--extra-arms", nargs="+", default=[], choices=sorted(EXTRA_BASELINES), metavar="ARM",
                     help="more models trained and evaluated like the baseline (default none): "
                          + ", ".join(f"{k} ({v})" for k, v in EXTRA_BASELINES.items()))
    rob.add_argument("--kinds", nargs="+", default=list(CORRUPTION_KINDS), choices=CORRUPTION_KINDS,
                     help="corruptions (default: all four)")
    rob.add_argument("--severities", nargs="+", type=int, help="levels 1..5 (default: the scale's)")
    low = subs["low-data"] = sub.add_parser("low-data", prog=f"{prog} low-data",
                         help="Dice / IoU / HD95 with 10 / 20 / 50 / 100 %% of the training images (paper Fig. 4)")
    _common_options(low, LOW_DATA_SCALES, PAPER_DATASETS["low-data"])
    low.add_argument("--fractions", nargs="+", type=float, help="training fractions in (0, 1] (default 0.1 0.2 0.5 1)")
    for name, ablation in ABLATIONS.items():
        abl = subs[name] = sub.add_parser(name, prog=f"{prog} {name}", help=f"{ablation.title}: one row per arm")
        _common_options(abl, SCALES, PAPER_DATASETS[name], baseline=None)
        abl.add_argument("--arms", nargs="+", choices=[arm.name for arm in ablation.arms], metavar="ARM",
                         help="run only these arms (default all): "
                              + " ".join(arm.name for arm in ablation.arms))  # fmt: skip
        if ablation.decoders:
            default = next(iter(ablation.decoders))
            abl.add_argument("--decoder", default=default, choices=list(ablation.decoders),
                             help=f"the arms' Stage-2 decoder (default {default}, the paper's Table 2): "
                                  + " | ".join(f"{k} ({', '.join(f'{a} {b}' for a, b in v.items())})"
                                               for k, v in ablation.decoders.items()))  # fmt: skip
        if name == "dispersive-weight":
            abl.add_argument("--weights", nargs="+", type=float, default=list(DISPERSIVE_WEIGHTS),
                             help="lambda values (default 0.2 0.4 0.6 0.8 1.0)")
    fig = subs["figures"] = sub.add_parser("figures", prog=f"{prog} figures",
                         help="t-SNE of Stage-1 features, DAF gates, error spectra, predictions (Figs. 1d, 3, 6, 7)")
    _common_options(fig, SCALES, PAPER_DATASETS["figures"])
    fig.add_argument("--num-images", type=int, default=4, help="test images in the gate and panel figures (default 4)")
    al = subs["active-learning"] = sub.add_parser("active-learning", prog=f"{prog} active-learning",
                        help="simulated labelling: mDSC / mIoU against labelled images, uncertainty vs random")
    _common_options(al, ACTIVE_LEARNING_SCALES, PAPER_DATASETS["active-learning"], baseline=None)
    al.add_argument("--strategies", nargs="+", default=list(ACTIVE_LEARNING_STRATEGIES),
                    choices=ACTIVE_LEARNING_STRATEGIES, help="selection strategies (default: random uncertainty)")
    al.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="one arm per strategy and seed (default 0 1)")
    small = ACTIVE_LEARNING_SCALES["small"]
    for option, what in (("initial", "labelled images before the first round"), ("query", "images labelled per round"),
                         ("rounds", "rounds of selection"), ("pool-size", "training images in the unlabelled pool"),
                         ("val-size", "validation images that pick each round's checkpoint")):  # fmt: skip
        key = option.replace("-", "_")
        al.add_argument(f"--{option}", type=int, default=None,
                        help=f"{what} (default: the scale's; small {small[key]}, full "
                             f"{ACTIVE_LEARNING_SCALES['full'][key] or 'all'})")  # fmt: skip
    return parser, subs


def main(argv: Sequence[str] | None = None, prog: str = "spectraflow experiment") -> int:
    """Run one experiment; returns 0 (bad options exit with status 2 and a message)."""
    parser, subs = build_parser(prog)
    args = parser.parse_args(argv)
    if args.experiment == "dispersive-weight":
        try:
            ablation = dispersive_weight_ablation(args.weights)
        except ValueError as err:
            parser.error(f"--weights: {err}")
    name = args.experiment
    if args.dataset != _SYNTHETIC and not (args.dataset_dir or args.data_list_file_path):
        subs[name].error(
            f"--dataset {args.dataset} needs its files: give --dataset-dir (or --data-list-file-path). The paper ran "
            f"{name} on {PAPER_DATASETS[name]} (the default --dataset); --dataset synthetic runs it on a generated set."
        )
    output = os.path.abspath(args.output)
    data, overrides = _data(args, output), dict(args.override)
    try:
        if name == "robustness":
            extra = {arm: EXTRA_BASELINES[arm] for arm in args.extra_arms}
            rows = run_robustness(output, data, args.scale, args.kinds, args.severities, args.baseline_config,
                                  overrides, extra)  # fmt: skip
        elif name == "active-learning":
            budget = {k: getattr(args, k) for k in ("initial", "query", "rounds", "pool_size", "val_size")
                      if getattr(args, k) is not None}  # fmt: skip
            rows = run_active_learning(output, data, args.scale, args.strategies, args.seeds, budget, overrides)
        elif name == "low-data":
            rows = run_low_data(output, data, args.scale, args.fractions, args.baseline_config, overrides)
        elif name == "figures":
            from spectraflow_monai.experiments.figures import run_figures  # torch, MONAI: not for --help

            result = run_figures(output, data, args.scale, args.baseline_config, overrides, num_images=args.num_images)
            rows = list(result["files"].values())
        else:
            rows = run_ablation(output, ablation if name == "dispersive-weight" else name, data, args.scale,
                                overrides, args.arms, getattr(args, "decoder", None))  # fmt: skip
    except SettingError as err:  # raised before any training (EncoderWeightsError, a budget that cannot be met)
        subs[name].exit(2, f"{subs[name].prog}: error: {err}\n")
    report = write_report(output)
    print(f"{name}: {len(rows)} {'figures' if name == 'figures' else 'evaluations'}; report {report}")
    return 0
