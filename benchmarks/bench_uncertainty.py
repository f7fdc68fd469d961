"""What the MONAI Label app's uncertainty scoring costs: FlipEntropy (four test-time flips in one batched pass) against
one plain inference pass of the same SpectraFlowNet-S, measured in one run.

Usage::

    python benchmarks/bench_uncertainty.py --threads 2 --size 224 --images 8 --rounds 5
    python benchmarks/bench_uncertainty.py --device cuda --images 64

Prints a markdown table: seconds per image of plain inference (the network on a batch of ``--images``) and of the
score (the network on the same images under the four flips, in batches of ``--batch`` images), and their ratio. The
two are timed in interleaved rounds and the median round is reported, so that a background load affects both alike.
A volume costs its number of axial slices times the per-image figure.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from spectraflow_monai.metrics import FlipEntropy
from spectraflow_monai.networks import SpectraFlowNet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--size", type=int, default=224, help="image size (default 224, the bundles')")
    parser.add_argument("--images", type=int, default=8, help="images per round (default 8)")
    parser.add_argument("--batch", type=int, default=8, help="FlipEntropy batch_size (default 8, the app's)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    network = SpectraFlowNet(out_channels=1, img_size=args.size).to(device).eval()
    images = torch.randn(args.images, 3, args.size, args.size, device=device)
    score = FlipEntropy(network, batch_size=args.batch)

    def plain() -> None:
        with torch.no_grad():
            for chunk in images.split(args.batch):
                network(chunk)

    def scored() -> None:
        score(images)

    timings: dict[str, list[float]] = {"inference (1 pass)": [], "uncertainty score (4 flips)": []}
    for fn in (plain, scored):  # warm-up
        fn()
    for _ in range(args.rounds):
        for name, fn in zip(timings, (plain, scored)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            timings[name].append((time.perf_counter() - start) / args.images)
    base = statistics.median(timings["inference (1 pass)"])
    print(f"SpectraFlowNet-S, {args.size} px, {args.images} images per round, batch {args.batch}, device {device}, "
          f"{args.threads} threads, median of {args.rounds} interleaved rounds\n")  # fmt: skip
    print("| what | s / image | ratio to inference |\n| --- | ---: | ---: |")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
