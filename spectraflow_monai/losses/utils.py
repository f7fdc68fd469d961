"""Argument checks shared by the losses."""

from __future__ import annotations

from monai.utils import LossReduction

__all__ = ["check_reduction"]


def check_reduction(reduction: LossReduction | str) -> str:
    """``reduction`` as the value MONAI's ``_Loss`` takes; ValueError naming the value unless mean / sum / none."""
    try:
        return LossReduction(reduction).value
    except ValueError as e:
        raise ValueError(f"reduction must be one of 'mean', 'sum', 'none', got {reduction!r}.") from e
