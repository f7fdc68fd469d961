from .label import BinarizeLabel, BinarizeLabelD, BinarizeLabeld, BinarizeLabelDict
from .mixed_domain import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MaskToImage,
    RandMixedDomain,
    RandMixedDomainD,
    RandMixedDomaind,
    RandMixedDomainDict,
)

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
