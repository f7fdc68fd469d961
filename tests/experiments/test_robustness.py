"""The robustness experiment at its smallest scale on a generated synthetic set (a 2-block encoder, 1 epoch)."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

import spectraflow_monai.experiments.robustness as robustness_module
import spectraflow_monai.experiments.runner as runner_module
from spectraflow_monai.experiments import run_robustness
from spectraflow_monai.experiments.cli import main
from spectraflow_monai.experiments.robustness import (
    EXTRA_BASELINES,
    ROBUSTNESS_BASELINE,
    ROBUSTNESS_TITLE,
    model_label,
)
from spectraflow_monai.experiments.runner import RANDOM_INIT_NOTE, ExperimentRunner
from tests.experiments.stubs import stub_bundle_runs
from spectraflow_monai.utils import bundle_path
from spectraflow_monai.utils.bundles import bundle_parser

#: the extra arm of the tiny runs: MONAI's UNet only (the U-Net++ of MONAI's defaults is checked without training)
UNET = {"unet": EXTRA_BASELINES["unet"]}
# 112 px: a multiple of the ViT patch (14) and of the UNet's total stride (16)
TINY = {
    "image_size": 112,
    "encoder_kwargs": {"depth": 2},
    "synthetic_size": {"num_train": 4, "num_val": 2},
    "stage1_epochs": 1,
    "stage1_batch_size": 2,
    "max_epochs": 1,
    "batch_size": 2,
    "val_batch_size": 2,
    "num_workers": 0,
    "precision": "fp32",
}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("robustness")
    data = {"dataset": "synthetic", "dataset_dir": str(out / "data"), "pretrained_weights": "none"}
    rows = run_robustness(out, data, kinds=["gaussian_noise"], severities=[3], overrides=TINY, extra_baselines=UNET)
    yield out, data, rows
    shutil.rmtree(out, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def test_rows_cover_every_model_clean_and_shifted(experiment):
    out, _, rows = experiment
    assert [(r["model"], r["corruption"], r["severity"]) for r in rows] == [
        (model, kind, severity)
        for model in ("spectraflow", "baseline", "unet")
        for kind, severity in (("clean", 0), ("gaussian_noise", 3))
    ]
    for r in rows:
        assert 0.0 <= r["mDSC"] <= 1.0
        if r["corruption"] == "clean":
            assert r["mDSC_change"] == 0.0
    with open(out / "robustness.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    assert (out / "robustness.png").stat().st_size > 0
    text = (out / "robustness.md").read_text()
    assert text.startswith(f"## {ROBUSTNESS_TITLE}: {RANDOM_INIT_NOTE}\n")
    start = "encoder start none (no encoder)"  # read from each model's models/model.json
    assert f"| baseline (unetpp_baseline; 9.05 M parameters; BatchNorm2d; {start}) | gaussian_noise | 3 |" in text
    assert "| spectraflow (" in text and "encoder start Stage-1 export) |" in text
    assert {r["model"]: r["encoder_start"] for r in rows}["spectraflow"] == "Stage-1 export"
    assert "| unet (unet_baseline; " in text and "| mIoU (%) | change (points) |" in text
    assert all(0.0 <= r["mIoU"] <= 1.0 and "mIoU_change" in r for r in rows)


def test_baseline_is_unetpp_by_the_same_stage2_and_unet_an_extra_arm(experiment):
    out, _, _ = experiment
    runs = out / "robustness"
    configs = {m: json.loads((runs / m / "stage2.done.json").read_text())["configs"] for m in ("baseline", "unet")}
    assert configs == {"baseline": ["train.yaml", "unetpp_baseline.yaml"], "unet": ["train.yaml", "unet_baseline.yaml"]}
    assert not (runs / "baseline" / "stage1.done.json").exists()


@pytest.mark.parametrize("corruption", [None, "gaussian_noise", "contrast"])
def test_evaluate_config_corrupts_images_before_normalisation(corruption):
    """evaluate.yaml's `corruption` setting puts a Corruptiond between resizing and normalisation (none when null)."""
    from spectraflow_monai.utils.bundles import bundle_parser

    bundle = bundle_path("spectraflow_2d_segmentation")
    settings = {"corruption": corruption, "corruption_severity": 3}
    parser = bundle_parser(bundle, ["train.yaml", "evaluate.yaml"], settings)
    names = [type(t).__name__ for t in parser.get_parsed_content("evaluate#preprocessing").transforms]
    if corruption is None:
        assert "Corruptiond" not in names
    else:
        assert names[names.index("Resized") + 1 : names.index("NormalizeIntensityd")] == ["Corruptiond"]
        corrupt = parser.get_parsed_content("evaluate#preprocessing").transforms[names.index("Corruptiond")]
        assert corrupt.corrupter.kind == corruption and corrupt.corrupter.severity == 3


def test_second_call_does_no_training(experiment, monkeypatch):
    out, data, rows = experiment

    def refuse(*args, **kwargs):
        raise AssertionError(f"a finished step ran again: {args[2:]}")

    monkeypatch.setattr(runner_module, "run_bundle_configs", refuse)
    titles = []
    monkeypatch.setattr(robustness_module, "save_figure", lambda fig, path: titles.append(fig.get_suptitle()))
    again = run_robustness(out, data, kinds=["gaussian_noise"], severities=[3], overrides=TINY, extra_baselines=UNET)
    assert again == rows and titles == [f"{ROBUSTNESS_TITLE}: {RANDOM_INIT_NOTE}"]


def test_cli_writes_the_report(experiment, monkeypatch, capsys):
    out, _, _ = experiment
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail("nothing should run"))
    argv = ["robustness", "--output", str(out), "--dataset", "synthetic", "--dataset-dir", str(out / "data"),
            "--pretrained-weights", "none", "--kinds", "gaussian_noise", "--severities", "3", "--precision", "fp32",
            "--extra-arms", "unet"]  # fmt: skip
    argv += [f"--override={k}={v}" for k, v in TINY.items() if k != "precision"]
    assert main(argv) == 0
    assert "## Robustness to distribution shift" in (out / "report.md").read_text()


@pytest.mark.parametrize("kwargs,match", [({"scale": "huge"}, "scale"), ({"severities": [0]}, "severities"),
                                          ({"kinds": ["fog"]}, "kinds"),
                                          ({"extra_baselines": {"baseline": "unet_baseline.yaml"}}, "extra_baselines"),
                                          ({"extra_baselines": {"unet": ""}}, "extra_baselines")])  # fmt: skip
def test_bad_settings_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_robustness(tmp_path, {"dataset": "synthetic"}, **kwargs)


@pytest.mark.parametrize(
    "config,parameters,norm",
    [("unetpp_baseline.yaml", 9_049_572, "BatchNorm2d"), ("unetpp_monai_baseline.yaml", 2_410_756, "InstanceNorm2d"),
     ("unetpp_zhou_literal_baseline.yaml", 9_042_276, "none")],
)  # fmt: skip
def test_unetpp_baselines_name_their_size_and_norm(tmp_path, config, parameters, norm):
    """Fig. 5's U-Net++ has Zhou et al.'s widths (32-512) with batch norm; MONAI's defaults (instance norm) and Zhou et
    al.'s reference code (no norm, dropout 0.5) are extra arms."""
    runner = ExperimentRunner(tmp_path, "robustness", {"dataset": "synthetic", "image_size": 112})
    facts = runner.network_facts("baseline", ["train.yaml", config])
    assert facts == {"parameters": parameters, "norm": norm}
    assert model_label("baseline", config, facts).startswith(f"baseline ({config[:-5]}; {parameters / 1e6:.2f} M")
    assert config in (ROBUSTNESS_BASELINE, *EXTRA_BASELINES.values())


def test_kvasir_colour_augmentation_is_the_documented_one_and_can_be_off(tmp_path):
    """The module docstring (and docs/experiments.md) name the Kvasir-SEG training augmentation that overlaps the
    contrast and blur corruptions, and ``--override 'colour_augmentation#kvasir=[]'`` as the way to train without."""
    runner = ExperimentRunner(tmp_path, "robustness", {"dataset": "synthetic"})
    for overrides, expected in (({}, ["RandAdjustContrastd", "RandScaleIntensityd", "RandGaussianSmoothd"]),
                                ({"colour_augmentation#kvasir": []}, [])):  # fmt: skip
        parser = bundle_parser(runner.bundle, ["train.yaml"], {"dataset": "synthetic", **overrides})
        assert [type(t).__name__ for t in parser.get_parsed_content("colour_augmentation#kvasir")] == expected
    assert "colour_augmentation#kvasir=[]" in robustness_module.__doc__


def test_tables_carry_miou_and_each_models_size(tmp_path, monkeypatch):
    calls = stub_bundle_runs(monkeypatch)
    data = {"dataset": "synthetic", "pretrained_weights": "none", "encoder_kwargs": {"depth": 2}}
    rows = run_robustness(tmp_path, data, kinds=["contrast"], severities=[2], extra_baselines=EXTRA_BASELINES)
    assert [c["configs"][-1] for c in calls if c["title"].endswith("/ stage2")] == [
        "train.yaml", "unetpp_baseline.yaml", "unet_baseline.yaml", "unetpp_monai_baseline.yaml",
        "unetpp_zhou_literal_baseline.yaml",
    ]  # fmt: skip
    by_model = {r["model"]: r for r in rows}
    assert (by_model["baseline"]["parameters"], by_model["baseline"]["norm"]) == (9_049_572, "BatchNorm2d")
    assert by_model["unetpp_monai"]["norm"] == "InstanceNorm2d"
    with open(tmp_path / "robustness.csv") as f:
        header = next(csv.reader(f))
    assert {"mDSC", "mIoU", "hd95_monai_empty_as_diagonal", "mIoU_change", "parameters", "norm"} <= set(header)
    text = (tmp_path / "robustness.md").read_text()
    assert "| mDSC (%) | change (points) | mIoU (%) | change (points) | HD95 (px, missed = diagonal) |" in text
    row = "| baseline (unetpp_baseline; 9.05 M parameters; BatchNorm2d; encoder start unknown (no model.json)) |"
    assert f"{row} contrast | 2 | 81.25 | +0.00 | 68.75 |" in text  # the stubbed runs write no model.json
    assert [c["settings"].get("encoder_init") for c in calls if c["title"].endswith("/ stage2")] == [
        "stage1", None, None, None, None]  # SpectraFlow requires its Stage-1 export
