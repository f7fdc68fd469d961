"""The ablation experiments (stage1, decoder, finetune, dispersive-weight) at their smallest scale, synthetic data."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch

import spectraflow_monai.experiments.ablations as ablations_module
import spectraflow_monai.experiments.runner as runner_module
from spectraflow_monai.experiments import ABLATIONS, dispersive_weight_ablation, run_ablation
from spectraflow_monai.experiments.ablations import PAPER_LITERAL_STAGE1, STAGE1_DECODERS, stage2_run
from spectraflow_monai.experiments.cli import main
from spectraflow_monai.experiments.runner import RANDOM_INIT_NOTE, ExperimentRunner
from spectraflow_monai.utils import bundle_path
from spectraflow_monai.utils.bundles import bundle_parser
from tests.experiments.stubs import SUMMARY, stub_bundle_runs
from tests.experiments.test_robustness import TINY

ARMS = {
    "stage1": ["no_stage1", "image_meanflow", "mixed_mae", "mixed_meanflow", "mixed_meanflow_dispersive",
               "paper_literal"],
    "decoder": ["concat_standard", "concat_cbam", "concat_fdconv", "daf_standard", "daf_cbam", "daf_fdconv"],
    "finetune": ["frozen", "last_block", "full"],
    "dispersive-weight": ["lambda_0.2", "lambda_1"],
}


def _ablation(name):
    return dispersive_weight_ablation([0.2, 1.0]) if name == "dispersive-weight" else name


@pytest.fixture(scope="module", params=list(ARMS))
def experiment(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(name.replace("-", "_"))
    data = {"dataset": "synthetic", "dataset_dir": str(out / "data"), "pretrained_weights": "none"}
    rows = run_ablation(out, _ablation(name), data, overrides=TINY)
    yield name, out, data, rows
    shutil.rmtree(out, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def _marker(out, stem, run, step):
    path = out / stem / run / f"{step}.done.json"
    return json.loads(path.read_text()) if path.is_file() else None


def test_one_row_per_arm_with_csv_figure_and_report(experiment):
    name, out, _, rows = experiment
    stem = ABLATIONS[name].stem
    assert [r["arm"] for r in rows] == ARMS[name]
    assert all(0.0 <= r["mDSC"] <= 1.0 for r in rows)
    with open(out / f"{stem}.csv") as f:
        assert [r["arm"] for r in csv.DictReader(f)] == ARMS[name]
    assert (out / f"{stem}.png").stat().st_size > 0
    text = (out / f"{stem}.md").read_text()
    assert text.startswith(f"## {ABLATIONS[name].title}: {RANDOM_INIT_NOTE}\n")  # pretrained_weights none
    assert all(f"| {arm} |" in text for arm in ARMS[name])
    assert "| mDSC (%) | mIoU (%) | HD95 (px, missed = diagonal) |" in text
    assert all(0.0 <= r["mIoU"] <= r["mDSC"] <= 1.0 for r in rows)
    # each row states where its encoder started, read from its models/model.json (no_stage1: pretrained_weights none)
    starts = {r["arm"]: r["encoder_start"] for r in rows}
    expected = {a: "random (pretrained_weights none)" if a == "no_stage1" else "Stage-1 export" for a in ARMS[name]}
    assert starts == expected
    assert "| encoder start |" in text and all(f"| {start} |" in text for start in starts.values())


def test_each_arm_runs_the_settings_it_names(experiment):
    name, out, _, _ = experiment
    stem = ABLATIONS[name].stem
    if name == "stage1":
        assert _marker(out, stem, "no_stage1", "stage1") is None
        assert _marker(out, stem, "no_stage1", "stage2")["overrides"]["encoder_init"] == "pretrained"
        assert _marker(out, stem, "mixed_mae", "stage1")["overrides"]["stage1_objective"] == "mae"
        image_only = _marker(out, stem, "image_meanflow", "stage1")["overrides"]
        assert image_only["mask_ratio"] == 0.0 and image_only["dispersive_weight"] == 0.0
        assert _marker(out, stem, "mixed_meanflow", "stage1")["overrides"]["dispersive_weight"] == 0.0
        assert _marker(out, stem, "mixed_mae", "stage2")["overrides"]["encoder_init"] == "stage1"
        default = _marker(out, stem, "mixed_meanflow_dispersive", "stage1")["overrides"]
        assert not {"dispersive_weight", *PAPER_LITERAL_STAGE1} & set(default)
        literal = _marker(out, stem, "paper_literal", "stage1")["overrides"]
        assert {k: literal[k] for k in PAPER_LITERAL_STAGE1} == {
            "latent_norm": False, "meanflow_adaptive_p": 0.0, "meanflow_ratio_unequal": 1.0,
            "dispersive_normalize": None,
        }  # fmt: skip
        assert "eqs. 1, 3, 5 as printed (t > s in every row)" in (out / f"{stem}.md").read_text()
        for arm in ARMS[name]:  # Table 2 is measured under Table 3's baseline decoder
            stage2 = _marker(out, stem, arm, "stage2")["overrides"]
            assert (stage2["fusion"], stage2["refine"]) == ("concat", "standard")
        # every Stage-1 variant trained its own encoder: the exports differ
        exports = [torch.load(out / stem / arm / "models" / "encoder_stage1.pt", weights_only=True)
                   for arm in ARMS[name][1:]]  # fmt: skip
        for i, a in enumerate(exports):
            for b in exports[i + 1 :]:
                assert any(not torch.equal(a[k], b[k]) for k in a)
    elif name in ("decoder", "finetune"):
        shared = str(out / stem / "stage1" / "models" / "encoder_stage1.pt")
        for arm in ARMS[name]:
            assert _marker(out, stem, arm, "stage1") is None
            assert _marker(out, stem, arm, "stage2")["overrides"]["stage1_encoder"] == shared
        key = "trainable_blocks" if name == "finetune" else "fusion"
        expected = [0, 1, "all"] if name == "finetune" else ["concat"] * 3 + ["daf"] * 3
        assert [_marker(out, stem, arm, "stage2")["overrides"][key] for arm in ARMS[name]] == expected
    else:
        weights = [_marker(out, stem, arm, "stage1")["overrides"]["dispersive_weight"] for arm in ARMS[name]]
        assert weights == [0.2, 1.0]


def test_second_call_does_no_training(experiment, monkeypatch):
    name, out, data, rows = experiment
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    titles = []
    monkeypatch.setattr(ablations_module, "save_figure", lambda fig, path: titles.append(fig.get_suptitle()))
    assert run_ablation(out, _ablation(name), data, overrides=TINY) == rows
    assert titles == [f"{ABLATIONS[name].title}: {RANDOM_INIT_NOTE}"]  # the figure says so too


def test_cli_maps_to_the_same_runs(experiment, monkeypatch):
    name, out, _, _ = experiment
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    argv = [name, "--output", str(out), "--dataset", "synthetic", "--dataset-dir", str(out / "data"),
            "--pretrained-weights", "none", "--precision", "fp32"]  # fmt: skip
    argv += [f"--override={k}={v}" for k, v in TINY.items() if k != "precision"]
    if name == "dispersive-weight":
        argv += ["--weights", "0.2", "1.0"]
    assert main(argv) == 0
    assert f"## {ABLATIONS[name].title}" in (out / "report.md").read_text()


def test_arms_subset_reuses_the_finished_runs(experiment, monkeypatch):
    name, out, data, rows = experiment
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    keep = ARMS[name][-1:]
    assert run_ablation(out, _ablation(name), data, overrides=TINY, arms=keep) == [r for r in rows if r["arm"] in keep]
    assert [r["arm"] for r in csv.DictReader(open(out / f"{ABLATIONS[name].stem}.csv"))] == keep


@pytest.mark.parametrize(
    "kwargs,match",
    [({"ablation": "unet"}, "ablation"), ({"ablation": "decoder", "scale": "huge"}, "scale"),
     ({"ablation": "decoder", "arms": ["daf_unet"]}, "arms"), ({"ablation": "decoder", "arms": []}, "arms")],
)  # fmt: skip
def test_bad_settings_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_ablation(tmp_path, data={"dataset": "synthetic"}, **kwargs)


@pytest.mark.parametrize("weights", [[], [-0.1], [True], ["0.4"]])
def test_bad_dispersive_weights_are_named(weights):
    with pytest.raises(ValueError, match="weights"):
        dispersive_weight_ablation(weights)


def test_cli_names_bad_weights(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["dispersive-weight", "--output", str(tmp_path), "--weights", "-0.5"])
    assert exit_info.value.code == 2 and "--weights" in capsys.readouterr().err


def test_cli_precision_choices_come_from_the_setting(tmp_path, capsys):
    # the one owner of the precision setting (spectraflow_monai.utils.precision.PRECISION_SETTINGS) gives the choices
    with pytest.raises(SystemExit) as exit_info:
        main(["dispersive-weight", "--output", str(tmp_path), "--precision", "fp8"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--precision" in err and "'auto', 'bf16', 'fp16', 'fp32'" in err


# ---------------------------------------------------------------- Table 2's decoder, the literal arm (no training)
STAGE1_ARMS = {arm.name: arm for arm in ABLATIONS["stage1"].arms}
DATA = {"dataset": "synthetic", "pretrained_weights": "none", "image_size": 112, "encoder_kwargs": {"depth": 2}}


@pytest.mark.parametrize("arm", ARMS["stage1"])
def test_stage1_arms_train_table3_baseline_decoder(arm):
    """Table 2's last row is Table 3's Baseline row: every Stage-1 arm trains Stage-2 with concat + standard."""
    assert {k: STAGE1_ARMS[arm].stage2[k] for k in ("fusion", "refine")} == {"fusion": "concat", "refine": "standard"}
    assert STAGE1_DECODERS["baseline"] == {"fusion": "concat", "refine": "standard"}
    assert next(iter(ABLATIONS["stage1"].decoders)) == "baseline"


@pytest.mark.parametrize("decoder", [None, "baseline", "full"])
@pytest.mark.parametrize("arm", ARMS["stage1"])
def test_stage2_run_of_each_decoder(tmp_path, arm, decoder):
    runner = ExperimentRunner(tmp_path, "stage1", {})
    run, settings = stage2_run(runner, ABLATIONS["stage1"], STAGE1_ARMS[arm], decoder)
    if decoder == "full":
        assert run == f"{arm}_full_decoder"
        assert {k: settings[k] for k in ("fusion", "refine")} == {"fusion": "daf", "refine": "fdconv"}
        own_export = str(tmp_path / "stage1" / arm / "models" / "encoder_stage1.pt")  # the arm's Stage-1, shared
        assert settings.get("stage1_encoder") == (None if arm == "no_stage1" else own_export)
    else:
        own = {} if arm == "no_stage1" else {"encoder_init": "stage1"}  # a Stage-1 row requires its export
        assert (run, settings) == (arm, {**STAGE1_ARMS[arm].stage2, **own})
    assert settings["encoder_init"] == ("pretrained" if arm == "no_stage1" else "stage1")


@pytest.mark.parametrize("decoder,stem,fusion", [(None, "stage1", "concat"), ("full", "stage1_full_decoder", "daf")])
def test_stage1_tables_name_the_decoder_and_carry_miou(tmp_path, monkeypatch, decoder, stem, fusion):
    calls = stub_bundle_runs(monkeypatch)
    rows = run_ablation(tmp_path, "stage1", DATA, decoder=decoder, arms=["no_stage1", "paper_literal"])
    stage2 = [c for c in calls if c["title"].endswith("/ stage2")]
    assert [c["settings"]["fusion"] for c in stage2] == [fusion, fusion]
    assert [r["mIoU"] for r in rows] == [SUMMARY["mIoU"]] * 2
    with open(tmp_path / f"{stem}.csv") as f:
        assert [float(r["mIoU"]) for r in csv.DictReader(f)] == [SUMMARY["mIoU"]] * 2
    text = (tmp_path / f"{stem}.md").read_text()
    assert "| mDSC (%) | mIoU (%) | HD95 (px, missed = diagonal) |" in text
    assert f"`fusion={fusion}`" in text and "| 81.25 | 68.75 | 12.50 |" in text
    assert ("Stage-2 decoder full (fusion daf, refine fdconv)" in text) == (decoder == "full")
    if decoder == "full":  # Stage-1 runs are shared with the baseline-decoder table: no second Stage-1
        assert not any("_full_decoder / stage1" in c["title"] for c in calls)


@pytest.mark.parametrize("ablation,decoder", [("stage1", "cbam"), ("decoder", "full"), ("finetune", "baseline")])
def test_bad_decoder_is_named(tmp_path, ablation, decoder):
    with pytest.raises(ValueError, match="decoder"):
        run_ablation(tmp_path, ablation, {"dataset": "synthetic"}, decoder=decoder)


@pytest.mark.parametrize("arm,all_unequal", [("paper_literal", True), ("mixed_meanflow_dispersive", False)])
def test_literal_arm_samples_t_greater_than_s_in_every_row(arm, all_unequal, tmp_path):
    """Eq. 3 is an expectation over t > s: the paper-literal Stage-1 loss (built from the bundle with the arm's
    overrides) draws s < t in every row; the default keeps MeanFlow's s = t in 75 % of the rows."""
    parser = bundle_parser(bundle_path("spectraflow_2d_segmentation"), list(STAGE1_ARMS[arm].stage1),
                           {**DATA, **STAGE1_ARMS[arm].stage1_overrides, "bundle_root": str(tmp_path)})  # fmt: skip
    loss = parser.get_parsed_content("stage1").meanflow_loss()
    t, s = loss.sample_times(256, generator=torch.Generator().manual_seed(0))
    assert bool((t > s).all()) == all_unequal and bool((s <= t).all())
    if not all_unequal:
        assert 0.15 < float((t > s).float().mean()) < 0.35
