"""``torch.compile`` where it works, eager where it does not (with the reason logged), and ``channels_last``.

At the paper's batch size a SpectraFlow step is bound by per-step overheads on a GPU (kernel launches, Python),
which ``torch.compile`` (and its CUDA graphs, ``mode="reduce-overhead"``) removes. Compilation fails for some code
(e.g. the MeanFlow target's forward-mode JVP on some torch versions, FDConv's complex FFTs under some backends) and
only at the first call, so :func:`compile_or_eager` wraps the callable: the first call runs the compiled version and,
if compiling or running it raises, logs the reason once and runs (and keeps running) the eager callable.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

__all__ = ["COMPILE_MODES", "CompiledOrEager", "compile_or_eager", "to_channels_last"]

logger = logging.getLogger(__name__)

#: the values of a ``compile`` setting: ``"off"`` (eager) or a ``torch.compile`` mode
COMPILE_MODES: tuple[str, ...] = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class CompiledOrEager:
    """A callable that runs ``torch.compile(fn)`` and falls back to ``fn`` for good at the first failure.

    Attributes:
        compiled: whether the compiled version is still in use (False after a fallback or when ``mode="off"``).
        reason: the fallback's reason (``"<exception type>: <message on one line, at most 300 characters>"``), or
            None.
    """

    def __init__(self, fn: Callable, name: str, mode: str, **compile_kwargs: Any) -> None:
        self.fn = fn
        self.name = name
        self.mode = mode
        self.reason: str | None = None
        self._compiled: Callable | None = None
        if mode != "off":
            try:
                kwargs = dict(compile_kwargs)
                if "backend" not in kwargs or kwargs.get("backend") == "inductor":
                    kwargs["mode"] = mode
                self._compiled = torch.compile(fn, **kwargs)
            except Exception as err:  # torch.compile itself refused (unsupported platform, Python version)
                self._fall_back(err)
        functools.update_wrapper(self, fn)

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def _fall_back(self, err: BaseException) -> None:
        message = " ".join(str(err).split())  # one line
        self.reason = f"{type(err).__name__}: {message[:300]}"
        self._compiled = None
        logger.warning("torch.compile of %s fell back to eager: %s", self.name, self.reason)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            return self.fn(*args, **kwargs)
        try:
            return self._compiled(*args, **kwargs)
        except Exception as err:
            if not _is_compile_error(err):
                raise
            self._fall_back(err)
            return self.fn(*args, **kwargs)


def _is_compile_error(err: BaseException) -> bool:
    """Whether ``err`` comes from compilation (dynamo / inductor / a backend), not from the user's code or data."""
    module = type(err).__module__ or ""
    if module.startswith(("torch._dynamo", "torch._inductor", "torch.fx", "torch._subclasses")):
        return True
    return "backend" in str(err).lower() and "compil" in str(err).lower()


def compile_or_eager(
    fn: Callable | nn.Module, mode: str = "default", name: str | None = None, **compile_kwargs: Any
) -> Callable:
    """``fn`` (a function, a bound method such as a trainer's step, or a module) compiled with ``torch.compile``
    where that works, eager otherwise (the reason logged once at WARNING).

    For a module the module itself is returned with its ``forward`` replaced (its parameters, ``state_dict`` and
    ``train()`` / ``eval()`` stay those of the module, so checkpoints do not change); the :class:`CompiledOrEager`
    wrapper is its ``forward``.

    Args:
        fn: what to compile.
        mode: one of :data:`COMPILE_MODES`; ``"off"`` returns ``fn`` unchanged. ``"reduce-overhead"`` captures CUDA
            graphs: it needs static shapes (``drop_last=True``) and no host synchronisation inside the step.
            Defaults to ``"default"``.
        name: the name in the log line. Defaults to ``fn``'s qualified name.
        compile_kwargs: other ``torch.compile`` arguments (``fullgraph``, ``dynamic``, ``backend``; ``mode`` is
            passed only for the default inductor backend).

    Raises:
        ValueError: an unknown ``mode`` or an ``fn`` that is not callable.
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"mode must be one of {list(COMPILE_MODES)}, got {mode!r}.")
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}.")
    if mode == "off":
        return fn
    label = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    if isinstance(fn, nn.Module):
        fn.forward = CompiledOrEager(fn.forward, label, mode, **compile_kwargs)
        return fn
    return CompiledOrEager(fn, label, mode, **compile_kwargs)


def to_channels_last(module: nn.Module, enabled: bool = True) -> nn.Module:
    """Put ``module``'s 4-D parameters and buffers in ``channels_last`` memory format (in place; returns it).

    Convolutions with ``channels_last`` inputs and weights use the NHWC kernels of cuDNN (tensor cores) and oneDNN;
    the inputs follow with ``x.contiguous(memory_format=torch.channels_last)`` (the ViT encoder's tokens are not
    affected). ``enabled=False`` returns the module unchanged.
    """
    return module.to(memory_format=torch.channels_last) if enabled else module
