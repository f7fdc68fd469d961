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
from spectraflow_monai.utils.errors import error_summary
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


@pytest.mark.parametrize("configs", [[TRAIN, EVALUATE], [INFERENCE]])
@pytest.mark.parametrize("value", [0, "4"])
def test_bad_sw_batch_size_is_named_before_any_work(tmp_path, configs, value):
    with pytest.raises(Exception) as info:
        run_bundle(configs, META, bundle_root=str(tmp_path), sw_batch_size=value, **NET)
    line = error_summary(info.value)
    named = f"sw_batch_size must be a positive int (slices per network call), got {value!r}"
    assert line.startswith("error: ") and named in line, line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("configs", [[TRAIN, EVALUATE], [INFERENCE]])
def test_an_edited_model_record_ends_in_one_line(tmp_path, configs):
    """A model.json whose label map was edited after training wrote it (organs 1 and 5 swapped: wrong label values
    written without a word otherwise) is refused before any volume is read, naming the record and the fix."""
    import json

    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    _random_model(INFERENCE, tmp_path)
    model, record = tmp_path / "models" / "model.pt", tmp_path / "models" / "model.json"
    label_map = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8}
    write_model_settings(model, ModelSettings(**NET, num_classes=9, out_channels=9, label_map=label_map))
    content = json.loads(record.read_text())
    content["model"]["label_map"].update({"1": 5, "5": 1})
    record.write_text(json.dumps(content, indent=2))
    with pytest.raises(Exception) as info:
        run_bundle(configs, META, bundle_root=str(tmp_path), num_workers=0, progress_bar=False,
                   input_dir=str(tmp_path / "none"), output_dir=str(tmp_path / "out"))  # fmt: skip
    line = error_summary(info.value)
    assert line.startswith(f"error: {record} was edited after it was written") and "re-train" in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


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
        "--bundle_root", str(tmp_path / "run"), "--model_settings#num_classes", "1", "--model_settings#class_names", "['background']",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=CONFIGS.parent, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert last.startswith("error: num_classes must be an int >= 2"), last
    log = last.rsplit("(traceback: ", 1)[1].rstrip(")")
    assert os.path.dirname(log) == str(tmp_path / "run" / "logs"), log
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["logs"]  # nothing else made before the check


# ---------------------------------------------------------------- nothing lost, one line per fault
def _bundle_cli(configs: list[str], override: dict, cwd: Path) -> tuple[int, str, str]:
    """``python -m monai.bundle run`` in a subprocess (CPU, one thread): (exit status, stdout, stderr)."""
    import subprocess
    import sys

    from spectraflow_monai.utils.bundles import merged_config, settings_overrides
    from tests.bundles.helpers import bundle_args

    override = settings_overrides(merged_config([os.path.join(cwd, c) for c in configs]), override)  # at their ids
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", repr(configs), *bundle_args(override)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("SPECTRAFLOW_TRACEBACK", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _assert_one_error_line(rc: int, out: str, err: str, log_dir: Path, *names: str) -> str:
    """The run failed, printed no traceback, and its last line is ``error: ...`` naming ``names`` and a traceback
    file in ``log_dir``; returns that line."""
    last = err.strip().splitlines()[-1]
    assert rc != 0 and "Traceback" not in out + err, (out + err)[-3000:]
    assert last.startswith("error: ") and all(n in last for n in names), last
    log = last.rsplit("(traceback: ", 1)[1].rstrip(")")
    assert os.path.dirname(log) == str(log_dir) and "Traceback" in Path(log).read_text(), log
    return last


def test_inference_segments_every_volume_after_a_bad_one_and_lists_the_bad_ones(tmp_path):
    root, in_dir = tmp_path / "b", tmp_path / "ct"
    nan = _raw_case(tmp_path / "data", 1, nan_patch=True)
    in_dir.mkdir()
    os.replace(nan, in_dir / "a.nii.gz")
    nib.save(nib.Nifti1Image(np.zeros(SHAPE[:2], np.float32), AFFINE), str(in_dir / "b.nii.gz"))  # 2D
    for name, case in (("c", 2), ("d", 3)):
        os.replace(_raw_case(tmp_path / "data", case), in_dir / f"{name}.nii.gz")
    _random_model(INFERENCE, root)
    with pytest.raises(Exception) as info:
        run_bundle(INFERENCE, META, bundle_root=str(root), input_dir=str(in_dir), output_dir=str(tmp_path / "out"),
                   **NET)  # fmt: skip
    line = error_summary(info.value)
    assert line.startswith("error: 2 of 4 input volume(s) could not be read; the outputs of the other 2"), line
    assert str(in_dir / "a.nii.gz") in line and "NaN" in line and str(in_dir / "b.nii.gz") in line and "2D" in line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["c_seg.nii.gz", "d_seg.nii.gz"]


@pytest.mark.parametrize("config", ["evaluate", "inference"])
def test_a_model_file_that_is_not_weights_ends_in_one_line_naming_it(tmp_path, config):
    root = tmp_path / "b"
    (root / "models").mkdir(parents=True)
    model = root / "models" / "model.pt"
    model.write_text("<html>not a model</html>")
    _raw_case(tmp_path / "data", 1)
    configs = ["configs/train.yaml", "configs/evaluate.yaml"] if config == "evaluate" else ["configs/inference.yaml"]
    override = {"bundle_root": str(root), "dataset": "btcv", "dataset_dir": str(tmp_path / "data"), "test_cases": [1],
                "input_dir": str(tmp_path / "data" / "RawData" / "Training" / "img"), **NET}  # fmt: skip
    rc, out, err = _bundle_cli(configs, override, CONFIGS.parent)
    last = _assert_one_error_line(rc, out, err, root / "logs", str(model), "not a weights file")
    assert "configs/train.yaml" in last, last


@pytest.mark.parametrize("num_workers", [0, 2])  # 2: the error comes back from a DataLoader worker, as text
def test_evaluation_of_a_volume_with_nan_voxels_ends_in_one_line_naming_it(tmp_path, num_workers):
    data, root = tmp_path / "data", tmp_path / "b"
    bad = _raw_case(data, 1, nan_patch=True)
    _random_model([TRAIN, EVALUATE], root, dataset="btcv")
    override = {"bundle_root": str(root), "dataset": "btcv", "dataset_dir": str(data), "test_cases": [1],
                "num_workers": num_workers, "progress_bar": False, **NET}  # fmt: skip
    rc, out, err = _bundle_cli(["configs/train.yaml", "configs/evaluate.yaml"], override, CONFIGS.parent)
    _assert_one_error_line(rc, out, err, root / "logs", bad, "non-finite voxel(s)")
    assert len((out + err).splitlines()) < 40, out + err


def test_a_broken_test_volume_is_named_before_training(tmp_path, caplog):
    """TransUNet test volumes: one h5 file with other dataset names, one fine; train.yaml's check_test_volumes
    names the broken one (a warning: training does not read it) before any training."""
    import h5py

    folder = tmp_path / "tu" / "test_vol_h5"
    folder.mkdir(parents=True)
    with h5py.File(folder / "case0001.npy.h5", "w") as f:
        f["image"], f["label"] = np.zeros((4, 8, 8), np.float32), np.zeros((4, 8, 8), np.uint8)
    with h5py.File(folder / "case0002.npy.h5", "w") as f:
        f["img"], f["seg"] = np.zeros((4, 8, 8), np.float32), np.zeros((4, 8, 8), np.uint8)
    parser = parse_config(TRAIN, bundle_root=str(tmp_path / "b"), dataset="transunet", dataset_dir=str(tmp_path / "tu"),
                          test_cases=[1, 2], **NET)  # fmt: skip
    run = [str(step) for step in parser["run"]]
    assert run.index("@check_test_volumes") < run.index("@train#run"), run
    with caplog.at_level(logging.WARNING, logger="spectraflow_monai.apps.synapse.source"):
        problems = parser.get_parsed_content("check_test_volumes")
    bad = str(folder / "case0002.npy.h5")
    assert len(problems) == 1 and bad in problems[0] and "lacks dataset(s) ['image', 'label']" in problems[0]
    assert f"the test volumes (configs/evaluate.yaml) will not evaluate: TransUNet volume {bad!r}" in caplog.text
    assert not (tmp_path / "b").exists()  # headers only: nothing written
