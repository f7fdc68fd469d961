"""Building blocks of the SpectraFlow decoder."""

from .daf import DirectAttentionalFusion
from .fdconv import FDConv2d, FDConvConfig
from .decoder import FUSION_MODES, REFINE_MODES, RefinementBlock, SpectraFlowDecoder

__all__: list[str] = [
    "DirectAttentionalFusion",
    "FDConv2d",
    "FDConvConfig",
    "FUSION_MODES",
    "REFINE_MODES",
    "RefinementBlock",
    "SpectraFlowDecoder",
]
