"""Readable training logs: the Stage-2 loss terms and boundary weight as metrics, and one summary line per epoch.

- :class:`BoundaryWeightRamp` sets the boundary weight ``beta`` of a
  :class:`~spectraflow_monai.losses.DiceBCEBoundaryLoss` at every epoch start (its linear ramp).
- :class:`LossTermsHandler` averages the terms that loss records at each call (Dice, BCE or CE, boundary) over the
  epoch and writes them with the current ``beta`` to ``engine.state.metrics``, where MONAI's ``StatsHandler`` and
  ``TensorBoardStatsHandler`` log them; a rising total loss is then explained by the term (or ``beta``) that rises.
- :class:`EpochSummaryHandler` logs one line per epoch: the epoch means of the training output terms, the
  training and validation metrics, the learning rate, the epoch's wall time and the best key metric so far.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from ignite.engine import Engine, Events

__all__ = ["BoundaryWeightRamp", "ENGINE_CHATTER", "LossTermsHandler", "EpochSummaryHandler", "scalar_entries"]


def _is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalar_entries(output: Any) -> dict[str, Any]:
    """The scalar entries of an engine output, in their order: a dict's, or those of the first dict of a list.

    MONAI's ``SupervisedTrainer`` decollates its output into a list of per-sample dicts, each holding the batch's
    ``loss``; the Stage-1 trainers return one dict of floats. Tensors are returned as they are (no device
    synchronisation); a bare number or one-element tensor is returned as ``{"loss": output}``.
    """
    if isinstance(output, Sequence) and not isinstance(output, (str, bytes)) and output:
        output = output[0]
    if isinstance(output, Mapping):
        return {str(k): v for k, v in output.items() if _is_scalar(v)}
    return {"loss": output} if _is_scalar(output) else {}


def _as_float(value: Any) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def _fmt(value: Any) -> str:
    value = _as_float(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


class BoundaryWeightRamp:
    """Ramp the boundary weight ``beta`` of a Stage-2 loss at every ``EPOCH_STARTED`` (``loss.set_epoch(epoch - 1)``).

    The ramp itself is the loss's (``beta`` from ``beta`` to ``beta_max`` over ``ramp_epochs``, see
    :class:`~spectraflow_monai.losses.DiceBCEBoundaryLoss`); this handler only tells it the 0-based epoch, also when
    a run resumes from a checkpoint (the restored epoch is used).

    Args:
        loss: an object with ``set_epoch(epoch: int)``, e.g. ``DiceBCEBoundaryLoss``.

    Raises:
        ValueError: ``loss`` has no ``set_epoch`` method.
    """

    def __init__(self, loss: Any) -> None:
        if not callable(getattr(loss, "set_epoch", None)):
            raise ValueError(f"loss must have a set_epoch(epoch) method, got {type(loss).__name__}.")
        self.loss = loss

    def __call__(self, engine: Engine) -> None:
        self.loss.set_epoch(engine.state.epoch - 1)

    def attach(self, engine: Engine) -> None:
        """Register the ramp on ``engine``'s ``EPOCH_STARTED``."""
        if not engine.has_event_handler(self, Events.EPOCH_STARTED):
            engine.add_event_handler(Events.EPOCH_STARTED, self)


class LossTermsHandler:
    """Per-epoch means of the Stage-2 loss terms and the current boundary weight, as engine metrics.

    After every iteration the terms that the loss recorded at its last call (``loss.last_terms``: ``dice``,
    ``bce`` or ``ce``, ``boundary`` when it was computed, ``boundary_weighted = beta * boundary``; unweighted
    batch means) are added up; at ``EPOCH_COMPLETED`` their epoch means are written to ``engine.state.metrics`` as
    ``<prefix><term>`` (``train_loss_dice``, ``train_loss_bce``, ``train_loss_boundary``,
    ``train_loss_boundary_weighted``) together with ``beta_name`` (``boundary_beta``, the weight used in the
    epoch). List it before MONAI's ``StatsHandler`` / ``TensorBoardStatsHandler`` among the trainer's handlers,
    which log the engine metrics at the same event. The terms are kept as tensors until the epoch ends, so the
    handler adds no device synchronisation per iteration.

    Args:
        loss: the Stage-2 loss (:class:`~spectraflow_monai.losses.DiceBCEBoundaryLoss`): it has ``last_terms``
            (a dict of detached scalar tensors, or None before its first call) and ``beta``.
        prefix: prefix of the term names in the metrics. Defaults to ``"train_loss_"``.
        beta_name: metric name of the boundary weight. Defaults to ``"boundary_beta"``.
        ramp: also ramp ``beta`` at every epoch start (a :class:`BoundaryWeightRamp` is attached). Defaults to True.

    Raises:
        ValueError: ``loss`` does not record its terms (no ``last_terms`` attribute), or ``ramp`` is set and it has no
            ``set_epoch`` method.
    """

    def __init__(
        self, loss: Any, prefix: str = "train_loss_", beta_name: str = "boundary_beta", ramp: bool = True
    ) -> None:
        if not hasattr(loss, "last_terms"):
            raise ValueError(f"loss must record its terms in `last_terms`, got {type(loss).__name__}.")
        self.loss = loss
        self.prefix = str(prefix)
        self.beta_name = str(beta_name)
        self.ramp = BoundaryWeightRamp(loss) if ramp else None
        self._sums: dict[str, Any] = {}
        self._count = 0

    def reset(self, engine: Engine | None = None) -> None:
        self._sums, self._count = {}, 0
        if hasattr(self.loss, "last_terms"):
            self.loss.last_terms = None  # terms of an earlier call (e.g. of another run) are not counted

    def update(self, engine: Engine | None = None) -> None:
        terms = getattr(self.loss, "last_terms", None)
        if not terms:
            return
        for name, value in terms.items():
            value = value.detach() if isinstance(value, torch.Tensor) else value
            self._sums[name] = self._sums.get(name, 0.0) + value
        self._count += 1
        self.loss.last_terms = None  # each call counted once

    def compute(self) -> dict[str, float]:
        """The epoch means so far (``<prefix><term>``) and the current weight (``beta_name``)."""
        out = {f"{self.prefix}{k}": _as_float(v) / self._count for k, v in self._sums.items()} if self._count else {}
        beta = getattr(self.loss, "beta", None)
        if beta is not None:
            out[self.beta_name] = float(beta)
        return out

    def completed(self, engine: Engine) -> None:
        engine.state.metrics.update(self.compute())

    def attach(self, engine: Engine) -> None:
        """Register the ramp (``EPOCH_STARTED``, first), the accumulation and the metrics on ``engine``."""
        if self.ramp is not None:
            self.ramp.attach(engine)
        engine.add_event_handler(Events.EPOCH_STARTED, self.reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.update)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.completed)


#: the per-epoch INFO lines of ignite's and MONAI's engines that the summary line replaces on the console
ENGINE_CHATTER = (
    "Epoch[",
    "Engine run starting",
    "Engine run resuming",
    "Engine run finished",
    "Got new best metric",
    "Saved checkpoint at epoch",
)


class _QuietEngine(logging.Filter):
    """Drop an engine logger's per-epoch INFO chatter (:data:`ENGINE_CHATTER`); warnings and errors always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not record.getMessage().startswith(ENGINE_CHATTER)


class EpochSummaryHandler:
    """One log line per training epoch: loss terms, metrics, learning rate, time and the best key metric so far.

    The line reads e.g. ``Stage-2 epoch 3/100 | train_loss 0.81 train_loss_dice 0.42 ... train_mean_dice 0.61 |
    val_mean_dice 0.55 val_hd95 12.3 | lr 0.0001 | 12.3s | best val_mean_dice 0.58 (epoch 2)``:

    - the epoch means of the scalar entries of the trainer's output (``output_transform``), each prefixed by
      ``output_prefix``;
    - the trainer's ``engine.state.metrics`` (e.g. the key training metric and :class:`LossTermsHandler`'s terms);
    - the validator's metrics when it ran in this epoch (``validator``);
    - the learning rate of the optimizer's first parameter group at the end of the epoch (after an epoch-level
      scheduler step; with several distinct rates, all of them);
    - the wall time of the epoch, validation included;
    - the best value of the validator's key metric so far and its epoch (or the trainer's, without a validator).

    The line is logged at ``EPOCH_COMPLETED`` after every other handler of that event (it is registered when the
    run starts, after the handlers listed in the config, the progress bar and the checkpoint savers are attached),
    so that it follows validation and appears below a closed progress bar. With the progress bar off it is the one
    console line of the epoch, which keeps log files readable.

    Args:
        title: the start of the line, before ``epoch <n>/<max>`` (e.g. ``"Stage-1"``). Defaults to ``"Training"``.
        name: name of the logger. Defaults to ``"spectraflow.train"``.
        output_transform: maps ``engine.state.output`` to a dict of scalars (floats or one-element tensors).
            Defaults to :func:`scalar_entries`.
        output_prefix: prefix of the output terms in the line (``"train_"`` turns ``loss`` into ``train_loss``).
            Defaults to ``""``.
        validator: the validation engine run by a ``ValidationHandler`` of the same trainer. Defaults to None.
        optimizer: the optimizer whose learning rate is shown; defaults to the trainer's ``optimizer`` attribute.
        quiet_engines: drop the per-epoch INFO lines of the trainer's and the validator's loggers that the summary
            replaces ("Epoch[n] Complete", "Engine run resuming", "Got new best metric", "Saved checkpoint at
            epoch", ...) while the run goes on (from ``STARTED`` to ``COMPLETED``); warnings and errors are kept.
            Defaults to True.
    """

    def __init__(
        self,
        title: str = "Training",
        name: str = "spectraflow.train",
        output_transform: Callable[[Any], Mapping[str, Any]] = scalar_entries,
        output_prefix: str = "",
        validator: Engine | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        quiet_engines: bool = True,
    ) -> None:
        if not callable(output_transform):
            raise ValueError(f"output_transform must be callable, got {output_transform!r}.")
        self.title = str(title)
        self.logger = logging.getLogger(name)
        self.output_transform = output_transform
        self.output_prefix = str(output_prefix)
        self.validator = validator
        self.optimizer = optimizer
        self.quiet_engines = bool(quiet_engines)
        self._filter = _QuietEngine()
        self._sums: dict[str, Any] = {}
        self._count = 0
        self._start = time.perf_counter()
        self.last_line: str | None = None

    def attach(self, engine: Engine) -> None:
        """Register the accumulation on ``engine`` and, when the run starts, the line at ``EPOCH_COMPLETED``."""
        engine.add_event_handler(Events.STARTED, self._register_last)
        engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self._iteration_completed)
        if self.quiet_engines:  # engine loggers are shared by class: quiet only while this run goes on
            engine.add_event_handler(Events.STARTED, self._quiet, True)
            engine.add_event_handler(Events.COMPLETED, self._quiet, False)

    def _quiet(self, engine: Engine, on: bool) -> None:
        for logger in {engine.logger, getattr(self.validator, "logger", engine.logger)}:
            if on:
                logger.addFilter(self._filter)
            else:
                logger.removeFilter(self._filter)

    def _register_last(self, engine: Engine) -> None:
        if not engine.has_event_handler(self._epoch_completed, Events.EPOCH_COMPLETED):
            engine.add_event_handler(Events.EPOCH_COMPLETED, self._epoch_completed)

    def _epoch_started(self, engine: Engine) -> None:
        self._sums, self._count, self._start = {}, 0, time.perf_counter()

    def _iteration_completed(self, engine: Engine) -> None:
        for key, value in self.output_transform(engine.state.output).items():
            value = value.detach().double() if isinstance(value, torch.Tensor) else float(value)
            self._sums[key] = self._sums.get(key, 0.0) + value
        self._count += 1

    def summary(self, engine: Engine) -> str:
        """The summary line of ``engine``'s current epoch."""
        epoch, max_epochs = engine.state.epoch, engine.state.max_epochs
        parts = [f"{self.title} epoch {epoch}/{max_epochs}"]
        train = [f"{self.output_prefix}{k} {_fmt(_as_float(v) / self._count)}" for k, v in self._sums.items()]
        train += [f"{k} {_fmt(v)}" for k, v in engine.state.metrics.items() if _is_scalar(v)]
        if train:
            parts.append(" ".join(train))
        validator = self.validator
        ran = validator is not None and getattr(validator.state, "epoch", None) == epoch and validator.state.iteration
        if ran:
            val = [f"{k} {_fmt(v)}" for k, v in validator.state.metrics.items() if _is_scalar(v)]
            if val:
                parts.append(" ".join(val))
        optimizer = self.optimizer if self.optimizer is not None else getattr(engine, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "param_groups", None):
            rates = list(dict.fromkeys(float(g["lr"]) for g in optimizer.param_groups))
            parts.append("lr " + ",".join(f"{r:.3g}" for r in rates))
        parts.append(f"{time.perf_counter() - self._start:.1f}s")
        best_of = validator if validator is not None else engine
        key = getattr(best_of.state, "key_metric_name", None)
        best_epoch = getattr(best_of.state, "best_metric_epoch", -1)
        if key is not None and best_epoch is not None and best_epoch > 0:
            parts.append(f"best {key} {_fmt(best_of.state.best_metric)} (epoch {best_epoch})")
        return " | ".join(parts)

    def _epoch_completed(self, engine: Engine) -> None:
        self.last_line = self.summary(engine)
        self.logger.info(self.last_line)
