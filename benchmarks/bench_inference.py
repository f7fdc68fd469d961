"""Inference throughput of SpectraFlowNet against the bare encoder and MONAI baselines, measured in one run.

Usage::

    python benchmarks/bench_inference.py --threads 2 --batch 8 --size 224 --rounds 5
    python benchmarks/bench_inference.py --device cuda --batch 32 --precision fp32 bf16 fp16
    python benchmarks/bench_inference.py --threads 2 --batch 4 --models spectraflow --onnx all int8   # onnxruntime

Prints a markdown table (images/s and the ratio to the bare DINOv2 ViT-S encoder at the same precision) for the
current device. Each ``--precision`` is resolved by :func:`spectraflow_monai.utils.resolve_precision` (logged) and
runs the forward under its ``torch.autocast``. The models and precisions are timed in interleaved rounds
(A B C D, A B C D, ...) and the median round is reported, so that a background load affects every model alike.
The issue's target: SpectraFlowNet-S >= 0.85x the bare encoder on 2 CPU threads.

``--onnx`` (CPU; the ``onnx`` extra) adds SpectraFlowNet-S exported to ONNX
(:func:`spectraflow_monai.networks.export.export_onnx`, a free batch axis) and run by onnxruntime
(:class:`~spectraflow_monai.networks.export.OnnxNetwork`) with ``--threads`` intra-op threads (that sleep between runs
instead of spinning, so as not to take CPU from the model timed next; ``--onnx-spinning``: they spin, onnxruntime's
default), one row per variant:
a graph optimisation level (``disable``, ``basic``, ``extended``, ``all``) of the float32 model, or ``int8``: the
ViT's linear layers dynamically quantised to int8
(:func:`~spectraflow_monai.networks.export.quantize_encoder_linear`; the decoder and the frequency transforms stay
float32), at level ``all``. They are timed in the same interleaved rounds as the PyTorch models (the
``precision`` setting does not reach onnxruntime: each ONNX row runs once per round, under ``fp32``), and a second
table gives each one's throughput against SpectraFlowNet-S in PyTorch fp32 eager (the issue's target: >= 1.2x at
batch 4 on 2 threads) with its agreement with PyTorch on the timed batch: the largest logit difference, relative to
the spread (standard deviation) of PyTorch's logits, and the share of mask pixels that differ, thresholded at the
median of PyTorch's logits (half the pixels foreground: the logits of the random-weight network all sit close to one
value, so a threshold at 0 would compare constant masks).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

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


def fill_zero_heads(model: nn.Module, std: float = 0.1) -> nn.Module:
    """Give the decoder's zero-initialised parameters (FDConv's and DAF's attention heads, ...) N(0, ``std``)
    values, as training would: the logits then depend on the encoder's features, so that the agreement of an
    onnxruntime variant with PyTorch says something (the timing does not change: every branch runs either way)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.decoder.parameters():
            if not p.abs().gt(0).any():
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


#: the models ``--models`` chooses from, in table order
MODEL_KEYS = ("encoder", "spectraflow", "unet", "swinunetr")
#: the ONNX variants ``--onnx`` chooses from: onnxruntime's graph optimisation levels, and int8 (at level "all")
ONNX_VARIANTS = ("disable", "basic", "extended", "all", "int8")


def build_models(size: int, refine: str, keys: tuple[str, ...] = MODEL_KEYS) -> dict[str, nn.Module]:
    from monai.networks.nets import SwinUNETR, UNet

    from spectraflow_monai.networks import SpectraFlowNet

    builders = {
        "encoder": ("DINOv2 ViT-S encoder (bare)", lambda: BareEncoder(size)),
        "spectraflow": (
            f"SpectraFlowNet-S (DAF + {refine})",
            lambda: fill_zero_heads(SpectraFlowNet(out_channels=1, img_size=size, refine=refine)),
        ),
        "unet": (
            "MONAI UNet 2D",
            lambda: UNet(2, 3, 1, channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2), num_res_units=2),
        ),
        "swinunetr": ("MONAI SwinUNETR 2D (feature 24)", lambda: SwinUNETR(3, 1, feature_size=24, spatial_dims=2)),
    }
    return {builders[k][0]: builders[k][1]() for k in MODEL_KEYS if k in keys}


def build_onnx_models(
    network: nn.Module, size: int, threads: int, variants: list[str], folder: Path, spinning: bool = False
) -> dict[str, nn.Module]:
    """SpectraFlowNet-S exported once (checked at batch 1 and 3), one onnxruntime session per variant."""
    from spectraflow_monai.networks.export import OnnxNetwork, export_onnx, quantize_encoder_linear

    fp32 = export_onnx(network, folder / "spectraflow.onnx", image_size=size, atol=1e-3)
    # by default onnxruntime's threads sleep after a run instead of spinning, so that they take no CPU from the
    # PyTorch model timed next in the same round (--onnx-spinning: onnxruntime's own default, spinning)
    calm = {"session.intra_op.allow_spinning": "1" if spinning else "0"}
    models = {}
    for variant in variants:
        if variant == "int8":
            path = quantize_encoder_linear(fp32, folder / "spectraflow_int8.onnx")
            models["SpectraFlowNet-S ONNX, int8 ViT linears (opt all)"] = OnnxNetwork(
                path, threads=threads, session_config=calm
            )
        else:
            models[f"SpectraFlowNet-S ONNX (opt {variant})"] = OnnxNetwork(
                fp32, threads=threads, optimization=variant, session_config=calm
            )
    return models


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
                        help="precision settings (default fp32)")
    parser.add_argument("--models", nargs="+", default=list(MODEL_KEYS), choices=MODEL_KEYS,
                        help="PyTorch models timed (default: all)")
    parser.add_argument("--onnx", nargs="*", default=[], choices=ONNX_VARIANTS,
                        help="SpectraFlowNet-S through onnxruntime (CPU, the onnx extra), one row per variant: a graph "
                        "optimisation level, or int8 (the ViT's linear layers quantised); needs 'spectraflow' in "
                        "--models (default: none)")  # fmt: skip
    parser.add_argument("--onnx-spinning", action="store_true",
                        help="onnxruntime's threads spin between runs (its default) instead of sleeping")
    args = parser.parse_args()
    if args.onnx and ("spectraflow" not in args.models or args.device != "cpu" or "fp32" not in args.precision):
        parser.error("--onnx needs --device cpu, 'spectraflow' in --models and fp32 in --precision.")

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precisions = {p: resolve_precision(p, device) for p in args.precision}
    models = {name: m.to(device).eval() for name, m in build_models(args.size, args.refine, args.models).items()}
    params = {name: sum(q.numel() for q in m.parameters()) / 1e6 for name, m in models.items()}
    eager = next((name for name in models if name.startswith("SpectraFlowNet-S")), None)
    temp = tempfile.TemporaryDirectory(prefix="bench_onnx_")
    onnx_models = {}
    if args.onnx:
        onnx_models = build_onnx_models(
            models[eager], args.size, args.threads, args.onnx, Path(temp.name), args.onnx_spinning
        )
    torch.set_num_threads(args.threads)  # the export's check may have changed it
    models.update(onnx_models)
    params.update({name: params[eager] for name in onnx_models})
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    runs = [(name, p) for p in precisions for name in models if name not in onnx_models or p == "fp32"]
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

    base_name = next(iter(models)) if "encoder" in args.models else None
    med = {run: statistics.median(t) for run, t in times.items()}
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(f"\nInference at {args.size}x{args.size}, batch {args.batch}, {dev}, torch {torch.__version__}\n")
    print("| model | precision | params (M) | images/s | ratio to bare encoder | ratio to its fp32 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name, p in runs:
        ips = args.batch / med[name, p]
        base = f"{ips / (args.batch / med[base_name, p]):.3f}" if base_name is not None else "-"
        fp32 = f"{med[name, 'fp32'] / med[name, p]:.2f}x" if (name, "fp32") in med else "-"
        print(f"| {name} | {precisions[p].name} | {params[name]:.1f} | {ips:.2f} | {base} | {fp32} |")
    if onnx_models:
        with torch.inference_mode():
            want = models[eager](x)
        print(f"\nonnxruntime {onnx_version()} against {eager} in PyTorch fp32 eager, the same rounds:\n")
        print("| onnxruntime model | images/s | ratio to PyTorch eager | max logit difference / logit std | "
              "mask pixels differing (median threshold) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        threshold = want.median()
        for name in onnx_models:
            with torch.inference_mode():
                got = models[name](x)
            diff = float((got - want).abs().max() / want.std())
            flips = float(((got > threshold) != (want > threshold)).float().mean())
            ratio = med[eager, "fp32"] / med[name, "fp32"]
            print(f"| {name} | {args.batch / med[name, 'fp32']:.2f} | **{ratio:.2f}x** | {diff:.2g} | {flips:.2%} |")
    temp.cleanup()


def onnx_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    main()
