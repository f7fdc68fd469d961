"""SpectraFlow for MONAI: structure-aware pretraining and frequency-adaptive decoding for medical image segmentation.

Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image Segmentation".
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

from spectraflow_monai._lazy import lazy_exports  # noqa: E402

# subpackages are imported when first named (``spectraflow_monai.networks``), so that the command line stays light
__getattr__, __dir__ = lazy_exports(__name__, {})
