"""Host-side time per image of the Stage-2 trainer process, the network replaced by a trivial one.

Usage::

    python benchmarks/bench_host_overhead.py --size 224 --batch 8 --iters 40          # both data paths
    python benchmarks/bench_host_overhead.py --tiny                                   # a smoke run

On a GPU machine the trainer process should only queue work: whatever it spends on the CPU per image (collation,
per-sample random transforms, bookkeeping, logging, host synchronisation) caps the images/s whatever the GPU. This
script measures that share on any machine. The network is a 1x1 convolution (3 -> 1 channels), so the step's own
arithmetic is small, and it is counted apart: the same tensor work (the batch augmentation where it runs in the
trainer, the network's forward and backward, the Stage-2 loss with the torch distance maps, the optimizer step)
is timed on its own on the same batches ("device work"); the host-side time is the trainer's wall time minus it.

Two data paths, each a MONAI ``SupervisedTrainer`` with the Stage-2 loss (``DiceBCEBoundaryLoss``) and the training
handlers (``LossTermsHandler``, ``EpochSummaryHandler``, ``StopOnNonFiniteLoss(every=...)``):

- ``classic``: ``CacheDataset`` + ``DataLoader(num_workers=0)`` with the 2D bundle's per-sample random transforms
  (flips, rot90, affine, Kvasir colour jitter, normalisation) and MONAI's collation, all in the trainer process (with
  worker processes this work moves to them; ``--classic-workers`` sets it);
- ``device``: :class:`~spectraflow_monai.data.DeviceCache` + :class:`~spectraflow_monai.data.DeviceCacheLoader` with
  the same augmentation as batched transforms (:mod:`spectraflow_monai.transforms.batched`) on the cache's device.

Printed: a markdown table per path with ms per image of the trainer's wall time, the device work and the
host-side difference (the issue's CPU target: host-side <= 2 ms per image at 224 px). ``--json`` writes the
figures. Timings on a shared or busy machine mean little: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from ignite.engine import Events
from monai.data import CacheDataset, DataLoader
from monai.engines import SupervisedTrainer
from monai.transforms import (
    Compose,
    NormalizeIntensityd,
    RandAdjustContrastd,
    RandAffined,
    RandFlipd,
    RandGaussianSmoothd,
    RandRotate90d,
    RandScaleIntensityd,
)

from spectraflow_monai.data import DeviceCache, DeviceCacheLoader
from spectraflow_monai.handlers import EpochSummaryHandler, LossTermsHandler, StopOnNonFiniteLoss
from spectraflow_monai.losses import DiceBCEBoundaryLoss
from spectraflow_monai.transforms import BatchCompose, batched_twins

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
KEYS = ["image", "label"]


def samples(n: int, size: int) -> list[dict]:
    """``n`` synthetic image / mask pairs (images in [0, 1], a disc per mask), channel first."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:size, :size]
    out = []
    for _ in range(n):
        cy, cx, r = rng.integers(size // 4, 3 * size // 4, 2).tolist() + [int(rng.integers(size // 10, size // 4))]
        label = (((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r).astype(np.float32)[None]
        out.append({"image": rng.random((3, size, size), dtype=np.float32), "label": label})
    return out


def classic_transforms() -> Compose:
    """The 2D bundle's Stage-2 augmentation (geometry + Kvasir colour jitter) and normalisation, per sample."""
    return Compose(
        [
            RandFlipd(KEYS, prob=0.5, spatial_axis=0),
            RandFlipd(KEYS, prob=0.5, spatial_axis=1),
            RandRotate90d(KEYS, prob=0.5),
            RandAffined(KEYS, prob=0.3, rotate_range=0.6, scale_range=0.1, mode=["bilinear", "nearest"],
                        padding_mode="zeros"),
            RandAdjustContrastd("image", prob=0.3, gamma=(0.7, 1.5)),
            RandScaleIntensityd("image", prob=0.3, factors=0.15),
            RandGaussianSmoothd("image", prob=0.1, sigma_x=(0.25, 1.0), sigma_y=(0.25, 1.0)),
            NormalizeIntensityd("image", subtrahend=MEAN, divisor=STD, channel_wise=True),
        ]
    )  # fmt: skip


def batch_transforms(seed: int = 0) -> BatchCompose:
    """The same augmentation as batched transforms on the batch's device (the twins the bundles' device data path
    runs: :func:`spectraflow_monai.transforms.batched_twins`)."""
    return BatchCompose(batched_twins(classic_transforms().transforms)).set_random_state(seed)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(path: str, data: list[dict], batch: int, device: torch.device, workers: int, every: int):
    """``(trainer, loader, net, loss, optimizer, transform_in_trainer)`` of one data path."""
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 1, 1).to(device)
    loss = DiceBCEBoundaryLoss(beta=0.01, distance_backend="torch")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    if path == "classic":
        dataset = CacheDataset(data, classic_transforms(), progress=False)
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)
        in_trainer = None
    else:
        cache = DeviceCache(data, keys=KEYS, cache_device="cuda" if device.type == "cuda" else "cpu", device=device)
        in_trainer = batch_transforms()
        loader = DeviceCacheLoader(cache, batch, transform=in_trainer, device=device)
    trainer = SupervisedTrainer(
        device=device, max_epochs=1, train_data_loader=loader, network=net, optimizer=opt, loss_function=loss,
        decollate=False, non_blocking=True,
    )  # fmt: skip
    StopOnNonFiniteLoss(every=every).attach(trainer)
    LossTermsHandler(loss).attach(trainer)
    EpochSummaryHandler(title="bench", quiet_engines=True).attach(trainer)
    return trainer, loader, net, loss, opt, in_trainer


def time_path(path: str, args, data: list[dict], device: torch.device) -> dict[str, float]:
    """Median seconds per image over ``--rounds`` rounds: trainer wall time, device work, host-side difference."""
    walls, works = [], []
    for r in range(args.rounds):
        trainer, loader, net, loss, opt, transform = build(path, data, args.batch, device, args.classic_workers,
                                                           args.every)  # fmt: skip
        iters = len(loader) - args.warmup  # one epoch: warm-up + timed iterations
        marks: dict[str, float] = {}  # the trainer's wall time for the iterations after the warm-up

        def mark(engine, marks=marks):
            if engine.state.iteration == args.warmup:
                _sync(device)
                marks["start"] = time.perf_counter()

        trainer.add_event_handler(Events.ITERATION_COMPLETED, mark)
        trainer.run()
        _sync(device)
        walls.append((time.perf_counter() - marks.get("start", time.perf_counter())) / (iters * args.batch))
        # the device work alone on the same kind of batches: augmentation (device path), forward, loss, backward, step
        cache = DeviceCache(data, keys=KEYS, cache_device="cpu")
        idx = torch.arange(args.batch)
        raw = {k: v.to(device) for k, v in cache.batch(idx).items()}
        aug = batch_transforms(r) if path == "device" else None
        fixed = raw if aug is not None else batch_transforms(r)(raw)  # classic: augmented on the host, not counted
        for _ in range(args.warmup):
            _step(net, loss, opt, aug(raw) if aug else fixed)
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            _step(net, loss, opt, aug(raw) if aug else fixed)
        _sync(device)
        works.append((time.perf_counter() - start) / (iters * args.batch))
    wall, work = statistics.median(walls), statistics.median(works)
    ms = {"wall": 1e3 * wall, "device": 1e3 * work, "host": 1e3 * (wall - work)}
    return {f"{k}_ms_per_image": v for k, v in ms.items()}


def _step(net, loss, opt, batch):
    opt.zero_grad(set_to_none=True)
    value = loss(net(batch["image"]), batch["label"])
    value.backward()
    opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--size", type=int, default=224, help="image side (default 224)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8, the paper's)")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per round (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, median reported (default 3)")
    parser.add_argument("--every", type=int, default=50, help="StopOnNonFiniteLoss read-back interval (default 50)")
    parser.add_argument("--classic-workers", type=int, default=0, help="DataLoader workers of the classic path")
    parser.add_argument("--paths", nargs="+", default=["classic", "device"], choices=["classic", "device"])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 32 px, batch 2, 2 iterations, 1 round")
    args = parser.parse_args()
    if args.tiny:
        args.size, args.batch, args.iters, args.warmup, args.rounds = 32, 2, 2, 1, 1
    for name in ("size", "batch", "iters", "rounds", "threads", "every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.images = args.batch * (args.iters + args.warmup)  # one epoch: the warm-up and the timed iterations
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = samples(args.images, args.size)
    results = {path: time_path(path, args, data, device) for path in args.paths}
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(f"\nStage-2 trainer process, trivial network, {args.size}x{args.size}, batch {args.batch}, {dev}, "
          f"median of {args.rounds} rounds of {args.iters} iterations\n")  # fmt: skip
    print("| data path | trainer wall (ms/image) | device work (ms/image) | host-side (ms/image) |")
    print("| --- | ---: | ---: | ---: |")
    for path, r in results.items():
        cells = " | ".join(f"{r[k + '_ms_per_image']:.3f}" for k in ("wall", "device", "host"))
        print(f"| {path} | {cells} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": dev, "size": args.size, "batch": args.batch, "paths": results}, f, indent=1)


if __name__ == "__main__":
    main()
