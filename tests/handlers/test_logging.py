"""Readable training logs: the Stage-2 loss terms as metrics, the beta ramp, the epoch summary line, the bar."""

from __future__ import annotations

import logging

import pytest
import torch
from ignite.engine import Engine, Events

from spectraflow_monai.handlers import BoundaryWeightRamp, EpochSummaryHandler, LossTermsHandler, ProgressBarHandler
from spectraflow_monai.losses import DiceBCEBoundaryLoss


def _binary_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 1, 12, 12, generator=g)
    target = torch.zeros(2, 1, 12, 12)
    target[:, :, 3:9, 4:10] = 1
    return logits, target


@pytest.mark.parametrize("softmax", [False, True])
def test_loss_records_its_terms(softmax):
    if softmax:
        loss_fn = DiceBCEBoundaryLoss(sigmoid=False, softmax=True, to_onehot_y=True, beta=0.2, lambda_ce=0.5)
        logits = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
        target = torch.randint(0, 3, (2, 1, 12, 12), generator=torch.Generator().manual_seed(2)).float()
    else:
        loss_fn = DiceBCEBoundaryLoss(beta=0.2, lambda_ce=0.5)
        logits, target = _binary_batch()
    assert loss_fn.last_terms is None
    loss = loss_fn(logits, target)
    terms = loss_fn.last_terms
    ce = "ce" if softmax else "bce"
    assert list(terms) == ["dice", ce, "boundary", "boundary_weighted"]
    assert all(not t.requires_grad and t.numel() == 1 for t in terms.values())
    torch.testing.assert_close(terms["boundary_weighted"], 0.2 * terms["boundary"])
    torch.testing.assert_close(loss.detach(), terms["dice"] + 0.5 * terms[ce] + terms["boundary_weighted"])
    loss_fn.beta_start = loss_fn._beta = 0.0  # no boundary term: not computed, not recorded
    loss_fn(logits, target)
    assert list(loss_fn.last_terms) == ["dice", ce]


def _engine(loss_fn, epochs_seen=None):
    logits, target = _binary_batch()

    def step(engine, batch):
        value = loss_fn(logits + batch, target)
        if epochs_seen is not None:
            epochs_seen.append((engine.state.epoch, loss_fn.beta, {k: float(v) for k, v in loss_fn.last_terms.items()}))
        return {"loss": value.detach()}

    return Engine(step)


def test_loss_terms_handler_metrics_and_ramp():
    loss_fn = DiceBCEBoundaryLoss(beta=0.0, beta_max=1.0, ramp_epochs=4)
    seen: list = []
    engine = _engine(loss_fn, seen)
    LossTermsHandler(loss_fn).attach(engine)
    per_epoch: list[dict] = []
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: per_epoch.append(dict(e.state.metrics)))
    engine.run([0.0, 0.5, -0.5], max_epochs=3)
    assert [m["boundary_beta"] for m in per_epoch] == pytest.approx([0.0, 0.25, 0.5])  # the ramp, as BoundaryWeightRamp
    assert "train_loss_boundary" not in per_epoch[0]  # beta = 0 in epoch 1: the term was not computed
    for epoch in (2, 3):
        metrics, rows = per_epoch[epoch - 1], [t for e, _, t in seen if e == epoch]
        assert len(rows) == 3
        for name in ("dice", "bce", "boundary", "boundary_weighted"):
            assert metrics[f"train_loss_{name}"] == pytest.approx(sum(r[name] for r in rows) / 3, rel=1e-6)


def test_boundary_weight_ramp_is_the_only_ramp():
    betas = {}
    for how in ("ramp", "terms"):
        loss_fn = DiceBCEBoundaryLoss(beta=0.0, beta_max=1.0, ramp_epochs=4)
        assert not hasattr(loss_fn, "attach")  # the loss does not attach itself to a trainer
        seen: list = []
        engine = Engine(lambda e, b: seen.append(loss_fn.beta))
        (BoundaryWeightRamp(loss_fn) if how == "ramp" else LossTermsHandler(loss_fn)).attach(engine)
        engine.run([0], max_epochs=6)
        betas[how] = seen
    assert betas["ramp"] == betas["terms"] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])


def test_handler_argument_checks():
    with pytest.raises(ValueError, match="set_epoch"):
        BoundaryWeightRamp(torch.nn.MSELoss())
    with pytest.raises(ValueError, match="last_terms"):
        LossTermsHandler(torch.nn.MSELoss())
    with pytest.raises(ValueError, match="keys"):
        ProgressBarHandler(keys="meanflow_error")


class _Records(logging.Handler):
    def __init__(self, on_emit=None):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.on_emit = on_emit

    def emit(self, record):
        self.lines.append(record.getMessage())
        if self.on_emit is not None:
            self.on_emit()


def _logger(name: str, handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def test_epoch_summary_one_line_per_epoch():
    """Epoch means of the output terms, the trainer and validation metrics, the rate, the time, the best so far."""
    param = torch.nn.Parameter(torch.zeros(1))
    trainer = Engine(lambda e, b: [{"loss": torch.tensor(b)}, {"loss": torch.tensor(b)}])
    trainer.optimizer = torch.optim.SGD([param], lr=0.01)
    validator = Engine(lambda e, b: None)
    validator.state.key_metric_name, validator.state.best_metric, validator.state.best_metric_epoch = "val_dice", -1, -1

    @validator.on(Events.EPOCH_COMPLETED)
    def _val_metrics(engine):
        engine.state.metrics["val_dice"] = 0.5 if trainer.state.epoch == 1 else 0.4
        if engine.state.metrics["val_dice"] > engine.state.best_metric:
            engine.state.best_metric = engine.state.metrics["val_dice"]
            engine.state.best_metric_epoch = trainer.state.epoch

    @trainer.on(Events.EPOCH_COMPLETED)
    def _validate(engine):  # what MONAI's ValidationHandler does
        validator.state.max_epochs = None
        validator.run([0], max_epochs=1)
        validator.state.epoch = engine.state.epoch
        engine.state.metrics["train_dice"] = 0.25
        trainer.optimizer.param_groups[0]["lr"] = 0.005

    records = _Records()
    logger = _logger("test.summary.lines", records)
    try:
        summary = EpochSummaryHandler(title="Stage-2", name=logger.name, output_prefix="train_", validator=validator)
        summary.attach(trainer)
        trainer.run([1.0, 2.0], max_epochs=2)
    finally:
        logger.removeHandler(records)
    assert len(records.lines) == 2, records.lines
    first, second = records.lines
    assert first.startswith("Stage-2 epoch 1/2 | train_loss 1.5 train_dice 0.25 | val_dice 0.5 | lr 0.005 | ")
    assert first.endswith("| best val_dice 0.5 (epoch 1)")
    assert second.startswith("Stage-2 epoch 2/2 | ") and "val_dice 0.4 |" in second
    assert second.endswith("| best val_dice 0.5 (epoch 1)")


def test_epoch_summary_after_the_progress_bar_closes():
    """Attached before the bar (the order of a bundle's handler list), the line still follows the closed bar."""
    engine = Engine(lambda e, b: {"meanflow_error": 0.5, "loss_meanflow_weighted": 0.99, "loss": 1.2})
    bar = ProgressBarHandler(desc="Stage-1", keys=["meanflow_error", "loss_mae"])
    assert bar.output_transform({"meanflow_error": 0.5, "loss": 1.2}) == {"meanflow_error": 0.5}  # the headline
    assert bar.output_transform([{"loss_mae": 0.3, "loss": 1.2}]) == {"loss_mae": 0.3}
    open_at_log: list[bool] = []
    records = _Records(on_emit=lambda: open_at_log.append(bar.bar.pbar is not None))
    logger = _logger("test.summary.bar", records)
    try:
        EpochSummaryHandler(title="Stage-1", name=logger.name).attach(engine)
        bar.attach(engine)
        engine.run([0, 1], max_epochs=2)
    finally:
        logger.removeHandler(records)
    assert open_at_log == [False, False]
    assert records.lines[0].startswith("Stage-1 epoch 1/2 | meanflow_error 0.5 loss_meanflow_weighted 0.99 loss 1.2 |")


def test_epoch_summary_replaces_the_engines_per_epoch_lines(caplog):
    trainer = Engine(lambda e, b: {"loss": torch.tensor(1.0)})
    validator = Engine(lambda e, b: None)
    EpochSummaryHandler(title="Stage-2", validator=validator).attach(trainer)

    @trainer.on(Events.EPOCH_COMPLETED)
    def _chatter(engine):
        engine.logger.info("Got new best metric of val_mean_dice: 0.5")
        engine.logger.warning("Epoch[2] something went wrong")  # warnings always pass
        validator.logger.info("Epoch[1] Complete. Time taken: 00:00:00")

    with caplog.at_level(logging.INFO):
        trainer.run([0, 1], max_epochs=2)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("Stage-2 epoch")]) == 2
    assert not any(m.startswith(("Epoch[1] Complete", "Epoch[2] Complete", "Got new best")) for m in messages), messages
    assert "Epoch[2] something went wrong" in messages
    caplog.clear()
    other = Engine(lambda e, b: None)  # the same class-wide logger: quiet only during the summarised run
    EpochSummaryHandler(quiet_engines=False).attach(other)
    with caplog.at_level(logging.INFO):
        other.run([0], max_epochs=1)
    assert any(r.getMessage().startswith("Epoch[1] Complete") for r in caplog.records)


@pytest.mark.parametrize("enabled, expected", [(True, 1), (False, 0)])
def test_progress_bar_attaches_only_when_enabled(enabled, expected):
    engine = Engine(lambda e, b: {"loss": 1.0})
    before = len(engine._event_handlers[Events.ITERATION_COMPLETED])
    ProgressBarHandler(desc="Stage-2", enabled=enabled).attach(engine)
    assert len(engine._event_handlers[Events.ITERATION_COMPLETED]) - before == expected
