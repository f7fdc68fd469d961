"""Encoder weights: DINOv2 checkpoints read and converted into a timm ``VisionTransformer``.

The networks (:class:`~spectraflow_monai.networks.DINOv2Encoder`, :class:`~spectraflow_monai.networks.SpectraFlowNet`)
build the architecture only; the encoder asks for its weights with
:meth:`~spectraflow_monai.networks.DINOv2Encoder.load_pretrained` (``encoder weights: <source> (<file>)``), which
reads them with this module: :func:`load_timm_weights` (``"timm"``: the DINOv2 weights of the paper, downloaded
through timm's Hugging Face hub copy) or :func:`load_dinov2_state_dict` (a local DINOv2 checkpoint file: official
facebookresearch keys with their position grid resized as the official code does, or timm keys, or a Stage-1
export). This module knows checkpoints and timm's ``VisionTransformer``, not the encoder. Which source a bundle run
starts from is decided above it (:func:`spectraflow_monai.apps.encoder_init.initialize_encoder`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from spectraflow_monai.utils.errors import SettingError

__all__ = [
    "HUB_PROBE_TIMEOUT",
    "interpolate_official_pos_embed",
    "load_dinov2_state_dict",
    "load_timm_weights",
    "normalize_weights_source",
]

# what a command line gives for "no weights" (``--pretrained_weights none`` / ``null``)
_NO_WEIGHTS = ("", "none", "null")
_MAX_LISTED_KEYS = 10
# keys under which training scripts commonly nest the state dict of a network
_WRAPPER_KEYS = ("state_dict", "model", "encoder", "teacher", "network")
# key prefixes added by DataParallel / torch.compile / wrapper modules
_STRIP_PREFIXES = ("module.", "_orig_mod.", "encoder.", "vit.", "backbone.")


def normalize_weights_source(source: Any, name: str = "pretrained_weights") -> str | None:
    """``None`` for "no weights" (``None``, ``"none"``, ``"null"``, ``""``, any case), ``"timm"``, or a file path.

    Args:
        source: the setting's value.
        name: the setting's name for the message. Defaults to ``"pretrained_weights"``.

    Raises:
        SettingError: ``source`` is neither ``None``, a string nor a path.
    """
    if source is None:
        return None
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise SettingError(
            f"{name} must be 'timm', a DINOv2 checkpoint file or 'none', got {source!r} ({type(source).__name__})."
        )
    if source.strip().lower() in _NO_WEIGHTS:
        return None
    if source.strip().lower() == "timm":
        return "timm"
    return source


def _format_keys(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_MAX_LISTED_KEYS])
    if len(keys) > _MAX_LISTED_KEYS:
        shown += f", ... ({len(keys) - _MAX_LISTED_KEYS} more)"
    return shown


def _load_strict(vit: nn.Module, state: Mapping[str, torch.Tensor], where: str, what: str) -> None:
    """Load ``state`` into ``vit`` when every key and shape fits; else a :class:`SettingError` (a ``ValueError``)
    naming ``where`` and the keys: the weights setting points at weights of another model."""
    expected = vit.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)]
    shapes = ", ".join(f"{k!r} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}" for k in wrong[:_MAX_LISTED_KEYS])
    if missing or unexpected or wrong:
        raise SettingError(
            f"{where} does not match {what}: {len(missing)} missing key(s) [{_format_keys(missing)}], "
            f"{len(unexpected)} unexpected key(s) [{_format_keys(unexpected)}], {len(wrong)} shape mismatch(es) "
            f"(weights vs model) [{shapes}]."
        )
    vit.load_state_dict(dict(state), strict=True)


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, torch.Tensor) for v in obj.values())


def interpolate_official_pos_embed(
    pos_embed: torch.Tensor, grid: tuple[int, int], interpolate_offset: float = 0.1, antialias: bool = False
) -> torch.Tensor:
    """Resize an official DINOv2 position embedding ``(1, 1 + M*M, D)`` to ``grid`` as the official code does.

    facebookresearch/dinov2 ``DinoVisionTransformer.interpolate_pos_encoding``: the class position is kept; the
    ``M x M`` patch grid, as ``(1, D, M, M)`` in float32, goes through ``F.interpolate(mode="bicubic",
    antialias=antialias)`` with ``scale_factor = ((rows + offset) / M, (cols + offset) / M)`` when
    ``interpolate_offset`` is non-zero and ``size = grid`` otherwise, and must come out with the size ``grid``. The
    hub models without registers use ``interpolate_offset=0.1, antialias=False``; those with registers
    ``interpolate_offset=0.0, antialias=True`` (``dinov2/hub/backbones.py``).

    Args:
        pos_embed: ``(1, 1 + M*M, D)`` class position followed by the patch grid.
        grid: target ``(rows, cols)`` of patches.
        interpolate_offset: the official offset. Defaults to 0.1.
        antialias: the official ``interpolate_antialias``. Defaults to False.

    Returns:
        ``(1, 1 + rows*cols, D)`` in the dtype of ``pos_embed``.

    Raises:
        ValueError: the patch positions do not form a square grid, or the interpolation misses ``grid``.
    """
    num_patches, dim = pos_embed.shape[1] - 1, pos_embed.shape[-1]
    side = math.isqrt(max(num_patches, 0))
    if pos_embed.ndim != 3 or pos_embed.shape[0] != 1 or side * side != num_patches or side == 0:
        raise ValueError(f"pos_embed must be (1, 1 + M*M, D), got {tuple(pos_embed.shape)}.")
    rows, cols = int(grid[0]), int(grid[1])
    if (rows, cols) == (side, side):
        return pos_embed
    patch = pos_embed[:, 1:].float().reshape(1, side, side, dim).permute(0, 3, 1, 2)
    if interpolate_offset:
        scale = (float(rows + interpolate_offset) / side, float(cols + interpolate_offset) / side)
        patch = F.interpolate(patch, mode="bicubic", antialias=antialias, scale_factor=scale)
    else:
        patch = F.interpolate(patch, mode="bicubic", antialias=antialias, size=(rows, cols))
    if tuple(patch.shape[-2:]) != (rows, cols):
        raise ValueError(f"position grid interpolated to {tuple(patch.shape[-2:])}, expected {(rows, cols)}.")
    patch = patch.permute(0, 2, 3, 1).reshape(1, rows * cols, dim)
    return torch.cat([pos_embed[:, :1].float(), patch], dim=1).to(pos_embed.dtype)


def load_dinov2_state_dict(vit: nn.Module, path: str | os.PathLike, what: str = "the encoder") -> int:
    """Load a DINOv2 weight file (official facebookresearch or timm layout) into the timm ``VisionTransformer`` ``vit``.

    See :meth:`spectraflow_monai.networks.encoders.DINOv2Encoder.load_weights` for the accepted layouts.

    Args:
        vit: the timm vision transformer to load into (strict: every key, every shape).
        path: the weight file, read with ``torch.load(..., weights_only=True)``.
        what: the model named in error messages.

    Returns:
        the number of tensors loaded.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file cannot be read, holds no state dict, or its keys/shapes do not match the model.
    """
    from timm.models.vision_transformer import checkpoint_filter_fn

    file = Path(os.fspath(path)).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"encoder weight file not found: '{file}'.")
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SettingError(f"could not read encoder weight file '{file}': {type(exc).__name__}: {exc}") from exc

    while isinstance(obj, Mapping) and not _is_state_dict(obj):
        inner = next((obj[k] for k in _WRAPPER_KEYS if k in obj and isinstance(obj[k], Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not _is_state_dict(obj):
        raise SettingError(
            f"encoder weight file '{file}' does not hold a state dict of tensors (top-level type "
            f"{type(obj).__name__}; nested state dicts are searched under {list(_WRAPPER_KEYS)})."
        )
    state = dict(obj)
    stripped = True
    while stripped:
        stripped = False
        for prefix in _STRIP_PREFIXES:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                stripped = True
    state = {k: v for k, v in state.items() if not k.startswith("head.")}
    if "mask_token" in state and isinstance(state.get("pos_embed"), torch.Tensor):
        registers = "register_tokens" in state  # official hub settings: (offset, antialias)
        offset, antialias = (0.0, True) if registers else (0.1, False)
        grid = tuple(int(g) for g in vit.patch_embed.grid_size)
        try:
            state["pos_embed"] = interpolate_official_pos_embed(state["pos_embed"], grid, offset, antialias)
        except ValueError as exc:
            raise SettingError(f"encoder weight file '{file}': {exc}") from exc

    try:
        state = checkpoint_filter_fn(state, vit)
    except Exception as exc:
        raise SettingError(
            f"could not map encoder weight file '{file}' onto {what}: {type(exc).__name__}: {exc}"
        ) from exc

    _load_strict(vit, state, f"encoder weight file '{file}'", what)
    return len(state)


def _offline_message(model_name: str, location: str, cfg: Mapping[str, Any], exc: BaseException) -> str:
    official = os.path.basename(str(cfg.get("url") or "")) or "dinov2_vits14_pretrain.pth"
    return (
        f"pretrained_weights='timm': could not download the DINOv2 weights of {model_name!r} ({location}): "
        f"{type(exc).__name__}: {exc}\n"
        "Nothing was trained. Without access to the hub, either\n"
        f"  - give a local weight file as pretrained_weights: /path/{official} (the official facebookresearch "
        f"checkpoint{', ' + str(cfg['url']) if cfg.get('url') else ''}, copied from a machine with internet) or a "
        f"timm state dict of {model_name} (in Python: pretrained='/path/file'); or\n"
        "  - opt into random initialisation: pretrained_weights none (not the paper's setting; with frozen encoder "
        "blocks also train every block, trainable_blocks all; README 'Encoder weights').\n"
        "Set HF_HUB_OFFLINE=1 to skip the network retries when a machine has no internet."
    )


#: how long the one connection attempt to the hub may take before a download is given up as offline
HUB_PROBE_TIMEOUT = 5.0
# the file names under which timm reads a hub model's weights (safetensors first)
_HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _hub_cached(hub_id: str) -> bool:
    """Whether the Hugging Face cache already holds the weights of ``hub_id`` (then no network is needed)."""
    from huggingface_hub import try_to_load_from_cache

    hub_id = hub_id.split("@")[0]
    return any(isinstance(try_to_load_from_cache(hub_id, name), str) for name in _HUB_WEIGHT_FILES)


def _hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hugging Face hub cannot be reached, or None when it can (or when that cannot be told here).

    One TCP connection to the hub's endpoint, at most ``timeout`` seconds: a machine without internet fails here at
    once instead of after the hub client's retries (about a minute). Skipped (None) in huggingface_hub's offline mode,
    which fails at once by itself, and where a proxy is configured (the hub is reached through it, not directly).
    """
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname, endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} could not be reached within {timeout:g} s ({type(exc).__name__}: {exc})"


def _download_timm_state_dict(vit: nn.Module, model_name: str) -> tuple[dict[str, torch.Tensor], str]:
    """timm's pretrained DINOv2 weights of ``vit`` (Hugging Face hub, else the url of its pretrained config).

    Weights not in the Hugging Face cache need the hub: an unreachable hub (no internet) fails at once
    (:func:`_hub_unreachable`), with the message that says how to go on."""
    import timm.models

    cfg = dict(getattr(vit, "pretrained_cfg", None) or {})
    hub_id, url = cfg.get("hf_hub_id"), cfg.get("url")
    location = f"hf-hub {hub_id}" if hub_id else f"url {url}"
    if not hub_id and not url:
        raise SettingError(f"pretrained_weights='timm': timm has no pretrained weights for {model_name!r}.")
    if hub_id and not _hub_cached(hub_id):
        reason = _hub_unreachable()
        if reason is not None:
            raise SettingError(_offline_message(model_name, location, cfg, ConnectionError(reason)))
    try:  # every failure of the download itself (no network, offline mode, missing cache) gets the message below
        if hub_id:
            state = timm.models.load_state_dict_from_hf(hub_id, weights_only=True)
        else:
            state = torch.hub.load_state_dict_from_url(url, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SettingError(_offline_message(model_name, location, cfg, exc)) from exc
    return dict(state), location


def load_timm_weights(vit: nn.Module, model_name: str, what: str | None = None) -> tuple[str, int]:
    """Download timm's DINOv2 weights of ``model_name`` and load them into the timm ``VisionTransformer`` ``vit``
    (timm's ``checkpoint_filter_fn`` mapping, classifier head dropped, strict: every key, every shape).

    Args:
        vit: the timm vision transformer to load into; its ``pretrained_cfg`` says where the weights are.
        model_name: the timm model name, for the messages.
        what: the model named in error messages. Defaults to ``model_name``.

    Returns:
        where the weights came from (``"hf-hub <id>"`` or ``"url <url>"``) and the number of tensors loaded.

    Raises:
        SettingError: the download failed (the message says how to pass a local file or opt into ``none``), or the
            weights do not fit the model.
    """
    from timm.models.vision_transformer import checkpoint_filter_fn

    state, location = _download_timm_state_dict(vit, model_name)
    state = {k: v for k, v in checkpoint_filter_fn(state, vit).items() if not k.startswith("head.")}
    _load_strict(vit, state, f"timm's weights of {model_name} ({location})", what or model_name)
    return location, len(state)
