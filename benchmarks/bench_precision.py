"""bfloat16 against float32 on the CPU (``precision: bf16`` / ``fp32``), measured in one run.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/bench_precision.py --threads 2 --rounds 5 \\
        --model runs/demo/models/model.pt --data runs/demo/data

Prints the CPU model and its native-bfloat16 flags (``avx512_bf16`` / ``amx_bf16``, as
``lscpu | grep -o 'avx512_bf16\\|amx_bf16'`` shows them) and what ``precision: auto`` picks on it, then four parts,
each timing its float32 and bfloat16 variants in interleaved rounds (medians; the best round beside):

(a) inference: SpectraFlowNet-S at 224², batch 8, float32 against ``torch.autocast("cpu", dtype=torch.bfloat16)``;
    the issue's target is bf16 >= 1.6x float32 on a bf16-capable CPU;
(b) a trained model (``--model`` = a 2D bundle ``model.pt``, e.g. the demo's, and ``--data`` = its dataset folder):
    the share of validation pixels whose thresholded prediction agrees between bf16 and float32 (target >= 99.5 %)
    and the change of the mean Dice (target <= 0.5 point); skipped, with a message, when ``--model`` is not given;
(c) Stage-1: one ``MeanFlowPretrainer`` iteration against a plain encoder forward + backward + AdamW, each at the
    same precision (target: Stage-1 <= 1.3x its baseline at bf16 as at float32), as in ``bench_stage1.py``;
(d) slice-wise inference of a synthetic 512x512x100 CT volume with ``monai.inferers.SliceInferer`` (9 classes, the
    Synapse bundle's preprocessing), float32 against bf16 (``spectraflow_monai.utils.AutocastInferer``): the time
    ratio and the share of voxels whose label agrees.

Where the CPU lacks native bfloat16 the script says so (bfloat16 is then emulated, and ``auto`` picks float32). The
weights of (a), (c) and (d) are random (the agreement in (d) is therefore only indicative); (b) uses trained
weights. ``--tiny`` runs every part on toy sizes (a smoke test, no meaningful figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn as nn
import yaml
from bench_inference import fill_skipped_init  # same folder
from bench_stage1 import _sync

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLE_2D = os.path.join(HERE, "..", "bundles", "spectraflow_2d_segmentation")


def cpu_report() -> tuple[str, tuple[str, ...]]:
    """CPU model name and its native-bfloat16 flags."""
    from spectraflow_monai.utils import cpu_bf16_flags

    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model, cpu_bf16_flags()


def interleaved(fns: dict[str, Callable[[], None]], rounds: int, label: str) -> dict[str, list[float]]:
    """Seconds of every function in ``rounds`` interleaved rounds (after one warm-up call each)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for r in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
        print(f"{label}: round {r + 1}/{rounds} done", flush=True)
    return times


def build_net(size: int, out_channels: int, tiny: bool) -> nn.Module:
    from spectraflow_monai.networks import SpectraFlowNet

    kwargs = {"depth": 2} if tiny else {}
    return SpectraFlowNet(out_channels=out_channels, img_size=size, encoder_kwargs=kwargs or None).eval()


# ------------------------------------------------------------------------------------------------ (a) inference
def part_inference(args, bf16) -> tuple[float, float]:
    net = build_net(args.size, 1, args.tiny)
    x = torch.randn(args.batch, 3, args.size, args.size)
    outs: dict[str, torch.Tensor] = {}

    def run(ctx, key):
        def fn():
            with torch.inference_mode(), ctx():
                for _ in range(args.iters):
                    outs[key] = net(x).float()

        return fn

    times = interleaved({"fp32": run(nullcontext, "fp32"), "bf16": run(bf16.context, "bf16")}, args.rounds, "(a)")
    med = {k: statistics.median(v) / args.iters for k, v in times.items()}
    best = {k: min(v) / args.iters for k, v in times.items()}
    agree = float(((outs["fp32"] > 0) == (outs["bf16"] > 0)).float().mean())
    print(f"\n(a) Inference, SpectraFlowNet-S at {args.size}x{args.size}, batch {args.batch}, {args.threads} threads, "
          f"median of {args.rounds} interleaved rounds\n")  # fmt: skip
    print("| precision | s / batch | images/s | speed-up over fp32 | best round (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k in ("fp32", "bf16"):
        print(f"| {k} | {med[k]:.3f} | {args.batch / med[k]:.2f} | {med['fp32'] / med[k]:.3f} | {best[k]:.3f} |")
    ratio = med["fp32"] / med["bf16"]
    print(f"\nbf16 / fp32 speed-up = {ratio:.3f}x (target >= 1.6x: {'met' if ratio >= 1.6 else 'MISSED'}); "
          f"random weights: thresholded logits agree on {100 * agree:.2f} % of pixels")  # fmt: skip
    return ratio, agree


# ------------------------------------------------------------------------------------ (b) trained-model agreement
def part_agreement(args, bf16) -> None:
    if not args.model:
        print("\n(b) Agreement of a trained model: skipped (no --model given; e.g. --model runs/demo/models/model.pt "
              "--data runs/demo/data after `python -m spectraflow_monai demo --output runs/demo`)")  # fmt: skip
        return
    if not args.data:
        sys.exit("--model needs --data (the dataset folder the model was trained on, e.g. runs/demo/data)")
    from monai.bundle import ConfigParser

    from spectraflow_monai.utils.bundles import settings_overrides
    from monai.data import DataLoader, Dataset

    from spectraflow_monai.apps.seg2d import build_datalist
    from spectraflow_monai.utils.bundles import bundle_config_files

    parser = ConfigParser()
    parser.read_config([str(f) for f in bundle_config_files(BUNDLE_2D, ["train.yaml", "evaluate.yaml"])])
    overrides = {"dataset": args.dataset, "dataset_dir": os.path.abspath(args.data), "datalist_kwargs": {},
                 "device": "$torch.device('cpu')", "image_size": args.model_size}  # fmt: skip
    for item in args.override:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)  # numbers, lists, dicts and null as on the bundle command line
    parser.update(settings_overrides(parser.config, overrides))  # a setting by its field name: at its id
    net = parser.get_parsed_content("network_def").eval()
    state = torch.load(args.model, map_location="cpu", weights_only=True)
    state = state.get("model", state) if isinstance(state, dict) else state
    net.load_state_dict(state)
    datalist = build_datalist(args.dataset, args.data, "val", check_images=False, check_masks=False)
    loader = DataLoader(Dataset(datalist, parser.get_parsed_content("evaluate#preprocessing")), batch_size=args.batch)
    agree = total = 0
    dice = {"fp32": [], "bf16": []}
    t = {"fp32": 0.0, "bf16": 0.0}
    with torch.inference_mode():
        for batch in loader:
            image, label = batch["image"].as_tensor().float(), batch["label"].as_tensor() > 0.5
            preds = {}
            for key, ctx in (("fp32", nullcontext), ("bf16", bf16.context)):
                start = time.perf_counter()
                with ctx():
                    preds[key] = torch.sigmoid(net(image).float()) > 0.5
                t[key] += time.perf_counter() - start
                inter = (preds[key] & label).flatten(1).sum(1).float()
                size = preds[key].flatten(1).sum(1).float() + label.flatten(1).sum(1).float()
                dice[key] += torch.where(size > 0, 2 * inter / size.clamp_min(1), torch.ones_like(size)).tolist()
            agree += int((preds["fp32"] == preds["bf16"]).sum())
            total += preds["fp32"].numel()
    share = 100.0 * agree / total
    mean = {k: 100.0 * statistics.fmean(v) for k, v in dice.items()}
    delta = mean["bf16"] - mean["fp32"]
    print(f"\n(b) Trained model {args.model} on the {len(datalist)} validation images of {args.data} "
          f"({args.model_size}x{args.model_size})\n")  # fmt: skip
    print("| precision | mean Dice (%) | s (whole set) |")
    print("| --- | ---: | ---: |")
    for k in ("fp32", "bf16"):
        print(f"| {k} | {mean[k]:.2f} | {t[k]:.2f} |")
    print(f"\nthresholded predictions agree on {share:.3f} % of pixels (target >= 99.5 %: "
          f"{'met' if share >= 99.5 else 'MISSED'}); Dice moves by {delta:+.3f} points (target <= 0.5: "
          f"{'met' if abs(delta) <= 0.5 else 'MISSED'})")  # fmt: skip


# ---------------------------------------------------------------------------------------------------- (c) Stage-1
def part_stage1(args, bf16) -> None:
    from spectraflow_monai.engines import DispersiveConfig, MeanFlowConfig, MeanFlowPretrainer
    from spectraflow_monai.losses import DispersiveLoss, MeanFlowLoss
    from spectraflow_monai.networks import DINOv2Encoder, MeanFlowHead
    from spectraflow_monai.utils import amp_kwargs

    device = torch.device("cpu")
    size, batch = args.stage1_size, args.stage1_batch
    model_kwargs = {"weight_init": "skip", **({"depth": 2} if args.tiny else {})}

    def encoder():
        enc = DINOv2Encoder(
            "vit_small_patch14_dinov2", img_size=size, trainable_blocks="all", model_kwargs=model_kwargs
        )
        return fill_skipped_init(enc).to(device)

    def baseline(ctx):
        enc = encoder().train()
        opt = torch.optim.AdamW(enc.trainable_parameters(), lr=1e-5, weight_decay=0.05)

        def step(data):
            opt.zero_grad(set_to_none=False)
            with ctx():
                loss = enc(data["image"]).final.float().pow(2).mean()
            loss.backward()
            opt.step()

        return step

    def stage1(precision):
        enc = encoder()
        head = MeanFlowHead(in_channels=enc.embed_dim, hidden_channels=256, num_blocks=2, num_domains=2).to(device)
        opt = torch.optim.AdamW(enc.trainable_parameters() + list(head.parameters()), lr=1e-5, weight_decay=0.05)
        trainer = MeanFlowPretrainer(
            device=device, max_epochs=1, train_data_loader=[None], encoder=enc, head=head, optimizer=opt,
            meanflow=MeanFlowConfig(loss=MeanFlowLoss(ratio_unequal=0.25)),
            dispersive=DispersiveConfig(
                weight=0.4, loss=DispersiveLoss(variant="infonce_l2", tau=0.5, normalize="dim")
            ),
            ema=None, amp=precision.autocast, amp_kwargs=amp_kwargs(precision),
        )  # fmt: skip

        def step(data):
            trainer.state.iteration += 1
            trainer._iteration(trainer, data)

        return step

    from spectraflow_monai.utils import resolve_precision

    fp32 = resolve_precision("fp32", "cpu", log=False)
    data = {"image": torch.randn(batch, 3, size, size), "domain": torch.arange(batch) % 2}
    steps = {
        "baseline fp32": baseline(nullcontext),
        "Stage-1 fp32": stage1(fp32),
        "baseline bf16": baseline(bf16.context),
        "Stage-1 bf16": stage1(bf16),
    }
    times = interleaved({k: (lambda s=s: (s(data), _sync(device))) for k, s in steps.items()}, args.rounds, "(c)")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n(c) Training iteration, ViT-S/14 at {size}x{size}, batch {batch}, {args.threads} threads, median of "
          f"{args.rounds} interleaved rounds (no EMA)\n")  # fmt: skip
    print("| iteration | s/iteration | images/s | ratio to baseline (same precision) | bf16 speed-up |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in steps:
        prec = name.split()[-1]
        base = med[f"baseline {prec}"]
        speed = med[name.replace("bf16", "fp32")] / med[name] if prec == "bf16" else 1.0
        print(f"| {name} | {med[name]:.3f} | {batch / med[name]:.2f} | {med[name] / base:.3f} | {speed:.3f} |")
    for prec in ("fp32", "bf16"):
        ratio = med[f"Stage-1 {prec}"] / med[f"baseline {prec}"]
        print(f"Stage-1 / baseline at {prec} = {ratio:.3f}x (target <= 1.3x: {'met' if ratio <= 1.3 else 'MISSED'})")


# ----------------------------------------------------------------------------------------------- (d) slice-wise 3D
def part_slices(args, bf16) -> None:
    from bench_synapse import NUM_CLASSES, postprocess, preprocess
    from monai.inferers import SliceInferer

    from spectraflow_monai.apps.synapse import synthetic_ct_volume
    from spectraflow_monai.utils import AutocastInferer

    shape = tuple(args.shape)
    image, _ = synthetic_ct_volume(1, shape=shape)
    x = preprocess(image, args.size)
    net = build_net(args.size, NUM_CLASSES, args.tiny)
    plain = SliceInferer(roi_size=(args.size, args.size), spatial_dim=2, sw_batch_size=args.sw_batch_size)
    inferers = {"fp32": plain, "bf16": AutocastInferer(plain, bf16)}
    labels: dict[str, torch.Tensor] = {}

    def run(key):
        def fn():
            with torch.inference_mode():
                labels[key] = postprocess(inferers[key](x, net), shape)

        return fn

    times = interleaved({k: run(k) for k in inferers}, args.rounds, "(d)")
    med = {k: statistics.median(v) for k, v in times.items()}
    agree = 100.0 * float((labels["fp32"] == labels["bf16"]).float().mean())
    print(f"\n(d) Slice-wise inference of a {shape} CT volume (slices at {args.size}^2, SliceInferer sw_batch_size "
          f"{args.sw_batch_size}, {NUM_CLASSES} classes, random weights), median of {args.rounds} "
          "rounds\n")  # fmt: skip
    print("| precision | s / volume | slices/s | speed-up over fp32 | best round (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k in ("fp32", "bf16"):
        print(f"| {k} | {med[k]:.2f} | {shape[2] / med[k]:.2f} | {med['fp32'] / med[k]:.3f} | {min(times[k]):.2f} |")
    print(f"\nbf16 / fp32 speed-up = {med['fp32'] / med['bf16']:.3f}x; labels agree on {agree:.3f} % of the voxels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads (default 2)")
    parser.add_argument("--batch", type=int, default=8, help="batch size of (a) and (b) (default 8)")
    parser.add_argument("--size", type=int, default=224, help="input size of (a) and (d), multiple of 14 (default 224)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--iters", type=int, default=2, help="forward passes per round in (a) (default 2)")
    parser.add_argument("--parts", default="abcd", help="parts to run, any of a, b, c, d (default abcd)")
    parser.add_argument("--model", help="(b): a trained 2D bundle model.pt (e.g. runs/demo/models/model.pt)")
    parser.add_argument("--data", help="(b): its dataset folder (e.g. runs/demo/data)")
    parser.add_argument("--dataset", default="synthetic", help="(b): dataset preset of --data (default synthetic)")
    parser.add_argument("--model-size", type=int, default=224, help="(b): image_size of the model (default 224)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="(b): extra 2D bundle setting the model was trained with (repeatable)")  # fmt: skip
    parser.add_argument("--stage1-size", type=int, default=224, help="(c): input size (default 224)")
    parser.add_argument("--stage1-batch", type=int, default=8, help="(c): batch size, >= 2 (default 8)")
    parser.add_argument("--shape", type=int, nargs=3, default=[512, 512, 100], metavar=("H", "W", "D"),
                        help="(d): CT volume shape (default 512 512 100)")  # fmt: skip
    parser.add_argument("--sw-batch-size", type=int, default=16, help="(d): slices per network call (default 16)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes for a smoke test (no meaningful figures)")
    args = parser.parse_args()
    if args.tiny:
        args.batch, args.size, args.rounds, args.iters = 2, 28, 1, 1
        args.stage1_size, args.stage1_batch, args.shape, args.sw_batch_size = 28, 2, [32, 32, 3], 2
        args.model_size = 28 if args.model is None else args.model_size
    if set(args.parts) - set("abcd") or not args.parts:
        parser.error(f"--parts must hold only the letters a, b, c, d, got {args.parts!r}")
    if args.size % 14 or args.stage1_size % 14:
        parser.error(f"--size and --stage1-size must be multiples of 14, got {args.size} and {args.stage1_size}")
    if args.stage1_batch < 2:
        parser.error(f"--stage1-batch must be >= 2 (dispersive loss), got {args.stage1_batch}")

    from spectraflow_monai.utils import resolve_precision

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, flags = cpu_report()
    auto = resolve_precision("auto", "cpu", log=False)
    print(f"CPU: {model}; native bfloat16 flags: {' '.join(flags) if flags else 'none'}; torch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}); {args.threads} threads; "
          f"precision auto -> {auto}")  # fmt: skip
    if not flags:
        print("NOTE: this CPU lacks native bfloat16 (no avx512_bf16 / amx_bf16): bf16 below is emulated and "
              "`precision: auto` picks fp32 here; the bf16 targets apply to bf16-capable CPUs only.")  # fmt: skip
    bf16 = resolve_precision("bf16", "cpu", log=False)
    if "a" in args.parts:
        part_inference(args, bf16)
    if "b" in args.parts:
        part_agreement(args, bf16)
    if "c" in args.parts:
        part_stage1(args, bf16)
    if "d" in args.parts:
        part_slices(args, bf16)


if __name__ == "__main__":
    main()
