"""The lazily exported names of the package's subpackages (``_EXPORTS`` tables, :mod:`spectraflow_monai._lazy`)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import spectraflow_monai

PACKAGES = sorted(
    info.name
    for info in pkgutil.walk_packages(spectraflow_monai.__path__, "spectraflow_monai.")
    if info.ispkg and hasattr(importlib.import_module(info.name), "_EXPORTS")
)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_exported_name_is_also_a_submodule(package):
    """A name that is both a lazy export and a submodule resolves to whichever was imported first (importing the
    submodule sets the package attribute): ``from pkg import name`` and config ``_target_`` paths would then depend on
    import order."""
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    exported = {name for names in module._EXPORTS.values() for name in names}
    assert not exported & submodules, f"{package}: {sorted(exported & submodules)}"


def test_label_setup_is_the_function_whatever_was_imported_first():
    import spectraflow_monai.apps.seg2d.labels  # noqa: F401  (the submodule first)
    from spectraflow_monai.apps.seg2d import LabelSetup, label_setup

    assert callable(label_setup) and isinstance(label_setup(None), LabelSetup)
