"""Helpers that TorchScript compiles, for the networks' error messages (model-zoo's bundle check scripts them)."""

from __future__ import annotations

import torch

__all__ = ["shape_str"]


def shape_str(x: torch.Tensor) -> str:
    """``x``'s shape written as Python writes a tuple, e.g. ``"(2, 3, 224, 224)"``; unlike ``tuple(x.shape)`` inside
    an f-string, TorchScript compiles it."""
    dims = [str(int(s)) for s in x.shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
