"""How unsure a segmentation model is of an unlabelled image: the predictive entropy under test-time flips.

Active learning spends an annotator's time on the images the model is least sure of. SpectraFlow's network has no
dropout (so MONAI Label's epistemic scoring, which samples dropout masks, does not apply); test-time augmentation
(Wang et al., "Aleatoric uncertainty estimation with test-time augmentation for medical image segmentation with
convolutional neural networks", Neurocomputing 2019) gives the predictive distribution instead: the network sees the
image under the four flips of its two axes (identity, horizontal, vertical, both; each prediction flipped back), the
per-pixel class probabilities are averaged over the flips, and the score of an image is the mean over its pixels of
the entropy of that average, divided by ``log K`` (``K`` classes; 2 for a sigmoid output) so that it lies in
``[0, 1]``: 0 when every flip predicts every pixel with certainty, 1 when every pixel is a coin toss. A pixel counts
as uncertain both when each flip is unsure of it and when the flips disagree, so the score ranks images by the
model's total predictive uncertainty (aleatoric and flip disagreement; Wang et al.'s "TTA entropy"). A volume's score
is the mean over its voxels (all its axial slices).

Cost: one forward pass of four times the batch (the flips are stacked into one batch), no gradient.

:func:`compute_flip_entropy` is the functional form on probabilities; :class:`FlipEntropy` runs a network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

__all__ = ["FLIPS_2D", "FlipEntropy", "compute_flip_entropy"]

#: the test-time flips of a 2D image ``(B, C, H, W)``: the dimensions each one flips (``()``: the image itself).
FLIPS_2D: tuple[tuple[int, ...], ...] = ((), (-1,), (-2,), (-2, -1))


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
    """The uncertainty score of :mod:`this module <spectraflow_monai.metrics.uncertainty>` for a 2D network.

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
