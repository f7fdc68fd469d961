import pytest
import torch
from ignite.engine import Engine, Events
from monai.engines.utils import IterationEvents
from parameterized import parameterized

from spectraflow_monai.handlers import FinalHeadHandler


def _engine(pred, with_loss_event=True):
    def step(engine, batch):
        engine.state.output = {"pred": pred, "loss": torch.tensor(0.0)}
        if with_loss_event:
            engine.fire_event(IterationEvents.LOSS_COMPLETED)
        engine.state.seen = engine.state.output["pred"]  # what ITERATION_COMPLETED (post-processing, metrics) sees
        return engine.state.output

    engine = Engine(step)
    if with_loss_event:
        engine.register_events(*IterationEvents, event_to_attr={e: e.value for e in IterationEvents})
    return engine


HEADS = [torch.full((1, 1, 2, 2), float(i)) for i in range(4)]


class TestFinalHeadHandler:
    @parameterized.expand([
        ["list_loss_event", HEADS, True, -1, HEADS[-1]],
        ["tuple_first_head", tuple(HEADS), True, 0, HEADS[0]],
        ["list_no_loss_event", HEADS, False, -1, HEADS[-1]],
        ["tensor_untouched", HEADS[2], True, -1, HEADS[2]],
    ])  # fmt: skip
    def test_keeps_one_head_after_the_loss(self, _, pred, with_loss_event, head, expected):
        engine = _engine(pred, with_loss_event)
        FinalHeadHandler(head=head).attach(engine)
        seen = []
        engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(e.state.output["pred"]))
        engine.run([0], max_epochs=1)
        assert seen[0] is expected
        if with_loss_event:  # selected before ITERATION_COMPLETED, the post-processing's event
            assert engine.state.seen is expected

    @parameterized.expand([["1.0"], [True], [None]])
    def test_bad_head(self, head):
        with pytest.raises(ValueError, match="head"):
            FinalHeadHandler(head=head)
