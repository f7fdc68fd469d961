"""The deterministic part of the data path computed once and kept as stacked tensors, in device memory if it fits.

MONAI's fast training guide (``acceleration/fast_model_training_guide.md`` in MONAI's tutorials): cache the
deterministic transforms, move the cache to the GPU, run the random transforms there and drop the worker processes.
:class:`DeviceCache` runs the deterministic transforms once (through ``monai.data.CacheDataset``), stacks every key
into one (N, ...) tensor and places it on ``cache_device``; :class:`DeviceCacheLoader` yields shuffled mini-batches
from it by index (no worker processes, no collation, no host-device copy when the cache is on the training device),
optionally through a batch transform (:mod:`spectraflow_monai.transforms.batched`). It can be passed to MONAI's
``SupervisedTrainer`` (and the Stage-1 trainers) as ``train_data_loader``: its batches are dictionaries of tensors
(``{"image": (B, C, H, W), "label": (B, 1, H, W)}``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import torch
from monai.data import CacheDataset
from monai.utils import ensure_tuple

from spectraflow_monai.utils.settings import CACHE_DEVICES  # the values of the ``cache_device`` setting

__all__ = ["CACHE_DEVICES", "DeviceCache", "DeviceCacheLoader", "resolve_cache_device", "single_thread_worker_init"]

logger = logging.getLogger(__name__)


def resolve_cache_device(
    cache_device: str, nbytes: int, memory_fraction: float = 0.5, device: str | torch.device | None = None
) -> torch.device:
    """The device a cache of ``nbytes`` bytes lives on.

    Args:
        cache_device: ``"cpu"``; ``"cuda"`` (``device`` or the current CUDA device; an error without CUDA);
            ``"auto"``: the CUDA device when CUDA is available and ``nbytes`` is at most ``memory_fraction`` of its
            free memory, the CPU otherwise (the choice and the sizes are logged).
        nbytes: the size of the cache in bytes.
        memory_fraction: the share of the free device memory the cache may take with ``"auto"``, in (0, 1].
        device: the CUDA device (e.g. ``"cuda:1"``, the trainer's device). Defaults to the current one.

    Raises:
        ValueError: an unknown ``cache_device``, ``memory_fraction`` outside (0, 1], ``"cuda"`` without CUDA.
    """
    if cache_device not in CACHE_DEVICES:
        raise ValueError(f"cache_device must be one of {list(CACHE_DEVICES)}, got {cache_device!r}.")
    if isinstance(memory_fraction, bool) or not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}.")
    if cache_device == "cpu":
        return torch.device("cpu")
    target = torch.device(device) if device is not None else torch.device("cuda")
    if target.type != "cuda":
        if cache_device == "cuda":
            raise ValueError(f"cache_device='cuda' needs a CUDA device, got device={device!r}.")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if cache_device == "cuda":
            raise ValueError("cache_device='cuda' but CUDA is not available; use 'auto' or 'cpu'.")
        return torch.device("cpu")
    if target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    if cache_device == "cuda":
        return target
    free, _ = torch.cuda.mem_get_info(target)
    fits = nbytes <= memory_fraction * free
    logger.info(
        "data cache of %.1f MiB on %s (free device memory %.1f MiB, memory_fraction %.2f)",
        nbytes / 2**20, target if fits else "cpu", free / 2**20, memory_fraction,
    )  # fmt: skip
    return target if fits else torch.device("cpu")


def single_thread_worker_init(worker_id: int) -> None:
    """``worker_init_fn`` for ``DataLoader`` worker processes: MONAI's (seeds the worker's random transforms), then one
    torch intra-op thread per worker.

    Each worker process otherwise starts as many intra-op threads as the machine has cores: 14 workers on a 16-core
    machine then run about 200 threads that contend for 16 cores (and with the trainer process). Pass it as the
    loader's ``worker_init_fn`` (``monai.data.DataLoader`` uses MONAI's own by default).
    """
    from monai.data.utils import worker_init_fn

    worker_init_fn(worker_id)
    torch.set_num_threads(1)


def _plain(value: Any) -> torch.Tensor:
    """A cached item's value as a plain tensor (MetaTensor metadata dropped)."""
    value = value.as_tensor() if hasattr(value, "as_tensor") else value
    return torch.as_tensor(value)


class DeviceCache:
    """The deterministic samples of a dataset, stacked per key into (N, ...) tensors on one device.

    Args:
        data: the datalist (a sequence of dictionaries, as for ``monai.data.CacheDataset``), or a dataset (a
            sequence of already transformed sample dictionaries, e.g. a ``CacheDataset``).
        transform: the deterministic transforms (loading, resizing, ...; no random transform: they run on batches,
            every epoch). Ignored when ``data`` is a dataset. Defaults to None.
        keys: the keys stacked (every sample must hold them, with one shape per key). Defaults to
            ``("image", "label")``.
        cache_device: ``"auto"``, ``"cpu"`` or ``"cuda"`` (:func:`resolve_cache_device`). Defaults to ``"auto"``.
        memory_fraction: with ``"auto"``, the share of free device memory the cache may take. Defaults to 0.5.
        device: the training device (the CUDA device the cache goes to). Defaults to None (the current one).
        dtypes: optional ``{key: dtype}`` the stacked tensors are cast to (e.g. ``{"label": torch.uint8}`` to save
            memory). Defaults to None.
        num_workers: threads of ``CacheDataset`` while building. Defaults to 0.
        progress: show ``CacheDataset``'s progress bar. Defaults to False.

    Raises:
        ValueError: an empty dataset, bad ``keys``, a sample that is not a dictionary or lacks a key, samples of
            differing shapes, and the :func:`resolve_cache_device` errors.
    """

    def __init__(
        self,
        data: Sequence[Any],
        transform: Callable | None = None,
        keys: Sequence[Hashable] = ("image", "label"),
        cache_device: str = "auto",
        memory_fraction: float = 0.5,
        device: str | torch.device | None = None,
        dtypes: Mapping[Hashable, torch.dtype] | None = None,
        num_workers: int = 0,
        progress: bool = False,
    ) -> None:
        self.keys = ensure_tuple(keys)
        if not self.keys:
            raise ValueError(f"keys must name at least one key, got {keys!r}.")
        if cache_device not in CACHE_DEVICES:
            raise ValueError(f"cache_device must be one of {list(CACHE_DEVICES)}, got {cache_device!r}.")
        if len(data) == 0:
            raise ValueError("the dataset to cache is empty.")
        dataset = CacheDataset(data, transform, num_workers=num_workers, progress=progress) if transform else data
        columns: dict[Hashable, list[torch.Tensor]] = {k: [] for k in self.keys}
        for i in range(len(dataset)):
            sample = dataset[i]
            if not isinstance(sample, Mapping):
                raise ValueError(f"sample {i} is a {type(sample).__name__}, not a dictionary of {list(self.keys)}.")
            for key in self.keys:
                if key not in sample:
                    raise ValueError(f"sample {i} has no key {key!r} (keys {list(sample)}).")
                columns[key].append(_plain(sample[key]))
        stacked = {}
        for key, values in columns.items():
            shapes = {tuple(v.shape) for v in values}
            if len(shapes) != 1:
                raise ValueError(f"the samples' {key!r} differ in shape ({sorted(shapes)[:4]}); resize them first.")
            tensor = torch.stack(values)
            if dtypes and key in dtypes:
                tensor = tensor.to(dtypes[key])
            stacked[key] = tensor
        self.nbytes = sum(t.numel() * t.element_size() for t in stacked.values())
        self.device = resolve_cache_device(cache_device, self.nbytes, memory_fraction, device)
        self.data = {k: v.to(self.device) for k, v in stacked.items()}

    def __len__(self) -> int:
        return int(next(iter(self.data.values())).shape[0])

    def batch(self, index: torch.Tensor) -> dict[Hashable, torch.Tensor]:
        """The samples at ``index`` (a 1-D int64 tensor on the cache's device) as a batch dictionary."""
        return {k: v.index_select(0, index) for k, v in self.data.items()}


class DeviceCacheLoader:
    """Mini-batches of a :class:`DeviceCache`, shuffled every epoch, without worker processes.

    Each ``iter()`` is one epoch: a permutation of the samples drawn from ``torch.Generator`` seeded with ``seed +
    epoch`` (so a resumed run, calling :meth:`set_epoch` or restoring :meth:`state_dict`, sees the same order), split
    into batches of ``batch_size`` (the last, short one dropped with ``drop_last``); distributed, every process takes
    its share of the permutation (padded to equal lengths by repeating its start, as ``DistributedSampler`` does).
    Every batch is gathered by ``index_select`` on the cache's device, moved to ``device`` if that differs and passed
    through ``transform`` (a batch transform such as
    :class:`~spectraflow_monai.transforms.batched.BatchCompose`).

    Args:
        cache: the :class:`DeviceCache`.
        batch_size: samples per batch, >= 1.
        shuffle: a new order every epoch (else the cache's order). Defaults to True.
        drop_last: drop the last, short batch (static shapes for compiled steps). Defaults to True.
        transform: callable applied to every batch dictionary. Defaults to None.
        device: the device batches are delivered on. Defaults to None (the cache's device).
        seed: seed of the order. Defaults to 0.
        num_replicas: processes of a distributed run; None: the world size when ``torch.distributed`` is
            initialised, else 1.
        rank: this process's rank; None: from ``torch.distributed`` when initialised, else 0.

    Raises:
        ValueError: ``batch_size`` < 1, a ``rank`` outside ``[0, num_replicas)``, or a share of the data smaller than
            one batch with ``drop_last``.
    """

    def __init__(
        self,
        cache: DeviceCache,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = True,
        transform: Callable[[dict], dict] | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.num_replicas = num_replicas if num_replicas is not None else (
            torch.distributed.get_world_size() if distributed else 1
        )
        self.rank = rank if rank is not None else (torch.distributed.get_rank() if distributed else 0)
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, {self.num_replicas}), got {self.rank!r}.")
        self.cache = cache
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.transform = transform
        self.device = torch.device(device) if device is not None else cache.device
        self.seed = int(seed)
        self.epoch = 0
        self._epoch_set = False
        self._started = False
        self.per_replica = math.ceil(len(cache) / self.num_replicas)
        if self.drop_last and self.per_replica < batch_size:
            raise ValueError(
                f"batch_size {batch_size} is larger than this process's {self.per_replica} of {len(cache)} samples "
                "and drop_last is set: the epoch would be empty."
            )

    def __len__(self) -> int:
        full, rest = divmod(self.per_replica, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (0-based) at the next ``iter()``, as ``DistributedSampler.set_epoch``."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def attach(self, engine: Any) -> None:
        """Call :meth:`set_epoch` with the 0-based epoch at every ``EPOCH_STARTED`` of an ignite ``engine`` (a
        resumed run then continues with the order of its epoch)."""
        from ignite.engine import Events

        engine.add_event_handler(Events.EPOCH_STARTED, lambda e: self.set_epoch(e.state.epoch - 1))

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the seed and the transform's random state (when it has one)."""
        state: dict[str, Any] = {"epoch": self.epoch, "seed": self.seed}
        if hasattr(self.transform, "state_dict"):
            state["transform"] = self.transform.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seed = int(state["seed"])
        self.set_epoch(int(state["epoch"]))
        if "transform" in state and hasattr(self.transform, "load_state_dict"):
            self.transform.load_state_dict(state["transform"])

    def _order(self) -> torch.Tensor:
        n = len(self.cache)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(n)
        total = self.per_replica * self.num_replicas
        if total > n:  # pad so that every process gets the same number of samples
            order = torch.cat([order, order[: total - n]])
        return order[self.rank : total : self.num_replicas]

    def __iter__(self) -> Iterator[dict[Hashable, torch.Tensor]]:
        if not self._epoch_set and self._started:
            self.epoch += 1
        self._started, self._epoch_set = True, False
        order = self._order().to(self.cache.device)  # one small copy per epoch
        for i in range(len(self)):
            batch = self.cache.batch(order[i * self.batch_size : (i + 1) * self.batch_size])
            if self.device.type != self.cache.device.type:
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            yield self.transform(batch) if self.transform is not None else batch
