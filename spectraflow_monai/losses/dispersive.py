"""Dispersive loss: an in-batch repulsive regulariser that needs no positive pairs.

SpectraFlow (Chen et al.) adds it to the Stage-1 MeanFlow objective, ``L = L_MF + lambda * L_Disp`` (eq. 4), on the
global-average-pooled features of the penultimate encoder block. The loss comes from Wang & He, "Diffuse and
Disperse: Image Generation with Representation Regularization" (2025, arXiv:2506.09027); the SpectraFlow appendix
(eqs. 15-20) lists the four variants implemented here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from monai.utils import LossReduction
from torch.nn.modules.loss import _Loss

from spectraflow_monai.losses.utils import check_reduction
from spectraflow_monai.utils.precision import autocast_off

__all__ = ["DispersiveLoss"]

_VARIANTS = ("infonce_l2", "infonce_cosine", "hinge", "covariance")
_NORMALIZE = (None, "dim", "l2")
# Above this feature dimension the covariance variant works with the (B, B) Gram matrix instead of the (D, D)
# covariance matrix, so flattened token maps (D ~ 1e5) do not allocate a D x D matrix.
_COV_DIRECT_MAX_DIM = 2048


def _pairwise_sq_dist(h: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances between the rows of ``h`` (B, D), as a (B, B) matrix.

    The rows are centred on the batch mean first (distances are translation invariant), which keeps the
    ``|a|^2 + |b|^2 - 2 a.b`` expansion accurate for features with a large common component (ViT features).
    No square root is taken, so the gradient stays finite for coincident points.
    """
    h = h - h.mean(dim=0, keepdim=True)
    sq = (h * h).sum(dim=1)
    d = sq[:, None] + sq[None, :] - 2.0 * (h @ h.t())
    return d.clamp_min(0.0)


class DispersiveLoss(_Loss):
    """Dispersive loss of SpectraFlow (Chen et al., Sec. "Dispersive Regularization" and appendix eqs. 17-20).

    It treats every other sample of the mini-batch as a negative and pushes the representations ``h_i`` apart,
    which counters representation collapse during MeanFlow pretraining (Wang & He, 2025). With ``B`` samples and
    the off-diagonal pairs ``i != j``:

    - ``"infonce_l2"`` (main-text eq. 5 / appendix eq. 17, the SpectraFlow default):
      ``log( 1/(B(B-1)) * sum_{i!=j} exp(-||h_i - h_j||^2 / tau) + eps )``.
    - ``"infonce_cosine"`` (eq. 18): the same with ``D(h_i, h_j) = 1 - cos(h_i, h_j)``.
    - ``"hinge"`` (eq. 19): ``1/(B(B-1)) * sum_{i!=j} max(0, margin - ||h_i - h_j||^2)^2``.
    - ``"covariance"`` (eq. 20): ``||C - diag(C)||_F^2`` with ``C = H~^T H~ / (B-1)`` and ``H~`` the batch-centred
      features (a decorrelation penalty across feature dimensions).

    The log-mean-exp of the InfoNCE variants is evaluated as ``logaddexp(logsumexp(-d/tau) - log(B(B-1)), log eps)``,
    which equals ``log(mean + eps)`` exactly without ever forming ``exp`` of a large argument. Squared distances are
    used directly (no ``sqrt``), so coincident points have a finite (zero) gradient.

    Gradient (appendix eqs. 21-22): for ``infonce_l2`` with ``eps = 0`` the derivative with respect to ``h_i`` is
    ``-(4/tau) * sum_{j != i} w_ij (h_i - h_j)``, with ``w_ij`` the softmax weights of ``-d_ij / tau`` over all
    off-diagonal pairs (the factor 4 = 2 from the square times 2 pair orders; ``eps > 0`` scales it by
    ``mean / (mean + eps)``). Eq. 22 prints the derivative without the minus sign; with it, a gradient-descent step
    moves ``h_i`` away from its neighbours, the closest ones the most, which is the dispersion the paper describes.

    Feature scale (``normalize``): raw DINOv2 pooled features have norms of tens, so ``||h_i - h_j||^2`` is in the
    hundreds to thousands; ``exp(-d / tau)`` then underflows to 0, the loss sits at ``log(eps)`` and its gradient is
    exactly zero (the regulariser silently does nothing). The official dispersive-loss code divides the squared
    distances by the feature dimension ``D``; this is the default here (``normalize="dim"``). It is a deviation from
    eq. 5 as printed: ``exp(-||h_i - h_j||^2 / (D tau))`` is eq. 5 with the temperature ``D tau`` (192 for ViT-S,
    ``D = 384``, ``tau = 0.5``), so the paper's ``lambda = 0.4`` weighs a different loss than eq. 5 with ``tau = 0.5``.
    ``normalize=None`` is eq. 5 as printed (bundle setting ``dispersive_normalize: null``).

    Args:
        variant: one of ``"infonce_l2"``, ``"infonce_cosine"``, ``"hinge"``, ``"covariance"``.
            Defaults to ``"infonce_l2"``.
        tau: temperature of the InfoNCE variants, > 0. Defaults to 0.5.
        eps: the ``eps`` inside the logarithm of the InfoNCE variants, >= 0 (0 gives appendix eq. 17 exactly).
            Defaults to 1e-8.
        margin: margin of the hinge variant (``epsilon`` in eq. 19), > 0. Defaults to 1.0.
        normalize: how the features are scaled before the loss.

            - ``None``: the exact paper form on the raw features.
            - ``"dim"``: features divided by ``sqrt(D)``, i.e. squared distances divided by ``D`` (as in the
              official dispersive-loss code); the covariance penalty is then divided by ``D^2``. No effect on the
              cosine variant, which is scale invariant.
            - ``"l2"``: each ``h_i`` L2-normalised first (squared distances in ``[0, 4]``).

            Defaults to ``"dim"``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``; accepted for symmetry with other MONAI losses. The loss
            is already a single scalar for the whole batch (eq. 17 is one log over all pairs), so every reduction
            returns that scalar. Defaults to ``"mean"``.

    Raises:
        ValueError: for an unknown ``variant``, ``normalize`` or ``reduction``, ``tau <= 0``, ``eps < 0`` or
            ``margin <= 0``.

    Example:
        >>> loss = DispersiveLoss(variant="infonce_l2", tau=0.5)
        >>> h = torch.randn(8, 384, requires_grad=True)  # pooled penultimate-block features
        >>> loss(h).backward()
    """

    def __init__(
        self,
        variant: str = "infonce_l2",
        tau: float = 0.5,
        eps: float = 1e-8,
        margin: float = 1.0,
        normalize: str | None = "dim",
        reduction: LossReduction | str = LossReduction.MEAN,
    ) -> None:
        super().__init__(reduction=check_reduction(reduction))
        if variant not in _VARIANTS:
            raise ValueError(f"variant must be one of {_VARIANTS}, got {variant!r}.")
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau!r}.")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}.")
        if not margin > 0:
            raise ValueError(f"margin must be > 0, got {margin!r}.")
        if normalize not in _NORMALIZE:
            raise ValueError(f"normalize must be one of {_NORMALIZE}, got {normalize!r}.")
        self.variant = variant
        self.tau = float(tau)
        self.eps = float(eps)
        self.margin = float(margin)
        self.normalize = normalize

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """
        Args:
            h: features of shape (B, D), or (B, ...) which is flattened to (B, prod(...)). B must be >= 2.

        Returns:
            a scalar tensor, computed in float32 for half-precision inputs and under autocast (autocast is off
            inside, so the matrix products are not run in float16 / bfloat16).

        Raises:
            ValueError: when ``h`` has fewer than 2 dimensions, is not floating point, or ``B < 2``.
        """
        if not isinstance(h, torch.Tensor) or h.dim() < 2:
            raise ValueError(
                f"h must be a tensor of shape (B, D) or (B, ...), got {getattr(h, 'shape', type(h).__name__)}."
            )
        if not torch.is_floating_point(h):
            raise ValueError(f"h must be floating point, got dtype {h.dtype}.")
        batch = h.shape[0]
        if batch < 2:
            raise ValueError(f"DispersiveLoss needs a batch size B >= 2 (in-batch negatives), got B={batch}.")
        h = h.reshape(batch, -1)
        if h.dtype in (torch.float16, torch.bfloat16):
            h = h.float()
        with autocast_off(h):  # the matrix products stay in float32 under autocast too
            return self._loss(h)

    def _loss(self, h: torch.Tensor) -> torch.Tensor:
        """The loss of ``(B, D)`` features ``h`` in float32 (or float64), autocast off."""
        batch, dim = h.shape

        if self.normalize == "dim":
            h = h / math.sqrt(dim)
        elif self.normalize == "l2":
            h = F.normalize(h, p=2.0, dim=1)

        if self.variant == "covariance":
            return self._covariance(h)

        off_diag = ~torch.eye(batch, dtype=torch.bool, device=h.device)
        if self.variant == "infonce_cosine":
            hn = F.normalize(h, p=2.0, dim=1)
            dist = (1.0 - hn @ hn.t())[off_diag]
        else:
            dist = _pairwise_sq_dist(h)[off_diag]

        if self.variant == "hinge":
            return F.relu(self.margin - dist).pow(2).mean()

        # log( mean_{i != j} exp(-d_ij / tau) + eps ), evaluated in log space
        log_mean = torch.logsumexp(-dist / self.tau, dim=0) - math.log(batch * (batch - 1))
        if self.eps > 0:
            log_mean = torch.logaddexp(log_mean, log_mean.new_tensor(math.log(self.eps)))
        return log_mean

    def _covariance(self, h: torch.Tensor) -> torch.Tensor:
        """Off-diagonal covariance penalty, eq. (20)."""
        batch, dim = h.shape
        hc = h - h.mean(dim=0, keepdim=True)
        if dim <= _COV_DIRECT_MAX_DIM:
            cov = hc.t() @ hc / (batch - 1)
            off = cov - torch.diag_embed(torch.diagonal(cov))
            return off.pow(2).sum()
        # ||H^T H||_F = ||H H^T||_F, and diag(H^T H)_k = sum_i H_ik^2: no (D, D) matrix needed
        gram = hc @ hc.t()
        diag = hc.pow(2).sum(dim=0)
        return ((gram.pow(2).sum() - diag.pow(2).sum()) / (batch - 1) ** 2).clamp_min(0.0)
