"""Light MAE decoder: reconstructs the pixels of masked patches from the visible encoder tokens (Stage-1 only).

The mixed-domain MAE Stage-1 variant (the baseline of SpectraFlow's Table 2, Chen et al.) pretrains the DINOv2
encoder with masked-patch reconstruction in the style of He et al. 2022 ("Masked Autoencoders Are Scalable Vision
Learners"): the encoder sees only the visible patches; this decoder gets their tokens, inserts a shared learned
mask token at every removed position, adds fixed 2D sine-cosine position embeddings, runs a few transformer blocks
and predicts the ``p*p*C`` pixel values of every patch. Like the MeanFlow head it is discarded after Stage-1: only
the encoder is exported for Stage-2.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from monai.networks.blocks.transformerblock import TransformerBlock
from torch import Tensor, nn

__all__ = ["MAEDecoder", "sincos_position_embedding_2d"]


def sincos_position_embedding_2d(
    grid_size: Sequence[int], dim: int, temperature: float = 10000.0, device=None, dtype=None
) -> Tensor:
    """Fixed 2D sine-cosine position embedding ``(1, h*w, dim)`` of a patch grid in raster order (as MAE).

    The first half of the channels encodes the row, the second half the column, each as
    ``[sin(pos * f_k), cos(pos * f_k)]`` with ``f_k = temperature^(-k / (dim / 4))``, ``k = 0..dim/4 - 1``.

    Args:
        grid_size: ``(h, w)``.
        dim: embedding width, a multiple of 4.
        temperature: the lowest frequency is ``1 / temperature``. Defaults to 10000.
        device: device of the result.
        dtype: dtype of the result (computed in float32).

    Raises:
        ValueError: ``dim`` not a positive multiple of 4 or a malformed ``grid_size``.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 4 or dim % 4:
        raise ValueError(f"dim must be a positive multiple of 4, got {dim!r}.")
    if len(grid_size) != 2 or min(int(g) for g in grid_size) < 1:
        raise ValueError(f"grid_size must be (h, w) with positive entries, got {grid_size!r}.")
    h, w = int(grid_size[0]), int(grid_size[1])
    quarter = dim // 4
    freqs = temperature ** (-torch.arange(quarter, device=device, dtype=torch.float32) / quarter)
    rows = torch.arange(h, device=device, dtype=torch.float32)[:, None].expand(h, w).reshape(-1)
    cols = torch.arange(w, device=device, dtype=torch.float32)[None, :].expand(h, w).reshape(-1)
    parts = []
    for pos in (rows, cols):
        args = pos[:, None] * freqs[None]
        parts += [torch.sin(args), torch.cos(args)]
    return torch.cat(parts, dim=1).unsqueeze(0).to(dtype=dtype or torch.float32)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value


class MAEDecoder(nn.Module):
    """Lightweight transformer decoder of a masked autoencoder (He et al. 2022), for SpectraFlow's MAE Stage-1.

    ``forward(tokens, ids_restore, grid_size)``:

    1. the encoder tokens of the visible patches (after the encoder's final norm, prefix tokens first) are projected
       to ``hidden_size``;
    2. a learned mask token fills the ``N - K`` removed positions and ``ids_restore`` puts the ``N`` patch tokens
       back in raster order (the MAE "unshuffle");
    3. fixed 2D sine-cosine position embeddings of the ``(h, w)`` grid are added to the patch tokens (any grid size
       works, nothing depends on the training resolution); the prefix tokens (class token, registers) keep no
       position, as MAE's class token;
    4. ``num_layers`` transformer blocks (MONAI ``TransformerBlock``: pre-norm self-attention + MLP), a LayerNorm and
       a linear layer predict ``patch_size**2 * out_channels`` values per patch; the prefix outputs are dropped.

    He et al. find a narrow, shallow decoder enough for a good encoder (their Table 1: one block already works for
    fine-tuning); the defaults (256 wide, 2 blocks) keep the decoder a small fraction of a ViT-S/14 encoder.

    Args:
        in_channels: width of the encoder tokens (``DINOv2Encoder.embed_dim``).
        patch_size: side ``p`` of the encoder's patches (14 for DINOv2).
        out_channels: channels of the reconstructed images. Defaults to 3.
        hidden_size: decoder width, a multiple of ``num_heads`` and of 4 (the 2D sine-cosine embedding).
            Defaults to 256.
        num_layers: number of transformer blocks, ``>= 1``. Defaults to 2.
        num_heads: attention heads. Defaults to 8.
        mlp_ratio: MLP width of the blocks relative to ``hidden_size``, ``> 0``. Defaults to 4.0.

    Raises:
        ValueError: any argument outside its range.

    Example:
        >>> decoder = MAEDecoder(in_channels=384, patch_size=14)
        >>> tokens = torch.randn(2, 1 + 4, 384)            # class token + 4 visible patch tokens
        >>> ids_restore = torch.argsort(torch.rand(2, 16), dim=1)
        >>> decoder(tokens, ids_restore, (4, 4)).shape
        torch.Size([2, 16, 588])
    """

    def __init__(
        self,
        in_channels: int,
        patch_size: int,
        out_channels: int = 3,
        hidden_size: int = 256,
        num_layers: int = 2,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        _positive_int("in_channels", in_channels)
        _positive_int("patch_size", patch_size)
        _positive_int("out_channels", out_channels)
        _positive_int("hidden_size", hidden_size)
        _positive_int("num_layers", num_layers)
        _positive_int("num_heads", num_heads)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size must be divisible by num_heads={num_heads}, got {hidden_size}.")
        if hidden_size % 4:
            raise ValueError(f"hidden_size must be a multiple of 4 (2D sine-cosine positions), got {hidden_size}.")
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or not mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio!r}.")
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.out_channels = out_channels
        self.hidden_size = hidden_size

        self.embed = nn.Linear(in_channels, hidden_size)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        mlp_dim = max(1, int(round(hidden_size * float(mlp_ratio))))
        self.blocks = nn.ModuleList(
            [TransformerBlock(hidden_size, mlp_dim, num_heads, qkv_bias=True) for _ in range(num_layers)]
        )
        self.norm = nn.LayerNorm(hidden_size)
        self.pred = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self._init_weights()

    def _init_weights(self) -> None:
        """MAE's initialisation: xavier-uniform linear layers with zero bias, mask token N(0, 0.02)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def position_embedding(self, grid_size: Sequence[int], device=None, dtype=None) -> Tensor:
        """Fixed 2D sine-cosine embedding ``(1, h*w, hidden_size)`` of a patch grid
        (:func:`sincos_position_embedding_2d`)."""
        return sincos_position_embedding_2d(grid_size, self.hidden_size, device=device, dtype=dtype)

    def forward(
        self, tokens: Tensor, ids_restore: Tensor, grid_size: Sequence[int], num_prefix_tokens: int = 1
    ) -> Tensor:
        """Predict the pixels of every patch.

        Args:
            tokens: ``(B, P + K, in_channels)`` encoder output: ``P = num_prefix_tokens`` prefix tokens then the
                ``K`` visible patch tokens in the order of ``ids_restore``'s shuffle (the first ``K`` of it).
            ids_restore: ``(B, N)`` permutation that puts ``[visible..., masked...]`` back in raster order
                (``argsort`` of the shuffle), ``N = h * w >= K``.
            grid_size: ``(h, w)`` patch rows and columns.
            num_prefix_tokens: ``P`` (1 for DINOv2's class token, 5 with four registers). Defaults to 1.

        Returns:
            ``(B, N, patch_size**2 * out_channels)`` predicted patches in raster order (see
            :func:`spectraflow_monai.losses.mae.patchify`).

        Raises:
            ValueError: shapes that do not fit together.
        """
        if tokens.ndim != 3 or tokens.shape[-1] != self.in_channels:
            raise ValueError(f"tokens must have shape (B, P + K, {self.in_channels}), got {tuple(tokens.shape)}.")
        if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int) or num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be an int >= 0, got {num_prefix_tokens!r}.")
        if len(grid_size) != 2:
            raise ValueError(f"grid_size must be (h, w), got {grid_size!r}.")
        b = tokens.shape[0]
        n = int(grid_size[0]) * int(grid_size[1])
        k = tokens.shape[1] - num_prefix_tokens
        if ids_restore.shape != (b, n):
            raise ValueError(
                f"ids_restore must have shape ({b}, {n}) for grid {tuple(grid_size)}, got {tuple(ids_restore.shape)}."
            )
        if not 0 < k <= n:
            raise ValueError(f"tokens hold {k} patch tokens after {num_prefix_tokens} prefix tokens; expected 1..{n}.")

        x = self.embed(tokens)
        prefix, visible = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]
        filled = torch.cat([visible, self.mask_token.to(x.dtype).expand(b, n - k, -1)], dim=1)
        index = ids_restore.to(device=x.device, dtype=torch.long).unsqueeze(-1).expand(-1, -1, x.shape[-1])
        patches = torch.gather(filled, 1, index)
        patches = patches + self.position_embedding(grid_size, device=x.device, dtype=x.dtype)
        x = torch.cat([prefix, patches], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.pred(self.norm(x))[:, num_prefix_tokens:]
