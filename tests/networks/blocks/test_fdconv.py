"""Tests of FDConv2d (Chen et al., "Frequency Dynamic Convolution for Dense Image Prediction", CVPR 2025)."""

from __future__ import annotations

import unittest
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from parameterized import parameterized

from spectraflow_monai.networks import FDConv2d as FDConv2dFromNetworks
from spectraflow_monai.networks.blocks import FDConv2d, FDConvConfig
from spectraflow_monai.networks.blocks.frequency import FrequencyBandModulation
from spectraflow_monai.networks.blocks.frequency import rfft2_frequency_order


def _perturb(module: nn.Module, std: float = 0.3, seed: int = 0) -> None:
    """Give every zero-initialised parameter (the attention heads) random values, so the layer becomes dynamic."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            if not param.abs().gt(0).any():
                param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * std)


def _official_sorted_coords(n_rows: int, n_cols: int) -> torch.Tensor:
    """Reference of the official ``get_fft2freq(n_rows, n_cols, use_rfft=True)``: float32 grid, L2 radius over the
    stacked (f_h, f_w) dimension, ``torch.sort`` with its default (not stable) order, flat index -> (row, column)."""
    freq_h, freq_w = torch.fft.fftfreq(n_rows), torch.fft.rfftfreq(n_cols)
    freq_hw = torch.stack(torch.meshgrid(freq_h, freq_w, indexing="ij"), dim=-1)
    dist = torch.norm(freq_hw, dim=-1)
    _, indices = torch.sort(dist.view(-1))
    width = n_cols // 2 + 1
    return torch.stack([indices // width, indices % width], dim=-1).permute(1, 0)


def _np_band_ids(n_rows: int, n_cols: int, kernel_num: int) -> np.ndarray:
    """Band of every rfft2 bin: the official sorted coordinates reshaped to (2, kernel_num, N / kernel_num)."""
    coords = _official_sorted_coords(n_rows, n_cols).reshape(2, kernel_num, -1).numpy()
    bands = np.empty((n_rows, n_cols // 2 + 1), dtype=np.int64)
    for band in range(kernel_num):
        bands[coords[0, band], coords[1, band]] = band
    return bands


def _np_kernel_to_matrix(weight: np.ndarray) -> np.ndarray:
    """(Cout, Cin, k, k) -> (Cout*k, Cin*k) with M[o*k + p, i*k + q] = W[o, i, p, q]."""
    cout, cin, k, _ = weight.shape
    matrix = np.zeros((cout * k, cin * k), dtype=weight.dtype)
    for p in range(k):
        for q in range(k):
            matrix[p::k, q::k] = weight[:, :, p, q]
    return matrix


def _np_matrix_to_kernel(matrix: np.ndarray, cout: int, cin: int, k: int) -> np.ndarray:
    weight = np.zeros((cout, cin, k, k), dtype=matrix.dtype)
    for p in range(k):
        for q in range(k):
            weight[:, :, p, q] = matrix[p::k, q::k]
    return weight


def _official_fbm_masks(height: int, width: int, k_list) -> np.ndarray:
    """Reference of the official FBM masks on the rfft grid (len(k_list), height, width // 2 + 1): float32 L-infinity
    box max(|f_h|, |f_w|) < 0.5 / k + 1e-8 on the rfft grid of 64x64, nearest-interpolated to (height, width//2+1)."""
    freq_hw = torch.stack(torch.meshgrid(torch.fft.fftfreq(64), torch.fft.rfftfreq(64), indexing="ij"), dim=-1)
    linf = freq_hw.abs().max(dim=-1)[0]
    masks = torch.stack([linf < 0.5 / k + 1e-8 for k in k_list], dim=0).unsqueeze(1)
    resized = F.interpolate(masks.float(), size=(height, width // 2 + 1), mode="nearest")
    return resized[:, 0].double().numpy()


EQUIVALENCE_CASES = [
    # cin, cout, k, stride, dilation, bias, padding_mode, batch, (H, W), dynamic
    (24, 32, 3, 1, 1, True, "zeros", 3, (12, 10), True),
    (20, 20, 3, 2, 1, False, "zeros", 1, (9, 11), True),
    (17, 36, 1, 1, 1, True, "zeros", 3, (8, 8), True),  # Cin*k odd
    (32, 24, 3, 1, 2, True, "reflect", 1, (7, 9), True),
    (8, 8, 3, 1, 1, True, "zeros", 2, (6, 6), False),  # small channels: plain convolution
]


class TestFDConv2dEquivalence(unittest.TestCase):
    @parameterized.expand(EQUIVALENCE_CASES)
    def test_matches_static_convolution(self, cin, cout, k, stride, dilation, bias, padding_mode, batch, size, dynamic):
        torch.manual_seed(0)
        conv = nn.Conv2d(cin, cout, k, stride, dilation * (k // 2), dilation, bias=bias, padding_mode=padding_mode)
        converted = FDConv2d.from_conv2d(conv)
        fresh = FDConv2d(cin, cout, k, stride, dilation=dilation, bias=bias, padding_mode=padding_mode)
        self.assertEqual(converted.dynamic, dynamic)
        self.assertEqual(fresh.dynamic, dynamic)
        x = torch.randn(batch, cin, *size)
        np.testing.assert_allclose(converted.static_weight().detach(), conv.weight.detach(), atol=1e-6)
        for training in (True, False):
            converted.train(training)
            fresh.train(training)
            conv.train(training)
            with torch.no_grad():
                np.testing.assert_allclose(converted(x), conv(x), atol=1e-5, rtol=1e-5)
                static = fresh.static_weight()
                expected = F.conv2d(
                    (
                        F.pad(x, fresh._reversed_padding_repeated_twice, mode=padding_mode)
                        if padding_mode != "zeros"
                        else x
                    ),
                    static,
                    fresh.bias,
                    stride,
                    0 if padding_mode != "zeros" else fresh.padding,
                    dilation,
                )
                out = fresh(x)
                self.assertEqual(out.shape, expected.shape)
                np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)

    @parameterized.expand(
        [
            # cin, cout, k, stride, padding, dilation, padding_mode, (H, W)
            (24, 32, 3, 1, None, 1, "zeros", (12, 10)),
            (20, 20, 3, 2, None, 1, "zeros", (9, 11)),
            (17, 36, 1, 1, None, 1, "zeros", (8, 8)),
            (32, 24, 3, 1, None, 2, "reflect", (7, 9)),
            (24, 24, 3, 2, 0, 1, "zeros", (9, 8)),
            (24, 24, 3, 1, "same", 2, "zeros", (7, 7)),
            (24, 24, 3, 1, "valid", 1, "circular", (6, 9)),
        ]
    )
    def test_batch_free_conv_matches_grouped(self, cin, cout, k, stride, padding, dilation, padding_mode, size):
        """The export form (shifted slices and a batched matrix product) computes the grouped convolution's sums,
        with random weights, at several batch sizes; a trace of it is not tied to the traced batch size."""
        torch.manual_seed(3)
        module = FDConv2d(cin, cout, k, stride, padding, dilation, padding_mode=padding_mode).eval()
        _perturb(module, std=0.2)
        with torch.no_grad():
            module.dft_weight.add_(0.05 * torch.randn_like(module.dft_weight))
        for batch in (1, 2, 5):
            x = torch.randn(batch, cin, *size)
            with torch.no_grad():
                module.batch_free_conv = False
                want = module(x)
                module.batch_free_conv = True
                got = module(x)
            self.assertEqual(got.shape, want.shape)
            np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scripted = torch.jit.script(module)
            traced = torch.jit.trace(module, torch.randn(2, cin, *size))  # the grouped form bakes groups=2 in
        with torch.no_grad():
            np.testing.assert_allclose(scripted(x), want, atol=2e-5, rtol=1e-5)
            np.testing.assert_allclose(traced(x), want, atol=2e-5, rtol=1e-5)

    def test_float64_roundtrip_is_exact(self):
        torch.manual_seed(1)
        conv = nn.Conv2d(20, 24, 3, padding=1).double()
        module = FDConv2d.from_conv2d(conv)
        self.assertEqual(module.dft_weight.dtype, torch.float64)
        x = torch.randn(2, 20, 8, 8, dtype=torch.float64)
        with torch.no_grad():
            np.testing.assert_allclose(module.static_weight(), conv.weight, atol=1e-13)
            np.testing.assert_allclose(module(x), conv(x), atol=1e-11)

    def test_from_fdconv_and_defaults(self):
        source = FDConv2d(20, 24)  # default padding keeps the size
        self.assertEqual(source.padding, (1, 1))
        self.assertEqual(FDConv2d(20, 24, dilation=2).padding, (2, 2))
        copy = FDConv2d.from_conv2d(source, FDConvConfig(kernel_num=2)).eval()
        self.assertEqual(copy.kernel_num, 2)
        self.assertFalse(copy.training)
        x = torch.randn(1, 20, 6, 6)
        with torch.no_grad():
            np.testing.assert_allclose(copy(x), source(x), atol=1e-5)

    def test_reset_parameters_restores_static_behaviour(self):
        module = FDConv2d(20, 24)
        _perturb(module)
        module.reset_parameters()
        self.assertNotIn("weight", dict(module.named_parameters()))
        x = torch.randn(2, 20, 6, 6)
        with torch.no_grad():
            np.testing.assert_allclose(
                module(x), F.conv2d(x, module.static_weight(), module.bias, padding=1), atol=1e-5
            )


class TestFourierDisjointWeight(unittest.TestCase):
    def test_parameters_and_bands(self):
        torch.manual_seed(2)
        cin, cout, k, kernel_num = 20, 24, 3, 4
        conv = nn.Conv2d(cin, cout, k, padding=1)
        module = FDConv2d.from_conv2d(conv, FDConvConfig(kernel_num=kernel_num))
        names = dict(module.named_parameters())
        self.assertNotIn("weight", names)
        self.assertNotIn("weight", module.state_dict())
        self.assertNotIn("band_index", module.state_dict())
        self.assertEqual(tuple(module.dft_weight.shape), (cout * k, cin * k // 2 + 1, 2))
        # FDW transform: rfft2 of the (Cout*k, Cin*k) rearranged kernel, divided by min(Cin, Cout) // 2
        spectrum = np.fft.rfft2(_np_kernel_to_matrix(conv.weight.detach().double().numpy())) / (min(cin, cout) // 2)
        np.testing.assert_allclose(module.dft_weight[..., 0].detach(), spectrum.real, atol=1e-5)
        np.testing.assert_allclose(module.dft_weight[..., 1].detach(), spectrum.imag, atol=1e-5)
        # disjoint, equally sized radial bands, low to high
        bands = module.band_index.numpy()
        np.testing.assert_array_equal(bands, _np_band_ids(cout * k, cin * k, kernel_num))
        self.assertEqual(np.bincount(bands.ravel()).tolist(), [bands.size // kernel_num] * kernel_num)
        radius = np.sqrt(np.fft.fftfreq(cout * k)[:, None] ** 2 + np.fft.rfftfreq(cin * k)[None, :] ** 2)
        for band in range(kernel_num - 1):
            self.assertLessEqual(radius[bands == band].max(), radius[bands == band + 1].min())

    @parameterized.expand([(24, 24, 3, 4), (32, 32, 3, 8), (36, 17, 1, 4), (32, 24, 3, 4)])
    def test_band_order_matches_official_sort(self, cout, cin, k, kernel_num):
        """Bands = official float32 radii sorted by torch.sort's default (not stable) order, ties included."""
        module = FDConv2d(cin, cout, k, config=FDConvConfig(kernel_num=kernel_num))
        reference = _official_sorted_coords(cout * k, cin * k)
        self.assertTrue(torch.equal(rfft2_frequency_order(cout * k, cin * k), reference))
        self.assertTrue(torch.equal(module.band_index, torch.from_numpy(_np_band_ids(cout * k, cin * k, kernel_num))))

    def test_kernel_attention_selects_frequency_band(self):
        """W_eff = F^-1(a(f) * W~): with a = (2, 0, 0, 0) the kernel is twice the lowest-band part of the weight."""
        torch.manual_seed(3)
        cin, cout, k = 20, 24, 3
        conv = nn.Conv2d(cin, cout, k, padding=1, bias=False)
        module = FDConv2d.from_conv2d(conv, FDConvConfig(use_fbm=False, use_ksm_local=False))
        with torch.no_grad():
            module.ksm_global.kernel_fc.bias.copy_(torch.tensor([40.0, -40.0, -40.0, -40.0]))
        matrix = _np_kernel_to_matrix(conv.weight.detach().double().numpy())
        spectrum = np.fft.rfft2(matrix) * (_np_band_ids(cout * k, cin * k, 4) == 0)
        expected_weight = 2.0 * _np_matrix_to_kernel(np.fft.irfft2(spectrum, s=matrix.shape), cout, cin, k)
        x = torch.randn(2, cin, 7, 7)
        expected = F.conv2d(x, torch.from_numpy(expected_weight).float(), padding=1)
        with torch.no_grad():
            np.testing.assert_allclose(module(x), expected, atol=1e-5)
            self.assertGreater((module(x) - conv(x)).abs().max().item(), 1e-2)

    def test_load_plain_conv_state_dict(self):
        torch.manual_seed(4)
        conv = nn.Conv2d(20, 24, 3, padding=1)
        module = FDConv2d(20, 24)
        result = module.load_state_dict(conv.state_dict(), strict=False)  # the attention heads keep their init
        self.assertEqual(result.unexpected_keys, [])
        self.assertTrue(result.missing_keys and all(key.startswith(("ksm_", "fbm.")) for key in result.missing_keys))
        x = torch.randn(1, 20, 6, 6)
        with torch.no_grad():
            np.testing.assert_allclose(module(x), conv(x), atol=1e-5)
        with self.assertRaisesRegex(RuntimeError, "weight"):
            module.load_state_dict(nn.Conv2d(20, 20, 3).state_dict(), strict=False)
        plain = FDConv2d(8, 8)  # no attention heads: a plain conv state dict loads strictly
        plain.load_state_dict(nn.Conv2d(8, 8, 3).state_dict())


class TestKernelSpatialModulation(unittest.TestCase):
    def test_channel_filter_spatial_attention(self):
        torch.manual_seed(5)
        cin, cout = 20, 24
        conv = nn.Conv2d(cin, cout, 3, padding=1)
        module = FDConv2d.from_conv2d(conv, FDConvConfig(use_fbm=False, use_ksm_local=False, kernel_num=1))
        bc, bf, bs = torch.randn(cin), torch.randn(cout), torch.randn(9)
        with torch.no_grad():
            head = module.ksm_global
            head.channel_fc.bias.copy_(bc)
            head.filter_fc.bias.copy_(bf)
            head.spatial_fc.bias.copy_(bs)
        weight = (
            conv.weight.detach()
            * (2 * torch.sigmoid(bf))[:, None, None, None]
            * (2 * torch.sigmoid(bc))[None, :, None, None]
            * (2 * torch.sigmoid(bs)).reshape(1, 1, 3, 3)
        )
        x = torch.randn(2, cin, 6, 5)
        with torch.no_grad():
            np.testing.assert_allclose(module(x), F.conv2d(x, weight, conv.bias, padding=1), atol=1e-5)

    def test_local_modulation_layout(self):
        """Centre-tap Conv1d weights c[(o, p, q)] give the kernel W[o, i, p, q] * 2 sigmoid(c * LN(gap)_i)."""
        torch.manual_seed(6)
        cin, cout, k = 20, 24, 3
        conv = nn.Conv2d(cin, cout, k, padding=1)
        module = FDConv2d.from_conv2d(conv, FDConvConfig(use_fbm=False))
        local_conv = module.ksm_local.conv
        centre = local_conv.kernel_size[0] // 2
        taps = torch.randn(cout * k * k)
        with torch.no_grad():
            local_conv.weight[:, 0, centre] = taps
        x = torch.randn(2, cin, 6, 6)
        pooled = x.double().mean(dim=(2, 3)).numpy()
        normed = (pooled - pooled.mean(1, keepdims=True)) / np.sqrt(pooled.var(1, keepdims=True) + 1e-5)
        c = taps.double().numpy().reshape(cout, k, k)
        for b in range(2):
            logits = c[:, None, :, :] * normed[b][None, :, None, None]  # (Cout, Cin, k, k)
            weight = conv.weight.detach().double().numpy() * 2.0 / (1.0 + np.exp(-logits))
            expected = F.conv2d(x[b : b + 1].double(), torch.from_numpy(weight), conv.bias.double(), padding=1)
            with torch.no_grad():
                np.testing.assert_allclose(module(x)[b : b + 1], expected, atol=1e-5)

    def test_samples_are_independent_and_dynamic(self):
        torch.manual_seed(7)
        module = FDConv2d(20, 24).train()
        _perturb(module, std=0.2)
        x = torch.randn(3, 20, 8, 8)
        with torch.no_grad():
            out = module(x)
            for b in range(3):
                np.testing.assert_allclose(out[b : b + 1], module(x[b : b + 1]), atol=1e-5)
            static = F.conv2d(x, module.static_weight(), module.bias, padding=1)
            self.assertGreater((out - static).abs().max().item(), 1e-2)

    def test_gradients_reach_all_parameters(self):
        torch.manual_seed(8)
        module = FDConv2d(20, 24)
        x = torch.randn(2, 20, 8, 8)
        module(x).square().mean().backward()  # at init: frequency weights and every head get gradients
        for name in (
            "dft_weight",
            "bias",
            "ksm_global.kernel_fc.weight",
            "ksm_global.filter_fc.weight",
            "ksm_global.channel_fc.weight",
            "ksm_global.spatial_fc.weight",
            "ksm_local.conv.weight",
            "fbm.gain_conv.weight",
        ):
            grad = dict(module.named_parameters())[name].grad
            self.assertTrue(grad is not None and grad.abs().sum() > 0, name)
        module.zero_grad()
        _perturb(module, std=0.2)
        module(x).square().mean().backward()
        for name, param in module.named_parameters():
            self.assertTrue(param.grad is not None and torch.isfinite(param.grad).all(), name)
            self.assertGreater(param.grad.abs().sum().item(), 0, name)


class TestFrequencyBandModulation(unittest.TestCase):
    def test_identity_at_init(self):
        fbm = FrequencyBandModulation(4)
        x = torch.randn(2, 4, 9, 12)
        self.assertTrue(torch.equal(fbm(x), x))

    @parameterized.expand([((16, 10),), ((7, 9),), ((1, 1),)])
    def test_band_gains_match_reference(self, size):
        """Constant gains g_i (bias only): FBM = F^-1(G * F(x)) with G = g_i on ring i and 1 on the lowest band."""
        torch.manual_seed(9)
        k_list = (2, 4, 8)
        fbm = FrequencyBandModulation(3, k_list)
        bias = torch.tensor([0.7, -1.2, 2.0])
        with torch.no_grad():
            fbm.gain_conv.bias.copy_(bias)
        gains = (2 * torch.sigmoid(bias)).double().numpy()
        masks = _official_fbm_masks(*size, k_list)
        response = masks[-1].copy()
        outer = np.ones_like(masks[0])
        for gain, mask in zip(gains, masks):
            response += gain * (outer - mask)
            outer = mask
        x = torch.randn(2, 3, *size)
        spectrum = torch.fft.rfft2(x.double(), norm="ortho") * torch.from_numpy(response)
        expected = torch.fft.irfft2(spectrum, s=size, norm="ortho").numpy()
        with torch.no_grad():
            np.testing.assert_allclose(fbm(x), expected, atol=1e-5)

    def test_spatial_gains_match_band_form(self):
        torch.manual_seed(10)
        fbm = FrequencyBandModulation(3)
        _perturb(fbm)
        x = torch.randn(2, 3, 12, 10)
        with torch.no_grad():
            gains = (2 * torch.sigmoid(fbm.gain_conv(x))).double().numpy()
            out = fbm(x)
        spectrum = torch.fft.rfft2(x.double(), norm="ortho")
        previous, expected = x.double().numpy(), 0.0
        for idx, mask in enumerate(_official_fbm_masks(12, 10, (2, 4, 8))):
            low = torch.fft.irfft2(spectrum * torch.from_numpy(mask), s=(12, 10), norm="ortho").numpy()
            expected = expected + gains[:, idx : idx + 1] * (previous - low)
            previous = low
        np.testing.assert_allclose(out, expected + previous, atol=1e-5)
        masks = fbm.masks(12, 10).numpy()
        self.assertEqual(masks.shape, (3, 12, 6))
        np.testing.assert_array_equal(masks, _official_fbm_masks(12, 10, (2, 4, 8)))

    @parameterized.expand([((64, 64),), ((32, 32),)])
    def test_kept_bins_match_official_rule(self, size):
        """Official float32 edge rule: |f| = 0.5 / k bins are kept for k = 4, 8 (0.5 / k + 1e-8 rounds above the
        edge) and dropped for k = 2 (0.25 + 1e-8 rounds to 0.25); masks nearest-resized from the 64x64 grid."""
        self.assertFalse(bool(torch.tensor(0.25) < 0.5 / 2 + 1e-8))
        self.assertTrue(bool(torch.tensor(0.125) < 0.5 / 4 + 1e-8))
        self.assertTrue(bool(torch.tensor(0.0625) < 0.5 / 8 + 1e-8))
        fbm = FrequencyBandModulation(3, (2, 4, 8))
        masks = fbm.masks(*size).numpy()
        reference = _official_fbm_masks(*size, (2, 4, 8))
        self.assertEqual(masks.sum(axis=(1, 2)).tolist(), reference.sum(axis=(1, 2)).tolist())
        np.testing.assert_array_equal(masks, reference)
        if size == (64, 64):  # rows |f_h| <= 1/8 (17) x columns <= 1/8 (9); rows < 1/4 (31) x columns < 1/4 (16)
            self.assertEqual(masks.sum(axis=(1, 2)).tolist(), [31 * 16, 17 * 9, 9 * 5])


class TestFDConv2dExecution(unittest.TestCase):
    def test_autocast_bfloat16(self):
        torch.manual_seed(11)
        module = FDConv2d(20, 24)
        _perturb(module, std=0.2)
        x = torch.randn(2, 20, 8, 8)
        with torch.no_grad():
            reference = module(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = module(x)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertTrue(torch.isfinite(out).all())
        self.assertLess(((out.float() - reference).abs().max() / reference.abs().max()).item(), 3e-2)

    @parameterized.expand(
        [["dynamic", 20, torch.float32], ["dynamic_bf16_input", 20, torch.bfloat16], ["static", 8, torch.float32]]
    )
    def test_fft_path_float32_under_cpu_bf16_autocast(self, _, channels, in_dtype):
        """The kernel synthesis (irfft2) and the FBM (rfft / ifft) run with autocast off and in float32 inside a
        bfloat16 autocast region; the output matches the float32 layer within bfloat16 tolerance."""
        torch.manual_seed(13)
        module = FDConv2d(channels, 24)
        _perturb(module, std=0.2)
        seen: list[tuple[str, bool, torch.dtype]] = []

        def spy(name, fn):
            def wrapper(*args, **kwargs):
                out = fn(*args, **kwargs)
                seen.append((name, torch.is_autocast_enabled("cpu"), out.dtype))
                return out

            return wrapper

        module._mixed_kernels = spy("kernels", module._mixed_kernels)
        if module.fbm is not None:
            module.fbm._modulate = spy("fbm", module.fbm._modulate)
        x = torch.randn(2, channels, 8, 8)
        with torch.no_grad():
            reference = module(x)
            seen.clear()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = module(x.to(in_dtype))
        names = {name for name, _, _ in seen}
        self.assertEqual(names, {"kernels", "fbm"} if module.dynamic else {"kernels"})
        for name, autocast_on, dtype in seen:
            self.assertFalse(autocast_on, f"{name} ran with autocast on")
            self.assertEqual(dtype, torch.float32, name)
        self.assertTrue(torch.isfinite(out).all())
        self.assertLess(((out.float() - reference).abs().max() / reference.abs().max()).item(), 3e-2)

    def test_trace_and_script(self):
        torch.manual_seed(12)
        module = FDConv2d(20, 24).eval()
        _perturb(module, std=0.2)
        x, other = torch.randn(2, 20, 8, 6), torch.randn(2, 20, 8, 6)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, x)
            scripted = torch.jit.script(module)
        with torch.no_grad():
            np.testing.assert_allclose(traced(other), module(other), atol=1e-6)
            np.testing.assert_allclose(scripted(other), module(other), atol=1e-6)
            bigger = torch.randn(3, 20, 5, 7)  # scripting is not tied to the input shape
            np.testing.assert_allclose(scripted(bigger), module(bigger), atol=1e-6)

    def test_exported_from_networks(self):
        self.assertIs(FDConv2dFromNetworks, FDConv2d)


class TestFDConv2dArguments(unittest.TestCase):
    @parameterized.expand(
        [
            ({"groups": 2}, "groups"),
            ({"kernel_size": 5}, "kernel_size"),
            ({"kernel_size": (1, 3)}, "kernel_size"),
            ({"config": FDConvConfig(kernel_num=7)}, r"kernel_num=7.*valid values.*\[1, 2, 3, 4, 6"),
            ({"config": {"kernel_num": 2}}, r"config must be an FDConvConfig or None, got dict"),
            ({"in_channels": 0}, "in_channels"),
        ]
    )
    def test_invalid_arguments(self, kwargs, message):
        args = {"in_channels": 24, "out_channels": 32, **kwargs}
        with self.assertRaisesRegex(ValueError, message):
            FDConv2d(**args)

    def test_kernel_num_not_checked_without_dynamic_part(self):
        self.assertFalse(FDConv2d(8, 8, config=FDConvConfig(kernel_num=7)).dynamic)

    def test_invalid_inputs(self):
        with self.assertRaisesRegex(TypeError, "nn.Conv2d"):
            FDConv2d.from_conv2d(nn.Linear(3, 3))
        with self.assertRaises(TypeError):  # the geometry comes from conv
            FDConv2d.from_conv2d(nn.Conv2d(20, 24, 3), in_channels=3)
        with self.assertRaisesRegex(ValueError, "config must be an FDConvConfig"):
            FDConv2d.from_conv2d(nn.Conv2d(20, 24, 3), {"kernel_num": 2})
        with self.assertRaisesRegex(ValueError, "groups"):
            FDConv2d.from_conv2d(nn.Conv2d(20, 24, 3, groups=4))
        with self.assertRaisesRegex(ValueError, "FDConv2d expects input"):
            FDConv2d(20, 24)(torch.randn(1, 3, 8, 8))



class TestFDConvConfig(unittest.TestCase):
    def test_defaults_are_the_official_ones(self):
        config = FDConvConfig()
        self.assertEqual((config.kernel_num, config.reduction, config.min_attention_channels), (4, 0.0625, 16))
        self.assertEqual((config.kernel_temperature, config.temperature), (1.0, None))
        self.assertEqual((config.use_ksm_local, config.use_fbm, config.fbm_k_list), (True, True, (2.0, 4.0, 8.0)))
        self.assertEqual(FDConv2d(20, 24).config, config)

    @parameterized.expand(
        [
            ({"kernel_num": 0}, r"kernel_num must be a positive int, got 0\."),
            ({"kernel_num": 2.0}, r"kernel_num must be a positive int, got 2.0\."),
            ({"kernel_num": True}, r"kernel_num must be a positive int, got True\."),
            ({"reduction": 0.0}, r"reduction must be a finite number > 0, got 0.0\."),
            ({"reduction": float("nan")}, r"reduction must be a finite number > 0, got nan\."),
            ({"min_attention_channels": -1}, r"min_attention_channels must be a non-negative int, got -1\."),
            ({"kernel_temperature": 0.0}, r"kernel_temperature must be a finite number > 0, got 0.0\."),
            ({"temperature": -1.0}, r"temperature must be None or a finite number > 0, got -1.0\."),
            ({"use_ksm_local": 1}, r"use_ksm_local must be True or False, got 1\."),
            ({"use_fbm": "no"}, r"use_fbm must be True or False, got 'no'\."),
            ({"fbm_k_list": (4, 2)}, r"fbm_k_list must be a non-empty, strictly increasing .*got \(4, 2\)\."),
            ({"fbm_k_list": ()}, r"fbm_k_list must be a non-empty, strictly increasing .*got \(\)\."),
            ({"fbm_k_list": ("a",)}, r"fbm_k_list must be a sequence of positive numbers, got \('a',\)\."),
        ]
    )
    def test_bad_values_are_named(self, kwargs, message):
        with self.assertRaisesRegex(ValueError, rf"^FDConvConfig: {message}$"):
            FDConvConfig(**kwargs)

    def test_frozen_hashable_and_numpy_values(self):
        config = FDConvConfig(kernel_num=np.int64(2), fbm_k_list=[2, 4])
        self.assertEqual(config.fbm_k_list, (2.0, 4.0))
        self.assertEqual(hash(config), hash(FDConvConfig(kernel_num=2, fbm_k_list=(2.0, 4.0))))
        with self.assertRaises(AttributeError):  # dataclasses.FrozenInstanceError
            config.kernel_num = 8
        self.assertEqual(FDConv2d(20, 24, config=config).kernel_num, 2)

    def test_options_reach_the_layer_and_keep_the_state_dict_keys(self):
        """The state dict keys of a default layer are the ones trained models hold; options only drop branches."""
        keys = set(FDConv2d(20, 24).state_dict())
        self.assertIn("dft_weight", keys)
        self.assertTrue(any(k.startswith("fbm.") for k in keys) and any(k.startswith("ksm_local.") for k in keys))
        config = FDConvConfig(use_fbm=False, use_ksm_local=False, temperature=2.0, kernel_temperature=0.5)
        module = FDConv2d(20, 24, config=config)
        self.assertIsNone(module.fbm)
        self.assertIsNone(module.ksm_local)
        self.assertEqual(module.ksm_global.kernel_temperature, 0.5)
        self.assertEqual(set(module.state_dict()), {k for k in keys if not k.startswith(("fbm.", "ksm_local."))})


if __name__ == "__main__":
    unittest.main()
