"""Utilities: atomic checkpoint writing and input checks used by the bundles."""

from .checkpoint import atomic_torch_save, cpu_state_dict
from .files import atomic_path, require_file, require_items, write_text_atomic

__all__: list[str] = [
    "atomic_path",
    "atomic_torch_save",
    "cpu_state_dict",
    "require_file",
    "require_items",
    "write_text_atomic",
]
