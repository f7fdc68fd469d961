"""Building blocks of the SpectraFlow decoder."""

from .daf import DirectAttentionalFusion
from .decoder import FUSION_MODES, REFINE_MODES, RefinementBlock, SpectraFlowDecoder

__all__: list[str] = [
    "DirectAttentionalFusion",
    "FUSION_MODES",
    "REFINE_MODES",
    "RefinementBlock",
    "SpectraFlowDecoder",
]
