"""Utilities: atomic checkpoint writing and input checks used by the bundles."""

from spectraflow_monai._lazy import lazy_exports

#: module -> the names it exports (imported when a name is first used: the command line stays light)
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".bundles": (
        "BUNDLE_NAMES", "COMMANDS", "INFERENCE_LAYERS", "LAYERED_LAST", "bundle_command", "check_run_configs",
        "bundle_config_files", "bundle_parser",
        "bundle_path", "run_bundle_configs",
    ),
    ".files": ("atomic_path", "require_file", "require_items", "require_weights", "write_text_atomic"),
    ".checkpoint": ("atomic_torch_save", "cpu_state_dict"),
    ".compile": ("COMPILE_MODES", "CompiledOrEager", "compile_or_eager", "to_channels_last"),
    ".distance": (
        "DISTANCE_BACKENDS", "euclidean_distance_transform", "signed_distance_map", "squared_distance_transform",
    ),
    ".settings": ("check_image_size",),
    ".errors": ("DataError", "install_excepthook", "SettingError"),
    ".fingerprint": ("file_digest",),
    ".run_record": ("MODEL_DIGEST_KEY", "SETTINGS_DIGEST_KEY", "check_model_digest", "settings_digest"),
    ".precision": (
        "AutocastInferer", "Precision", "amp_kwargs", "autocast_kwargs", "autocast_off", "cpu_bf16_flags",
        "cpu_supports_bf16", "cuda_supports_bf16", "resolve_precision",
    ),
}

__all__: list[str] = [name for names in _EXPORTS.values() for name in names]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
