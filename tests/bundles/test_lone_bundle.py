"""A bundle folder copied out on its own runs the model-zoo way, from that folder: ``configs/train.yaml`` alone trains
Stage-2, Stage-1 and evaluation layer one file after it, and a list that cannot run ends in one line naming the
commands that work. A model trained with its own normalisation is evaluated and served with it."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from monai.transforms import NormalizeIntensityd

from spectraflow_monai.utils.bundles import bundle_path, merged_config, settings_overrides
from tests.bundles.helpers import bundle_args, parse_config

TWO_D, SYNAPSE = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"
TINY = {
    TWO_D: {"synthetic_size": {"num_train": 4, "num_val": 2}, "batch_size": 2, "val_batch_size": 2},
    SYNAPSE: {
        "synthetic_size": {"cases": [5, 6, 7, 1, 2], "shape": [40, 40, 6]}, "val_cases": [7], "batch_size": 4,
        "val_batch_size": 4,
    },
}  # fmt: skip
COMMON = {
    "image_size": 28, "encoder_kwargs": {"depth": 2}, "num_workers": 0, "progress_bar": False,
    "pretrained_weights": "none", "precision": "fp32", "stage1_batch_size": 2, "head_hidden_channels": 16,
    "head_num_blocks": 1,
}  # fmt: skip
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]


def _lone_copy(bundle: str, tmp_path: Path) -> Path:
    """The bundle folder alone, copied as a user copies it (no other folder of the repository beside it)."""
    target = tmp_path / "somewhere" / bundle
    shutil.copytree(bundle_path(bundle), target, symlinks=True)
    return target


def _run(folder: Path, configs: str, **override) -> subprocess.CompletedProcess:
    files = [folder / f for f in (ast.literal_eval(configs) if configs.startswith("[") else [configs])]
    if all(f.is_file() for f in files):  # each setting at its id (the settings objects' values)
        override = settings_overrides(merged_config(files), override)
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", configs, *bundle_args(override)]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_a_lone_bundle_folder_trains_both_stages_and_evaluates(bundle, tmp_path):
    folder = _lone_copy(bundle, tmp_path)
    assert not [p for p in folder.rglob("*") if p.is_symlink()]
    settings = {**COMMON, **TINY[bundle], "image_mean": MEAN, "image_std": STD}
    _ok(_run(folder, "['configs/train.yaml','configs/train_stage1.yaml']", stage1_epochs=1, **settings))
    assert (folder / "models" / "encoder_stage1.pt").is_file()
    _ok(_run(folder, "configs/train.yaml", max_epochs=1, **settings))  # Stage-2: train.yaml alone
    record = json.loads((folder / "models" / "model.json").read_text())["model"]
    assert (record["image_mean"], record["image_std"]) == (MEAN, STD)
    # evaluation gives data and output only: the normalisation (and every model setting) comes from the record
    data = {k: v for k, v in settings.items() if k not in ("image_mean", "image_std", "image_size", "encoder_kwargs")}
    _ok(_run(folder, "['configs/train.yaml','configs/evaluate.yaml']", **data))
    assert list((folder / "eval").glob("*summary*"))


@pytest.mark.parametrize(
    "configs",
    [
        "['configs/train_stage1.yaml','configs/train.yaml']",
        "configs/train_stage1.yaml",
        "configs/evaluate.yaml",
        "['configs/train.yaml','configs/multi_gpu_train.yaml','configs/train_stage1.yaml']",
    ],
)
def test_a_config_list_that_cannot_run_ends_in_one_line(configs, tmp_path):
    proc = _run(bundle_path(TWO_D), configs, bundle_root=str(tmp_path))
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("error: ") and "the runs are:" in lines[-1], lines[-1]
    assert "['configs/train.yaml','configs/train_stage1.yaml']" in lines[-1]
    assert not (tmp_path / "models").exists()  # nothing ran


def _normalize(transforms) -> NormalizeIntensityd:
    (norm,) = [t for t in getattr(transforms, "transforms", transforms) if isinstance(t, NormalizeIntensityd)]
    return norm


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_evaluation_and_inference_normalise_as_the_model_was_trained(bundle, tmp_path):
    """The record beside model.pt carries image_mean / image_std; evaluation and inference read them back (a value
    given on the command line that contradicts it is refused)."""
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    (tmp_path / "models").mkdir()
    torch.save({}, tmp_path / "models" / "model.pt")
    out = 1 if bundle == TWO_D else 9
    write_model_settings(
        tmp_path / "models" / "model.pt",
        ModelSettings(image_size=28, encoder_kwargs={"depth": 2}, image_mean=MEAN, image_std=STD, out_channels=out,
                      num_classes=None if bundle == TWO_D else 9,
                      **({} if bundle == TWO_D else {"hu_window": [-125.0, 275.0], "nonfinite": "error"})),
    )  # fmt: skip
    configs = bundle_path(bundle) / "configs"
    evaluation = parse_config([str(configs / "train.yaml"), str(configs / "evaluate.yaml")], bundle_root=str(tmp_path))
    inference = parse_config(str(configs / "inference.yaml"), bundle_root=str(tmp_path))
    for parser, key in ((evaluation, "evaluate#preprocessing"), (inference, "preprocessing")):
        transforms = parser.get_parsed_content(key)
        if bundle == SYNAPSE and key == "evaluate#preprocessing":
            transforms = parser.get_parsed_content("volume_transforms")
        norm = _normalize(transforms).normalizer
        assert torch.allclose(torch.as_tensor(norm.subtrahend, dtype=torch.float), torch.tensor(MEAN))
        assert torch.allclose(torch.as_tensor(norm.divisor, dtype=torch.float), torch.tensor(STD))


def _window(transforms):
    from spectraflow_monai.apps.synapse import CTWindowd

    (window,) = [t for t in getattr(transforms, "transforms", transforms) if isinstance(t, CTWindowd)]
    return window


def test_a_synapse_model_is_served_with_its_window_and_label_map(tmp_path):
    """A model trained with its own HU window and label map records both in models/model.json; inference.yaml
    alone windows as in training and writes the source label values (0, 1, 6), not the class indices."""
    import nibabel as nib
    import numpy as np

    from spectraflow_monai.apps.synapse import prediction_values

    folder = _lone_copy(SYNAPSE, tmp_path)
    window, label_map = [-200.0, 300.0], {0: 0, 1: 1, 6: 2}
    settings = {
        **COMMON, **TINY[SYNAPSE], "encoder_init": "random", "max_epochs": 3, "num_classes": 3,
        "hu_window": window, "label_map": label_map, "unmapped_labels": "background",
    }  # fmt: skip
    _ok(_run(folder, "configs/train.yaml", **settings))
    record = json.loads((folder / "models" / "model.json").read_text())["model"]
    assert record["hu_window"] == window and record["label_map"] == {"0": 0, "1": 1, "6": 2}
    assert record["class_names"] == ["background", "class_1", "class_2"] and record["nonfinite"] == "error"
    parser = parse_config(str(folder / "configs" / "inference.yaml"), bundle_root=str(folder))
    window_transform = _window(parser.get_parsed_content("preprocessing"))
    assert (window_transform.scaler.a_min, window_transform.scaler.a_max) == (-200.0, 300.0)
    recorded = parser.get_parsed_content("pipeline").settings  # the record, read as one object
    assert parser["model_settings"] == {} and recorded.label_map == label_map  # nothing given: the record's
    assert prediction_values(recorded.label_map, None, 3) == [0, 1, 6]
    _ok(_run(folder, "configs/inference.yaml", num_workers=0))  # told nothing but where the model is
    written = sorted((folder / "predictions").glob("*_seg.nii.gz"))
    values = {int(v) for path in written for v in np.unique(np.asarray(nib.load(str(path)).dataobj))}
    assert written and values == {0, 1, 6}, values  # the source values of the 3 classes (3 epochs find all)
    # a window given that contradicts the record is refused in one line naming both
    proc = _run(folder, "configs/inference.yaml", hu_window=[-125.0, 275.0])
    assert proc.returncode != 0 and "hu_window: [-200.0, 300.0] in the record, [-125.0, 275.0] given" in proc.stderr


def test_the_unetpp_baseline_trains_at_64_px_and_inference_alone_serves_it(tmp_path):
    """U-Net++ takes 64 px (a multiple of 16, not of 14); models/model.json names the architecture and its
    arguments, and inference.yaml alone rebuilds that network."""
    folder = _lone_copy(TWO_D, tmp_path)
    settings = {
        **COMMON, **TINY[TWO_D], "image_size": 64, "max_epochs": 1, "network_kwargs#features": [4, 4, 8, 8, 16, 4],
    }  # fmt: skip
    _ok(_run(folder, "['configs/train.yaml','configs/unetpp_baseline.yaml']", **settings))
    record = json.loads((folder / "models" / "model.json").read_text())["model"]
    assert (record["architecture"], record["image_size"], record["encoder_name"]) == ("unetpp", 64, None)
    assert record["network_kwargs"]["features"] == [4, 4, 8, 8, 16, 4] and record["network_kwargs"]["norm"] == "batch"
    _ok(_run(folder, "configs/inference.yaml"))
    assert sorted((folder / "predictions").glob("*.png"))
    # evaluation rebuilds the recorded network whatever configs come before it
    _ok(_run(folder, "['configs/train.yaml','configs/evaluate.yaml']", **TINY[TWO_D], num_workers=0))
