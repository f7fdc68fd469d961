"""The trainer's prediction of a deeply supervised network: its final head, once the loss has seen every head."""

from __future__ import annotations

from collections.abc import Sequence

from ignite.engine import Engine, Events
from monai.engines.utils import IterationEvents
from monai.utils import CommonKeys

__all__ = ["FinalHeadHandler"]


class FinalHeadHandler:
    """Keep only the final head of a deeply supervised network's training output, after the loss.

    A network with deep supervision (e.g. :class:`~spectraflow_monai.networks.UNetPlusPlus` with
    ``deep_supervision=True``, Zhou et al.'s U-Net++ as the baseline of the SpectraFlow paper's Fig. 5) returns a list
    of heads in training mode; MONAI's :class:`~monai.losses.DeepSupervisionLoss` takes that list, while the
    trainer's post-processing and training metrics take one prediction. This handler replaces a list (or tuple)
    ``engine.state.output["pred"]`` by its entry ``head`` at MONAI's ``IterationEvents.LOSS_COMPLETED``, after the loss
    and before the decollation, post-processing and metrics of ``ITERATION_COMPLETED``; a tensor prediction is left
    as it is, so the handler is a no-op for networks without deep supervision. Engines that do not fire
    ``LOSS_COMPLETED`` are handled at ``ITERATION_COMPLETED`` (attach it before the metrics then).

    Args:
        head: index of the head to keep. Defaults to -1, the final head (MONAI's ``BasicUNetPlusPlus`` lists it last).
        key: the prediction's key in the engine output. Defaults to ``"pred"``.

    Raises:
        ValueError: ``head`` is not an int.
    """

    def __init__(self, head: int = -1, key: str = CommonKeys.PRED) -> None:
        if isinstance(head, bool) or not isinstance(head, int):
            raise ValueError(f"head must be an int, got {head!r}.")
        self.head = head
        self.key = key

    def attach(self, engine: Engine) -> None:
        """Select the head after every iteration's loss of ``engine``."""
        event = IterationEvents.LOSS_COMPLETED
        engine.add_event_handler(event if engine.has_registered_events(event) else Events.ITERATION_COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        output = engine.state.output
        pred = output.get(self.key) if isinstance(output, dict) else None
        if isinstance(pred, Sequence) and not isinstance(pred, (str, bytes)):
            output[self.key] = pred[self.head]
