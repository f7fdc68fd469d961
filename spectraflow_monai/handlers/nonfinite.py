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

    Host synchronisation: reading whether a loss on a GPU is finite waits for the device. With ``every=1`` (the
    default) that happens at every iteration, and the guarantee above holds. With ``every=N > 1`` the check is
    accumulated on the device (a flag, no synchronisation) and read back every ``N`` iterations and at the end of
    every epoch: the step never waits for the device, but a non-finite loss is reported up to ``N - 1`` iterations
    late, with the range of iterations it occurred in, and the weights may have been updated from it meanwhile (the
    checkpoint savers still refuse a non-finite state).

    Args:
        output_transform: maps ``engine.state.output`` to the value to check (a tensor or a number). Defaults to
            the ``"loss"`` entry of a dict output (or of its first item for MONAI's decollated lists).
        every: iterations between read-backs, >= 1. Defaults to 1.

    Raises:
        ValueError: ``output_transform`` not callable or ``every`` not a positive integer.
    """

    def __init__(self, output_transform: Callable[[Any], Any] = _loss_of, every: int = 1) -> None:
        if not callable(output_transform):
            raise ValueError(f"output_transform must be callable, got {type(output_transform).__name__}.")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}.")
        self.output_transform = output_transform
        self.every = every
        self._bad: torch.Tensor | None = None  # device flag: a non-finite loss since the last read-back
        self._since = 1  # first iteration of the current interval

    def attach(self, engine: Engine) -> None:
        """Check the loss of every iteration of ``engine`` (and make a failing run end with the error line)."""
        install_excepthook()
        event = IterationEvents.LOSS_COMPLETED
        engine.add_event_handler(event if engine.has_registered_events(event) else Events.ITERATION_COMPLETED, self)
        if self.every > 1:
            engine.add_event_handler(Events.EPOCH_COMPLETED, self.read_back)

    def __call__(self, engine: Engine) -> None:
        loss = self.output_transform(engine.state.output)
        if self.every > 1 and isinstance(loss, torch.Tensor):
            bad = ~torch.isfinite(loss.detach()).all()
            self._bad = bad if self._bad is None else self._bad | bad
            if engine.state.iteration % self.every == 0:
                self.read_back(engine)
            return
        if not _is_finite(loss):
            value = loss.detach().float().reshape(-1)[:4].tolist() if isinstance(loss, torch.Tensor) else loss
            raise NonFiniteLossError(
                f"the training loss is {value} at epoch {engine.state.epoch}, iteration {engine.state.iteration}: "
                "training stopped before the weights were updated from it, and no checkpoint was written "
                "from it (check the data for NaN/inf values, lower the learning rate or turn mixed precision off)."
            )

    def read_back(self, engine: Engine) -> None:
        """Read the accumulated flag back (``every > 1``); raise if a loss since the last read-back was not finite."""
        bad, self._bad = self._bad, None
        first, self._since = self._since, engine.state.iteration + 1
        if bad is not None and bool(bad):
            raise NonFiniteLossError(
                f"the training loss became NaN or infinite at epoch {engine.state.epoch}, between iterations {first} "
                f"and {engine.state.iteration} (checked every {self.every} iterations, so the weights may have been "
                "updated from it; no checkpoint was written from it): check the data for NaN/inf values, lower the "
                "learning rate or turn mixed precision off."
            )
