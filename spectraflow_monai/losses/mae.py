"""Masked-patch reconstruction loss of the mixed-domain MAE Stage-1 variant (SpectraFlow Table 2 baseline).

The masked autoencoder of He et al. 2022 ("Masked Autoencoders Are Scalable Vision Learners", CVPR) regresses the
pixels of the masked patches: the image is cut into non-overlapping ``p x p`` patches, each flattened to a
``p*p*C`` vector (row, column, channel order), optionally normalised by its own mean and standard deviation
("normalized pixels as targets"), and the mean squared error is averaged over the masked patches only.
SpectraFlow's Table 2 compares its Mixed-Domain MeanFlow Stage-1 with this objective on the same mixed image/mask
mini-batches.
"""

from __future__ import annotations

import torch
from monai.utils import LossReduction
from torch.nn.modules.loss import _Loss

from spectraflow_monai.losses.utils import check_reduction

__all__ = ["MAELoss", "patchify", "unpatchify"]


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut ``(B, C, H, W)`` images into flattened patches ``(B, (H/p)*(W/p), p*p*C)``.

    Patches are numbered row by row (the token order of a ViT); inside a patch the values are ordered
    ``(row, column, channel)``, as in MAE.

    Args:
        images: ``(B, C, H, W)`` with ``H`` and ``W`` multiples of ``patch_size``.
        patch_size: side ``p`` of the square patches, ``>= 1``.

    Raises:
        ValueError: a wrong shape or a ``patch_size`` that does not divide ``H`` and ``W``.
    """
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}.")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(getattr(images, 'shape', ()))}.")
    b, c, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(f"image size ({height}, {width}) must be a multiple of patch_size={patch_size}.")
    h, w = height // patch_size, width // patch_size
    x = images.reshape(b, c, h, patch_size, w, patch_size)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, h * w, patch_size * patch_size * c)


def unpatchify(patches: torch.Tensor, patch_size: int, grid_size: tuple[int, int], channels: int = 3) -> torch.Tensor:
    """Inverse of :func:`patchify`: ``(B, h*w, p*p*C)`` back to ``(B, C, h*p, w*p)``.

    Args:
        patches: flattened patches.
        patch_size: side ``p`` of the patches.
        grid_size: ``(h, w)`` number of patch rows and columns.
        channels: ``C``. Defaults to 3.

    Raises:
        ValueError: the shape does not match ``patch_size``, ``grid_size`` and ``channels``.
    """
    h, w = int(grid_size[0]), int(grid_size[1])
    expected = (h * w, patch_size * patch_size * channels)
    if patches.ndim != 3 or tuple(patches.shape[1:]) != expected:
        raise ValueError(f"patches must have shape (B, {expected[0]}, {expected[1]}), got {tuple(patches.shape)}.")
    x = patches.reshape(patches.shape[0], h, w, patch_size, patch_size, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(patches.shape[0], channels, h * patch_size, w * patch_size)


class MAELoss(_Loss):
    """Masked-patch pixel regression of MAE (He et al. 2022), the Stage-1 baseline of SpectraFlow's Table 2.

    With ``x`` the patchified input (:func:`patchify`), ``pred`` the decoder output for every patch and ``mask``
    ``1`` on the removed patches and ``0`` on the visible ones:

    - target ``y = x``, or with ``norm_pix_loss`` ``y = (x - mean(x)) / sqrt(var(x) + eps)`` per patch (unbiased
      variance over the ``p*p*C`` values, as MAE; a constant patch, e.g. inside a binary mask, gets target 0);
    - per-patch error ``e = mean((pred - y)^2)`` over the ``p*p*C`` values;
    - per-sample loss ``sum(e * mask) / sum(mask)``: the visible patches do not count.

    The loss is computed in float32 with autocast disabled (half-precision predictions are promoted).

    Args:
        patch_size: side ``p`` of the patches (14 for DINOv2), ``>= 1``.
        norm_pix_loss: normalise every target patch by its own mean and standard deviation (MAE's best setting).
            Defaults to True.
        eps: variance floor of the normalisation, ``> 0``. Defaults to 1e-6 (MAE).
        reduction: ``"mean"``: masked error averaged over all masked patches of the batch (MAE's
            ``(e * mask).sum() / mask.sum()``; the mean of the per-sample losses when every sample has the same
            number of masked patches); ``"sum"``: sum of the per-sample losses; ``"none"``: the ``(B,)`` per-sample
            losses. Defaults to ``"mean"``.
        check_mask: raise when a sample has no masked patch. The check reads the mask back from the device (a host
            synchronisation per call); a caller whose masking guarantees masked patches (the MAE Stage-1 trainer
            removes ``N - K >= 1`` patches of every sample) turns it off. Defaults to True.

    Raises:
        ValueError: invalid ``patch_size``, ``eps`` or ``reduction``.

    Example:
        >>> loss = MAELoss(patch_size=14)
        >>> images = torch.randn(2, 3, 28, 28)
        >>> pred = torch.randn(2, 4, 14 * 14 * 3, requires_grad=True)
        >>> mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
        >>> loss(pred, images, mask).backward()
    """

    def __init__(
        self,
        patch_size: int = 14,
        norm_pix_loss: bool = True,
        eps: float = 1e-6,
        reduction: LossReduction | str = LossReduction.MEAN,
        check_mask: bool = True,
    ) -> None:
        super().__init__(reduction=check_reduction(reduction))
        self.check_mask = bool(check_mask)
        if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
            raise ValueError(f"patch_size must be a positive int, got {patch_size!r}.")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}.")
        self.patch_size = patch_size
        self.norm_pix_loss = bool(norm_pix_loss)
        self.eps = float(eps)

    def target(self, images: torch.Tensor) -> torch.Tensor:
        """The regression target ``(B, N, p*p*C)`` of ``images`` ``(B, C, H, W)`` (float32, normalised per patch
        when ``norm_pix_loss``)."""
        target = patchify(images.float(), self.patch_size)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True) if target.shape[-1] > 1 else torch.zeros_like(mean)
            target = (target - mean) / (var + self.eps).sqrt()
        return target

    def forward(self, pred: torch.Tensor, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """
        Args:
            pred: ``(B, N, p*p*C)`` predicted patches (all ``N`` patches; only the masked ones are scored).
            images: ``(B, C, H, W)`` input images, ``N = (H/p)*(W/p)``.
            mask: ``(B, N)``, 1 (or True) on the masked patches, 0 on the visible ones; every sample needs at least
                one masked patch.

        Returns:
            a scalar (``"mean"``, ``"sum"``) or ``(B,)`` (``"none"``) float32 tensor.

        Raises:
            ValueError: shapes that do not match, or a sample without masked patches.
        """
        if not isinstance(pred, torch.Tensor) or pred.ndim != 3:
            raise ValueError(f"pred must have shape (B, N, p*p*C), got {tuple(getattr(pred, 'shape', ()))}.")
        device_type = pred.device.type if pred.device.type in ("cuda", "cpu", "xpu", "mps") else "cpu"
        with torch.autocast(device_type, enabled=False):
            target = self.target(images)
            if tuple(pred.shape) != tuple(target.shape):
                raise ValueError(
                    f"pred must have the shape of the patchified images {tuple(target.shape)} (patch_size="
                    f"{self.patch_size}), got {tuple(pred.shape)}."
                )
            if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(target.shape[:2]):
                raise ValueError(
                    f"mask must have shape {tuple(target.shape[:2])}, got {tuple(getattr(mask, 'shape', ()))}."
                )
            mask = mask.to(device=pred.device, dtype=torch.float32)
            counts = mask.sum(dim=1)
            if self.check_mask and bool((counts <= 0).any()):
                raise ValueError("every sample needs at least one masked patch (mask == 1), got a sample without.")
            error = (pred.float() - target).pow(2).mean(dim=-1)  # (B, N) per-patch error
            masked = error * mask
            if self.reduction == LossReduction.MEAN.value:
                return masked.sum() / counts.sum()
            per_sample = masked.sum(dim=1) / counts
            if self.reduction == LossReduction.SUM.value:
                return per_sample.sum()
            return per_sample
