"""Next sample by uncertainty in the MONAI Label app (``lib/scoring.py``; docs/monailabel.md): after a training, the
``uncertainty`` scoring writes a number into each unlabelled image's info and the ``uncertainty`` strategy answers the
unlabelled image with the highest one, through MONAI Label's own routes (FastAPI's TestClient); 2D images and NIfTI
volumes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

from PIL import Image  # noqa: E402

from spectraflow_monai.apps.seg2d.synthetic import synthesize_pair  # noqa: E402
from spectraflow_monai.apps.synapse import synthetic_ct_volume  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (_quiet_app: an autouse fixture used by name)
    AFFINE,
    NAME_2D,
    NAME_3D,
    SIZE,
    TRAIN,
    VOLUME_SHAPE,
    _app,
    _make_bundles,
    _quiet_app,
    _write_2d_pairs,
    _write_studies,
    app_main,
)

SCORE = "uncertainty_tta_entropy"


def _client(app, bundles: Path, studies: Path):
    from fastapi.testclient import TestClient
    from monailabel.app import app as fastapi_app
    from monailabel.config import settings
    from monailabel.interfaces.utils import app as app_utils

    settings.MONAI_LABEL_APP_DIR, settings.MONAI_LABEL_STUDIES = str(bundles / "monailabel_app"), str(studies)
    app_utils.apps.clear()
    app_utils.apps[f"{settings.MONAI_LABEL_APP_DIR}{settings.MONAI_LABEL_STUDIES}"] = app
    app.server_mode(True)
    return TestClient(fastapi_app, raise_server_exceptions=False)


@pytest.fixture
def settings_saved():
    from monailabel.config import settings
    from monailabel.interfaces.utils import app as app_utils

    names = ("MONAI_LABEL_APP_DIR", "MONAI_LABEL_STUDIES", "MONAI_LABEL_DATASTORE_AUTO_RELOAD",
             "MONAI_LABEL_AUTO_UPDATE_SCORING")  # fmt: skip
    saved = {k: getattr(settings, k) for k in names}
    settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD = False
    settings.MONAI_LABEL_AUTO_UPDATE_SCORING = False  # scoring runs when the test asks (in process)
    yield
    app_utils.apps.clear()
    for key, value in saved.items():
        setattr(settings, key, value)


def _run_scoring(client, app, **options) -> dict:
    """``POST /scoring/uncertainty`` (a run in the server's process, in the background), waited for; its result."""
    r = client.post("/scoring/uncertainty", json=options or None)
    assert r.status_code == 200, r.text
    app.scoring_runs.wait(300)
    status = client.get("/scoring/").json()
    assert status["id"] == r.json()["id"] and status["status"] == "DONE", status
    return status["result"]


def _scores(app) -> dict[str, float]:
    store = app.datastore()
    return {i: store.get_image_info(i).get(SCORE) for i in store.get_unlabeled_images()}


@pytest.mark.slow
def test_2d_scoring_after_training_and_the_strategy_serves_the_highest(tmp_path, settings_saved):
    studies = tmp_path / "studies"
    _write_studies(studies)
    for path in ("img_j.jpg", "ct_a.nii.gz"):
        (studies / path).unlink()
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    _write_2d_pairs(studies, 7)  # 7 labelled images s0..s6
    rng = np.random.default_rng(5)
    for i in range(3):  # 4 unlabelled: img_a and u0..u2
        Image.fromarray(synthesize_pair(rng, 56)[0]).save(studies / f"u{i}.png")
    conf = {f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN}), "pretrained_weights": "none"}
    app = _app(bundles, studies, models=NAME_2D, encoder_init="pretrained", **conf)
    client = _client(app, bundles, studies)

    info = client.get("/info/").json()
    assert "uncertainty" in info["strategies"] and "uncertainty" in info["scoring"]
    # no score yet: the strategy answers a random unlabelled image and says so
    r = client.post("/activelearning/uncertainty")
    assert r.status_code == 200 and r.json()["id"] in {"img_a", "u0", "u1", "u2"}
    assert r.json()["selection"].startswith("random: no unlabelled image has an uncertainty score")

    app.train({"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.3})
    _run_scoring(client, app)
    scores = _scores(app)
    assert set(scores) == {"img_a", "u0", "u1", "u2"}
    assert all(isinstance(v, float) and math.isfinite(v) and 0.0 <= v <= 1.0 for v in scores.values()), scores
    assert len(set(scores.values())) > 1  # a number per image, not one for all

    for info in ({"strategy": {}},):  # forget the random pick above, so that every image may be served
        for image in scores:
            app.datastore().update_image_info(image, info)
    ranked = sorted(scores, key=scores.get, reverse=True)
    first = client.post("/activelearning/uncertainty").json()
    assert first["id"] == ranked[0] and first[SCORE] == pytest.approx(scores[ranked[0]])
    # the image just served to one client is not served to the next
    assert client.post("/activelearning/uncertainty", json={"client_id": "other"}).json()["id"] == ranked[1]


def test_synapse_volumes_are_scored_over_their_slices(tmp_path, settings_saved):
    studies = tmp_path / "studies"
    studies.mkdir()
    for i in range(2):
        volume, _ = synthetic_ct_volume(i + 1, shape=VOLUME_SHAPE)
        nib.save(nib.Nifti1Image(volume, AFFINE), str(studies / f"ct{i}.nii.gz"))
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(studies / "photo.png")  # no served model takes it
    bundles = _make_bundles(tmp_path, studies, names=(NAME_3D,))
    app = _app(bundles, studies, models=NAME_3D)
    client = _client(app, bundles, studies)
    assert _run_scoring(client, app)["skipped"] == {"photo": "no served model takes 2D images"}
    scores = _scores(app)
    assert scores["photo"] is None
    assert all(0.0 < scores[f"ct{i}"] <= 1.0 for i in range(2)), scores
    answer = client.post("/activelearning/uncertainty").json()
    assert answer["id"] == max(("ct0", "ct1"), key=scores.get)


def test_scoring_stops_at_its_time_budget(tmp_path, settings_saved):
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    app = _app(bundles, studies, models=NAME_2D, scoring_max_seconds="1e-9")
    result = app.scoring({"method": "uncertainty"})
    assert result["scored"] == 0 and result["left"] == 3  # img_a, img_j, ct_a: none scored, the budget was spent


@pytest.mark.parametrize(
    "conf,match",
    [
        ({"scoring_max_seconds": "soon"}, "scoring_max_seconds must be a number"),
        ({"scoring_max_seconds": "0"}, "max_seconds must be > 0"),
        ({"scoring_batch_size": "0"}, "batch_size must be"),
        ({"uncertainty_hold_seconds": "-1"}, "hold_seconds must be >= 0"),
    ],
)
def test_bad_scoring_settings_stop_the_app(tmp_path, conf, match):
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,), weights=False)
    with pytest.raises(ValueError, match=match):
        _app(bundles, studies, models=NAME_2D, **conf)


def test_strategy_without_unlabelled_images_answers_nothing(tmp_path, settings_saved):
    studies = tmp_path / "studies"
    studies.mkdir()
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,), weights=False)
    app = _app(bundles, studies, models=NAME_2D)
    assert _client(app, bundles, studies).post("/activelearning/uncertainty").json() == {}
    assert app_main.SpectraFlowApp is type(app)


def test_images_scored_by_the_served_model_are_not_scored_again(tmp_path, settings_saved):
    studies = tmp_path / "studies"
    _write_studies(studies)
    (studies / "ct_a.nii.gz").unlink()
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    app = _app(bundles, studies, models=NAME_2D)
    assert app.scoring({"method": "uncertainty"})["scored"] == 2
    again = app.scoring({"method": "uncertainty"})  # what MONAI Label runs after every Next Sample
    assert again["scored"] == 0 and again["current"] == 2
    assert app.scoring({"method": "uncertainty", "force": True})["scored"] == 2


def test_automatic_scoring_starts_only_when_an_image_needs_a_score(tmp_path, settings_saved, monkeypatch):
    studies = tmp_path / "studies"
    _write_studies(studies)
    (studies / "ct_a.nii.gz").unlink()
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    app = _app(bundles, studies, models=NAME_2D)
    started = []
    monkeypatch.setattr(app.scoring_runs, "start", lambda request, automatic=False: started.append(automatic) or {})
    app.server_mode(True)
    app.async_scoring(None)  # what MONAI Label does at start, after a training and after every Next Sample
    assert started == [True]
    app.scoring({"method": "uncertainty"})
    app.async_scoring(None)
    assert started == [True]  # every unlabelled image is scored by the served model: no run started
    app.async_scoring("uncertainty")  # asked for by name: always runs
    assert started == [True, True]


def test_a_scoring_trigger_that_fails_does_not_fail_the_training(tmp_path, settings_saved, monkeypatch):
    """A background training runs outside the server process, where MONAI Label starts the scoring over HTTP; with
    the server unreachable the trigger raised and the finished training was reported as failed."""
    import requests

    def refused(*args, **kwargs):
        raise requests.exceptions.ConnectionError("Connection refused")

    monkeypatch.setattr(requests, "post", refused)
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    app = _app(bundles, studies, models=NAME_2D)
    assert app.async_scoring(None) == {}  # not in server mode: MONAI Label would post to 127.0.0.1


def test_next_sample_asked_again_and_again_is_answered(tmp_path, settings_saved):
    """MONAI Label's ``random`` strategy weighs each unlabelled image by the seconds since it was served: with every
    image served within the current second all weights were 0 and ``random.choices`` raised (a bare 500)."""
    studies = tmp_path / "studies"
    _write_studies(studies)
    (studies / "ct_a.nii.gz").unlink()
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    app = _app(bundles, studies, models=NAME_2D)
    client = _client(app, bundles, studies)
    answers = [client.post("/activelearning/random", json={}) for _ in range(6)]
    assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
    assert {r.json()["id"] for r in answers} <= {"img_a", "img_j"}
