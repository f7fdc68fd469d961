"""Utilities: atomic checkpoint writing and input checks used by the bundles."""

from .checkpoint import atomic_torch_save, cpu_state_dict
from .files import require_file, require_items

__all__: list[str] = ["atomic_torch_save", "cpu_state_dict", "require_file", "require_items"]
