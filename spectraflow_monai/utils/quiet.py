"""Known-harmless library warnings, filtered so that a run's output shows what matters.

Each filter names one message of one library, and why it says nothing to a user of the bundles:

- MONAI's notice that a bundle config is evaluated (``parsing config_file ... Only proceed if this config is from a
  source you trust``): silenced only while the package runs its own shipped configs
  (:func:`trusted_bundle_configs`, used by ``spectraflow demo`` and the experiments); a config a user passes to
  ``python -m monai.bundle run`` still shows it.
- ``torch.jit.script`` deprecation (a FutureWarning from torch, raised inside MONAI and timm at import): nothing the
  user can change.
- MONAI's ``get_mask_edges`` argument deprecation (``always_return_as_numpy``; MONAI's own HD95 passes it).
- MONAI's ``the prediction (ground truth) of class N is all 0, this may result in nan/inf distance``: an empty
  prediction is expected (a missed lesion) and is reported by the metric suite itself (``HD95 dropped`` and the
  ``empty prediction = image diagonal`` rows), once per run instead of once per image.
- MONAI's nvImageCodec notices (a ``UserWarning`` of ``NvImgCodecPydicomReader`` and a log line of
  ``monai.data.nvimgcodec_pydicom_plugin``, each time ``LoadImage`` registers its readers): GPU decoding of DICOM
  through pydicom, which no bundle reader uses.

:func:`filter_known_warnings` installs the filters; importing ``spectraflow_monai.utils.excepthook`` (which every
bundle config does) calls it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

__all__ = ["KNOWN_HARMLESS_LOG_RECORDS", "KNOWN_HARMLESS_WARNINGS", "filter_known_warnings", "trusted_bundle_configs"]

#: (category, message regular expression) of the filtered warnings; see the module docstring
KNOWN_HARMLESS_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"`torch\.jit\.script` is deprecated"),
    (FutureWarning, r".*Argument `always_return_as_numpy` has been deprecated"),
    (UserWarning, r"the (prediction|ground truth) of class .* is all 0, this may result in nan/inf distance"),
    (UserWarning, r"NvImgCodecPydicomReader: nvImageCodec decoder plugin did not register"),
)
#: (logger, message start) of the filtered log records; see the module docstring
KNOWN_HARMLESS_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("monai.data.nvimgcodec_pydicom_plugin", "nvImageCodec is not available"),
)
_CONFIG_NOTICE = r"parsing config_file .* Only proceed if this config is from a source you trust"


def filter_known_warnings() -> None:
    """Ignore the warnings of :data:`KNOWN_HARMLESS_WARNINGS` (idempotent: ``warnings`` removes duplicates)."""
    for category, message in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, start in KNOWN_HARMLESS_LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) and f.start == start for f in logger.filters):
            logger.addFilter(_DropRecords(start))


class _DropRecords(logging.Filter):
    """Drops the records of one logger whose message starts with ``start``."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


@contextlib.contextmanager
def trusted_bundle_configs() -> Iterator[None]:
    """While the package runs its own shipped bundle configs: MONAI's config-evaluation notice is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CONFIG_NOTICE, category=UserWarning)
        filter_known_warnings()
        yield
