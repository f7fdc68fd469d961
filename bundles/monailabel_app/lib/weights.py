"""Weight-file checks of the SpectraFlow MONAI Label app (docs/monailabel.md, "A model and its record").

A served model is a pair: ``models/model.pt`` and the record ``models/model.json`` its training wrote beside it (the
model settings with the SHA-256 of the weights and of the settings). Before a pair is served, at start, after a
training run or an upload (``PUT /model/<model>``), the app checks:

- :func:`weights_problem`: the weights load weights-only (``torch.load(weights_only=True)``: no pickled code runs)
  as a state dict with exactly the network's keys and shapes, each tensor dense, of the network's kind of number,
  finite, and not all zero;
- :func:`pair_problem`: the record holds both digests and the one of these very weights, and describes a model of
  the bundle's kind (2D images or CT volumes); then the weights against the network the record describes;
- :func:`check_weights`: at start, the served ``model.pt`` against the configured network (the start stops naming
  the file and the keys).

Each check returns or raises a reason that names no server path.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import torch

from spectraflow_monai.utils.run_record import MODEL_DIGEST_KEY, SETTINGS_DIGEST_KEY, check_model_digest
from spectraflow_monai.utils.settings import model_settings_path

from .checks import redact_paths
from .infers import DEFAULT_WEIGHTS, short_reason

__all__ = ["check_weights", "pair_problem", "weights_problem"]


def weights_problem(path: str, network: torch.nn.Module) -> str | None:
    """Why the file at ``path`` cannot be loaded into ``network``, or None when it fits.

    The file is loaded weights-only (``torch.load(..., weights_only=True)``: no pickled code runs) and must hold a
    state dict (or ``{"model": state dict}``) with exactly the network's keys and shapes.

    Args:
        path: the weight file.
        network: the served network.

    Returns:
        the reason (naming no path), or None.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # every load failure means "not a weights-only PyTorch file"
        return f"it is not a weights-only PyTorch checkpoint ({redact_paths(short_reason(e))})"
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("model"), dict):
        checkpoint = checkpoint["model"]
    if not isinstance(checkpoint, dict) or not all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return f"it holds a {type(checkpoint).__name__}, not a state dict of tensors"
    expected = network.state_dict()
    missing = sorted(set(expected) - set(checkpoint))
    unexpected = sorted(set(checkpoint) - set(expected))
    wrong = sorted(k for k in set(checkpoint) & set(expected) if tuple(checkpoint[k].shape) != tuple(expected[k].shape))
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)):
        if keys:
            parts.append(f"{label}: {keys[:5]}{' ...' if len(keys) > 5 else ''} ({len(keys)})")
    if parts:
        return f"it does not fit the served network ({'; '.join(parts)})"
    return _tensor_problem(checkpoint, expected)


def _number_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "complex" if dtype.is_complex else "float" if dtype.is_floating_point else "integer"


def _tensor_problem(checkpoint: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> str | None:
    """Why tensors of the right names and shapes still cannot be served: a storage the network cannot compute with
    (sparse, meta, quantized), another kind of number (bool, integer or complex for a float weight), NaN or
    infinite values, or weights that are all zero (an untrained or wiped model)."""
    kinds: dict[str, list[str]] = {}
    nonzero = False
    for key in sorted(expected):
        tensor, wanted = checkpoint[key], expected[key]
        if tensor.layout != torch.strided or tensor.is_meta or tensor.is_quantized:
            kinds.setdefault("not a dense tensor with values (sparse, meta or quantized)", []).append(key)
        elif _number_kind(tensor.dtype) != _number_kind(wanted.dtype):
            kinds.setdefault(f"of another number type than the network's ({wanted.dtype})", []).append(key)
        elif tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
            kinds.setdefault("holding NaN or infinite values", []).append(key)
        elif tensor.dtype.is_floating_point and bool(tensor.any()):
            nonzero = True
    parts = [
        f"{len(keys)} tensor(s) {kind}: {keys[:3]}{' ...' if len(keys) > 3 else ''}"
        for kind, keys in kinds.items()
    ]
    if parts:
        return f"it cannot be served ({'; '.join(parts)})"
    if not nonzero and any(t.dtype.is_floating_point for t in expected.values()):
        return "it cannot be served (every weight is zero: an untrained or wiped model)"
    return None


def check_weights(path: str, network: torch.nn.Module, name: str) -> None:
    """Stop the start, naming the file and the keys, when ``model.pt`` at ``path`` does not fit the configured
    network of bundle ``name`` (:func:`weights_problem`).

    Raises:
        ValueError: naming the file, the bundle and what does not fit.
    """
    problem = weights_problem(path, network)
    if problem is not None:
        raise ValueError(
            f"{path} does not fit the network of bundle {name!r}: {problem}. Serve it with the network "
            'settings it was trained with, e.g. --conf overrides \'{"encoder_name": ..., "encoder_kwargs": ...}\'.'
        )


def pair_problem(folder: str, name: str, volume_bundle: bool, network: Callable[[], torch.nn.Module]) -> str | None:
    """Why the model pair in ``folder/models`` (``model.pt`` and its ``model.json``) cannot serve as bundle
    ``name``'s, or None: the record must hold the digest of these weights and of its own settings, describe a model
    of this bundle's kind (2D images or CT volumes), and the weights must be exactly those of the network it
    describes (:func:`weights_problem`).

    Args:
        folder: the folder whose ``models/`` holds the pair (the upload's unpacked archive).
        name: the bundle's name (for the message).
        volume_bundle: whether the bundle takes CT volumes.
        network: builds the network the record in ``folder`` describes (a record that the app's overrides
            contradict raises ValueError there).

    Returns:
        the reason (the folder named "the upload"), or None.
    """
    weights = os.path.join(folder, "models", DEFAULT_WEIGHTS)
    try:
        with open(model_settings_path(weights)) as f:
            content = json.load(f)
        if not isinstance(content, dict) or not isinstance(content.get("model"), dict):
            return "model.json is not a model record (no 'model' settings)"
        if not content.get(MODEL_DIGEST_KEY) or not content.get(SETTINGS_DIGEST_KEY):
            return (f"model.json holds no {MODEL_DIGEST_KEY} / {SETTINGS_DIGEST_KEY}: upload the model.json that "
                    "training wrote beside this model.pt (this version records both)")  # fmt: skip
        check_model_digest(weights)
        volume = bool(content["model"].get("hu_window"))
        if volume != volume_bundle:
            kind = "CT volumes (a Synapse model)" if volume else "2D images"
            return f"model.json describes a model of {kind}, not of bundle {name!r}"
        built = network()
    except (ValueError, OSError, RuntimeError) as e:
        return redact_paths(short_reason(e).split(": ", 1)[-1], {folder: "the upload"})
    return weights_problem(weights, built)
