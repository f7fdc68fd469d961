"""Runs that record themselves (``spectraflow_monai.utils.run_record``), through the 2D bundle's own configs.

A training run writes ``models/stage2/run_record.json`` (settings, model settings, data fingerprints, label setup,
seed, precision, package version) and ``models/model.json`` beside ``model.pt``; Stage-1 writes
``models/stage1/run_record.json`` and ``models/encoder_stage1.json`` beside its export. A restart that would continue
a run with other settings or data stops before training, naming each difference and the ways forward; evaluation and
inference read the model settings from the record, and a contradicting value given on the command line stops them
naming both values. A Stage-2 setting given to Stage-1 is reported.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import spectraflow_monai
from spectraflow_monai.apps.seg2d import generate_synthetic_dataset
from spectraflow_monai.utils.run_record import RECORD_FORMAT, check_model_digest, file_digest, settings_digest
from spectraflow_monai.utils.settings import IMAGENET_MEAN, IMAGENET_STD, ModelSettings
from tests.bundles.helpers import config_paths, error_text, run_bundle

CONFIGS = config_paths("spectraflow_2d_segmentation")
TRAIN, STAGE1, EVALUATE, INFERENCE, META = (
    CONFIGS[k] for k in ("train", "train_stage1", "evaluate", "inference", "metadata")
)
NET = {"image_size": 28, "encoder_kwargs": {"depth": 2}}
STAGE2 = {"encoder_init": "random", "max_epochs": 1, "batch_size": 2, "val_batch_size": 2}
STAGE1_ARGS = {"stage1_epochs": 1, "stage1_batch_size": 2, "head_hidden_channels": 16, "head_num_blocks": 1}

pytestmark = pytest.mark.xdist_group("spectraflow_run_records")


def _common(root: Path, data_dir: Path, num_train: int = 4) -> dict:
    return {
        "bundle_root": str(root),
        "dataset_dir": str(data_dir),
        "synthetic_size": {"num_train": num_train, "num_val": 2},
        "num_workers": 0,
        "progress_bar": False,
        "pretrained_weights": "none",
        "precision": "fp32",
        **NET,
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("record_data") / "data"
    generate_synthetic_dataset(root, num_train=4, num_val=2)  # what the bundle would generate
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir) -> Path:
    """One Stage-1 and one Stage-2 run (1 epoch each) in one bundle_root."""
    root = tmp_path_factory.mktemp("recorded_run")
    run_bundle([TRAIN, STAGE1], META, **_common(root, data_dir), **STAGE1_ARGS)
    run_bundle(TRAIN, META, **_common(root, data_dir), **STAGE2)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _killed(trained: Path, root: Path) -> Path:
    """A copy of the trained bundle as a run killed after its last checkpoint leaves it: the record without the note
    that the run ended (``record_finished``), which only the end of training writes."""
    shutil.copytree(trained, root)
    path = root / "models" / "stage2" / "run_record.json"
    record = json.loads(path.read_text())
    assert record.pop("finished") == {"epoch": 1, "max_epochs": 1, "stopped_early": False}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return root


def _fails(config, **override) -> str:
    with pytest.raises(Exception) as info:
        run_bundle(config, META, **override)
    return error_text(info.value)


def test_a_run_records_itself(trained):
    record = json.loads((trained / "models" / "stage2" / "run_record.json").read_text())
    assert record["settings"]["learning_rate"] == 0.0001 and record["settings"]["encoder_init"] == "random"
    assert record["model"] == ModelSettings(encoder_kwargs={"depth": 2}, image_size=28).to_dict()  # the object, whole
    assert record["settings"]["data"]["dataset"] == "synthetic" and record["format"] == RECORD_FORMAT
    assert record["data"]["train"]["items"] == 4 and record["data"]["val"]["items"] == 2
    assert len(record["data"]["train"]["sha256"]) == 64
    assert record["seed"] == 0 and record["precision"] == "fp32"
    assert "binary" in record["label_setup"] and record["spectraflow_monai"] == spectraflow_monai.__version__
    assert record["not_compared"]["max_epochs"] == 1
    beside = json.loads((trained / "models" / "model.json").read_text())  # model.pt describes itself
    assert beside["model"] == record["model"] and beside["model_file"] == "model.pt"
    assert beside["model_sha256"] == file_digest(trained / "models" / "model.pt")  # the record is of this model.pt
    assert beside["settings_sha256"] == settings_digest(beside["model"])
    stage1 = json.loads((trained / "models" / "stage1" / "run_record.json").read_text())
    assert stage1["not_compared"]["stage1_epochs"] == 1 and stage1["data"]["train"]["items"] == 4
    export = json.loads((trained / "models" / "encoder_stage1.json").read_text())
    encoder = {"encoder_name": "vit_small_patch14_dinov2", "encoder_kwargs": {"depth": 2}, "image_size": 28,
               "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD)}  # fmt: skip
    assert export["model"] == encoder


def test_a_restart_with_other_settings_stops_before_training(trained, data_dir, tmp_path):
    killed = _killed(trained, tmp_path / "killed")
    model = (killed / "models" / "model.pt").read_bytes()
    record = (killed / "models" / "stage2" / "run_record.json").read_text()
    text = _fails(TRAIN, **{**_common(killed, data_dir), **STAGE2, "learning_rate": 0.001, "image_size": 42})
    assert "learning_rate: recorded 0.0001, now 0.001" in text
    assert "model.image_size: recorded 28, now 42" in text
    assert "Nothing was trained" in text and "--run_settings#resume false" in text and "--bundle_root" in text
    assert "size mismatch" not in text
    assert (killed / "models" / "model.pt").read_bytes() == model  # nothing changed
    assert (killed / "models" / "stage2" / "run_record.json").read_text() == record


def test_a_stage1_restart_with_another_objective_stops(trained, data_dir):
    """The Stage-1 objective's settings are part of the Stage-1 record (eq. 3's adaptive weight, the epoch views)."""
    text = _fails(
        [TRAIN, STAGE1], **_common(trained, data_dir), **STAGE1_ARGS, meanflow_adaptive_p=0.0, stage1_views="both"
    )
    assert "meanflow_adaptive_p: recorded 1.0, now 0.0" in text and "settings.stage1_views: recorded 'either', now 'both'" in text
    assert "Nothing was trained" in text


def test_a_restart_on_other_data_stops(trained, tmp_path):
    other = tmp_path / "other"
    generate_synthetic_dataset(other, num_train=6, num_val=2)
    text = _fails(TRAIN, **_common(_killed(trained, tmp_path / "killed"), other, num_train=6), **STAGE2)
    assert "data.train.items: recorded 4, now 6" in text and "data.train.sha256" in text


@pytest.mark.parametrize("change", [{}, {"learning_rate": 0.001}, {"synthetic_size": {"num_train": 6, "num_val": 2}}])
def test_a_finished_run_started_again_trains_a_new_run(trained, tmp_path, change, caplog):
    """A finished run has nothing to continue at its max_epochs (MONAI Label's repeated ``/train``, possibly on more
    labels): a new run trains, the finished one kept aside; never a start that trains nothing."""
    root = tmp_path / "again"
    shutil.copytree(trained, root)
    data = tmp_path / "data"  # the synthetic preset generates what synthetic_size asks for
    caplog.set_level(logging.WARNING)
    run_bundle(TRAIN, META, **{**_common(root, data), **STAGE2, **change})
    assert "holds a finished run" in caplog.text and "resuming from" not in caplog.text
    record = json.loads((root / "models" / "stage2" / "run_record.json").read_text())
    assert record["finished"] == {"epoch": 1, "max_epochs": 1, "stopped_early": False}  # trained, and ended again
    assert record["settings"]["learning_rate"] == change.get("learning_rate", 0.0001)
    (aside,) = (root / "models").glob("stage2.bak-*")
    assert json.loads((aside / "run_record.json").read_text())["settings"]["learning_rate"] == 0.0001
    assert len(list((root / "models").glob("model.pt.bak-*"))) == 1  # the served model, copied aside


def test_evaluation_and_inference_read_the_record(trained, data_dir, tmp_path):
    plain = {"bundle_root": str(trained), "dataset_dir": str(data_dir), "num_workers": 0, "precision": "fp32",
             "synthetic_size": {"num_train": 4, "num_val": 2}}  # fmt: skip
    # no model setting given: image_size 28 and the 2-block encoder come from models/model.json
    run_bundle([TRAIN, EVALUATE], META, **plain, output_dir=str(tmp_path / "eval"))
    assert (tmp_path / "eval" / "summary.json").is_file()
    run_bundle(INFERENCE, META, bundle_root=str(trained), input_dir=str(data_dir / "images"),
               output_dir=str(tmp_path / "pred"))  # fmt: skip
    assert len(list((tmp_path / "pred").glob("*_seg.png"))) == 6
    # a given model setting that contradicts the record: both values named, before any network is built
    text = _fails([TRAIN, EVALUATE], **plain, output_dir=str(tmp_path / "e2"), image_size=56)
    assert "image_size: 28 in the record, 56 given" in text
    text = _fails(INFERENCE, bundle_root=str(trained), input_dir=str(data_dir / "images"), encoder_kwargs={"depth": 3})
    assert "encoder_kwargs.depth: 2 in the record, 3 given" in text


def test_stage2_names_an_export_of_other_settings(trained, data_dir, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(trained / "models", root / "models", ignore=shutil.ignore_patterns("stage2", "model.*"))
    settings = {**_common(root, data_dir), **STAGE2, "encoder_init": "stage1", "image_size": 42}
    text = _fails(TRAIN, **settings)
    assert "the Stage-1 export" in text and "image_size: 28 in the record, 42 given" in text
    assert "--stage2_settings#encoder_init pretrained" in text and "size mismatch" not in text


def test_starting_over_keeps_the_earlier_run_aside(trained, data_dir, tmp_path):
    """A new run keeps the earlier run aside; the exports of the earlier model.pt go aside when the new model.pt
    replaces it (no stale model.onnx beside the new model), and the new model.json is the new model.pt's."""
    root = tmp_path / "again"
    shutil.copytree(trained, root)
    for name in ("model.onnx", "model_int8.onnx"):  # exports of the earlier model (their content is not read here)
        (root / "models" / name).write_bytes(b"an export of the earlier model.pt")
    run_bundle(TRAIN, META, **{**_common(root, data_dir), **STAGE2, "learning_rate": 0.001, "resume": False})
    record = json.loads((root / "models" / "stage2" / "run_record.json").read_text())
    assert record["settings"]["learning_rate"] == 0.001
    names = {p.name.split(".bak-")[0] for p in (root / "models").glob("*.bak-*")}
    assert {"stage2", "model.pt", "model.json"} <= names  # the earlier checkpoints with their record, the model
    assert {"model.onnx", "model_int8.onnx"} <= names and not list((root / "models").glob("*.onnx"))
    check_model_digest(root / "models" / "model.pt")
    (aside,) = (root / "models").glob("stage2.bak-*")
    assert json.loads((aside / "run_record.json").read_text())["settings"]["learning_rate"] == 0.0001


def test_a_restart_of_the_same_run_continues(trained, data_dir, caplog):
    caplog.set_level(logging.WARNING)
    run_bundle(TRAIN, META, **{**_common(trained, data_dir), **STAGE2, "max_epochs": 2})  # max_epochs may change
    assert "resuming from" in caplog.text


