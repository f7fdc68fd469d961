"""Time of the Stage-2 boundary term: MONAI's ``BoundaryLoss`` on one batch, the share of its signed distance maps, and
the same maps from the exact torch transform (``distance_backend="torch"``) as a ratio against MONAI's in the same run.

Usage::

    python benchmarks/bench_boundary_loss.py --device cpu --batch 8 --size 224
    python benchmarks/bench_boundary_loss.py --device cuda --batch 8 --size 224 --classes 1 9
    python benchmarks/bench_boundary_loss.py --batch 2 --size 32 --rounds 1    # a smoke run

``BoundaryLoss`` computes the signed distance map of every target with ``monai.transforms.utils.distance_transform_edt``:
with cuCIM (and CuPy) installed and the target on a CUDA device it runs on the GPU, otherwise scipy runs on the CPU,
one image and class after another. The script prints which one MONAI picked and, per ``--classes`` (1: a binary
sigmoid task, 9: the Synapse label maps), the median time of one loss forward + backward and of the distance maps
alone, over ``--rounds`` rounds, as a markdown table. Stage-2's ``DiceBCEBoundaryLoss`` computes this term for every
training batch whose β is above 0 (docs/benchmarks.md, "GPU: NVIDIA H200").

The torch arm (:func:`spectraflow_monai.utils.distance.signed_distance_map`, on ``--device``) is timed for the maps
alone and for the loss forward + backward (``SignedDistanceBoundaryLoss(distance_backend="torch")``); the ratio
column is MONAI's time over the torch time (above 1: torch is faster). ``--json`` also writes the figures to a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from monai.losses import BoundaryLoss
from monai.utils import optional_import

from spectraflow_monai.losses import SignedDistanceBoundaryLoss


def distance_backend(device: torch.device) -> str:
    """The backend MONAI's ``distance_transform_edt`` uses for a tensor on ``device``."""
    _, has_cp = optional_import("cupy")
    _, has_cucim = optional_import("cucim.core.operations.morphology", name="distance_transform_edt")
    return "cuCIM (GPU)" if has_cp and has_cucim and device.type == "cuda" else "scipy (CPU)"


def targets(batch: int, classes: int, size: int, device: torch.device) -> torch.Tensor:
    """One-hot targets of random discs (each class a disc of its own), ``(batch, classes, size, size)``."""
    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    out = torch.zeros(batch, classes, size, size)
    for b in range(batch):
        for c in range(classes):
            cy, cx = torch.randint(size // 4, 3 * size // 4, (2,), generator=g).tolist()
            r = int(torch.randint(size // 16, size // 4, (1,), generator=g))
            out[b, c] = (((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r).float()
    return out.to(device)


def _median_seconds(fn, rounds: int, device: torch.device) -> float:
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--batch", type=int, default=8, help="images per batch (default 8, the 2D bundle's)")
    parser.add_argument("--size", type=int, default=224, help="image side (default 224)")
    parser.add_argument("--classes", type=int, nargs="+", default=[1], help="target channels (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    for name in ("batch", "size", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}; distance maps: {distance_backend(device)}; batch {args.batch}, {args.size}x{args.size}")
    print(
        "\n| classes | loss forward + backward (s) | distance maps alone (s) | torch: loss (s) | torch: maps (s) "
        "| maps ratio MONAI / torch |\n| --- | --- | --- | --- | --- | --- |"
    )
    rows = []
    for classes in args.classes:
        target = targets(args.batch, classes, args.size, device)
        logits = torch.randn(target.shape, device=device, requires_grad=True)
        kw = {"sigmoid": classes == 1, "softmax": classes > 1, "include_background": classes == 1}
        times = {}
        for arm, loss in (("monai", BoundaryLoss(**kw)), ("torch", SignedDistanceBoundaryLoss("torch", **kw))):

            def step(loss=loss, logits=logits, target=target):
                loss(logits, target).backward()

            def maps(loss=loss, target=target):
                loss.compute_distance_map(target)

            step(), maps()  # warm-up (CUDA kernels, cuCIM compilation)
            times[arm] = (_median_seconds(step, args.rounds, device), _median_seconds(maps, args.rounds, device))
        ratio = times["monai"][1] / max(times["torch"][1], 1e-12)
        print(
            f"| {classes} | {times['monai'][0]:.4f} | {times['monai'][1]:.4f} | {times['torch'][0]:.4f} "
            f"| {times['torch'][1]:.4f} | {ratio:.2f} |"
        )
        rows.append(
            {"classes": classes, "monai_loss_s": times["monai"][0], "monai_maps_s": times["monai"][1],
             "torch_loss_s": times["torch"][0], "torch_maps_s": times["torch"][1], "maps_ratio_monai_over_torch": ratio}
        )  # fmt: skip
    if args.json:
        meta = {"device": str(device), "monai_backend": distance_backend(device), "batch": args.batch, "size": args.size}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
