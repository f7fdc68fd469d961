"""Stage-2 segmentation loss of SpectraFlow: Dice + (B)CE + beta * boundary loss.

SpectraFlow (Chen et al.), Sec. "Stage-2: Segmentation Finetuning", eq. 7: ``L_S2 = L_seg + beta * L_bd`` where
``L_seg`` combines Dice and BCE and ``L_bd`` is a boundary term. The region term is MONAI's ``DiceCELoss`` and the
boundary term MONAI's ``BoundaryLoss`` (Kervadec et al., "Boundary loss for highly unbalanced segmentation",
MIDL 2019), whose weight can be ramped up over the first epochs as in Kervadec et al.; its signed distance maps come
from :func:`spectraflow_monai.utils.distance.signed_distance_map` (exact, batched, on the training device) or, by
``distance_backend``, from cuCIM / scipy as MONAI computes them.
"""

from __future__ import annotations

import torch
from monai.losses import BoundaryLoss, DiceCELoss
from monai.networks.utils import one_hot
from monai.utils import optional_import
from torch.nn.modules.loss import _Loss

from spectraflow_monai.utils.distance import DISTANCE_BACKENDS, signed_distance_map
from spectraflow_monai.utils.precision import autocast_off

__all__ = ["DiceBCEBoundaryLoss", "SignedDistanceBoundaryLoss", "cucim_available"]


def cucim_available() -> bool:
    """Whether MONAI's ``distance_transform_edt`` can use cuCIM (cuCIM and CuPy importable)."""
    _, has_cp = optional_import("cupy")
    _, has_cucim = optional_import("cucim.core.operations.morphology", name="distance_transform_edt")
    return bool(has_cp and has_cucim)


class SignedDistanceBoundaryLoss(BoundaryLoss):
    """MONAI's ``BoundaryLoss`` (Kervadec et al., MIDL 2019) with a choice of where its signed distance maps are
    computed; the maps and the loss are those of ``BoundaryLoss`` (tested).

    ``distance_backend``:

    - ``"torch"``: :func:`~spectraflow_monai.utils.distance.signed_distance_map`, exact, one batched computation on
      the target's device (a GPU tensor stays on the GPU; no host synchronisation, so it can run inside a captured or
      compiled step);
    - ``"cucim"``: MONAI's ``distance_transform_edt`` with cuCIM, per image and class (needs cuCIM + CuPy and a CUDA
      target; MONAI synchronises the device after every map);
    - ``"scipy"``: MONAI's ``distance_transform_edt`` with scipy on the CPU, per image and class (the target is copied
      to the CPU and the maps back);
    - ``"auto"`` (default): ``"torch"`` for a target on an accelerator (CUDA, MPS, ...), ``"scipy"`` for a CPU target
      (scipy's linear-time transform per image is the cheaper one on a CPU; ``benchmarks/bench_boundary_loss.py``
      measures both).

    Args:
        distance_backend: one of :data:`~spectraflow_monai.utils.distance.DISTANCE_BACKENDS`. Defaults to ``"auto"``.
        max_elements: chunk bound of the torch backend's reduction (memory). Defaults to 2^26 (256 MiB of float32).
        kwargs: the arguments of ``monai.losses.BoundaryLoss``.

    Raises:
        ValueError: an unknown ``distance_backend``, ``"cucim"`` without cuCIM installed; at call time ``"cucim"``
            with a target not on a CUDA device.
    """

    def __init__(self, distance_backend: str = "auto", max_elements: int = 2**26, **kwargs) -> None:
        if distance_backend not in DISTANCE_BACKENDS:
            raise ValueError(f"distance_backend must be one of {list(DISTANCE_BACKENDS)}, got {distance_backend!r}.")
        if distance_backend == "cucim" and not cucim_available():
            raise ValueError("distance_backend='cucim' needs cuCIM and CuPy installed; use 'auto' or 'torch'.")
        if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 1:
            raise ValueError(f"max_elements must be a positive integer, got {max_elements!r}.")
        super().__init__(**kwargs)
        self.distance_backend = distance_backend
        self.max_elements = max_elements

    def backend_for(self, target: torch.Tensor) -> str:
        """The backend that computes the maps of ``target`` (``"auto"`` resolved by its device)."""
        if self.distance_backend != "auto":
            return self.distance_backend
        return "scipy" if target.device.type == "cpu" else "torch"

    @torch.no_grad()
    def compute_distance_map(self, target: torch.Tensor) -> torch.Tensor:
        """Signed distance maps of ``target`` (B, N, H, W[, D]) on ``target``'s device (see the class)."""
        backend = self.backend_for(target)
        if backend == "torch":
            return signed_distance_map(target, max_elements=self.max_elements)
        if backend == "cucim" and target.device.type != "cuda":
            raise ValueError(f"distance_backend='cucim' needs a CUDA target, got a target on {target.device}.")
        if backend == "scipy" and target.device.type != "cpu":
            return super().compute_distance_map(target.cpu()).to(target.device)
        return super().compute_distance_map(target)


def _promote(x: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 tensors as float32; other dtypes unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class DiceBCEBoundaryLoss(_Loss):
    """``lambda_dice * Dice + lambda_ce * (B)CE + beta * Boundary``, the Stage-2 loss of SpectraFlow (eq. 7).

    - Binary / multi-label (``sigmoid=True``, the default): ``input`` holds logits (B, N, H, W[, D]) and ``target``
      the same shape in {0, 1}; the CE term is ``BCEWithLogitsLoss`` over every channel (``DiceCELoss`` alone
      would use softmax cross entropy for N > 1).
    - Multi-class (``softmax=True``, e.g. Synapse with 9 channels): ``input`` holds logits (B, N, H, W[, D]);
      ``target`` is a class-index map (B, 1, H, W[, D]) with ``to_onehot_y=True``, or one-hot (B, N, ...);
      the CE term is ``CrossEntropyLoss``.

    ``Dice + CE`` is ``monai.losses.DiceCELoss`` and the boundary term is ``monai.losses.BoundaryLoss``
    (``mean(p * phi)`` with ``phi`` the signed distance map of the ground truth, in pixels, under ``no_grad``; where
    it is computed is ``distance_backend``, see :class:`SignedDistanceBoundaryLoss`: by default exact torch code on
    the training device for GPU tensors, scipy for CPU tensors). Because ``phi`` is measured in
    pixels, ``beta`` should be small (0.01 following Kervadec et al.). ``beta = 0`` skips the distance transforms.

    Precision: the loss is computed in float32 whatever the precision of the run (float16 / bfloat16 logits are
    promoted and autocast is off inside), so that mixed-precision training changes the network's arithmetic only.

    Ramping ``beta``: with ``beta_max`` and ``ramp_epochs`` set, ``set_epoch(e)`` (``e`` = 0-based epoch index)
    sets ``beta = beta_start + (beta_max - beta_start) * min(e, ramp_epochs) / ramp_epochs``, reaching ``beta_max``
    at epoch ``ramp_epochs`` and staying there. The loss never attaches itself to a trainer: with ignite /
    ``monai.engines`` a handler calls it on ``EPOCH_STARTED``: :class:`spectraflow_monai.handlers.LossTermsHandler`
    does that and logs the terms (below); :class:`spectraflow_monai.handlers.BoundaryWeightRamp` only ramps::

        loss = DiceBCEBoundaryLoss(beta=0.01, beta_max=0.1, ramp_epochs=20)
        LossTermsHandler(loss).attach(trainer)  # ramps beta and logs train_loss_dice, ..., boundary_beta

    Logging: every call records its unweighted terms as detached scalar tensors in ``last_terms``: ``dice``,
    ``bce`` (``sigmoid``) or ``ce`` (``softmax``), and, when ``beta > 0``, ``boundary`` and
    ``boundary_weighted = beta * boundary``; the loss is ``lambda_dice * dice + lambda_ce * (b)ce +
    boundary_weighted``. A total that rises while ``beta`` ramps up is then explained by the terms.

    Args:
        sigmoid: apply a sigmoid to the logits for the Dice and boundary terms; CE is BCE-with-logits.
            Defaults to True.
        softmax: apply a softmax to the logits for the Dice and boundary terms; CE is cross entropy.
            Exactly one of ``sigmoid`` / ``softmax`` must be True (the CE term always takes logits).
            Defaults to False.
        to_onehot_y: convert a class-index ``target`` (B, 1, ...) to one-hot using ``input.shape[1]`` classes.
            Defaults to False.
        include_background: if False, channel 0 is excluded from the Dice and boundary terms (not from CE, as in
            ``DiceCELoss``). Defaults to True.
        lambda_dice: weight of the Dice term, >= 0. Defaults to 1.0.
        lambda_ce: weight of the (B)CE term, >= 0. Defaults to 1.0.
        beta: weight of the boundary term (the starting value when ramping), >= 0. Defaults to 0.01.
        beta_max: final boundary weight of the linear ramp, >= ``beta``; None disables the ramp. Defaults to None.
        ramp_epochs: number of epochs of the ramp, >= 0; must be > 0 when ``beta_max`` differs from ``beta``.
            Defaults to 0.
        smooth_nr: numerator smoothing of the Dice term. Defaults to 1e-5.
        smooth_dr: denominator smoothing of the Dice term. Defaults to 1e-5.
        reduction: ``"mean"`` or ``"sum"`` over batch and channels (``"none"`` is not supported by
            ``DiceCELoss``). Defaults to ``"mean"``.
        distance_backend: where the boundary term's signed distance maps are computed: ``"auto"``, ``"torch"``,
            ``"cucim"`` or ``"scipy"`` (:class:`SignedDistanceBoundaryLoss`). Defaults to ``"auto"``.

    Raises:
        ValueError: when both or neither of ``sigmoid`` / ``softmax`` are set, a weight is negative,
            ``beta_max < beta``, ``ramp_epochs`` is negative (or 0 with a ramp), ``reduction`` is unsupported, or
            ``distance_backend`` is unknown (or ``"cucim"`` without cuCIM).
    """

    def __init__(
        self,
        sigmoid: bool = True,
        softmax: bool = False,
        to_onehot_y: bool = False,
        include_background: bool = True,
        lambda_dice: float = 1.0,
        lambda_ce: float = 1.0,
        beta: float = 0.01,
        beta_max: float | None = None,
        ramp_epochs: int = 0,
        smooth_nr: float = 1e-5,
        smooth_dr: float = 1e-5,
        reduction: str = "mean",
        distance_backend: str = "auto",
    ) -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
        super().__init__(reduction=reduction)
        if sigmoid and softmax:
            raise ValueError("sigmoid and softmax cannot both be True, got sigmoid=True, softmax=True.")
        if not sigmoid and not softmax:
            raise ValueError(
                "one of sigmoid / softmax must be True (the CE term takes logits), got sigmoid=False, softmax=False."
            )
        for name, value in (("lambda_dice", lambda_dice), ("lambda_ce", lambda_ce), ("beta", beta)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}.")
        if beta_max is not None and not beta_max >= beta:
            raise ValueError(f"beta_max must be >= beta ({beta!r}), got {beta_max!r}.")
        if isinstance(ramp_epochs, bool) or int(ramp_epochs) != ramp_epochs or ramp_epochs < 0:
            raise ValueError(f"ramp_epochs must be an integer >= 0, got {ramp_epochs!r}.")
        if beta_max is not None and beta_max != beta and ramp_epochs == 0:
            raise ValueError(f"ramp_epochs must be > 0 to ramp beta from {beta!r} to beta_max={beta_max!r}, got 0.")

        self.sigmoid = sigmoid
        self.softmax = softmax
        self.to_onehot_y = to_onehot_y
        self.beta_start = float(beta)
        self.beta_max = None if beta_max is None else float(beta_max)
        self.ramp_epochs = int(ramp_epochs)
        self._beta = float(beta)
        self.last_terms: dict[str, torch.Tensor] | None = None
        self.dice_ce = DiceCELoss(
            include_background=include_background,
            to_onehot_y=to_onehot_y,
            sigmoid=sigmoid,
            softmax=softmax,
            reduction=reduction,
            smooth_nr=smooth_nr,
            smooth_dr=smooth_dr,
            lambda_dice=lambda_dice,
            lambda_ce=lambda_ce,
        )
        self.boundary = SignedDistanceBoundaryLoss(
            distance_backend=distance_backend,
            include_background=include_background,
            to_onehot_y=to_onehot_y,
            sigmoid=sigmoid,
            softmax=softmax,
            reduction=reduction,
        )

    @property
    def beta(self) -> float:
        """The current weight of the boundary term."""
        return self._beta

    def set_epoch(self, epoch: int) -> None:
        """Set ``beta`` for the 0-based ``epoch`` following the linear ramp (a no-op without ``beta_max``).

        Args:
            epoch: 0-based epoch index (ignite's ``engine.state.epoch - 1`` at ``EPOCH_STARTED``); negative values
                are treated as 0.
        """
        if self.beta_max is None or self.ramp_epochs == 0:
            return
        frac = min(max(int(epoch), 0), self.ramp_epochs) / self.ramp_epochs
        self._beta = self.beta_start + (self.beta_max - self.beta_start) * frac

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """
        Args:
            input: logits of shape (B, N, H, W[, D]).
            target: (B, N, H, W[, D]) binary / one-hot, or (B, 1, H, W[, D]) class indices with ``to_onehot_y``.

        Raises:
            ValueError: when the shapes of ``input`` and ``target`` are incompatible.
        """
        if input.dim() not in (4, 5):
            raise ValueError(f"input must be (B, N, H, W) or (B, N, H, W, D) logits, got shape {tuple(input.shape)}.")
        if target.dim() != input.dim() or target.shape[0] != input.shape[0] or target.shape[2:] != input.shape[2:]:
            raise ValueError(
                "target must have the batch and spatial shape of input, got input shape "
                f"{tuple(input.shape)} and target shape {tuple(target.shape)}."
            )
        n_in, n_t = input.shape[1], target.shape[1]
        if n_t != n_in and not (n_t == 1 and self.to_onehot_y and n_in > 1):
            hint = " (set to_onehot_y=True for a class-index target)" if n_t == 1 else ""
            raise ValueError(
                f"target has {n_t} channel(s) but input has {n_in}{hint}: input shape {tuple(input.shape)}, "
                f"target shape {tuple(target.shape)}."
            )
        if self.to_onehot_y and n_in > 1 and n_t != 1:
            raise ValueError(
                f"to_onehot_y=True expects a class-index target with 1 channel, got target shape {tuple(target.shape)}"
                f" for input shape {tuple(input.shape)} (set to_onehot_y=False for a one-hot target)."
            )
        # float32 whatever the precision of the run: half-precision logits are promoted and autocast is off here
        with autocast_off(input):
            return self._forward_float32(_promote(input), _promote(target), n_in, n_t)

    def _forward_float32(self, input: torch.Tensor, target: torch.Tensor, n_in: int, n_t: int) -> torch.Tensor:
        """The loss of checked, float32 (or float64) ``input`` / ``target`` with ``n_in`` / ``n_t`` channels."""
        dice = self.dice_ce.dice(input, target)
        if self.sigmoid:
            # BCE on every channel (DiceCELoss itself switches to softmax CE whenever N > 1)
            bce_target = one_hot(target, num_classes=n_in) if self.to_onehot_y and n_t == 1 and n_in > 1 else target
            ce_name, ce = "bce", self.dice_ce.bce(input, bce_target)
        else:
            ce_name, ce = "ce", (self.dice_ce.ce(input, target) if n_in != 1 else self.dice_ce.bce(input, target))
        loss: torch.Tensor = self.dice_ce.lambda_dice * dice + self.dice_ce.lambda_ce * ce  # = DiceCELoss's sum
        terms = {"dice": dice.detach(), ce_name: ce.detach()}
        if self._beta > 0:
            boundary = self.boundary(input, target)
            loss = loss + self._beta * boundary
            terms.update(boundary=boundary.detach(), boundary_weighted=self._beta * boundary.detach())
        self.last_terms = terms
        return loss
