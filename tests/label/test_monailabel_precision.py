"""The ``precision`` setting in the MONAI Label app: ``--conf precision`` reaches every bundle's inference and
training as the bundle setting of the same name, and a training request may choose its own (checked like every
other option of ``lib.options.TRAIN_OPTIONS``)."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

from .test_monailabel_app import (  # noqa: E402,F401  (fixtures used by name)
    NAME_2D,
    NAME_3D,
    _app,
    _quiet_app,
    app_main,
    served,
)


def test_conf_precision_reaches_inference_and_training(served):
    app = _app(served["bundles"], served["studies"], precision="BF16")
    for name in (NAME_2D, NAME_3D):
        assert app._trainers[name].overrides["precision"] == "bf16"
        task = app._infers[name]
        assert task.overrides["precision"] == "bf16"
        inferer = task.inferer({"device": "cpu"})  # the bundle's inferer, built with the override
        assert type(inferer).__name__ == "AutocastInferer" and inferer.precision.name == "bf16"
        assert app._trainers[name].config()["precision"][0] == "bf16"  # what a client is offered first
    # left out: the bundles' own `auto`
    default = _app(served["bundles"], served["studies"])
    assert "precision" not in default._trainers[NAME_2D].overrides
    assert default._trainers[NAME_2D].config()["precision"][0] == "auto"


def test_bad_conf_precision_is_named(served):
    with pytest.raises(ValueError, match=r"--conf precision must be one of \['auto', 'bf16', 'fp16', 'fp32'\]"):
        _app(served["bundles"], served["studies"], precision="half")


@pytest.mark.parametrize(
    "value, expected",
    [("bf16", "bf16"), ("FP32", "fp32"), (["fp16", "auto", "bf16", "fp32"], "fp16"), ("auto", "auto")],
)
def test_request_precision_option(value, expected):
    assert app_main.check_train_options({"model": NAME_2D, "precision": value}) == {
        "model": NAME_2D,
        "precision": expected,
    }


@pytest.mark.parametrize("value", ["half", "", 16, None, ["fp8"]])
def test_bad_request_precision_is_refused(value):
    with pytest.raises(ValueError, match=r"train option 'precision' must be one of \['auto', 'bf16', 'fp16', 'fp32'\]"):
        app_main.check_train_options({"model": NAME_2D, "precision": value})


def test_request_precision_becomes_the_bundle_setting(served, monkeypatch):
    app = _app(served["bundles"], served["studies"], models=NAME_2D, precision="fp32")
    task = app._trainers[NAME_2D]
    seen = []

    def run_single_gpu(request, overrides):  # records the setting; the run's "best model" is the served one
        seen.append(overrides["precision"])
        best = overrides["run_settings#model_path"]  # the override at its id
        shutil.copy(os.path.join(task.bundle_path, "models", "model.pt"), os.path.dirname(best))

    monkeypatch.setattr(task, "run_single_gpu", run_single_gpu)
    monkeypatch.setattr(app, "check_train_data", lambda request=None: None)  # (recorded, not run: no labels)
    base = {"model": NAME_2D, "max_epochs": 1, "device": "cpu", "multi_gpu": False, "val_split": 0.0}
    app.train({**base, "precision": "bf16"})
    app.train(base)  # without the option: the app's --conf precision
    assert seen == ["bf16", "fp32"]
