"""Slice-wise whole-volume inference and per-volume organ metrics of the Synapse pipeline, measured in one run.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/bench_synapse.py --threads 2
    OMP_NUM_THREADS=2 python benchmarks/bench_synapse.py --threads 2 --skip-inference --metric-runs 5  # metrics only

(1) Slice-wise inference. One synthetic abdominal CT volume of 512x512x100 voxels
(:func:`spectraflow_monai.apps.synapse.synthetic_ct_volume`) goes through the preprocessing of the bundle's
``inference.yaml`` (HU window [-125, 275] -> [0, 1], every axial slice resized to 224x224, 3 channels, ImageNet
normalisation) and is segmented with ``monai.inferers.SliceInferer(spatial_dim=2, roi_size=(224, 224))`` by two
models, timed in interleaved rounds on the same 100 slices:

- SpectraFlowNet-S (ViT-S/14 DINOv2 encoder + DAF / FDConv decoder, 9 classes), the bundle's network;
- the bare DINOv2 ViT-S/14 encoder wrapped to the same output contract: its final 16x16 token map, a 1x1
  convolution to 9 classes and a bilinear up-sampling to 224x224 (a linear probe, whose cost beyond the encoder is
  negligible).

The issue's target: SpectraFlowNet-S <= 1.5x the bare encoder's time per volume. The pre- and post-processing
(window + resize; argmax + nearest resize back to 512x512x100) are timed once and reported beside.

(2) Organ metrics. :func:`spectraflow_monai.metrics.organ_metrics` (DSC, HD95 in mm with MONAI's definition and
TransUNet's DSC / pooled HD95 in voxels, 8 organs) on a 512x512x100 prediction / label pair: the labels of two
different phantom cases mapped to the Synapse classes (so that every organ overlaps partially), spacing
0.8 x 0.8 x 2.5 mm; the median of ``--metric-runs`` runs. Target: <= 2 s per volume. Timed in interleaved runs
against :func:`baseline_organ_metrics`, the 3D-only implementation the package had before every HD95 went through
the one surface-distance core (:mod:`spectraflow_monai.metrics.surface`), kept here only as the yardstick; the
largest difference between the two results is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
from bench_inference import fill_skipped_init

NUM_CLASSES = 9
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class BareEncoderSegmenter(nn.Module):
    """The DINOv2 ViT-S/14 encoder with a linear probe: final token map -> 1x1 conv -> bilinear up-sampling."""

    def __init__(self, img_size: int, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        from spectraflow_monai.networks import DINOv2Encoder

        self.encoder = fill_skipped_init(
            DINOv2Encoder("vit_small_patch14_dinov2", img_size=img_size, model_kwargs={"weight_init": "skip"})
        )
        self.head = nn.Conv2d(self.encoder.embed_dim, num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.encoder(x).final)
        return nn.functional.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


def baseline_organ_metrics(pred: np.ndarray, gt: np.ndarray, spacing: tuple[float, ...]) -> dict[int, tuple]:
    """The former 3D organ metrics (MONAI ``get_mask_edges`` + ``compute_dice``, balanced KD-trees), for timing only.

    Returns ``{class: (dice, hd95 mm, hd95 voxels)}`` for the organs present in both volumes.
    """
    import warnings

    from monai.metrics import compute_dice
    from monai.metrics.utils import get_mask_edges
    from scipy.ndimage import find_objects
    from scipy.spatial import KDTree

    def directed(src, dst, shared, scale):
        query, target = np.argwhere(src & ~shared).astype(np.float64), np.argwhere(dst).astype(np.float64)
        d = np.zeros(int(shared.sum()) + len(query))
        if len(query):
            q, t = (query, target) if scale is None else (query * scale, target * scale)
            d[int(shared.sum()) :] = KDTree(t, leafsize=32).query(q, k=1)[0]
        return d

    out = {}
    boxes_p, boxes_g = find_objects(pred, max_label=NUM_CLASSES - 1), find_objects(gt, max_label=NUM_CLASSES - 1)
    for c in range(1, NUM_CLASSES):
        bp, bg = boxes_p[c - 1], boxes_g[c - 1]
        if bp is None or bg is None:
            continue
        box = tuple(
            slice(max(min(a.start, b.start) - 1, 0), min(max(a.stop, b.stop) + 1, n))
            for a, b, n in zip(bp, bg, pred.shape)
        )
        p, g = pred[box] == c, gt[box] == c
        dice = float(compute_dice(torch.from_numpy(p)[None, None], torch.from_numpy(g)[None, None])[0, 0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ep, eg = get_mask_edges(p, g, crop=False)
        shared = ep & eg
        scale = np.asarray(spacing)
        d_mm = directed(ep, eg, shared, scale), directed(eg, ep, shared, scale)
        d_vox = directed(ep, eg, shared, None), directed(eg, ep, shared, None)
        hd_mm = max(np.percentile(d_mm[0], 95), np.percentile(d_mm[1], 95))
        out[c] = (dice, float(hd_mm), float(np.percentile(np.concatenate(d_vox), 95)))
    return out


def load_avg() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def preprocess(volume_hu: np.ndarray, size: int) -> torch.Tensor:
    """(H, W, D) HU -> (1, 3, size, size, D): window, per-slice resize (bilinear), 3 channels, ImageNet norm."""
    from monai.transforms import Resize

    from spectraflow_monai.apps.synapse import CTWindow

    x = torch.as_tensor(CTWindow()(torch.from_numpy(volume_hu.astype(np.float32))))[None]
    x = Resize((size, size, -1), mode="bilinear")(x).as_tensor()
    x = x.repeat(3, 1, 1, 1)
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None, None]
    return ((x - mean) / std)[None].float()


def postprocess(logits: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """(1, C, s, s, D) -> (H, W, D) uint8 labels: argmax, nearest resize back to the volume's grid."""
    labels = logits.argmax(1, keepdim=True).float()
    return nn.functional.interpolate(labels, size=shape, mode="nearest")[0, 0].to(torch.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads (default 2)")
    parser.add_argument("--shape", type=int, nargs=3, default=[512, 512, 100], metavar=("H", "W", "D"))
    parser.add_argument("--size", type=int, default=224, help="network input size, a multiple of 14 (default 224)")
    parser.add_argument("--sw-batch-size", type=int, default=16, help="slices per network call (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--metric-runs", type=int, default=5, help="organ_metrics runs (default 5)")
    parser.add_argument("--skip-inference", action="store_true", help="only time the organ metrics")
    args = parser.parse_args()

    from monai.inferers import SliceInferer

    from spectraflow_monai.apps.synapse import map_btcv_labels, synthetic_ct_volume
    from spectraflow_monai.metrics import organ_metrics
    from spectraflow_monai.networks import SpectraFlowNet

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = tuple(args.shape)
    print(f"load average at start (1/5/15 min): {load_avg()}", flush=True)
    start = time.perf_counter()
    image, label_a = synthetic_ct_volume(1, shape=shape)
    _, label_b = synthetic_ct_volume(2, shape=shape)
    print(f"phantoms {shape} generated in {time.perf_counter() - start:.1f} s", flush=True)

    rows = []
    if not args.skip_inference:
        t0 = time.perf_counter()
        x = preprocess(image, args.size)
        t_pre = time.perf_counter() - t0
        models = {
            "DINOv2 ViT-S encoder (bare, linear probe)": BareEncoderSegmenter(args.size).eval(),
            "SpectraFlowNet-S (DAF + fdconv), 9 classes": SpectraFlowNet(out_channels=NUM_CLASSES, img_size=args.size)
            .eval(),
        }
        inferer = SliceInferer(roi_size=(args.size, args.size), spatial_dim=2, sw_batch_size=args.sw_batch_size)
        times: dict[str, list[float]] = {name: [] for name in models}
        with torch.inference_mode():
            for m in models.values():  # warm-up on a few slices
                inferer(x[..., :4], m)
            for r in range(args.rounds):
                for name, m in models.items():
                    t0 = time.perf_counter()
                    out = inferer(x, m)
                    times[name].append(time.perf_counter() - t0)
                print(f"round {r + 1}/{args.rounds} done ({load_avg()})", flush=True)
            t0 = time.perf_counter()
            pred = postprocess(out, shape)
            t_post = time.perf_counter() - t0
        assert pred.shape == shape
        base = statistics.median(times[next(iter(models))])
        for name, m in models.items():
            med = statistics.median(times[name])
            params = sum(p.numel() for p in m.parameters()) / 1e6
            rows.append((name, params, med, shape[2] / med, med / base, min(times[name])))

    metric_times: dict[str, list[float]] = {"core": [], "baseline": []}
    label = map_btcv_labels(label_a, dtype=np.uint8)
    pred_labels = map_btcv_labels(label_b, dtype=np.uint8)
    spacing = (0.8, 0.8, 2.5)
    for _ in range(args.metric_runs):  # interleaved: both see the same load
        t0 = time.perf_counter()
        metrics = organ_metrics(pred_labels, label, spacing=spacing)
        metric_times["core"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        baseline = baseline_organ_metrics(pred_labels, label, spacing)
        metric_times["baseline"].append(time.perf_counter() - t0)
    organs = list(metrics.values())
    keys = ("dice", "hd95", "hd95_transunet")
    diff = max(abs(v - organs[c - 1][k]) for c, vals in baseline.items() for v, k in zip(vals, keys))
    print(f"load average at end (1/5/15 min): {load_avg()}", flush=True)

    print(f"\nCPU, {args.threads} threads, torch {torch.__version__}; volume {shape}, slices resized to {args.size}^2, "
          f"SliceInferer sw_batch_size {args.sw_batch_size}, {args.rounds} interleaved rounds (median)\n")  # fmt: skip
    if rows:
        print("| model | params (M) | s / volume | slices/s | ratio to bare encoder | best round (s) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, params, med, sps, ratio, best in rows:
            print(f"| {name} | {params:.1f} | {med:.2f} | {sps:.2f} | {ratio:.3f} | {best:.2f} |")
        print(f"\npre-processing (window + resize to {args.size}^2): {t_pre:.2f} s; post-processing (argmax + nearest "
              f"resize back): {t_post:.2f} s")  # fmt: skip
    dice = [m["dice"] for m in metrics.values()]
    print(f"\nOrgan metrics on a {shape} 8-organ pair, spacing 0.8 x 0.8 x 2.5 mm, {args.metric_runs} interleaved "
          f"runs; mean DSC of the pair {np.nanmean(dice):.3f}\n")  # fmt: skip
    print("| implementation | median (s) | min (s) | max (s) | ratio to baseline |")
    print("| --- | ---: | ---: | ---: | ---: |")
    base = statistics.median(metric_times["baseline"])
    labels = {"core": "organ_metrics (surface-distance core)", "baseline": "former 3D implementation (baseline)"}
    for key, times_ in metric_times.items():
        med = statistics.median(times_)
        print(f"| {labels[key]} | {med:.2f} | {min(times_):.2f} | {max(times_):.2f} | {med / base:.3f} |")
    print(f"\nlargest difference between the two results (DSC, HD95 mm, HD95 voxels): {diff:.2e}")


if __name__ == "__main__":
    main()
