"""Networks of SpectraFlow: the DINOv2 encoder, the DAF/FDConv decoder blocks and the full segmentation network."""

from .blocks import DirectAttentionalFusion, RefinementBlock, SpectraFlowDecoder
from .encoders import DINOv2Encoder, EncoderFeatures
from .nets import MeanFlowHead, SpectraFlowNet

__all__: list[str] = [
    "DINOv2Encoder",
    "DirectAttentionalFusion",
    "EncoderFeatures",
    "MeanFlowHead",
    "RefinementBlock",
    "SpectraFlowDecoder",
    "SpectraFlowNet",
]
