from .label import BinarizeLabel, BinarizeLabelD, BinarizeLabeld, BinarizeLabelDict
from .ct import (
    CTWindow,
    CTWindowd,
    LoadSynapseH5d,
    LoadSynapseSliced,
    MapBTCVLabels,
    MapBTCVLabelsd,
    load_slice_npz,
)
from .mixed_domain import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MaskToImage,
    RandMixedDomain,
    RandMixedDomainD,
    RandMixedDomaind,
    RandMixedDomainDict,
)
from .mixed_domain_batch import MixedDomainCollate, num_masks

__all__: list[str] = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MaskToImage",
    "RandMixedDomain",
    "RandMixedDomainD",
    "RandMixedDomaind",
    "RandMixedDomainDict",
]

__all__ += ["BinarizeLabel", "BinarizeLabelD", "BinarizeLabeld", "BinarizeLabelDict"]

__all__ += ["CTWindow", "CTWindowd", "LoadSynapseSliced", "MapBTCVLabels", "MapBTCVLabelsd", "load_slice_npz"]
__all__ += ["LoadSynapseH5d"]
__all__ += ["MixedDomainCollate", "num_masks"]
