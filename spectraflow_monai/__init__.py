"""SpectraFlow for MONAI: structure-aware pretraining and frequency-adaptive decoding for medical image segmentation.

Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image Segmentation".
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
