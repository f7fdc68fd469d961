"""Parameter groups with a Keras-style L2 penalty on the convolution kernels (Zhou et al.'s U-Net++ reference code).

Keras's ``kernel_regularizer=l2(c)`` adds ``c * sum(w ** 2)`` of a layer's kernel to the loss, so the gradient of
that kernel gains ``2 * c * w`` while its bias and every other parameter gain nothing; the optimizer (Adam in
Zhou et al.'s "UNet++: A Nested U-Net Architecture for Medical Image Segmentation", DLMIA 2018) then sees that
gradient. ``torch.optim.Adam(weight_decay=d)`` adds ``d * w`` to the gradient of the parameters of a group, the same
coupled penalty, so a group of the convolution kernels with ``weight_decay = 2 * c`` beside a group of the rest with
``weight_decay = 0`` is that regulariser. AdamW's decoupled weight decay (the Stage-2 default) is not: it shrinks
every parameter by ``lr * d`` outside Adam's scaling. ``monai.optimizers.generate_param_groups`` sets a learning rate
per group, not a weight decay.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["KERNEL_L2_LAYERS", "kernel_l2_parameter_groups"]

#: the layers whose kernel (``weight``) takes the penalty: the convolutions, as Zhou et al.'s ``Conv2D`` layers with
#: ``kernel_regularizer=l2(1e-4)``. Transposed convolutions (``nn.ConvTranspose*``, not subclasses of these) are left
#: out, as their ``Conv2DTranspose`` layers carry no regulariser.
KERNEL_L2_LAYERS: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def kernel_l2_parameter_groups(network: nn.Module, l2: float = 1e-4) -> list[dict[str, Any]]:
    """The optimizer parameter groups of ``network``'s trainable parameters: the kernels of its convolutions
    (:data:`KERNEL_L2_LAYERS`) with ``weight_decay = 2 * l2``, everything else (biases, transposed convolutions,
    normalisation) with ``weight_decay = 0`` (an empty group is left out). Given to ``torch.optim.Adam`` (coupled
    weight decay), this is the loss ``L + l2 * sum(kernel ** 2)`` of Keras's ``kernel_regularizer=l2(l2)``; do not
    give it to ``AdamW``, whose decoupled decay is another regulariser.

    Args:
        network: the network; parameters that do not require gradient are left out.
        l2: the penalty coefficient ``c`` of ``c * sum(w ** 2)``, ``>= 0``. Defaults to 1e-4 (Zhou et al.).

    Raises:
        ValueError: ``l2`` is not a non-negative number.
    """
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not l2 >= 0:
        raise ValueError(f"l2 must be a non-negative number, got {l2!r}.")
    kernels = {id(m.weight) for m in network.modules() if isinstance(m, KERNEL_L2_LAYERS)}
    trainable = [p for p in network.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if id(p) in kernels], "weight_decay": 2.0 * float(l2)},
        {"params": [p for p in trainable if id(p) not in kernels], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]
