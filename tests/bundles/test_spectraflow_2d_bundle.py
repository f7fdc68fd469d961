"""End-to-end checks of the ``spectraflow_2d_segmentation`` bundle, in the manner of the MONAI model-zoo CI.

Everything goes through the public ``monai.bundle`` API (``run``, ``ckpt_export``, ``verify_net_in_out``,
``verify_metadata``, ``ConfigParser``) with the bundle's own config files, on a handful of tiny synthetic images
(56x56, a 2-block DINOv2 encoder): SpectraFlow Stage-1 (Mixed-Domain MeanFlow + dispersive pretraining, Chen et al.,
Sec. 4.1) and Stage-2 (segmentation fine-tuning, Sec. 4.2) run once per module and the later tests reuse their
outputs (evaluation, inference, TorchScript export, metadata checks, resuming). The multi-GPU override is run with
``torchrun`` and two CPU processes (gloo).
"""

from __future__ import annotations

import csv
import glob
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.bundle.scripts import ckpt_export, verify_metadata, verify_net_in_out
from monai.utils import set_determinism
from PIL import Image

from spectraflow_monai.networks import DINOv2Encoder
from tests.bundles.helpers import (
    REPO,
    SCHEMA,
    assert_evaluation_skips_encoder_weights,
    config_paths,
    missing_workflow_properties,
    run_bundle,
)
from tests.bundles.helpers import error_text as _error_text
from tests.bundles.helpers import load_weights as _load
from tests.bundles.helpers import parse_config as _parse
from tests.bundles.helpers import torchrun_bundle as _torchrun

BUNDLE = REPO / "bundles" / "spectraflow_2d_segmentation"
_CONFIGS = config_paths("spectraflow_2d_segmentation")
TRAIN, STAGE1_CONFIG, EVALUATE, INFERENCE, MULTI_GPU, META = (
    _CONFIGS[k] for k in ("train", "train_stage1", "evaluate", "inference", "multi_gpu_train", "metadata")
)

IMAGE_SIZE = 56
DEPTH = 2
NUM_TRAIN, NUM_VAL = 8, 4
STAGE1_EPOCHS = 2
STAGE1_BATCH = 4
# network settings shared by every config (train, evaluate, inference)
NET = {"image_size": IMAGE_SIZE, "encoder_kwargs": {"depth": DEPTH}}
# Stage-1 settings: a small head; a large learning rate and a short EMA so that the exported encoder is clearly
# different from its random initialisation (otherwise "Stage-2 starts from the export" could not be told apart)
STAGE1_ARGS = {
    "stage1_epochs": STAGE1_EPOCHS,
    "stage1_batch_size": STAGE1_BATCH,
    "head_hidden_channels": 32,
    "head_num_blocks": 1,
    "stage1_start_lr": 1e-3,
    "stage1_end_lr": 1e-4,
    "ema_decay": 0.5,
}
PRECISION_LINE = re.compile(r"precision: (?:bf16|fp16|fp32) \(")  # resolve_precision's log line
# the module fixture trains once; with `pytest -n N --dist loadgroup` keep this module on one worker
pytestmark = pytest.mark.xdist_group("spectraflow_2d_bundle")








def _scalars(log_dir: str) -> dict[str, list[int]]:
    """TensorBoard scalar tags of ``log_dir`` and the steps logged for each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir)
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}






def _run(config_file, **override) -> None:
    run_bundle(config_file, META, **override)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Synthetic data, Stage-1 and Stage-2, each run once for the module; returns the paths and settings."""
    root = tmp_path_factory.mktemp("spectraflow_2d")
    data_dir = str(root / "data")
    common = {
        "bundle_root": str(root),
        "dataset_dir": data_dir,
        "synthetic_size": {"num_train": NUM_TRAIN, "num_val": NUM_VAL},
        "num_workers": 0,
        "progress_bar": False,
        "pretrained_weights": "none",  # no hub on the test machines: Stage-1 starts from random weights, explicitly
        **NET,
    }
    _run([TRAIN, STAGE1_CONFIG], **common, **STAGE1_ARGS)
    export = _load(root / "models" / "encoder_stage1.pt")  # kept: later runs in other roots never touch it
    _run(TRAIN, **common, max_epochs=2, batch_size=4, val_batch_size=4)
    yield {"root": root, "data_dir": data_dir, "common": common, "export": export}
    shutil.rmtree(root, ignore_errors=True)  # checkpoints: keep the suite's disk use small


# ---------------------------------------------------------------- 1. Stage-1
def test_stage1_export_loads_into_encoder(trained):
    path = trained["root"] / "models" / "encoder_stage1.pt"
    assert path.is_file()
    encoder = DINOv2Encoder(pretrained=str(path), model_kwargs={"depth": DEPTH}, img_size=IMAGE_SIZE)
    state = encoder.vit.state_dict()
    export = trained["export"]
    assert set(export) == set(state)
    for key, value in export.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
    # Stage-1 changed the weights: the export is not a fresh random encoder
    set_determinism(seed=0)
    fresh = DINOv2Encoder(model_kwargs={"depth": DEPTH}, img_size=IMAGE_SIZE).vit.state_dict()
    assert any(not torch.equal(fresh[k], export[k]) for k in export)
    # the Stage-1 losses were logged to TensorBoard for every iteration
    tags = _scalars(str(trained["root"] / "logs" / "stage1"))
    assert {"loss", "meanflow_error", "loss_meanflow_weighted", "loss_dispersive"} <= set(tags)
    assert tags["loss"] == list(range(1, STAGE1_EPOCHS * (NUM_TRAIN // STAGE1_BATCH) + 1))


def test_stage1_resume_continues(trained, tmp_path):
    ckpt_path = trained["root"] / "models" / "stage1" / "checkpoint_final.pt"
    assert ckpt_path.is_file()
    ckpt = _load(ckpt_path)
    assert {"encoder", "head", "optimizer", "ema", "lr_scheduler", "trainer"} <= set(ckpt)
    iters_per_epoch = NUM_TRAIN // STAGE1_BATCH
    assert ckpt["trainer"]["iteration"] == STAGE1_EPOCHS * iters_per_epoch
    # resume into a separate bundle root (same data) with one more epoch
    common = dict(trained["common"], bundle_root=str(tmp_path))
    stage1 = dict(STAGE1_ARGS, stage1_epochs=STAGE1_EPOCHS + 1)
    _run([TRAIN, STAGE1_CONFIG], **common, **stage1, resume_from=str(ckpt_path))
    resumed = _load(tmp_path / "models" / "stage1" / "checkpoint_final.pt")
    previous_epoch = ckpt["trainer"]["iteration"] // ckpt["trainer"]["epoch_length"]
    epoch = resumed["trainer"]["iteration"] // resumed["trainer"]["epoch_length"]
    assert epoch == previous_epoch + 1
    # only the new epoch ran (a run from scratch would log steps 1..6)
    steps = _scalars(str(tmp_path / "logs" / "stage1"))["loss"]
    first = STAGE1_EPOCHS * iters_per_epoch + 1
    assert steps == list(range(first, first + iters_per_epoch))
    assert (tmp_path / "models" / "encoder_stage1.pt").is_file()
    # the learning rate followed the new, longer schedule down to its end rate (not the checkpoint's length)
    total = (STAGE1_EPOCHS + 1) * iters_per_epoch
    assert resumed["lr_scheduler"]["total_iters"] == total == resumed["lr_scheduler"]["last_epoch"]
    end_lr = resumed["lr_scheduler"]["base_lrs"][0] * resumed["lr_scheduler"]["end_factor"]
    assert resumed["optimizer"]["param_groups"][0]["lr"] == pytest.approx(end_lr, rel=1e-6)


# ---------------------------------------------------------------- 2. Stage-2
def test_stage2_starts_from_stage1_export(trained):
    export = trained["export"]
    # the network of train.yaml after its `encoder_initialization` step (Stage-2 at its start; encoder_init: auto,
    # the default, finds the export) holds the exported encoder...
    set_determinism(seed=0)
    parser = _parse(TRAIN, **trained["common"])
    assert parser["stage2_settings#encoder_init"] == "auto" and parser.get_parsed_content("stage2").encoder_start == "stage1"
    parser.get_parsed_content("encoder_initialization")
    start = parser.get_parsed_content("network_def").encoder.vit.state_dict()
    for key, value in export.items():
        torch.testing.assert_close(start[key], value, rtol=0, atol=0, msg=key)
    # ...which the network definition alone does not (it builds the architecture only; same seed)
    set_determinism(seed=0)
    net0 = _parse(TRAIN, **trained["common"]).get_parsed_content("network_def")
    assert not torch.equal(net0.encoder.vit.blocks[0].attn.qkv.weight, export["blocks.0.attn.qkv.weight"])

    # the trained model: frozen encoder parts unchanged from the export, the last block fine-tuned
    model = _load(trained["root"] / "models" / "model.pt")
    assert any(k.startswith("decoder.") for k in model)
    for key in ("patch_embed.proj.weight", "pos_embed", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc2.weight"):
        torch.testing.assert_close(model["encoder.vit." + key], export[key], rtol=0, atol=0, msg=key)
    last = f"blocks.{DEPTH - 1}.attn.qkv.weight"
    assert not torch.equal(model["encoder.vit." + last], export[last])


def test_stage2_tensorboard(trained):
    log_dir = trained["root"] / "logs"
    assert glob.glob(str(log_dir / "events.out.tfevents.*"))
    tags = _scalars(str(log_dir))
    assert {"train_loss", "val_mean_dice", "val_mean_iou", "val_hd95"} <= set(tags)
    assert tags["val_mean_dice"] == [1, 2]


# ---------------------------------------------------------------- 3. evaluate
def test_evaluate_reports(trained):
    root = trained["root"]
    _run([TRAIN, EVALUATE], **trained["common"])
    with open(root / "eval" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    names = sorted(Path(p).stem for p in glob.glob(os.path.join(trained["data_dir"], "images", "synth_val_*")))
    assert len(names) == NUM_VAL
    assert sorted(r["name"] for r in rows) == names
    metric_columns = ("iou", "dice", "recall", "precision", "hd95_monai", "hd95_pooled")
    assert set(metric_columns) <= set(rows[0])
    n_nan = 0
    for row in rows:
        for column in metric_columns:
            value = float(row[column])
            if math.isnan(value):  # documented: HD95 is undefined when a mask is empty
                assert column.startswith("hd95") and 0 in (int(row["gt_area"]), int(row["pred_area"])), row
                n_nan += 1
            else:
                assert math.isfinite(value), row
                if not column.startswith("hd95"):
                    assert 0.0 <= value <= 1.0, row
    summary = (root / "eval" / "summary.md").read_text()
    assert "max of the directed 95th percentiles (MONAI)" in summary
    assert "pooled distances (medpy/TransUNet)" in summary
    assert f"Images: {NUM_VAL}" in summary
    # "HD95 [monai]: <k> image(s) excluded (...)": every NaN in the table is accounted for in the summary
    excluded = [line.split(" image(s) excluded")[0] for line in summary.splitlines() if "image(s) excluded" in line]
    assert len(excluded) == 2 and sum(int(e.rsplit(" ", 1)[-1]) for e in excluded) == n_nan
    preds = sorted(glob.glob(str(root / "eval" / "predictions" / "*.png")))
    assert [Path(p).name for p in preds] == [f"{n}_seg.png" for n in names]
    for p in preds:
        mask = np.asarray(Image.open(p))
        assert mask.shape == (IMAGE_SIZE, IMAGE_SIZE)
        assert set(np.unique(mask).tolist()) <= {0, 255}


# ---------------------------------------------------------------- 4. inference
def test_inference_writes_masks_at_input_size(trained, tmp_path):
    in_dir, out_dir = tmp_path / "images", tmp_path / "predictions"
    in_dir.mkdir()
    rng = np.random.default_rng(0)
    height, width = 70, 90
    for name in ("case_a", "case_b"):
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(in_dir / f"{name}.png")
    (in_dir / "notes.txt").write_text("not an image")  # skipped, not read
    _run(INFERENCE, bundle_root=str(trained["root"]), input_dir=str(in_dir), output_dir=str(out_dir), **NET)
    outputs = sorted(p.name for p in out_dir.glob("*.png"))
    assert outputs == ["case_a_seg.png", "case_b_seg.png"]
    for name in outputs:
        image = Image.open(out_dir / name)
        assert image.size == (width, height)
        assert set(np.unique(np.asarray(image)).tolist()) <= {0, 255}


# ---------------------------------------------------------------- 5. TorchScript export
def test_ckpt_export_trace_matches_eager(trained):
    root = trained["root"]
    ts_path = root / "models" / "model.ts"
    shape = [1, 3, IMAGE_SIZE, IMAGE_SIZE]
    ckpt_export(
        net_id="network_def",
        filepath=str(ts_path),
        ckpt_file=str(root / "models" / "model.pt"),
        meta_file=META,
        config_file=INFERENCE,
        bundle_root=str(root),
        use_trace=True,
        input_shape=shape,
        **NET,
    )
    traced = torch.jit.load(str(ts_path), map_location="cpu")
    eager = _parse(INFERENCE, bundle_root=str(root), **NET).get_parsed_content("network_def")
    eager.load_state_dict(_load(root / "models" / "model.pt"))
    eager.eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = eager(x)
        actual = traced(x)
    assert actual.shape == (1, 1, IMAGE_SIZE, IMAGE_SIZE)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- 6. metadata and network I/O
@pytest.mark.parametrize("workflow_type", ["train", "inference"])
def test_monai_check_properties(trained, workflow_type):
    # MONAI's check of a bundle workflow: nothing required is missing, every optional reference is where MONAI looks
    config = TRAIN if workflow_type == "train" else INFERENCE
    override = {**trained["common"], "max_epochs": 2, "batch_size": 4, "val_batch_size": 4}
    if workflow_type == "inference":
        images = os.path.join(trained["data_dir"], "images")
        override = {"bundle_root": str(trained["root"]), "input_dir": images, **NET}
    assert missing_workflow_properties(config, workflow_type, META, **override) == []


def test_verify_metadata_offline():
    verify_metadata(meta_file=META, filepath=SCHEMA)


def test_verify_net_in_out(trained):
    verify_net_in_out(
        net_id="network_def",
        meta_file=META,
        config_file=INFERENCE,
        device="cpu",
        bundle_root=str(trained["root"]),
        encoder_kwargs={"depth": DEPTH},
    )


# ---------------------------------------------------------------- 7. multi-GPU override (2 CPU processes, gloo)


@pytest.mark.slow
def test_multi_gpu_override_two_processes(trained, tmp_path):
    root = tmp_path / "ddp"
    args = [
        "--bundle_root", str(root), "--dataset_dir", trained["data_dir"],
        "--synthetic_size", f"{{'num_train':{NUM_TRAIN},'num_val':{NUM_VAL}}}",
        "--model_settings#image_size", str(IMAGE_SIZE), "--model_settings#encoder_kwargs", f"{{'depth':{DEPTH}}}", "--run_settings#num_workers", "0",
        "--meta_file", "configs/metadata.json", "--logging_file", "configs/logging.conf",
        "--stage2_settings#pretrained_weights", "none",
    ]  # fmt: skip
    stage1_log = _torchrun(
        ["configs/train.yaml", "configs/train_stage1.yaml",
         "configs/multi_gpu_train.yaml"],
        args + ["--run_settings#stage1_epochs", "1", "--stage1_settings#stage1_batch_size", "2", "--stage1_settings#head_hidden_channels", "32",
                "--stage1_settings#head_num_blocks", "1"],
        BUNDLE,
    )  # fmt: skip
    export_path = root / "models" / "encoder_stage1.pt"
    assert export_path.is_file()
    assert (root / "models" / "stage1" / "checkpoint_final.pt").is_file()
    assert not list((root / "models" / "stage1").glob("checkpoint_epoch=*.pt"))  # a completed run keeps the final one
    # the same program as one process: the precision is checked and logged, Stage-1 records itself in its folder
    assert (root / "models" / "stage1" / "run_record.json").is_file()
    assert (root / "models" / "encoder_stage1.json").is_file()
    assert not (root / "models" / "stage2").exists()
    assert len(PRECISION_LINE.findall(stage1_log)) == 2 and "process group: rank 1 of 2 (gloo)" in stage1_log
    stage2_log = _torchrun(
        ["configs/train.yaml", "configs/multi_gpu_train.yaml"],
        args + ["--max_epochs", "1", "--stage2_settings#batch_size", "2", "--run_settings#val_batch_size", "2"],
        BUNDLE,
    )
    model_path = root / "models" / "model.pt"
    assert model_path.is_file() and (root / "models" / "model.json").is_file()
    assert len(PRECISION_LINE.findall(stage2_log)) == 2  # one per process
    assert (root / "models" / "stage2" / "run_record.json").is_file()
    # saved without the DistributedDataParallel wrapper, and started from this run's Stage-1 export
    model, export = _load(model_path), _load(export_path)
    assert not any(k.startswith("module.") for k in model)
    torch.testing.assert_close(model["encoder.vit.blocks.0.attn.qkv.weight"], export["blocks.0.attn.qkv.weight"])


# ---------------------------------------------------------------- 8. bad input stops the run before training
def test_missing_dataset_folder_is_named(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception) as info:
        _run(TRAIN, bundle_root=str(tmp_path / "b"), dataset="kvasir", dataset_dir=str(empty), num_workers=0,
             encoder_init="pretrained", pretrained_weights="none", **NET)  # fmt: skip
    text = _error_text(info.value)
    assert str(empty) in text and "not found" in text, text
    assert not (tmp_path / "b" / "models" / "model.pt").exists()


def test_evaluate_without_model_names_the_file(tmp_path):
    with pytest.raises(Exception) as info:
        _run([TRAIN, EVALUATE], bundle_root=str(tmp_path), num_workers=0, **NET)
    text = _error_text(info.value)
    assert "DataError" in text and os.path.join(str(tmp_path), "models", "model.pt") in text, text  # one line
    assert "does not exist: train the model first" in text, text
    assert not (tmp_path / "eval").exists()


def test_evaluation_loads_no_encoder_weights_before_model_pt(tmp_path):
    assert_evaluation_skips_encoder_weights(TRAIN, EVALUATE, tmp_path)


def test_unreachable_hub_stops_stage1_before_training(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"), raising=False)
    with pytest.raises(Exception) as info:  # pretrained_weights: timm, the bundle's default
        _run([TRAIN, STAGE1_CONFIG], bundle_root=str(tmp_path), num_workers=0, progress_bar=False, **NET)
    text = _error_text(info.value)
    assert "SettingError" in text and "pretrained_weights: /path/dinov2_vits14_pretrain.pth" in text, text
    assert "pretrained_weights none" in text, text
    assert not list((tmp_path / "models").rglob("*.pt"))  # nothing trained, nothing exported


def test_stage2_without_stage1_export_names_the_file_and_the_ways_forward(tmp_path):
    with pytest.raises(Exception) as info:  # encoder_init: stage1 (auto, the default, falls back); no fallback
        _run(TRAIN, bundle_root=str(tmp_path), num_workers=0, progress_bar=False, pretrained_weights="none",
             encoder_init="stage1", **NET)  # fmt: skip
    text = _error_text(info.value)
    assert os.path.join(str(tmp_path), "models", "encoder_stage1.pt") in text, text
    assert "configs/train_stage1.yaml" in text and "--stage2_settings#encoder_init pretrained" in text, text
    assert not (tmp_path / "models" / "model.pt").exists()


def test_inference_without_images_names_the_folder(trained, tmp_path):
    with pytest.raises(Exception) as info:
        _run(INFERENCE, bundle_root=str(trained["root"]), input_dir=str(tmp_path), output_dir=str(tmp_path), **NET)
    text = _error_text(info.value)
    assert "FileNotFoundError" in text and str(tmp_path) in text, text
