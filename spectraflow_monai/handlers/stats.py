"""MONAI's ``StatsHandler`` that leaves the report of a user's mistake to the run's one-line error report."""

from __future__ import annotations

from ignite.engine import Engine
from monai.handlers import StatsHandler

from spectraflow_monai.utils.errors import find_input_error

__all__ = ["RunStatsHandler"]


class RunStatsHandler(StatsHandler):
    """MONAI ``StatsHandler`` (same arguments) whose ``EXCEPTION_RAISED`` handler does not log the traceback of a
    user's mistake (a :class:`~spectraflow_monai.utils.errors.DataError`, ``SettingError`` or ``TrainingError`` in
    the exception's chain: a test volume with NaN voxels, an h5 file without its datasets, ...).

    MONAI's handler logs every exception with its traceback (about 140 lines on the terminal) before the run's
    excepthook (:func:`~spectraflow_monai.utils.errors.install_excepthook`) prints the one ``error:`` line; for a
    user's mistake this handler only re-raises, so the traceback goes to the run's log folder with that line naming
    it. Any other exception is logged as MONAI logs it.
    """

    def exception_raised(self, _engine: Engine, e: Exception) -> None:
        if find_input_error(e) is None:
            super().exception_raised(_engine, e)
        raise e
