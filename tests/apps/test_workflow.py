"""Tests of spectraflow_monai.apps.workflow: the program steps both bundles call from their configs."""

from __future__ import annotations

import pytest
import torch
from ignite.engine import Engine
from monai.handlers import MeanDice, MeanIoUHandler

from spectraflow_monai.apps.seg2d import label_setup
from spectraflow_monai.apps.workflow import (
    datalist,
    flat_compose,
    prepare_run,
    pretrainer_checkpoint,
    recorded_network,
    segmentation_metrics,
    serving_evaluator,
    start_training,
    total_iterations,
    trainable_parameters,
)
from spectraflow_monai.handlers import HD95, HD95EmptyAsDiagonal
from spectraflow_monai.networks import SpectraFlowNet
from spectraflow_monai.utils import SettingError
from spectraflow_monai.utils.run_record import ModelRecord, write_model_settings


@pytest.mark.parametrize("classes, background", [(None, True), (["background", "polyp", "tool"], False)])
def test_metrics_follow_the_label_setup(classes, background):
    setup = label_setup(classes)
    key = segmentation_metrics("val", label_setup=setup)
    assert list(key) == ["val_mean_dice"] and isinstance(key["val_mean_dice"], MeanDice)
    assert key["val_mean_dice"].metric_fn.include_background is background
    extra = segmentation_metrics("val", "additional", label_setup=setup)
    assert [type(m) for m in extra.values()] == [MeanIoUHandler, HD95, HD95EmptyAsDiagonal]
    names = list(segmentation_metrics("train", "additional", hd95=False))
    assert names == ["train_mean_iou", "train_hd95_empty_as_diagonal"]
    with pytest.raises(ValueError, match="which"):
        segmentation_metrics("val", "other")


@pytest.mark.parametrize("pred_fill, expected", [(0, "nan"), (1, "finite")])
def test_validation_hd95_of_empty_predictions_is_nan_not_zero(pred_fill, expected):
    """Every prediction empty: the validation HD95 is nan (as evaluation reports it), never 0, the best value;
    the diagonal variant charges each missed mask the image diagonal."""
    label = torch.zeros(2, 2, 16, 16)
    label[:, 1, 4:10, 4:10] = 1
    label[:, 0] = 1 - label[:, 1]
    pred = torch.zeros_like(label)
    pred[:, 1, 5:11, 5:11] = pred_fill
    pred[:, 0] = 1 - pred[:, 1]
    engine = Engine(lambda e, batch: batch)
    metrics = segmentation_metrics("val", "additional")
    for name, handler in metrics.items():
        handler.attach(engine, name)
    batch = [{"pred": p, "label": y} for p, y in zip(pred, label)]  # decollated, as MONAI's evaluators output
    engine.run([batch] * 2, max_epochs=1)
    hd95 = engine.state.metrics["val_hd95"]
    assert (hd95 != hd95) if expected == "nan" else (0 < hd95 < 5), hd95
    diagonal = engine.state.metrics["val_hd95_empty_as_diagonal"]
    assert diagonal == pytest.approx(16 * 2**0.5) if expected == "nan" else diagonal == pytest.approx(hd95)


def test_prepare_run_checks_and_creates(tmp_path):
    prepare_run(0, [tmp_path / "a" / "b"], image_size=28)
    assert (tmp_path / "a" / "b").is_dir()
    with pytest.raises(SettingError, match="image_size"):
        prepare_run(0, image_size=30)


def test_trainable_parameters_leave_frozen_ones_out():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    net[0].requires_grad_(False)
    assert trainable_parameters(net) == list(net[1].parameters())


def test_trainable_parameters_of_several_modules():  # Stage-1: the encoder's trainable blocks and the whole head
    encoder, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    encoder.weight.requires_grad_(False)
    assert trainable_parameters([encoder, head]) == [encoder.bias, *head.parameters()]


class _Source:
    def datalist(self, split, *args, **kwargs):
        return [{"split": split, "args": args, **kwargs}]


def test_datalist_asks_the_source_for_one_split():
    assert datalist(_Source(), "val", [1, 2], slices=False) == [{"split": "val", "args": ([1, 2],), "slices": False}]


@pytest.mark.parametrize("epochs, batches, expected", [(3, 4, 12), (1, 0, 1), (0, 5, 1)])
def test_total_iterations(epochs, batches, expected):
    assert total_iterations(epochs, range(batches)) == expected


def test_pretrainer_checkpoint_adds_the_random_state():
    class Trainer:
        def checkpoint_dict(self, lr_scheduler):
            return {"encoder": 1, "lr_scheduler": lr_scheduler}

    assert pretrainer_checkpoint(Trainer(), "lr", "rng") == {"encoder": 1, "lr_scheduler": "lr", "random_state": "rng"}


def test_recorded_network_follows_the_record(tmp_path):
    model = tmp_path / "model.pt"
    model.write_bytes(b"")
    settings = {"image_size": 28, "encoder_name": "vit_small_patch14_dinov2", "encoder_kwargs": {"depth": 2},
                "fusion": "concat", "refine": "standard", "label_classes": None}  # fmt: skip
    write_model_settings(model, settings)
    net = recorded_network(ModelRecord(model), out_channels=2)
    assert isinstance(net, SpectraFlowNet) and net(torch.zeros(1, 3, 28, 28)).shape == (1, 2, 28, 28)
    assert net.decoder.fusion == "concat" and len(net.encoder.vit.blocks) == 2
    with pytest.raises(SettingError, match="fusion: 'concat' in the record, 'daf' given"):
        ModelRecord(model, given={"fusion": "daf", "refine": None})  # None: not given


TINY_NETWORKS = {  # a small model of every registered architecture, at a size its rule takes
    "spectraflow": {"image_size": 28, "encoder_kwargs": {"depth": 2}},
    "unet": {"image_size": 32, "network_kwargs": {"channels": [4, 8, 16], "strides": [2, 2]}},
    "unetpp": {"image_size": 32, "network_kwargs": {"features": [4, 4, 8, 8, 8, 4]}},
}


def test_every_registered_architecture_has_a_tiny_network_here():
    from spectraflow_monai.utils.architectures import ARCHITECTURES

    assert set(TINY_NETWORKS) == set(ARCHITECTURES)


@pytest.mark.parametrize("name", sorted(TINY_NETWORKS))
def test_recorded_network_builds_the_registered_class(name):
    from spectraflow_monai.apps.workflow import network_class
    from spectraflow_monai.utils.settings import ModelSettings

    settings = ModelSettings(architecture=name, out_channels=2, **TINY_NETWORKS[name])
    # Stage-2's trainable_blocks: SpectraFlow's encoder blocks; a network without an encoder trains all of it
    net = recorded_network(settings, trainable_blocks=1)
    assert type(net) is network_class(settings.architecture_entry)
    size = settings.image_size
    assert net.eval()(torch.zeros(1, 3, size, size)).shape == (1, 2, size, size)


def test_recorded_network_builds_a_new_entry_and_names_kwargs_its_class_refuses(monkeypatch):
    from monai.networks.nets import BasicUNet

    from spectraflow_monai.utils.architectures import ARCHITECTURES, Architecture, pooling_multiple
    from spectraflow_monai.utils.settings import ModelSettings

    entry = Architecture(name="basicunet", network_class="monai.networks.nets.BasicUNet", description="BasicUNet",
                         fixed_arguments={"spatial_dims": 2}, size_multiple=pooling_multiple(4))  # fmt: skip
    monkeypatch.setitem(ARCHITECTURES, "basicunet", entry)
    settings = ModelSettings(architecture="basicunet", network_kwargs={"features": [4, 4, 8, 8, 16, 4]}, image_size=32)
    assert isinstance(recorded_network(settings), BasicUNet)
    with pytest.raises(SettingError) as exc:
        recorded_network(settings.replace(network_kwargs={"features": [4, 4, 8, 8, 16, 4], "widths": 3}))
    line = str(exc.value)
    assert "\n" not in line and "do not fit monai.networks.nets.BasicUNet (architecture 'basicunet')" in line
    assert "'widths'" in line


class _Engine:
    def __init__(self):
        self.calls = []

    def run(self):
        self.calls.append("run")


class _Saver:
    def attach(self, engine):
        engine.calls.append("saver")


def test_start_training_resumes_only_from_a_given_checkpoint(tmp_path):
    engine, early = _Engine(), type("Early", (), {"set_trainer": lambda self, t: setattr(self, "trainer", t)})()
    start_training(engine, _Saver(), early_stop=early)  # a new run: nothing loaded
    assert engine.calls == ["saver", "run"] and early.trainer is engine
    with pytest.raises(ValueError, match="without the checkpoint objects"):
        start_training(_Engine(), _Saver(), resume_path=str(tmp_path / "c.pt"))


def test_start_training_loads_the_checkpoint_at_start(tmp_path):
    from ignite.engine import Engine

    net = torch.nn.Linear(2, 2)
    saved = {k: torch.full_like(v, 3.0) for k, v in net.state_dict().items()}
    torch.save({"model": saved}, tmp_path / "c.pt")
    trainer = Engine(lambda engine, batch: None)
    trainer.run = lambda: Engine.run(trainer, [0], max_epochs=1)  # start_training calls run() without data

    class Saver:
        def attach(self, engine):
            pass

    start_training(trainer, Saver(), checkpoint={"model": net}, resume_path=str(tmp_path / "c.pt"), map_location="cpu")
    assert all(torch.equal(v, torch.full_like(v, 3.0)) for v in net.state_dict().values())


def test_flat_compose_keeps_the_order_of_lists_and_composes():
    from monai.transforms import Compose, Identityd, RandFlipd

    a, b, c, d = Identityd("x"), RandFlipd("x", prob=0.5), Identityd("y"), Identityd("z")
    flat = flat_compose([[a], Compose([b, Compose([c])]), d, []])
    assert flat.transforms == (a, b, c, d)


@pytest.mark.parametrize("setting, device", [("fp32", "cpu"), ("bf16", "cpu")])
def test_serving_evaluator_runs_under_the_resolved_precision(setting, device):
    from monai.engines import SupervisedEvaluator

    from spectraflow_monai.utils import resolve_precision

    precision = resolve_precision(setting, device)
    net = torch.nn.Conv2d(1, 1, 1)
    loader = [{"image": torch.ones(1, 1, 4, 4), "label": torch.zeros(1, 1, 4, 4)}]
    evaluator = serving_evaluator(precision, device=torch.device(device), val_data_loader=loader, network=net)
    assert isinstance(evaluator, SupervisedEvaluator)
    # MONAI's amp only for float16 on CUDA (its scaler); the dtype is the precision's either way
    assert evaluator.amp is precision.use_grad_scaler is False
    assert evaluator.amp_kwargs == precision.amp_kwargs
    evaluator.run()
    assert evaluator.state.output[0]["pred"].shape == (1, 4, 4)
