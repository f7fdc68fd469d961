"""Image encoders of SpectraFlow (the encoder E of the paper: a DINOv2 vision transformer)."""

from .dinov2 import DINOv2Encoder, EncoderFeatures

__all__ = ["DINOv2Encoder", "EncoderFeatures"]
