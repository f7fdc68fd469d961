"""The predictive entropy under test-time flips (``spectraflow_monai.metrics.uncertainty``)."""

from __future__ import annotations

import math

import pytest
import torch

from spectraflow_monai.metrics import FLIPS_2D, FlipEntropy, compute_flip_entropy


@pytest.mark.parametrize(
    "probs,sigmoid,expected",
    [
        (torch.zeros(4, 2, 1, 5, 5), True, [0.0, 0.0]),  # certain background under every flip
        (torch.ones(4, 2, 1, 5, 5), True, [0.0, 0.0]),  # certain foreground
        (torch.full((4, 2, 1, 5, 5), 0.5), True, [1.0, 1.0]),  # a coin toss everywhere
        (torch.full((4, 1, 3, 5, 5), 1 / 3), False, [1.0]),  # softmax: uniform over 3 classes
        (torch.cat([torch.zeros(2, 1, 1, 4, 4), torch.ones(2, 1, 1, 4, 4)]), True, [1.0]),  # certain flips disagree
    ],
)
def test_entropy_bounds(probs, sigmoid, expected):
    assert compute_flip_entropy(probs, sigmoid=sigmoid).tolist() == pytest.approx(expected, abs=1e-6)


def test_entropy_is_the_pixel_mean_of_the_normalised_entropy():
    p = torch.tensor([0.1, 0.5, 0.9, 1.0]).view(1, 1, 1, 2, 2)
    h = [-(x * math.log(x) + (1 - x) * math.log(1 - x)) / math.log(2) if 0 < x < 1 else 0.0 for x in p.flatten().tolist()]
    assert compute_flip_entropy(p, sigmoid=True).item() == pytest.approx(sum(h) / 4, rel=1e-6)


@pytest.mark.parametrize(
    "probs,sigmoid,match",
    [(torch.zeros(2, 3, 4), True, "spatial"), (torch.zeros(2, 1, 1, 4, 4), False, "2 classes")],
)
def test_entropy_refuses_bad_input(probs, sigmoid, match):
    with pytest.raises(ValueError, match=match):
        compute_flip_entropy(probs, sigmoid=sigmoid)


class _LeftHalf(torch.nn.Module):
    """Logits +10 in the left half of the image whatever it shows: every flip that mirrors the width disagrees."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.full((x.shape[0], 1, *x.shape[2:]), -10.0)
        out[..., : x.shape[-1] // 2] = 10.0
        return out


class _Threshold(torch.nn.Module):
    """A pixel-wise network (equivariant to flips): logits from the image's first channel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 20.0 * (x[:, :1] - 0.5)


def test_flips_agreeing_give_zero_and_disagreeing_give_one():
    images = torch.rand(3, 3, 8, 8).round()
    assert FlipEntropy(_Threshold(), sigmoid=True)(images).tolist() == pytest.approx([0.0] * 3, abs=1e-3)
    # identity and the vertical flip say "left", the two width flips say "right": every pixel is a coin toss
    assert FlipEntropy(_LeftHalf(), sigmoid=True)(images).tolist() == pytest.approx([1.0] * 3, abs=1e-3)
    assert FlipEntropy(_LeftHalf(), sigmoid=True, flips=[()])(images).tolist() == pytest.approx([0.0] * 3, abs=1e-3)


def test_uncertain_images_rank_first_and_batching_does_not_change_scores():
    torch.manual_seed(0)
    images = torch.rand(5, 3, 8, 8)
    images[2] = 0.5  # every logit 0: the least sure image
    full = FlipEntropy(_Threshold(), sigmoid=True, batch_size=8)(images)
    assert int(full.argmax()) == 2 and full[2].item() == pytest.approx(1.0)
    assert FlipEntropy(_Threshold(), sigmoid=True, batch_size=2)(images).tolist() == pytest.approx(full.tolist())


def test_softmax_network_and_one_pass_of_four_flips():
    calls = []

    def network(x):
        calls.append(x.shape[0])
        return torch.zeros(x.shape[0], 4, *x.shape[2:])  # uniform over 4 classes

    assert FlipEntropy(network, batch_size=3)(torch.rand(3, 3, 6, 6)).tolist() == pytest.approx([1.0] * 3)
    assert calls == [3 * len(FLIPS_2D)]  # four channels: a softmax, without being told


def test_pixel_sum_weights_by_pixels():
    total, pixels = FlipEntropy(_Threshold(), sigmoid=True).pixel_sum(torch.full((2, 3, 4, 5), 0.5))
    assert pixels == 40 and total == pytest.approx(40.0)


@pytest.mark.parametrize(
    "kwargs,match", [({"flips": []}, "flips"), ({"flips": [(1,)]}, "spatial"), ({"batch_size": 0}, "batch_size")]
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FlipEntropy(_Threshold(), sigmoid=True, **kwargs)


def test_images_must_be_a_2d_batch():
    with pytest.raises(ValueError, match="images"):
        FlipEntropy(_Threshold(), sigmoid=True)(torch.zeros(3, 8, 8))
