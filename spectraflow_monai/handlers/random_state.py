"""The random-number generator states of a training run, as a checkpointable object."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from monai.transforms import Randomizable

__all__ = ["RandomStateHandler"]


def _np_state(rs: np.random.RandomState) -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = rs.get_state(legacy=True)
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}  # fmt: skip


def _set_np_state(rs: np.random.RandomState, state: Mapping[str, Any]) -> None:
    # a checkpoint loaded with map_location='cuda' (the bundles' CheckpointLoader on a GPU) holds CUDA tensors
    keys = state["keys"].cpu().numpy().astype(np.uint32)
    rs.set_state((state["kind"], keys, state["pos"], state["has_gauss"], state["gauss"]))


def _randomizables(objects: Iterable[Any]) -> list[Randomizable]:
    """Every MONAI ``Randomizable`` reachable from ``objects`` (lists, dicts, ``Compose`` and the attributes of
    transforms), in a fixed depth-first order, each once."""
    found: list[Randomizable] = []
    seen: set[int] = set()

    def walk(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 12:
            return
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                walk(item, depth + 1)
        elif hasattr(obj, "__call__") and hasattr(obj, "__dict__") and not isinstance(obj, (torch.Tensor, type)):
            if isinstance(obj, Randomizable):
                found.append(obj)
            if type(obj).__module__.startswith(("monai.", "spectraflow_monai.")):
                for item in vars(obj).values():
                    walk(item, depth + 1)

    walk(list(objects), 0)
    return found


class RandomStateHandler:
    """``state_dict`` / ``load_state_dict`` of every random-number generator a training run draws from.

    Saved: the CPU generator of torch (which also seeds the shuffling of ``DataLoader`` samplers and the workers'
    seeds), the CUDA generators (when CUDA is available), numpy's and Python's global generators, and the
    ``RandomState`` of every MONAI ``Randomizable`` transform reachable from ``transforms`` (with
    ``num_workers=0`` the random augmentations run in the main process and draw from those). Listing this object in
    the ``save_dict`` of a ``CheckpointSaver`` (and the ``load_dict`` of a ``CheckpointLoader``) makes a resumed
    run draw the same random numbers as an uninterrupted one. All values are tensors, numbers or strings, so the
    checkpoint loads with ``torch.load(..., weights_only=True)``.

    Args:
        transforms: transforms (a ``Compose``, a list, a dataset's ``transform``, a ``collate_fn``) whose random
            states are saved too. Defaults to None.
    """

    def __init__(self, transforms: Any = None) -> None:
        self.transforms = [] if transforms is None else list(transforms) if isinstance(transforms, (list, tuple)) else [transforms]

    def attach(self, engine: Any) -> None:
        """Nothing to attach: the object is saved and loaded by checkpoint handlers (MONAI handler contract)."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": _np_state(np.random.mtrand._rand),
            "python": random.getstate(),
            "transforms": [_np_state(t.R) for t in _randomizables(self.transforms)],
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the states saved by :meth:`state_dict`.

        Raises:
            ValueError: the number of random transforms differs from the checkpoint's (another pipeline).
        """
        torch.set_rng_state(state_dict["torch"].cpu())
        _set_np_state(np.random.mtrand._rand, state_dict["numpy"])
        version, internal, gauss = state_dict["python"]
        random.setstate((version, tuple(internal), gauss))
        targets = _randomizables(self.transforms)
        saved = state_dict.get("transforms", [])
        if len(saved) != len(targets):
            raise ValueError(
                f"the checkpoint holds the random states of {len(saved)} random transforms, this run has "
                f"{len(targets)}: it was written by another data pipeline."
            )
        for transform, rs in zip(targets, saved):
            _set_np_state(transform.R, rs)
        cuda = state_dict.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
