"""Networks of SpectraFlow: the DINOv2 encoder, the DAF/FDConv decoder blocks and the full segmentation network."""

from .blocks import DirectAttentionalFusion, FDConv2d, RefinementBlock, SpectraFlowDecoder
from .encoders import DINOv2Encoder, EncoderFeatures
from .nets import MeanFlowHead, SpectraFlowNet

__all__: list[str] = [
    "DINOv2Encoder",
    "DirectAttentionalFusion",
    "EncoderFeatures",
    "FDConv2d",
    "MeanFlowHead",
    "RefinementBlock",
    "SpectraFlowDecoder",
    "SpectraFlowNet",
]
