"""Bad inputs to the ``spectraflow_2d_segmentation`` bundle: the run stops (or, for inference, skips the bad files)
with a message naming the file or setting, and ``python -m monai.bundle run`` ends its output with one line
``error: <file>: <problem>``. Tiny inputs, no training: every case fails in the checks before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from spectraflow_monai.utils.errors import DataError, SettingError, error_summary, find_input_error
from tests.bundles.helpers import parse_config, run_bundle

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "bundles" / "spectraflow_2d_segmentation"
CONFIGS = BUNDLE / "configs"
TRAIN, EVALUATE, INFERENCE = (str(CONFIGS / f"{n}.yaml") for n in ("train", "evaluate", "inference"))
STAGE1 = str(CONFIGS / "train_stage1.yaml")
META = str(CONFIGS / "metadata.json")
NET = {"image_size": 56, "encoder_kwargs": {"depth": 2}}


def _tiny_kvasir(root: Path) -> Path:
    """A Kvasir-SEG layout with two images and one mask: ``b.jpg`` has no mask."""
    base = root / "Kvasir-SEG"
    (base / "images").mkdir(parents=True)
    (base / "masks").mkdir()
    (root / "splits").mkdir()
    for name in ("a", "b"):
        Image.fromarray(np.zeros((28, 28, 3), dtype=np.uint8)).save(base / "images" / f"{name}.jpg")
    Image.fromarray(np.zeros((28, 28), dtype=np.uint8)).save(base / "masks" / "a.jpg")
    (root / "splits" / "train.txt").write_text("a\nb\n")
    (root / "splits" / "val.txt").write_text("a\n")
    return base


def test_last_output_line_names_the_file_and_the_problem(tmp_path):
    base = _tiny_kvasir(tmp_path / "kvasir")
    cmd = [
        sys.executable, "-m", "monai.bundle", "run",
        "--config_file", "['configs/train.yaml']",
        "--bundle_root", str(tmp_path / "b"), "--data_settings#dataset", "kvasir",
        "--dataset_dir", str(tmp_path / "kvasir"), "--model_settings#image_size", "28",
        "--model_settings#encoder_kwargs", "{'depth': 2}", "--run_settings#num_workers", "0",
        "--stage2_settings#encoder_init", "pretrained",
        "--stage2_settings#pretrained_weights", "none",  # no Stage-1 export, no hub here
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=BUNDLE, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr  # a user's mistake: no traceback on screen ...
    last = lines[-1]
    assert last.startswith("error: ") and str(base / "images" / "b.jpg") in last and "without a mask" in last, last
    log = last.rsplit("(traceback: ", 1)[1].rstrip(")")  # ... it is in the log file the line names, in the run's
    assert os.path.dirname(log) == str(tmp_path / "b" / "logs"), log  # log folder
    with open(log) as f:
        assert "Traceback" in f.read()
    assert not (tmp_path / "b" / "models" / "model.pt").exists()


@pytest.mark.parametrize("configs", [[TRAIN], [TRAIN, STAGE1], [TRAIN, EVALUATE], [INFERENCE]])
@pytest.mark.parametrize("value", ["abc", 100])
def test_image_size_checked_before_any_work(tmp_path, configs, value):
    with pytest.raises(Exception) as info:
        run_bundle(configs, META, bundle_root=str(tmp_path), image_size=value, encoder_kwargs={"depth": 2})
    error = find_input_error(info.value)
    assert isinstance(error, SettingError) and isinstance(error, ValueError), info.value
    assert "image_size" in str(error) and repr(value) in str(error) and "multiple of 14" in str(error)
    assert list(tmp_path.iterdir()) == []  # no data generated, no folder made


def test_inference_skips_unreadable_inputs_and_lists_them(tmp_path):
    torch.manual_seed(0)
    net = parse_config(INFERENCE, bundle_root=str(tmp_path), **NET).get_parsed_content("network_def")
    (tmp_path / "models").mkdir()
    torch.save(net.state_dict(), tmp_path / "models" / "model.pt")
    in_dir, out_dir = tmp_path / "images", tmp_path / "predictions"
    in_dir.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.bmp", "d.png"):
        Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(in_dir / name)
    truncated = in_dir / "b.bmp"
    truncated.write_bytes(truncated.read_bytes()[:-200])  # header intact: only decoding notices
    nan = np.full((30, 40), 100.0, dtype=np.float32)
    nan[3, 4] = np.nan
    Image.fromarray(nan).save(in_dir / "c.tiff")
    with pytest.raises(Exception) as info:
        run_bundle(INFERENCE, META, bundle_root=str(tmp_path), input_dir=str(in_dir), output_dir=str(out_dir), **NET)
    error = find_input_error(info.value)
    assert isinstance(error, DataError), info.value
    line = error_summary(info.value)
    assert "2 of 4 input image(s) could not be read" in line, line
    assert str(truncated) in line and "truncated" in line and str(in_dir / "c.tiff") in line and "NaN" in line
    assert sorted(p.name for p in out_dir.iterdir()) == ["a_seg.png", "d_seg.png"]  # the others were segmented


@pytest.mark.parametrize("allow", [False, True])
def test_all_background_training_masks_are_reported_before_training(tmp_path, caplog, allow):
    """Masks that are all background: the training datalist stops the run naming allow_empty_masks (or, allowed,
    warns); nothing is trained on them silently."""
    root = tmp_path / "own"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(4):
        Image.fromarray(np.full((28, 28, 3), 40 * i, dtype=np.uint8)).save(root / "images" / f"c{i}.png")
        Image.fromarray(np.zeros((28, 28), dtype=np.uint8)).save(root / "masks" / f"c{i}.png")
    parser = parse_config(TRAIN, bundle_root=str(tmp_path / "b"), dataset="folder", dataset_dir=str(root),
                          allow_empty_masks=allow, **NET)  # fmt: skip
    if allow:
        assert len(parser.get_parsed_content("train#datalist")) > 0
        assert "allow_empty_masks" in caplog.text or "background" in caplog.text
    else:
        with pytest.raises(Exception) as info:
            parser.get_parsed_content("train#datalist")
        assert "allow_empty_masks" in error_summary(info.value)


def _model_files(root: Path, **record) -> Path:
    """A random ``models/model.pt`` of the NET network with its model.json written after it (its digest), with
    ``record`` replacing model settings in the record (a record that contradicts the weights)."""
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    torch.manual_seed(0)
    net = parse_config(INFERENCE, bundle_root=str(root), **NET).get_parsed_content("network_def")
    model = root / "models" / "model.pt"
    model.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), model)
    write_model_settings(model, ModelSettings(**{**NET, **record}))
    return model


@pytest.mark.parametrize(
    "override, named",
    [
        ({"score_at_original_size": "maybe"}, "score_at_original_size must be true or false, got 'maybe'"),
        ({"corruption": "fog"}, "corruption must be null or one of ['brightness', 'contrast', 'gaussian_blur', "
                                "'gaussian_noise'], got 'fog'"),
        ({"corruption": "contrast", "corruption_severity": 9}, "corruption_severity must be an int from 0 to 5, got 9"),
        ({"corruption_severity": "high"}, "corruption_severity must be an int from 0 to 5, got 'high'"),
    ],
)  # fmt: skip
def test_bad_evaluation_settings_end_in_one_line_naming_them(tmp_path, override, named):
    _model_files(tmp_path)
    with pytest.raises(Exception) as info:
        run_bundle([TRAIN, EVALUATE], META, bundle_root=str(tmp_path), num_workers=0, progress_bar=False,
                   synthetic_size={"num_train": 2, "num_val": 2}, output_dir=str(tmp_path / "eval"),
                   **override)  # fmt: skip
    assert isinstance(find_input_error(info.value), SettingError), info.value
    line = error_summary(info.value)
    assert "\n" not in line and named in line, line
    assert not (tmp_path / "eval" / "summary.json").exists()


@pytest.mark.parametrize("configs", [[TRAIN, EVALUATE], [INFERENCE]])
def test_a_record_that_contradicts_the_weights_ends_in_one_line(tmp_path, configs):
    """A model.json (with the model.pt's digest) that names another network than the weights: PyTorch's
    ``Error(s) in loading state_dict`` becomes one line naming the model file, the record and the fix."""
    model = _model_files(tmp_path, encoder_kwargs={"depth": 3})
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((30, 40, 3), dtype=np.uint8)).save(images / "a.png")
    with pytest.raises(Exception) as info:
        run_bundle(configs, META, bundle_root=str(tmp_path), num_workers=0, progress_bar=False, input_dir=str(images),
                   synthetic_size={"num_train": 2, "num_val": 2}, output_dir=str(tmp_path / "out"))  # fmt: skip
    assert isinstance(find_input_error(info.value), SettingError), info.value
    line = error_summary(info.value)
    assert "\n" not in line and f"{model}: its weights do not fit the network its record" in line, line
    assert str(tmp_path / "models" / "model.json") in line and "Missing key(s)" in line and "re-train" in line


def test_a_record_that_contradicts_the_weights_prints_no_traceback(tmp_path):
    """On the terminal: no traceback (it is in the run's log folder), the last line names the model and its record."""
    model = _model_files(tmp_path / "b", encoder_kwargs={"depth": 3})
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((30, 40, 3), dtype=np.uint8)).save(images / "a.png")
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", "['configs/inference.yaml']",
           "--bundle_root", str(tmp_path / "b"), "--inference_settings#input_dir", str(images)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("SPECTRAFLOW_TRACEBACK", None)
    proc = subprocess.run(cmd, cwd=BUNDLE, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {model}: its weights do not fit the network its record") and "re-train" in last
    assert "Error(s) in loading state_dict" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("configs", [[TRAIN, EVALUATE], [INFERENCE]])
def test_a_record_of_another_model_ends_in_one_line(tmp_path, configs):
    """A model.pt trained again (or copied over) beside the model.json of the earlier one: refused before any input
    is read, naming both files and the fix."""
    model = _model_files(tmp_path)
    state = torch.load(model, weights_only=True)
    torch.save({k: v + 1 if v.is_floating_point() else v for k, v in state.items()}, model)  # another model.pt
    with pytest.raises(Exception) as info:
        run_bundle(configs, META, bundle_root=str(tmp_path), num_workers=0, progress_bar=False,
                   input_dir=str(tmp_path / "none"), output_dir=str(tmp_path / "out"))  # fmt: skip
    assert isinstance(find_input_error(info.value), SettingError), info.value
    line = error_summary(info.value)
    record = tmp_path / "models" / "model.json"
    assert "\n" not in line and f"{model}: {record} was written for another model.pt" in line, line
    assert "put the model.json its training wrote beside it, or re-train" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()
