"""Learning-rate schedules and parameter groups of SpectraFlow (the counterpart of ``monai.optimizers``)."""

from .lr_scheduler import LinearDecayLR, linear_lr_schedule
from .param_groups import KERNEL_L2_LAYERS, kernel_l2_parameter_groups

__all__ = ["KERNEL_L2_LAYERS", "LinearDecayLR", "kernel_l2_parameter_groups", "linear_lr_schedule"]
