"""Slice-wise whole-volume inference and per-volume organ metrics of the Synapse pipeline, measured in one run.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/bench_synapse.py --threads 2
    OMP_NUM_THREADS=2 python benchmarks/bench_synapse.py --threads 2 --skip-inference --metric-runs 5  # metrics only
    OMP_NUM_THREADS=2 python benchmarks/bench_synapse.py --threads 2 --serving --rounds 5  # (3) serving paths only

(1) Slice-wise inference. One synthetic abdominal CT volume of 512x512x100 voxels
(:func:`spectraflow_monai.apps.synapse.synthetic_ct_volume`) goes through the preprocessing of the bundle's
``inference.yaml`` (HU window [-125, 275] -> [0, 1], every axial slice resized to 224x224, 3 channels, ImageNet
normalisation) and is segmented slice by slice (the bundle's
:class:`spectraflow_monai.utils.inferers.AxialSliceInferer`; ``--monai-slice-inferer``: MONAI's ``SliceInferer``) by two
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

(3) Serving paths (``--serving``). The whole volume, from HU to the uint8 label volume at 512x512x100 (the
preprocessing, the bundle's slice inferer :class:`spectraflow_monai.utils.inferers.AxialSliceInferer` with
``--sw-batch-size`` slices per call (``--monai-slice-inferer``: MONAI's ``SliceInferer``, its former one), argmax at
224 px and the nearest resize back), through each way the bundle serves a model on the CPU, timed in interleaved
rounds (the same load for each):

- PyTorch eager float32 (``inference.yaml --precision fp32``), the reference;
- PyTorch under the default ``precision: auto`` (bf16 autocast on a CPU with native bf16, else float32);
- onnxruntime with each export variant of :func:`spectraflow_monai.networks.onnx_runtime.export_variant`:
  ``fp32``, ``int8-encoder`` and ``cpu`` (fused attention nodes + int8 encoder; ``export-onnx --variant cpu``),
  run by :class:`spectraflow_monai.networks.export.OnnxNetwork` with ``--threads`` threads, sleeping between runs
  as in the Synapse bundle's ``inference_onnx.yaml`` (``--onnx-spinning``: onnxruntime's spinning threads);
- ``onnxruntime static-int8`` (a candidate, not an export the package offers): every matrix product and convolution
  of the ``fp32`` export in int8 by onnxruntime's static quantisation (QDQ, uint8 activations per tensor, int8
  weights), calibrated on 8 slices of the volume itself (:func:`static_int8_export`);
- ``onnxruntime int8-per-matrix`` (for comparison, not an export the package offers): ``int8-encoder`` with one int8
  scale per weight matrix instead of one per output channel (``quantize_encoder_linear(..., per_channel=False)``,
  what the int8 exports were before).

Each path's label volume is compared with the eager float32 one: the fraction of voxels with the same label and
the Dice between the two of every organ either holds. ``--model`` takes a bundle's trained ``model.pt`` (with its
``model.json``: the network built from the record); without it SpectraFlowNet-S with random weights (its
zero-initialised decoder heads filled, as ``bench_inference.py`` does), whose labels say less about agreement.
``--onnx-dir`` keeps the exports between runs (each is made once per model file and variant).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
from bench_inference import fill_skipped_init, fill_zero_heads

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


SERVING_PATHS = (
    "eager fp32", "precision auto", "onnxruntime fp32", "onnxruntime int8-encoder", "onnxruntime cpu",
    "onnxruntime static-int8", "onnxruntime int8-per-matrix",
)  # fmt: skip


def static_int8_export(fp32_file: str, out_file: str, x: torch.Tensor, slices: int = 8) -> None:
    """The ``fp32`` export with every matrix product and convolution in int8: onnxruntime's ``quantize_static``
    (QDQ, uint8 activations per tensor, int8 weights) after its ``quant_pre_process``, calibrated on ``slices``
    axial slices of the prepared volume ``x`` (1, 3, s, s, D), evenly spaced, in batches of 4."""
    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = out_file + ".pre.onnx"
    quant_pre_process(fp32_file, prepared, skip_symbolic_shape=True)
    name = onnxruntime.InferenceSession(prepared, providers=["CPUExecutionProvider"]).get_inputs()[0].name
    picks = np.linspace(0, x.shape[-1] - 1, slices).round().astype(int)
    feeds = [{name: x[0, ..., picks[i:i + 4]].permute(3, 0, 1, 2).contiguous().numpy()} for i in range(0, slices, 4)]

    class Slices(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(prepared, out_file, Slices(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=False)  # fmt: skip
    os.remove(prepared)


def serving_network(model_file: str | None, size: int) -> tuple[nn.Module, str]:
    """The network served: a bundle's model (``model.pt`` + its ``model.json``) or SpectraFlowNet-S with random
    weights (decoder heads filled); and a short description."""
    if model_file is None:
        from spectraflow_monai.networks import SpectraFlowNet

        net = SpectraFlowNet(out_channels=NUM_CLASSES, img_size=size, encoder_kwargs={"weight_init": "skip"})
        fill_skipped_init(net.encoder)
        return fill_zero_heads(net).eval(), "SpectraFlowNet-S, random weights"
    from ignite.handlers import Checkpoint

    from spectraflow_monai.apps.workflow import recorded_network
    from spectraflow_monai.utils.run_record import ModelRecord

    record = ModelRecord(model_file)
    net = recorded_network(record, record.out_channels)
    Checkpoint.load_objects({"model": net}, torch.load(model_file, map_location="cpu", weights_only=True))
    return net.eval(), f"{model_file} ({record.settings.encoder_name}, {record.out_channels} classes)"


def label_agreement(pred: torch.Tensor, ref: torch.Tensor, num_classes: int) -> tuple[float, dict[int, float]]:
    """The fraction of voxels with the same label, and the Dice between the two of each class >= 1 either holds."""
    equal = float((pred == ref).double().mean())
    dice = {}
    for c in range(1, num_classes):
        p, r = pred == c, ref == c
        total = int(p.sum()) + int(r.sum())
        if total:
            dice[c] = 2.0 * int((p & r).sum()) / total
    return equal, dice


def time_serving_paths(args: argparse.Namespace, image: np.ndarray, shape: tuple[int, ...]) -> None:
    """(3): the whole volume through each serving path, interleaved rounds; the table printed."""
    import tempfile

    from monai.inferers import SliceInferer

    from spectraflow_monai.networks.export import OnnxNetwork, quantize_encoder_linear
    from spectraflow_monai.networks.onnx_runtime import (
        CPU_SESSION_CONFIG,
        export_variant,
    )
    from spectraflow_monai.utils import AutocastInferer, resolve_precision
    from spectraflow_monai.utils.inferers import AxialSliceInferer

    net, described = serving_network(args.model, args.size)
    num_classes = int(getattr(net, "out_channels", NUM_CLASSES))
    onnx_dir = args.onnx_dir or tempfile.mkdtemp(prefix="bench_synapse_")
    os.makedirs(onnx_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.model))[0] if args.model else "random"
    if args.monai_slice_inferer:
        slice_inferer = SliceInferer(roi_size=(args.size, args.size), spatial_dim=2, sw_batch_size=args.sw_batch_size)
    else:  # the bundle's (the model pipeline's)
        slice_inferer = AxialSliceInferer(args.sw_batch_size)
    auto = resolve_precision("auto", "cpu")
    paths: dict[str, tuple] = {
        "eager fp32": (net, slice_inferer),
        "precision auto": (net, AutocastInferer(slice_inferer, auto)),
    }
    from_fp32 = {"onnxruntime static-int8", "onnxruntime int8-per-matrix"}  # candidates made from the fp32 export
    for variant in ("fp32", "int8-encoder", "cpu", "static-int8", "int8-per-matrix"):
        onnx_file = os.path.join(onnx_dir, f"{stem}_{args.size}_{variant}.onnx")
        needed = {f"onnxruntime {variant}"} | (from_fp32 if variant == "fp32" else set())
        if not needed & set(args.paths):  # an export made only when a path asked for runs it (or is made from it)
            continue
        if not os.path.isfile(onnx_file):
            t0 = time.perf_counter()
            fp32_file = os.path.join(onnx_dir, f"{stem}_{args.size}_fp32.onnx")
            if variant == "static-int8":
                static_int8_export(fp32_file, onnx_file, preprocess(image, args.size))
            elif variant == "int8-per-matrix":
                quantize_encoder_linear(fp32_file, onnx_file, per_channel=False)
            else:
                export_variant(net, onnx_file, variant, image_size=args.size, atol=float("inf"))
            print(f"exported {variant} in {time.perf_counter() - t0:.0f} s: {onnx_file}", flush=True)
        session = CPU_SESSION_CONFIG if not args.onnx_spinning else None
        network = OnnxNetwork(onnx_file, threads=args.threads, session_config=session)
        paths[f"onnxruntime {variant}"] = (network, slice_inferer)
    paths = {name: paths[name] for name in args.paths}

    def serve(network: nn.Module, inferer) -> torch.Tensor:
        x = preprocess(image, args.size)
        with torch.inference_mode():
            return postprocess(inferer(x, network), shape)

    with torch.inference_mode():  # warm-up on a few slices
        for network, inferer in paths.values():
            inferer(preprocess(image[..., :2], args.size), network)
    times: dict[str, list[float]] = {name: [] for name in paths}
    labels: dict[str, torch.Tensor] = {}
    for r in range(args.rounds):
        for name, (network, inferer) in paths.items():
            t0 = time.perf_counter()
            labels[name] = serve(network, inferer)
            times[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.rounds} done ({load_avg()})", flush=True)
    ref = labels.get("eager fp32")
    base = statistics.median(times["eager fp32"]) if ref is not None else None
    print(f"load average at end (1/5/15 min): {load_avg()}", flush=True)
    print(f"\nCPU, {args.threads} threads, torch {torch.__version__}, onnxruntime {_ort_version()}; {described}; "
          f"volume {shape}, slices at {args.size}^2, {type(slice_inferer).__name__} sw_batch_size "
          f"{args.sw_batch_size}; precision "
          f"auto = {auto.name} here; {args.rounds} interleaved rounds, whole volume (pre- and post-processing "
          "included)\n")  # fmt: skip
    print("| serving path | s / volume (median) | best round (s) | speed-up over eager fp32 (medians) "
          "| voxels equal to eager fp32 | lowest organ Dice to eager fp32 |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in paths:
        med = statistics.median(times[name])
        ratio = f"{base / med:.2f}x" if base else "-"
        if ref is not None:
            equal, dice = label_agreement(labels[name], ref, num_classes)
            low = min(dice.values()) if dice else float("nan")
            agree = f"{100 * equal:.4f} % | {low:.4f}" + (f" (class {min(dice, key=dice.get)})" if dice else "")
        else:
            agree = "- | -"
        print(f"| {name} | {med:.2f} | {min(times[name]):.2f} | {ratio} | {agree} |")
    if ref is not None:
        present = {c: int((ref == c).sum()) for c in range(1, num_classes)}
        print(f"\nvoxels per class in the eager fp32 labels: {present}")


def _ort_version() -> str:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads (default 2)")
    parser.add_argument("--shape", type=int, nargs=3, default=[512, 512, 100], metavar=("H", "W", "D"))
    parser.add_argument("--size", type=int, default=224, help="network input size, a multiple of 14 (default 224)")
    parser.add_argument("--sw-batch-size", type=int, default=16, help="slices per network call (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--metric-runs", type=int, default=5, help="organ_metrics runs (default 5)")
    parser.add_argument("--skip-inference", action="store_true", help="only time the organ metrics")
    parser.add_argument("--serving", action="store_true", help="only (3): the whole volume through each serving path")
    parser.add_argument("--paths", nargs="+", choices=SERVING_PATHS, default=list(SERVING_PATHS), metavar="PATH",
                        help=f"the serving paths of --serving (default: all of {', '.join(SERVING_PATHS)})")
    parser.add_argument("--model", default=None, metavar="FILE",
                        help="--serving: a bundle's model.pt with its model.json (default: random weights)")
    parser.add_argument("--onnx-dir", default=None, metavar="DIR",
                        help="--serving: where the exports are kept between runs (default: a new temporary folder)")
    parser.add_argument("--monai-slice-inferer", action="store_true",
                        help="MONAI's SliceInferer instead of the bundle's AxialSliceInferer")
    parser.add_argument("--onnx-spinning", action="store_true",
                        help="--serving: onnxruntime's threads spin between runs (its own default) instead of sleeping "
                        "(the Synapse bundle's inference_onnx.yaml)")
    args = parser.parse_args()

    from monai.inferers import SliceInferer

    from spectraflow_monai.apps.synapse import map_btcv_labels, synthetic_ct_volume
    from spectraflow_monai.metrics import organ_metrics
    from spectraflow_monai.utils.inferers import AxialSliceInferer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = tuple(args.shape)
    print(f"load average at start (1/5/15 min): {load_avg()}", flush=True)
    start = time.perf_counter()
    image, label_a = synthetic_ct_volume(1, shape=shape)
    _, label_b = synthetic_ct_volume(2, shape=shape)
    print(f"phantoms {shape} generated in {time.perf_counter() - start:.1f} s", flush=True)
    if args.serving:
        time_serving_paths(args, image, shape)
        return

    rows = []
    if not args.skip_inference:
        t0 = time.perf_counter()
        x = preprocess(image, args.size)
        t_pre = time.perf_counter() - t0
        models = {
            "DINOv2 ViT-S encoder (bare, linear probe)": BareEncoderSegmenter(args.size).eval(),
            # the same weights as --serving's random model: the encoder filled as the bare one's, the heads filled
            "SpectraFlowNet-S (DAF + fdconv), 9 classes": serving_network(None, args.size)[0],
        }
        if args.monai_slice_inferer:
            inferer = SliceInferer(roi_size=(args.size, args.size), spatial_dim=2, sw_batch_size=args.sw_batch_size)
        else:
            inferer = AxialSliceInferer(args.sw_batch_size)
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
          f"{'SliceInferer' if args.monai_slice_inferer else 'AxialSliceInferer'} sw_batch_size {args.sw_batch_size}, "
          f"{args.rounds} interleaved rounds (median)\n")  # fmt: skip
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
