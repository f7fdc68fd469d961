"""MeanFlow head: the average-velocity network used only in SpectraFlow's Stage-1 pretraining.

The head predicts the MeanFlow average velocity ``u(z_t, t, s)`` on the encoder latent map (SpectraFlow, Chen et
al., Sec. "Stage-1: MeanFlow Pretraining", eq. (2)). Its design follows the DiT backbone used by MeanFlow (Geng et
al. 2025, "Mean Flows for One-step Generative Modeling"): separate sinusoidal embeddings of ``t`` and ``t - s``
summed into one conditioning vector that drives adaLN-zero modulated transformer blocks. It contains no BatchNorm
and no dropout, so that it can be differentiated with forward-mode AD (``torch.func.jvp``) for the MeanFlow target.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from monai.networks.blocks.pos_embed_utils import build_sincos_position_embedding
from torch import Tensor, nn

__all__ = ["MeanFlowHead", "timestep_embedding"]


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding of a batch of scalar times, as in DiT / MeanFlow (raw ``t``, no ×1000 scaling).

    Args:
        t: times of shape ``(B,)``.
        dim: embedding size (even).
        max_period: the lowest frequency is ``1 / max_period``. Defaults to 10000.

    Returns:
        ``(B, dim)`` tensor ``[cos(t·f_k), sin(t·f_k)]`` with ``f_k = max_period^(-k / (dim / 2))``, in the floating
        dtype of ``t`` (at least float32).
    """
    dtype = torch.promote_types(t.dtype, torch.float32)
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=dtype) / half)
    args = t.to(dtype)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class _TimeEmbedder(nn.Module):
    """Sinusoidal frequency embedding followed by Linear–SiLU–Linear."""

    def __init__(self, out_dim: int, freq_dim: int) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, out_dim), nn.SiLU(), nn.Linear(out_dim, out_dim))

    def forward(self, t: Tensor) -> Tensor:
        emb = timestep_embedding(t, self.freq_dim)
        return self.mlp(emb.to(self.mlp[0].weight.dtype))


class _SelfAttention(nn.Module):
    """Multi-head self-attention on tokens ``(B, N, D)`` through ``F.scaled_dot_product_attention``."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


class _DepthwiseConvMixer(nn.Module):
    """Spatial token mixing by a depthwise 3×3 convolution (used when ``use_attention=False``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        b, n, d = x.shape
        x = self.conv(x.transpose(1, 2).reshape(b, d, hw[0], hw[1]))
        return self.proj(x.flatten(2).transpose(1, 2))


class _AdaLNBlock(nn.Module):
    """DiT block with adaLN-zero: modulated LayerNorm → token mixer → gated residual; same for the MLP."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, use_attention: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mixer: nn.Module = _SelfAttention(dim, num_heads) if use_attention else _DepthwiseConvMixer(dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = max(1, int(round(dim * mlp_ratio)))
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.ada_ln = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: Tensor, c: Tensor, hw: tuple[int, int]) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada_ln(c).chunk(6, dim=-1)
        x = x + gate1.unsqueeze(1) * self.mixer(_modulate(self.norm1(x), shift1, scale1), hw)
        x = x + gate2.unsqueeze(1) * self.mlp(_modulate(self.norm2(x), shift2, scale2))
        return x


class MeanFlowHead(nn.Module):
    """Average-velocity network ``h(z_t, t, s[, domain])`` on an encoder latent map, for Stage-1 of SpectraFlow.

    SpectraFlow (Chen et al.) pretrains the encoder with MeanFlow on its latent ``z0 = E(x)`` (Sec. "Stage-1:
    MeanFlow Pretraining", eqs. (1)–(3)); this module is the estimator ``h_θ`` of eq. (2) and is discarded after
    Stage-1. Following MeanFlow (Geng et al. 2025, "Mean Flows for One-step Generative Modeling") and its DiT
    backbone:

    - the conditioning vector is ``MLP_t(emb(t)) + MLP_h(emb(t - s)) [+ E_domain(domain)]``, where ``emb`` is a
      sinusoidal embedding of the raw time in ``[0, 1]`` (no ×1000 scaling) and each MLP is Linear–SiLU–Linear;
      the optional learned domain embedding (0 = image, 1 = mask) tells the head each sample's domain, an extension
      of the method (the paper's head sees no domain label: its mixed-domain batches only mix images and masks);
    - the ``h·w`` latent tokens are projected to ``hidden_channels``, given a fixed 2-D sin-cos position embedding,
      and processed by ``num_blocks`` adaLN-zero blocks (modulated LayerNorm → multi-head self-attention via
      ``F.scaled_dot_product_attention`` → modulated LayerNorm → MLP, both with gated residuals);
    - a modulated LayerNorm and a zero-initialised linear layer project back to ``in_channels``, so the head
      outputs zeros at initialisation (adaLN-zero).

    There is no BatchNorm and no dropout: the MeanFlow target needs a forward-mode JVP of this network, which is
    unsafe with running-statistic updates and would need shared dropout masks. Forward-mode AD is not implemented
    for the fused SDPA kernels; :func:`spectraflow_monai.losses.meanflow_target` therefore runs the JVP under the
    math SDPA backend.

    Args:
        in_channels: channels ``C`` of the latent map (384 for ViT-S/14, 768 for ViT-B/14).
        hidden_channels: token width inside the head; a multiple of 4 (for the 2-D sin-cos position embedding) and
            of ``num_heads``. Defaults to 256.
        num_blocks: number of adaLN-zero blocks. Defaults to 2.
        num_heads: attention heads. Defaults to 4.
        use_attention: if True the token mixer is multi-head self-attention; if False a depthwise 3×3 convolution
            (cheaper, local). Defaults to True.
        num_domains: size of a learned domain embedding (2: image | mask) added to the condition; 0 (the paper,
            whose eqs. 1-3 condition on ``t`` and ``s`` only) disables it. A labelled extension of the method, off by
            default. Defaults to 0.
        time_embed_dim: size of the sinusoidal frequency embedding of ``t`` and ``t - s`` (even). Defaults to 256.
        mlp_ratio: MLP hidden width as a multiple of ``hidden_channels``. Defaults to 2.0.

    Example::

        head = MeanFlowHead(in_channels=384)
        z = torch.randn(2, 384, 16, 16)
        u = head(z, t=torch.rand(2), s=torch.zeros(2))  # (2, 384, 16, 16)
        # the domain-conditioned extension: MeanFlowHead(384, num_domains=2)(z, t, s, domain=torch.tensor([0, 1]))
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int = 256,
        num_blocks: int = 2,
        num_heads: int = 4,
        use_attention: bool = True,
        num_domains: int = 0,
        time_embed_dim: int = 256,
        mlp_ratio: float = 2.0,
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"in_channels must be a positive int, got {in_channels!r}.")
        if not isinstance(hidden_channels, int) or hidden_channels < 4 or hidden_channels % 4 != 0:
            raise ValueError(f"hidden_channels must be a positive multiple of 4, got {hidden_channels!r}.")
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}.")
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}.")
        if use_attention and hidden_channels % num_heads != 0:
            raise ValueError(
                f"hidden_channels ({hidden_channels}) must be divisible by num_heads, got num_heads={num_heads}."
            )
        if not isinstance(num_domains, int) or num_domains < 0:
            raise ValueError(f"num_domains must be a non-negative int, got {num_domains!r}.")
        if not isinstance(time_embed_dim, int) or time_embed_dim < 2 or time_embed_dim % 2 != 0:
            raise ValueError(f"time_embed_dim must be a positive even int, got {time_embed_dim!r}.")
        if not mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio!r}.")

        self.in_channels = in_channels
        self.hidden_channels = hidden_channels
        self.num_domains = num_domains
        self.use_attention = use_attention

        self.in_proj = nn.Linear(in_channels, hidden_channels)
        self.t_embedder = _TimeEmbedder(hidden_channels, time_embed_dim)
        self.h_embedder = _TimeEmbedder(hidden_channels, time_embed_dim)
        self.domain_embed = nn.Embedding(num_domains, hidden_channels) if num_domains > 0 else None
        self.blocks = nn.ModuleList(
            [_AdaLNBlock(hidden_channels, num_heads, mlp_ratio, use_attention) for _ in range(num_blocks)]
        )
        self.norm_out = nn.LayerNorm(hidden_channels, elementwise_affine=False, eps=1e-6)
        self.ada_ln_out = nn.Sequential(nn.SiLU(), nn.Linear(hidden_channels, 2 * hidden_channels))
        self.out_proj = nn.Linear(hidden_channels, in_channels)
        self._pos_cache: dict[tuple, Tensor] = {}
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for emb in (self.t_embedder, self.h_embedder):
            nn.init.normal_(emb.mlp[0].weight, std=0.02)
            nn.init.normal_(emb.mlp[2].weight, std=0.02)
        if self.domain_embed is not None:
            nn.init.normal_(self.domain_embed.weight, std=0.02)
        # adaLN-zero: every residual branch and the output start at zero
        for block in self.blocks:
            nn.init.zeros_(block.ada_ln[-1].weight)
            nn.init.zeros_(block.ada_ln[-1].bias)
        nn.init.zeros_(self.ada_ln_out[-1].weight)
        nn.init.zeros_(self.ada_ln_out[-1].bias)
        nn.init.zeros_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _pos_embed(self, h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Fixed 2-D sin-cos position embedding ``(1, h*w, hidden_channels)``, cached per grid, device and dtype."""
        key = (h, w, str(device), dtype)
        if key not in self._pos_cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # monai's meshgrid call omits `indexing`
                pe = build_sincos_position_embedding([h, w], self.hidden_channels, spatial_dims=2).data
            self._pos_cache[key] = pe.to(device=device, dtype=dtype)
        return self._pos_cache[key]

    @staticmethod
    def _as_batch_times(x: Tensor | float, batch: int, name: str, ref: Tensor) -> Tensor:
        x = torch.as_tensor(x, device=ref.device)
        if x.ndim == 0:
            return x.expand(batch)
        if x.numel() != batch or any(d != 1 for d in x.shape[1:]) or x.shape[0] != batch:
            raise ValueError(
                f"{name} must be a scalar or have shape ({batch},) or ({batch}, 1, ...), got {tuple(x.shape)}."
            )
        return x.reshape(batch)

    def forward(self, z: Tensor, t: Tensor, s: Tensor, domain: Tensor | None = None) -> Tensor:
        """Predict the average velocity ``u(z_t, t, s)``.

        Args:
            z: latent map ``(B, C, h, w)`` with ``C == in_channels``.
            t: end time, a scalar or shape ``(B,)`` (or ``(B, 1, 1, 1)``), values in ``[0, 1]``.
            s: start time (``s <= t``), same shapes as ``t``.
            domain: optional int tensor ``(B,)`` (or a scalar) with values in ``[0, num_domains)``; 0 = image,
                1 = mask. None means image (0) when ``num_domains > 0``. Must be None when ``num_domains == 0``.

        Returns:
            tensor of the same shape as ``z``.
        """
        if z.ndim != 4 or z.shape[1] != self.in_channels:
            raise ValueError(f"z must have shape (B, {self.in_channels}, h, w), got {tuple(z.shape)}.")
        b, _, h, w = z.shape
        t = self._as_batch_times(t, b, "t", z)
        s = self._as_batch_times(s, b, "s", z)

        c = self.t_embedder(t) + self.h_embedder(t - s)
        if self.domain_embed is not None:
            if domain is None:
                domain_idx = torch.zeros(b, dtype=torch.long, device=z.device)
            else:
                domain_idx = torch.as_tensor(domain, device=z.device)
                if domain_idx.is_floating_point() or domain_idx.is_complex():
                    raise ValueError(f"domain must hold integers, got dtype {domain_idx.dtype}.")
                domain_shape = tuple(domain_idx.shape)
                domain_idx = domain_idx.long()
                if domain_idx.ndim == 0:
                    domain_idx = domain_idx.expand(b)
                domain_idx = domain_idx.reshape(-1)
                if domain_idx.numel() != b:
                    raise ValueError(f"domain must be a scalar or have {b} entries, got shape {domain_shape}.")
                lo, hi = int(domain_idx.min()), int(domain_idx.max())
                if lo < 0 or hi >= self.num_domains:
                    raise ValueError(
                        f"domain values must be in [0, {self.num_domains}), got values in [{lo}, {hi}]."
                    )
            c = c + self.domain_embed(domain_idx)
        elif domain is not None:
            raise ValueError("domain was given but the head was built with num_domains=0.")

        x = self.in_proj(z.flatten(2).transpose(1, 2))  # (B, h*w, D)
        x = x + self._pos_embed(h, w, x.device, x.dtype)
        for block in self.blocks:
            x = block(x, c, (h, w))
        shift, scale = self.ada_ln_out(c).chunk(2, dim=-1)
        x = self.out_proj(_modulate(self.norm_out(x), shift, scale))
        return x.transpose(1, 2).reshape(b, self.in_channels, h, w)
