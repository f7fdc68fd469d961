import pytest
import torch
from parameterized import parameterized

from spectraflow_monai.networks import SpectraFlowNet
from spectraflow_monai.networks.blocks import FUSION_MODES, REFINE_MODES

TINY = {"depth": 2}  # shapes do not depend on depth: keep the suite fast

SHAPE_CASES = [
    [size, batch, out]
    for size in [(224, 224), (448, 448), (224, 168)]
    for batch in [1, 4]
    for out in [1, 9]
]


class TestSpectraFlowNet:
    @parameterized.expand(SHAPE_CASES)
    def test_shapes(self, size, batch, out_channels):
        net = SpectraFlowNet(out_channels=out_channels, encoder_kwargs=TINY).eval()
        with torch.no_grad():
            logits, gate = net(torch.randn(batch, 3, *size), return_gate=True)
        assert logits.shape == (batch, out_channels, *size)
        assert gate.shape == (batch, 96, size[0] // 14 * 2, size[1] // 14 * 2)

    def test_full_depth_vit_s(self):
        net = SpectraFlowNet(out_channels=1).eval()
        assert net.encoder.depth == 12 and net.encoder.embed_dim == 384
        with torch.no_grad():
            assert net(torch.randn(1, 3, 224, 224)).shape == (1, 1, 224, 224)

    @parameterized.expand([[f, r] for f in FUSION_MODES for r in REFINE_MODES])
    def test_ablation_switches_train_step(self, fusion, refine):
        net = SpectraFlowNet(out_channels=2, fusion=fusion, refine=refine, img_size=56, encoder_kwargs=TINY)
        net.train()
        x = torch.randn(2, 3, 56, 56)
        logits, gate = net(x, return_gate=True)
        assert logits.shape == (2, 2, 56, 56)
        assert (gate is not None) == (fusion == "daf")
        logits.square().mean().backward()
        decoder_grads = [p.grad for p in net.decoder.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in decoder_grads)
        has_fdconv = any(type(m).__name__ == "FDConv2d" for m in net.modules())
        assert has_fdconv == refine.startswith("fdconv")

    def test_one_channel_input_is_repeated(self):
        net = SpectraFlowNet(in_channels=1, out_channels=9, img_size=28, encoder_kwargs=TINY).eval()
        x = torch.randn(2, 1, 28, 28)
        with torch.no_grad():
            a = net(x)
            rgb = net.decoder(*net.encoder(x.repeat(1, 3, 1, 1))[:2], output_size=(28, 28))[0]
        assert a.shape == (2, 9, 28, 28)
        torch.testing.assert_close(a, rgb)

    @parameterized.expand([[0, 0], ["frozen", 0], [1, 1], [2, 2], ["all", 2], [-1, 2]])
    def test_trainable_blocks(self, mode, n_trainable_blocks):
        net = SpectraFlowNet(trainable_blocks=mode, img_size=28, encoder_kwargs=TINY)
        vit = net.encoder.vit
        trainable = {n for n, p in net.encoder.named_parameters() if p.requires_grad}
        depth = len(vit.blocks)
        for i, blk in enumerate(vit.blocks):
            expect = i >= depth - n_trainable_blocks
            assert all(p.requires_grad == expect for p in blk.parameters()), (mode, i)
        assert all(p.requires_grad for p in net.decoder.parameters())
        if n_trainable_blocks == 0:
            assert not trainable
        assert all(p.requires_grad == (n_trainable_blocks > 0) for p in vit.norm.parameters())

    def test_decoder_reads_encoder_width(self):
        net = SpectraFlowNet(encoder="vit_base_patch14_dinov2", img_size=28, encoder_kwargs=TINY)
        assert net.encoder.embed_dim == 768
        assert net.decoder.project.conv.in_channels == 768
        assert net.decoder.skip_project.conv.in_channels == 768

    def test_trace(self):
        net = SpectraFlowNet(out_channels=2, img_size=56, encoder_kwargs=TINY).eval()
        x = torch.randn(1, 3, 56, 56)
        with torch.no_grad():
            traced = torch.jit.trace(net, x, check_trace=False)
            torch.testing.assert_close(traced(x), net(x))

    @parameterized.expand(
        [
            [{"in_channels": 2}, "in_channels"],
            [{"out_channels": 0}, "out_channels"],
            [{"fusion": "sum"}, "fusion"],
            [{"refine": "fdconv2"}, "refine"],
            [{"encoder": "resnet50"}, "resnet50"],
            [{"decoder_channels": ()}, "decoder_channels"],
        ]
    )
    def test_bad_args(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            SpectraFlowNet(img_size=28, encoder_kwargs=TINY, **kwargs)

    def test_bad_input(self):
        net = SpectraFlowNet(img_size=28, encoder_kwargs=TINY).eval()
        with pytest.raises(ValueError, match="14"):
            net(torch.randn(1, 3, 30, 28))
        with pytest.raises(ValueError, match=r"\(1, 1, 28, 28\)"):
            net(torch.randn(1, 1, 28, 28))
