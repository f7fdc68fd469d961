"""The simulated labelling experiment (``spectraflow experiment active-learning``) on a generated synthetic set."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

import spectraflow_monai.experiments.runner as runner_module
from spectraflow_monai.experiments.active_learning import (
    ACTIVE_LEARNING_TITLE,
    run_active_learning,
    select_images,
)
from spectraflow_monai.experiments.cli import main as experiment_main
from spectraflow_monai.experiments.runner import RANDOM_INIT_NOTE
from spectraflow_monai.utils.errors import SettingError
from tests.experiments.stubs import SUMMARY, stub_bundle_runs
from tests.experiments.test_robustness import TINY

SYNTH = {"num_train": 6, "num_val": 2}
BUDGET = {"initial": 2, "query": 2, "rounds": 1, "pool_size": 6, "val_size": 2}


def _data(out):
    return {"dataset": "synthetic", "dataset_dir": str(out / "data"), "pretrained_weights": "none"}


@pytest.mark.parametrize(
    "strategy,scores,expected",
    [
        ("uncertainty", {"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.9}, ["b", "d"]),  # highest first, ties in pool order
        ("random", None, None),
    ],
)
def test_select_images(strategy, scores, expected):
    chosen = select_images(strategy, ["a", "b", "c", "d"], 2, seed=3, scores=scores)
    if expected is not None:
        assert chosen == expected
    else:  # seeded: the same draw again, two different images of the pool
        assert chosen == select_images(strategy, ["a", "b", "c", "d"], 2, seed=3) and len(set(chosen)) == 2
    assert select_images(strategy, ["a"], 5, seed=0, scores=scores and {"a": 1.0}) == ["a"]


@pytest.mark.parametrize(
    "args,match",
    [
        (("entropy", ["a"], 1, 0), "strategy"),
        (("random", ["a"], 0, 0), "k must"),
        (("uncertainty", ["a", "b"], 1, 0, {"a": 1.0}), "score for every"),
    ],
)
def test_select_images_refuses(args, match):
    with pytest.raises(ValueError, match=match):
        select_images(*args)


@pytest.fixture(scope="module")
def uncertainty_run(tmp_path_factory):
    """One real arm: Stage-2 on 2 labelled images, the pool scored by its model, 2 more labelled, Stage-2 again."""
    out = tmp_path_factory.mktemp("active_learning")
    overrides = {**TINY, "synthetic_size": SYNTH}
    rows = run_active_learning(out, _data(out), strategies=["uncertainty"], seeds=[0], budget=BUDGET,
                               overrides=overrides)  # fmt: skip
    yield out, overrides, rows
    shutil.rmtree(out, ignore_errors=True)


@pytest.mark.slow
def test_uncertainty_arm_labels_the_highest_scores(uncertainty_run):
    out, _, rows = uncertainty_run
    assert [(r["strategy"], r["round"], r["labelled"]) for r in rows] == [("uncertainty", 0, 2), ("uncertainty", 1, 4)]
    assert all(0.0 <= r["mDSC"] <= 1.0 for r in rows)
    root = out / "active_learning"
    selection = json.loads((root / "uncertainty_seed0_round0" / "selection.json").read_text())
    assert len(selection["chosen"]) == 2 and all(0.0 <= s <= 1.0 for s in selection["scores"].values())
    assert min(selection["scores"].values()) >= selection["pool_mean_score"] - 1e-9  # the most uncertain of the pool
    first = json.loads(next((root / "uncertainty_seed0_round0").glob("datalist-*.json")).read_text())
    second = json.loads(next((root / "uncertainty_seed0_round1").glob("datalist-*.json")).read_text())
    names = [e["name"] for e in second["training"]]
    assert names == [e["name"] for e in first["training"]] + selection["chosen"]
    assert second["validation"] == first["validation"] and second["test"] == first["test"]
    text = (out / "active_learning.md").read_text()
    assert text.startswith(f"## {ACTIVE_LEARNING_TITLE}: {RANDOM_INIT_NOTE}\n") and "| 4 | uncertainty |" in text
    assert (out / "active_learning.png").stat().st_size > 0


@pytest.mark.slow
def test_second_call_trains_and_scores_nothing(uncertainty_run, monkeypatch):
    out, overrides, rows = uncertainty_run
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    import spectraflow_monai.experiments.active_learning as al

    monkeypatch.setattr(al, "_score_pool", lambda *a, **k: pytest.fail("scored again"))
    again = run_active_learning(out, _data(out), strategies=["uncertainty"], seeds=[0], budget=BUDGET,
                                overrides=overrides)  # fmt: skip
    assert again == rows


def test_random_arms_table(tmp_path, monkeypatch):
    calls = stub_bundle_runs(monkeypatch)
    rows = run_active_learning(tmp_path, _data(tmp_path), strategies=["random"], seeds=[0, 1], budget=BUDGET,
                               overrides={"synthetic_size": SYNTH})  # fmt: skip
    assert [(r["seed"], r["labelled"]) for r in rows] == [(0, 2), (0, 4), (1, 2), (1, 4)]
    assert all(c["settings"]["encoder_init"] == "pretrained" for c in calls)  # no Stage-1 per round
    assert {c["settings"]["data_seed"] for c in calls} == {0, 1}
    with open(tmp_path / "active_learning.csv") as f:
        assert [float(r["mDSC"]) for r in csv.DictReader(f)] == [SUMMARY["mDSC"]] * 4
    table = (tmp_path / "active_learning.md").read_text()
    assert "| 4 | random | 81.25 [81.25, 81.25] | 68.75 [68.75, 68.75] |" in table


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"scale": "huge"}, "scale"),
        ({"strategies": ["entropy"]}, "strategies"),
        ({"seeds": []}, "seeds"),
        ({"budget": {"queries": 3}}, "budget may set"),
        ({"budget": {"query": 0}}, "query must"),
        ({"budget": {"initial": 5, "rounds": 2, "query": 2, "pool_size": 6}}, "pool holds 6"),
    ],
)
def test_bad_settings_are_named(tmp_path, monkeypatch, kwargs, match):
    stub_bundle_runs(monkeypatch)
    with pytest.raises(ValueError, match=match):
        run_active_learning(tmp_path, _data(tmp_path), overrides={"synthetic_size": SYNTH}, **kwargs)


def test_cli_budget_error_is_one_line(tmp_path, monkeypatch, capsys):
    stub_bundle_runs(monkeypatch)
    argv = ["active-learning", "--output", str(tmp_path), "--dataset", "synthetic", "--pretrained-weights", "none",
            "--pool-size", "3", "--override", "synthetic_size={num_train: 6, num_val: 2}"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        experiment_main(argv)
    assert exit_info.value.code == 2
    assert "error: initial 8 + rounds 3 x query 8 = 32 labels, but the pool holds 3" in capsys.readouterr().err
    assert issubclass(SettingError, ValueError)


def test_help_names_every_default(capsys):
    with pytest.raises(SystemExit):
        experiment_main(["active-learning", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("default kvasir", "default small", "default: random uncertainty", "default 0 1",
                   "small 8, full 20", "small 3, full 5", "small 160, full all", "small 40, full all"):  # fmt: skip
        assert phrase in text, phrase
