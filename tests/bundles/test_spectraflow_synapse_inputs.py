"""The ``spectraflow_synapse_segmentation`` bundle stops on bad settings and non-finite CT voxels before any work.

Each run uses tiny raw BTCV-layout volumes (32 x 32 x 6 voxels), a 56 x 56 network input and a 2-block DINOv2
encoder; evaluation and inference load a randomly initialised ``model.pt``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from spectraflow_monai.apps.synapse import synthetic_ct_volume
from tests.bundles.helpers import error_text, parse_config, run_bundle

CONFIGS = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_synapse_segmentation" / "configs"
TRAIN, EVALUATE, INFERENCE = (str(CONFIGS / f"{n}.yaml") for n in ("train", "evaluate", "inference"))
META = str(CONFIGS / "metadata.json")
NET = {"image_size": 56, "encoder_kwargs": {"depth": 2}}
SHAPE = (32, 32, 6)
AFFINE = np.diag([0.8, 0.8, 2.5, 1.0])
pytestmark = pytest.mark.xdist_group("spectraflow_synapse_bundle")


def _raw_case(root: Path, case: int, nan_patch: bool = False) -> str:
    """Write phantom case ``case`` in the raw layout; ``nan_patch`` puts 8 NaN voxels and 1 +inf into the image."""
    image, label = synthetic_ct_volume(case, shape=SHAPE)
    image = image.astype(np.float32)
    if nan_patch:
        image[10:12, 10:12, 2:4] = np.nan
        image[0, 0, 0] = np.inf
    paths = []
    for arr, sub in ((image, "img"), (label, "label")):
        path = root / "RawData" / "Training" / sub / f"{sub}{case:04d}.nii.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        nib.save(nib.Nifti1Image(arr, AFFINE), str(path))
        paths.append(str(path))
    return paths[0]


def _random_model(config, root: Path, **override) -> None:
    net = parse_config(config, bundle_root=str(root), **NET, **override).get_parsed_content("network_def")
    (root / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), root / "models" / "model.pt")


# ---------------------------------------------------------------- settings are checked before any work
@pytest.mark.parametrize("image_size", ["abc", 100])
def test_bad_image_size_stops_before_the_phantom_and_the_cache(tmp_path, image_size):
    root = tmp_path / "bundle"
    for config in (TRAIN, [TRAIN, str(CONFIGS / "train_stage1.yaml")], [TRAIN, EVALUATE], INFERENCE):
        with pytest.raises(Exception) as info:
            run_bundle(config, META, bundle_root=str(root), num_workers=0, progress_bar=False,
                       image_size=image_size, encoder_kwargs={"depth": 2})  # fmt: skip
        text = error_text(info.value)
        assert "SettingError" in text and "image_size must be a positive int multiple of 14" in text, text
        assert f"got {image_size!r}" in text, text
    assert not root.exists() or not any(root.rglob("*")), sorted(root.rglob("*"))  # no phantom, cache, or models


def test_bad_nonfinite_setting_is_named(tmp_path):
    with pytest.raises(Exception) as info:
        run_bundle(TRAIN, META, bundle_root=str(tmp_path), nonfinite="skip", **NET)
    assert "nonfinite must be one of ['error', 'replace'], got 'skip'" in error_text(info.value)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "data").exists()


# ---------------------------------------------------------------- NaN / inf voxels: named, or replaced when asked
def test_training_stops_on_a_volume_with_nan_voxels(tmp_path):
    data = tmp_path / "data"
    bad = _raw_case(data, 5, nan_patch=True)
    _raw_case(data, 6)
    with pytest.raises(Exception) as info:
        run_bundle(TRAIN, META, bundle_root=str(tmp_path / "b"), dataset="btcv", dataset_dir=str(data),
                   train_cases=[5, 6], val_cases=[6], num_workers=0, progress_bar=False, encoder_init="random",
                   **NET)  # fmt: skip
    text = error_text(info.value)
    assert "case 0005" in text and bad in text and "9 non-finite voxel(s) (8 NaN, 1 infinite)" in text, text
    assert not (tmp_path / "b" / "models" / "model.pt").exists()
    assert not list((tmp_path / "b").rglob("case0005_slice*.npz"))


def test_evaluation_names_a_volume_with_nan_voxels_or_replaces_them(tmp_path, caplog):
    data, root = tmp_path / "data", tmp_path / "b"
    bad = _raw_case(data, 1, nan_patch=True)
    common = {"bundle_root": str(root), "dataset": "btcv", "dataset_dir": str(data), "test_cases": [1],
              "num_workers": 0, "progress_bar": False, **NET}  # fmt: skip
    _random_model([TRAIN, EVALUATE], root, dataset="btcv")
    with pytest.raises(Exception) as info:
        run_bundle([TRAIN, EVALUATE], META, **common)
    text = error_text(info.value)
    assert bad in text and "9 non-finite voxel(s) (8 NaN, 1 infinite)" in text, text
    assert not (root / "eval" / "predictions").exists() or not os.listdir(root / "eval" / "predictions")
    with caplog.at_level(logging.WARNING, logger="spectraflow_monai.transforms.finite"):
        run_bundle([TRAIN, EVALUATE], META, nonfinite="replace", **common)
    assert f"{bad!r}: replaced 9 non-finite voxel(s)" in caplog.text and "with -125" in caplog.text, caplog.text
    assert (root / "eval" / "predictions" / "img0001_seg.nii.gz").is_file()


def test_inference_names_a_volume_with_nan_voxels_or_replaces_them(tmp_path, caplog):
    root = tmp_path / "b"
    bad = _raw_case(tmp_path / "data", 2, nan_patch=True)
    _random_model(INFERENCE, root)
    common = {"bundle_root": str(root), "input_dir": os.path.dirname(bad), "output_dir": str(tmp_path / "out"), **NET}
    with pytest.raises(Exception) as info:
        run_bundle(INFERENCE, META, **common)
    text = error_text(info.value)
    assert bad in text and "9 non-finite voxel(s) (8 NaN, 1 infinite)" in text, text
    with caplog.at_level(logging.WARNING, logger="spectraflow_monai.transforms.finite"):
        run_bundle(INFERENCE, META, nonfinite="replace", nonfinite_value=-1000, **common)
    assert f"{bad!r}: replaced 9 non-finite voxel(s)" in caplog.text and "with -1000" in caplog.text, caplog.text
    out = nib.load(str(tmp_path / "out" / "img0002_seg.nii.gz"))
    assert out.shape == SHAPE


def test_a_refused_setting_leaves_its_traceback_in_the_runs_log_folder(tmp_path):
    import subprocess
    import sys

    cmd = [
        sys.executable, "-m", "monai.bundle", "run",
        "--config_file", "['configs/train.yaml']",
        "--bundle_root", str(tmp_path / "run"), "--num_classes", "1", "--class_names", "['background']",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=CONFIGS.parent, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert last.startswith("error: num_classes must be an int >= 2"), last
    log = last.rsplit("(traceback: ", 1)[1].rstrip(")")
    assert os.path.dirname(log) == str(tmp_path / "run" / "logs"), log
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["logs"]  # nothing else made before the check
