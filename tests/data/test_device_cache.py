"""Tests for spectraflow_monai.data.device_cache: the stacked cache and its loader, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.engines import SupervisedTrainer
from monai.transforms import Compose, EnsureChannelFirstd, Lambdad

from spectraflow_monai.data import DeviceCache, DeviceCacheLoader, resolve_cache_device
from spectraflow_monai.transforms import BatchCompose, RandFlipBatchd


def _datalist(n=10, size=8):
    rng = np.random.default_rng(0)
    return [
        {"image": rng.random((size, size, 3)).astype(np.float32) + i, "label": (rng.random((size, size)) > 0.5) * 1.0}
        for i in range(n)
    ]


def _transform():
    return Compose(
        [
            Lambdad("image", lambda x: np.moveaxis(x, -1, 0)),
            EnsureChannelFirstd("label", channel_dim="no_channel"),
        ]
    )


def _cache(n=10, **kwargs):
    kwargs.setdefault("cache_device", "cpu")
    return DeviceCache(_datalist(n), _transform(), **kwargs)


def test_cache_stacks_on_device():
    cache = _cache(dtypes={"label": torch.uint8})
    assert len(cache) == 10 and cache.device == torch.device("cpu")
    assert cache.data["image"].shape == (10, 3, 8, 8) and cache.data["label"].shape == (10, 1, 8, 8)
    assert cache.data["label"].dtype == torch.uint8 and type(cache.data["image"]) is torch.Tensor
    assert cache.nbytes == 10 * 3 * 64 * 4 + 10 * 64
    # the sample's first value tells its index (i + [0, 1))
    assert torch.equal(cache.data["image"][:, 0, 0, 0].floor(), torch.arange(10.0))


@pytest.mark.parametrize("batch_size, drop_last, expected", [(3, True, 3), (3, False, 4), (5, True, 2), (10, True, 1)])
def test_loader_len_and_epochs(batch_size, drop_last, expected):
    loader = DeviceCacheLoader(_cache(), batch_size, drop_last=drop_last, seed=1)
    batches = list(loader)
    assert len(batches) == len(loader) == expected
    assert all(b["image"].shape[0] == batch_size for b in (batches if drop_last else batches[:-1]))
    seen = torch.cat([b["image"][:, 0, 0, 0].floor() for b in batches]).long()
    assert len(set(seen.tolist())) == len(seen)  # no sample twice in an epoch
    again = torch.cat([b["image"][:, 0, 0, 0].floor() for b in loader]).long()
    assert not torch.equal(seen, again) or batch_size == 10  # a new order every epoch


def test_loader_order_is_reproducible_and_resumable():
    a, b = DeviceCacheLoader(_cache(), 2, seed=3), DeviceCacheLoader(_cache(), 2, seed=3)
    first = [x["image"] for x in a]
    assert all(torch.equal(x, y["image"]) for x, y in zip(first, b))
    second = [x["image"] for x in a]
    c = DeviceCacheLoader(_cache(), 2, seed=3)
    c.set_epoch(1)
    assert all(torch.equal(x, y["image"]) for x, y in zip(second, c))
    d = DeviceCacheLoader(_cache(), 2, seed=0)
    d.load_state_dict(a.state_dict())
    assert d.seed == 3 and d.epoch == a.epoch


def test_loader_distributed_shares():
    cache = _cache(n=10)
    shares = []
    for rank in range(3):
        loader = DeviceCacheLoader(cache, 2, shuffle=False, drop_last=False, num_replicas=3, rank=rank)
        shares.append(torch.cat([b["image"][:, 0, 0, 0].floor() for b in loader]).long().tolist())
    assert [len(s) for s in shares] == [4, 4, 4]
    assert set(sum(shares, [])) == set(range(10))


def test_loader_transform_and_state():
    transform = BatchCompose([RandFlipBatchd(["image", "label"], prob=1.0, spatial_axis=1)]).set_random_state(0)
    loader = DeviceCacheLoader(_cache(), 4, shuffle=False, transform=transform)
    batch = next(iter(loader))
    assert torch.equal(batch["image"], _cache().data["image"][:4].flip(3))
    assert "transform" in loader.state_dict()


def test_supervised_trainer_runs_from_the_loader():
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 1, 3, padding=1)
    loader = DeviceCacheLoader(_cache(), 4, seed=0)
    trainer = SupervisedTrainer(
        device=torch.device("cpu"),
        max_epochs=2,
        train_data_loader=loader,
        network=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.01),
        loss_function=torch.nn.BCEWithLogitsLoss(),
    )
    loader.attach(trainer)
    trainer.run()
    assert trainer.state.iteration == 2 * len(loader) and loader.epoch == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"cache_device": "gpu"}, {"keys": ()}, {"keys": ("image", "missing")}],
)
def test_cache_ill_arguments(kwargs):
    with pytest.raises(ValueError):
        _cache(**kwargs)


def test_loader_and_device_ill_arguments():
    cache = _cache(n=4)
    for kwargs in ({"batch_size": 0}, {"batch_size": 5}, {"batch_size": 2, "num_replicas": 2, "rank": 2}):
        with pytest.raises(ValueError):
            DeviceCacheLoader(cache, **kwargs)
    with pytest.raises(ValueError, match="memory_fraction"):
        resolve_cache_device("auto", 10, memory_fraction=0.0)
    assert resolve_cache_device("auto", 10, device="cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_cache_device("auto", 10) == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA"):
            resolve_cache_device("cuda", 10)
    with pytest.raises(ValueError, match="empty"):
        DeviceCache([], cache_device="cpu")
    with pytest.raises(ValueError, match="shape"):
        DeviceCache([{"image": torch.zeros(1, 2, 2), "label": torch.zeros(1, 2, 2)},
                     {"image": torch.zeros(1, 3, 3), "label": torch.zeros(1, 3, 3)}], cache_device="cpu")


def test_stage1_trainer_runs_from_the_device_path():
    """Stage-1 wiring: cache -> loader -> batched augmentation + normalisation + mixed-domain rendering -> trainer."""
    from spectraflow_monai.engines import MeanFlowPretrainer
    from spectraflow_monai.networks.encoders.dinov2 import DINOv2Encoder
    from spectraflow_monai.networks.nets.meanflow_head import MeanFlowHead
    from spectraflow_monai.transforms import NormalizeIntensityBatchd, RandMixedDomainBatchd

    data = [{"image": np.random.default_rng(i).random((28, 28, 3)).astype(np.float32),
             "label": (np.random.default_rng(i).random((28, 28)) > 0.5) * 1.0} for i in range(8)]  # fmt: skip
    cache = DeviceCache(data, _transform(), cache_device="cpu")
    transform = BatchCompose(
        [
            RandFlipBatchd(["image", "label"], prob=0.5, spatial_axis=1),
            NormalizeIntensityBatchd("image", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            RandMixedDomainBatchd(mask_ratio=0.5),
        ]
    ).set_random_state(0)
    loader = DeviceCacheLoader(cache, 4, transform=transform)
    batch = next(iter(loader))
    assert set(batch) == {"image", "domain"} and int(batch["domain"].sum()) == 2
    torch.manual_seed(0)
    encoder = DINOv2Encoder("vit_small_patch14_dinov2", img_size=28, trainable_blocks="all", model_kwargs={"depth": 2})
    head = MeanFlowHead(encoder.embed_dim, hidden_channels=16, num_blocks=1, num_heads=2)
    opt = torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=1e-4)
    trainer = MeanFlowPretrainer("cpu", 1, loader, encoder, head, opt, output_on_device=True)
    trainer.run()
    assert trainer.state.iteration == 2 and torch.isfinite(trainer.state.output["loss"])


def test_single_thread_worker_init():
    from monai.data import DataLoader, Dataset

    from spectraflow_monai.data import single_thread_worker_init

    class Threads(Dataset):
        def __getitem__(self, i):
            return torch.tensor(torch.get_num_threads())

    loader = DataLoader(Threads(list(range(2))), batch_size=1, num_workers=1, worker_init_fn=single_thread_worker_init)
    assert [int(b) for b in loader] == [1, 1]
