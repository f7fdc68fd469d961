"""Tests of the mixed-domain MAE Stage-1 variant: masking, visible-token encoder pass, decoder and trainer."""

from __future__ import annotations

import pytest
import torch
from ignite.engine import Events
from parameterized import parameterized

from spectraflow_monai.engines import (
    DispersiveConfig,
    EMAConfig,
    MAEConfig,
    MAEPretrainer,
    encode_visible,
    random_masking,
)
from spectraflow_monai.handlers import EncoderExportHandler
from spectraflow_monai.networks import DINOv2Encoder, MAEDecoder, SpectraFlowNet

torch.set_num_threads(1)

SIZE, DEPTH = 28, 2
ENC_KW = {"img_size": SIZE, "model_kwargs": {"depth": DEPTH}}


def _modules(seed: int = 0):
    torch.manual_seed(seed)
    encoder = DINOv2Encoder(**ENC_KW, trainable_blocks="all")
    decoder = MAEDecoder(encoder.embed_dim, encoder.patch_size, hidden_size=32, num_layers=1, num_heads=4)
    return encoder, decoder


def _structured_data(n_batches: int, batch: int = 4):
    """Two fixed smooth images (and their binary "masks"), repeated: the masked patches are predictable."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, SIZE), torch.linspace(-1, 1, SIZE), indexing="ij")
    image = torch.stack([xx, yy, xx * yy])
    mask = ((xx**2 + yy**2) < 0.4).float().expand(3, -1, -1)
    pair = torch.stack([image, mask * 2 - 1])
    return [{"image": pair.repeat(batch // 2, 1, 1, 1), "domain": torch.tensor([0, 1] * (batch // 2))}] * n_batches


def test_random_masking_per_sample():
    torch.manual_seed(0)
    ids_keep, mask, ids_restore = random_masking(6, 16, 0.75)
    assert ids_keep.shape == (6, 4) and mask.shape == (6, 16) and ids_restore.shape == (6, 16)
    assert bool((mask.sum(1) == 12).all())
    for b in range(6):
        assert bool((mask[b, ids_keep[b]] == 0).all())
    assert len({tuple(sorted(row.tolist())) for row in ids_keep}) > 1  # a different subset per sample
    # ids_restore undoes the shuffle: [visible..., removed...] -> raster order
    shuffled = torch.cat([ids_keep, torch.stack([torch.nonzero(m).flatten() for m in mask])], dim=1)
    torch.testing.assert_close(torch.gather(shuffled, 1, ids_restore).sort(1).values, torch.arange(16).expand(6, 16))


@parameterized.expand([(0.0,), (1.0,), (0.99,), (True,)])
def test_random_masking_invalid_ratio(ratio):
    with pytest.raises(ValueError, match="mask_ratio"):
        random_masking(2, 16, ratio)


def test_encode_visible_all_kept_matches_encoder():
    encoder, _ = _modules()
    x = torch.randn(2, 3, SIZE, SIZE)
    feats = encoder(x)
    ids = torch.arange(4).expand(2, 4)
    tokens, pooled = encode_visible(encoder, x, ids, return_pooled=True)
    prefix = encoder.vit.num_prefix_tokens
    final = tokens[:, prefix:].reshape(2, 2, 2, -1).permute(0, 3, 1, 2)
    torch.testing.assert_close(final, feats.final, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, feats.pooled, atol=1e-5, rtol=1e-5)
    # a subset keeps the prefix tokens plus the listed patches
    tokens, pooled = encode_visible(encoder, x, ids[:, :1])
    assert tokens.shape == (2, prefix + 1, encoder.embed_dim) and pooled is None


def test_decoder_unshuffles():
    _, decoder = _modules()
    decoder.eval()
    tokens = torch.randn(1, 1 + 4, decoder.in_channels)
    out = decoder(tokens, torch.arange(4)[None], (2, 2))
    assert out.shape == (1, 4, 14 * 14 * 3)
    perm = torch.tensor([2, 0, 3, 1])
    shuffled = torch.cat([tokens[:, :1], tokens[:, 1:][:, perm]], dim=1)
    torch.testing.assert_close(decoder(shuffled, torch.argsort(perm)[None], (2, 2)), out, atol=1e-5, rtol=1e-5)


@parameterized.expand(
    [
        ({"hidden_size": 30, "num_heads": 4}, "hidden_size"),
        ({"hidden_size": 34, "num_heads": 2}, "multiple of 4"),
        ({"num_layers": 0}, "num_layers"),
        ({"mlp_ratio": 0}, "mlp_ratio"),
        ({"patch_size": 0}, "patch_size"),
    ]
)
def test_decoder_invalid_arguments(kwargs, name):
    args = {"in_channels": 8, "patch_size": 14, **kwargs}
    with pytest.raises(ValueError, match=name):
        MAEDecoder(**args)


def test_loss_falls_and_export_loads_into_stage2(tmp_path):
    encoder, decoder = _modules()
    initial = {k: v.clone() for k, v in encoder.vit.state_dict().items()}
    optimizer = torch.optim.AdamW(encoder.trainable_parameters() + list(decoder.parameters()), lr=1e-3)
    path = tmp_path / "encoder_stage1.pt"
    handlers = [EncoderExportHandler(path=path)]
    data = _structured_data(30)
    trainer = MAEPretrainer("cpu", 1, data, encoder, decoder, optimizer, ema=EMAConfig(0.5), train_handlers=handlers)
    losses: list[float] = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(e.state.output["loss_mae"]))
    trainer.run()
    assert set(trainer.state.output) == {"loss", "loss_mae", "loss_dispersive"}
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.85 * first, (first, last)  # about 1.05 -> 0.79 with this seed

    # the export is the EMA encoder in timm layout: no decoder keys, strict load into the encoder and Stage-2's net
    export = torch.load(path, map_location="cpu", weights_only=True)
    assert set(export) == set(initial)
    assert any(not torch.equal(export[k], initial[k]) for k in export)
    torch.testing.assert_close(export, dict(trainer.ema_encoder.vit.state_dict()))
    loaded = DINOv2Encoder(pretrained=str(path), **ENC_KW).vit.state_dict()
    net = SpectraFlowNet(pretrained=str(path), img_size=SIZE, encoder_kwargs={"depth": DEPTH})
    for key, value in export.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)
        torch.testing.assert_close(net.encoder.vit.state_dict()[key], value, rtol=0, atol=0, msg=key)
    assert trainer.checkpoint_dict()["head"] is decoder is trainer.decoder


def test_dispersive_term_optional():
    encoder, decoder = _modules()
    optimizer = torch.optim.AdamW(encoder.trainable_parameters() + list(decoder.parameters()), lr=1e-3)
    trainer = MAEPretrainer(
        "cpu", 1, _structured_data(1), encoder, decoder, optimizer, dispersive=DispersiveConfig(weight=0.4)
    )
    trainer.run()
    out = trainer.state.output
    assert out["loss_dispersive"] != 0.0
    assert out["loss"] == pytest.approx(out["loss_mae"] + 0.4 * out["loss_dispersive"], rel=1e-5)


def test_invalid_trainer_arguments():
    encoder, decoder = _modules()
    optimizer = torch.optim.AdamW(decoder.parameters())
    with pytest.raises(ValueError, match="mae must be MAEConfig or None, got dict"):
        MAEPretrainer("cpu", 1, [], encoder, decoder, optimizer, mae={"mask_ratio": 0.5})
    with pytest.raises(ValueError, match="encoder"):
        MAEPretrainer("cpu", 1, [], torch.nn.Linear(2, 2), decoder, optimizer)
    from spectraflow_monai.losses import MAELoss

    with pytest.raises(ValueError, match="MAEConfig: loss.patch_size=16 differs"):
        MAEPretrainer("cpu", 1, [], encoder, decoder, optimizer, mae=MAEConfig(loss=MAELoss(patch_size=16)))
    # one 14x14 image is a single patch: nothing can be both visible and removed
    trainer = MAEPretrainer("cpu", 1, [{"image": torch.randn(2, 3, 14, 14)}], encoder, decoder, optimizer)
    with pytest.raises(ValueError, match="mask_ratio"):
        trainer.run()
