"""A progress bar that MONAI bundles can list among their handlers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ignite.engine import Engine, Events
from ignite.handlers import ProgressBar

__all__ = ["ProgressBarHandler"]


def _loss_only(output: Any) -> dict[str, float]:
    """Pick the scalar loss terms of an engine output for display (dict outputs, or lists of dicts)."""
    if isinstance(output, Sequence) and output and isinstance(output[0], dict):
        output = output[0]
    if isinstance(output, dict):
        return {k: float(v) for k, v in output.items() if k.startswith("loss") and hasattr(v, "__float__")}
    return {"loss": float(output)} if hasattr(output, "__float__") else {}


def _pick(output: Any, keys: Sequence[str]) -> dict[str, float]:
    """The entries ``keys`` of an engine output (dict, or list of dicts) that are present, as floats."""
    if isinstance(output, Sequence) and output and isinstance(output[0], dict):
        output = output[0]
    if not isinstance(output, dict):
        return {}
    return {k: float(output[k]) for k in keys if k in output and hasattr(output[k], "__float__")}


class ProgressBarHandler:
    """ignite's tqdm :class:`~ignite.handlers.ProgressBar` with MONAI's handler contract (``attach(engine)``).

    MONAI bundles attach handlers by calling ``handler.attach(engine)``; ignite's progress bar takes its display
    options in ``attach`` instead of ``__init__``. This wrapper takes them in ``__init__``.

    Args:
        output_transform: maps ``engine.state.output`` to a dict of values to display. Defaults to the entries whose
            names start with ``loss`` (MONAI trainers put the loss under ``"loss"`` of every decollated item).
        metric_names: engine metrics to display, or ``"all"``. Defaults to ``None``.
        persist: keep the bar after each epoch. Defaults to ``False``.
        desc: bar description. Defaults to ``None``.
        keys: names of the output entries to display, those present in the output in this order (e.g.
            ``["meanflow_error", "loss_mae"]`` for the Stage-1 trainers: the headline error of whichever runs);
            replaces ``output_transform``. Defaults to ``None``.
        enabled: False attaches nothing (a bundle's ``progress_bar: false``, or a process other than the first of
            a distributed run). Defaults to ``True``.
        every: iterations between updates of the bar, >= 1. Displaying a loss held on a GPU reads it back (a host
            synchronisation), so a GPU run updates the bar every few iterations. Defaults to 1.

    Raises:
        ValueError: ``keys`` is a string or empty, or ``every`` is not a positive integer.
    """

    def __init__(
        self,
        output_transform: Callable[[Any], dict] | None = _loss_only,
        metric_names: str | Sequence[str] | None = None,
        persist: bool = False,
        desc: str | None = None,
        keys: Sequence[str] | None = None,
        enabled: bool = True,
        every: int = 1,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}.")
        self.every = every
        if keys is not None:
            if isinstance(keys, str) or not len(keys):
                raise ValueError(f"keys must be a non-empty sequence of output names, got {keys!r}.")
            names = tuple(str(k) for k in keys)
            output_transform = lambda output: _pick(output, names)  # noqa: E731
        self.keys = keys
        self.output_transform = output_transform
        self.metric_names = metric_names
        self.bar = ProgressBar(persist=persist, desc=desc)
        self.enabled = bool(enabled)

    def attach(self, engine: Engine) -> None:
        """Attach the progress bar to ``engine`` (nothing when not ``enabled``)."""
        if not self.enabled:
            return
        event = Events.ITERATION_COMPLETED if self.every == 1 else Events.ITERATION_COMPLETED(every=self.every)
        self.bar.attach(
            engine, metric_names=self.metric_names, output_transform=self.output_transform, event_name=event
        )
