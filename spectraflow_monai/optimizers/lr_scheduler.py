"""Learning-rate schedules of SpectraFlow, as ``monai.optimizers.lr_scheduler`` holds MONAI's.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Implementation Details) trains Stage-1 with AdamW at a learning rate "of 1e-5, linearly decayed to
1e-6". :func:`linear_lr_schedule` builds that schedule as a :class:`LinearDecayLR`, a
``torch.optim.lr_scheduler.LinearLR`` whose checkpoint restores the progress and keeps the configured schedule, so
that a run resumed with a different number of epochs continues on the newly configured straight line.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.optim.optimizer import Optimizer

__all__ = ["LinearDecayLR", "linear_lr_schedule"]


def linear_lr_schedule(
    optimizer: Optimizer, total_steps: int, start_lr: float | None = 1e-5, end_lr: float = 1e-6
) -> LinearDecayLR:
    """Linear learning-rate decay from ``start_lr`` to ``end_lr`` over ``total_steps`` scheduler steps.

    SpectraFlow Stage-1 (Implementation Details): AdamW, "initial learning rate of 1e-5, linearly decayed to 1e-6".
    This is ``torch.optim.lr_scheduler.LinearLR(start_factor=1, end_factor=end_lr / start_lr)``; after
    ``total_steps`` steps the rate stays at ``end_lr``. Attach it to the trainer with MONAI's
    ``LrScheduleHandler(lr_scheduler, epoch_level=False)``, which steps it after every iteration: then
    ``total_steps = max_epochs * epoch_length`` (iterations, not optimizer steps; with gradient accumulation the
    rate used at each optimizer step still follows the same straight line).

    Args:
        optimizer: the optimizer whose parameter groups are scheduled.
        total_steps: number of scheduler steps over which to decay, ``>= 1``.
        start_lr: initial learning rate; every parameter group's ``lr`` is set to it. ``None`` keeps the groups'
            current rates and uses the first group's rate as the start of the ratio. Defaults to 1e-5.
        end_lr: final learning rate, ``0 <= end_lr <= start_lr``. Defaults to 1e-6.

    Returns:
        a :class:`LinearDecayLR` (a ``LinearLR``; checkpoint it with the rest of the training state; loading a
        checkpoint keeps the configured schedule and restores only the step count).

    Raises:
        ValueError: non-positive ``total_steps`` or ``start_lr``, or ``end_lr`` outside ``[0, start_lr]``.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive int, got {total_steps!r}.")
    if start_lr is None:
        start_lr = float(optimizer.param_groups[0]["lr"])
    else:
        if not (math.isfinite(start_lr) and start_lr > 0):
            raise ValueError(f"start_lr must be > 0, got {start_lr!r}.")
        for group in optimizer.param_groups:
            group["lr"] = float(start_lr)
            group["initial_lr"] = float(start_lr)
    if not start_lr > 0:
        raise ValueError(f"the optimizer's learning rate must be > 0 when start_lr=None, got {start_lr!r}.")
    if not (math.isfinite(end_lr) and 0 <= end_lr <= start_lr):
        raise ValueError(f"end_lr must be in [0, start_lr={start_lr}], got {end_lr!r}.")
    return LinearDecayLR(optimizer, start_factor=1.0, end_factor=end_lr / start_lr, total_iters=total_steps)


class LinearDecayLR(torch.optim.lr_scheduler.LinearLR):
    """``torch.optim.lr_scheduler.LinearLR`` whose checkpoint restores the progress, not the schedule.

    ``load_state_dict`` takes the step count (``last_epoch``) from the checkpoint and keeps this scheduler's own
    configuration (``base_lrs``, ``start_factor``, ``end_factor``, ``total_iters``). Resuming Stage-1 with the same
    settings is therefore an exact resume, and resuming it with more (or fewer) epochs, or other rates, continues on
    the newly configured straight line: the rate right after loading is the new schedule's rate at the restored step
    (a plain ``LinearLR`` would keep decaying over the old length, because its state dict holds ``total_iters``).
    """

    _SCHEDULE_KEYS = ("base_lrs", "start_factor", "end_factor", "total_iters")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        configured = {key: getattr(self, key) for key in self._SCHEDULE_KEYS}
        super().load_state_dict(state_dict)
        if all(state_dict.get(key) == value for key, value in configured.items()):
            return  # same schedule: the loaded state (and the optimizer's restored rates) resume it exactly
        self.__dict__.update(configured)
        rates = self._get_closed_form_lr()
        for group, lr, base_lr in zip(self.optimizer.param_groups, rates, self.base_lrs):
            group["lr"] = lr
            group["initial_lr"] = base_lr
        self._last_lr = list(rates)
        warnings.warn(
            f"learning-rate schedule changed since the checkpoint (total_iters {state_dict.get('total_iters')} -> "
            f"{self.total_iters}, end_factor {state_dict.get('end_factor')} -> {self.end_factor}): continuing at step "
            f"{self.last_epoch} on the new schedule with lr {rates[0]:.3g}.",
            stacklevel=2,
        )
