"""The experiments' command line: every option's help names its default (``--scale`` included, with what the
default scale sets), and the ``stage1`` table's Stage-2 decoder is an option."""

from __future__ import annotations

import argparse

import pytest

from spectraflow_monai.experiments.cli import EXPERIMENTS, build_parser, main
from tests.experiments.stubs import stub_bundle_runs

SUBS = build_parser()[1]


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_help_names_every_default(name, capsys):
    options = [a for a in SUBS[name]._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    unnamed = [a.option_strings[0] for a in options if not a.required and "default" not in a.help]
    assert unnamed == []
    scale = next(a for a in options if "--scale" in a.option_strings)
    assert scale.default == "small" and scale.help.startswith("default small; small: image_size 112")
    assert "max_epochs 8" in scale.help
    if name != "active-learning":  # its rounds run no Stage-1 (Stage-2 from pretrained_weights)
        assert "ema_decay 0.9" in scale.help
    with pytest.raises(SystemExit):
        main([name, "--help"])
    assert "default small" in capsys.readouterr().out


def test_stage1_decoder_option(tmp_path, monkeypatch):
    decoder = next(a for a in SUBS["stage1"]._actions if "--decoder" in a.option_strings)
    assert (decoder.default, decoder.choices) == ("baseline", ["baseline", "full"])
    assert not any("--decoder" in a.option_strings for n in ("decoder", "finetune") for a in SUBS[n]._actions)
    calls = stub_bundle_runs(monkeypatch)
    argv = ["stage1", "--output", str(tmp_path), "--dataset", "synthetic", "--pretrained-weights", "none",
            "--arms", "mixed_meanflow", "--decoder", "full"]  # fmt: skip
    assert main(argv) == 0
    stage2 = [c for c in calls if c["title"].endswith("/ stage2")]
    assert [(c["title"], c["settings"]["fusion"]) for c in stage2] == [
        ("stage1 / mixed_meanflow_full_decoder / stage2", "daf")
    ]  # fmt: skip
    assert "Stage-2 decoder full" in (tmp_path / "report.md").read_text()
