"""Tests for spectraflow_monai.utils.compile: torch.compile with the eager fallback (cheap backends only)."""

from __future__ import annotations

import logging

import pytest
import torch

from spectraflow_monai.utils.compile import CompiledOrEager, compile_or_eager, to_channels_last


def _failing_backend(gm, example_inputs):
    raise RuntimeError("this backend cannot compile anything")


def _step(x):
    return (x * 2).sum()


def test_fallback_to_eager_logs_the_reason(caplog):
    fn = compile_or_eager(_step, mode="default", name="toy step", backend=_failing_backend)
    assert isinstance(fn, CompiledOrEager) and fn.compiled
    with caplog.at_level(logging.WARNING, logger="spectraflow_monai.utils.compile"):
        out = fn(torch.ones(3))
    assert out.item() == 6.0 and not fn.compiled
    assert "toy step fell back to eager" in caplog.text and "cannot compile" in fn.reason
    assert fn(torch.ones(2)).item() == 4.0  # eager from now on, no second warning
    assert caplog.text.count("fell back") == 1


def test_compiles_with_a_working_backend():
    fn = compile_or_eager(_step, backend="eager")
    assert fn(torch.ones(4)).item() == 8.0 and fn.compiled and fn.reason is None


def test_user_errors_are_not_swallowed():
    def bad(x):
        raise KeyError("not a compile error")

    fn = compile_or_eager(bad, backend="eager")
    with pytest.raises(KeyError):
        fn(torch.ones(1))


def test_module_keeps_its_state_dict_and_off_mode():
    net = torch.nn.Conv2d(3, 4, 3)
    keys = set(net.state_dict())
    same = compile_or_eager(net, backend=_failing_backend)
    assert same is net and set(net.state_dict()) == keys
    assert net(torch.randn(1, 3, 8, 8)).shape == (1, 4, 6, 6) and not net.forward.compiled
    assert compile_or_eager(_step, mode="off") is _step


@pytest.mark.parametrize("kwargs", [{"mode": "fast"}, {"fn": 3}])
def test_ill_arguments(kwargs):
    with pytest.raises(ValueError):
        compile_or_eager(**{"fn": _step, **kwargs})


def test_channels_last():
    net = to_channels_last(torch.nn.Conv2d(3, 4, 3))
    assert net.weight.is_contiguous(memory_format=torch.channels_last)
    plain = torch.nn.Conv2d(3, 4, 3)
    assert to_channels_last(plain, enabled=False).weight.is_contiguous()
