"""Full networks of SpectraFlow: the segmentation network and the Stage-1 MeanFlow head."""

from .meanflow_head import MeanFlowHead
from .spectraflow import SpectraFlowNet
from .unetpp import UNetPlusPlus

__all__: list[str] = ["MeanFlowHead", "SpectraFlowNet", "UNetPlusPlus"]
