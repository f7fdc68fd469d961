"""Stop training, with an error, as soon as the loss is NaN or infinite."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from ignite.engine import Engine, Events
from monai.engines.utils import IterationEvents

from spectraflow_monai.utils.errors import TrainingError, install_excepthook

__all__ = ["NonFiniteLossError", "StopOnNonFiniteLoss"]


class NonFiniteLossError(TrainingError):
    """The training loss became NaN or infinite; the run was stopped before the optimizer used it."""


def _loss_of(output: Any) -> Any:
    """The loss in an engine output: ``output["loss"]`` of a dict, of the first item of a list, or the output."""
    if isinstance(output, Sequence) and not isinstance(output, (str, bytes)) and output:
        output = output[0]
    if isinstance(output, Mapping):
        return output.get("loss")
    return output


def _is_finite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value.detach()).all())
    if isinstance(value, numbers.Real):
        return math.isfinite(float(value))
    return True  # nothing to check


class StopOnNonFiniteLoss:
    """Raise :class:`NonFiniteLossError` when a training iteration's loss is NaN or infinite.

    ignite's ``TerminateOnNan`` ends the run quietly (exit status 0), after the optimizer step and with the final
    checkpoint handlers still firing; this handler instead checks the loss at MONAI's
    ``IterationEvents.LOSS_COMPLETED`` (before the backward pass, so the weights are never updated from it; engines
    that do not fire that event are checked at ``ITERATION_COMPLETED``) and raises an error naming the epoch and
    the iteration, so that ``python -m monai.bundle run`` exits with a non-zero status and (``attach`` installs
    :func:`~spectraflow_monai.utils.errors.install_excepthook`) ends its output with ``error: <message>``. The
    checkpoint savers of
    :mod:`spectraflow_monai.handlers.checkpoint` refuse to write a non-finite state in any case.

    Args:
        output_transform: maps ``engine.state.output`` to the value to check (a tensor or a number). Defaults to
            the ``"loss"`` entry of a dict output (or of its first item for MONAI's decollated lists).
    """

    def __init__(self, output_transform: Callable[[Any], Any] = _loss_of) -> None:
        if not callable(output_transform):
            raise ValueError(f"output_transform must be callable, got {type(output_transform).__name__}.")
        self.output_transform = output_transform

    def attach(self, engine: Engine) -> None:
        """Check the loss of every iteration of ``engine`` (and make a failing run end with the error line)."""
        install_excepthook()
        event = IterationEvents.LOSS_COMPLETED
        engine.add_event_handler(event if engine.has_registered_events(event) else Events.ITERATION_COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        loss = self.output_transform(engine.state.output)
        if not _is_finite(loss):
            value = loss.detach().float().reshape(-1)[:4].tolist() if isinstance(loss, torch.Tensor) else loss
            raise NonFiniteLossError(
                f"the training loss is {value} at epoch {engine.state.epoch}, iteration {engine.state.iteration}: "
                "training stopped before the weights were updated from it, and no checkpoint was written "
                "from it (check the data for NaN/inf values, lower the learning rate or turn mixed precision off)."
            )
