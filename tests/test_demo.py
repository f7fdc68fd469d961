"""The embedded demo runs end to end (tiny settings) and its command line parses."""

import pytest
import torch

from spectraflow_monai import __main__ as cli
from spectraflow_monai.demo import run_demo


def test_demo_end_to_end(tmp_path):
    out = run_demo(
        output=tmp_path / "demo",
        num_train=8,
        num_val=4,
        image_size=28,
        stage1_epochs=1,
        stage2_epochs=1,
        batch_size=4,
        encoder_kwargs={"depth": 2},
    )
    eval_dir = tmp_path / "demo" / "eval"
    for name in ("metrics.csv", "summary.md", "report.md", "overlays.png", "curves.png"):
        assert (eval_dir / name).is_file(), name
    assert (tmp_path / "demo" / "models" / "encoder_stage1.pt").is_file()
    summary = out["summary"]
    assert summary["num_images"] == 4
    assert set(out["times"]) == {"data", "stage1", "stage2", "evaluate"}
    text = (eval_dir / "report.md").read_text()
    assert "mDSC" in text and "overlays.png" in text
    from spectraflow_monai.visualize.report import STAGE1_CURVES_NOTE

    stage1 = next(line for line in text.splitlines() if line.startswith("- Stage-1 ("))
    assert "`meanflow_error`" in stage1 and "`loss_dispersive`" in stage1 and "weighted" not in stage1
    assert STAGE1_CURVES_NOTE in text
    assert "Drawn on the 28x28 resize of each image, the size of its prediction" in text  # not a default 224


def test_cli_usage(capsys):
    assert cli.main([]) == 0
    assert "demo" in capsys.readouterr().out
    assert cli.main(["nope"]) == 2
    with pytest.raises(ValueError, match="multiple of 14"):
        run_demo(image_size=30)


def test_demo_precision_option(monkeypatch, tmp_path, caplog):
    from spectraflow_monai import demo

    calls = []

    def record(bundle, configs, overrides, title):
        calls.append(overrides)
        raise KeyboardInterrupt  # stop after the first stage's settings are known

    monkeypatch.setattr(demo, "run_bundle_configs", record)
    caplog.set_level("INFO", logger="spectraflow_monai.demo")
    with pytest.raises(KeyboardInterrupt):
        demo.main(["--output", str(tmp_path / "demo"), "--num-train", "2", "--num-val", "1", "--precision", "bf16"])
    assert calls[0]["precision"] == "bf16"
    assert "demo: precision: bf16" in caplog.text
    with pytest.raises(SystemExit):
        demo.main(["--precision", "half"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="precision='fp16' needs a CUDA device"):
            run_demo(output=tmp_path / "x", precision="fp16")  # checked before any work


def test_demo_resolves_the_precision_once(monkeypatch, tmp_path):
    """``auto`` is resolved by the demo, and every run gets the result: no run resolves ``auto`` again."""
    from spectraflow_monai import demo
    from spectraflow_monai.utils import resolve_precision

    calls = []

    def record(bundle, configs, overrides, title):
        calls.append(dict(overrides))
        if "evaluate.yaml" in configs:
            raise KeyboardInterrupt  # the last run: every run's settings are known
        return 0.0

    monkeypatch.setattr(demo, "run_bundle_configs", record)
    with pytest.raises(KeyboardInterrupt):
        run_demo(output=tmp_path / "demo", num_train=2, num_val=1, image_size=28, precision="auto")
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    decided = resolve_precision("auto", device, log=False).name
    assert [c["precision"] for c in calls] == [decided] * 3  # Stage-1, Stage-2, evaluation
    assert resolve_precision(decided, device, log=False).name == decided  # what each run resolves it to
