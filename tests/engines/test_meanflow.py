"""Tests of the SpectraFlow Stage-1 trainer (MeanFlowPretrainer) and its latent normalisation."""

from __future__ import annotations

import copy
import io
import logging
import math
import os

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import ProgressBar
from monai.data import DataLoader, Dataset
from monai.handlers import CheckpointLoader, CheckpointSaver, LrScheduleHandler, StatsHandler
from parameterized import parameterized

from spectraflow_monai.engines import (
    DispersiveConfig,
    EMAConfig,
    GradientConfig,
    MeanFlowConfig,
    MeanFlowPretrainer,
    normalize_latent,
)
from spectraflow_monai.optimizers import linear_lr_schedule
from spectraflow_monai.networks.encoders.dinov2 import DINOv2Encoder
from spectraflow_monai.networks.nets.meanflow_head import MeanFlowHead

torch.set_num_threads(1)

ENC_KW = {"model_name": "vit_small_patch14_dinov2", "img_size": 28, "model_kwargs": {"depth": 3}}


def _modules(seed: int = 0, trainable_blocks="all", num_domains: int = 2):
    torch.manual_seed(seed)
    encoder = DINOv2Encoder(**ENC_KW, trainable_blocks=trainable_blocks)
    head = MeanFlowHead(encoder.embed_dim, hidden_channels=32, num_blocks=1, num_heads=4, num_domains=num_domains)
    return encoder, head


def _optimizer(encoder, head, lr: float = 1e-3):
    return torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=lr)


def _data(n_batches: int, batch: int = 4, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "image": torch.randn(batch, 3, 28, 28, generator=g),
            "domain": torch.tensor([0, 1] * (batch // 2) + [0] * (batch % 2)),
        }
        for _ in range(n_batches)
    ]


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _count_steps(optimizer) -> list[int]:
    calls: list[int] = []
    optimizer.register_step_post_hook(lambda *_: calls.append(1))
    return calls


class TestMeanFlowPretrainer:
    def test_run_outputs_and_updates(self):
        encoder, head = _modules()
        enc0, head0 = _params(encoder), _params(head)
        opt = _optimizer(encoder, head)
        steps = _count_steps(opt)
        outputs = []
        trainer = MeanFlowPretrainer("cpu", 1, _data(6), encoder, head, opt)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(dict(e.state.output)))
        trainer.run()
        assert len(outputs) == 6 and len(steps) == 6
        for out in outputs:
            assert list(out) == [
                "meanflow_error", "loss_meanflow_weighted", "loss_dispersive", "dispersive_weighted", "loss"
            ]  # fmt: skip
            assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())
            assert out["dispersive_weighted"] == pytest.approx(0.4 * out["loss_dispersive"], rel=1e-5)
            assert out["loss"] == pytest.approx(out["loss_meanflow_weighted"] + out["dispersive_weighted"], rel=1e-5)
            # adaptive weight L / (L + c) keeps each per-sample term in (0, 1)
            assert 0 < out["loss_meanflow_weighted"] < 1
            assert out["meanflow_error"] > 0
        assert _max_diff(enc0, _params(encoder)) > 0
        assert _max_diff(head0, _params(head)) > 0

    def test_meanflow_gradient_reaches_encoder_and_warns_without_disp_path(self):
        # dispersive term off: any encoder change comes from the MeanFlow prediction through z_t.
        encoder, head = _modules()
        enc0 = _params(encoder)
        trainer = MeanFlowPretrainer(
            "cpu", 1, _data(3), encoder, head, _optimizer(encoder, head), dispersive=DispersiveConfig(weight=0)
        )
        trainer.run()
        assert trainer.state.output["loss_dispersive"] == 0.0
        assert _max_diff(enc0, _params(encoder)) > 0
        # only the last block trainable: the penultimate-block features have no gradient path
        encoder, head = _modules(trainable_blocks=1)
        trainer = MeanFlowPretrainer("cpu", 1, _data(1), encoder, head, _optimizer(encoder, head))
        with pytest.warns(UserWarning, match="dispersive loss cannot change the encoder"):
            trainer.run()

    @parameterized.expand(
        [
            # accumulation_steps, number of batches, epoch_length, expected optimizer steps
            (2, 6, None, 3),
            (4, 6, None, 2),  # steps after iteration 4 and the end-of-epoch flush at 6
            (3, 5, None, 2),  # steps after 3 and the flush at 5
        ]
    )
    def test_gradient_accumulation(self, acc, n, epoch_length, expected):
        encoder, head = _modules()
        opt = _optimizer(encoder, head)
        steps = _count_steps(opt)
        changed = []
        trainer = MeanFlowPretrainer(
            "cpu", 1, _data(n), encoder, head, opt, gradients=GradientConfig(acc), epoch_length=epoch_length
        )
        last = [_params(head)]

        def record(engine):
            now = _params(head)
            changed.append(_max_diff(last[0], now) > 0)
            last[0] = now
            assert engine.optimizer_stepped == changed[-1]

        trainer.add_event_handler(Events.ITERATION_COMPLETED, record)
        trainer.run()
        assert len(steps) == expected
        expected_changed = [(i + 1) % acc == 0 or i + 1 == n for i in range(n)]
        assert changed == expected_changed

    def test_accumulation_equals_large_batch_without_dispersion(self):
        # with the noise/time fixed, two half batches accumulated == one step on the full batch (mean reductions)
        data = _data(2, batch=4, seed=3)
        full = [
            {"image": torch.cat([data[0]["image"], data[1]["image"]]), "domain": torch.cat([d["domain"] for d in data])}
        ]
        results = []
        for batches, acc in ((data, 2), (full, 1)):
            encoder, head = _modules(seed=5)
            # make the head output non-zero so that the MeanFlow gradient reaches the encoder at the first step
            torch.nn.init.normal_(head.out_proj.weight, std=0.02)
            opt = torch.optim.SGD(encoder.trainable_parameters() + list(head.parameters()), lr=0.1)
            trainer = MeanFlowPretrainer(
                "cpu", 1, batches, encoder, head, opt, dispersive=DispersiveConfig(0), gradients=GradientConfig(acc)
            )
            gen = torch.Generator().manual_seed(11)
            noise = torch.randn(8, encoder.embed_dim, 2, 2, generator=gen)
            times = torch.rand(2, 8, generator=gen).sort(dim=0).values

            class FixedMF(type(trainer.meanflow_loss)):
                calls = 0

                def compute(self, head_, z0, **kw):
                    b = z0.shape[0]
                    i = 0 if b == 8 else FixedMF.calls * b
                    FixedMF.calls += 1
                    return super().compute(
                        head_, z0, noise=noise[i : i + b], t=times[1, i : i + b], s=times[0, i : i + b], **kw
                    )

            trainer.meanflow_loss = FixedMF()
            trainer.run()
            results.append((_params(encoder), _params(head)))
        assert _max_diff(results[0][0], results[1][0]) < 1e-6
        assert _max_diff(results[0][1], results[1][1]) < 1e-6
        assert _max_diff(results[0][0], _params(_modules(seed=5)[0])) > 1e-5  # the encoder did move

    def test_domain_condition(self):
        seen = []

        class SpyHead(MeanFlowHead):
            def forward(self, z, t, s, domain=None):
                seen.append(domain)
                return super().forward(z, t, s, domain=domain)

        torch.manual_seed(0)
        encoder = DINOv2Encoder(**ENC_KW, trainable_blocks="all")
        head = SpyHead(encoder.embed_dim, hidden_channels=32, num_blocks=1, num_heads=4, num_domains=2)
        trainer = MeanFlowPretrainer("cpu", 1, _data(1), encoder, head, _optimizer(encoder, head))
        trainer.run()
        assert len(seen) == 2  # prediction + JVP
        assert all(torch.equal(d, torch.tensor([0, 1, 0, 1])) for d in seen)
        # a head without domain embedding never receives the flag (it would raise if it did)
        encoder, head = _modules(num_domains=0)
        trainer = MeanFlowPretrainer("cpu", 1, _data(1), encoder, head, _optimizer(encoder, head))
        assert not trainer.condition_on_domain
        trainer.run()

    def test_with_mixed_domain_transform_and_dataloader(self):
        from spectraflow_monai.transforms.mixed_domain import RandMixedDomaind

        g = torch.Generator().manual_seed(0)
        items = [
            {"image": torch.randn(3, 28, 28, generator=g), "label": (torch.rand(1, 28, 28, generator=g) > 0.5).float()}
            for _ in range(8)
        ]
        xform = RandMixedDomaind(keys="image", mask_key="label", mask_ratio=0.5)
        xform.set_random_state(0)
        loader = DataLoader(Dataset(items, transform=xform), batch_size=4, num_workers=0)
        encoder, head = _modules()
        trainer = MeanFlowPretrainer("cpu", 1, loader, encoder, head, _optimizer(encoder, head))
        trainer.run()
        assert trainer.state.iteration == 2
        assert math.isfinite(trainer.state.output["loss"])

    def test_ema(self):
        encoder, head = _modules()
        init = _params(encoder)
        live_after_step = []
        opt, ema = _optimizer(encoder, head), EMAConfig(0.9)
        trainer = MeanFlowPretrainer("cpu", 1, _data(4), encoder, head, opt, ema=ema, gradients=GradientConfig(2))
        trainer.add_event_handler(
            Events.ITERATION_COMPLETED,
            lambda e: live_after_step.append(_params(encoder)) if e.optimizer_stepped else None,
        )
        trainer.run()
        assert len(live_after_step) == 2
        expected = init
        for live in live_after_step:
            expected = {k: 0.9 * expected[k] + 0.1 * live[k] for k in expected}
        ema = _params(trainer.ema_encoder)
        assert _max_diff(ema, expected) < 1e-6
        live = _params(encoder)
        dist_ema = sum(float((ema[k] - live[k]).pow(2).sum()) for k in live)
        dist_init = sum(float((init[k] - live[k]).pow(2).sum()) for k in live)
        assert 0 < dist_ema < dist_init  # differs from the live encoder, moved towards it
        assert all(not p.requires_grad for p in trainer.ema_encoder.parameters())

    def test_no_ema(self):
        encoder, head = _modules()
        trainer = MeanFlowPretrainer("cpu", 1, _data(1), encoder, head, _optimizer(encoder, head), ema=None)
        assert trainer.ema_encoder is None and "ema" not in trainer.checkpoint_dict()
        trainer.run()

    def test_resume_matches_uninterrupted_run(self, tmp_path):
        def build(max_epochs, handlers):
            encoder, head = _modules(seed=0)
            opt = _optimizer(encoder, head)
            lr = linear_lr_schedule(opt, total_steps=6, start_lr=1e-3, end_lr=1e-4)
            trainer = MeanFlowPretrainer("cpu", max_epochs, _data(3), encoder, head, opt, ema=EMAConfig(0.9))
            # noise and times are drawn from the global RNG: seed it per epoch so that both runs see the same draws
            trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: torch.manual_seed(100 + e.state.epoch))
            LrScheduleHandler(lr, epoch_level=False, print_lr=False).attach(trainer)
            for h in handlers(trainer, lr):
                h.attach(trainer)
            return trainer, lr

        ref, _ = build(2, lambda t, lr: [])
        ref.run()

        first, _ = build(
            1,
            lambda t, lr: [
                CheckpointSaver(str(tmp_path), t.checkpoint_dict(lr), save_final=True, final_filename="ckpt.pt")
            ],
        )
        first.run()
        saved = {k: _params(first.checkpoint_dict()[k]) for k in ("encoder", "head", "ema")}
        saved_opt = copy.deepcopy(first.optimizer.state_dict())

        restored = {}

        def after_load(engine):
            restored["iteration"], restored["epoch"] = engine.state.iteration, engine.state.epoch
            restored.update({k: _params(engine.checkpoint_dict()[k]) for k in ("encoder", "head", "ema")})
            restored["opt"] = copy.deepcopy(engine.optimizer.state_dict())
            restored["lr"] = engine.optimizer.param_groups[0]["lr"]

        second, _ = build(2, lambda t, lr: [CheckpointLoader(str(tmp_path / "ckpt.pt"), t.checkpoint_dict(lr))])
        second.add_event_handler(Events.STARTED, after_load)  # runs after the loader's STARTED handler
        second.run()

        assert restored["iteration"] == 3 and restored["epoch"] == 1
        for k in ("encoder", "head", "ema"):
            assert _max_diff(saved[k], restored[k]) == 0
        assert restored["lr"] == pytest.approx(first.optimizer.param_groups[0]["lr"])
        for pid, st in saved_opt["state"].items():
            for name, value in st.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(restored["opt"]["state"][pid][name]))
        assert second.state.iteration == 6 and second.state.epoch == 2
        for k in ("encoder", "head", "ema"):
            assert _max_diff(_params(ref.checkpoint_dict()[k]), _params(second.checkpoint_dict()[k])) < 1e-6
        assert second.optimizer.param_groups[0]["lr"] == pytest.approx(ref.optimizer.param_groups[0]["lr"])

    def test_stats_handler_logs_each_term(self):
        encoder, head = _modules()
        handler = StatsHandler(name="sf_pretrain_test", output_transform=lambda out: out, iteration_log=True)
        trainer = MeanFlowPretrainer(
            "cpu", 1, _data(1), encoder, head, _optimizer(encoder, head), train_handlers=[handler]
        )
        records: list[str] = []

        class _ListHandler(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())

        logger = logging.getLogger("sf_pretrain_test")
        capture = _ListHandler(level=logging.INFO)
        logger.addHandler(capture)
        stream = io.StringIO()
        ProgressBar(persist=True, file=stream).attach(trainer, output_transform=lambda out: {"loss": out["loss"]})
        try:
            trainer.run()
        finally:
            logger.removeHandler(capture)
        text = "\n".join(records)
        out = trainer.state.output
        for key in ("meanflow_error", "loss_meanflow_weighted", "loss_dispersive", "dispersive_weighted", "loss"):
            assert f"{key}: {out[key]:.4f}" in text
        assert "loss=" in stream.getvalue()

    def test_amp_cpu_bf16(self):
        encoder, head = _modules()
        trainer = MeanFlowPretrainer("cpu", 1, _data(2), encoder, head, _optimizer(encoder, head), amp=True)
        assert trainer.scaler is None
        trainer.run()
        assert all(math.isfinite(v) for v in trainer.state.output.values())

    def test_batch_size_one(self):
        encoder, head = _modules()
        data = [{"image": torch.randn(1, 3, 28, 28)}]
        trainer = MeanFlowPretrainer("cpu", 1, data, encoder, head, _optimizer(encoder, head))
        with pytest.raises(ValueError, match=r"batch size 1.*batch_size >= 2.*DispersiveConfig\(weight=0\)"):
            trainer.run()
        trainer = MeanFlowPretrainer(
            "cpu", 1, data, encoder, head, _optimizer(encoder, head), dispersive=DispersiveConfig(weight=0)
        )
        trainer.run()  # fine without the dispersive term (and without a domain key)
        assert math.isfinite(trainer.state.output["loss"])

    def test_bad_batches(self):
        encoder, head = _modules()
        trainer = MeanFlowPretrainer(
            "cpu", 1, [{"img": torch.randn(2, 3, 28, 28)}], encoder, head, _optimizer(encoder, head)
        )
        with pytest.raises(ValueError, match="no image_key 'image'"):
            trainer.run()
        bad_domain = [{"image": torch.randn(2, 3, 28, 28), "domain": torch.tensor([0, 1, 1])}]
        trainer = MeanFlowPretrainer("cpu", 1, bad_domain, encoder, head, _optimizer(encoder, head))
        with pytest.raises(ValueError, match="3 entries for a batch of 2"):
            trainer.run()

    @parameterized.expand(
        [
            ({"max_epochs": 0}, "max_epochs.*0"),
            ({"dispersive": 0.4}, "dispersive must be DispersiveConfig or None, got float"),
            ({"ema": 0.999}, "ema must be EMAConfig or None, got float"),
            ({"gradients": {"accumulation_steps": 2}}, "gradients must be GradientConfig or None, got dict"),
            ({"meanflow": {"latent_norm": False}}, "meanflow must be MeanFlowConfig or None, got dict"),
            ({"ema": "own encoder"}, "EMAConfig: encoder must be a separate nn.Module"),
        ]
    )
    def test_invalid_arguments(self, kwargs, match):
        encoder, head = _modules()
        if kwargs.get("ema") == "own encoder":  # the EMA module must not be the trained encoder itself
            kwargs = {"ema": EMAConfig(encoder=encoder)}
        args = {"max_epochs": 1, **kwargs}
        with pytest.raises(ValueError, match=match):
            MeanFlowPretrainer(
                "cpu",
                train_data_loader=_data(1),
                encoder=encoder,
                head=head,
                optimizer=_optimizer(encoder, head),
                **args,
            )

    def test_invalid_modules(self):
        encoder, head = _modules(num_domains=0)
        with pytest.raises(ValueError, match="condition_on_domain=True.*num_domains=0"):
            MeanFlowPretrainer(
                "cpu", 1, _data(1), encoder, head, _optimizer(encoder, head),
                meanflow=MeanFlowConfig(condition_on_domain=True),
            )  # fmt: skip
        with pytest.raises(ValueError, match="head must be the plain module, got DataParallel"):
            MeanFlowPretrainer("cpu", 1, _data(1), encoder, torch.nn.DataParallel(head), _optimizer(encoder, head))
        with pytest.raises(RuntimeError, match=r"GradientConfig\(distributed=True\)\) needs an initialised"):
            MeanFlowPretrainer(
                "cpu", 1, _data(1), encoder, head, _optimizer(encoder, head), gradients=GradientConfig(distributed=True)
            ).run()

    def test_external_ema_encoder(self):
        encoder, head = _modules()
        ema_module = DINOv2Encoder(**ENC_KW)  # different random weights, overwritten with the encoder's
        trainer = MeanFlowPretrainer(
            "cpu", 1, _data(2), encoder, head, _optimizer(encoder, head), ema=EMAConfig(encoder=ema_module)
        )
        assert trainer.ema_encoder is ema_module
        assert _max_diff(_params(ema_module), _params(encoder)) == 0
        trainer.run()
        assert 0 < _max_diff(_params(ema_module), _params(encoder))


    @parameterized.expand([(True,), (False,)])
    def test_latent_norm_decides_z0(self, latent_norm):
        """latent_norm=True regresses the normalised token map, False the raw final map (eq. 1 as printed)."""
        from spectraflow_monai.losses import MeanFlowLoss

        seen: list[torch.Tensor] = []

        class Recording(MeanFlowLoss):
            def compute(self, head, z0, *args, **kwargs):
                seen.append(z0.detach().clone())
                return super().compute(head, z0, *args, **kwargs)

        encoder, head = _modules(num_domains=0)
        batch = _data(1)
        with torch.no_grad():
            raw = encoder(batch[0]["image"]).final
        trainer = MeanFlowPretrainer("cpu", 1, batch, encoder, head, _optimizer(encoder, head, lr=0.0),
                                     meanflow=MeanFlowConfig(loss=Recording(), latent_norm=latent_norm),
                                     ema=None)  # fmt: skip
        trainer.run()
        expected = normalize_latent(raw) if latent_norm else raw
        assert torch.allclose(seen[0], expected, atol=1e-5)

    def test_paper_literal_objective_is_finite_and_unweighted(self):
        """Eqs. 1, 3, 5 as printed: raw latent, plain squared error (adaptive power 0), raw squared distances."""
        from spectraflow_monai.losses import DispersiveLoss, MeanFlowLoss

        encoder, head = _modules(num_domains=0)
        outputs = []
        trainer = MeanFlowPretrainer("cpu", 1, _data(3), encoder, head, _optimizer(encoder, head),
                                     meanflow=MeanFlowConfig(loss=MeanFlowLoss(adaptive_p=0.0), latent_norm=False),
                                     dispersive=DispersiveConfig(loss=DispersiveLoss(normalize=None)))  # fmt: skip
        trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(dict(e.state.output)))
        trainer.run()
        elements = encoder.embed_dim * 2 * 2  # 28 px / patch 14: a 2x2 token map per sample
        for out in outputs:
            assert all(math.isfinite(v) for v in out.values())
            # no adaptive weight: the optimised MeanFlow loss is the per-sample sum of squares of eq. 3
            assert out["loss_meanflow_weighted"] == pytest.approx(out["meanflow_error"] * elements, rel=1e-4)


class TestHelpers:
    def test_normalize_latent(self):
        z = torch.randn(2, 6, 3, 4) * 5 + 2
        out = normalize_latent(z)
        tokens = z.permute(0, 2, 3, 1)
        expected = (tokens - tokens.mean(-1, keepdim=True)) / torch.sqrt(
            tokens.var(-1, unbiased=False, keepdim=True) + 1e-6
        )
        assert torch.allclose(out, expected.permute(0, 3, 1, 2), atol=1e-5)
        assert torch.allclose(out.mean(1), torch.zeros(2, 3, 4), atol=1e-5)
        with pytest.raises(ValueError, match=r"\(B, C, h, w\)"):
            normalize_latent(torch.randn(2, 6, 3))
