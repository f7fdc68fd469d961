from .finite import NONFINITE_MODES, CheckFinite, CheckFinited, check_finite, count_nonfinite
from .label import (
    BinarizeLabel,
    BinarizeLabelD,
    BinarizeLabeld,
    BinarizeLabelDict,
    LabelClasses,
    LabelClassesd,
    SaveLabelValuesd,
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
from .batched import (
    BatchCompose,
    batched_twins,
    BatchRandomizable,
    NormalizeIntensityBatch,
    NormalizeIntensityBatchd,
    RandAdjustContrastBatch,
    RandAdjustContrastBatchd,
    RandAffineBatch,
    RandAffineBatchd,
    RandFlipBatch,
    RandFlipBatchd,
    RandGaussianSmoothBatch,
    RandGaussianSmoothBatchd,
    RandRotate90Batch,
    RandRotate90Batchd,
    RandScaleIntensityBatch,
    RandScaleIntensityBatchd,
    RandShiftIntensityBatch,
    RandShiftIntensityBatchd,
)
from .mixed_domain_batch import MIXED_DOMAIN_VIEWS, MixedDomainCollate, RandMixedDomainBatchd, num_masks

__all__: list[str] = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MaskToImage",
    "RandMixedDomain",
    "RandMixedDomainD",
    "RandMixedDomaind",
    "RandMixedDomainDict",
]

__all__ += ["BinarizeLabel", "BinarizeLabelD", "BinarizeLabeld", "BinarizeLabelDict", "LabelClasses", "LabelClassesd"]
__all__ += ["SaveLabelValuesd"]

__all__ += ["NONFINITE_MODES", "CheckFinite", "CheckFinited", "check_finite", "count_nonfinite"]
__all__ += ["MIXED_DOMAIN_VIEWS", "MixedDomainCollate", "RandMixedDomainBatchd", "num_masks"]
__all__ += ["BatchCompose", "BatchRandomizable", "NormalizeIntensityBatch", "NormalizeIntensityBatchd"]
__all__ += ["RandAdjustContrastBatch", "RandAdjustContrastBatchd", "RandAffineBatch", "RandAffineBatchd"]
__all__ += ["RandFlipBatch", "RandFlipBatchd", "RandGaussianSmoothBatch", "RandGaussianSmoothBatchd"]
__all__ += ["RandRotate90Batch", "RandRotate90Batchd", "RandScaleIntensityBatch", "RandScaleIntensityBatchd"]
__all__ += ["RandShiftIntensityBatch", "RandShiftIntensityBatchd", "batched_twins"]

from .corruptions import (
    CORRUPTION_KINDS,
    CORRUPTION_SEVERITIES,
    MAX_SEVERITY,
    BrightnessCorruption,
    BrightnessCorruptiond,
    ContrastCorruption,
    ContrastCorruptiond,
    Corruption,
    Corruptiond,
    GaussianBlurCorruption,
    GaussianBlurCorruptiond,
    GaussianNoiseCorruption,
    GaussianNoiseCorruptiond,
    corruption_parameter,
)

__all__ += ["CORRUPTION_KINDS", "CORRUPTION_SEVERITIES", "MAX_SEVERITY", "corruption_parameter"]
__all__ += ["BrightnessCorruption", "BrightnessCorruptiond", "ContrastCorruption", "ContrastCorruptiond"]
__all__ += ["GaussianBlurCorruption", "GaussianBlurCorruptiond", "GaussianNoiseCorruption", "GaussianNoiseCorruptiond"]
__all__ += ["Corruption", "Corruptiond"]
