from __future__ import annotations

import io

import pytest
import torch
from ignite.engine import Engine, Events
from monai.transforms import Compose, RandFlipd, RandGaussianNoised

from spectraflow_monai.handlers import (
    NonFiniteLossError,
    RandomStateHandler,
    RecordedCheckpointLoader,
    ResumableEarlyStopHandler,
    SafeCheckpointSaver,
    StopOnNonFiniteLoss,
)
from spectraflow_monai.utils.checkpoint import NonFiniteStateError
from spectraflow_monai.utils.errors import SettingError
from spectraflow_monai.utils.run_record import check_model_digest


def _engine(score: float) -> Engine:
    engine = Engine(lambda e, b: None)
    engine.state.metrics = {"dice": score}
    return engine


def _best_saver(tmp_path, net):
    return SafeCheckpointSaver(str(tmp_path), {"model": net}, save_key_metric=True, key_metric_name="dice",
                               key_metric_filename="model.pt")  # fmt: skip


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_best_model_saver_never_writes_non_finite_weights(tmp_path):
    net = torch.nn.Linear(2, 2)
    saver = _best_saver(tmp_path, net)
    saver.metrics_completed(_engine(0.5))
    before = _load(tmp_path / "model.pt")
    with torch.no_grad():
        net.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteStateError, match="weight"):
        saver.metrics_completed(_engine(0.9))
    after = _load(tmp_path / "model.pt")  # the earlier best model is still there, unchanged
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary file left behind


def test_resumed_best_model_saver_keeps_the_better_model(tmp_path):
    net = torch.nn.Linear(2, 2)
    first = _best_saver(tmp_path, net)
    first.metrics_completed(_engine(0.9))
    state = first.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    best = _load(tmp_path / "model.pt")
    with torch.no_grad():
        net.weight.add_(1.0)
    resumed = _best_saver(tmp_path, net)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    resumed.metrics_completed(_engine(0.5))  # worse: model.pt stays the earlier best
    assert torch.equal(_load(tmp_path / "model.pt")["weight"], best["weight"])
    resumed.metrics_completed(_engine(0.95))  # better: replaced
    assert torch.equal(_load(tmp_path / "model.pt")["weight"], net.weight)


def test_best_model_saver_keeps_the_newest_of_equal_scores(tmp_path):
    # every validation mask empty: the Dice is 0 every epoch; the saved model must be the newest, not epoch 1's
    net = torch.nn.Linear(2, 2)
    saver = _best_saver(tmp_path, net)
    saver.metrics_completed(_engine(0.0))
    with torch.no_grad():
        net.weight.add_(1.0)
    saver.metrics_completed(_engine(0.0))
    assert torch.equal(_load(tmp_path / "model.pt")["weight"], net.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_a_new_best_model_sets_the_exports_of_the_earlier_one_aside(tmp_path):
    """model.pt is written with its record (model.json, holding its digest); before a new model.pt replaces it, the
    exports beside it (model.onnx, an int8 one) are set aside: no stale export stays beside the new model."""
    net = torch.nn.Linear(2, 2)
    saver = SafeCheckpointSaver(str(tmp_path), {"model": net}, save_key_metric=True, key_metric_name="dice",
                                key_metric_filename="model.pt", model_settings={"image_size": 56})  # fmt: skip
    saver.metrics_completed(_engine(0.5))
    check_model_digest(tmp_path / "model.pt")
    (tmp_path / "model.onnx").write_text("export of the first model")
    (tmp_path / "model_int8.onnx").write_text("int8 export of the first model")
    with torch.no_grad():
        net.weight.add_(1.0)
    saver.metrics_completed(_engine(0.9))
    check_model_digest(tmp_path / "model.pt")  # the record is the new model's
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "model.onnx" not in names and "model_int8.onnx" not in names, names
    assert [n.split(".bak-")[0] for n in names if ".bak-" in n] == ["model.onnx", "model_int8.onnx"]


def test_weights_that_do_not_fit_the_network_end_in_one_line(tmp_path):
    torch.save(torch.nn.Linear(2, 3).state_dict(), tmp_path / "model.pt")
    loader = RecordedCheckpointLoader(str(tmp_path / "model.pt"), {"model": torch.nn.Linear(2, 2)})
    with pytest.raises(SettingError) as info:
        loader(Engine(lambda e, b: None))
    message = str(info.value)
    assert "\n" not in message and "size mismatch for weight" in message and str(tmp_path / "model.json") in message
    assert "put the model.json its training wrote beside it, or re-train" in message


def test_final_checkpoint_skipped_when_failing_with_non_finite_weights(tmp_path):
    net = torch.nn.Linear(2, 2)
    saver = SafeCheckpointSaver(str(tmp_path), {"model": net}, save_final=True, final_filename="final.pt")

    def step(engine, batch):
        with torch.no_grad():
            net.weight.fill_(float("inf"))
        raise RuntimeError("boom")

    engine = Engine(step)
    saver.attach(engine)
    with pytest.raises(RuntimeError, match="boom"):
        engine.run([0])
    assert not (tmp_path / "final.pt").exists()


def test_interval_checkpoints_of_the_resumed_run_count_in_n_saved(tmp_path):
    net = torch.nn.Linear(2, 2)
    for epoch in (1, 2):
        torch.save(net.state_dict(), tmp_path / f"checkpoint_epoch={epoch}.pt")
    saver = SafeCheckpointSaver(str(tmp_path), {"model": net, "opt": torch.optim.SGD(net.parameters(), 0.1)},
                                save_interval=1, n_saved=2)  # fmt: skip
    engine = Engine(lambda e, b: None)
    saver.attach(engine)
    engine.state.max_epochs, engine.state.epoch = 4, 2  # resumed after epoch 2
    engine.run([0], max_epochs=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_epoch=3.pt", "checkpoint_epoch=4.pt"]


def _pruning_run(tmp_path, net, prune: bool) -> Engine:
    """An engine with Stage-1's checkpoint saver: every epoch, the newest 2 kept, a final checkpoint."""
    objects = {"model": net, "opt": torch.optim.SGD(net.parameters(), 0.1)}
    saver = SafeCheckpointSaver(str(tmp_path), objects, save_interval=1, n_saved=2, save_final=True,
                                final_filename="checkpoint_final.pt", prune_on_completion=prune)  # fmt: skip
    engine = Engine(lambda e, b: None)
    saver.attach(engine)
    return engine


@pytest.mark.parametrize("prune", [True, False])
def test_completed_run_keeps_only_its_final_checkpoint_when_pruning(tmp_path, prune):
    net = torch.nn.Linear(2, 2)
    engine = _pruning_run(tmp_path, net, prune)
    engine.run([0], max_epochs=3)
    kept = sorted(p.name for p in tmp_path.iterdir())
    epochs = ["checkpoint_epoch=2.pt", "checkpoint_epoch=3.pt"]
    assert kept == (["checkpoint_final.pt"] if prune else [*epochs, "checkpoint_final.pt"])
    torch.testing.assert_close(_load(tmp_path / "checkpoint_final.pt")["model"]["weight"], net.weight)


def test_failed_final_checkpoint_keeps_the_epoch_checkpoints(tmp_path):
    net = torch.nn.Linear(2, 2)
    engine = _pruning_run(tmp_path, net, True)

    @engine.on(Events.EPOCH_COMPLETED(once=2))
    def _break_weights(_):
        with torch.no_grad():
            net.weight[0, 0] = float("nan")

    with pytest.raises(NonFiniteStateError):  # the final checkpoint is refused: the epoch checkpoints stay
        engine.run([0], max_epochs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_epoch=1.pt", "checkpoint_epoch=2.pt"]


def test_early_stop_state_round_trip_before_set_trainer():
    first = ResumableEarlyStopHandler(patience=3, score_function=lambda e: 1.0)
    first.set_trainer(Engine(lambda e, b: None))
    first._handler.counter, first._handler.best_score = 2, 0.7
    state = first.state_dict()
    handler = ResumableEarlyStopHandler(patience=3, score_function=lambda e: 1.0)
    handler.load_state_dict(state)
    handler.set_trainer(Engine(lambda e, b: None))
    assert handler.state_dict() == state and state["counter"] == 2 and state["best_score"] == 0.7


def test_random_state_round_trip_restores_every_generator():
    import random

    import numpy as np

    transforms = Compose([RandFlipd("x", prob=0.5), RandGaussianNoised("x", prob=1.0)])
    transforms.set_random_state(seed=3)
    handler = RandomStateHandler(transforms=[transforms])
    buffer = io.BytesIO()
    torch.save(handler.state_dict(), buffer)

    def draw():
        out = transforms({"x": torch.zeros(1, 4, 4)})["x"]
        return out, torch.rand(3), np.random.rand(3), random.random()

    first = draw()
    buffer.seek(0)
    handler.load_state_dict(torch.load(buffer, weights_only=True))
    second = draw()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert np.array_equal(first[2], second[2]) and first[3] == second[3]


class _DeviceTensor(torch.Tensor):
    """Stands for a tensor that a checkpoint loaded with ``map_location='cuda'`` puts on the GPU: ``numpy()`` refuses
    it, as torch does for a CUDA tensor, until ``cpu()`` copies it to the host."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def test_random_state_loads_from_device_tensors():
    """Resume on a GPU: the bundles' CheckpointLoader maps the checkpoint to the training device."""
    transforms = Compose([RandFlipd("x", prob=0.5)])
    handler = RandomStateHandler(transforms=[transforms])
    state = handler.state_dict()
    on_device = {
        **state,
        "torch": state["torch"].as_subclass(_DeviceTensor),
        "numpy": {**state["numpy"], "keys": state["numpy"]["keys"].as_subclass(_DeviceTensor)},
        "transforms": [{**t, "keys": t["keys"].as_subclass(_DeviceTensor)} for t in state["transforms"]],
    }
    handler.load_state_dict(on_device)
    assert torch.equal(torch.get_rng_state(), state["torch"])


def test_random_state_rejects_another_pipeline():
    state = RandomStateHandler(transforms=[RandFlipd("x", prob=0.5)]).state_dict()
    with pytest.raises(ValueError, match="random transforms"):
        RandomStateHandler().load_state_dict(state)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), torch.tensor(float("nan"))])
def test_non_finite_loss_stops_with_an_error(bad):
    losses = [1.0, bad, 1.0]
    engine = Engine(lambda e, b: {"loss": losses[e.state.iteration - 1]})
    StopOnNonFiniteLoss().attach(engine)
    seen = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.iteration))
    with pytest.raises(NonFiniteLossError, match="epoch 1, iteration 2"):
        engine.run([0, 1, 2])
    assert seen == [1]


def test_finite_losses_run_to_the_end():
    engine = Engine(lambda e, b: [{"loss": torch.tensor(0.5)}])
    StopOnNonFiniteLoss().attach(engine)
    engine.run([0, 1], max_epochs=2)
    assert engine.state.iteration == 4


def test_stop_on_non_finite_loss_rejects_bad_transform():
    with pytest.raises(ValueError, match="output_transform"):
        StopOnNonFiniteLoss(output_transform=3)
