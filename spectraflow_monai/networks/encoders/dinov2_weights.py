"""Loading DINOv2 weight files into SpectraFlow's encoder: official facebookresearch and timm layouts.

SpectraFlow (Chen et al.) starts both stages from the official DINOv2 weights (Oquab et al., arXiv:2304.07193). The
official checkpoints keep the position embedding on the 37x37 grid of 518-px training;
:func:`interpolate_official_pos_embed` resizes it as the official code does, and timm's ``checkpoint_filter_fn`` maps
the keys.
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

__all__ = ["interpolate_official_pos_embed", "load_dinov2_state_dict"]

# keys under which training scripts commonly nest the state dict of a network
_WRAPPER_KEYS = ("state_dict", "model", "encoder", "teacher", "network")
# key prefixes added by DataParallel / torch.compile / wrapper modules
_STRIP_PREFIXES = ("module.", "_orig_mod.", "encoder.", "vit.", "backbone.")
_MAX_LISTED_KEYS = 10



def _format_keys(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_MAX_LISTED_KEYS])
    if len(keys) > _MAX_LISTED_KEYS:
        shown += f", ... ({len(keys) - _MAX_LISTED_KEYS} more)"
    return shown


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


def load_dinov2_state_dict(vit: nn.Module, path: str | os.PathLike, what: str = "the encoder") -> None:
    """Load a DINOv2 weight file (official facebookresearch or timm layout) into the timm ``VisionTransformer`` ``vit``.

    See :meth:`spectraflow_monai.networks.encoders.DINOv2Encoder.load_weights` for the accepted layouts.

    Args:
        vit: the timm vision transformer to load into (strict: every key, every shape).
        path: the weight file, read with ``torch.load(..., weights_only=True)``.
        what: the model named in error messages.

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
        raise ValueError(f"could not read encoder weight file '{file}': {type(exc).__name__}: {exc}") from exc

    while isinstance(obj, Mapping) and not _is_state_dict(obj):
        inner = next((obj[k] for k in _WRAPPER_KEYS if k in obj and isinstance(obj[k], Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not _is_state_dict(obj):
        raise ValueError(
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
            raise ValueError(f"encoder weight file '{file}': {exc}") from exc

    try:
        state = checkpoint_filter_fn(state, vit)
    except Exception as exc:
        raise ValueError(
            f"could not map encoder weight file '{file}' onto {what}: {type(exc).__name__}: {exc}"
        ) from exc

    expected = vit.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise ValueError(
            f"encoder weight file '{file}' does not match {what}: "
            f"{len(missing)} missing key(s) [{_format_keys(missing)}], "
            f"{len(unexpected)} unexpected key(s) [{_format_keys(unexpected)}]."
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(
                f"encoder weight file '{file}': key '{key}' has shape {tuple(value.shape)}, "
                f"the model expects {tuple(expected[key].shape)}."
            )
    vit.load_state_dict(state, strict=True)
