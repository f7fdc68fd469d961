"""Helpers of the Stage-1 trainers: batch preparation (a MONAI ``PrepareBatch``) and gradient synchronisation.

- :class:`PrepareBatchMixedDomain` reads the images (and the optional 0/1 image/mask domain flag) of a Stage-1
  mini-batch and moves them to the device; :class:`~spectraflow_monai.engines.MeanFlowPretrainer` and
  :class:`~spectraflow_monai.engines.MAEPretrainer` use it as their ``prepare_batch``.
- :func:`accumulation_flags` says when gradient accumulation zeroes the gradients and steps the optimizer;
- :func:`broadcast_modules` and :func:`all_reduce_gradients` replace ``DistributedDataParallel`` in multi-process
  Stage-1 runs (``torch.func.jvp``, which the MeanFlow target needs, cannot differentiate through the wrapper).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from monai.engines.utils import PrepareBatch
from torch import nn

__all__ = [
    "PrepareBatchMixedDomain",
    "PrepareBatchTransform",
    "accumulation_flags",
    "all_reduce_gradients",
    "broadcast_modules",
]


class PrepareBatchTransform(PrepareBatch):
    """Move a batch dictionary to the device, apply a batch transform there and return the entries ``keys``.

    The random augmentation of a ``DataLoader``'s collated batches then runs on the training device, one call per
    batch (e.g. a :class:`~spectraflow_monai.transforms.BatchCompose` of the ``Rand*Batchd`` transforms), while the
    loader keeps only the deterministic work. With ``keys=("image", "label")`` it is a ``prepare_batch`` of MONAI's
    ``SupervisedTrainer`` (Stage-2); with ``keys=("image", "domain")`` after a
    :class:`~spectraflow_monai.transforms.RandMixedDomainBatchd`, of the Stage-1 trainers.

    Args:
        transform: callable taking and returning a batch dictionary of tensors on the device.
        keys: the entries returned, in order (a tuple; one key: that tensor alone). Defaults to ``("image",
            "label")``.

    Raises:
        ValueError: ``transform`` not callable or ``keys`` empty; at call time, a batch that is not a dictionary or
            lacks a returned key after the transform.
    """

    def __init__(self, transform: Any, keys: tuple[str, ...] = ("image", "label")) -> None:
        if not callable(transform):
            raise ValueError(f"transform must be callable, got {type(transform).__name__}.")
        if isinstance(keys, str) or not keys:
            raise ValueError(f"keys must be a non-empty tuple of batch keys, got {keys!r}.")
        self.transform = transform
        self.keys = tuple(keys)

    def __call__(
        self, batchdata: Any, device: str | torch.device | None = None, non_blocking: bool = False, **kwargs: Any
    ) -> Any:
        if not isinstance(batchdata, Mapping):
            raise ValueError(f"{type(self).__name__} needs dictionary batches, got {type(batchdata).__name__}.")
        moved = {}
        for key, value in batchdata.items():
            if isinstance(value, torch.Tensor):
                value = value.as_tensor() if hasattr(value, "as_tensor") else value
                value = value.to(device=device, non_blocking=non_blocking, **kwargs)
            moved[key] = value
        out = self.transform(moved)
        missing = [k for k in self.keys if k not in out]
        if missing:
            raise ValueError(f"the transformed batch lacks {missing} (keys {sorted(map(str, out))}).")
        return out[self.keys[0]] if len(self.keys) == 1 else tuple(out[k] for k in self.keys)


class PrepareBatchMixedDomain(PrepareBatch):
    """Prepare a Stage-1 mini-batch: ``(images, domain)`` on the device (SpectraFlow, Chen et al., Sec. 4.1).

    A mixed-domain Stage-1 mini-batch holds images and 3-channel masks side by side (e.g. from
    :class:`~spectraflow_monai.transforms.RandMixedDomaind`), with a per-sample flag, 0 image / 1 mask, that the
    paper's head never sees (an optional extension passes it to a domain-conditioned head).

    Accepted batches: a dict with ``image_key`` (and optionally ``domain_key``), an image tensor, or a sequence
    ``(image, domain)``. The image must be a ``(B, C, H, W)`` tensor; a ``MetaTensor`` becomes a plain tensor and
    integer images become float. A floating-point domain flag is rounded; the flag is returned as a ``(B,)`` long
    tensor, or None when the batch has none.

    Args:
        image_key: batch key of the input images. Defaults to ``"image"``.
        domain_key: batch key of the 0/1 domain flag; None (or a batch without the key): no flag. Defaults to
            ``"domain"``.

    Raises:
        ValueError: invalid keys; at call time a batch without ``image_key``, an image that is not a
            ``(B, C, H, W)`` tensor, or a domain flag whose length is not the batch size.
    """

    def __init__(self, image_key: str = "image", domain_key: str | None = "domain") -> None:
        if not isinstance(image_key, str) or not image_key:
            raise ValueError(f"image_key must be a non-empty str, got {image_key!r}.")
        if domain_key is not None and not isinstance(domain_key, str):
            raise ValueError(f"domain_key must be a str or None, got {domain_key!r}.")
        self.image_key = image_key
        self.domain_key = domain_key

    def __call__(
        self,
        batchdata: Any,
        device: str | torch.device | None = None,
        non_blocking: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(image, domain)`` of ``batchdata`` on ``device``; ``kwargs`` go to ``Tensor.to`` for the image."""
        if isinstance(batchdata, Mapping):
            if self.image_key not in batchdata:
                raise ValueError(
                    f"the batch has no image_key {self.image_key!r}; its keys are {sorted(map(str, batchdata))}."
                )
            image = batchdata[self.image_key]
            domain = batchdata.get(self.domain_key) if self.domain_key is not None else None
        elif isinstance(batchdata, torch.Tensor):
            image, domain = batchdata, None
        elif isinstance(batchdata, (tuple, list)) and len(batchdata) > 0:
            image, domain = batchdata[0], (batchdata[1] if len(batchdata) > 1 else None)
        else:
            raise ValueError(
                f"unsupported batch type {type(batchdata).__name__}; expected a dict with {self.image_key!r}."
            )
        if not isinstance(image, torch.Tensor):
            raise ValueError(f"the batch image must be a tensor (B, C, H, W), got {type(image).__name__}.")
        if image.ndim != 4:
            raise ValueError(f"the batch image must have shape (B, C, H, W), got {tuple(image.shape)}.")
        if hasattr(image, "as_tensor"):  # MetaTensor -> plain tensor
            image = image.as_tensor()
        image = image.to(device=device, non_blocking=non_blocking, **kwargs)
        if not image.is_floating_point():
            image = image.float()
        if domain is not None:
            if hasattr(domain, "as_tensor"):
                domain = domain.as_tensor()
            domain = torch.as_tensor(domain)
            if domain.is_floating_point():
                domain = domain.round()
            domain = domain.reshape(-1).to(device=device, dtype=torch.long, non_blocking=non_blocking)
            if domain.numel() != image.shape[0]:
                raise ValueError(
                    f"the domain flag {self.domain_key!r} has {domain.numel()} entries for a batch of "
                    f"{image.shape[0]} images."
                )
        return image, domain


def accumulation_flags(iteration: int, accumulation_steps: int, epoch_length: int | None = None) -> tuple[bool, bool]:
    """``(zero the gradients, step the optimizer)`` at a 1-based ``iteration`` of gradient accumulation.

    The gradients are zeroed at the first iteration of every cycle of ``accumulation_steps`` and the optimizer
    steps at the last one, and also at the last iteration of an epoch whose length is not a multiple of it (as in
    MONAI's ``SupervisedTrainer``); cycles restart with every epoch of ``epoch_length`` iterations.

    Args:
        iteration: the engine's 1-based iteration count (``engine.state.iteration``, counted over all epochs).
        accumulation_steps: mini-batches per optimizer step, ``>= 1``.
        epoch_length: iterations per epoch; None: one endless cycle. Defaults to None.
    """
    if accumulation_steps == 1:
        return True, True
    local = iteration - 1 if epoch_length is None else (iteration - 1) % epoch_length
    end_of_epoch = epoch_length is not None and local + 1 == epoch_length
    return local % accumulation_steps == 0, (local + 1) % accumulation_steps == 0 or end_of_epoch


def broadcast_modules(modules: Iterable[nn.Module], src: int = 0) -> None:
    """Copy the parameters and buffers of ``modules`` from process ``src`` to every process (in place).

    Needs an initialised ``torch.distributed`` process group; every process must pass modules of the same
    architecture in the same order.
    """
    with torch.no_grad():
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=src)


def all_reduce_gradients(params: Iterable[nn.Parameter], bucket_bytes: int = 25 * 2**20) -> None:
    """Average the gradients of ``params`` across processes, as ``DistributedDataParallel`` does.

    A parameter without gradient gets a zero gradient first (and a sparse gradient becomes dense), so that all
    processes take part in the same collectives. The gradients are summed with ``all_reduce`` in flat buckets of
    at most ``bucket_bytes`` per (device, dtype) and divided by the world size.

    Args:
        params: the trainable parameters, in the same order on every process.
        bucket_bytes: size limit of one flat bucket in bytes, > 0. Defaults to 25 MiB.

    Raises:
        ValueError: ``bucket_bytes`` is not positive.
    """
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}.")
    params = list(params)
    world_size = dist.get_world_size()
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            p.grad = p.grad.to_dense()
    buckets: dict[tuple, list[list[torch.Tensor]]] = {}
    for p in params:
        grad = p.grad
        groups = buckets.setdefault((grad.device, grad.dtype), [[]])
        current = groups[-1]
        size = sum(g.numel() for g in current) * grad.element_size()
        if current and size + grad.numel() * grad.element_size() > bucket_bytes:
            current = []
            groups.append(current)
        current.append(grad)
    for groups in buckets.values():
        for bucket in groups:
            flat = torch._utils._flatten_dense_tensors(bucket)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world_size)
            for grad, synced in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
                grad.copy_(synced)
