"""Networks of SpectraFlow: the DINOv2 encoder, the DAF/FDConv decoder blocks and the full segmentation network."""

from .encoders import DINOv2Encoder, EncoderFeatures

__all__: list[str] = ["DINOv2Encoder", "EncoderFeatures"]
