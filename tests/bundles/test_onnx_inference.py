"""Bundle inference through onnxruntime: ``spectraflow export-onnx`` writes ``models/model.onnx`` beside
``models/model.pt`` (and its ``model.json``), and ``['configs/inference.yaml','configs/inference_onnx.yaml']`` run in
a lone copy of the bundle writes the masks the PyTorch inference writes (at fp32), without reading ``model.pt``'s
weights. A model.onnx that is missing, truncated or not of the model beside it (a model trained again) ends the run in
one error line naming the export command. Skipped where the ``onnx`` extra is not installed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from spectraflow_monai.utils.bundles import bundle_path
from spectraflow_monai.utils.errors import DataError, SettingError, error_summary, find_input_error
from tests.bundles.helpers import run_bundle

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

TWO_D, SYNAPSE = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"
#: a tiny model of every registered architecture (the 2D bundle trains each: train.yaml, configs/*_baseline.yaml)
TINY = {
    "spectraflow": {"image_size": 28, "encoder_kwargs": {"depth": 2}},
    "unet": {"image_size": 32, "network_kwargs": {"channels": [4, 8, 16], "strides": [2, 2], "num_res_units": 1,
                                                  "norm": "batch"}},
    "unetpp": {"image_size": 32, "network_kwargs": {"features": [4, 4, 8, 8, 8, 4], "deep_supervision": True}},
}  # fmt: skip


def _lone_copy(bundle: str, tmp_path: Path) -> Path:
    target = tmp_path / "somewhere" / bundle
    shutil.copytree(bundle_path(bundle), target, symlinks=True)
    return target


def _write_model(
    folder: Path, out_channels: int, num_classes: int | None, seed: int = 0, architecture: str = "spectraflow"
) -> Path:
    """models/model.pt (a state dict, as training saves it) with model.json beside it, written after it (its digest):
    a tiny network of ``architecture`` (:data:`TINY`; SpectraFlow: 28 px, 2 blocks) whose decoder (a baseline: every
    weight) is moved away from its initialisation, so that the masks depend on every part of it."""
    from spectraflow_monai.apps.workflow import recorded_network
    from spectraflow_monai.utils.run_record import ModelRecord, write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    model = folder / "models" / "model.pt"
    model.parent.mkdir(parents=True, exist_ok=True)
    # a Synapse model carries its CT preprocessing, as its training records it
    ct = {} if num_classes is None else {"hu_window": [-125.0, 275.0], "nonfinite": "error"}
    settings = ModelSettings(architecture=architecture, **TINY[architecture], out_channels=out_channels,
                             num_classes=num_classes, image_mean=[0.5, 0.4, 0.3], image_std=[0.25, 0.2, 0.3],
                             **ct)  # fmt: skip
    torch.manual_seed(seed)
    network = recorded_network(ModelRecord(model, defaults=settings.to_dict()), out_channels)
    with torch.no_grad():
        moved, scale = (network.decoder, 0.05) if architecture == "spectraflow" else (network, 0.3)
        for p in moved.parameters():
            p.add_(scale * torch.randn_like(p))
    torch.save(network.state_dict(), model)
    write_model_settings(model, settings)
    return model


def _images(folder: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir()
    for name, (h, w) in (("a.png", (40, 36)), ("b.png", (30, 50)), ("c.png", (28, 28))):
        smooth = np.kron(rng.uniform(0, 255, (h // 2 + 1, w // 2 + 1, 3)), np.ones((2, 2, 1)))[:h, :w]
        Image.fromarray(smooth.astype(np.uint8)).save(folder / name)
    return folder


def _volumes(folder: Path) -> Path:
    import nibabel as nib

    rng = np.random.default_rng(0)
    folder.mkdir()
    for name in ("case1.nii.gz", "case2.nii.gz"):
        volume = rng.uniform(-200, 300, (40, 36, 6)).astype(np.float32)
        nib.save(nib.Nifti1Image(volume, np.diag([0.8, 0.8, 2.5, 1.0])), folder / name)
    return folder


def _read(path: Path) -> np.ndarray:
    if path.suffix == ".png":
        from PIL import Image

        return np.asarray(Image.open(path))
    import nibabel as nib

    return np.asarray(nib.load(path).dataobj)


def test_every_registered_architecture_is_exported_here():
    from spectraflow_monai.utils.architectures import ARCHITECTURES

    assert set(TINY) == set(ARCHITECTURES)


@pytest.mark.parametrize(
    "bundle, architecture",
    [(TWO_D, "spectraflow"), (SYNAPSE, "spectraflow"), (TWO_D, "unet"), (TWO_D, "unetpp")],
)
def test_onnx_inference_writes_the_pytorch_masks(bundle, architecture, tmp_path):
    """``export-onnx`` then ``inference_onnx.yaml`` write the masks of ``inference.yaml`` at fp32, for a model of each
    architecture the bundles train (SpectraFlowNet; the 2D bundle's UNet and U-Net++ baselines, the U-Net++ with deep
    supervision: its final head)."""
    from spectraflow_monai.cli import main

    folder = _lone_copy(bundle, tmp_path)
    model = _write_model(folder, 1 if bundle == TWO_D else 9, None if bundle == TWO_D else 9,
                         architecture=architecture)  # fmt: skip
    inputs = _images(tmp_path / "images") if bundle == TWO_D else _volumes(tmp_path / "ct")
    common = {"bundle_root": str(folder), "input_dir": str(inputs), "device": "$torch.device('cpu')"}
    if bundle == SYNAPSE:
        common["sw_batch_size"] = 4  # 6 slices: batches of 4 and 2 through the free batch axis
    meta = str(folder / "configs" / "metadata.json")

    # the documented command, from the bundle folder's models/model.pt: models/model.onnx beside it
    assert main(["export-onnx", "--model", str(model)]) == 0
    assert (folder / "models" / "model.onnx").is_file()

    run_bundle(str(folder / "configs" / "inference.yaml"), meta, output_dir=str(tmp_path / "torch"),
               precision="fp32", **common)  # fmt: skip
    model.rename(tmp_path / "model.pt.away")  # the ONNX inference needs model.onnx and model.json only
    configs = [str(folder / "configs" / "inference.yaml"), str(folder / "configs" / "inference_onnx.yaml")]
    run_bundle(configs, meta, output_dir=str(tmp_path / "onnx"), **common)

    want = sorted(p.relative_to(tmp_path / "torch") for p in (tmp_path / "torch").rglob("*") if p.is_file())
    got = sorted(p.relative_to(tmp_path / "onnx") for p in (tmp_path / "onnx").rglob("*") if p.is_file())
    assert got == want and len(want) == (3 if bundle == TWO_D else 2)
    values = set()
    for name in want:
        mask = _read(tmp_path / "torch" / name)
        np.testing.assert_array_equal(_read(tmp_path / "onnx" / name), mask)
        values |= set(np.unique(mask).tolist())
    assert len(values) > 1  # not a constant mask: the comparison sees the network's output
    if bundle == SYNAPSE or architecture != "spectraflow":
        return
    # the model trained again (a new model.pt and model.json) beside the old model.onnx: refused in one line
    _write_model(folder, 1, None, seed=1)
    with pytest.raises(Exception) as exc:
        run_bundle(configs, meta, output_dir=str(tmp_path / "stale"), **common)
    line = _one_error_line(exc.value, SettingError)
    assert "model.onnx was not exported from" in line and "export-onnx --model" in line
    assert not (tmp_path / "stale").exists()


def _one_error_line(exc: BaseException, kind: type) -> str:
    """The run's one error line (what the excepthook prints), for a user's mistake of ``kind``."""
    assert isinstance(find_input_error(exc), kind), exc
    line = error_summary(exc)
    assert line.startswith("error: ") and "\n" not in line
    return line


@pytest.mark.parametrize("onnx_file", [None, b"truncated ONNX"])
def test_onnx_inference_without_a_readable_model_onnx_names_the_command(tmp_path, monkeypatch, onnx_file):
    folder = _lone_copy(TWO_D, tmp_path)
    _write_model(folder, 1, None)
    if onnx_file is not None:
        (folder / "models" / "model.onnx").write_bytes(onnx_file)
    monkeypatch.chdir(folder)  # from the bundle folder, as the docs run it
    configs = [str(folder / "configs" / "inference.yaml"), str(folder / "configs" / "inference_onnx.yaml")]
    with pytest.raises(Exception) as exc:  # MONAI wraps the initialize step's error in a RuntimeError
        run_bundle(configs, str(folder / "configs" / "metadata.json"), bundle_root=".",
                   input_dir=str(_images(tmp_path / "images")))  # fmt: skip
    line = _one_error_line(exc.value, DataError)
    assert ("no such ONNX model file" if onnx_file is None else "not an ONNX model onnxruntime can run") in line
    assert "python -m spectraflow_monai export-onnx --model models/model.pt" in line


def test_export_onnx_command_is_quiet_and_refuses_a_record_of_another_model(tmp_path, capsys):
    """The export prints its own steps (a line each at most) and the path, not the exporter's passes; a model.json
    written for another model.pt, or weights that do not fit the record, stop it in one line."""
    import subprocess
    import sys

    from spectraflow_monai.cli import main
    from spectraflow_monai.utils.run_record import read_model_settings, write_model_settings

    model = _write_model(tmp_path, 1, None)
    command = [sys.executable, "-m", "spectraflow_monai", "export-onnx", "--model", str(model)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / "models" / "model.onnx"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # the check's line (and a library warning)
    other = _write_model(tmp_path / "other", 1, None, seed=1)
    shutil.copy(other, model)  # another model.pt beside this model.json
    with pytest.raises(SystemExit):
        main(["export-onnx", "--model", str(model)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was written for another model.pt" in err[0]
    torch.save({"unexpected": torch.zeros(1)}, model)
    write_model_settings(model, read_model_settings(model))  # a hand-made pair: weights of another network
    with pytest.raises(SystemExit):
        main(["export-onnx", "--model", str(model)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its weights do not fit the network its record" in err[0] and "re-train" in err[0]


def test_export_onnx_command_errors_are_one_line(tmp_path, capsys):
    from spectraflow_monai.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["export-onnx", "--model", str(tmp_path / "missing.pt")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.pt: no such model file" in err[0]
    torch.save({}, tmp_path / "model.pt")
    with pytest.raises(SystemExit):
        main(["export-onnx", "--model", str(tmp_path / "model.pt")])
    assert "no model settings recorded beside it" in capsys.readouterr().err


def test_export_onnx_refuses_in_one_line_what_an_architecture_does_not_export(tmp_path, capsys, monkeypatch):
    """An architecture whose registry entry has no export, and ``--int8-encoder`` for a network without an encoder,
    stop the command in one line before anything is written."""
    import dataclasses

    from spectraflow_monai.cli import main
    from spectraflow_monai.utils import architectures

    model = _write_model(tmp_path, 1, None, architecture="unet")
    with pytest.raises(SystemExit) as exc:
        main(["export-onnx", "--model", str(model), "--int8-encoder"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "is a 'unet' model, which has none" in err[0]
    entry = dataclasses.replace(architectures.ARCHITECTURES["unet"], export="its graph has no ONNX form.")
    monkeypatch.setitem(architectures.ARCHITECTURES, "unet", entry)
    with pytest.raises(SystemExit):
        main(["export-onnx", "--model", str(model)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "architecture 'unet' has no ONNX export: its graph has no ONNX form." in err[0]
    assert not (tmp_path / "models" / "model.onnx").exists()
