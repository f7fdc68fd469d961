"""What the SpectraFlow MONAI Label app answers to a request before it runs it (docs/monailabel.md, "Bad requests").

MONAI Label 0.8.5 answers an unknown model, strategy, scoring method or batch-inference model, a training request on
a datastore that cannot train, or an image that a model cannot read with a bare HTTP 500 (or queues a task that then
fails unseen). The app's request methods (main.py) ask these checks first; each raises an ``HTTPException`` with a
4xx status and a message that names no server path:

- :func:`require_bundle`, :func:`require_infer_model`: 404 naming the served models (503 naming why for a served
  model whose files on disk are not a pair, 404 naming the reason for a bundle without weights);
- :func:`check_train_request`: 404 when training is off or the model has no trainer, 422 naming a refused option;
- :func:`check_train_data`: 422 when no image has a label, every label is background, or the request's split leaves
  no validation pair or too few training pairs;
- :func:`check_batch_infer_request`, :func:`check_scoring_request`, :func:`check_strategy`: 404 for what is not
  served, 422 for options that are not accepted;
- :func:`infer_failure`: the 415 / 422 that an inference failure on an unreadable or unsuitable image becomes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException

from spectraflow_monai.data.validation import check_foreground
from spectraflow_monai.utils.errors import DatasetError

from .checks import check_id, redact_paths
from .infers import SpectraFlowInferTask, image_problem
from .options import check_infer_options
from .trainers import SpectraFlowTrainTask

__all__ = [
    "check_batch_infer_request",
    "check_scoring_request",
    "check_split",
    "check_strategy",
    "check_train_data",
    "check_train_request",
    "infer_failure",
    "require_bundle",
    "require_infer_model",
]


def require_bundle(model: Any, bundles: Mapping[str, str]) -> None:
    """HTTP 404 naming the served bundles unless ``model`` is one of ``bundles``."""
    if not (isinstance(model, str) and model in bundles):
        raise HTTPException(status_code=404, detail=f"model {model!r} is not served; models: {sorted(bundles)}")


def require_infer_model(
    model: Any, infers: Mapping[str, Any], unusable: Mapping[str, tuple[Any, str]], untrained: Mapping[str, str]
) -> None:
    """HTTP 404 naming the loaded models unless ``model`` is in ``infers``; 503 naming why when its served model
    cannot be served (``unusable``: bundle -> (stamp, reason)); 404 with the reason for a bundle without weights
    (``untrained``)."""
    if isinstance(model, str) and model in infers:
        return
    if isinstance(model, str) and model in unusable:
        raise HTTPException(
            status_code=503,
            detail=f"model {model!r} cannot serve its models/model.pt: {unusable[model][1]}; upload a model "
            f"with its record (PUT /model/{model}) or train it (POST /train/{model})",
        )
    if isinstance(model, str) and model in untrained:
        raise HTTPException(status_code=404, detail=untrained[model])
    raise HTTPException(status_code=404, detail=f"model {model!r} is not loaded; loaded models: {sorted(infers)}")


def check_train_request(request: Any, trainers: Mapping[str, Any], skip_trainers: bool) -> dict[str, Any]:
    """The training request with checked options (:meth:`lib.trainers.SpectraFlowTrainTask.check_request`).

    Raises:
        HTTPException: 404 for a model without a training task (all of them with ``skip_trainers``), 422 naming
            the first option that is not accepted.
    """
    if not isinstance(request, dict):
        raise HTTPException(status_code=422, detail="the training request must be a JSON object")
    model = request.get("model")
    task = trainers.get(model) if isinstance(model, str) else None
    if task is None:
        if skip_trainers:
            raise HTTPException(status_code=404, detail="training is disabled on this server (skip_trainers)")
        detail = f"model {model!r} has no training task; trainers: {sorted(trainers)}"
        raise HTTPException(status_code=404, detail=detail)
    # MONAI Label's deprecated POST /train/ also passes every model's options under the model's name
    own = {k: v for k, v in request.items() if not (k in trainers and k != "model" and isinstance(v, dict))}
    try:
        return task.check_request(own) if isinstance(task, SpectraFlowTrainTask) else own
    except ValueError as e:
        raise HTTPException(status_code=422, detail=str(e)) from None


def check_batch_infer_request(request: dict[str, Any], served_copy: str | None, datastore: Any) -> dict[str, Any]:
    """A batch inference request (``POST /batch/infer/<model>``) of a served model, before it is run or queued.

    Args:
        request: the request (its ``model`` is served for inference).
        served_copy: the served copy of the model's bundle (the ``bundle_path`` MONAI Label itself sets; any other
            is refused).
        datastore: the app's datastore (the ids of an image list must be its images).

    Raises:
        HTTPException: 404 for an unknown image id, 422 for options that are not accepted.
    """
    images = request.get("images", "all")
    given = request.get("bundle_path")
    if served_copy and isinstance(given, str) and os.path.realpath(given) == os.path.realpath(served_copy):
        request = {k: v for k, v in request.items() if k != "bundle_path"}
    try:
        checked = check_infer_options({k: v for k, v in request.items() if k != "images"})
    except ValueError as e:
        raise HTTPException(status_code=422, detail=str(e)) from None
    if not (images in ("all", "labeled", "unlabeled") or isinstance(images, list)):
        raise HTTPException(status_code=422, detail="images must be 'all', 'labeled', 'unlabeled' or a list of ids")
    if isinstance(images, list) and hasattr(datastore, "require_image"):
        for image in images:
            datastore.require_image(check_id(image))
    return {**checked, "images": images}


def check_scoring_request(request: Any, methods: Mapping[str, Any]) -> None:
    """HTTP 404 naming the scoring methods unless the request's ``method`` is one of ``methods``."""
    method = request.get("method") if isinstance(request, dict) else None
    if not (isinstance(method, str) and method in methods):
        raise HTTPException(
            status_code=404, detail=f"scoring method {method!r} is not served; scoring methods: {sorted(methods)}"
        )


def check_strategy(request: Any, strategies: Mapping[str, Any]) -> str:
    """The active learning strategy a next-sample request names (default ``random``).

    Raises:
        HTTPException: 404 naming the strategies for one that is not served.
    """
    strategy = (request.get("strategy") or "random") if isinstance(request, dict) else None
    if not (isinstance(strategy, str) and strategy in strategies):
        raise HTTPException(
            status_code=404,
            detail=f"active learning strategy {strategy!r} is not served; strategies: {sorted(strategies)}",
        )
    return strategy


def check_train_data(
    datastore: Any, studies: str, allow_empty: bool, task: Any = None, request: dict[str, Any] | None = None
) -> None:
    """HTTP 422 when no image of the datastore has a label (``labels/final``), or when every label is background
    only, unless ``allow_empty`` (``--conf allow_empty_masks true``: then a warning); see
    :func:`spectraflow_monai.data.validation.check_foreground`. With a training task and its checked ``request``:
    also when the split leaves no validation pair or too few training pairs (:func:`check_split`)."""
    try:
        pairs = datastore.datalist()
    except DatasetError as e:  # a SEG of the PACS (lib/dicomweb.py)
        detail = f"the labels in the PACS cannot train this model: {redact_paths(str(e))}"
        raise HTTPException(status_code=422, detail=detail) from None
    if not pairs:
        raise HTTPException(
            status_code=422, detail="no image has a label yet (labels/final): save labels (PUT /datastore/label) first"
        )
    try:
        check_foreground(pairs, "the datastore's labels", allow_empty=allow_empty)
    except DatasetError as e:
        shown = {studies: "studies", os.path.realpath(studies): "studies"}
        detail = redact_paths(str(e), shown).replace("set allow_empty_masks true", "start the server with --conf "
                                              "allow_empty_masks true")  # fmt: skip
        raise HTTPException(status_code=422, detail=detail) from None
    if isinstance(task, SpectraFlowTrainTask) and isinstance(request, dict):
        check_split(task, pairs, request)


def check_split(task: SpectraFlowTrainTask, pairs: list[dict[str, Any]], request: dict[str, Any]) -> None:
    """HTTP 422 when the request's split of ``pairs`` (MONAI Label's, as the run makes it) leaves no validation pair
    (a run serves its best validated model) or, for a 2D bundle, fewer than two training pairs (the decoder's batch
    normalisation needs two samples a batch)."""
    val_split = request.get("val_split", 0.2)
    train, val = task.split(pairs, val_split)
    counts = f"{len(pairs)} labelled image(s), val_split {val_split}: {len(train)} to train, {len(val or [])} to "
    if not val:
        raise HTTPException(
            status_code=422,
            detail=f"this run would have no validation pair ({counts}validate); a run serves its best validated "
            "model: choose val_split > 0 that leaves at least one image to validate, or label more images",
        )
    minimum = 1 if task.volume_input else 2
    if len(train) < minimum:
        raise HTTPException(
            status_code=422,
            detail=f"this run would have {len(train)} training pair(s) ({counts}validate); it needs at least "
            f"{minimum}{' (batch normalisation needs two samples a batch)' if minimum > 1 else ''}: label more "
            "images or lower val_split",
        )


def infer_failure(task: Any, model: str, path: str, shown: str) -> HTTPException | None:
    """The answer to an inference of ``model`` that failed on the image at ``path`` (shown as ``shown``): 415 when
    the model cannot read it as an image, 422 (or the problem's status) when it does not suit the model (a 2D image
    for a volume model or the reverse); None when the image is not the reason."""
    loader = task.image_loader() if isinstance(task, SpectraFlowInferTask) else None
    problem = image_problem(path, loader, getattr(task, "input_rank", None))
    if problem is None:
        return None
    if problem[0] == 415:
        reason = redact_paths(problem[1], {path: shown, os.path.realpath(path): shown})
        detail = f"{shown} cannot be read as an image by model {model!r} ({reason})"
        return HTTPException(status_code=415, detail=detail)
    return HTTPException(status_code=problem[0], detail=f"{shown} does not suit model {model!r}: {problem[1]}")
