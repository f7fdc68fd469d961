"""Checkpoint handlers for resumable, safe training runs.

- :class:`SafeCheckpointSaver`: MONAI's ``CheckpointSaver`` whose files are written atomically and never hold a
  NaN/inf tensor, and whose best-metric bookkeeping (the score of ``model.pt``) can itself be checkpointed, so a
  resumed run never replaces a better ``model.pt`` with a worse one;
- :class:`ResumableEarlyStopHandler`: MONAI's ``EarlyStopHandler`` with ``state_dict`` / ``load_state_dict``
  (patience counter and best score of ignite's ``EarlyStopping``);
- :class:`GradScalerState`: the AMP grad scaler of a MONAI trainer (created when the run starts) as a
  checkpointable object;
- :class:`RecordedCheckpointLoader`: MONAI's ``CheckpointLoader`` for evaluation and inference, whose weights that
  do not fit the network built from the model's record end the run in one line naming the model file, the record
  and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import ignite.distributed as idist
from ignite.engine import Engine
from ignite.handlers.checkpoint import BaseSaveHandler, Checkpoint
from monai.handlers import CheckpointLoader, CheckpointSaver, EarlyStopHandler

from spectraflow_monai.utils.checkpoint import NonFiniteStateError, atomic_torch_save, check_finite_state
from spectraflow_monai.utils.run_record import set_exports_aside, weights_mismatch, write_model_settings

__all__ = [
    "AtomicFiniteSaver",
    "GradScalerState",
    "RecordedCheckpointLoader",
    "ResumableEarlyStopHandler",
    "SafeCheckpointSaver",
]


class AtomicFiniteSaver(BaseSaveHandler):
    """ignite save handler: finiteness check, atomic write (rank 0 only), removals deferred until a save succeeded.

    ignite's ``Checkpoint`` removes the file it replaces before writing the new one; with a fixed file name
    (``model.pt``) that would leave no file at all if the process died in between. Here removals wait for the next
    successful save and are skipped for the file just written (``os.replace`` swaps it in one step).

    Args:
        dirname: folder of the files.
        filename: fixed file name used for every save (``None``: the name ignite proposes).
        model_settings: the settings that built the model; written beside every file saved
            (:func:`~spectraflow_monai.utils.run_record.write_model_settings`: ``model.pt`` -> ``model.json``, with
            the new file's digest), so that a model file describes itself. Before such a file is replaced, its exports
            (``model.onnx``, ``model_int8.onnx``, ...) are kept aside
            (:func:`~spectraflow_monai.utils.run_record.set_exports_aside`): an export never stays beside a model it
            was not exported from. Defaults to None (nothing written beside).
    """

    def __init__(
        self, dirname: str | os.PathLike, filename: str | None = None, model_settings: Mapping | None = None
    ) -> None:
        self.dirname = os.fspath(dirname)
        self.filename = filename
        self.model_settings = model_settings
        self._pending: list[str] = []

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        name = self.filename or filename
        path = os.path.join(self.dirname, name)
        pending, self._pending = self._pending, []
        check_finite_state(checkpoint, path)
        if idist.get_rank() == 0:
            if self.model_settings is not None:
                set_exports_aside(path)
            atomic_torch_save(checkpoint, path)
            if self.model_settings is not None:
                write_model_settings(path, self.model_settings)
            for old in pending:
                if old != name and os.path.isfile(os.path.join(self.dirname, old)):
                    os.remove(os.path.join(self.dirname, old))

    def remove(self, filename: str) -> None:
        self._pending.append(self.filename or filename)


class SafeCheckpointSaver(CheckpointSaver):
    """MONAI ``CheckpointSaver`` (same arguments) with safe files and a checkpointable best score.

    - files are written by :class:`AtomicFiniteSaver`: atomically, on rank 0, and never when a tensor holds NaN or
      inf (:class:`~spectraflow_monai.utils.checkpoint.NonFiniteStateError` stops the run instead; when the run
      is already failing, the final checkpoint is skipped with a log line and the original error is raised);
    - ``state_dict()`` / ``load_state_dict()`` hold the key-metric bookkeeping (the best score and its file), so
      listing this saver in a resumable checkpoint makes a resumed run compare against the best score of the run
      it continues: ``model.pt`` is replaced only by a better model;
    - at ``attach``, the epoch checkpoints already in ``save_dir`` (those of the run being resumed) are counted in
      ``n_saved``, so that a resumed run keeps only the newest ``n_saved`` of them all.

    ``model_settings`` (a keyword of its own): the settings that built the model, written beside the key-metric file
    (``model.pt`` -> ``model.json``, see :class:`AtomicFiniteSaver`); evaluation and inference read them.

    ``key_metric_greater_or_equal`` defaults to True here (MONAI: False): a later model that scores as well as the
    best one replaces it, so that on data whose key metric does not move (every validation mask empty: a Dice of 0
    every epoch) the saved model is the newest, not a stale one from the first epoch.

    ``prune_on_completion`` (a keyword of its own, default False): once the final checkpoint of a completed run is
    written, remove the epoch checkpoints: a restart resumes from the newest checkpoint, the final one, so they serve
    no resume any more (Stage-1's checkpoints hold encoder, EMA encoder, head and optimizer states, hundreds of MB
    each). Nothing is removed when the final checkpoint could not be written.

    Example (bundle config)::

        model_saver: {_target_: spectraflow_monai.handlers.SafeCheckpointSaver, save_dir: '@ckpt_dir',
                      save_dict: {model: '@network'}, save_key_metric: true, key_metric_filename: model.pt}
    """

    def __init__(
        self,
        save_dir: str,
        save_dict: dict,
        model_settings: Mapping | None = None,
        prune_on_completion: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("key_metric_greater_or_equal", True)
        super().__init__(save_dir, save_dict, **kwargs)
        self.prune_on_completion = bool(prune_on_completion)
        fixed = {"_final_checkpoint": kwargs.get("final_filename"), "_key_metric_checkpoint": kwargs.get("key_metric_filename")}
        for attr in ("_final_checkpoint", "_key_metric_checkpoint", "_interval_checkpoint"):
            checkpoint = getattr(self, attr)
            if checkpoint is not None:
                settings = model_settings if attr == "_key_metric_checkpoint" else None
                checkpoint.save_handler = AtomicFiniteSaver(save_dir, fixed.get(attr), settings)

    def attach(self, engine: Engine) -> None:
        super().attach(engine)
        interval = self._interval_checkpoint
        if interval is None or not self.epoch_level or interval._saved or not os.path.isdir(self.save_dir):
            return
        prefix = f"{interval.filename_prefix}_" if interval.filename_prefix else ""
        pattern = re.compile(rf"^{re.escape(prefix)}checkpoint_epoch=(\d+)\.{re.escape(interval.ext)}$")
        found = [(int(m.group(1)), name) for name in os.listdir(self.save_dir) if (m := pattern.match(name))]
        interval._saved = [Checkpoint.Item(epoch, name) for epoch, name in sorted(found)]

    def completed(self, engine: Engine) -> None:
        """Save the final checkpoint; with ``prune_on_completion``, then remove the epoch checkpoints."""
        super().completed(engine)
        interval = self._interval_checkpoint
        if not self.prune_on_completion or interval is None or self._final_checkpoint is None:
            return
        for item in interval._saved:
            path = os.path.join(self.save_dir, item.filename)
            if idist.get_rank() == 0 and os.path.isfile(path):
                os.remove(path)
        interval._saved.clear()

    def state_dict(self) -> dict[str, Any]:
        """The key-metric bookkeeping (ignite ``Checkpoint.state_dict()``: saved scores and file names)."""
        return {} if self._key_metric_checkpoint is None else self._key_metric_checkpoint.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the key-metric bookkeeping saved by :meth:`state_dict` (an empty dict is ignored)."""
        if state_dict and self._key_metric_checkpoint is not None:
            self._key_metric_checkpoint.load_state_dict(state_dict)
            best = max((item[0] for item in self._key_metric_checkpoint._saved), default=None)
            self.logger.warning(f"best-model saver resumed: the best score so far is {best}.")

    def exception_raised(self, engine: Engine, e: Exception) -> None:
        """Save the final checkpoint if it is finite (else log why not), then raise ``e``."""
        try:
            super().exception_raised(engine, e)
        except NonFiniteStateError as refused:
            self.logger.error(f"final checkpoint not saved: {refused}")
            raise e from None


class RecordedCheckpointLoader(CheckpointLoader):
    """MONAI ``CheckpointLoader`` (same arguments) for a model whose network was built from its record.

    Evaluation and inference build the network from the settings recorded beside the model file
    (``models/model.json``, :class:`~spectraflow_monai.utils.run_record.ModelRecord`); weights that do not fit that
    network (PyTorch's ``Error(s) in loading state_dict``: a ``model.json`` that is not the model's, a record of an
    earlier version beside another model) raise a :class:`~spectraflow_monai.utils.errors.SettingError` naming the
    model file, the record, the first line of PyTorch's message and the fix, which the bundles report in one
    ``error:`` line (the traceback goes to the run's log folder).
    """

    def __call__(self, engine: Engine) -> None:
        try:
            super().__call__(engine)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            raise weights_mismatch(self.load_path, err) from err


class ResumableEarlyStopHandler(EarlyStopHandler):
    """MONAI ``EarlyStopHandler`` (same arguments) whose state can be checkpointed.

    ``state_dict`` returns ignite ``EarlyStopping``'s ``{"counter", "best_score"}``; a state loaded before
    ``set_trainer`` is kept and applied when the ignite handler is created.
    """

    _pending: Mapping | None = None

    def set_trainer(self, trainer: Engine) -> None:
        super().set_trainer(trainer)
        if self._pending is not None and self._handler is not None:
            self._handler.load_state_dict(self._pending)
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        if self._handler is not None:
            return dict(self._handler.state_dict())
        return dict(self._pending) if self._pending is not None else {}

    def load_state_dict(self, state_dict: Mapping) -> None:
        if not state_dict:
            return
        if self._handler is not None:
            self._handler.load_state_dict(state_dict)
        else:
            self._pending = dict(state_dict)


class GradScalerState:
    """``state_dict`` / ``load_state_dict`` of ``engine.scaler`` (MONAI trainers create it when ``run`` starts).

    Empty when the engine has no scaler (no fp16 mixed precision), so a checkpoint can always list it.

    Args:
        engine: the trainer.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def state_dict(self) -> dict[str, Any]:
        scaler = getattr(self.engine, "scaler", None)
        return dict(scaler.state_dict()) if scaler is not None else {}

    def load_state_dict(self, state_dict: Mapping) -> None:
        scaler = getattr(self.engine, "scaler", None)
        if state_dict and scaler is not None:
            scaler.load_state_dict(state_dict)
