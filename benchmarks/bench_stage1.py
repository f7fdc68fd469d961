"""Cost of one SpectraFlow Stage-1 iteration against a plain full-encoder training iteration, measured in one run.

Usage::

    python benchmarks/bench_stage1.py --threads 2 --batch 8 --size 224 --rounds 5

Two training iterations on the same input batch, both with every encoder parameter trainable and an AdamW step:

- baseline: ``DINOv2Encoder`` ViT-S/14 forward, a trivial loss ``mean(final²)``, backward, optimizer step;
- Stage-1: one real :meth:`spectraflow_monai.engines.MeanFlowPretrainer._iteration` (encoder forward, latent
  normalisation, ``MeanFlowHead`` forward, the stop-gradient JVP MeanFlow target, dispersive loss on the pooled
  penultimate features, backward, optimizer step), with the head configuration of the bundle (hidden 256, 2
  attention blocks, mixed image/mask batch) plus the domain embedding (``num_domains=2``), an extension the bundle
  leaves off by default (``head_condition_on_domain: false``). ``--ema`` adds the EMA-0.999 encoder update of the
  bundle (the trainer's ignite ``EMAHandler``, fired as after every optimizer step).

The two are timed in interleaved rounds (baseline, Stage-1, baseline, Stage-1, ...) and the median round is
reported, so that a background load affects both alike; the best round is shown beside it (the one least disturbed
by other processes on a shared machine). A second table splits the Stage-1 iteration into its pieces (encoder
forward, head forward, JVP target, dispersive loss, backward, optimizer step), each timed separately with the
trainer's own modules and loss objects, next to the baseline's pieces. The issue's target: Stage-1 iteration
<= 1.3x the baseline iteration on 2 CPU threads (ViT-S, 224², batch 8).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from spectraflow_monai.utils.precision import PRECISION_SETTINGS, resolve_precision


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_encoder(size: int, device: torch.device):
    """ViT-S/14 DINOv2 encoder with every parameter trainable (random weights, no timm init cost)."""
    from spectraflow_monai.networks import DINOv2Encoder

    from bench_inference import fill_skipped_init  # same folder

    enc = DINOv2Encoder(
        "vit_small_patch14_dinov2", img_size=size, trainable_blocks="all", model_kwargs={"weight_init": "skip"}
    )
    return fill_skipped_init(enc).to(device)


class BaselineStep:
    """Plain training iteration: encoder forward, ``mean(final²)``, backward, AdamW step."""

    def __init__(self, size: int, device: torch.device, lr: float, precision=None) -> None:
        self.encoder = build_encoder(size, device).train()
        self.optimizer = torch.optim.AdamW(self.encoder.trainable_parameters(), lr=lr, weight_decay=0.05)
        self.precision = precision or resolve_precision("fp32", device, log=False)
        self.scaler = torch.amp.GradScaler(device.type) if self.precision.use_grad_scaler else None

    def __call__(self, batch: dict[str, torch.Tensor]) -> None:
        self.optimizer.zero_grad(set_to_none=False)
        with self.precision.context():
            loss = self.encoder(batch["image"]).final.float().pow(2).mean()
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def pieces(self, batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, float]:
        """Seconds of each piece of one iteration (forward, backward, optimizer step)."""
        times: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=False)
        with _Timer(times, "encoder forward", device):
            loss = self.encoder(batch["image"]).final.pow(2).mean()
        with _Timer(times, "backward", device):
            loss.backward()
        with _Timer(times, "optimizer step", device):
            self.optimizer.step()
        return times


class Stage1Step:
    """One real ``MeanFlowPretrainer`` iteration with the bundle's Stage-1 configuration, the head domain-conditioned
    (``num_domains=2``; the bundle's default ``head_condition_on_domain: false`` has no domain embedding)."""

    def __init__(self, size: int, device: torch.device, lr: float, ema: bool, precision=None) -> None:
        from spectraflow_monai.engines import DispersiveConfig, EMAConfig, MeanFlowConfig, MeanFlowPretrainer
        from spectraflow_monai.losses import DispersiveLoss, MeanFlowLoss
        from spectraflow_monai.networks import MeanFlowHead

        encoder = build_encoder(size, device)
        head = MeanFlowHead(in_channels=encoder.embed_dim, hidden_channels=256, num_blocks=2, num_domains=2)
        head = head.to(device)
        optimizer = torch.optim.AdamW(
            encoder.trainable_parameters() + list(head.parameters()), lr=lr, weight_decay=0.05
        )
        self.ema = ema
        self.trainer = MeanFlowPretrainer(
            device=device,
            max_epochs=1,
            train_data_loader=[None],  # batches are passed to _iteration directly
            encoder=encoder,
            head=head,
            optimizer=optimizer,
            meanflow=MeanFlowConfig(loss=MeanFlowLoss(ratio_unequal=0.25)),
            dispersive=DispersiveConfig(
                weight=0.4, loss=DispersiveLoss(variant="infonce_l2", tau=0.5, normalize="dim")
            ),
            ema=EMAConfig(decay=0.999) if ema else None,
            # as the bundle's Stage-1 trainer: autocast of the precision setting (a grad scaler for float16)
            amp=bool(precision is not None and precision.autocast),
            amp_kwargs=precision.amp_kwargs if precision is not None else None,
        )

    def __call__(self, batch: dict[str, torch.Tensor]) -> None:
        from ignite.engine import Events

        trainer = self.trainer
        trainer.state.iteration += 1
        trainer._iteration(trainer, batch)
        if self.ema:
            trainer.fire_event(Events.ITERATION_COMPLETED)  # the EMAHandler, filtered on optimizer steps

    def pieces(self, batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, float]:
        """Seconds of each piece of one Stage-1 iteration, run with the trainer's own modules and losses.

        Same computation as ``MeanFlowPretrainer._iteration`` + ``MeanFlowLoss.compute`` (float32, no accumulation),
        split so that each piece can be timed; the sum is compared with the real iteration in the report.
        """
        from ignite.engine import Events

        from spectraflow_monai.engines import normalize_latent
        from spectraflow_monai.losses.meanflow import meanflow_target

        tr = self.trainer
        enc, head, mf = tr.encoder, tr.head, tr.meanflow_loss
        images, domain = batch["image"], batch["domain"]
        times: dict[str, float] = {}
        tr.optimizer.zero_grad(set_to_none=False)
        with _Timer(times, "encoder forward", device):
            feats = enc(images)
            z0 = normalize_latent(feats.final)
        with _Timer(times, "head forward (u_pred)", device):
            t, s = mf.sample_times(z0.shape[0], device=z0.device)
            tb = t.view(-1, 1, 1, 1)
            noise = torch.randn_like(z0)
            z_t = (1 - tb) * z0 + tb * noise
            v = noise - z0
            u_pred = head(z_t, t, s, domain=domain)
        with _Timer(times, "JVP target (no grad)", device):
            u_tgt = meanflow_target(lambda z, tt, ss: head(z, tt, ss, domain=domain), z_t, t, s, v)
        with _Timer(times, "dispersive loss", device):
            loss_disp = tr.dispersive_loss(feats.pooled)
        per_sample = (u_pred - u_tgt).pow(2).flatten(1).sum(1)
        loss = (per_sample / (per_sample.detach() + mf.adaptive_c).pow(mf.adaptive_p)).mean()
        loss = loss + tr.dispersive_weight * loss_disp
        with _Timer(times, "backward", device):
            loss.backward()
        with _Timer(times, "optimizer step", device):
            tr.optimizer.step()
        if self.ema:
            tr.optimizer_stepped = True
            with _Timer(times, "EMA update", device):
                tr.fire_event(Events.ITERATION_COMPLETED)
        return times


class _Timer:
    """Context manager adding the elapsed seconds of its block to ``times[name]``."""

    def __init__(self, times: dict[str, float], name: str, device: torch.device) -> None:
        self.times, self.name, self.device = times, name, device

    def __enter__(self) -> None:
        _sync(self.device)
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        _sync(self.device)
        self.times[self.name] = self.times.get(self.name, 0.0) + time.perf_counter() - self.start


def time_once(step: Callable, batch: dict[str, torch.Tensor], iters: int, device: torch.device) -> float:
    """Seconds per iteration, averaged over ``iters`` iterations."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        step(batch)
    _sync(device)
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads (default 2)")
    parser.add_argument("--batch", type=int, default=8, help="batch size, >= 2 (default 8)")
    parser.add_argument("--size", type=int, default=224, help="square input size, a multiple of 14 (default 224)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--iters", type=int, default=1, help="iterations per model per round (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--ema", action="store_true", help="include the EMA encoder update in the Stage-1 iteration")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the per-piece timing of Stage-1")
    parser.add_argument("--precision", default="fp32", choices=PRECISION_SETTINGS,
                        help="bundle precision setting of both iterations (default fp32; the breakdown is fp32)")  # fmt: skip
    args = parser.parse_args()
    if args.batch < 2:
        parser.error(f"--batch must be >= 2 (the dispersive loss needs in-batch negatives), got {args.batch}")
    if args.size % 14:
        parser.error(f"--size must be a multiple of the patch size 14, got {args.size}")
    if args.rounds < 1 or args.iters < 1:
        parser.error("--rounds and --iters must be >= 1")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device} was asked for but CUDA is not available")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    precision = resolve_precision(args.precision, device)
    if args.precision != "fp32" and not args.no_breakdown:
        parser.error("--precision other than fp32 needs --no-breakdown (the per-piece timing runs in float32)")
    lr = 1e-5
    steps: dict[str, Callable] = {
        "baseline: encoder fwd + bwd + AdamW": BaselineStep(args.size, device, lr, precision),
        "Stage-1: MeanFlowPretrainer iteration" + (" + EMA" if args.ema else ""): Stage1Step(
            args.size, device, lr, args.ema, precision
        ),
    }
    batch = {
        "image": torch.randn(args.batch, 3, args.size, args.size, device=device),
        "domain": (torch.arange(args.batch, device=device) % 2),  # mixed image/mask batch
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():  # warm-up (allocations, AdamW state)
        step(batch)
    for r in range(args.rounds):
        for name, step in steps.items():
            times[name].append(time_once(step, batch, args.iters, device))
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    breakdown: dict[str, dict[str, list[float]]] = {}
    if not args.no_breakdown:
        for r in range(args.rounds):
            for name, step in reversed(steps.items()):  # Stage-1 first: its pieces set the row order
                for piece, sec in step.pieces(batch, device).items():
                    breakdown.setdefault(piece, {}).setdefault(name, []).append(sec)
            print(f"breakdown round {r + 1}/{args.rounds} done", flush=True)

    names = list(steps)
    med = {name: statistics.median(times[name]) for name in names}
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(f"\nTraining iteration, ViT-S/14 at {args.size}x{args.size}, batch {args.batch}, {dev}, precision "
          f"{precision.name}, torch {torch.__version__}, median of {args.rounds} interleaved rounds\n")
    best = {name: min(times[name]) for name in names}
    print("| iteration | s/iteration | images/s | ratio to baseline | best round (s) | ratio of best rounds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        print(
            f"| {name} | {med[name]:.3f} | {args.batch / med[name]:.2f} | {med[name] / med[names[0]]:.3f} "
            f"| {best[name]:.3f} | {best[name] / best[names[0]]:.3f} |"
        )
    ratio = med[names[1]] / med[names[0]]
    print(
        f"\nStage-1 / baseline = {ratio:.3f}x on medians, {best[names[1]] / best[names[0]]:.3f}x on best rounds "
        f"(target <= 1.3x: {'met' if ratio <= 1.3 else 'MISSED'})"
    )

    if breakdown:
        print(f"\nBreakdown (median seconds of each piece, timed separately, {args.rounds} rounds)\n")
        print("| piece | baseline (s) | Stage-1 (s) | Stage-1 share |")
        print("| --- | ---: | ---: | ---: |")
        sums = {name: 0.0 for name in names}
        piece_med = {}
        for piece, per_step in breakdown.items():
            piece_med[piece] = {name: statistics.median(v) for name, v in per_step.items()}
            for name, sec in piece_med[piece].items():
                sums[name] += sec
        for piece, per_step in piece_med.items():
            cells = [f"{per_step[name]:.3f}" if name in per_step else "-" for name in names]
            share = per_step.get(names[1], 0.0) / sums[names[1]] if sums[names[1]] else 0.0
            print(f"| {piece} | {cells[0]} | {cells[1]} | {share:.0%} |")
        print(f"| **sum of pieces** | {sums[names[0]]:.3f} | {sums[names[1]]:.3f} | 100% |")
        print(f"| (whole iteration, table above) | {med[names[0]]:.3f} | {med[names[1]]:.3f} | |")


if __name__ == "__main__":
    main()
