"""Tests of the Stage-1 learning-rate schedule (linear decay, resumable with a different schedule)."""

from __future__ import annotations

import pytest
import torch
from parameterized import parameterized

from spectraflow_monai.optimizers import LinearDecayLR, linear_lr_schedule


class TestLinearLRSchedule:
    def test_linear_lr_schedule(self):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=0.5)
        sched = linear_lr_schedule(opt, total_steps=10)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(12):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        expected = [1e-5 + (1e-6 - 1e-5) * min(k, 10) / 10 for k in range(13)]
        assert lrs == pytest.approx(expected, rel=1e-6)

    @staticmethod
    def _schedule_after(steps, total_steps, start_lr=1e-3, end_lr=1e-4):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=0.1)
        sched = linear_lr_schedule(opt, total_steps=total_steps, start_lr=start_lr, end_lr=end_lr)
        for _ in range(steps):
            opt.step()
            sched.step()
        return opt, sched

    def test_linear_lr_schedule_same_schedule_resumes_exactly(self):
        opt, sched = self._schedule_after(4, total_steps=10)
        state, opt_state = sched.state_dict(), opt.state_dict()
        new_opt, new_sched = self._schedule_after(0, total_steps=10)
        new_opt.load_state_dict(opt_state)
        new_sched.load_state_dict(state)
        for _ in range(3):
            for o, s in ((opt, sched), (new_opt, new_sched)):
                o.step()
                s.step()
        assert new_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]  # bit-for-bit
        assert new_sched.state_dict() == sched.state_dict()

    @parameterized.expand([(20, 1e-3, 1e-4), (6, 1e-3, 1e-4), (3, 1e-3, 1e-4), (20, 2e-3, 1e-5)])
    def test_linear_lr_schedule_resume_with_new_schedule(self, new_total, new_start, new_end):
        # 4 steps of a 10-step schedule, then resumed with another length / other rates: the rate continues on the
        # newly configured straight line from step 4, not on the checkpoint's
        opt, sched = self._schedule_after(4, total_steps=10)
        state, opt_state = sched.state_dict(), opt.state_dict()
        new_opt, new_sched = self._schedule_after(0, total_steps=new_total, start_lr=new_start, end_lr=new_end)
        new_opt.load_state_dict(opt_state)
        with pytest.warns(UserWarning, match=f"total_iters 10 -> {new_total}"):
            new_sched.load_state_dict(state)
        assert new_sched.last_epoch == 4
        lrs = [new_opt.param_groups[0]["lr"]]
        for _ in range(new_total + 2):
            new_opt.step()
            new_sched.step()
            lrs.append(new_opt.param_groups[0]["lr"])
        expected = [new_start + (new_end - new_start) * min(k, new_total) / new_total for k in range(4, new_total + 7)]
        assert lrs == pytest.approx(expected, rel=1e-6)
        assert new_sched.get_last_lr()[0] == pytest.approx(expected[-1], rel=1e-6)

    @parameterized.expand(
        [
            ({"total_steps": 0}, "total_steps.*0"),
            ({"total_steps": 5, "start_lr": 1e-5, "end_lr": 1e-4}, "end_lr.*0.0001"),
            ({"total_steps": 5, "start_lr": -1.0}, "start_lr.*-1.0"),
        ]
    )
    def test_linear_lr_schedule_errors(self, kwargs, match):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        with pytest.raises(ValueError, match=match):
            linear_lr_schedule(opt, **kwargs)

    def test_type_and_optimizer_rate(self):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        sched = linear_lr_schedule(opt, total_steps=4, start_lr=None, end_lr=0.01)  # None keeps the optimizer's rate
        assert isinstance(sched, LinearDecayLR) and isinstance(sched, torch.optim.lr_scheduler.LinearLR)
        for _ in range(4):
            opt.step()
            sched.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
