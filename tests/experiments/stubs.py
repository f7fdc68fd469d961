"""A stand-in for the bundle runs of the experiments: records each step and writes an evaluation summary, so that an
experiment's arms, overrides and tables can be checked without training."""

from __future__ import annotations

import json
from pathlib import Path

import spectraflow_monai.experiments.runner as runner_module

#: the summary every stubbed evaluation writes (fractions; HD95 in pixels)
SUMMARY = {"mDSC": 0.8125, "mIoU": 0.6875, "hd95_monai_empty_as_diagonal": 12.5}


def stub_bundle_runs(monkeypatch) -> list[dict]:
    """Replace the experiments' bundle runs by a recorder; returns the list of ``{title, configs, settings}`` it
    fills. An evaluation step writes :data:`SUMMARY` into its ``output_dir``."""
    calls: list[dict] = []

    def fake_run(bundle, configs, settings, title):
        calls.append({"title": title, "configs": list(configs), "settings": dict(settings)})
        if configs[-1] == "evaluate.yaml":
            out = Path(settings["output_dir"])
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.json").write_text(json.dumps(SUMMARY))
        return 0.0

    monkeypatch.setattr(runner_module, "run_bundle_configs", fake_run)
    return calls
