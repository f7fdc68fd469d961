"""The experiments' encoder weights (the bundle's default, checked before any step; random init only when asked for,
then named in every title), the command line's paper defaults (data set, baseline), and a step whose settings changed
since it finished starting over (the bundle's run record would refuse to continue the earlier run; the earlier run
is kept aside)."""

from __future__ import annotations

import json

import pytest
import torch

import spectraflow_monai.experiments.runner as runner_module
from spectraflow_monai.experiments import ABLATIONS, run_ablation
from spectraflow_monai.experiments.cli import PAPER_DATASETS, main
from spectraflow_monai.experiments.runner import (
    RANDOM_INIT_NOTE,
    EncoderWeightsError,
    ExperimentRunner,
    experiment_title,
    resolve_encoder_weights,
)
from spectraflow_monai.networks import DINOv2Encoder

SMALL = {"image_size": 28, "encoder_kwargs": {"depth": 2}, "dataset": "synthetic"}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No hub: huggingface_hub's offline mode with an empty cache (fails at once)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"), raising=False)


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"a step ran: {a[2:]}"))


@pytest.mark.parametrize("value", ["none", None, "None", ""])
def test_random_init_only_when_asked_and_then_titled(value):
    settings = resolve_encoder_weights({**SMALL, "pretrained_weights": value})
    assert settings["pretrained_weights"] == "none"
    assert experiment_title("Table", settings) == f"Table: {RANDOM_INIT_NOTE}"


def test_a_weight_file_is_loaded_and_titles_stay_plain(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "dinov2_tiny.pth"
    torch.save(DINOv2Encoder(img_size=28, model_kwargs={"depth": 2}).vit.state_dict(), path)
    settings = resolve_encoder_weights({**SMALL, "pretrained_weights": str(path)})
    assert settings["pretrained_weights"] == str(path)
    assert experiment_title("Table", settings) == "Table"


def test_default_is_the_bundles_timm_and_offline_stops_before_training(offline, no_training, tmp_path):
    with pytest.raises(EncoderWeightsError) as info:  # no pretrained_weights: the bundle's default, timm
        run_ablation(tmp_path, "finetune", {"dataset": "synthetic", "dataset_dir": str(tmp_path / "data")},
                     overrides={"image_size": 28, "encoder_kwargs": {"depth": 2}})  # fmt: skip
    text = str(info.value)
    assert text.startswith("pretrained_weights='timm'") and "nothing was trained" in text
    assert "--pretrained-weights /path/dinov2_vits14_pretrain.pth" in text and "--pretrained-weights none" in text
    assert not (tmp_path / "finetune").exists()


def test_missing_weight_file_is_named(no_training, tmp_path):
    absent = tmp_path / "absent.pth"
    with pytest.raises(EncoderWeightsError, match="absent.pth"):
        resolve_encoder_weights({**SMALL, "pretrained_weights": str(absent)})


@pytest.mark.parametrize("experiment", ["stage1", "robustness", "low-data", "figures"])
def test_cli_offline_exits_naming_the_option(offline, no_training, tmp_path, capsys, experiment):
    argv = [experiment, "--output", str(tmp_path), "--dataset", "synthetic", "--override=encoder_kwargs={depth: 2}"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert f"experiment {experiment}: error: pretrained_weights='timm'" in err and "--pretrained-weights none" in err


def test_paper_datasets_are_the_defaults(tmp_path, capsys):
    assert PAPER_DATASETS == {
        "robustness": "kvasir", "low-data": "isic2016", "stage1": "isic2016", "decoder": "isic2016",
        "finetune": "isic2016", "dispersive-weight": "kvasir", "figures": "isic2016",
        "active-learning": "kvasir",  # not a paper experiment: the MONAI Label app's first 2D use
    }  # fmt: skip
    assert {name: ABLATIONS[name].dataset for name in ABLATIONS} == {
        "stage1": "isic2016", "decoder": "isic2016", "finetune": "isic2016", "dispersive-weight": "kvasir"
    }  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:  # the default data set needs its folder
        main(["decoder", "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--dataset isic2016 needs its files" in err and "--dataset-dir" in err


COMMON = {
    "dataset": "synthetic", "image_size": 28, "encoder_kwargs": {"depth": 2}, "pretrained_weights": "none",
    "encoder_init": "random", "synthetic_size": {"num_train": 4, "num_val": 2}, "max_epochs": 1, "batch_size": 2,
    "val_batch_size": 2, "num_workers": 0, "progress_bar": False, "precision": "fp32",
}  # fmt: skip


def test_a_step_with_changed_settings_starts_over(tmp_path):
    runner = ExperimentRunner(tmp_path, "exp", {**COMMON, "dataset_dir": str(tmp_path / "data")})
    root = runner.step("run", "stage2", ["train.yaml"], {"learning_rate": 0.0001})
    runner.step("run", "stage2", ["train.yaml"], {"learning_rate": 0.0001})  # done: skipped
    assert runner.executed == ["run/stage2"]
    runner.step("run", "stage2", ["train.yaml"], {"learning_rate": 0.001})
    assert runner.executed == ["run/stage2", "run/stage2"]
    record = json.loads((root / "models" / "stage2" / "run_record.json").read_text())
    assert record["settings"]["learning_rate"] == 0.001
    assert len(list((root / "models").glob("stage2.bak-*"))) == 1  # the earlier run, kept aside
