"""Utilities: atomic checkpoint writing and input checks used by the bundles."""

from .checkpoint import atomic_torch_save, cpu_state_dict
from .errors import DataError, SettingError, install_excepthook
from .files import atomic_path, require_file, require_items, write_text_atomic
from .bundles import BUNDLE_NAMES, bundle_command, bundle_path, run_bundle_configs
from .settings import check_image_size
from . import distributed, run_record  # noqa: E402,F401  (modules the bundle configs call)

__all__: list[str] = [
    "BUNDLE_NAMES",
    "bundle_command",
    "bundle_path",
    "run_bundle_configs",
    "atomic_path",
    "atomic_torch_save",
    "check_image_size",
    "cpu_state_dict",
    "DataError",
    "install_excepthook",
    "require_file",
    "require_items",
    "SettingError",
    "write_text_atomic",
]

from .precision import (  # noqa: E402
    AutocastInferer,
    Precision,
    amp_kwargs,
    autocast_kwargs,
    autocast_off,
    cpu_bf16_flags,
    cpu_supports_bf16,
    cuda_supports_bf16,
    resolve_precision,
)

__all__ += [
    "AutocastInferer",
    "Precision",
    "amp_kwargs",
    "autocast_kwargs",
    "autocast_off",
    "cpu_bf16_flags",
    "cpu_supports_bf16",
    "cuda_supports_bf16",
    "resolve_precision",
]
