"""No host synchronisation per iteration: a structural test (CUDA's sync debug mode needs a GPU).

Every Python-level read-back of a tensor (``item``, ``tolist``, ``float`` / ``int`` / ``bool`` of a tensor, ``cpu``,
``numpy``) made while an iteration runs (from ``ITERATION_STARTED`` to the last ``ITERATION_COMPLETED`` handler) is
counted; on a GPU each of them would wait for the device. The Stage-1 trainer with ``output_on_device=True`` and the
handlers of the training programs must make none between their read-back intervals. Read-backs of tensors that live
on the host by design are not counted: the optimizers' step counters in ``torch.optim`` (on the host unless
``capturable`` / ``fused``) and MONAI's ``torch.arange(...).tolist()`` of the reduced axes in its Dice loss.
"""

from __future__ import annotations

import linecache
import sys

import pytest
import torch
from ignite.engine import Events
from monai.engines.utils import IterationEvents

from spectraflow_monai.engines import DispersiveConfig, MeanFlowPretrainer
from spectraflow_monai.handlers import EpochSummaryHandler, LossTermsHandler, StopOnNonFiniteLoss
from spectraflow_monai.handlers.nonfinite import NonFiniteLossError
from spectraflow_monai.losses import DiceBCEBoundaryLoss
from spectraflow_monai.networks.encoders.dinov2 import DINOv2Encoder
from spectraflow_monai.networks.nets.meanflow_head import MeanFlowHead

READ_BACKS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


def _host_side(frame) -> bool:
    """Whether a read-back at ``frame`` is of a tensor that lives on the host by design (see the module)."""
    path = frame.f_code.co_filename.replace("\\", "/")
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return "/torch/optim/" in path or ("/monai/losses/" in path and "torch.arange(" in line)


class _SyncCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active = False
        self.calls: list[str] = []
        for name in READ_BACKS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, original))

    def _wrap(self, name, original):
        def counted(tensor, *args, **kwargs):
            if self.active and not _host_side(sys._getframe(1)):
                self.calls.append(name)
            return original(tensor, *args, **kwargs)

        return counted

    def attach(self, engine) -> list[tuple[int, int]]:
        per_iteration: list[tuple[int, int]] = []

        def start(e):
            self.calls.clear()
            self.active = True

        def stop(e):
            self.active = False
            per_iteration.append((e.state.iteration, len(self.calls)))

        engine.add_event_handler(Events.ITERATION_STARTED, start)
        engine.add_event_handler(Events.STARTED, lambda e: e.add_event_handler(Events.ITERATION_COMPLETED, stop))
        return per_iteration


def _stage1_trainer(output_on_device: bool):
    torch.manual_seed(0)
    encoder = DINOv2Encoder("vit_small_patch14_dinov2", img_size=28, trainable_blocks="all", model_kwargs={"depth": 2})
    head = MeanFlowHead(encoder.embed_dim, hidden_channels=16, num_blocks=1, num_heads=2)
    opt = torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=1e-4)
    data = [{"image": torch.randn(4, 3, 28, 28)} for _ in range(4)]
    return MeanFlowPretrainer("cpu", 1, data, encoder, head, opt, output_on_device=output_on_device)


def test_stage1_iterations_do_not_read_back(monkeypatch):
    trainer = _stage1_trainer(output_on_device=True)
    StopOnNonFiniteLoss(every=4).attach(trainer)
    summary = EpochSummaryHandler(title="Stage-1", quiet_engines=False)
    summary.attach(trainer)
    counter = _SyncCounter(monkeypatch)
    per_iteration = counter.attach(trainer)
    trainer.run()
    assert [n for i, n in per_iteration if i % 4] == [0, 0, 0], per_iteration
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in trainer.state.output.values())
    assert "loss" in summary.last_line


def test_mae_iterations_do_not_read_back(monkeypatch):
    from spectraflow_monai.engines import MAEPretrainer
    from spectraflow_monai.networks.nets.mae_decoder import MAEDecoder

    torch.manual_seed(0)
    encoder = DINOv2Encoder("vit_small_patch14_dinov2", img_size=28, trainable_blocks="all", model_kwargs={"depth": 2})
    decoder = MAEDecoder(encoder.embed_dim, encoder.patch_size, hidden_size=16, num_layers=1, num_heads=2)
    opt = torch.optim.AdamW(encoder.trainable_parameters() + list(decoder.parameters()), lr=1e-4)
    data = [{"image": torch.randn(4, 3, 28, 28)} for _ in range(4)]
    trainer = MAEPretrainer(
        "cpu", 1, data, encoder, decoder, opt, dispersive=DispersiveConfig(weight=0.4), output_on_device=True
    )
    StopOnNonFiniteLoss(every=4).attach(trainer)
    EpochSummaryHandler(title="Stage-1", quiet_engines=False).attach(trainer)
    per_iteration = _SyncCounter(monkeypatch).attach(trainer)
    trainer.run()
    assert [n for i, n in per_iteration if i % 4] == [0, 0, 0], per_iteration


def test_stage1_default_output_stays_floats():
    trainer = _stage1_trainer(output_on_device=False)
    trainer.run()
    assert all(isinstance(v, float) for v in trainer.state.output.values())


def test_stage2_loss_and_handlers_do_not_read_back(monkeypatch):
    """MONAI's SupervisedTrainer with the Stage-2 loss (torch distance maps) and the logging handlers."""
    from monai.engines import SupervisedTrainer

    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 1, 3, padding=1)
    loss = DiceBCEBoundaryLoss(beta=0.01, distance_backend="torch")
    data = [{"image": torch.randn(2, 3, 16, 16), "label": (torch.rand(2, 1, 16, 16) > 0.5).float()} for _ in range(4)]
    trainer = SupervisedTrainer(
        device=torch.device("cpu"), max_epochs=1, train_data_loader=data, network=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.01), loss_function=loss, decollate=False,
    )  # fmt: skip
    StopOnNonFiniteLoss(every=4).attach(trainer)
    LossTermsHandler(loss).attach(trainer)
    EpochSummaryHandler(title="Stage-2", quiet_engines=False).attach(trainer)
    counter = _SyncCounter(monkeypatch)
    per_iteration = counter.attach(trainer)
    trainer.run()
    assert [n for i, n in per_iteration if i % 4] == [0, 0, 0], per_iteration


def test_nonfinite_every_reports_the_interval():
    trainer = _stage1_trainer(output_on_device=True)
    handler = StopOnNonFiniteLoss(every=2)
    handler.attach(trainer)

    def poison(engine):
        if engine.state.iteration == 3:
            engine.state.output = {"loss": torch.tensor(float("nan"))}

    # the poison must run before the check: the handler is registered again after it
    trainer.remove_event_handler(handler, IterationEvents.LOSS_COMPLETED)
    trainer.add_event_handler(IterationEvents.LOSS_COMPLETED, poison)
    trainer.add_event_handler(IterationEvents.LOSS_COMPLETED, handler)
    with pytest.raises(NonFiniteLossError, match="between iterations 3 and 4"):
        trainer.run()
    with pytest.raises(ValueError, match="every"):
        StopOnNonFiniteLoss(every=0)
