"""Lazy package exports (PEP 562): a package's names are imported from their modules when first used.

The ``spectraflow`` command line answers ``--help`` without loading torch and MONAI: a subcommand's module is
imported through its package, and an eager package ``__init__`` would import every module of it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` of ``package``: ``modules`` maps each module (relative, e.g. ``".files"``) to
    the names the package exports from it; a submodule name imports the submodule. Unknown names raise
    ``AttributeError``."""
    namespace = importlib.import_module(package).__dict__
    exports = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
        else:
            try:
                value = importlib.import_module(f".{name}", package)
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
