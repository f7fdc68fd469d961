"""The entropies under test-time augmentation (``spectraflow_monai.metrics.uncertainty``): the flip-averaged
predictive entropy and Wang et al.'s vote entropy."""

from __future__ import annotations

import math

import pytest
import torch

from spectraflow_monai.metrics import DIHEDRAL_2D, FLIPS_2D, FlipEntropy, TTAVoteEntropy
from spectraflow_monai.metrics import compute_flip_entropy, compute_vote_entropy


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


def _binary_entropy(f: float) -> float:
    return 0.0 if f in (0.0, 1.0) else -(f * math.log(f) + (1 - f) * math.log(1 - f)) / math.log(2)


@pytest.mark.parametrize(
    "votes,expected",
    [
        (torch.tensor([20.0, 0.0]).view(1, 2, 1, 1).expand(2, 2, 3, 3), [0.0, 0.0]),  # unanimous
        (torch.tensor([10.0, 10.0]).view(1, 2, 1, 1).expand(1, 2, 3, 3), [1.0]),  # an even split of two classes
        (torch.full((1, 3, 4, 4), 1 / 3), [1.0]),  # fractions: even over three classes
        (torch.tensor([5.0, 5.0, 0.0]).view(1, 3, 1), [math.log(2) / math.log(3)]),  # two of three classes
        (torch.tensor([3.0, 1.0]).view(1, 2, 1), [_binary_entropy(0.75)]),
        (torch.tensor([[1.0, 0.0], [1.0, 1.0]]).view(1, 2, 2, 1), [0.5]),  # the mean over the pixels
        (torch.tensor([4.0, 0.0]).view(1, 2, 1, 1, 1).expand(3, 2, 2, 4, 4), [0.0] * 3),  # (B, 2, C, H, W): sigmoid
    ],
)
def test_vote_entropy_known_histograms(votes, expected):
    out = compute_vote_entropy(votes)
    assert out.dtype == torch.float32 and out.tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "votes,match",
    [
        (torch.ones(2, 3), "spatial"),
        (torch.ones(2, 1, 4, 4), "2 classes"),
        (torch.tensor([1.0, -1.0]).view(1, 2, 1), "non-negative"),
        (torch.zeros(1, 2, 3), "at least one vote"),
    ],
)
def test_vote_entropy_refuses_bad_histograms(votes, match):
    with pytest.raises(ValueError, match=match):
        compute_vote_entropy(votes)


def _constant_class(classes: int, winner: int):
    def network(x):
        out = torch.zeros(x.shape[0], classes, *x.shape[2:])
        out[:, winner] = 5.0
        return out

    return network


@pytest.mark.parametrize("rotations", [True, False])
@pytest.mark.parametrize("network", [_Threshold(), _constant_class(4, 2), _constant_class(1, 0)])
def test_votes_that_agree_under_every_augmentation_give_zero(network, rotations):
    """The same class at every pixel under every augmentation (a constant network, or a pixel-wise one whose
    predictions the restoring turn and flip bring back exactly) scores 0."""
    images = torch.rand(3, 3, 8, 8)
    score = TTAVoteEntropy(network, num_samples=20, rotations=rotations, seed=1)
    out = score(images)
    assert out.shape == (3,) and out.dtype == torch.float32
    assert out.tolist() == pytest.approx([0.0] * 3, abs=1e-6)
    assert len(set(score.drawn)) >= (6 if rotations else 4)  # quarter turns with and without a flip were drawn


def test_an_even_split_of_the_votes_gives_one():
    """``_LeftHalf`` votes "foreground" at a pixel under the identity and the vertical flip and "background" under the
    two flips that mirror the width: the score is the binary entropy of the drawn share, 1 for an even split."""
    images, seen = torch.rand(2, 3, 6, 8), set()
    for seed in range(12):
        score = TTAVoteEntropy(_LeftHalf(), num_samples=2, rotations=False, seed=seed)
        out = score(images)
        share = sum(a in ((0, False), (2, True)) for a in score.drawn) / 2
        assert out.tolist() == pytest.approx([_binary_entropy(share)] * 2, abs=1e-6)
        seen.add(share)
    assert 0.5 in seen and seen & {0.0, 1.0}  # both an even split (1) and a unanimous draw (0) occurred


def test_draws_are_seeded_and_batching_does_not_change_scores():
    images = torch.rand(5, 3, 8, 8)
    a, b = (TTAVoteEntropy(_LeftHalf(), num_samples=6, seed=7, batch_size=n) for n in (8, 2))
    assert a(images).tolist() == pytest.approx(b(images).tolist()) and a.drawn == b.drawn
    first = a.drawn
    a(images)
    assert a.drawn != first  # the next call draws again
    drawn = a.drawn
    a(images, randomize=False)
    assert a.drawn == drawn
    assert set(first) <= set(DIHEDRAL_2D)


def test_each_distinct_augmentation_runs_once():
    calls = []

    def network(x):
        calls.append(x.shape[0])
        return torch.zeros(x.shape[0], 1, *x.shape[2:])

    score = TTAVoteEntropy(network, num_samples=20, seed=0)
    score(torch.rand(3, 3, 8, 8))
    assert calls == [3] * len(set(score.drawn))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_samples": 1}, "num_samples"),
        ({"num_samples": True}, "num_samples"),
        ({"num_samples": 2.5}, "num_samples"),
        ({"batch_size": 0}, "batch_size"),
        ({"rotations": "yes"}, "rotations"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_vote_entropy_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TTAVoteEntropy(_Threshold(), **kwargs)
    with pytest.raises(ValueError, match="network"):
        TTAVoteEntropy(None)


def test_vote_entropy_images_must_be_a_2d_batch_and_square_to_turn():
    with pytest.raises(ValueError, match="images"):
        TTAVoteEntropy(_Threshold())(torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match="rotations=False"):
        TTAVoteEntropy(_Threshold())(torch.zeros(1, 3, 6, 8))
    assert TTAVoteEntropy(_Threshold(), rotations=False)(torch.zeros(1, 3, 6, 8)).shape == (1,)
