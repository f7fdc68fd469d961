"""Multi-process training of the bundles (``configs/multi_gpu_train.yaml``): one place for the process group, the
device of each process and the DistributedDataParallel wrapping, so that single- and multi-process runs share the
same ``run`` lists and programs (the multi-GPU config only replaces ``process_group``, ``device``, ``network``,
``progress_bar`` and the samplers, and adds a ``finalize`` list)."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = [
    "destroy_process_group", "is_main_process", "local_device", "process_rank", "setup_process_group", "wrap_ddp",
]

logger = logging.getLogger(__name__)


def process_rank() -> int:
    """This process's rank in the torchrun process group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def local_device() -> torch.device:
    """``cuda:<LOCAL_RANK>`` when CUDA is available (``LOCAL_RANK`` set by ``torchrun``, 0 otherwise), else CPU."""
    if torch.cuda.is_available():
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    return torch.device("cpu")


def setup_process_group(device: torch.device | str | None = None) -> int:
    """Join the process group of a ``torchrun`` launch (NCCL on CUDA, gloo on CPU) once, select this process's
    GPU, and return the rank. ``configs/multi_gpu_train.yaml`` makes it the ``process_group`` step of every stage's
    ``run`` list (``null`` in ``configs/train.yaml``), before the error log and the stage's work."""
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available() and device is not None:
        torch.cuda.set_device(torch.device(device))
    rank = dist.get_rank()
    logger.info(f"process group: rank {rank} of {dist.get_world_size()} ({dist.get_backend()})")
    return rank


def is_main_process() -> bool:
    """True on rank 0 of a process group, and in a single-process run."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def wrap_ddp(network: nn.Module, device: torch.device | str) -> nn.Module:
    """``network`` on ``device``, wrapped in DistributedDataParallel (with ``device_ids`` on CUDA)."""
    device = torch.device(device)
    module = network.to(device)
    return nn.parallel.DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None)


def destroy_process_group() -> None:
    """Leave the process group (the multi-GPU config's ``finalize``)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
