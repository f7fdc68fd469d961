"""Inference throughput of SpectraFlowNet against the bare encoder and MONAI baselines, measured in one run.

Usage::

    python benchmarks/bench_inference.py --threads 2 --batch 8 --size 224 --rounds 5
    python benchmarks/bench_inference.py --device cuda --batch 32 --precision fp32 bf16 fp16

Prints a markdown table (images/s and the ratio to the bare DINOv2 ViT-S encoder at the same precision) for the
current device. Each ``--precision`` is resolved by :func:`spectraflow_monai.utils.resolve_precision` (logged) and
runs the forward under its ``torch.autocast``. The models and precisions are timed in interleaved rounds
(A B C D, A B C D, ...) and the median round is reported, so that a background load affects every model alike.
The issue's target: SpectraFlowNet-S >= 0.85x the bare encoder on 2 CPU threads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from spectraflow_monai.utils.precision import PRECISION_SETTINGS, resolve_precision


class BareEncoder(nn.Module):
    """The timm ViT-S/14 DINOv2 forward alone (no decoder), as a baseline."""

    def __init__(self, img_size: int) -> None:
        super().__init__()
        from spectraflow_monai.networks import DINOv2Encoder

        self.encoder = fill_skipped_init(
            DINOv2Encoder("vit_small_patch14_dinov2", img_size=img_size, model_kwargs={"weight_init": "skip"})
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).final


def fill_skipped_init(model: nn.Module) -> nn.Module:
    """timm's ``weight_init="skip"`` (fast construction) leaves parameters uninitialised; fill them with N(0, 0.02)
    so that no NaN or denormal value distorts the timing."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model


def build_models(size: int, refine: str) -> dict[str, nn.Module]:
    from monai.networks.nets import SwinUNETR, UNet

    from spectraflow_monai.networks import SpectraFlowNet

    return {
        "DINOv2 ViT-S encoder (bare)": BareEncoder(size),
        f"SpectraFlowNet-S (DAF + {refine})": SpectraFlowNet(out_channels=1, img_size=size, refine=refine),
        "MONAI UNet 2D": UNet(2, 3, 1, channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2), num_res_units=2),
        "MONAI SwinUNETR 2D (feature 24)": SwinUNETR(3, 1, feature_size=24, spatial_dims=2),
    }


def time_once(model: nn.Module, x: torch.Tensor, iters: int) -> float:
    """Seconds per batch, averaged over ``iters`` forward passes."""
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        model(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads (default 2)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--size", type=int, default=224, help="square input size, a multiple of 14 (default 224)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--iters", type=int, default=2, help="forward passes per model per round (default 2)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--refine", default="fdconv", help="refinement block of SpectraFlowNet (default fdconv)")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=PRECISION_SETTINGS,
                        help="precision settings (default fp32)")  # fmt: skip
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precisions = {p: resolve_precision(p, device) for p in args.precision}
    models = {name: m.to(device).eval() for name, m in build_models(args.size, args.refine).items()}
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    runs = [(name, p) for p in precisions for name in models]
    times: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    with torch.inference_mode():
        for name, p in runs:  # warm-up
            with precisions[p].context():
                models[name](x)
        for r in range(args.rounds):
            for name, p in runs:
                with precisions[p].context():
                    times[name, p].append(time_once(models[name], x, args.iters))
            print(f"round {r + 1}/{args.rounds} done", flush=True)

    base_name = next(iter(models))
    med = {run: statistics.median(t) for run, t in times.items()}
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(f"\nInference at {args.size}x{args.size}, batch {args.batch}, {dev}, torch {torch.__version__}\n")
    print("| model | precision | params (M) | images/s | ratio to bare encoder | ratio to its fp32 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, p in runs:
        ips, base = args.batch / med[name, p], args.batch / med[base_name, p]
        fp32 = f"{med[name, 'fp32'] / med[name, p]:.2f}x" if (name, "fp32") in med else "-"
        params = sum(q.numel() for q in models[name].parameters()) / 1e6
        print(f"| {name} | {precisions[p].name} | {params:.1f} | {ips:.2f} | {ips / base:.3f} | {fp32} |")


if __name__ == "__main__":
    main()
