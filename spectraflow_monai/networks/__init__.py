"""Networks of SpectraFlow: the DINOv2 encoder, the DAF/FDConv decoder blocks, the full segmentation network and
the reading of encoder checkpoints (``weights``) and deployment exports (``export``)."""

from .blocks import DirectAttentionalFusion, FDConv2d, FDConvConfig, RefinementBlock, SpectraFlowDecoder
from .encoders import DINOv2Encoder, EncoderFeatures
from .nets import MeanFlowHead, SpectraFlowNet, UNetPlusPlus

__all__: list[str] = [
    "DINOv2Encoder",
    "DirectAttentionalFusion",
    "EncoderFeatures",
    "FDConv2d",
    "FDConvConfig",
    "MeanFlowHead",
    "RefinementBlock",
    "SpectraFlowDecoder",
    "SpectraFlowNet",
    "UNetPlusPlus",
]

from .nets.mae_decoder import MAEDecoder, sincos_position_embedding_2d  # noqa: E402

__all__ += ["MAEDecoder", "sincos_position_embedding_2d"]
