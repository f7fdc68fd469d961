"""The machinery shared by the SpectraFlow Stage-1 trainers (MeanFlow and MAE) as a ``monai.engines.Trainer``.

SpectraFlow (Chen et al., Sec. "Stage-1: MeanFlow Pretraining" and "Implementation Details") pretrains the DINOv2
encoder on mixed image/mask mini-batches with AdamW, gradient accumulation to a global batch of 8 and an EMA (0.999)
of the encoder. :class:`Stage1Trainer` holds all of it but the objective, which a subclass's ``_iteration`` supplies.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from ignite.engine import Engine, EventEnum, Events
from ignite.handlers import EMAHandler
from monai.engines.trainer import Trainer
from monai.engines.utils import IterationEvents
from monai.engines.workflow import Workflow
from torch import nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader

from spectraflow_monai.engines.config import DispersiveConfig, EMAConfig, GradientConfig
from spectraflow_monai.engines.utils import (
    PrepareBatchMixedDomain,
    accumulation_flags,
    all_reduce_gradients,
    broadcast_modules,
)
from spectraflow_monai.utils.precision import Precision

__all__ = ["Stage1Trainer"]

_PARALLEL_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


class Stage1Trainer(Trainer):
    """Base of the SpectraFlow Stage-1 trainers: an encoder and a head trained together, the encoder exported.

    The arguments of a MONAI ``Trainer`` are taken one by one; the Stage-1 options come in three objects of
    :mod:`spectraflow_monai.engines.config`: ``dispersive`` (:class:`DispersiveConfig`), ``ema``
    (:class:`EMAConfig`) and ``gradients`` (:class:`GradientConfig`).

    Gradient accumulation: ``(L / accumulation_steps).backward()`` at every iteration; the optimizer steps (and the
    EMA follows) as :func:`~spectraflow_monai.engines.utils.accumulation_flags` says. Global batch =
    ``batch_size × accumulation_steps × world_size`` (the paper uses a global batch of 8).

    EMA: with ``ema`` an ignite ``EMAHandler(encoder, momentum=1 - ema.decay)`` is attached (before the
    ``train_handlers``, so that iteration-level checkpoints see the updated EMA) to ``ITERATION_COMPLETED`` filtered
    to the iterations where the optimizer stepped; ``engine.ema_encoder`` is the EMA model and
    ``engine.ema_handler`` the handler. At the first iteration of a fresh run (``state.iteration == 1``) the EMA
    encoder is reset to the live encoder, so weights loaded at ``Events.STARTED`` (e.g. a ``CheckpointLoader``
    that loads only the encoder) are the EMA's starting point; when resuming (``iteration > 1``) the loaded EMA is
    kept.

    Checkpoints: :meth:`checkpoint_dict` returns the objects to hand to MONAI's ``CheckpointSaver`` /
    ``CheckpointLoader`` (``encoder``, ``head``, ``optimizer``, ``ema``, ``trainer`` for epoch/iteration, and the lr
    scheduler / AMP grad scaler when used) so that training resumes exactly;
    :class:`~spectraflow_monai.handlers.EncoderExportHandler` writes the EMA encoder for Stage-2. In a bundle, a
    handler passed in ``train_handlers`` cannot reference the trainer (circular reference); pass a pre-built
    EMA module (``EMAConfig(encoder=...)``) and reference that, or attach the saver after construction
    (``"$@saver.attach(@train#trainer)"``) with ``save_dict="$@train#trainer.checkpoint_dict(@lr)"``.

    Distributed training: ``torch.func.jvp`` (used by the MeanFlow target) cannot differentiate through a
    ``DistributedDataParallel`` wrapper, so the modules are NOT wrapped. Instead, when ``torch.distributed`` is
    initialised with more than one process (or ``GradientConfig(distributed=True)``), at the first iteration of
    every ``run()`` (after all ``Events.STARTED`` handlers, e.g. checkpoint loading) the parameters and buffers of the
    encoder, the head and the EMA encoder are broadcast from rank 0
    (:func:`~spectraflow_monai.engines.utils.broadcast_modules`), and before every optimizer step the gradients of
    all trainable parameters of encoder + head are averaged
    (:func:`~spectraflow_monai.engines.utils.all_reduce_gradients`, buckets of ``bucket_mb``), as DDP does.
    Each process must see its own data shard (``DistributedSampler``) with the same number of iterations per epoch.
    The dispersive loss uses the in-process batch only, as in the single-GPU setting of the paper; so ``N``
    processes give the update of one process with ``accumulation_steps=N`` that sees the shards one after another.

    Args:
        device: device to run on (e.g. ``"cuda:0"``, ``"cpu"``).
        max_epochs: number of epochs (paper: 300).
        train_data_loader: data loader or iterable of batches (dicts with ``image_key`` and optionally
            ``domain_key``; tensors or ``(image, domain)`` tuples also work).
        encoder: the encoder (``DINOv2Encoder``); its trainable parameters (``requires_grad``) are optimised. It is
            moved to ``device`` (in place: an optimizer built on its parameters stays valid), as are ``head`` and
            ``ema_encoder``.
        head: the module trained with the encoder and discarded afterwards (MeanFlow head, MAE decoder).
        optimizer: optimizer over the trainable parameters of encoder and head (paper: AdamW, lr 1e-5).
        dispersive: the dispersive term on the pooled penultimate-block features (:class:`DispersiveConfig`: ``λ``
            and the loss). None: ``DispersiveConfig()`` (``λ = 0.4``, ``DispersiveLoss()``). Defaults to None.
        ema: the EMA of the encoder (:class:`EMAConfig`: decay, optional pre-built EMA module), or None for no EMA.
            Defaults to ``EMAConfig()`` (decay 0.999).
        gradients: gradient accumulation and the multi-process all-reduce (:class:`GradientConfig`). None:
            ``GradientConfig()`` (one mini-batch per step; all-reduce when a process group of > 1 is initialised).
            Defaults to None.
        image_key: batch key of the input images. Defaults to ``"image"``.
        domain_key: batch key of the 0/1 domain flag (missing key: no domain). Defaults to ``"domain"``.
        epoch_length: iterations per epoch, default ``len(train_data_loader)``.
        non_blocking: non-blocking host-to-device copies. Defaults to False.
        prepare_batch: ``prepare_batch(batchdata, device, non_blocking, **to_kwargs)`` (a MONAI ``PrepareBatch``)
            returning the image tensor or ``(image, domain)``. None: ``PrepareBatchMixedDomain(image_key,
            domain_key)``. The output of any other callable is checked and moved by that one too. Defaults to None.
        iteration_update: replaces ``_iteration`` (ignite process function) when given. Defaults to None.
        train_handlers: ignite/MONAI handlers with ``attach(engine)`` (StatsHandler, CheckpointSaver, ...).
        amp: mixed precision: ``torch.autocast`` with float16 + ``GradScaler`` on CUDA, bfloat16 without scaler on
            CPU (``amp_kwargs={"dtype": torch.bfloat16}`` selects bfloat16 on CUDA). Defaults to False.
        event_names: additional custom ignite events to register.
        event_to_attr: mapping of events to state attributes (ignite ``register_events``).
        decollate: decollate batch and output after the iteration; the output is a dict of scalars, so keep False.
            Defaults to False.
        optim_set_to_none: ``optimizer.zero_grad(set_to_none=...)``. Defaults to False.
        to_kwargs: extra arguments for ``Tensor.to`` when moving the batch (and for ``prepare_batch``).
        amp_kwargs: extra arguments for ``torch.autocast`` (e.g. ``{"dtype": torch.bfloat16}``).
        precision: the run's resolved :class:`~spectraflow_monai.utils.precision.Precision`
            (:func:`~spectraflow_monai.utils.resolve_precision`); when given it decides autocast, its dtype and the
            gradient scaler (``amp`` and the ``dtype`` of ``amp_kwargs`` are not read). Defaults to None.
        output_on_device: ``engine.state.output`` holds the terms as detached 0-d float32 tensors on the device
            instead of Python floats, so that an iteration never waits for the device (no host synchronisation per
            step; the handlers of :mod:`spectraflow_monai.handlers` add them up on the device and read them back at
            the epoch's end or their ``every`` interval). False: one synchronisation per iteration reads all terms
            back as floats. Defaults to False.

    Raises:
        ValueError: invalid arguments (named with their value); at run time a batch with fewer than 2 samples
            while the dispersive loss is on, a missing ``image_key``, or a domain flag that does not match the batch.
    """

    def __init__(
        self,
        device: str | torch.device,
        max_epochs: int,
        train_data_loader: Iterable | DataLoader,
        encoder: nn.Module,
        head: nn.Module,
        optimizer: Optimizer,
        dispersive: DispersiveConfig | None = None,
        ema: EMAConfig | None = EMAConfig(),
        gradients: GradientConfig | None = None,
        image_key: str = "image",
        domain_key: str | None = "domain",
        epoch_length: int | None = None,
        non_blocking: bool = False,
        prepare_batch: Callable | None = None,
        iteration_update: Callable[[Engine, Any], Any] | None = None,
        train_handlers: Sequence | None = None,
        amp: bool = False,
        event_names: list[str | EventEnum | type[EventEnum]] | None = None,
        event_to_attr: dict | None = None,
        decollate: bool = False,
        optim_set_to_none: bool = False,
        to_kwargs: dict | None = None,
        amp_kwargs: dict | None = None,
        precision: Precision | None = None,
        output_on_device: bool = False,
    ) -> None:
        if precision is not None:  # the run's resolved precision, handed whole: autocast, dtype and scaler from it
            if not isinstance(precision, Precision):
                raise ValueError(f"precision must be a resolved Precision or None, got {type(precision).__name__}.")
            amp, amp_kwargs = precision.autocast, {**dict(amp_kwargs or {}), "dtype": precision.dtype}
        if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
            raise ValueError(f"max_epochs must be a positive int, got {max_epochs!r}.")
        for name, module in (("encoder", encoder), ("head", head)):
            if not isinstance(module, nn.Module):
                raise ValueError(f"{name} must be an nn.Module, got {type(module).__name__}.")
            if isinstance(module, _PARALLEL_WRAPPERS):
                raise ValueError(
                    f"{name} must be the plain module, got {type(module).__name__}: torch.func.jvp cannot "
                    "differentiate through (Distributed)DataParallel; the trainer all-reduces gradients itself."
                )
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        dispersive = DispersiveConfig() if dispersive is None else dispersive
        gradients = GradientConfig() if gradients is None else gradients
        configs = (("dispersive", dispersive, DispersiveConfig), ("ema", ema, EMAConfig))
        for name, value, kind in (*configs, ("gradients", gradients, GradientConfig)):
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"{name} must be {kind.__name__} or None, got {type(value).__name__}.")
        ema_encoder = None if ema is None else ema.encoder
        if ema_encoder is not None and ema_encoder is encoder:
            raise ValueError("EMAConfig: encoder must be a separate nn.Module with the encoder's architecture.")
        batch_reader = PrepareBatchMixedDomain(image_key=image_key, domain_key=domain_key)
        if gradients.distributed and not dist.is_available():
            raise ValueError(
                "GradientConfig: distributed=True but torch.distributed is not available in this build of torch."
            )
        if prepare_batch is not None and not callable(prepare_batch):
            raise ValueError(f"prepare_batch must be callable or None, got {type(prepare_batch).__name__}.")

        # handlers are attached below, after the EMA handler (see the class notes)
        super().__init__(
            device=device,
            max_epochs=max_epochs,
            data_loader=train_data_loader,
            epoch_length=epoch_length,
            non_blocking=non_blocking,
            prepare_batch=batch_reader if prepare_batch is None else prepare_batch,
            iteration_update=iteration_update,
            handlers=None,
            amp=amp,
            event_names=event_names,
            event_to_attr=event_to_attr,
            decollate=decollate,
            to_kwargs=to_kwargs,
            amp_kwargs=amp_kwargs,
        )
        for module in (encoder, head, ema_encoder):  # in place: the optimizer's parameters are these tensors
            if module is not None:
                module.to(self.state.device)
        dispersive_loss = dispersive.loss
        if dispersive_loss is None and dispersive.weight > 0:
            from spectraflow_monai.losses.dispersive import DispersiveLoss

            dispersive_loss = DispersiveLoss()

        self.encoder = encoder
        self.head = head
        self.optimizer = optimizer
        self.dispersive_loss = dispersive_loss
        self.dispersive_weight = float(dispersive.weight)
        self.accumulation_steps = int(gradients.accumulation_steps)
        self.image_key = image_key
        self.domain_key = domain_key
        self.batch_reader = batch_reader
        self.optim_set_to_none = optim_set_to_none
        self.distributed_arg = gradients.distributed
        self.grad_bucket_bytes = max(1, int(gradients.bucket_mb * 2**20))
        self.output_on_device = bool(output_on_device)

        # mixed precision: fp16 + GradScaler on CUDA, bf16 elsewhere (no scaler needed)
        dev = self.state.device if self.state.device is not None else torch.device("cpu")
        self._device_type = dev.type if dev.type in ("cuda", "cpu", "xpu", "mps") else "cpu"
        autocast_kwargs = dict(self.amp_kwargs)
        autocast_kwargs.setdefault("dtype", torch.float16 if self._device_type == "cuda" else torch.bfloat16)
        self._autocast_kwargs = autocast_kwargs
        if precision is not None:
            use_scaler = precision.use_grad_scaler
        else:
            use_scaler = self.amp and self._device_type == "cuda" and autocast_kwargs["dtype"] == torch.float16
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None

        # per-run state
        self.optimizer_stepped = False  # True after an iteration that stepped the optimizer
        self.distributed = False
        self.world_size = 1
        self._run_setup_pending = True
        self._warned_no_disp_grad = False
        self.add_event_handler(Events.STARTED, self._mark_run_started)

        self.ema_handler: EMAHandler | None = None
        if ema is not None:
            self.ema_handler = EMAHandler(encoder, momentum=1.0 - float(ema.decay))
            if ema_encoder is not None:
                ema_encoder.load_state_dict(encoder.state_dict())
                for p in ema_encoder.parameters():
                    p.requires_grad_(False)
                ema_encoder.eval()
                self.ema_handler.ema_model = ema_encoder
            self.ema_handler.attach(
                self,
                name="ema_momentum",
                event=Events.ITERATION_COMPLETED(event_filter=lambda engine, _: engine.optimizer_stepped),
            )
        if train_handlers is not None:
            self._register_handlers(train_handlers)

    @property
    def ema_encoder(self) -> nn.Module | None:
        """The EMA copy of the encoder (None when ``ema=None``)."""
        return None if self.ema_handler is None else self.ema_handler.ema_model

    def checkpoint_dict(self, lr_scheduler: Any | None = None) -> dict[str, Any]:
        """Objects to save/load for an exact resume (for MONAI ``CheckpointSaver`` / ``CheckpointLoader``).

        Keys: ``"encoder"``, ``"head"``, ``"optimizer"``, ``"trainer"`` (this engine: epoch and iteration),
        ``"ema"`` (the EMA encoder, when enabled), ``"lr_scheduler"`` (when given) and ``"scaler"`` (AMP fp16).
        """
        out: dict[str, Any] = {"encoder": self.encoder, "head": self.head, "optimizer": self.optimizer}
        if self.ema_encoder is not None:
            out["ema"] = self.ema_encoder
        if lr_scheduler is not None:
            out["lr_scheduler"] = lr_scheduler
        if self.scaler is not None:
            out["scaler"] = self.scaler
        out["trainer"] = self
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters of encoder + head that require gradient (deduplicated, in module order)."""
        seen: set[int] = set()
        params = []
        for module in (self.encoder, self.head):
            for p in module.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    def run(self) -> None:  # type: ignore[override]
        """Run training (continues from the current state when called again).

        Unlike ``monai.engines.Trainer.run`` the AMP grad scaler is created once in ``__init__`` (so that it can be
        checkpointed) and only for float16 autocast on CUDA.
        """
        Workflow.run(self)

    def _mark_run_started(self, engine: Engine) -> None:
        self._run_setup_pending = True

    def _setup_run(self) -> None:
        """First iteration of a run: resolve distributed mode, sync ranks, reset the EMA on a fresh start."""
        initialised = dist.is_available() and dist.is_initialized()
        if self.distributed_arg and not initialised:
            raise RuntimeError(
                f"{type(self).__name__}(gradients=GradientConfig(distributed=True)) needs an initialised "
                "torch.distributed process group (call torch.distributed.init_process_group before running)."
            )
        self.world_size = dist.get_world_size() if initialised else 1
        self.distributed = initialised and self.world_size > 1 and self.distributed_arg is not False
        if self.ema_handler is not None and self.state.iteration == 1:
            self.ema_handler.ema_model.load_state_dict(self.encoder.state_dict())
        if self.distributed:
            broadcast_modules([m for m in (self.encoder, self.head, self.ema_encoder) if m is not None])
        self._run_setup_pending = False

    def _prepare(self, batchdata: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(images, domain)`` of a batch through ``prepare_batch`` (a custom one's output checked and moved)."""
        device, kwargs = self.state.device, self.to_kwargs
        out = self.prepare_batch(batchdata, device, self.non_blocking, **kwargs)
        if not isinstance(self.prepare_batch, PrepareBatchMixedDomain):
            out = self.batch_reader(out, device, self.non_blocking, **kwargs)
        return out

    def _start_iteration(self, batchdata: Any) -> tuple[torch.Tensor, torch.Tensor | None, bool, bool]:
        """The first half of an iteration, shared by the Stage-1 objectives: set the run up on its first iteration,
        prepare the batch, check it for the dispersive loss, put the modules in training mode and zero the gradients
        at the start of an accumulation cycle.

        Returns:
            ``(images, domain, use_dispersive, should_step)``.

        Raises:
            ValueError: empty batch, batch size < 2 with the dispersive loss on, or malformed batch.
        """
        if batchdata is None:
            raise ValueError("Must provide batch data for current iteration.")
        if self._run_setup_pending:
            self._setup_run()
        self.optimizer_stepped = False
        images, domain = self._prepare(batchdata)
        batch_size = int(images.shape[0])
        use_disp = self.dispersive_weight > 0 and self.dispersive_loss is not None
        if use_disp and batch_size < 2:
            raise ValueError(
                f"the dispersive loss needs at least 2 samples per batch (in-batch negatives), got batch size "
                f"{batch_size} at iteration {self.state.iteration}; use batch_size >= 2 (and drop_last=True), or "
                "dispersive=DispersiveConfig(weight=0)."
            )
        should_zero_grad, should_step = accumulation_flags(
            self.state.iteration, self.accumulation_steps, self.state.epoch_length
        )
        self.encoder.train()
        self.head.train()
        if should_zero_grad:
            self.optimizer.zero_grad(set_to_none=self.optim_set_to_none)
        return images, domain, use_disp, should_step

    def _autocast(self) -> AbstractContextManager:
        """``torch.autocast`` on the trainer's device when ``amp``, else a no-op context."""
        return torch.autocast(self._device_type, **self._autocast_kwargs) if self.amp else nullcontext()

    def _dispersive_term(self, pooled: torch.Tensor) -> torch.Tensor:
        """``L_Disp`` of the pooled features (float32 scalar); warns once when they carry no gradient."""
        if not pooled.requires_grad and torch.is_grad_enabled() and not self._warned_no_disp_grad:
            warnings.warn(
                "the pooled penultimate-block features do not require gradient, so the dispersive loss "
                "cannot change the encoder; make the penultimate block trainable "
                "(DINOv2Encoder(trainable_blocks>=2 or 'all')) or set DispersiveConfig(weight=0).",
                stacklevel=3,
            )
            self._warned_no_disp_grad = True
        return self.dispersive_loss(pooled).mean().float()

    def _backward_and_step(self, loss: torch.Tensor, should_step: bool) -> None:
        """The optimisation half of an iteration, shared by the Stage-1 objectives: expose the loss to
        ``LOSS_COMPLETED`` handlers (e.g. ``StopOnNonFiniteLoss``, before any weight changes), back-propagate the
        (accumulation-scaled, grad-scaled) loss and, on an optimizer step, average gradients across processes and step.
        """
        self.state.output = {"loss": loss.detach()}  # what LOSS_COMPLETED handlers (StopOnNonFiniteLoss) read
        self.fire_event(IterationEvents.LOSS_COMPLETED)
        scaled = loss / self.accumulation_steps if self.accumulation_steps > 1 else loss
        if self.scaler is not None:
            self.scaler.scale(scaled).backward()
        else:
            scaled.backward()
        self.fire_event(IterationEvents.BACKWARD_COMPLETED)
        if should_step:
            if self.distributed:
                all_reduce_gradients(self.trainable_parameters(), self.grad_bucket_bytes)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer_stepped = True

    def _finish_iteration(self, names: Sequence[str], values: Sequence[torch.Tensor]) -> dict[str, Any]:
        """Set ``state.output = {name: value}``, fire ``MODEL_COMPLETED`` and return the output: floats (one device
        synchronisation for all values) or, with ``output_on_device``, detached 0-d float32 tensors (none)."""
        stacked = torch.stack([v.detach().float().reshape(()) for v in values])
        self.state.output = dict(zip(names, stacked.unbind() if self.output_on_device else stacked.tolist()))
        self.fire_event(IterationEvents.MODEL_COMPLETED)
        return self.state.output
