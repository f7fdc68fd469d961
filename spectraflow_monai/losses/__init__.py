from .dice_bce_boundary import DiceBCEBoundaryLoss, SignedDistanceBoundaryLoss, cucim_available
from .dispersive import DispersiveLoss
from .meanflow import MeanFlowLoss, math_sdpa, meanflow_target

__all__: list[str] = [
    "DiceBCEBoundaryLoss",
    "SignedDistanceBoundaryLoss",
    "cucim_available",
    "DispersiveLoss",
    "MeanFlowLoss",
    "math_sdpa",
    "meanflow_target",
]

from .mae import MAELoss, patchify, unpatchify  # noqa: E402

__all__ += ["MAELoss", "patchify", "unpatchify"]
