"""MeanFlow regression loss for SpectraFlow's Stage-1 latent pretraining.

Implements the self-distilled MeanFlow objective (Geng et al. 2025, "Mean Flows for One-step Generative Modeling")
as used by SpectraFlow (Chen et al.), Sec. "Stage-1: MeanFlow Pretraining", eqs. (1)–(3): the encoder latent
``z0`` is perturbed along the linear path ``z_t = (1 - t)·z0 + t·ε`` (eq. (1)); a head ``u = h(z_t, t, s)``
regresses the average velocity between ``s`` and ``t`` (eq. (2)) towards the stop-gradient MeanFlow target
``v - (t - s)·(∂u/∂z·v + ∂u/∂t)`` with ``v = ε - z0`` (eq. (3)).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from monai.utils import LossReduction
from torch import Tensor
from torch.nn.modules.loss import _Loss

__all__ = ["MeanFlowLoss", "meanflow_target", "math_sdpa"]


@contextlib.contextmanager
def math_sdpa() -> Iterator[None]:
    """Context manager restricting ``F.scaled_dot_product_attention`` to the math backend.

    Forward-mode AD is not implemented for the fused (flash / memory-efficient / cuDNN / CPU-flash) SDPA kernels,
    so any JVP through an attention layer must run inside this context.
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False):
            yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield


def _batch_view(x: Tensor, ndim: int) -> Tensor:
    """Reshape a ``(B,)`` tensor to ``(B, 1, ..., 1)`` with ``ndim`` dims in total."""
    return x.reshape(-1, *([1] * (ndim - 1)))


def meanflow_target(
    u_fn: Callable[[Tensor, Tensor, Tensor], Tensor], z_t: Tensor, t: Tensor, s: Tensor, v: Tensor
) -> Tensor:
    """Stop-gradient MeanFlow target ``v - (t - s)·(∂u/∂z·v + ∂u/∂t)``.

    The total derivative ``du/dt = ∂u/∂z·v + ∂u/∂t`` along the flow is one forward-mode JVP of ``u_fn`` at
    ``(z_t, t, s)`` with tangents ``(v, 1, 0)`` (the MeanFlow identity of Geng et al. 2025; SpectraFlow eq. (3)).
    The JVP runs under ``torch.no_grad``, with autocast disabled, in at least float32 (float16/bfloat16 inputs are
    promoted; float64 stays float64) and with the math SDPA backend (forward-mode AD is not implemented for the
    fused attention kernels). ``u_fn`` must therefore have float32 (or float64) parameters and no in-place state
    updates (no BatchNorm running statistics).

    Args:
        u_fn: callable ``u_fn(z, t, s) -> u`` with ``u`` shaped like ``z``; ``t`` and ``s`` are passed with shape
            ``(B,)``. Extra conditioning (e.g. a domain label) must be bound in a closure.
        z_t: perturbed latent ``(B, ...)``.
        t: end times ``(B,)``.
        s: start times ``(B,)``.
        v: conditional velocity ``ε - z0``, shaped like ``z_t``.

    Returns:
        the detached target, shaped like ``z_t``, in the JVP dtype (float32 unless the inputs are float64).

    Raises:
        ValueError: if ``v`` does not match ``z_t`` or ``t`` / ``s`` are not ``(B,)``.
    """
    if v.shape != z_t.shape:
        raise ValueError(f"v must have the shape of z_t {tuple(z_t.shape)}, got {tuple(v.shape)}.")
    b = z_t.shape[0]
    if t.shape != (b,) or s.shape != (b,):
        raise ValueError(f"t and s must have shape ({b},), got t {tuple(t.shape)} and s {tuple(s.shape)}.")
    dtype = torch.promote_types(z_t.dtype, torch.float32)
    z_t, v = z_t.detach().to(dtype), v.detach().to(dtype)
    t, s = t.detach().to(dtype), s.detach().to(dtype)
    device_type = z_t.device.type if z_t.device.type in ("cuda", "cpu", "xpu", "mps") else "cpu"
    with torch.no_grad(), torch.autocast(device_type=device_type, enabled=False), math_sdpa():
        _, dudt = torch.func.jvp(u_fn, (z_t, t, s), (v, torch.ones_like(t), torch.zeros_like(s)))
    dudt = dudt.to(dtype)
    return (v - _batch_view(t - s, z_t.ndim) * dudt).detach()


class MeanFlowLoss(_Loss):
    """Self-distilled MeanFlow loss with adaptive weighting, for Stage-1 encoder pretraining in SpectraFlow.

    For a latent batch ``z0`` (SpectraFlow eq. (1) with ``α_t = 1 - t``, ``σ_t = t``)::

        z_t = (1 - t)·z0 + t·ε,     v = ε - z0,
        u   = head(z_t, t, s)                                   (with gradient)
        u_tgt = sg(v - (t - s)·(∂u/∂z·v + ∂u/∂t))               (:func:`meanflow_target`, no gradient)
        L_i = Σ_{C,h,w} (u - u_tgt)²,   loss_i = L_i / sg((L_i + c)^p)

    following MeanFlow (Geng et al. 2025, "Mean Flows for One-step Generative Modeling", official defaults
    ``p = 1``, ``c = 1e-2``) and SpectraFlow eqs. (2)–(3). The prediction carries gradient into the head and,
    through ``z_t``, into the encoder that produced ``z0``; the target is computed with the current weights under
    no-grad and is fully stop-gradient (including its dependence on ``z0``). A ``DataParallel`` /
    ``DistributedDataParallel`` head is unwrapped (``.module``) for the JVP only.

    Time sampling (:meth:`sample_times`): ``t`` and ``s`` are drawn independently from the logit-normal
    ``sigmoid(N(time_mean, time_std))``, ``t = max``, ``s = min``; then all but a random subset of
    ``ratio_unequal·B`` rows get ``s = t``. When ``ratio_unequal·B`` is not an integer it is rounded
    stochastically (floor or ceil, with the fractional part as probability of ceil), so that the count is exact
    for integer products and unbiased otherwise (small batches keep a chance of ``s ≠ t`` rows). The subset is
    random rather than the last rows so that it is independent of any ordering of the batch (e.g. images before
    masks in mixed-domain batches).

    For logging, :meth:`compute` returns ``{"loss": ..., "mse": ...}`` where ``mse`` is the detached, un-weighted
    mean squared error per element; :meth:`forward` returns ``compute(...)["loss"]``.

    Args:
        time_mean: mean of the logit-normal time distribution. Defaults to -0.4 (official ImageNet config).
        time_std: std of the logit-normal time distribution, > 0. Defaults to 1.0.
        ratio_unequal: fraction of rows with ``s ≠ t``, in ``[0, 1]`` (official ``1 - data_proportion = 0.25``).
            0 reduces MeanFlow to flow matching (``u`` = instantaneous velocity). Defaults to 0.25.
        adaptive_p: power ``p >= 0`` of the adaptive weight (bundle setting ``meanflow_adaptive_p``). ``0``: no
            weight, the plain per-sample squared error of SpectraFlow eq. (3) as printed. ``1`` (MeanFlow's official
            weight, an extension of eq. (3)): each sample's loss is ``L_i / sg(L_i + c)``, close to 1 whatever the
            error, so every sample contributes a gradient of about unit scale (``∇L_i / (L_i + c)``) and the loss
            value itself says little about progress. Defaults to 1.0.
        adaptive_c: constant ``c > 0`` of the adaptive weight (bundle setting ``meanflow_adaptive_c``). Defaults to
            1e-2.
        reduction: {``"none"``, ``"mean"``, ``"sum"``} over the batch; ``"none"`` returns ``(B,)``.
            Defaults to ``"mean"``.

    Example::

        loss_fn = MeanFlowLoss()
        head = MeanFlowHead(in_channels=384)
        z0 = encoder(x)                                    # (B, 384, 16, 16), requires grad
        loss = loss_fn(head, z0, domain=domain)           # head kwargs are forwarded
        out = loss_fn.compute(head, z0)                    # {"loss": ..., "mse": ...}
    """

    def __init__(
        self,
        time_mean: float = -0.4,
        time_std: float = 1.0,
        ratio_unequal: float = 0.25,
        adaptive_p: float = 1.0,
        adaptive_c: float = 1e-2,
        reduction: LossReduction | str = LossReduction.MEAN,
    ) -> None:
        super().__init__(reduction=LossReduction(reduction).value)
        if not math.isfinite(time_mean):
            raise ValueError(f"time_mean must be finite, got {time_mean!r}.")
        if not (math.isfinite(time_std) and time_std > 0):
            raise ValueError(f"time_std must be > 0, got {time_std!r}.")
        if not 0.0 <= ratio_unequal <= 1.0:
            raise ValueError(f"ratio_unequal must be in [0, 1], got {ratio_unequal!r}.")
        if not adaptive_p >= 0:
            raise ValueError(f"adaptive_p must be >= 0, got {adaptive_p!r}.")
        if not adaptive_c > 0:
            raise ValueError(f"adaptive_c must be > 0, got {adaptive_c!r}.")
        self.time_mean = float(time_mean)
        self.time_std = float(time_std)
        self.ratio_unequal = float(ratio_unequal)
        self.adaptive_p = float(adaptive_p)
        self.adaptive_c = float(adaptive_c)

    def sample_times(
        self,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sample ``(t, s)`` of shape ``(batch_size,)`` with ``0 < s <= t < 1``.

        Args:
            batch_size: number of rows ``B >= 1``.
            device: device of the returned tensors (and of ``generator``).
            dtype: floating dtype of the returned tensors. Defaults to float32.
            generator: optional random generator (on ``device``) for reproducibility.

        Returns:
            ``(t, s)``; exactly ``round_stochastic(ratio_unequal·B)`` random rows keep ``s < t``, the others
            have ``s = t``.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        a = torch.randn(2, batch_size, device=device, generator=generator, dtype=torch.float32)
        a = torch.sigmoid(a * self.time_std + self.time_mean)
        t, s = a.max(dim=0).values, a.min(dim=0).values
        expected = self.ratio_unequal * batch_size
        n_unequal = math.floor(expected)
        frac = expected - n_unequal
        if frac > 1e-9 and float(torch.rand((), device=device, generator=generator)) < frac:
            n_unequal += 1
        equal = torch.ones(batch_size, dtype=torch.bool, device=t.device)
        equal[torch.randperm(batch_size, device=device, generator=generator)[:n_unequal]] = False
        s = torch.where(equal, t, s)
        return t.to(dtype), s.to(dtype)

    def compute(
        self,
        head: Callable[..., Tensor],
        z0: Tensor,
        noise: Tensor | None = None,
        t: Tensor | None = None,
        s: Tensor | None = None,
        **head_kwargs,
    ) -> dict[str, Tensor]:
        """Compute the MeanFlow loss and the un-weighted MSE.

        Args:
            head: the average-velocity network, called as ``head(z_t, t, s, **head_kwargs)`` with ``t``, ``s`` of
                shape ``(B,)`` (e.g. :class:`spectraflow_monai.networks.nets.MeanFlowHead`).
            z0: clean latents ``(B, ...)`` with at least 2 dims (``(B, C, h, w)`` for the MeanFlow head); may carry
                gradient to the encoder.
                float16 / bfloat16 latents (an encoder under autocast) are promoted to float32: the noise, the flow
                path ``z_t``, the JVP target and the loss are float32; the head runs under the caller's autocast.
            noise: optional ``ε`` shaped like ``z0``; standard normal when None.
            t: optional end times ``(B,)``; sampled with :meth:`sample_times` (together with ``s``) when None.
            s: optional start times ``(B,)`` with ``s <= t``; must be given together with ``t``.
            head_kwargs: extra keyword arguments for ``head`` (e.g. ``domain``), also used inside the JVP.

        Returns:
            dict with ``"loss"`` (reduced as ``reduction``, with gradient) and ``"mse"`` (detached scalar, mean of
            ``(u - u_tgt)²`` over all elements).
        """
        if z0.ndim < 2:
            raise ValueError(f"z0 must have shape (B, ...) with at least 2 dims, got {tuple(z0.shape)}.")
        if not z0.is_floating_point():
            raise ValueError(f"z0 must be a floating tensor, got dtype {z0.dtype}.")
        b = z0.shape[0]
        # the flow path, the target and the loss in at least float32 (a bfloat16 / float16 latent from an autocast
        # encoder is promoted; the gradient still flows back through the cast), the head itself under the caller's
        # autocast
        work_dtype = torch.promote_types(z0.dtype, torch.float32)
        z0 = z0.to(work_dtype)
        if noise is None:
            noise = torch.randn_like(z0)
        elif noise.shape != z0.shape:
            raise ValueError(f"noise must have the shape of z0 {tuple(z0.shape)}, got {tuple(noise.shape)}.")
        noise = noise.to(work_dtype)
        if (t is None) != (s is None):
            raise ValueError("t and s must be given together (or both left None to sample them).")
        if t is None or s is None:
            t, s = self.sample_times(b, device=z0.device)
        else:
            t = torch.as_tensor(t, device=z0.device)
            s = torch.as_tensor(s, device=z0.device)
            if t.shape != (b,) or s.shape != (b,):
                raise ValueError(f"t and s must have shape ({b},), got t {tuple(t.shape)} and s {tuple(s.shape)}.")
            if bool((t < s).any()):
                raise ValueError("t must be >= s in every row.")
        t, s = t.to(work_dtype), s.to(work_dtype)

        tb = _batch_view(t, z0.ndim)
        z_t = (1 - tb) * z0 + tb * noise
        v = noise - z0

        u_pred = head(z_t, t, s, **head_kwargs)
        if u_pred.shape != z0.shape:
            raise ValueError(f"head output must have the shape of z0 {tuple(z0.shape)}, got {tuple(u_pred.shape)}.")

        parallel = (torch.nn.parallel.DataParallel, torch.nn.parallel.DistributedDataParallel)
        target_head = head.module if isinstance(head, parallel) else head

        def u_fn(z: Tensor, tt: Tensor, ss: Tensor) -> Tensor:
            return target_head(z, tt, ss, **head_kwargs)

        u_tgt = meanflow_target(u_fn, z_t.detach(), t.detach(), s.detach(), v.detach())

        sq = (u_pred.float() - u_tgt.float()).pow(2)
        per_sample = sq.flatten(1).sum(dim=1)
        weight = (per_sample.detach() + self.adaptive_c).pow(self.adaptive_p)
        loss = per_sample / weight
        if self.reduction == LossReduction.MEAN.value:
            loss = loss.mean()
        elif self.reduction == LossReduction.SUM.value:
            loss = loss.sum()
        return {"loss": loss, "mse": sq.detach().mean()}

    def forward(
        self,
        head: Callable[..., Tensor],
        z0: Tensor,
        noise: Tensor | None = None,
        t: Tensor | None = None,
        s: Tensor | None = None,
        **head_kwargs,
    ) -> Tensor:
        """Return ``compute(head, z0, noise, t, s, **head_kwargs)["loss"]``; see :meth:`compute`."""
        return self.compute(head, z0, noise, t, s, **head_kwargs)["loss"]
