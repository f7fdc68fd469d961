"""Stage-2 training throughput of the 2D bundle's trainer: SpectraFlow against MONAI's 2D UNet and U-Net++ (the
paper's Fig. 5 baseline), per precision.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/bench_stage2_throughput.py --dataset kvasir \\
        --dataset-dir ../shared/data/kvasir-seg --threads 2 --iters 30 --precision fp32 bf16

Both trainers are the ``train#trainer`` of ``bundles/spectraflow_2d_segmentation/configs/train.yaml`` (for the UNet
with the bundle's ``configs/unet_baseline.yaml`` on top, as ``kvasir_protocol.sh`` trains it, for U-Net++ with
``configs/unetpp_baseline.yaml``): the same data path (``data_path``: ``CacheDataset`` + ``DataLoader``, or the device
cache with batched augmentation), Dice + BCE + boundary loss, AdamW and the train
metric; only the validation / logging handlers are left out. Each trainer runs ``--warmup`` + ``--iters`` real
iterations per precision (one epoch of that length); the time from the end of the last warm-up iteration to the
end of the last iteration, data loading included, gives images/s. Models and precisions alternate within a round,
``--rounds`` rounds, medians reported.

Precision: each ``--precision`` value is the bundle setting ``precision`` of its own trainer (one per model and
precision, all sharing one cached training set): the network's forward runs under the bundle's
:class:`spectraflow_monai.utils.AutocastInferer`, the trainer's ``amp`` is :attr:`Precision.use_grad_scaler`
(float16 on CUDA only) and its ``amp_kwargs`` :func:`spectraflow_monai.utils.amp_kwargs`.

The issue's targets (Kvasir-SEG copy, 2 CPU threads): SpectraFlow >= 1.0x the UNet, and SpectraFlow at bf16 >= 1.4x
its own float32. ``--no-loader`` times the trainer's own iteration (forward, loss, backward, optimizer step, train
metric) on one batch taken from its data loader, repeated, so that data loading and its worker processes are left out:
the network's share of the figure (not the target's measurement). ``--tiny`` runs on a generated toy set (a smoke
test, no meaningful figures).

Work per image: before timing, one training step of each model (forward under its inferer, loss, backward; no
optimizer step) on one batch of its loader is counted with ``torch.utils.flop_counter.FlopCounterMode`` (attention
through PyTorch's math kernel, so that its matrix products are counted too; BatchNorm statistics see that batch
once more). The FLOP ratio is the throughput ratio two models would have at equal arithmetic efficiency: it tells a
slow implementation from a model that simply has more work to do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import yaml
from bench_stage1 import _sync  # same folder

from spectraflow_monai.utils.precision import PRECISION_SETTINGS

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLE = os.path.join(HERE, "..", "bundles", "spectraflow_2d_segmentation")
BASELINE_CONFIGS = {  # the bundle's baseline overrides, merged on top of train.yaml
    "unet": os.path.join(BUNDLE, "configs", "unet_baseline.yaml"),
    "unetpp": os.path.join(BUNDLE, "configs", "unetpp_baseline.yaml"),
}
MODELS = {
    "spectraflow": "SpectraFlow-S (bundle)",
    "unet": "MONAI UNet 2D (unet_baseline.yaml)",
    "unetpp": "U-Net++ 2D (unetpp_baseline.yaml)",
}
SHORT_NAMES = {"spectraflow": "SpectraFlow", "unet": "UNet", "unetpp": "U-Net++"}


def build_trainer(model: str, precision: str, args, root: str, shared_dataset=None):
    """The bundle's Stage-2 trainer of ``model`` at the bundle setting ``precision``, for ``--warmup + --iters``
    iterations per run."""
    from monai.bundle import ConfigParser

    from spectraflow_monai.utils.bundles import settings_overrides

    from spectraflow_monai.utils.bundles import bundle_config_files

    baseline = [BASELINE_CONFIGS[model]] if model in BASELINE_CONFIGS else []
    files = bundle_config_files(BUNDLE, ["train.yaml", *baseline])
    parser = ConfigParser()
    parser.read_config([str(f) for f in files])
    overrides = {
        "bundle_root": os.path.join(root, f"{model}_{precision}"),
        "dataset": args.dataset,
        "dataset_dir": os.path.abspath(args.dataset_dir),
        "device": f"$torch.device('{args.device}')",
        "max_epochs": 1,
        "precision": precision,
        "progress_bar": False,
        # the boundary-weight ramp only: no validation, no logging
        "train#handlers": [{"_target_": "spectraflow_monai.handlers.BoundaryWeightRamp", "loss": "@train#loss"}],
        "train#trainer#epoch_length": args.warmup + args.iters,
    }
    if "stage2_settings" in parser:  # the encoder weights do not change the throughput: no file or download needed
        overrides.update({"encoder_init": "random", "pretrained_weights": None})
    for name in ("batch_size", "num_workers", "cache_rate", "image_size"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    for item in args.override:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    parser.update(settings_overrides(parser.config, overrides))  # a setting by its field name: at its id
    if shared_dataset is not None:  # one cache of the training images for both models
        parser["shared_dataset"] = shared_dataset
        parser["train#dataloader"] = "$@stage2.train_loader(@shared_dataset, @train_sampler)"
    for i in range(len(parser["run"]) - 1):  # the run's steps before training (setup, record, encoder weights)
        parser.get_parsed_content(f"run#{i}")
    trainer = parser.get_parsed_content("train#trainer")
    loader = parser.get_parsed_content("train#dataloader")  # data_path device: the loader holds its own cache
    return trainer, getattr(loader, "dataset", None)


def timed_run(trainer, warmup: int, iters: int, batch_size: int) -> tuple[float, float, list[str]]:
    """Run one epoch; images/s after the warm-up iterations, the last loss and the dtypes the network computed in."""
    from ignite.engine import Events

    stamps: list[float] = []
    dtypes: set[torch.dtype] = set()
    handle = trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda _: stamps.append(time.perf_counter()))
    hook = trainer.network.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    if trainer.state.epoch >= trainer.state.max_epochs:
        # a later round: ignite would start a new run with an epoch of the loader's whole length (epoch_length is not
        # kept); one more epoch of the same run keeps --warmup + --iters iterations
        trainer.state.max_epochs = trainer.state.epoch + 1
    try:
        trainer.run()
    finally:
        handle.remove()
        hook.remove()
    if len(stamps) != warmup + iters:
        raise RuntimeError(f"{len(stamps)} iterations ran instead of --warmup + --iters = {warmup + iters} (is the "
                           "training set smaller than that?)")  # fmt: skip
    timed = len(stamps) - warmup
    start = stamps[warmup - 1] if warmup > 0 else stamps[0]
    n = timed if warmup > 0 else timed - 1
    output = trainer.state.output
    loss = float(output[0]["loss"] if isinstance(output, list) else output["loss"])
    return batch_size * n / (stamps[-1] - start), loss, sorted(str(d).replace("torch.", "") for d in dtypes)


def timed_iterations(trainer, warmup: int, iters: int, batch_size: int) -> tuple[float, float, list[str]]:
    """Images/s of the trainer's own iteration on one batch of its data loader, repeated (no data loading)."""
    batch = next(iter(trainer.data_loader))
    dtypes: set[torch.dtype] = set()
    hook = trainer.network.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    device = torch.device(trainer.state.device)
    try:
        trainer.network.train()
        for i in range(warmup + iters):
            if i == warmup:
                _sync(device)
                start = time.perf_counter()
            trainer.state.iteration += 1
            output = trainer._iteration(trainer, batch)
        _sync(device)
        elapsed = time.perf_counter() - start
    finally:
        hook.remove()
    loss = float(output[0]["loss"] if isinstance(output, list) else output["loss"])
    return batch_size * iters / elapsed, loss, sorted(str(d).replace("torch.", "") for d in dtypes)


def training_flops(trainer) -> float:
    """FLOPs per image of one training step of ``trainer.network`` (forward under the trainer's inferer, loss,
    backward; no optimizer step) on one batch of the trainer's data loader."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    batch = next(iter(trainer.data_loader))
    prepared = trainer.prepare_batch(batch, trainer.state.device, trainer.non_blocking, **trainer.to_kwargs)
    inputs, targets, args, kwargs = (*prepared, (), {}) if len(prepared) == 2 else prepared  # as SupervisedTrainer
    trainer.network.train()
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention kernel has no FLOP formula in torch
        preds = trainer.inferer(inputs, trainer.network, *args, **kwargs)
        trainer.loss_function(preds, targets).mean().backward()
    trainer.network.zero_grad(set_to_none=True)
    return counter.get_total_flops() / inputs.shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="kvasir", help="2D bundle dataset preset (default kvasir)")
    parser.add_argument("--dataset-dir", help="the dataset folder (e.g. ../shared/data/kvasir-seg)")
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=PRECISION_SETTINGS,
                        help="settings (default fp32 bf16)")  # fmt: skip
    parser.add_argument("--models", nargs="+", default=["spectraflow", "unet"], choices=list(MODELS),
                        help="models to time (default spectraflow unet; unetpp: the paper's Fig. 5 baseline)")
    parser.add_argument("--iters", type=int, default=30, help="timed iterations per run (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first iterations per run (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of runs (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--batch-size", dest="batch_size", type=int, help="bundle batch_size (default: the bundle's)")
    parser.add_argument("--num-workers", dest="num_workers", type=int, help="bundle num_workers (default: bundle's)")
    parser.add_argument("--cache-rate", dest="cache_rate", type=float, help="bundle cache_rate (default: bundle's)")
    parser.add_argument("--image-size", dest="image_size", type=int, help="bundle image_size (default: bundle's)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra bundle setting of both models (repeatable), e.g. pretrained_weights=/w.pth")
    parser.add_argument("--no-loader", dest="no_loader", action="store_true",
                        help="time the trainer's iteration on one fixed batch (data loading left out)")
    parser.add_argument("--tiny", action="store_true", help="generated toy set, tiny sizes (smoke test)")
    args = parser.parse_args()
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--iters and --rounds must be >= 1 and --warmup >= 0")
    if args.warmup == 0 and args.iters < 2 and not args.no_loader:
        parser.error("--warmup 0 needs --iters >= 2 (the first iteration's end starts the clock)")

    from spectraflow_monai.utils import cpu_bf16_flags, resolve_precision

    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        flags = cpu_bf16_flags()
        print(f"CPU native bfloat16 flags: {' '.join(flags) if flags else 'none'}; precision auto -> "
              f"{resolve_precision('auto', 'cpu', log=False)}")  # fmt: skip
        if not flags and "bf16" in args.precision:
            print("NOTE: this CPU lacks native bfloat16 (no avx512_bf16 / amx_bf16): bf16 is emulated here (much "
                  "slower than fp32) and `precision: auto` picks fp32; the bf16 target applies to bf16-capable "
                  "CPUs.")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="stage2_throughput_") as root:
        if args.tiny:
            from spectraflow_monai.apps.seg2d import generate_synthetic_dataset

            args.dataset, args.dataset_dir = "synthetic", os.path.join(root, "data")
            tiny = {"num_train": 6, "num_val": 2, "size": 112}  # 3 batches: an epoch is shorter than the loader
            generate_synthetic_dataset(args.dataset_dir, **tiny)
            args.batch_size, args.num_workers, args.image_size = 2, 0, 112
            args.iters, args.warmup = 1, 1
            args.override = [*args.override, "encoder_kwargs={depth: 2}", f"synthetic_size={tiny}"]
        elif not args.dataset_dir:
            parser.error("--dataset-dir is needed (or --tiny)")
        precisions = {p: resolve_precision(p, args.device) for p in args.precision}
        trainers, dataset = {}, None
        for name in precisions:
            for model in args.models:
                start = time.perf_counter()
                trainers[(model, name)], dataset = build_trainer(model, name, args, root, dataset)
                inferer = trainers[(model, name)].inferer
                print(f"{MODELS[model]} at precision {name}: trainer built in {time.perf_counter() - start:.1f} s "
                      f"({inferer!r}, amp={trainers[(model, name)].amp})", flush=True)  # fmt: skip
        batch = trainers[(args.models[0], args.precision[0])].data_loader.batch_size
        flops = {model: training_flops(trainers[(model, args.precision[0])]) for model in args.models}
        for model, value in flops.items():
            print(f"{MODELS[model]}: {value / 1e9:.2f} GFLOP per training image (forward + loss + backward)")
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for name, precision in precisions.items():
                for model in args.models:
                    trainer = trainers[(model, name)]
                    if args.no_loader:
                        ips, loss, dtypes = timed_iterations(trainer, args.warmup, args.iters, batch)
                    else:
                        ips, loss, dtypes = timed_run(trainer, args.warmup, args.iters, batch)
                    if not torch.isfinite(torch.tensor(loss)):
                        raise RuntimeError(f"{model} at {name}: the loss is not finite ({loss})")
                    results.setdefault((model, name), []).append(ips)
                    print(f"round {r + 1}: {model} {precision}: {ips:.2f} images/s (loss {loss:.3f}, network output "
                          f"{'/'.join(dtypes)})", flush=True)  # fmt: skip

    med = {key: statistics.median(v) for key, v in results.items()}
    dev = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else f"CPU, {args.threads} threads"
    print(f"\nStage-2 training throughput, {args.dataset} ({args.dataset_dir}), batch {batch}, {dev}, torch "
          f"{torch.__version__}; {args.iters} timed iterations after {args.warmup} per run, "
          f"{'one fixed batch, no data loading' if args.no_loader else 'data loading included'}, "
          f"median of {args.rounds} round(s)\n")  # fmt: skip
    print("| model | precision | images/s | ratio to UNet (same precision) | ratio to own first precision |")
    print("| --- | --- | ---: | ---: | ---: |")
    first = args.precision[0]
    for model in args.models:
        for name in args.precision:
            unet = med.get(("unet", name))
            to_unet = f"{med[(model, name)] / unet:.3f}" if unet else "-"
            print(f"| {MODELS[model]} | {name} | {med[(model, name)]:.2f} | {to_unet} | "
                  f"{med[(model, name)] / med[(model, first)]:.3f} |")  # fmt: skip
    if "spectraflow" in args.models and "unetpp" in args.models:
        for name in args.precision:
            ratio = med[("spectraflow", name)] / med[("unetpp", name)]
            print(f"SpectraFlow / U-Net++ at {name} = {ratio:.3f}x")
    if "spectraflow" in args.models and "unet" in args.models:
        for name in args.precision:
            ratio = med[("spectraflow", name)] / med[("unet", name)]
            verdict = "not the target's measurement (--no-loader)" if args.no_loader else (
                "met" if ratio >= 1.0 else "MISSED")  # fmt: skip
            print(f"SpectraFlow / UNet at {name} = {ratio:.3f}x (target >= 1.0x: {verdict})")
    for model in ("unet", "unetpp"):
        if "spectraflow" in args.models and model in args.models:
            print(f"{SHORT_NAMES[model]} / SpectraFlow FLOPs per training image = "
                  f"{flops[model] / flops['spectraflow']:.3f} (the throughput ratio at equal arithmetic "
                  "efficiency)")  # fmt: skip
    if "spectraflow" in args.models and {"fp32", "bf16"} <= set(args.precision):
        ratio = med[("spectraflow", "bf16")] / med[("spectraflow", "fp32")]
        verdict = "not the target's measurement (--no-loader)" if args.no_loader else (
            "met" if ratio >= 1.4 else "MISSED")  # fmt: skip
        print(f"SpectraFlow bf16 / fp32 = {ratio:.3f}x (target >= 1.4x: {verdict})")


if __name__ == "__main__":
    main()
