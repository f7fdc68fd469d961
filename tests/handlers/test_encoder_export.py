"""Tests of the Stage-1 encoder export: the file written by hand and by the handler, and what it refuses."""

from __future__ import annotations

import os

import pytest
import torch
from ignite.engine import Events

from spectraflow_monai.engines import MeanFlowPretrainer
from spectraflow_monai.handlers import EncoderExportHandler, save_encoder_export
from spectraflow_monai.networks.encoders.dinov2 import DINOv2Encoder
from spectraflow_monai.networks.nets.meanflow_head import MeanFlowHead
from spectraflow_monai.utils.checkpoint import NonFiniteStateError

torch.set_num_threads(1)

ENC_KW = {"model_name": "vit_small_patch14_dinov2", "img_size": 28, "model_kwargs": {"depth": 3}}


def _modules():
    torch.manual_seed(0)
    encoder = DINOv2Encoder(**ENC_KW, trainable_blocks="all")
    return encoder, MeanFlowHead(encoder.embed_dim, hidden_channels=32, num_blocks=1, num_heads=4, num_domains=2)


def _optimizer(encoder, head, lr: float = 1e-3):
    return torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=lr)


def _data(n_batches: int, batch: int = 4):
    g = torch.Generator().manual_seed(1)
    return [{"image": torch.randn(batch, 3, 28, 28, generator=g), "domain": torch.tensor([0, 1] * (batch // 2))}
            for _ in range(n_batches)]


def test_encoder_export_refuses_non_finite_weights_and_keeps_the_earlier_file(tmp_path):
    encoder = torch.nn.Linear(3, 2)
    path = save_encoder_export(encoder, tmp_path / "encoder_stage1.pt")
    before = torch.load(path, weights_only=True)
    with torch.no_grad():
        encoder.bias[1] = float("inf")
    with pytest.raises(NonFiniteStateError, match="bias"):
        save_encoder_export(encoder, path)
    after = torch.load(path, weights_only=True)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_encoder_export(tmp_path):
    encoder, head = _modules()
    path = tmp_path / "export" / "encoder_ema.pt"
    epoch_files = []
    trainer = MeanFlowPretrainer(
        "cpu",
        2,
        _data(2),
        encoder,
        head,
        _optimizer(encoder, head),
        train_handlers=[EncoderExportHandler(path=path)],
    )
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: epoch_files.append(path.is_file()))
    trainer.run()
    assert epoch_files == [True, True]
    assert sorted(os.listdir(path.parent)) == ["encoder_ema.pt"]  # no temporary files left behind
    loaded = DINOv2Encoder(**ENC_KW, pretrained=str(path)).eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        a, b, live = loaded(x), trainer.ema_encoder.eval()(x), encoder.eval()(x)
    assert torch.allclose(a.final, b.final, atol=1e-6) and torch.allclose(a.pooled, b.pooled, atol=1e-6)
    assert not torch.allclose(a.final, live.final, atol=1e-6)  # the EMA, not the live encoder, was exported
    # explicit module (the live encoder)
    path2 = tmp_path / "live.pt"
    handler = EncoderExportHandler(encoder, path2, epoch_level=False)
    handler(trainer)
    sd = torch.load(path2, weights_only=True)
    assert all(torch.equal(sd[k], v) for k, v in encoder.vit.state_dict().items())


def test_export_handler_errors():
    with pytest.raises(ValueError, match="interval"):
        EncoderExportHandler(path="x.pt", interval=0)
    with pytest.raises(ValueError, match="encoder must be None"):
        EncoderExportHandler("not-a-module", "x.pt")
