"""MONAI Label serving of the SpectraFlow bundles (``bundles/monailabel_app``).

The app's tasks run in this process on both bundles (``spectraflow_2d_segmentation``: a 2D PNG in, a PNG label map at
the input's size out; ``spectraflow_synapse_segmentation``: a 3D CT NIfTI in, a label volume with the input's shape
and affine out), and their output is compared voxel by voxel with the bundle's own ``configs/inference.yaml`` run
through ``monai.bundle.run``. Fine-tuning (``BundleTrainTask``) runs one epoch on labels saved in the datastore's
``labels/final``. The end-to-end test starts ``monailabel start_server`` on 127.0.0.1, requests inferences over HTTP,
sends bad requests (4xx expected) and checks that the server keeps serving. The networks are tiny SpectraFlowNets
(2-block DINOv2 encoder, 56x56 / 28x28 slices) passed to the app as bundle config overrides, as a user serving a
model trained with non-default settings would (``--conf overrides``).

The module is skipped when MONAI Label is not installed (the ``label`` extra, docs/monailabel.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "monailabel",
    reason="MONAI Label is not installed: pip install -e '.[label]' && "
    "pip install --no-deps monailabel==0.8.5 pydicom-seg==0.4.1 (docs/monailabel.md)",
)

import nibabel as nib  # noqa: E402
import torch  # noqa: E402
from monai.bundle import ConfigParser  # noqa: E402
from monai.bundle import run as bundle_run  # noqa: E402
from PIL import Image  # noqa: E402

from spectraflow_monai.apps.seg2d.synthetic import synthesize_pair  # noqa: E402

from .pacs import serving  # noqa: E402
from spectraflow_monai.apps.synapse import (  # noqa: E402
    map_btcv_labels,
    synthetic_ct_volume,
)
from spectraflow_monai.utils.bundles import merged_config, settings_overrides  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP_MAIN = REPO / "bundles" / "monailabel_app" / "main.py"
NAME_2D = "spectraflow_2d_segmentation"
NAME_3D = "spectraflow_synapse_segmentation"
# tiny networks: a 2-block encoder; 56x56 images for the 2D bundle, 28x28 slices for the Synapse bundle
NET = {"encoder_kwargs": {"depth": 2}}
SIZE = {NAME_2D: {"image_size": 56}, NAME_3D: {"image_size": 28}}
# training settings for a handful of samples on CPU
TRAIN = {"batch_size": 2, "val_batch_size": 2, "num_workers": 0, "progress_bar": False}
IMAGE_2D_SHAPE = (70, 90)  # (H, W) of the test PNG
VOLUME_SHAPE = (40, 36, 6)
# a flipped, anisotropic, shifted affine: the label must come back on exactly this grid
AFFINE = np.array([[-0.8, 0, 0, 10.0], [0, -0.7, 0, -20.0], [0, 0, 2.5, 30.0], [0, 0, 0, 1]])
ORGANS = {
    "spleen": 1, "right_kidney": 2, "left_kidney": 3, "gallbladder": 4,
    "liver": 5, "stomach": 6, "aorta": 7, "pancreas": 8,
}  # fmt: skip
SERVER_START_TIMEOUT = 120.0


def _load_app_module():
    spec = importlib.util.spec_from_file_location("spectraflow_monailabel_app_main", APP_MAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


app_main = _load_app_module()


def _conf(**extra) -> dict[str, str]:
    conf = {
        "overrides": json.dumps(NET),
        f"overrides.{NAME_2D}": json.dumps(SIZE[NAME_2D]),
        f"overrides.{NAME_3D}": json.dumps(SIZE[NAME_3D]),
    }
    conf.update(extra)
    return conf


def _overrides(name: str) -> dict:
    return {**NET, **SIZE[name]}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _network(name: str, config: Path):
    parser = ConfigParser()
    parser.read_config(str(config))
    parser.update(settings_overrides(parser.config, _overrides(name)))  # a setting by its field name: at its id
    return parser


def _make_bundles(root: Path, studies: Path, names=(NAME_2D, NAME_3D), weights: bool = True) -> Path:
    """``root/bundles/{monailabel_app, <bundles>}`` laid out as in the repository: the app's main.py is a link to
    the repository's, each bundle has a copy of the repository's configs (the shared ones' contents in place of their
    links) and a freshly initialised tiny model.pt."""
    bundles = root / "bundles"
    (bundles / "monailabel_app").mkdir(parents=True)
    os.symlink(APP_MAIN, bundles / "monailabel_app" / "main.py")
    for name in names:
        shutil.copytree(REPO / "bundles" / name / "configs", bundles / name / "configs")
        if not weights:
            continue
        parser = _network(name, bundles / name / "configs" / "inference.yaml")
        torch.manual_seed(0)
        net = parser.get_parsed_content("network_def")
        if name == NAME_2D:
            # centre the logits on the test image so that the random network's mask is neither empty nor full
            image = parser.get_parsed_content("preprocessing")({"image": str(studies / "img_a.png")})["image"]
            net.eval()
            with torch.no_grad():
                logits = net(image[None].float())
                net.decoder.head.conv.bias.sub_(logits.median())
        (bundles / name / "models").mkdir()
        torch.save(net.state_dict(), bundles / name / "models" / "model.pt")
    return bundles


def _studies_and_bundles(root: Path, names=(NAME_2D,)) -> tuple[Path, Path]:
    """``root/studies`` (:func:`_write_studies`) and ``root/bundles`` (:func:`_make_bundles` of ``names``)."""
    studies = root / "studies"
    _write_studies(studies)
    return studies, _make_bundles(root, studies, names=names)


def _served(bundles: Path, name: str) -> Path:
    """The server's own copy of bundle ``name`` (``--conf model_dir``, default ``<app>/model``)."""
    return bundles / "monailabel_app" / "model" / name


def _write_studies(studies: Path) -> None:
    """A 70x90 RGB PNG (``img_a``), the same image as a JPEG (``img_j``) and a 40x36x6 CT volume (``ct_a``) with a
    flipped affine."""
    studies.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    image, _ = synthesize_pair(rng, 96)
    Image.fromarray(image[: IMAGE_2D_SHAPE[0], : IMAGE_2D_SHAPE[1]]).save(studies / "img_a.png")
    Image.fromarray(image[: IMAGE_2D_SHAPE[0], : IMAGE_2D_SHAPE[1]]).save(studies / "img_j.jpg", quality=95)
    volume, _ = synthetic_ct_volume(1, shape=VOLUME_SHAPE)
    nib.save(nib.Nifti1Image(volume, AFFINE), str(studies / "ct_a.nii.gz"))


def _write_2d_pairs(studies: Path, count: int, seed: int = 1) -> None:
    """``count`` synthetic 56x56 images ``s<i>.png`` with their 0/1 label maps in ``labels/final``."""
    (studies / "labels" / "final").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        image, mask = synthesize_pair(rng, 56)
        Image.fromarray(image).save(studies / f"s{i}.png")
        Image.fromarray((mask > 0).astype(np.uint8)).save(studies / "labels" / "final" / f"s{i}.png")


def _bundle_inference(name: str, bundle: Path, image: Path, out_dir: Path) -> Path:
    """The bundle's own inference.yaml (``monai.bundle run``) on one image; returns the written file."""
    in_dir = out_dir / "in"
    in_dir.mkdir(parents=True)
    shutil.copy(image, in_dir / image.name)
    saved_path = list(sys.path)
    try:
        config = str(bundle / "configs" / "inference.yaml")
        bundle_run(
            config_file=config,
            meta_file=str(bundle / "configs" / "metadata.json"),
            logging_file=False,
            bundle_root=str(bundle),
            device="cpu",
            amp=False,
            **settings_overrides(
                merged_config([config]),
                {"input_dir": str(in_dir), "output_dir": str(out_dir / "pred"), **_overrides(name)},
            ),
        )
    finally:
        sys.path[:] = saved_path
    (result,) = list((out_dir / "pred").iterdir())
    return result


@pytest.fixture(autouse=True)
def _quiet_app(monkeypatch):
    """One thread, no datastore file watcher threads nor automatic scoring, and sys.path restored (the Bundle tasks
    edit it)."""
    from monailabel.config import settings

    monkeypatch.setattr(settings, "MONAI_LABEL_DATASTORE_AUTO_RELOAD", False)
    # no automatic scoring: outside a server it would post to 127.0.0.1:<MONAI Label's port>
    monkeypatch.setattr(settings, "MONAI_LABEL_AUTO_UPDATE_SCORING", False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    saved_path = list(sys.path)
    yield
    sys.path[:] = saved_path
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("monailabel")
    studies = root / "studies"
    _write_studies(studies)
    bundles = _make_bundles(root, studies)
    yield {"root": root, "studies": studies, "bundles": bundles}
    shutil.rmtree(root, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def _app(bundles: Path, studies: Path, **conf):
    return app_main.SpectraFlowApp(app_dir=str(bundles / "monailabel_app"), studies=str(studies), conf=_conf(**conf))


@pytest.fixture(scope="module")
def app(served):
    from monailabel.config import settings

    saved = settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD
    settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD = False
    try:
        return _app(served["bundles"], served["studies"])
    finally:
        settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD = saved


def _status(exc_info) -> tuple[int, str]:
    return exc_info.value.status_code, str(exc_info.value.detail)


# ---------------------------------------------------------------- 1. the app finds and serves both bundles
def test_app_serves_both_bundles(app):
    info = app.info()
    assert set(info["models"]) == {NAME_2D, NAME_3D}
    assert set(info["trainers"]) == {NAME_2D, NAME_3D}
    assert info["models"][NAME_3D]["labels"] == ORGANS  # channel_def without the background
    assert info["models"][NAME_2D]["labels"] == {"foreground": 1}
    # what a client sends: a 3D volume to the Synapse bundle (its network is 2D), a 2D image to the 2D bundle
    assert info["models"][NAME_3D]["dimension"] == 3
    assert info["models"][NAME_2D]["dimension"] == 2


def test_unknown_bundle_name_stops_the_app(served):
    with pytest.raises(ValueError, match=r"'no_such_bundle'.*not found.*spectraflow_2d_segmentation"):
        _app(served["bundles"], served["studies"], models="no_such_bundle")


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"overrides": "{not json"}, "--conf overrides must be a JSON object"),
        ({"overrides": "[1, 2]"}, "--conf overrides must be a JSON object"),
        ({f"overrides.{NAME_2D}": '{"bundle_root": "/x"}'}, "must not set 'bundle_root'"),
        ({"encoder_init": "stage2"}, r"--conf encoder_init must be one of \['auto', 'stage1', 'pretrained', 'random'\]"),
        ({"pretrained_weights": "$os.getcwd()"}, "--conf pretrained_weights must be a plain, non-empty string"),
    ],
)
def test_bad_overrides_are_named(served, conf, message):
    with pytest.raises(ValueError, match=message):
        app_main.SpectraFlowApp(
            app_dir=str(served["bundles"] / "monailabel_app"), studies=str(served["studies"]), conf=conf
        )


def test_encoder_weight_settings_reach_training_only(served):
    app = _app(served["bundles"], served["studies"], pretrained_weights="/w/dinov2_vits14_pretrain.pth",
               encoder_init="Pretrained")  # fmt: skip
    for name in (NAME_2D, NAME_3D):
        overrides = app._trainers[name].overrides
        assert overrides["pretrained_weights"] == "/w/dinov2_vits14_pretrain.pth"
        assert overrides["encoder_init"] == "pretrained"
    # left out: the bundle's own settings (timm / stage1) stay
    default = _app(served["bundles"], served["studies"])
    assert not {"pretrained_weights", "encoder_init"} & set(default._trainers[NAME_2D].overrides)


def test_weights_that_do_not_fit_stop_the_app(served):
    # model.pt has a 2-block encoder; serving it as a 3-block one is refused at start-up, naming the file
    conf = _conf(models=NAME_2D, overrides=json.dumps({"encoder_kwargs": {"depth": 3}}))
    with pytest.raises(ValueError, match=r"model\.pt does not fit the network.*missing: \['encoder\.vit\.blocks\.2"):
        app_main.SpectraFlowApp(
            app_dir=str(served["bundles"] / "monailabel_app"), studies=str(served["studies"]), conf=conf
        )


# ---------------------------------------------------------------- 2. inference in process (BundleInferTask)
def test_infer_2d_png_at_input_size(app, served, tmp_path):
    result = app.infer({"model": NAME_2D, "image": "img_a", "device": "cpu"})
    label = np.asarray(Image.open(result["file"]))
    assert label.shape == IMAGE_2D_SHAPE and label.dtype == np.uint8
    assert set(np.unique(label).tolist()) == {0, 1}  # a label map (not 0/255), neither empty nor full
    assert result["params"]["label_names"] == {"foreground": 1}
    # the same mask as the bundle's own inference.yaml (which writes 0/255)
    expected = np.asarray(
        Image.open(_bundle_inference(NAME_2D, served["bundles"] / NAME_2D, served["studies"] / "img_a.png", tmp_path))
    )
    np.testing.assert_array_equal(label.astype(np.int64) * 255, expected.astype(np.int64))


def test_infer_3d_volume_keeps_the_geometry(app, served, tmp_path):
    result = app.infer({"model": NAME_3D, "image": "ct_a", "device": "cpu"})
    out = nib.load(result["file"])
    label = np.asarray(out.dataobj)
    assert out.shape == VOLUME_SHAPE
    np.testing.assert_allclose(out.affine, AFFINE, atol=1e-5)
    np.testing.assert_allclose(out.header.get_zooms(), (0.8, 0.7, 2.5), atol=1e-5)
    assert label.dtype == np.uint8
    values = set(np.unique(label).tolist())
    assert values <= set(range(9)) and len(values) >= 2, values
    assert result["params"]["label_names"] == ORGANS
    expected = nib.load(
        str(_bundle_inference(NAME_3D, served["bundles"] / NAME_3D, served["studies"] / "ct_a.nii.gz", tmp_path))
    )
    np.testing.assert_allclose(expected.affine, out.affine, atol=1e-5)
    np.testing.assert_array_equal(label, np.asarray(expected.dataobj))


# ---------------------------------------------------------------- 3. bad requests in process: 4xx, then served again
def test_bad_requests_are_client_errors(app, served, tmp_path):
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as info:
        app.infer({"model": "no_such_model", "image": "ct_a", "device": "cpu"})
    status, detail = _status(info)
    assert status == 404 and "'no_such_model' is not loaded" in detail and NAME_3D in detail

    with pytest.raises(HTTPException) as info:
        app.infer({"model": NAME_3D, "image": "no_such_image", "device": "cpu"})
    status, detail = _status(info)
    # the answer names neither the id nor a server path (server-side paths get the very same answer)
    assert status == 404 and "image not found" in detail and "no_such_image" not in detail
    assert str(served["studies"]) not in detail

    # an upload (the endpoint saves it as a temporary file) that is not an image
    with tempfile.NamedTemporaryFile(suffix=".nii.gz", delete=False) as f:
        f.write(b"not an image")
    try:
        with pytest.raises(HTTPException) as info, app_main.client_request(upload=True):
            app.infer({"model": NAME_3D, "image": f.name, "device": "cpu"})
    finally:
        os.unlink(f.name)
    status, detail = _status(info)
    assert status == 415 and "the uploaded file cannot be read as an image" in detail

    with pytest.raises(HTTPException) as info:  # a 2D image for the volume model
        app.infer({"model": NAME_3D, "image": "img_a", "device": "cpu"})
    status, detail = _status(info)
    assert status == 422 and "expected a 3D volume" in detail

    with pytest.raises(HTTPException) as info:  # a volume for the 2D model
        app.infer({"model": NAME_2D, "image": "ct_a", "device": "cpu"})
    status, detail = _status(info)
    assert status == 422 and "expected a 2D image" in detail

    # the app still serves
    result = app.infer({"model": NAME_3D, "image": "ct_a", "device": "cpu"})
    assert nib.load(result["file"]).shape == VOLUME_SHAPE


def test_datastore_refuses_a_non_image_upload(app, tmp_path):
    from fastapi import HTTPException

    junk = tmp_path / "junk.png"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(HTTPException) as info:
        app.datastore().add_image("junk", str(junk), {})
    status, detail = _status(info)
    assert status == 415 and "not a readable image" in detail
    assert "junk" not in app.datastore().list_images()


def test_bundle_without_weights_is_served_for_training_only(tmp_path):
    from fastapi import HTTPException

    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,), weights=False)
    app = _app(bundles, studies, models=NAME_2D)
    assert NAME_2D not in app.info()["models"] and NAME_2D in app.info()["trainers"]
    with pytest.raises(HTTPException) as info:
        app.infer({"model": NAME_2D, "image": "img_a", "device": "cpu"})
    status, detail = _status(info)
    assert status == 404 and "model.pt is missing" in detail and "train it first" in detail


# ---------------------------------------------------------------- 4. fine-tuning from the datastore (BundleTrainTask)
def _fine_tune(tmp_path: Path, name: str, write_pairs) -> tuple:
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(name,))
    (studies / "labels" / "final").mkdir(parents=True)
    write_pairs(studies)
    installed = bundles / name / "models" / "model.pt"
    before = torch.load(installed, weights_only=True)
    # the app's encoder-weight settings (no hub here): random init, then models/model.pt is loaded over it
    conf = {f"overrides.{name}": json.dumps({**SIZE[name], **TRAIN}), "pretrained_weights": "none"}
    app = _app(bundles, studies, models=name, encoder_init="pretrained", **conf)
    app.train({"model": name, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.34})
    after = torch.load(_served(bundles, name) / "models" / "model.pt", weights_only=True)
    # the installed bundle is never written: the server trains and serves its own copy
    assert torch.equal(torch.load(installed, weights_only=True)["decoder.head.conv.weight"],
                       before["decoder.head.conv.weight"])  # fmt: skip
    assert not (bundles / name / "logs").exists()
    assert not any((_served(bundles, name) / "runs").iterdir())  # the run's folder is gone once its model serves
    assert set(after) == set(before)
    # started from model.pt (frozen encoder blocks unchanged) and fine-tuned the rest
    torch.testing.assert_close(
        after["encoder.vit.blocks.0.attn.qkv.weight"], before["encoder.vit.blocks.0.attn.qkv.weight"]
    )
    assert not torch.equal(after["decoder.head.conv.weight"], before["decoder.head.conv.weight"])
    assert (_served(bundles, name) / "logs").is_dir()
    return app, bundles


def test_fine_tune_2d_from_datastore_labels(tmp_path):
    app, _ = _fine_tune(tmp_path, NAME_2D, lambda studies: _write_2d_pairs(studies, 5))
    result = app.infer({"model": NAME_2D, "image": "s0", "device": "cpu"})  # serves the fine-tuned model.pt
    assert np.asarray(Image.open(result["file"])).shape == (56, 56)


class _Lines(logging.Handler):
    """The messages of one logger (a bundle run's logging.conf replaces the root handlers, pytest's included)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_every_training_is_a_new_run_on_the_current_labels(tmp_path):
    """A second training with the same options once resumed the finished first run and trained nothing. Each request
    is a new run: from the served model.pt (fine-tuning) or the bundle's initial weights (``pretrained`` false),
    and its best model replaces the served one, with a log line."""
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    _write_2d_pairs(studies, 4)
    frozen, head = "encoder.vit.blocks.0.attn.qkv.weight", "decoder.head.conv.weight"
    # a deployed model whose frozen encoder differs from the initial one (the same seed would make them equal)
    deployed = torch.load(bundles / NAME_2D / "models" / "model.pt", weights_only=True)
    deployed[frozen] += 0.5
    torch.save(deployed, bundles / NAME_2D / "models" / "model.pt")
    conf = {f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN}), "pretrained_weights": "none"}
    app = _app(bundles, studies, models=NAME_2D, encoder_init="pretrained", **conf)
    served = Path(app._trainers[NAME_2D].bundle_path) / "models" / "model.pt"
    request = {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.5}
    states = [torch.load(served, weights_only=True)]
    lines = _Lines()
    loggers = [logging.getLogger(type(app._trainers[NAME_2D]).__module__), logging.getLogger("spectraflow_monai")]
    for log in loggers:
        log.addHandler(lines)
        log.setLevel(logging.INFO)
    try:
        app.train(dict(request))
        states.append(torch.load(served, weights_only=True))
        # new labels for the same images, then the same request again
        for i in range(4):
            corrected = np.zeros((56, 56), np.uint8)
            corrected[10 + i : 40, 8:44] = 1
            Image.fromarray(corrected).save(tmp_path / "corrected.png")
            app.datastore().save_label(f"s{i}", str(tmp_path / "corrected.png"), "final", {})
        app.train(dict(request))
        states.append(torch.load(served, weights_only=True))
        app.train({**request, "pretrained": False})
        states.append(torch.load(served, weights_only=True))
    finally:
        for log in loggers:
            log.removeHandler(lines)
    for earlier, later in zip(states, states[1:]):
        assert not torch.equal(earlier[head], later[head])  # every request trained and replaced the served model
    torch.testing.assert_close(states[2][frozen], states[0][frozen])  # fine-tuning: frozen blocks from model.pt
    assert not torch.equal(states[3][frozen], states[0][frozen])  # pretrained false: the initial (random) encoder
    text = "\n".join(lines.lines)
    assert text.count("starting from fine-tuning from models/model.pt") == 2
    assert text.count("starting from the bundle's initial weights") == 1
    assert text.count("now serves as models/model.pt (it replaced the previous one)") == 3
    assert "resuming from" not in text, text  # (what a resumed run logs)


def test_a_run_without_a_model_keeps_the_served_one(tmp_path):
    from fastapi import HTTPException

    # val_split 0: nothing is validated, so the run has no best model; the served model stays, the run's folder goes
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    _write_2d_pairs(studies, 2)
    conf = {f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN}), "pretrained_weights": "none"}
    app = _app(bundles, studies, models=NAME_2D, encoder_init="pretrained", **conf)
    copy = Path(app._trainers[NAME_2D].bundle_path)
    served = (copy / "models" / "model.pt").read_bytes()
    request = {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.0}
    with pytest.raises(HTTPException) as refused:  # a request is refused before it trains (no validation pair)
        app.train(dict(request))
    assert refused.value.status_code == 422 and "no validation pair" in refused.value.detail
    with pytest.raises(RuntimeError, match="saved no model"):  # the training task itself, run all the same
        app._trainers[NAME_2D](dict(request), app.datastore())
    assert (copy / "models" / "model.pt").read_bytes() == served
    assert not any((copy / "runs").iterdir())


def test_fine_tune_synapse_from_datastore_volumes(tmp_path):
    def pairs(studies):
        for i in range(3):
            volume, btcv = synthetic_ct_volume(i + 2, shape=VOLUME_SHAPE)
            nib.save(nib.Nifti1Image(volume, AFFINE), str(studies / f"ct{i}.nii.gz"))
            label = np.asarray(map_btcv_labels(btcv)).astype(np.uint8)  # what MONAI Label saves: classes 0..8
            nib.save(nib.Nifti1Image(label, AFFINE), str(studies / "labels" / "final" / f"ct{i}.nii.gz"))

    app, bundles = _fine_tune(tmp_path, NAME_3D, pairs)
    # the volumes were sliced once into the bundle's cache (one file per axial slice) by the bundle's own
    # volume_slices (VolumeSlices), as for MONAI Label's stock bundle trainer: no cache of the app's own
    cache = _served(bundles, NAME_3D) / "cache"
    assert sorted(p.name for p in cache.iterdir()) == [f"synthetic_{SIZE[NAME_3D]['image_size']}_volumes"]
    assert len(list(cache.rglob("*.npz"))) == 3 * VOLUME_SHAPE[2]
    result = app.infer({"model": NAME_3D, "image": "ct0", "device": "cpu"})
    assert nib.load(result["file"]).shape == VOLUME_SHAPE
    # fine-tuning a served model takes its recorded CT window, label map and non-finite rule as bundle settings
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    model = tmp_path / "other" / "model.pt"
    model.parent.mkdir()
    own = {"hu_window": (-200, 300), "label_map": {0: 0, 1: 1, 6: 2}, "nonfinite": "replace", "nonfinite_value": -1000}
    write_model_settings(model, ModelSettings(encoder_kwargs={"depth": 2}, image_size=28, num_classes=3, **own))
    taken = app._trainers[NAME_3D].recorded_settings(str(model))
    assert {k: taken[k] for k in own} == {
        "hu_window": [-200.0, 300.0], "label_map": {0: 0, 1: 1, 6: 2}, "nonfinite": "replace",
        "nonfinite_value": -1000.0,
    }  # fmt: skip
    assert taken["image_size"] == 28 and taken["encoder_kwargs"] == {"depth": 2}
    assert "architecture" not in taken  # not a setting of this bundle


def test_fine_tuning_takes_the_served_models_preprocessing(tmp_path):
    """A served model trained with its own normalisation is fine-tuned with it, not with train.yaml's: a server
    restarted without the override trains the served model with the recorded image_mean / image_std (the new
    model.json carries them, the log names them); starting from the bundle's initial weights takes train.yaml's."""
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,))
    _write_2d_pairs(studies, 4)
    own = {"image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.3, 0.25]}
    request = {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.5}
    conf = {f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN, **own}), "pretrained_weights": "none"}
    _app(bundles, studies, models=NAME_2D, encoder_init="pretrained", **conf).train(dict(request))
    record = _served(bundles, NAME_2D) / "models" / "model.json"
    assert {k: json.loads(record.read_text())["model"][k] for k in own} == own
    # the server again, with train.yaml's normalisation
    conf = {f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN}), "pretrained_weights": "none"}
    app = _app(bundles, studies, models=NAME_2D, encoder_init="pretrained", **conf)
    lines = _Lines()
    log = logging.getLogger(type(app._trainers[NAME_2D]).__module__)
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    try:
        app.train(dict(request))
        fine_tuned = json.loads(record.read_text())["model"]
        app.train({**request, "pretrained": False})
        initial = json.loads(record.read_text())["model"]
    finally:
        log.removeHandler(lines)
    assert {k: fine_tuned[k] for k in own} == own
    text = "\n".join(lines.lines)
    assert "fine-tuning from models/model.pt with its recorded settings (model.json): " in text
    assert "image_mean [0.5, 0.4, 0.3], image_std [0.2, 0.3, 0.25]" in text
    assert initial["image_mean"] == [0.485, 0.456, 0.406] and initial["image_std"] == [0.229, 0.224, 0.225]


def test_train_2d_multi_class_from_own_label_maps(tmp_path):
    """Own data: 3-class label maps drawn in MONAI Label (0 background, 1 lesion, 2 tool) train the 2D bundle set to
    those classes (``--conf overrides '{"label_classes": [...]}'``); the trained model serves label maps."""
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies, names=(NAME_2D,), weights=False)
    (studies / "labels" / "final").mkdir(parents=True)
    rng = np.random.default_rng(2)
    for i in range(5):
        image, mask = synthesize_pair(rng, 56)
        label = (mask > 0).astype(np.uint8)
        label[:12, :12] = 2  # a second class: an instrument in a corner
        Image.fromarray(image).save(studies / f"m{i}.png")
        Image.fromarray(label).save(studies / "labels" / "final" / f"m{i}.png")
    classes = {"label_classes": ["background", "lesion", "tool"]}
    conf = {f"overrides.{NAME_2D}": json.dumps({**SIZE[NAME_2D], **TRAIN, **classes}), "pretrained_weights": "none"}
    app = _app(bundles, studies, models=NAME_2D, encoder_init="random", **conf)
    app.train({"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.34})
    state = torch.load(_served(bundles, NAME_2D) / "models" / "model.pt", weights_only=True)
    assert state["decoder.head.conv.weight"].shape[0] == 3  # one output channel per class (softmax)
    # the app, which served the bundle for training only, serves the trained model.pt now; so does a restarted one
    assert NAME_2D in app.info()["models"]
    for served in (app, _app(bundles, studies, models=NAME_2D, **conf)):
        result = served.infer({"model": NAME_2D, "image": "m0", "device": "cpu"})
        pred = np.asarray(Image.open(result["file"]))
        assert pred.shape == (56, 56) and set(np.unique(pred).tolist()) <= {0, 1, 2}


# ---------------------------------------------------------------- 5. end to end over HTTP
def _server_log(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@contextlib.contextmanager
def running_server(workdir: Path, studies: Path | str, bundles: Path, conf: dict[str, str], env: dict | None = None):
    """``monailabel start_server`` on 127.0.0.1 (a free port) with the app in ``bundles`` (environment: this
    process's, updated with ``env``); yields ``(base_url, log_file)`` once ``GET /info/`` answers, and stops the
    server afterwards."""
    pytest.importorskip("requests")
    port = _free_port()
    cmd = [sys.executable, "-m", "monailabel.main", "start_server", "--app", str(bundles / "monailabel_app"),
           "--studies", str(studies), "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    for key, value in conf.items():
        cmd += ["--conf", key, value]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **(env or {}))
    log = workdir / "server.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as log_file, serving(
        cmd, f"{base}/info/", SERVER_START_TIMEOUT, "server", lambda: _server_log(log), poll=0.5, stdout=log_file,
        stderr=subprocess.STDOUT, env=env, cwd=workdir,
    ):  # fmt: skip
        yield base, log


def test_server_end_to_end(tmp_path):
    requests = pytest.importorskip("requests")
    studies = tmp_path / "studies"
    _write_studies(studies)
    bundles = _make_bundles(tmp_path, studies)
    params = {"params": (None, json.dumps({"device": "cpu"}))}
    with running_server(tmp_path, studies, bundles, _conf(models=f"{NAME_3D},{NAME_2D}")) as (base, _):
        info = requests.get(f"{base}/info/", timeout=30)
        assert set(info.json()["models"]) == {NAME_2D, NAME_3D}

        # automatic segmentation of a 3D CT from the datastore
        r = requests.post(
            f"{base}/infer/{NAME_3D}", params={"image": "ct_a", "output": "image"}, files=params, timeout=120
        )
        assert r.status_code == 200, r.text
        (tmp_path / "pred.nii.gz").write_bytes(r.content)
        out = nib.load(str(tmp_path / "pred.nii.gz"))
        assert out.shape == VOLUME_SHAPE
        np.testing.assert_allclose(out.affine, AFFINE, atol=1e-5)
        assert set(np.unique(np.asarray(out.dataobj)).tolist()) <= set(range(9))

        # bad requests: 4xx with a message
        r = requests.post(
            f"{base}/infer/{NAME_3D}", params={"image": "no_such_image", "output": "image"}, timeout=60
        )
        detail = r.json()["detail"]  # names neither the id nor a path: see the server-side paths below
        assert r.status_code == 404 and "image not found" in detail and "no_such_image" not in detail, r.text
        r = requests.post(f"{base}/infer/no_such_model", params={"image": "ct_a", "output": "image"}, timeout=60)
        assert r.status_code == 404 and "no_such_model" in r.json()["detail"], r.text
        r = requests.post(
            f"{base}/infer/{NAME_3D}", params={"output": "image"},
            files={"file": ("notes.nii.gz", b"not an image")}, timeout=60,
        )  # fmt: skip
        assert r.status_code == 415 and "cannot be read as an image" in r.json()["detail"], r.text

        # a server-side path (existing image, unreadable file, '../' path, missing file) is an unknown id
        (tmp_path / "junk.nii.gz").write_text("not an image")
        images = ["no_such_image", str(studies / "img_a.png"), str(tmp_path / "junk.nii.gz"),
                  f"../{tmp_path.name}/studies/img_a.png", str(studies / "missing.png")]  # fmt: skip
        unknown = requests.post(
            f"{base}/infer/{NAME_2D}", params={"image": images[0], "output": "image"}, files=params, timeout=60
        )
        assert unknown.status_code == 404, unknown.text
        for image in images:  # as the image of the query, and as "image" in params (which replaces it)
            for query, options in ((image, {}), ("img_a", {"image": image})):
                form = {"params": (None, json.dumps({"device": "cpu", **options}))}
                r = requests.post(
                    f"{base}/infer/{NAME_2D}", params={"image": query, "output": "image"}, files=form, timeout=60
                )
                assert (r.status_code, r.content) == (404, unknown.content), (image, options, r.text)

        # training options that the bundle config parser would evaluate: 422 naming the option, nothing runs
        marker = tmp_path / "marker"
        payload = f"$__import__('pathlib').Path({str(marker)!r}).touch() or 1"
        for option, run_sync in (("max_epochs", "true"), ("max_epochs", "false"), ("device", "false")):
            r = requests.post(
                f"{base}/train/{NAME_2D}", params={"run_sync": run_sync}, json={option: payload}, timeout=60
            )
            assert r.status_code == 422 and repr(option) in r.json()["detail"], r.text
        assert requests.get(f"{base}/train/", timeout=30).status_code == 404  # no training task was queued
        assert not marker.exists()

        # the server keeps serving: a 2D image upload
        with open(studies / "img_a.png", "rb") as f:
            r = requests.post(
                f"{base}/infer/{NAME_2D}", params={"output": "image"},
                files={"file": ("img_a.png", f.read()), **params}, timeout=120,
            )  # fmt: skip
        assert r.status_code == 200, r.text
        (tmp_path / "pred.png").write_bytes(r.content)
        mask = np.asarray(Image.open(tmp_path / "pred.png"))
        assert mask.shape == IMAGE_2D_SHAPE and set(np.unique(mask).tolist()) <= {0, 1}
