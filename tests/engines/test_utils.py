"""Tests of the Stage-1 engine helpers: the mixed-domain PrepareBatch and the gradient synchronisation."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from monai.data import MetaTensor
from monai.engines.utils import PrepareBatch
from parameterized import parameterized

from spectraflow_monai.engines import DispersiveConfig, MAEPretrainer, MeanFlowPretrainer
from spectraflow_monai.engines.utils import (
    PrepareBatchMixedDomain,
    accumulation_flags,
    all_reduce_gradients,
    broadcast_modules,
)
from spectraflow_monai.networks import DINOv2Encoder, MAEDecoder
from spectraflow_monai.networks.nets.meanflow_head import MeanFlowHead

torch.set_num_threads(1)


class TestPrepareBatchMixedDomain:
    def test_dict_batch(self):
        prepare = PrepareBatchMixedDomain()
        assert isinstance(prepare, PrepareBatch)
        image = MetaTensor(torch.randint(0, 255, (4, 3, 6, 6), dtype=torch.uint8))
        out, domain = prepare({"image": image, "domain": torch.tensor([0.0, 1.0, 0.9, 0.2])}, "cpu")
        assert type(out) is torch.Tensor and out.dtype == torch.float32 and out.shape == (4, 3, 6, 6)
        assert torch.equal(out, image.as_tensor().float())
        assert domain.dtype == torch.long and domain.tolist() == [0, 1, 1, 0]  # rounded flag
        _, domain = prepare({"image": image}, "cpu")  # no flag in the batch
        assert domain is None

    def test_other_layouts_and_keys(self):
        x = torch.randn(2, 3, 4, 4)
        out, domain = PrepareBatchMixedDomain()(x)
        assert out is x and domain is None  # already a float tensor on the device: no copy
        out, domain = PrepareBatchMixedDomain()((x, [[1], [0]]))
        assert domain.tolist() == [1, 0]
        out, domain = PrepareBatchMixedDomain(image_key="img", domain_key=None)({"img": x, "domain": [0, 1]})
        assert out is x and domain is None  # domain_key=None ignores the flag
        out, _ = PrepareBatchMixedDomain()({"image": x}, "cpu", False, dtype=torch.float64)  # Tensor.to kwargs
        assert out.dtype == torch.float64

    @parameterized.expand(
        [
            ({"img": torch.zeros(2, 3, 4, 4)}, "no image_key 'image'"),
            ({"image": torch.zeros(3, 4, 4)}, r"\(B, C, H, W\), got \(3, 4, 4\)"),
            ({"image": [[0.0]]}, "must be a tensor"),
            ({"image": torch.zeros(2, 3, 4, 4), "domain": torch.tensor([0, 1, 1])}, "3 entries for a batch of 2"),
            ("image", "unsupported batch type str"),
        ]
    )
    def test_bad_batches(self, batch, match):
        with pytest.raises(ValueError, match=match):
            PrepareBatchMixedDomain()(batch)

    def test_bad_keys(self):
        with pytest.raises(ValueError, match="image_key"):
            PrepareBatchMixedDomain(image_key="")
        with pytest.raises(ValueError, match="domain_key"):
            PrepareBatchMixedDomain(domain_key=3)


@parameterized.expand(
    [
        # accumulation_steps, epoch_length, [(zero_grad, step) for iterations 1, 2, ...]
        (1, 3, [(True, True)] * 4),
        (2, None, [(True, False), (False, True), (True, False), (False, True)]),
        (2, 3, [(True, False), (False, True), (True, True), (True, False), (False, True), (True, True)]),
        (4, 6, [(True, False), (False, False), (False, False), (False, True), (True, False), (False, True)]),
    ]
)
def test_accumulation_flags(acc, epoch_length, expected):
    assert [accumulation_flags(i, acc, epoch_length) for i in range(1, len(expected) + 1)] == expected


def _meanflow(data, **kwargs):
    torch.manual_seed(0)
    encoder = DINOv2Encoder(img_size=28, model_kwargs={"depth": 2}, trainable_blocks="all")
    head = MeanFlowHead(encoder.embed_dim, hidden_channels=16, num_blocks=1, num_heads=2)
    opt = torch.optim.SGD(encoder.trainable_parameters() + list(head.parameters()), lr=0.1)
    return MeanFlowPretrainer("cpu", 1, data, encoder, head, opt, dispersive=DispersiveConfig(weight=0), **kwargs)


def test_trainers_use_the_prepare_batch():
    trainer = _meanflow([{"image": torch.randn(2, 3, 28, 28)}])
    assert isinstance(trainer.prepare_batch, PrepareBatchMixedDomain)  # MONAI's Workflow.prepare_batch
    assert trainer.prepare_batch.image_key == "image" and trainer.prepare_batch.domain_key == "domain"
    encoder = DINOv2Encoder(img_size=28, model_kwargs={"depth": 2}, trainable_blocks="all")
    decoder = MAEDecoder(encoder.embed_dim, encoder.patch_size, hidden_size=16, num_layers=1, num_heads=2)
    opt = torch.optim.SGD(encoder.trainable_parameters() + list(decoder.parameters()), lr=0.1)
    mae = MAEPretrainer("cpu", 1, [], encoder, decoder, opt, image_key="img", domain_key=None)
    assert isinstance(mae.prepare_batch, PrepareBatchMixedDomain) and mae.prepare_batch.image_key == "img"


def test_custom_prepare_batch_output_is_checked():
    calls = []

    def custom(batch, device, non_blocking, **kwargs):
        calls.append(device)
        return batch["x"].to(torch.int64), batch["d"]  # integer image: made float by the trainer

    trainer = _meanflow([{"x": torch.randint(0, 3, (2, 3, 28, 28)), "d": torch.tensor([0, 1])}], prepare_batch=custom)
    assert trainer.prepare_batch is custom
    trainer.run()
    assert len(calls) == 1 and trainer.state.output["loss"] > 0
    bad = _meanflow([{"x": torch.zeros(2, 3, 28, 28), "d": torch.tensor([0, 1, 1])}], prepare_batch=custom)
    with pytest.raises(ValueError, match="3 entries for a batch of 2"):
        bad.run()
    configured = PrepareBatchMixedDomain(image_key="x", domain_key="d")
    trainer = _meanflow([{"x": torch.randn(2, 3, 28, 28), "d": torch.tensor([0, 1])}], prepare_batch=configured)
    trainer.run()
    assert trainer.prepare_batch is configured and trainer.state.iteration == 1


@pytest.fixture
def process_group(tmp_path):
    """A single-process gloo group (world size 1), destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_gradient_sync_single_process(process_group):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    a(torch.randn(4, 3)).sum().backward()
    grads = a.weight.grad.clone(), a.bias.grad.clone()
    all_reduce_gradients([*a.parameters(), *b.parameters()], bucket_bytes=16)  # tiny buckets: one per tensor
    assert torch.equal(a.weight.grad, grads[0]) and torch.equal(a.bias.grad, grads[1])  # world size 1: unchanged
    assert torch.equal(b.weight.grad, torch.zeros_like(b.weight))  # no gradient -> zeros (same collectives)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    broadcast_modules([a])
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())
    with pytest.raises(ValueError, match="bucket_bytes"):
        all_reduce_gradients(a.parameters(), bucket_bytes=0)


def test_prepare_batch_transform_stage2_and_stage1():
    from monai.data import MetaTensor
    from monai.engines import SupervisedTrainer

    from spectraflow_monai.engines import PrepareBatchTransform
    from spectraflow_monai.transforms import BatchCompose, RandFlipBatchd, RandMixedDomainBatchd

    flip = BatchCompose([RandFlipBatchd(["image", "label"], prob=1.0, spatial_axis=1)])
    image, label = torch.randn(2, 3, 4, 4), (torch.rand(2, 1, 4, 4) > 0.5).float()
    x, y = PrepareBatchTransform(flip)({"image": MetaTensor(image), "label": label, "name": ["a", "b"]}, "cpu")
    assert type(x) is torch.Tensor and torch.equal(x, image.flip(3)) and torch.equal(y, label.flip(3))
    mixed = BatchCompose([RandMixedDomainBatchd(mask_ratio=0.5)]).set_random_state(0)
    x, domain = PrepareBatchTransform(mixed, keys=("image", "domain"))({"image": image, "label": label})
    assert int(domain.sum()) == 1
    net = torch.nn.Conv2d(3, 1, 1)
    trainer = SupervisedTrainer(
        device=torch.device("cpu"), max_epochs=1, train_data_loader=[{"image": image, "label": label}], network=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss_function=torch.nn.BCEWithLogitsLoss(),
        prepare_batch=PrepareBatchTransform(flip),
    )  # fmt: skip
    trainer.run()
    with pytest.raises(ValueError, match="lacks"):
        PrepareBatchTransform(flip, keys=("image", "mask"))({"image": image, "label": label})
    with pytest.raises(ValueError, match="callable"):
        PrepareBatchTransform(3)
