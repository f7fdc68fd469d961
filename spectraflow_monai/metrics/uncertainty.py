"""How unsure a segmentation model is of an unlabelled image: two entropies under test-time augmentation.

Active learning spends an annotator's time on the images the model is least sure of. SpectraFlow's network has no
dropout, so MONAI Label's epistemic scoring, which samples dropout masks, does not apply as it is; test-time
augmentation gives the predictions to compare instead. This module has two scores, both in ``[0, 1]`` (0: every
prediction certain and in agreement), both the mean over an image's pixels (a volume: over all its axial slices):

- :class:`FlipEntropy` (:func:`compute_flip_entropy`), the score the MONAI Label app writes: the network sees the image
  under the four flips of its two axes (identity, horizontal, vertical, both; each prediction flipped back), the
  per-pixel class *probabilities* are averaged over the flips, and the score is the entropy of that average divided
  by ``log K`` (``K`` classes; 2 for a sigmoid output). It is the form of MONAI Label's own epistemic score
  (``monailabel.tasks.scoring.epistemic_v2.EpistemicScoring``: the entropy of the softmax averaged over dropout
  samples), with flips in place of dropout samples. A pixel counts as uncertain both when each flip is unsure of it
  and when the flips disagree (the total predictive uncertainty). Cost: one forward pass of four times the batch
  (the flips are stacked into one batch), no gradient.
- :class:`TTAVoteEntropy` (:func:`compute_vote_entropy`), the test-time-augmentation entropy of Wang et al.
  ("Aleatoric uncertainty estimation with test-time augmentation for medical image segmentation with convolutional
  neural networks", Neurocomputing 338 (2019) 34-45): ``N`` random augmentations, each prediction mapped back and
  turned into a *hard* label (argmax; a sigmoid channel at 0.5), and the entropy of the per-pixel histogram of those
  ``N`` votes, divided by ``log K``. The augmentations are the flips and 90 degree rotations of the image (exactly
  invertible on the pixel grid, so no interpolation blurs the votes). Only disagreement counts: a network unsure of
  a pixel but voting the same class under every augmentation scores 0 there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from monai.transforms import Randomizable

__all__ = [
    "DIHEDRAL_2D", "FLIPS_2D", "FlipEntropy", "TTAVoteEntropy", "compute_flip_entropy", "compute_vote_entropy"
]

#: the test-time flips of a 2D image ``(B, C, H, W)``: the dimensions each one flips (``()``: the image itself).
FLIPS_2D: tuple[tuple[int, ...], ...] = ((), (-1,), (-2,), (-2, -1))

#: the eight flips and 90 degree rotations of a 2D image ``(B, C, H, W)`` (the dihedral group of the square), each
#: ``(quarter turns, flip)``: ``torch.rot90`` of the two spatial dimensions by ``quarter turns``, then a flip of the
#: last one when ``flip``. The four with an even number of quarter turns are the four flips (they keep a non-square
#: shape): ``(0, False)`` the image itself, ``(0, True)`` horizontal, ``(2, True)`` vertical, ``(2, False)`` both.
DIHEDRAL_2D: tuple[tuple[int, bool], ...] = tuple((k, f) for f in (False, True) for k in range(4))


def compute_flip_entropy(probabilities: torch.Tensor, sigmoid: bool) -> torch.Tensor:
    """The normalised predictive entropy of every image of ``probabilities``, averaged over its pixels.

    Args:
        probabilities: ``(F, B, C, *spatial)``: the class probabilities of ``B`` images under ``F`` test-time
            transforms, mapped back to the image grid. With ``sigmoid`` each channel is an independent foreground
            probability (``C`` binary problems); otherwise the ``C`` channels are a softmax over classes.
        sigmoid: whether the channels are sigmoid (binary) probabilities rather than a softmax.

    Returns:
        float32 ``(B,)`` in ``[0, 1]``: the entropy of the mean over ``F`` divided by ``log 2`` (sigmoid) or
        ``log C`` (softmax), averaged over the pixels (and over the channels for sigmoid outputs).

    Raises:
        ValueError: fewer than 4 dimensions, or a softmax with fewer than 2 classes.
    """
    if probabilities.ndim < 4:
        raise ValueError(
            f"probabilities must be (F, B, C, *spatial) with at least one spatial dimension, got shape "
            f"{tuple(probabilities.shape)}."
        )
    p = probabilities.float().mean(dim=0).clamp(0.0, 1.0)  # (B, C, *spatial): the predictive distribution
    if sigmoid:
        q = 1.0 - p
        entropy = -(torch.special.xlogy(p, p) + torch.special.xlogy(q, q)) / math.log(2.0)
    else:
        classes = p.shape[1]
        if classes < 2:
            raise ValueError(f"a softmax output needs at least 2 classes, got {classes} (use sigmoid=True).")
        entropy = -torch.special.xlogy(p, p).sum(dim=1) / math.log(classes)
    return entropy.flatten(1).mean(dim=1).clamp(0.0, 1.0)


class FlipEntropy:
    """The entropy of the flip-averaged class probabilities of a 2D network (see the module notes): the form of MONAI
    Label's epistemic score (the entropy of the mean prediction), with the four flips in place of dropout samples. It
    is not Wang et al.'s test-time-augmentation entropy, which counts hard votes (:class:`TTAVoteEntropy`).

    Args:
        network: maps ``(N, C_in, H, W)`` images to ``(N, C, H, W)`` logits (a SpectraFlowNet, a UNet, or a callable
            such as an inferer bound to a network).
        sigmoid: whether the logits are sigmoid (binary masks) rather than softmax (label maps) logits; None: sigmoid
            for a one-channel output, softmax otherwise. Defaults to None.
        flips: the test-time flips (:data:`FLIPS_2D`: the four flips of the two image axes). Each flips dimensions of
            the ``(N, C, H, W)`` batch; ``()`` is the image itself.
        batch_size: images per forward pass (each pass holds ``batch_size * len(flips)`` images), which bounds the
            memory of a long list of slices. Defaults to 8.

    Example::

        score = FlipEntropy(network, sigmoid=True)(images)   # (B,) in [0, 1], higher = less sure

    Raises:
        ValueError: no flips, a flip of a dimension other than the two spatial ones, ``batch_size`` < 1.
    """

    def __init__(
        self,
        network: Callable[[torch.Tensor], torch.Tensor],
        sigmoid: bool | None = None,
        flips: Sequence[Sequence[int]] = FLIPS_2D,
        batch_size: int = 8,
    ) -> None:
        flips = tuple(tuple(int(d) for d in f) for f in flips)
        if not flips:
            raise ValueError("flips must hold at least one flip (() is the image itself).")
        bad = [f for f in flips if any(d not in (-1, -2, 2, 3) for d in f)]
        if bad:
            raise ValueError(f"flips may flip the spatial dimensions (-2, -1) of (N, C, H, W) only, got {bad}.")
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        self.network, self.flips, self.batch_size = network, flips, int(batch_size)
        self.sigmoid = None if sigmoid is None else bool(sigmoid)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """The score of each image of ``images`` ``(B, C_in, H, W)``: float32 ``(B,)`` on their device."""
        if images.ndim != 4:
            raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}.")
        scores = [self._batch(chunk) for chunk in images.split(self.batch_size)]
        return torch.cat(scores) if scores else images.new_zeros(0)

    def pixel_sum(self, images: torch.Tensor) -> tuple[float, int]:
        """``(sum of the per-image scores weighted by their pixels, number of pixels)`` of ``images``: what a volume's
        score (the mean over all its slices' pixels) accumulates, one chunk of slices at a time."""
        scores = self(images)
        pixels = images.shape[-1] * images.shape[-2]
        return float(scores.double().sum()) * pixels, int(scores.numel()) * pixels

    def _batch(self, images: torch.Tensor) -> torch.Tensor:
        n = images.shape[0]
        stacked = torch.cat([images.flip(f) if f else images for f in self.flips])
        logits = self.network(stacked).float()
        sigmoid = logits.shape[1] == 1 if self.sigmoid is None else self.sigmoid
        probs = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=1)
        per_flip = [p.flip(f) if f else p for p, f in zip(probs.split(n), self.flips)]
        return compute_flip_entropy(torch.stack(per_flip), sigmoid=sigmoid)


def compute_vote_entropy(votes: torch.Tensor) -> torch.Tensor:
    """The normalised entropy of per-pixel vote histograms, averaged over the pixels of each image.

    Args:
        votes: ``(B, K, *spatial)``: at each pixel of ``B`` images, how many of the augmented predictions voted for
            each of ``K`` classes (counts or fractions: non-negative, with a positive sum at every pixel). A sigmoid
            output with ``C`` channels is ``(B, 2, C, *spatial)`` (background and foreground votes per channel).

    Returns:
        float32 ``(B,)`` in ``[0, 1]``: the entropy of the vote fractions divided by ``log K`` (1 when the votes
        split evenly over the ``K`` classes, 0 when they agree), averaged over every position after the class
        dimension.

    Raises:
        ValueError: fewer than 3 dimensions, fewer than 2 classes, a negative count or a pixel without a vote.
    """
    if votes.ndim < 3:
        raise ValueError(
            f"votes must be (B, K, *spatial) with at least one spatial dimension, got shape {tuple(votes.shape)}."
        )
    classes = votes.shape[1]
    if classes < 2:
        raise ValueError(f"votes must count at least 2 classes, got {classes}.")
    v = votes.float()
    total = v.sum(dim=1, keepdim=True)
    if bool((v < 0).any()) or bool((total <= 0).any()):
        raise ValueError("votes must be non-negative counts with at least one vote at every pixel.")
    f = v / total
    entropy = -torch.special.xlogy(f, f).sum(dim=1) / math.log(classes)
    return entropy.flatten(1).mean(dim=1).clamp(0.0, 1.0)


def _augment(images: torch.Tensor, turns: int, flip: bool) -> torch.Tensor:
    out = torch.rot90(images, turns, dims=(-2, -1)) if turns else images
    return out.flip(-1) if flip else out


def _restore(images: torch.Tensor, turns: int, flip: bool) -> torch.Tensor:
    out = images.flip(-1) if flip else images
    return torch.rot90(out, -turns, dims=(-2, -1)) if turns else out


class TTAVoteEntropy(Randomizable):
    """Wang et al.'s test-time-augmentation entropy of a 2D network: the entropy of the hard votes of ``num_samples``
    random augmentations (see the module notes).

    Wang, G. et al., "Aleatoric uncertainty estimation with test-time augmentation for medical image segmentation
    with convolutional neural networks", Neurocomputing 338 (2019) 34-45. For each call, ``num_samples`` augmentations
    are drawn (with replacement, from ``self.R`` in :meth:`randomize`) among the flips and 90 degree rotations of the
    image (:data:`DIHEDRAL_2D`), which the pixel grid inverts exactly; every image of the call gets the same draws.
    Each augmented prediction is mapped back to the image grid and turned into a hard label (argmax over a softmax's
    classes; a sigmoid channel is foreground from logit 0, probability 0.5); the score of an image is
    :func:`compute_vote_entropy` of the per-pixel vote histogram, in ``[0, 1]``. Wang et al. also draw scalings,
    intensity changes and noise; these are left out, as their inverse is not exact on the pixel grid.

    The network is run once per distinct augmentation drawn (at most eight) and its vote counted as many times as the
    augmentation was drawn: the result of ``num_samples`` passes for a deterministic network (eval mode, no dropout).
    The MONAI Label app scores with :class:`FlipEntropy`, not with this class.

    Args:
        network: maps ``(N, C_in, H, W)`` images to ``(N, C, H, W)`` logits (a SpectraFlowNet, a UNet, or a callable
            such as an inferer bound to a network).
        num_samples: the number of random augmentations ``N`` (at least 2). Defaults to 20.
        sigmoid: whether the logits are sigmoid (binary masks) rather than softmax (label maps) logits; None: sigmoid
            for a one-channel output, softmax otherwise. Defaults to None.
        rotations: draw among all eight flips and 90 degree rotations (square images only, a quarter turn swaps the
            two axes); False: among the four flips (:data:`FLIPS_2D`), which keep any shape. Defaults to True.
        batch_size: images per forward pass. Defaults to 8.
        seed: seed of the draws (``set_random_state``); None: not seeded. Defaults to 0.

    Example::

        score = TTAVoteEntropy(network, num_samples=20, seed=0)(images)   # (B,) in [0, 1], higher = less sure

    Raises:
        ValueError: ``num_samples`` < 2, ``batch_size`` < 1, ``rotations`` not a bool, ``seed`` not an integer.
    """

    def __init__(
        self,
        network: Callable[[torch.Tensor], torch.Tensor],
        num_samples: int = 20,
        sigmoid: bool | None = None,
        rotations: bool = True,
        batch_size: int = 8,
        seed: int | None = 0,
    ) -> None:
        if not callable(network):
            raise ValueError(f"network must be callable (a network or an inferer), got {type(network).__name__}.")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 2:
            raise ValueError(f"num_samples must be an integer >= 2 (the votes to compare), got {num_samples!r}.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        if not isinstance(rotations, bool):
            raise ValueError(f"rotations must be True or False, got {rotations!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}.")
        self.network, self.num_samples, self.batch_size, self.rotations = network, num_samples, batch_size, rotations
        self.sigmoid = None if sigmoid is None else bool(sigmoid)
        self.augmentations = DIHEDRAL_2D if rotations else tuple(a for a in DIHEDRAL_2D if a[0] % 2 == 0)
        self.drawn: tuple[tuple[int, bool], ...] = ()
        self.set_random_state(seed=seed)

    def randomize(self, data: object = None) -> None:
        """Draw the ``num_samples`` augmentations of the next call (``self.drawn``, ``(quarter turns, flip)`` each)."""
        picks = self.R.randint(len(self.augmentations), size=self.num_samples)
        self.drawn = tuple(self.augmentations[int(i)] for i in picks)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, randomize: bool = True) -> torch.Tensor:
        """The score of each image of ``images`` ``(B, C_in, H, W)``: float32 ``(B,)`` on their device.

        Args:
            images: the images.
            randomize: draw new augmentations first; False reuses the last draw. Defaults to True.

        Raises:
            ValueError: ``images`` not 4-dimensional, or not square with ``rotations``.
        """
        if images.ndim != 4:
            raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}.")
        if self.rotations and images.shape[-1] != images.shape[-2]:
            raise ValueError(
                f"images of {images.shape[-2]}x{images.shape[-1]} are not square: a quarter turn would change their "
                "shape; use rotations=False (the four flips)."
            )
        if randomize or not self.drawn:
            self.randomize()
        scores = [self._batch(chunk) for chunk in images.split(self.batch_size)]
        return torch.cat(scores) if scores else images.new_zeros(0)

    def _batch(self, images: torch.Tensor) -> torch.Tensor:
        votes = None
        for augmentation in dict.fromkeys(self.drawn):
            logits = _restore(self.network(_augment(images, *augmentation)).float(), *augmentation)
            sigmoid = logits.shape[1] == 1 if self.sigmoid is None else self.sigmoid
            if sigmoid:
                fg = (logits >= 0).float()
                vote = torch.stack([1.0 - fg, fg], dim=1)  # (n, 2, C, H, W)
            else:
                vote = torch.nn.functional.one_hot(logits.argmax(dim=1), logits.shape[1]).movedim(-1, 1).float()
            vote = vote * self.drawn.count(augmentation)
            votes = vote if votes is None else votes + vote
        return compute_vote_entropy(votes)
