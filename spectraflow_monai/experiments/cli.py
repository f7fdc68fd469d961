"""``spectraflow experiment <name> [options]``: the paper's experiments as commands (see docs/experiments.md).

Each experiment runs the 2D bundle (every setting is a bundle override), skips steps that finished before (an
interrupted experiment resumes), and writes its CSV, figure and Markdown section into ``--output``, where
``report.md`` collects the sections of every experiment run there.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from spectraflow_monai.experiments.ablations import (
    ABLATIONS,
    DISPERSIVE_WEIGHTS,
    dispersive_weight_ablation,
    run_ablation,
)
from spectraflow_monai.experiments.low_data import LOW_DATA_SCALES, run_low_data
from spectraflow_monai.experiments.robustness import ROBUSTNESS_SCALES, run_robustness
from spectraflow_monai.experiments.runner import SCALES
from spectraflow_monai.utils.files import write_text_atomic
from spectraflow_monai.utils.settings import CORRUPTION_KINDS

__all__ = ["EXPERIMENTS", "main", "write_report"]

#: experiment name -> the Markdown section file it writes into ``--output`` (report order).
EXPERIMENTS: dict[str, str] = {
    "robustness": "robustness.md",
    "low-data": "low_data.md",
    **{name: f"{ablation.stem}.md" for name, ablation in ABLATIONS.items()},
    "figures": "figures.md",
}


def write_report(output: str | os.PathLike) -> Path:
    """``<output>/report.md``: the sections of the experiments that ran in ``output``, in :data:`EXPERIMENTS` order."""
    out = Path(output)
    parts = [(out / name).read_text() for name in EXPERIMENTS.values() if (out / name).is_file()]
    path = out / "report.md"
    write_text_atomic(path, "# SpectraFlow experiments\n\n" + "\n".join(parts))
    return path


def _override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _common_options(parser: argparse.ArgumentParser, scales: Sequence[str], baseline: bool = True) -> None:
    """The options every experiment shares: output, data, scale, baseline (where it has one), weights, precision,
    overrides."""
    parser.add_argument("--output", required=True, metavar="DIR", help="experiment folder (runs, CSV, PNG, report.md)")
    parser.add_argument("--dataset", default="synthetic",
                        help="bundle dataset: synthetic (default) | kvasir | isic2016 | glas | folder")
    parser.add_argument("--dataset-dir", help="bundle dataset_dir (default for synthetic: <output>/data)")
    parser.add_argument("--data-list-file-path", help="a Decathlon datalist JSON (the bundle's data_list_file_path)")
    parser.add_argument("--scale", default="small", choices=sorted(scales),
                        help="small (minutes to an hour on 2 CPU cores) or paper (the bundle's settings)")
    if baseline:
        parser.add_argument("--baseline-config", default="unet_baseline.yaml",
                            help="bundle config (or path) merged over train.yaml for the baseline (default MONAI UNet)")
    parser.add_argument("--pretrained-weights", default="none",
                        help="the bundle's pretrained_weights: none (default here), timm, or a DINOv2 checkpoint file")
    parser.add_argument("--precision", default="auto", help="the bundle's precision: auto | bf16 | fp16 | fp32")
    parser.add_argument("--override", action="append", type=_override, default=[], metavar="KEY=VALUE",
                        help="any other bundle override, e.g. --override max_epochs=20 (YAML values)")  # fmt: skip


def _data(args: argparse.Namespace, output: str) -> dict:
    data = {"dataset": args.dataset, "pretrained_weights": args.pretrained_weights, "precision": args.precision}
    if args.dataset_dir or args.dataset == "synthetic":
        data["dataset_dir"] = os.path.abspath(args.dataset_dir or os.path.join(output, "data"))
    if args.data_list_file_path:
        data["data_list_file_path"] = os.path.abspath(args.data_list_file_path)
    return data


def main(argv: Sequence[str] | None = None, prog: str = "spectraflow experiment") -> int:
    """Run one experiment; returns 0 (bad options exit with status 2 and a message)."""
    parser = argparse.ArgumentParser(prog=prog, description="Run one of the paper's experiments with the 2D bundle.")
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    rob = sub.add_parser("robustness", prog=f"{prog} robustness",
                         help="Dice / HD95 under brightness, contrast, blur and noise shifts (paper Fig. 5)")
    _common_options(rob, ROBUSTNESS_SCALES)
    rob.add_argument("--kinds", nargs="+", default=list(CORRUPTION_KINDS), choices=CORRUPTION_KINDS,
                     help="corruptions (default: all four)")
    rob.add_argument("--severities", nargs="+", type=int, help="levels 1..5 (default: the scale's)")
    low = sub.add_parser("low-data", prog=f"{prog} low-data",
                         help="Dice / HD95 with 10 / 20 / 50 / 100 %% of the training images (paper Fig. 4)")
    _common_options(low, LOW_DATA_SCALES)
    low.add_argument("--fractions", nargs="+", type=float, help="training fractions in (0, 1] (default 0.1 0.2 0.5 1)")
    for name, ablation in ABLATIONS.items():
        abl = sub.add_parser(name, prog=f"{prog} {name}", help=f"{ablation.title}: one row per arm")
        _common_options(abl, SCALES, baseline=False)
        abl.add_argument("--arms", nargs="+", choices=[arm.name for arm in ablation.arms], metavar="ARM",
                         help="run only these arms: " + " ".join(arm.name for arm in ablation.arms))  # fmt: skip
        if name == "dispersive-weight":
            abl.add_argument("--weights", nargs="+", type=float, default=list(DISPERSIVE_WEIGHTS),
                             help="lambda values (default 0.2 0.4 0.6 0.8 1.0)")
    fig = sub.add_parser("figures", prog=f"{prog} figures",
                         help="t-SNE of Stage-1 features, DAF gates, error spectra, predictions (Figs. 1d, 3, 6, 7)")
    _common_options(fig, SCALES)
    fig.add_argument("--num-images", type=int, default=4, help="test images in the gate and panel figures (default 4)")
    args = parser.parse_args(argv)
    if args.experiment == "dispersive-weight":
        try:
            ablation = dispersive_weight_ablation(args.weights)
        except ValueError as err:
            parser.error(f"--weights: {err}")
    output = os.path.abspath(args.output)
    data, overrides = _data(args, output), dict(args.override)
    name = args.experiment
    if name == "robustness":
        rows = run_robustness(output, data, args.scale, args.kinds, args.severities, args.baseline_config, overrides)
    elif name == "low-data":
        rows = run_low_data(output, data, args.scale, args.fractions, args.baseline_config, overrides)
    elif name == "figures":
        from spectraflow_monai.experiments.figures import run_figures  # torch, MONAI: not for --help

        result = run_figures(output, data, args.scale, args.baseline_config, overrides, num_images=args.num_images)
        rows = list(result["files"].values())
    else:
        rows = run_ablation(output, ablation if name == "dispersive-weight" else name, data, args.scale, overrides,
                            args.arms)  # fmt: skip
    report = write_report(output)
    print(f"{name}: {len(rows)} {'figures' if name == 'figures' else 'evaluations'}; report {report}")
    return 0
