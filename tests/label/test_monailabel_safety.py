"""What the MONAI Label app accepts from a client (docs/monailabel.md, "Serving safely"), in process.

Training requests may set only the documented options (a value that MONAI's config parser would evaluate is refused
with HTTP 422 naming the option, and nothing runs); an image that is not a datastore id is answered exactly like an
unknown id; 2D label maps are PNG files with the documented values whatever the input's format. The HTTP side of the
same checks is in ``test_monailabel_app.test_server_end_to_end``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

from PIL import Image  # noqa: E402

from spectraflow_monai.apps.seg2d.synthetic import synthesize_pair  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (fixtures used by name)
    IMAGE_2D_SHAPE,
    NAME_2D,
    NAME_3D,
    SIZE,
    TRAIN,
    _app,
    _make_bundles,
    _quiet_app,
    _status,
    _write_studies,
    app,
    app_main,
    served,
)

_PAYLOAD = "$__import__('pathlib').Path({!r}).touch() or 1"


def _bad_train_options(marker: str) -> list[tuple[dict, str]]:
    payload = _PAYLOAD.format(marker)
    return [
        ({"max_epochs": payload}, "max_epochs"),
        ({"device": payload}, "device"),
        ({"val_split": payload}, "val_split"),
        ({"tracking": "mlflow", "tracking_uri": payload}, "tracking"),
        ({"tracking_uri": payload}, "tracking_uri"),
        ({"train#trainer#max_epochs": 1}, "train#trainer#max_epochs"),
        ({"max_epochs": {"_target_": "os.system", "command": f"touch {marker}"}}, "max_epochs"),
        ({"max_epochs": "@network_def"}, "max_epochs"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"max_epochs": True}, "max_epochs"),
        ({"max_epochs": 1.5}, "max_epochs"),
        ({"val_split": 1.0}, "val_split"),
        ({"gpus": "0;touch x"}, "gpus"),
        ({"model_filename": "../../../model.pt"}, "model_filename"),
        ({"run_id": "initialize"}, "run_id"),
        ({"bundle_path": "/tmp"}, "bundle_path"),
        ({"dataset": "CacheDataset"}, "dataset"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_train_options(""))), ids=[n for _, n in _bad_train_options("")])
def test_train_refuses_options_it_does_not_document(app, tmp_path, case):
    from fastapi import HTTPException

    marker = tmp_path / "marker"
    options, named = _bad_train_options(str(marker))[case]
    with pytest.raises(HTTPException) as info:
        app.train({"model": NAME_2D, "device": "cpu", "multi_gpu": False, **options})
    status, detail = _status(info)
    assert status == 422 and f"train option {named!r}" in detail, detail
    assert not marker.exists()  # the payload never ran


def test_train_payload_never_runs(tmp_path):
    # a datastore with labelled pairs: MONAI Label's own task would build the trainer and evaluate the payload
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    (studies / "labels" / "final").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(3):
        image, mask = synthesize_pair(rng, 56)
        Image.fromarray(image).save(studies / f"s{i}.png")
        Image.fromarray((mask > 0).astype(np.uint8)).save(studies / "labels" / "final" / f"s{i}.png")
    app = _app(bundles, studies, models=NAME_2D, **{f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN})})
    marker = tmp_path / "marker"
    request = {"model": NAME_2D, "device": "cpu", "multi_gpu": False, "val_split": 0.34}
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as info:
        app.train({**request, "max_epochs": _PAYLOAD.format(str(marker))})
    status, detail = _status(info)
    assert status == 422 and "train option 'max_epochs'" in detail
    assert not marker.exists()
    with pytest.raises(ValueError, match="train option 'max_epochs'"):  # the task itself refuses it too
        app._trainers[NAME_2D]({**request, "max_epochs": _PAYLOAD.format(str(marker))}, app.datastore())
    assert not marker.exists()


def test_train_accepts_what_monai_label_clients_send(app):
    task = app._trainers[NAME_2D]
    request = {
        "model": NAME_2D, "bundle_path": task.bundle_path, "device": ["cpu"], "pretrained": True, "max_epochs": 3,
        "val_split": 0.2, "multi_gpu": True, "gpus": "all", "tracking": ["None", "mlflow"], "tracking_uri": "",
        "tracking_experiment_name": "", "run_id": "", "model_filename": ["model.pt"],
    }  # fmt: skip
    checked = app.check_train_request(request)
    assert checked == {
        "model": NAME_2D, "device": "cpu", "pretrained": True, "max_epochs": 3, "val_split": 0.2, "multi_gpu": True,
        "gpus": "all", "tracking": "None", "model_filename": "model.pt",
    }  # fmt: skip
    # MONAI Label's deprecated POST /train/ also passes each model's options under its name
    assert app.check_train_request({**request, NAME_3D: {"max_epochs": 2}}) == checked


def test_training_can_be_disabled(served):
    from fastapi import HTTPException

    app = _app(served["bundles"], served["studies"], skip_trainers="true")
    assert app.info()["trainers"] == {}
    with pytest.raises(HTTPException) as info:
        app.train({"model": NAME_2D, "max_epochs": 1})
    status, detail = _status(info)
    assert status == 404 and "training is disabled" in detail


def test_server_side_paths_are_answered_as_unknown_ids(app, served, tmp_path):
    from fastapi import HTTPException

    junk = tmp_path / "junk.png"
    junk.write_bytes(b"\x00" * 64)
    existing = served["studies"] / "img_a.png"
    images = [
        "no_such_image",  # an id that is not in the datastore: the reference answer
        str(existing),  # an absolute path of an image
        str(junk),  # an absolute path of a file that is not an image
        os.path.relpath(existing),  # a path with '../' (relative to the working folder)
        str(tmp_path / "missing.png"),  # a path that does not exist
        "../studies/img_a",
    ]
    assert images[3].startswith("..")
    answers = []
    for image in images:
        with pytest.raises(HTTPException) as info:
            app.infer({"model": NAME_2D, "image": image, "device": "cpu"})
        answers.append(_status(info))
    assert answers == [answers[0]] * len(images)
    assert answers[0][0] == 404 and "no_such_image" not in answers[0][1]


def test_infer_2d_jpeg_input_gives_a_png_label_map(app):
    result = app.infer({"model": NAME_2D, "image": "img_j", "device": "cpu"})
    assert result["file"].endswith(".png")
    with Image.open(result["file"]) as f:
        assert f.format == "PNG"
        label = np.asarray(f)
    assert label.shape == IMAGE_2D_SHAPE and label.dtype == np.uint8
    assert set(np.unique(label).tolist()) == {0, 1}  # the documented values: 0 background, 1 foreground
