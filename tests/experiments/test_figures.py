"""The figures experiment at its smallest scale, and the error spectrum on hand-made masks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import spectraflow_monai.experiments.runner as runner_module
from spectraflow_monai.experiments import run_ablation
from spectraflow_monai.experiments.figures import FIGURE_FILES, FIGURES_TITLE, error_spectrum, run_figures
from spectraflow_monai.experiments.runner import RANDOM_INIT_NOTE
from spectraflow_monai.visualize import paper_figures
from tests.experiments.test_robustness import TINY


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    data = {"dataset": "synthetic", "dataset_dir": str(out / "data"), "pretrained_weights": "none"}
    yield out, data, run_figures(out, data, overrides=TINY, num_images=2)
    shutil.rmtree(out, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def test_four_figures_and_the_report(experiment):
    out, _, result = experiment
    assert set(result["files"]) == set(FIGURE_FILES)
    for name in FIGURE_FILES.values():
        assert (out / name).stat().st_size > 0
    assert set(result["spread"]) == {"mixed_meanflow_dispersive", "mixed_meanflow"}
    assert all(len(bands) == 3 for bands in result["bands"].values())
    text = (out / "figures.md").read_text()
    assert "paper Figs. 1d, 3, 6, 7" in text and "| spectraflow |" in text and "| baseline |" in text


def test_runs_train_what_the_figures_need(experiment):
    out, _, _ = experiment
    stage1 = out / "stage1"  # the stage1 ablation's runs: the two Stage-1 variants, Stage-2 of the full one
    assert (stage1 / "mixed_meanflow" / "models" / "encoder_stage1.pt").is_file()
    assert not (stage1 / "mixed_meanflow" / "stage2.done.json").exists()
    # SpectraFlow: the default Stage-1 under the full DAF + FDConv decoder, beside the Table 2 arm's run
    full = json.loads((stage1 / "mixed_meanflow_dispersive_full_decoder" / "stage2.done.json").read_text())
    assert (full["overrides"]["fusion"], full["overrides"]["refine"]) == ("daf", "fdconv")
    assert full["overrides"]["stage1_encoder"] == str(stage1 / "mixed_meanflow_dispersive" / "models" /
                                                      "encoder_stage1.pt")  # fmt: skip
    assert (stage1 / "mixed_meanflow_dispersive_full_decoder" / "eval" / "clean" / "summary.json").is_file()
    assert not (stage1 / "mixed_meanflow_dispersive" / "stage2.done.json").exists()
    assert (out / "figures" / "baseline" / "eval" / "clean" / "summary.json").is_file()


def test_stage1_ablation_reuses_the_figures_runs(experiment, monkeypatch):
    out, data, _ = experiment
    ran = []
    real = runner_module.run_bundle_configs
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: ran.append(a[3]) or real(*a, **k))
    run_ablation(out, "stage1", data, overrides=TINY, decoder="full", arms=["mixed_meanflow_dispersive"])
    assert ran == []  # `stage1 --decoder full` of that arm is the figures' SpectraFlow run
    run_ablation(out, "stage1", data, overrides=TINY)  # Table 2's decoder: new Stage-2 runs on the same Stage-1 runs
    assert ran and not any(
        t.startswith(("stage1 / mixed_meanflow_dispersive / stage1", "stage1 / mixed_meanflow / stage1")) for t in ran
    )


def test_second_call_does_no_training(experiment, monkeypatch):
    out, data, result = experiment
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    titles = []
    monkeypatch.setattr(paper_figures, "save_figure", lambda fig, path: titles.append(fig.get_suptitle()) or path)
    again = run_figures(out, data, overrides=TINY, num_images=2)
    assert len(titles) == 4 and all(RANDOM_INIT_NOTE in t for t in titles)  # every figure says so in its title
    assert (out / "figures.md").read_text().startswith(f"## {FIGURES_TITLE}: {RANDOM_INIT_NOTE}\n")
    assert again["spread"] == result["spread"]
    assert {k: again["bands"][k] for k in ("spectraflow", "baseline")} == result["bands"]


def test_error_spectrum_of_known_masks():
    gt = np.zeros((16, 16), bool)
    gt[4:12, 4:12] = True
    centres, power = error_spectrum([gt], [gt], num_bins=8)
    assert len(centres) == 8 and np.all(power == 0)  # a perfect prediction has no error anywhere in the spectrum
    one = gt.copy()
    one[0, 0] = True  # one wrong pixel: a flat spectrum whose bins add up to one pixel (Parseval)
    _, power = error_spectrum([one], [gt], num_bins=8)
    assert power.sum() == pytest.approx(1.0, rel=1e-5)
    shifted = np.roll(gt, 3, axis=1)  # a displaced square: most of its error energy is at low frequency
    _, power = error_spectrum([shifted], [gt], num_bins=4)
    assert power[0] > power[-1]


@pytest.mark.parametrize(
    "kwargs,match",
    [({"scale": "huge"}, "scale"), ({"num_images": 0}, "num_images"),
     ({"overrides": {"label_classes": ["background", "a", "b"]}}, "label_classes")],
)  # fmt: skip
def test_bad_settings_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_figures(tmp_path, {"dataset": "synthetic"}, **kwargs)


def test_panel_and_bands_take_the_other_evaluated_stage1_arms(experiment, monkeypatch):
    out, data, result = experiment
    run_ablation(out, "stage1", data, overrides=TINY)  # finished in the test above, or trains the other arms now
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    again = run_figures(out, data, overrides=TINY, num_images=2)
    assert list(again["bands"]) == ["spectraflow", "baseline", "no_stage1", "image_meanflow", "mixed_mae",
                                    "mixed_meanflow", "mixed_meanflow_dispersive", "paper_literal"]  # fmt: skip
    text = (out / "figures.md").read_text()
    assert "| mixed_mae |" in text and "| model | mDSC (%) | mIoU (%) |" in text
