"""Killed runs, resumed runs and non-finite losses, through ``python -m monai.bundle run`` subprocesses.

A run of the 2D bundle killed with SIGKILL in the middle of its second epoch and started again in the same
``bundle_root`` ends with the same weights as an uninterrupted run (Stage-1 and Stage-2; CPU, one thread,
deterministic settings, a 2-block encoder on 28x28 synthetic images); every file left behind by the killed run loads
with ``weights_only=True``. A run whose loss becomes NaN exits with a non-zero status and an error line, and writes
no checkpoint or export from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spectraflow_monai.apps.seg2d import generate_synthetic_dataset
from tests.bundles.helpers import kill_when_file_appears, load_weights, run_bundle_process, start_bundle

BUNDLE = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_2d_segmentation"
TRAIN = str(BUNDLE / "configs" / "train.yaml")
STAGE1 = str(BUNDLE / "configs" / "train_stage1.yaml")
NUM_TRAIN = 16  # batch 2: 8 iterations per epoch, so that a kill right after the epoch-1 checkpoint lands in epoch 2
STAGE2 = {"encoder_init": "random", "max_epochs": 3, "batch_size": 2, "val_batch_size": 2}
STAGE1_ARGS = {"stage1_epochs": 3, "stage1_batch_size": 2, "head_hidden_channels": 32, "head_num_blocks": 1,
               "stage1_start_lr": 1e-3, "stage1_end_lr": 1e-4, "ema_decay": 0.5}  # fmt: skip

pytestmark = pytest.mark.xdist_group("spectraflow_resume_runs")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume_data") / "data"
    generate_synthetic_dataset(root, num_train=NUM_TRAIN, num_val=2)  # what the bundle itself would generate
    return root


def _settings(root: Path, data_dir: Path, **extra) -> dict:
    return {
        "bundle_root": str(root),
        "dataset_dir": str(data_dir),
        "synthetic_size": {"num_train": NUM_TRAIN, "num_val": 2},
        "image_size": 28,
        "encoder_kwargs": {"depth": 2},
        "pretrained_weights": "none",
        "num_workers": 0,
        "progress_bar": False,
        **extra,
    }


def _run(configs: list[str], settings: dict, root: Path, name: str) -> tuple[int, str]:
    root.mkdir(parents=True, exist_ok=True)
    return run_bundle_process(configs, settings, BUNDLE, root / f"{name}.log")


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _assert_all_load(models: Path) -> None:
    files = sorted(models.rglob("*.pt"))
    assert files
    for path in files:
        state = load_weights(path)  # weights_only=True: a truncated or unsafe file would fail here
        tensors = [v for v in state.values() if isinstance(v, torch.Tensor)] if "model" not in state else []
        assert all(torch.isfinite(t).all() for t in tensors if t.is_floating_point()), path


def _kill_in_second_epoch(configs: list[str], settings: dict, root: Path, first_ckpt: Path, second_ckpt: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    proc = start_bundle(configs, settings, BUNDLE, root / "killed.log")
    kill_when_file_appears(proc, first_ckpt)
    assert proc.returncode == -9
    assert not second_ckpt.exists()  # killed during epoch 2


def test_stage2_killed_mid_epoch_resumes_to_the_same_weights(tmp_path, data_dir):
    ref, run = tmp_path / "ref", tmp_path / "run"
    rc, out = _run([TRAIN], _settings(ref, data_dir, **STAGE2), ref, "ref")
    assert rc == 0, out[-4000:]

    ckpts = run / "models" / "stage2"
    _kill_in_second_epoch([TRAIN], _settings(run, data_dir, **STAGE2), run, ckpts / "checkpoint_epoch=1.pt",
                          ckpts / "checkpoint_epoch=2.pt")  # fmt: skip
    _assert_all_load(run / "models")
    rc, out = _run([TRAIN], _settings(run, data_dir, **STAGE2), run, "resumed")
    assert rc == 0, out[-4000:]
    assert "resuming from" in out and "checkpoint_epoch=1.pt" in out

    final_ref = load_weights(ref / "models" / "stage2" / "checkpoint_epoch=3.pt")
    final_run = load_weights(ckpts / "checkpoint_epoch=3.pt")
    assert final_run["trainer"]["iteration"] == final_ref["trainer"]["iteration"] == 3 * NUM_TRAIN // 2
    _assert_same(final_ref["model"], final_run["model"])
    assert final_ref["early_stop"] == final_run["early_stop"]
    assert final_ref["best_model"] == final_run["best_model"]  # the best score of model.pt survived the kill
    _assert_same(load_weights(ref / "models" / "model.pt"), load_weights(run / "models" / "model.pt"))
    assert not list((run / "models").glob("model.pt.bak-*"))  # resuming sets nothing aside


def test_stage1_killed_mid_epoch_resumes_to_the_same_weights(tmp_path, data_dir):
    ref, run = tmp_path / "ref", tmp_path / "run"
    # the epoch checkpoints stay after completion here, so that their count across the restart can be checked (the
    # bundle's default removes them once checkpoint_final.pt is written: test_spectraflow_2d_bundle)
    args = {**STAGE1_ARGS, "stage1#prune_on_completion": False}
    rc, out = _run([TRAIN, STAGE1], _settings(ref, data_dir, **args), ref, "ref")
    assert rc == 0, out[-4000:]

    ckpts = run / "models" / "stage1"
    _kill_in_second_epoch([TRAIN, STAGE1], _settings(run, data_dir, **args), run,
                          ckpts / "checkpoint_epoch=1.pt", ckpts / "checkpoint_epoch=2.pt")  # fmt: skip
    _assert_all_load(run / "models")
    rc, out = _run([TRAIN, STAGE1], _settings(run, data_dir, **args), run, "resumed")
    assert rc == 0, out[-4000:]
    assert "resuming from" in out

    final_ref = load_weights(ref / "models" / "stage1" / "checkpoint_final.pt")
    final_run = load_weights(ckpts / "checkpoint_final.pt")
    for key in ("encoder", "head", "ema"):
        _assert_same(final_ref[key], final_run[key])
    _assert_same(load_weights(ref / "models" / "encoder_stage1.pt"), load_weights(run / "models" / "encoder_stage1.pt"))
    assert sorted(p.name for p in ckpts.glob("checkpoint_epoch=*.pt")) == ["checkpoint_epoch=2.pt", "checkpoint_epoch=3.pt"]


def _nan_after(calls: int, loss_ref: str, signature: str) -> str:
    """A config expression: the loss ``loss_ref``, multiplied by NaN from call ``calls + 1`` on."""
    return (f"$lambda {signature}, _loss={loss_ref}, _calls=[]: _calls.append(1) or "
            f"_loss({signature}) * (float('nan') if len(_calls) > {calls} else 1.0)")  # fmt: skip


def test_stage2_nan_loss_exits_nonzero_and_keeps_model_pt(tmp_path, data_dir):
    iterations = NUM_TRAIN // 2
    patch = tmp_path / "nan_loss.yaml"
    patch.write_text(f'train#trainer#loss_function: "{_nan_after(iterations, "@train#loss", "pred, target")}"\n')
    rc, out = _run([TRAIN, str(patch)], _settings(tmp_path, data_dir, **STAGE2), tmp_path, "nan")
    assert rc != 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("error:") and "loss is [nan]" in last and "epoch 2" in last, last
    models = tmp_path / "models"
    _assert_all_load(models)
    assert not (models / "stage2" / "checkpoint_epoch=2.pt").exists()
    # model.pt is the epoch-1 model (the only validation before the NaN), finite
    _assert_same(load_weights(models / "model.pt"), load_weights(models / "stage2" / "checkpoint_epoch=1.pt")["model"])


def test_stage1_nan_loss_exits_nonzero_and_keeps_the_export(tmp_path, data_dir):
    iterations = NUM_TRAIN // 2
    patch = tmp_path / "nan_loss.yaml"
    imports = (
        "imports: ['$import spectraflow_monai.utils.excepthook', '$from spectraflow_monai.losses import DispersiveLoss']"
    )
    loss = "DispersiveLoss(normalize='dim')"  # the bundle's default dispersive loss, as a replacement that turns NaN
    patch.write_text(f'{imports}\nstage1#dispersive_loss: "{_nan_after(iterations, loss, "x")}"\n')
    rc, out = _run([TRAIN, STAGE1, str(patch)], _settings(tmp_path, data_dir, **STAGE1_ARGS), tmp_path, "nan")
    assert rc != 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("error:") and "loss is [nan]" in last and "epoch 2" in last, last
    models = tmp_path / "models"
    _assert_all_load(models)
    export = load_weights(models / "encoder_stage1.pt")
    assert all(torch.isfinite(v).all() for v in export.values() if v.is_floating_point())
    # the export is the EMA encoder after epoch 1, as in the epoch-1 checkpoint
    assert not (models / "stage1" / "checkpoint_epoch=2.pt").exists()
