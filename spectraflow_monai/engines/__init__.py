"""Training engines of SpectraFlow (Stage-1 MeanFlow pretraining as a MONAI trainer)."""

from .pretrainer import (
    EncoderExportHandler,
    LinearDecayLR,
    MeanFlowPretrainer,
    encoder_export_state_dict,
    linear_lr_schedule,
    normalize_latent,
    save_encoder_export,
)

__all__: list[str] = [
    "EncoderExportHandler",
    "LinearDecayLR",
    "MeanFlowPretrainer",
    "encoder_export_state_dict",
    "linear_lr_schedule",
    "normalize_latent",
    "save_encoder_export",
]

from .mae import MAEPretrainer, encode_visible, random_masking  # noqa: E402

__all__ += ["MAEPretrainer", "encode_visible", "random_masking"]
