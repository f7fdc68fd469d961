"""Next sample by uncertainty (docs/monailabel.md, "Next sample by uncertainty"): a scoring method and a strategy.

:class:`UncertaintyScoring` (``POST /scoring/uncertainty``; run by MONAI Label after every training, label save and
start while ``MONAI_LABEL_AUTO_UPDATE_SCORING`` is on, its default) scores each unlabelled image of the datastore with
the served model of every bundle that takes it (2D images: the 2D bundle; NIfTI / NRRD volumes: the Synapse bundle,
over all axial slices): :class:`~spectraflow_monai.metrics.FlipEntropy`, the mean predictive entropy under the four
test-time flips, in ``[0, 1]`` (1: every pixel a coin toss). The score goes into the image's info under
:data:`SCORE_KEY`, with the model and the time (:data:`MODEL_KEY`, :data:`TIME_KEY`). It reads each image as the
bundle's inference does (its own preprocessing: size, normalisation, HU window), runs on the server's device, holds
at most ``batch_size`` images (or slices) times four flips at once, stops after ``max_seconds`` (the images not
scored then keep their earlier score; the oldest scores go first next time), and, run by MONAI Label as a background
task, stops at ``DELETE /scoring/``. An image scored by the model served now (the same weights file:
:data:`WEIGHTS_KEY`) is not scored again unless the request says ``{"force": true}``, so that MONAI Label's runs after
every *Next Sample* cost next to nothing (the app does not even start them while :meth:`UncertaintyScoring.pending`
is 0).

:class:`UncertaintyStrategy` (``POST /activelearning/uncertainty``) answers the unlabelled image with the highest
score, leaving out the images any strategy served within ``hold_seconds`` (another annotator is labelling them);
while no image has a score (no model trained yet, or scoring has not run) it answers a random image and says so
(``"selection"`` in the answer).
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.scoring import ScoringMethod
from monailabel.interfaces.tasks.strategy import Strategy
from monailabel.tasks.activelearning.random import Random
from monailabel.interfaces.utils.transform import run_transforms

from spectraflow_monai.metrics.uncertainty import FlipEntropy

__all__ = [
    "DEFAULT_MAX_SERIES",
    "ERROR_KEY",
    "MODEL_KEY",
    "SCORE_KEY",
    "SCORING_NAME",
    "STRATEGY_NAME",
    "ServedLongestAgoRandom",
    "TIME_KEY",
    "WEIGHTS_KEY",
    "WRITE_SECONDS",
    "WRITE_SHARE",
    "UncertaintyScoring",
    "UncertaintyStrategy",
    "default_device",
    "image_uncertainty",
    "scoring_settings",
    "spatial_rank_of_name",
]

logger = logging.getLogger(__name__)

#: the scoring method's and the strategy's names (``/scoring/<name>``, ``/activelearning/<name>``)
SCORING_NAME = "uncertainty"
STRATEGY_NAME = "uncertainty"
#: where a score goes in an image's info: the score in [0, 1], the bundle that gave it, its time (epoch seconds)
SCORE_KEY = "uncertainty_tta_entropy"
MODEL_KEY = "uncertainty_model"
TIME_KEY = "uncertainty_ts"
#: which weights gave the score: the served model file's size and modification time
WEIGHTS_KEY = "uncertainty_weights"
#: why the image could not be scored by those weights (the error's type; None once scored)
ERROR_KEY = "uncertainty_error"
#: a scoring run writes the datastore's record to its file at most every this many seconds (and at its end) ...
WRITE_SECONDS = 2.0
#: ... and no more often than keeps the writing under this share of the run's time
WRITE_SHARE = 0.005
# a run scores again, at most this many times in all, when another model was served while it ran
_MAX_PASSES = 3
#: an image any strategy served within this many seconds is not served again (MONAI Label's Epistemic: a day)
DEFAULT_HOLD_SECONDS = 24 * 60 * 60
DEFAULT_MAX_SECONDS = 600.0
#: series a scoring run retrieves from a PACS at most (``--conf scoring_max_series``)
DEFAULT_MAX_SERIES = 8
#: images (or slices) per forward pass by device: on 2 CPU threads 2 images (8 with their flips) score 1.3x faster
#: per image than 8 (32), on a GPU a larger pass fills the device (docs/benchmarks.md, "Uncertainty scoring")
DEFAULT_BATCH_SIZE = {"cpu": 2, "cuda": 8}
_VOLUME_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".mha", ".mhd")


def spatial_rank_of_name(path: str) -> int:
    """3 for a volume file (NIfTI, NRRD, MetaImage), else 2 (the 2D formats the datastore takes)."""
    return 3 if str(path).lower().endswith(_VOLUME_SUFFIXES) else 2


def image_uncertainty(image: torch.Tensor, network: Callable[[torch.Tensor], torch.Tensor], batch_size: int) -> float:
    """:class:`~spectraflow_monai.metrics.FlipEntropy` of one preprocessed image: ``(C, H, W)`` a 2D image,
    ``(C, H, W, D)`` a volume scored over its ``D`` axial slices (the mean over all its voxels)."""
    score = FlipEntropy(network, batch_size=batch_size)
    if image.ndim == 3:
        return float(score(image[None])[0])
    if image.ndim != 4:
        raise ValueError(f"expected a (C, H, W) image or a (C, H, W, D) volume, got shape {tuple(image.shape)}")
    total, pixels = 0.0, 0
    for chunk in image.permute(3, 0, 1, 2).split(batch_size):
        part, n = score.pixel_sum(chunk)
        total, pixels = total + part, pixels + n
    return total / max(pixels, 1)


def _weights_stamp(task: Any) -> str:
    """``"<size>-<mtime_ns>"`` of the task's served model file (MONAI Label's ``get_path()``), "" without one."""
    path = task.get_path()
    if not path or not os.path.isfile(path):
        return ""
    stat = os.stat(path)
    return f"{stat.st_size}-{stat.st_mtime_ns}"


class _InfoWriter:
    """Scores on their way into the datastore: each goes into the datastore's record in memory at once (the strategy
    sees it), and the record is written to its file every :data:`WRITE_SECONDS` at the least, and no more often than
    keeps the writing under :data:`WRITE_SHARE` of the run's time (a large record is written less often), and at the
    end: the record's cost per scored image does not grow with the datastore. A datastore without
    ``update_image_infos`` (MONAI Label's DICOMweb one) is written image by image."""

    def __init__(self, datastore: Datastore, clock: Callable[[], float] = time.monotonic) -> None:
        self.datastore, self.clock = datastore, clock
        self.many = getattr(datastore, "update_image_infos", None)
        self.dirty, self.interval, self.last = False, WRITE_SECONDS, clock()

    def add(self, image_id: str, info: dict[str, Any]) -> None:
        if self.many is None:
            self.datastore.update_image_info(image_id, info)
            return
        self.many({image_id: info}, write=False)
        self.dirty = True
        if self.clock() - self.last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if not self.dirty:
            return
        started = self.clock()
        self.datastore.write_record()
        spent = self.clock() - started
        self.dirty, self.last = False, self.clock()
        self.interval = max(WRITE_SECONDS, spent / WRITE_SHARE)


def _spatial_rank(datastore: Datastore, image_id: str) -> int:
    """The spatial rank of a datastore image without reading it: the datastore's ``spatial_rank`` (a PACS: 3), else
    by its file name (:func:`spatial_rank_of_name`)."""
    rank = getattr(datastore, "spatial_rank", None)
    return int(rank(image_id)) if rank is not None else spatial_rank_of_name(datastore.get_image_uri(image_id))


def _finite_score(info: Mapping[str, Any]) -> float | None:
    value = info.get(SCORE_KEY)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class UncertaintyScoring(ScoringMethod):
    """Writes :data:`SCORE_KEY` into the info of every unlabelled image (see the module docstring).

    Args:
        infer_tasks: returns the app's inference tasks by bundle name (the served models at the time of the call).
        device: the device to score on (the server's: ``cuda`` when it has a GPU, else ``cpu``).
        max_seconds: stop after this many seconds (> 0). Defaults to 600.
        batch_size: images or slices per forward pass (each pass holds four times as many). Defaults to
            :data:`DEFAULT_BATCH_SIZE` of the device (2 on a CPU, 8 on a GPU).
        max_series: on a remote datastore (a PACS: its ``remote`` is true), a run scores at most this many series
            (the unscored first, then the oldest scores): each one scored is a series retrieved. Defaults to
            :data:`DEFAULT_MAX_SERIES`.

    Raises:
        ValueError: ``max_seconds`` <= 0, ``batch_size`` < 1 or ``max_series`` < 1.
    """

    def __init__(
        self,
        infer_tasks: Callable[[], Mapping[str, Any]],
        device: str,
        max_seconds: float = DEFAULT_MAX_SECONDS,
        batch_size: int | None = None,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        if batch_size is None:
            batch_size = DEFAULT_BATCH_SIZE["cuda" if str(device).startswith("cuda") else "cpu"]
        if not float(max_seconds) > 0:
            raise ValueError(f"max_seconds must be > 0, got {max_seconds!r}.")
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        if isinstance(max_series, bool) or int(max_series) < 1:
            raise ValueError(f"max_series must be an integer >= 1, got {max_series!r}.")
        super().__init__(
            "Uncertainty of the served model on each unlabelled image: the mean predictive entropy under test-time "
            f"flips, in [0, 1], written as {SCORE_KEY!r} into the image info"
        )
        self.infer_tasks, self.device = infer_tasks, str(device)
        self.max_seconds, self.batch_size, self.max_series = float(max_seconds), int(batch_size), int(max_series)

    def _order(self, datastore: Datastore, images: list[str]) -> list[str]:
        """Unscored images first, then the oldest scores."""
        ts = {i: datastore.get_image_info(i).get(TIME_KEY) for i in images}
        return sorted(images, key=lambda i: (ts[i] is not None, ts[i] if isinstance(ts[i], (int, float)) else 0))

    def _current(self, info: Mapping[str, Any], name: str, stamps: Mapping[str, str]) -> bool:
        return info.get(MODEL_KEY) == name and info.get(WEIGHTS_KEY) == stamps[name]

    def pending(self, datastore: Datastore) -> int:
        """How many unlabelled images a run would score: those a served model takes and that have no score from the
        weights it serves now. Cheap (image infos only, never an image itself: on a PACS nothing is retrieved): the
        app skips MONAI Label's automatic runs when it is 0."""
        tasks = {name: t for name, t in self.infer_tasks().items() if getattr(t, "input_rank", None) in (2, 3)}
        stamps = {name: _weights_stamp(task) for name, task in tasks.items()}
        count = 0
        for image_id in datastore.get_unlabeled_images():
            rank = _spatial_rank(datastore, image_id)
            name = next((n for n, t in tasks.items() if t.input_rank == rank), None)
            if name is not None and not self._current(datastore.get_image_info(image_id), name, stamps):
                count += 1
        return count

    def __call__(
        self, request: Mapping[str, Any], datastore: Datastore, stop: threading.Event | None = None
    ) -> dict[str, Any]:
        """Score the unlabelled images (see the module docstring).

        Args:
            request: ``{"force": bool}`` (default false: images scored by the served weights are left as they are).
            datastore: the server's datastore; the scores are written with its ``update_image_infos`` (a few images
                at a time, one write of the record each) where it has one, else image by image.
            stop: set to stop after the current image (``DELETE /scoring/``). Defaults to None.

        Returns:
            ``scored``, ``current`` (already scored by the served weights), ``left``, ``skipped`` (image id -> why;
            an unreadable image is remembered with the weights that failed on it and not tried again until others
            are served) and ``passes`` (a model served during the run is scored in a further pass).
        """
        started = time.monotonic()
        stop = stop if stop is not None else threading.Event()
        force = request.get("force", False) is True if isinstance(request, Mapping) else False
        scored: dict[str, float] = {}
        skipped: dict[str, str] = {}
        current, left, passes = 0, 0, 0
        writer = _InfoWriter(datastore)
        while passes < _MAX_PASSES:
            tasks = {name: t for name, t in self.infer_tasks().items() if getattr(t, "input_rank", None) in (2, 3)}
            images = self._order(datastore, list(datastore.get_unlabeled_images()))
            if getattr(datastore, "remote", False):
                images = images[: self.max_series]  # each series scored is one retrieved
            if not tasks:
                logger.info(f"{SCORING_NAME}: no model is served for inference yet; nothing scored")
                return {"scored": 0, "left": len(images), "reason": "no model is served for inference yet"}
            stamps = {name: _weights_stamp(task) for name, task in tasks.items()}
            passes += 1
            current, left = 0, 0
            for done, image_id in enumerate(images):
                if stop.is_set() or time.monotonic() - started > self.max_seconds:
                    left = len(images) - done
                    break
                outcome = self._score_one(datastore, image_id, tasks, stamps, force and image_id not in scored)
                if outcome is None:
                    current += 1  # scored by the model served now: nothing would change
                    continue
                info, why = outcome
                if why is None:
                    scored[image_id] = info[SCORE_KEY]
                else:
                    skipped[image_id] = why
                if info is not None:
                    writer.add(image_id, info)
            writer.flush()
            if left or stop.is_set():
                break
            now = {name: _weights_stamp(task) for name, task in self.infer_tasks().items() if name in stamps}
            if now == stamps:  # no other model was served during the run
                break
            force = False  # the next pass scores what the newly served weights have not
        if left:
            reason = "DELETE /scoring/" if stop.is_set() else f"{self.max_seconds:.0f} s (--conf scoring_max_seconds)"
            logger.warning(f"{SCORING_NAME}: stopped ({reason}) with {left} image(s) left; they keep their earlier "
                           "score")  # fmt: skip
        logger.info(f"{SCORING_NAME}: scored {len(scored)} image(s) in {time.monotonic() - started:.1f} s")
        return {"scored": len(scored), "current": current, "left": left, "skipped": skipped, "passes": passes}

    def _score_one(
        self, datastore: Datastore, image_id: str, tasks: Mapping[str, Any], stamps: Mapping[str, str], force: bool
    ) -> tuple[dict[str, Any] | None, str | None] | None:
        """One image: None when the served weights scored it already, else ``(info, why)``: the info to write (the
        score, or for an unreadable image the weights that failed on it, so that it is not tried again until others
        are served; None for an image no served model takes) and why it was not scored (None: scored)."""
        path = datastore.get_image_uri(image_id)
        rank = spatial_rank_of_name(path)
        name = next((n for n, t in tasks.items() if t.input_rank == rank), None)
        if name is None:
            return None, f"no served model takes {rank}D images"
        if not force and self._current(datastore.get_image_info(image_id), name, stamps):
            return None
        info = {MODEL_KEY: name, WEIGHTS_KEY: stamps[name], TIME_KEY: int(time.time())}
        try:
            return {**info, SCORE_KEY: self._score(tasks[name], path), ERROR_KEY: None}, None
        except Exception as e:  # one unreadable image does not stop the others
            logger.warning(f"{SCORING_NAME}: {image_id} not scored: {type(e).__name__}: {str(e)[:200]}")
            return {**info, SCORE_KEY: None, ERROR_KEY: type(e).__name__}, type(e).__name__

    def _score(self, task: Any, path: str) -> float:
        data = {"image": path, "device": self.device}
        data = run_transforms(data, task.pre_transforms(data), log_prefix="SCORING")
        network = task._get_network(self.device, data)
        image = torch.as_tensor(data["image"]).float().to(self.device)
        return image_uncertainty(image, network, self.batch_size)


class UncertaintyStrategy(Strategy):
    """The unlabelled image with the highest :data:`SCORE_KEY` (see the module docstring).

    Args:
        hold_seconds: an image any strategy served within this many seconds is not served again, unless every
            unlabelled image was (then the one served longest ago). Defaults to a day (MONAI Label's Epistemic).

    Raises:
        ValueError: ``hold_seconds`` < 0.
    """

    def __init__(self, hold_seconds: float = DEFAULT_HOLD_SECONDS) -> None:
        if not float(hold_seconds) >= 0:
            raise ValueError(f"hold_seconds must be >= 0, got {hold_seconds!r}.")
        super().__init__(
            f"The unlabelled image the served model is least sure of (highest {SCORE_KEY!r}, scoring method "
            f"{SCORING_NAME!r}); random while no image has a score"
        )
        self.hold_seconds = float(hold_seconds)

    def __call__(self, request: Mapping[str, Any], datastore: Datastore) -> dict[str, Any] | None:
        images = datastore.get_unlabeled_images(request.get("label_tag"), request.get("labels"))
        if not images:
            return None
        now = time.time()
        infos = {i: datastore.get_image_info(i) for i in images}
        served = {i: max([s.get("ts", 0) for s in (infos[i].get("strategy") or {}).values()
                          if isinstance(s, Mapping) and isinstance(s.get("ts", 0), (int, float))] or [0])
                  for i in images}  # fmt: skip
        free = [i for i in images if now - served[i] >= self.hold_seconds]
        if not free:  # every unlabelled image was just served: the one served longest ago
            image = min(images, key=lambda i: served[i])
            return {"id": image, "selection": f"every unlabelled image was served within {self.hold_seconds:.0f} s; "
                                              "the one served longest ago"}  # fmt: skip
        scores = {i: _finite_score(infos[i]) for i in free}
        ranked = [i for i in free if scores[i] is not None]
        if not ranked:
            image = random.choice(free)
            note = (f"random: no unlabelled image has an uncertainty score yet (train a model, then POST "
                    f"/scoring/{SCORING_NAME})")  # fmt: skip
            logger.info(f"{STRATEGY_NAME}: {note}: {image}")
            return {"id": image, "selection": note}
        order = {image_id: n for n, image_id in enumerate(images)}  # ties: the datastore's order (one lookup each)
        image = max(ranked, key=lambda i: (scores[i], -order[i]))
        logger.info(f"{STRATEGY_NAME}: {image} ({SCORE_KEY} {scores[image]:.4f}, {len(ranked)} scored)")
        return {"id": image, SCORE_KEY: scores[image], "selection": f"highest {SCORE_KEY} of {len(ranked)} scored"}


class ServedLongestAgoRandom(Random):
    """MONAI Label's ``random`` strategy (an unlabelled image drawn with weights = seconds since a strategy last
    served it), with a draw when every weight is 0: each unlabelled image served within the current second (a client
    asking again and again) made MONAI Label's ``random.choices`` raise, a bare 500; then every image is drawn
    alike."""

    def __call__(self, request: Mapping[str, Any], datastore: Datastore) -> dict[str, Any] | None:
        try:
            return super().__call__(request, datastore)
        except ValueError:  # "Total of weights must be greater than zero"
            images = datastore.get_unlabeled_images(request.get("label_tag"), request.get("labels"))
            if not images:
                return None
            return {"id": random.choice(images), "weight": 0}


def scoring_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--conf`` settings of scoring and the strategy: ``scoring_max_seconds``, ``scoring_batch_size``,
    ``scoring_max_series``, ``uncertainty_hold_seconds`` as keyword arguments (defaults: 600; None, the device's
    :data:`DEFAULT_BATCH_SIZE`; :data:`DEFAULT_MAX_SERIES`; 86400), checked as numbers.

    Raises:
        ValueError: a value that is not a number, naming the setting.
    """
    out: dict[str, Any] = {}
    for key, arg, kind, default in (
        ("scoring_max_seconds", "max_seconds", float, DEFAULT_MAX_SECONDS),
        ("scoring_batch_size", "batch_size", int, None),
        ("scoring_max_series", "max_series", int, DEFAULT_MAX_SERIES),
        ("uncertainty_hold_seconds", "hold_seconds", float, DEFAULT_HOLD_SECONDS),
    ):
        text = conf.get(key)
        try:
            out[arg] = kind(text) if text not in (None, "") else default
        except (TypeError, ValueError):
            raise ValueError(f"--conf {key} must be a number, got {text!r}.") from None
    return out


def default_device() -> str:
    """The device the server scores on: ``cuda`` when torch sees a GPU, else ``cpu`` (``MONAI_LABEL`` infers the
    same way)."""
    return "cuda" if torch.cuda.is_available() else "cpu"

