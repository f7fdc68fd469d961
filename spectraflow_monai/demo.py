"""The embedded demo: Stage-1 -> Stage-2 -> evaluation -> report on the synthetic 2D dataset, through the bundle.

``spectraflow demo --output runs/demo`` runs the ``spectraflow_2d_segmentation`` bundle's configs with
``monai.bundle.run`` exactly as a user would run them by hand (the commands are printed), on a synthetic lesion
dataset generated on the fly. The defaults take about 4 minutes on 2 CPU cores (README); every option is listed by
``spectraflow demo --help``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from spectraflow_monai.utils.bundles import bundle_path, run_bundle_configs
from spectraflow_monai.utils.settings import PRECISION_SETTINGS, ModelSettings, check_image_size

__all__ = ["main", "run_demo"]

logger = logging.getLogger("spectraflow_monai.demo")


def run_demo(
    output: str | os.PathLike = "runs/demo",
    num_train: int = 64,
    num_val: int = 24,
    image_size: int = ModelSettings.image_size,
    stage1_epochs: int = 4,
    stage2_epochs: int = 20,
    batch_size: int = 8,
    encoder: str = ModelSettings.encoder_name,
    pretrained_weights: str | None = "none",
    threads: int | None = None,
    seed: int = 0,
    encoder_kwargs: dict | None = None,
    precision: str = "auto",
) -> dict[str, Any]:
    """Generate the synthetic set, then run Stage-1, Stage-2, evaluation and the report with the 2D bundle.

    Args:
        output: the bundle_root of the run: ``data/``, ``models/``, ``logs/``, ``eval/`` go there.
        num_train: synthetic training images. Defaults to 64.
        num_val: synthetic validation images. Defaults to 24.
        image_size: network input size, a multiple of 14 (the paper's 224 by default). Defaults to 224.
        stage1_epochs: Stage-1 epochs. Defaults to 4.
        stage2_epochs: Stage-2 epochs (early stopping may end it sooner). Defaults to 20.
        batch_size: batch size of both stages. Defaults to 8.
        encoder: timm DINOv2 model name. Defaults to ``"vit_small_patch14_dinov2"``.
        pretrained_weights: where Stage-1 starts (the bundle setting ``pretrained_weights``): ``"none"`` (random
            initialisation, the demo's default: the synthetic lesions need no download), ``"timm"`` (the paper's
            DINOv2 weights through timm's hub) or a local DINOv2 checkpoint file. Stage-2 starts from this run's
            Stage-1 export (``encoder_init: stage1``). Defaults to ``"none"``.
        threads: torch CPU threads (``None`` keeps torch's default).
        seed: seed of data generation and training. Defaults to 0.
        encoder_kwargs: extra ``timm.create_model`` arguments of the encoder (e.g. ``{"depth": 2}`` for a quick check).
        precision: the numeric precision of every stage: ``"auto"`` (bfloat16 on a CPU with native bfloat16 and on a
            GPU that supports it, float16 with a gradient scaler on an older GPU, else float32), ``"bf16"``,
            ``"fp16"`` (CUDA only) or ``"fp32"``. Resolved once, before any work; every stage runs with the resolved
            value as its bundle setting ``precision``. Defaults to ``"auto"``.

    Returns:
        ``{"summary": <metric summary dict>, "report": <report.md path>, "times": {...},
        "precision": <the resolved precision, e.g. "bf16">}``.

    Raises:
        ValueError: ``image_size`` not a multiple of 14, or a ``precision`` that is not a setting or that the
            device cannot run (``fp16`` on the CPU).
    """
    import torch

    from spectraflow_monai.apps.seg2d import generate_synthetic_dataset
    from spectraflow_monai.utils import resolve_precision

    check_image_size(image_size)
    from spectraflow_monai.networks.weights import normalize_weights_source

    weights = normalize_weights_source(pretrained_weights)
    # the bundles' `device`: the first GPU when there is one; checked and logged before any work, and resolved here
    # once: every run gets the resolved precision (bf16 / fp16 / fp32), never "auto" to resolve again
    resolved = resolve_precision(precision, "cuda:0" if torch.cuda.is_available() else "cpu", log=False)
    logger.info(f"demo: precision: {resolved}")
    print(f"=== Precision: {resolved}", flush=True)
    weights_text = "none (random initialisation)" if weights is None else weights
    logger.info(f"demo: pretrained_weights={weights_text}; Stage-2 encoder_init=stage1 (this run's Stage-1 export)")
    print(f"=== Encoder weights: Stage-1 starts from {weights_text}; Stage-2 from the Stage-1 export", flush=True)
    if threads:
        torch.set_num_threads(int(threads))
    root = Path(output).resolve()
    data_dir = root / "data"
    bundle = bundle_path("spectraflow_2d_segmentation")
    times: dict[str, float] = {}

    print(f"=== Synthetic dataset: {num_train} train + {num_val} val images in {data_dir}", flush=True)
    start = time.perf_counter()
    generate_synthetic_dataset(data_dir, num_train=num_train, num_val=num_val, size=224, seed=seed, overwrite=True)
    times["data"] = time.perf_counter() - start

    common: dict[str, Any] = {
        "bundle_root": str(root),
        "dataset": "synthetic",
        "dataset_dir": str(data_dir),
        "synthetic_size": {"num_train": num_train, "num_val": num_val},
        "image_size": image_size,
        "encoder_name": encoder,
        "num_workers": 0,
        "data_seed": seed,
        "encoder_kwargs": encoder_kwargs,
        "pretrained_weights": "none" if weights is None else weights,  # explicit, never the bundle's default
        "resume": False,  # a rerun starts over (the bundles keep earlier checkpoints aside as *.bak-<time>)
        "precision": resolved.name,
    }
    for stale in (root / "models" / "model.pt", root / "models" / "encoder_stage1.pt"):
        if stale.exists():
            stale.unlink()  # a rerun starts from scratch, never from a previous run's weights
    times["stage1"] = run_bundle_configs(
        bundle,
        ["train.yaml", "train_stage1.yaml"],
        {**common, "stage1_epochs": stage1_epochs, "stage1_batch_size": batch_size,
         # the demo's short schedule uses a larger learning rate than the paper's 300-epoch 1e-5 -> 1e-6
         "stage1_start_lr": 1e-4, "stage1_end_lr": 1e-5},
        "Stage-1: Mixed-Domain MeanFlow + dispersive pretraining",
    )
    times["stage2"] = run_bundle_configs(
        bundle,
        ["train.yaml"],
        {**common, "encoder_init": "stage1", "max_epochs": stage2_epochs, "batch_size": batch_size,
         "learning_rate": 3e-4},
        "Stage-2: segmentation fine-tuning (DAF + FDConv decoder, last encoder block)",
    )
    times["evaluate"] = run_bundle_configs(bundle, ["train.yaml", "evaluate.yaml"], common, "Evaluation (paper protocol)")

    from spectraflow_monai.apps.seg2d import build_datalist
    from spectraflow_monai.visualize.report import write_report

    eval_dir = root / "eval"
    val_list = build_datalist("synthetic", data_dir, "val", check_images=False, check_masks=False)
    total = sum(times.values())
    report = write_report(
        eval_dir,
        datalist=val_list,
        log_dirs={"Stage-1": root / "logs" / "stage1", "Stage-2": root / "logs"},
        title="SpectraFlow demo on synthetic lesions",
        extra_lines=[
            f"Input size {image_size}x{image_size}, encoder {encoder} (Stage-1 from {weights_text}), "
            f"{num_train} training / {num_val} validation images, Stage-1 {stage1_epochs} epochs, "
            f"Stage-2 up to {stage2_epochs} epochs, precision {resolved}.",
            "Wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f" (total {total:.0f} s).",
        ],
    )
    # the metric table was logged once by the evaluation; the report holds it with the curves and overlays
    print(f"Metrics: {eval_dir / 'summary.md'}\nReport: {report}  (total {total:.0f} s)")
    import json

    summary = json.loads((eval_dir / "summary.json").read_text())
    return {"summary": summary, "report": report, "times": times, "precision": resolved.name}


def main(argv: list[str] | None = None, prog: str = "spectraflow demo") -> int:
    """``spectraflow demo`` (or ``python -m spectraflow_monai demo``): see :func:`run_demo`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run SpectraFlow Stage-1 -> Stage-2 -> evaluation -> report on a generated synthetic dataset.",
    )
    parser.add_argument("--output", default="runs/demo", help="output folder (bundle_root of the run)")
    parser.add_argument("--num-train", type=int, default=64, help="synthetic training images (default 64)")
    parser.add_argument("--num-val", type=int, default=24, help="synthetic validation images (default 24)")
    parser.add_argument("--image-size", type=int, default=ModelSettings.image_size,
                        help=f"input size, multiple of 14 (default {ModelSettings.image_size})")
    parser.add_argument("--stage1-epochs", type=int, default=4, help="Stage-1 epochs (default 4)")
    parser.add_argument("--stage2-epochs", type=int, default=20, help="Stage-2 epochs (default 20)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--encoder", default=ModelSettings.encoder_name, help="timm DINOv2 model name")
    parser.add_argument(
        "--pretrained-weights",
        "--pretrained",
        dest="pretrained_weights",
        default="none",
        help="where Stage-1 starts: 'none' (random init, default), 'timm' (hub download) or a DINOv2 checkpoint file",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=PRECISION_SETTINGS,
        help="numeric precision of every stage: auto (bf16 where the CPU/GPU supports it, fp16 + grad scaler on "
        "older GPUs, else fp32; default), bf16, fp16 (CUDA only) or fp32; resolved once, every stage runs with "
        "the resolved value",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    args = parser.parse_args(argv)
    run_demo(
        output=args.output,
        num_train=args.num_train,
        num_val=args.num_val,
        image_size=args.image_size,
        stage1_epochs=args.stage1_epochs,
        stage2_epochs=args.stage2_epochs,
        batch_size=args.batch_size,
        encoder=args.encoder,
        pretrained_weights=args.pretrained_weights,
        threads=args.threads,
        seed=args.seed,
        precision=args.precision,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
