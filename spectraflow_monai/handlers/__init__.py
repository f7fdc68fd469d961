"""Ignite handlers used by the SpectraFlow bundles."""

from .progress import ProgressBarHandler

__all__ = ["ProgressBarHandler"]
