"""MONAI's ``StatsHandler`` that leaves the report of a user's mistake to the run's one-line error report."""

from __future__ import annotations

import logging

from ignite.engine import Engine
from monai.handlers import StatsHandler

from spectraflow_monai.utils.errors import find_input_error, worker_input_error

__all__ = ["RunStatsHandler"]


class _FirstLineOfWorkerErrors(logging.Filter):
    """Shorten an engine's log record of a user's mistake raised in a ``DataLoader`` worker (whose message is the
    worker's whole traceback) to its first line: the traceback goes to the run's log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "\n" in str(record.msg):
            text = record.getMessage()
            if worker_input_error(text.split(": ", 1)[-1]) is not None:
                record.msg, record.args = text.split("\n", 1)[0] + " (the error line below names the file)", ()
        return True


class RunStatsHandler(StatsHandler):
    """MONAI ``StatsHandler`` (same arguments) whose ``EXCEPTION_RAISED`` handler does not log the traceback of a
    user's mistake (a :class:`~spectraflow_monai.utils.errors.DataError`, ``SettingError`` or ``TrainingError`` in
    the exception's chain: a test volume with NaN voxels, an h5 file without its datasets, ...).

    MONAI's handler logs every exception with its traceback (about 140 lines on the terminal) before the run's
    excepthook (:func:`~spectraflow_monai.utils.errors.install_excepthook`) prints the one ``error:`` line; for a
    user's mistake this handler only re-raises, so the traceback goes to the run's log folder with that line naming
    it. Any other exception is logged as MONAI logs it. The engine's own record of such a mistake raised in a
    ``DataLoader`` worker (ignite logs the exception's message, there the worker's whole traceback) is cut to its
    first line.
    """

    def attach(self, engine: Engine) -> None:
        super().attach(engine)
        if not any(isinstance(f, _FirstLineOfWorkerErrors) for f in engine.logger.filters):
            engine.logger.addFilter(_FirstLineOfWorkerErrors())

    def exception_raised(self, _engine: Engine, e: Exception) -> None:
        if find_input_error(e) is None:
            super().exception_raised(_engine, e)
        raise e
