"""Learning-rate schedules of SpectraFlow (the counterpart of ``monai.optimizers``)."""

from .lr_scheduler import LinearDecayLR, linear_lr_schedule

__all__ = ["LinearDecayLR", "linear_lr_schedule"]
