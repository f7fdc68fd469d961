"""Tests of spectraflow_monai.utils.run_record: data fingerprints, the restart decision and the model settings beside
a model file (the bundles use them end to end in tests/bundles/test_run_records.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from spectraflow_monai.utils import SettingError
from spectraflow_monai.utils.checkpoint import CONTINUE, NEW, resume_checkpoint
from spectraflow_monai.utils.run_record import (
    RECORD_FILE,
    RECORD_FORMAT,
    ModelRecord,
    RecordedModel,
    check_model_digest,
    check_model_settings,
    data_fingerprint,
    decide_restart,
    file_digest,
    model_exports,
    model_settings_path,
    read_model_settings,
    record_components,
    record_finished,
    record_run,
    set_exports_aside,
    settings_digest,
    weights_mismatch,
    write_model_settings,
)
from spectraflow_monai.utils.settings import IMAGENET_MEAN, DataSettings, ModelSettings, Stage2Settings


def _datalist(folder, sizes):
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, size in enumerate(sizes):
        (folder / f"i{i}.png").write_bytes(b"x" * size)
        (folder / f"m{i}.png").write_bytes(b"y" * size)
        entries.append({"image": str(folder / f"i{i}.png"), "label": str(folder / f"m{i}.png"), "label_threshold": 128})
    return entries


def test_fingerprint_follows_the_files_not_their_folder(tmp_path):
    a = _datalist(tmp_path / "a", [3, 4])
    shutil.copytree(tmp_path / "a", tmp_path / "moved" / "b")
    moved = [{k: v.replace(str(tmp_path / "a"), str(tmp_path / "moved" / "b")) if isinstance(v, str) else v
              for k, v in e.items()} for e in a]  # fmt: skip
    assert data_fingerprint(a) == data_fingerprint(moved) and data_fingerprint(a)["items"] == 2
    assert data_fingerprint(list(reversed(a))) == data_fingerprint(a)  # order does not matter
    other = _datalist(tmp_path / "c", [3, 5])  # one label file of another size
    assert data_fingerprint(other) != data_fingerprint(a)
    assert data_fingerprint([{**a[0], "label_threshold": 1}, a[1]]) != data_fingerprint(a)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"settings": {"learning_rate": 0.001}}, "settings.learning_rate: recorded 0.0001, now 0.001"),
        ({"model": {"image_size": 448}}, "model.image_size: recorded 224, now 448"),
        ({"seed": 3}, "seed: recorded 0, now 3"),
        ({"precision": "bf16"}, "precision: recorded 'fp32', now 'bf16'"),
        ({"data_settings": {"label_map": {"2": 1}}}, "settings.data.label_map.2: recorded '<not set>', now 1"),
    ],
)
def test_a_restart_that_differs_is_named(tmp_path, change, named):
    data = {"train": _datalist(tmp_path / "d", [1, 2])}
    base = {"settings": {"learning_rate": 0.0001}, "data_settings": {"label_map": {"1": 1}},
            "model": {"image_size": 224}, "data": data, "seed": 0, "precision": "fp32"}  # fmt: skip
    record_run(tmp_path / "run", **base)
    torch.save({}, tmp_path / "run" / "checkpoint_epoch=1.pt")  # a run to continue
    record_run(tmp_path / "run", **base, not_compared={"max_epochs": 9})  # the same run: continues
    with pytest.raises(SettingError) as info:
        record_run(tmp_path / "run", **{**base, **change})
    text = str(info.value)
    assert named in text and "--run_settings#resume false" in text and "--bundle_root" in text
    # starting over keeps the earlier run (checkpoints and record) aside
    record_run(tmp_path / "run", **{**base, **change}, resume=False)
    assert len(list(tmp_path.glob("run.bak-*"))) == 1
    assert json.loads((tmp_path / "run" / RECORD_FILE).read_text())["seed"] == change.get("seed", 0)


# a finished run (epoch, max_epochs of its end) started again with max_epochs: continued, or a new run
@pytest.mark.parametrize(
    "ended, max_epochs, change, continues",
    [
        ((3, 3), 5, {}, True),  # ended at its max_epochs, given more: trains on
        ((3, 3), 3, {}, False),  # nothing left to train
        ((2, 5), 9, {}, False),  # stopped early: done whatever the budget
        ((3, 3), 5, {"seed": 1}, False),  # other settings (or data): nothing of it to continue, never refused
        ((3, 3), None, {}, True),  # a stage that does not tell its epochs: continued
    ],
)
def test_a_finished_run_is_continued_only_with_epochs_left(tmp_path, caplog, ended, max_epochs, change, continues):
    base = {"settings": {"learning_rate": 0.0001}, "seed": 0}
    record_run(tmp_path / "run", **base)
    torch.save({}, tmp_path / "run" / "checkpoint_epoch=3.pt")
    record_finished(tmp_path / "run", *ended)
    finished = json.loads((tmp_path / "run" / RECORD_FILE).read_text())["finished"]
    assert finished["stopped_early"] is (ended[0] < ended[1])
    record_run(tmp_path / "run", **{**base, **change}, max_epochs=max_epochs)
    assert (tmp_path / "run" / "checkpoint_epoch=3.pt").is_file() is continues
    assert len(list(tmp_path.glob("run.bak-*"))) == (0 if continues else 1)
    assert ("holds a finished run" in caplog.text) is not continues
    assert "finished" not in json.loads((tmp_path / "run" / RECORD_FILE).read_text())  # the new start's record
    with pytest.raises(SettingError, match="max_epochs must be a positive int"):
        record_run(tmp_path / "other", **base, max_epochs=0)


def test_a_run_recorded_before_new_fields_continues(tmp_path, caplog):
    """A run recorded before a field was added (model.architecture, settings.resolved) continues after an upgrade,
    with a warning naming them; a field it holds is still compared."""
    record_run(tmp_path / "run", Stage2Settings(), model={"image_size": 224})
    torch.save({}, tmp_path / "run" / "checkpoint_epoch=1.pt")
    model = ModelSettings(image_size=224)
    record_run(tmp_path / "run", Stage2Settings(), model=model, resolved={"encoder_start": "pretrained"})
    assert "model.architecture" in caplog.text and "settings.resolved" in caplog.text
    with pytest.raises(SettingError, match="model.image_size: recorded 224, now 448"):
        record_run(tmp_path / "run", Stage2Settings(), model=model.replace(image_size=448))


def test_data_settings_are_recorded_with_the_settings(tmp_path):
    """The run's data settings are recorded under settings.data, beside the stage's settings."""
    record_run(tmp_path / "run", {"learning_rate": 1}, data_settings={"hu_window": [-125, 275]})
    record = json.loads((tmp_path / "run" / RECORD_FILE).read_text())
    assert record["settings"] == {"learning_rate": 1, "data": {"hu_window": [-125, 275]}}


def test_settings_objects_are_recorded_whole(tmp_path):
    """The record is the settings objects written whole: every field, nothing listed by hand."""
    stage2, data, model = Stage2Settings(learning_rate=0.01), DataSettings(dataset="kvasir"), ModelSettings(
        image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.25, 0.25])
    record_run(tmp_path / "run", stage2, data_settings=data, model=model)
    record = json.loads((tmp_path / "run" / RECORD_FILE).read_text())
    assert record["settings"] == {**stage2.to_dict(), "data": data.to_dict()}
    assert record["model"] == model.to_dict() and record["model"]["image_mean"] == [0.5, 0.5, 0.5]
    assert set(record["settings"]) == {f.name for f in dataclasses.fields(Stage2Settings)} | {"data"}
    assert record["format"] == RECORD_FORMAT
    torch.save({}, tmp_path / "run" / "checkpoint_epoch=1.pt")
    with pytest.raises(SettingError, match=r"model.image_std: recorded \[0.25, 0.25, 0.25\], now \[0.229, 0.224, 0.225\]"):
        record_run(tmp_path / "run", stage2, data_settings=data, model=ModelSettings(image_mean=[0.5, 0.5, 0.5]))


def test_a_record_of_an_earlier_format_is_refused_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RECORD_FILE).write_text(json.dumps({"settings": {}, "spectraflow_monai": "0.0.9"}))
    torch.save({}, tmp_path / "run" / "checkpoint_epoch=1.pt")
    with pytest.raises(SettingError) as info:
        record_run(tmp_path / "run", Stage2Settings())
    assert "earlier record format" in str(info.value) and "--run_settings#resume false" in str(info.value)
    assert "\n" not in str(info.value)
    record_run(tmp_path / "run", Stage2Settings(), resume=False)  # starting over is allowed


def test_model_record_reads_the_normalisation(tmp_path, caplog):
    """A model trained with its own image_mean / image_std is read back with them; an earlier record without them
    reads as ImageNet's, with a warning."""
    model = tmp_path / "model.pt"
    torch.save({}, model)
    write_model_settings(model, ModelSettings(image_mean=[0.1, 0.2, 0.3], image_std=[0.4, 0.5, 0.6]))
    record = ModelRecord(model)
    assert (record.image_mean, record.image_std) == ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))
    assert record.settings == ModelSettings(image_mean=[0.1, 0.2, 0.3], image_std=[0.4, 0.5, 0.6])
    write_model_settings(model, {"image_size": 56, "num_classes": 9})  # written by an earlier version
    record = ModelRecord(model)
    assert record.image_mean == IMAGENET_MEAN and record.out_channels == 9 and "ImageNet" in caplog.text


def test_without_a_checkpoint_a_new_run_replaces_the_record(tmp_path):
    record_run(tmp_path / "run", {"learning_rate": 1})
    record_run(tmp_path / "run", {"learning_rate": 2})  # nothing to continue: a new run
    assert json.loads((tmp_path / "run" / RECORD_FILE).read_text())["settings"] == {"learning_rate": 2}
    assert len(list((tmp_path / "run").glob(f"{RECORD_FILE}.bak-*"))) == 1


def test_model_settings_beside_a_model_file(tmp_path):
    model = tmp_path / "model.pt"
    torch.save({}, model)
    assert model_settings_path(model) == str(tmp_path / "model.json")
    record = ModelRecord(model, defaults={"image_size": 224, "fusion": "daf"})  # no record yet: the defaults
    assert record.image_size == 224
    write_model_settings(model, {"image_size": 56, "encoder_kwargs": {"depth": 2}, "label_classes": [0, 1]})
    record = ModelRecord(model, defaults={"image_size": 224, "fusion": "daf"})
    assert (record.image_size, record.fusion, record.encoder_kwargs) == (56, "daf", {"depth": 2})
    record.check(image_size=56, encoder_kwargs={"depth": 2}, label_classes=(0, 1), fusion="concat")  # agree
    with pytest.raises(SettingError, match=r"(?s)image_size: 56 in the record, 112 given.*Leave these settings out"):
        record.check(image_size=112)
    with pytest.raises(SettingError, match=r"encoder_kwargs.depth: 2 in the record, 12 given"):
        check_model_settings(model, {"encoder_kwargs": {"depth": 12}})
    check_model_settings(tmp_path / "absent.pt", {"image_size": 1})  # no record: nothing to check


def test_model_record_takes_the_given_settings(tmp_path):
    model = tmp_path / "model.pt"
    torch.save({}, model)
    defaults = {"encoder_name": "vit_small_patch14_dinov2", "fusion": "daf"}
    # no record (an older model file): a given value is what the network is built with
    assert ModelRecord(model, defaults, given={"encoder_name": "vit_base_patch14_dinov2"}).encoder_name == (
        "vit_base_patch14_dinov2"
    )
    write_model_settings(model, {"encoder_name": "vit_small_patch14_dinov2", "fusion": "concat"})
    record = ModelRecord(model, defaults, given={"encoder_name": None, "fusion": "concat"})  # None: not given
    assert (record.encoder_name, record.fusion) == ("vit_small_patch14_dinov2", "concat")
    with pytest.raises(SettingError, match="fusion: 'concat' in the record, 'add' given"):
        ModelRecord(model, defaults, given={"fusion": "add"})


def test_an_earlier_record_reads_the_preprocessing_defaults_with_a_warning(tmp_path, caplog):
    """A Synapse model.json written before the preprocessing was recorded keeps working: the config's defaults
    (TransUNet's window, no label map) are assumed and named; a recorded one is read back, label map keys as ints."""
    model = tmp_path / "model.pt"
    torch.save({}, model)
    defaults = {"num_classes": 9, "out_channels": 9, "hu_window": [-125.0, 275.0], "label_map": None}
    write_model_settings(model, {"image_size": 56, "num_classes": 9, "out_channels": 9})
    record = ModelRecord(model, defaults=defaults)
    assert (record.hu_window, record.label_map, record.architecture) == ((-125.0, 275.0), None, "spectraflow")
    assert "hu_window [-125.0, 275.0], label_map None assumed" in caplog.text and "out_channels" not in caplog.text
    caplog.clear()
    write_model_settings(model, ModelSettings(num_classes=3, out_channels=3, hu_window=[-200, 300],
                                              label_map={0: 0, 1: 1, 6: 2}))  # fmt: skip
    record = ModelRecord(model, defaults=defaults)
    assert (record.hu_window, record.label_map) == ((-200.0, 300.0), {0: 0, 1: 1, 6: 2}) and not caplog.text
    record.check(label_map={0: 0, 1: 1, 6: 2})
    with pytest.raises(SettingError, match=r"label_map.6: 2 in the record, 3 given"):
        record.check(label_map={0: 0, 1: 1, 6: 3})


@pytest.mark.parametrize(
    "architecture, kwargs, taken, refused",
    [("spectraflow", None, 56, 64), ("unetpp", {"features": [4, 4, 8, 8, 16, 4]}, 64, 56),
     ("unet", {"channels": [4, 8, 16], "strides": [2, 2]}, 12, 6)],
)  # fmt: skip
def test_the_image_size_follows_the_architecture(architecture, kwargs, taken, refused):
    settings = ModelSettings(architecture=architecture, network_kwargs=kwargs, image_size=taken)
    assert settings.image_size == taken
    if architecture != "spectraflow":  # a baseline records no DINOv2 encoder
        assert (settings.encoder_name, settings.fusion, settings.refine) == (None, None, None)
    with pytest.raises(SettingError, match=f"image_size must be a positive int multiple of .* got {refused}"):
        ModelSettings(architecture=architecture, network_kwargs=kwargs, image_size=refused)


def _model(folder, weights=0.0, **settings):
    """``folder/model.pt`` (one tensor) with its record written after it, as training writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.pt"
    torch.save({"w": torch.full((3,), weights)}, model)
    write_model_settings(model, ModelSettings(image_size=56, **settings))
    return model


def test_the_record_holds_the_digests_of_its_model_and_settings(tmp_path):
    import hashlib

    model = _model(tmp_path)
    content = json.loads((tmp_path / "model.json").read_text())
    assert content["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest() == file_digest(model)
    assert content["settings_sha256"] == settings_digest(content["model"])
    canonical = json.dumps(content["model"], sort_keys=True).encode()
    assert content["settings_sha256"] == hashlib.sha256(canonical).hexdigest()
    check_model_digest(model)  # the pair training wrote
    assert ModelRecord(model).image_size == 56


@pytest.mark.parametrize("reader", [check_model_digest, ModelRecord])
def test_a_record_beside_another_model_file_is_refused_in_one_line(tmp_path, reader):
    model = _model(tmp_path / "a")
    retrained = _model(tmp_path / "b", weights=1.0)
    shutil.copy(retrained, model)  # a retrained model.pt beside the old model.json
    with pytest.raises(SettingError) as info:
        reader(model)
    message = str(info.value)
    assert "\n" not in message and str(model) in message and str(tmp_path / "a" / "model.json") in message
    assert "was written for another model.pt" in message
    assert "put the model.json its training wrote beside it" in message


@pytest.mark.parametrize("reader", [check_model_digest, ModelRecord, read_model_settings])
def test_an_edited_record_is_refused_in_one_line(tmp_path, reader):
    """A Synapse record whose label map was edited (1 and 5 swapped) with the model file left as it was."""
    model = _model(tmp_path, num_classes=9, out_channels=9, label_map={0: 0, 1: 1, 5: 5, 6: 6})
    record = tmp_path / "model.json"
    content = json.loads(record.read_text())
    content["model"]["label_map"] = {"0": 0, "1": 5, "5": 1, "6": 6}
    record.write_text(json.dumps(content, indent=2))
    with pytest.raises(SettingError) as info:
        reader(model)
    message = str(info.value)
    assert "\n" not in message and str(record) in message and "was edited after it was written" in message
    assert "put the model.json its training wrote" in message


def test_a_record_without_digests_is_read_with_a_warning(tmp_path, caplog):
    """A record of an earlier version (no model_sha256, no settings_sha256) keeps working, named once."""
    model = _model(tmp_path)
    record = tmp_path / "model.json"
    content = json.loads(record.read_text())
    del content["model_sha256"], content["settings_sha256"]
    record.write_text(json.dumps(content))
    check_model_digest(model)
    assert ModelRecord(model).image_size == 56
    assert caplog.text.count("holds no model_sha256") == 1 and caplog.text.count("holds no settings_sha256") == 1
    check_model_digest(tmp_path / "no_record.pt")  # no record: nothing to check


def test_a_record_written_before_its_model_file_has_no_model_digest(tmp_path, caplog):
    model = tmp_path / "model.pt"
    write_model_settings(model, ModelSettings())
    assert "model_sha256" not in json.loads((tmp_path / "model.json").read_text()) and "before its model" in caplog.text
    torch.save({}, model)
    check_model_digest(model)  # accepted, with the earlier-record warning
    assert "holds no model_sha256" in caplog.text


def test_the_exports_of_a_model_are_set_aside(tmp_path):
    model = _model(tmp_path)
    for name in ("model.onnx", "model_int8.onnx", "model.int8.onnx", "modelx.onnx", "other.onnx", "model.onnx.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "model-link.onnx").symlink_to(tmp_path / "other.onnx")
    assert [p.name for p in model_exports(model)] == ["model.int8.onnx", "model.onnx", "model_int8.onnx"]
    kept = set_exports_aside(model, "20260101-000000")
    assert sorted(p.name for p in kept) == [
        "model.int8.onnx.bak-20260101-000000", "model.onnx.bak-20260101-000000", "model_int8.onnx.bak-20260101-000000"
    ]  # fmt: skip
    assert model_exports(model) == [] and (tmp_path / "modelx.onnx").is_file() and (tmp_path / "other.onnx").is_file()


def test_weights_that_do_not_fit_the_record_are_named_in_one_line(tmp_path):
    error = RuntimeError('Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "a".')
    message = str(weights_mismatch(tmp_path / "model.pt", error))
    assert "\n" not in message and str(tmp_path / "model.json") in message
    assert 'Missing key(s) in state_dict: "a"' in message
    assert "put the model.json its training wrote beside it, or re-train" in message


def _finished_run(folder, ended=(3, 3)):
    record_run(folder, {"learning_rate": 0.0001}, seed=0)
    torch.save({}, folder / "checkpoint_epoch=3.pt")
    record_finished(folder, *ended)


# one decision (continue / new run / refuse), taken once and followed by the record and by the checkpoint loader
@pytest.mark.parametrize(
    "state, resume, max_epochs, action",
    [
        ("killed", True, 5, CONTINUE),  # a killed run (checkpoint, not finished): continues from its newest checkpoint
        ("finished", True, 3, NEW),  # a finished run with no epoch left: a new run
        ("finished", True, 5, CONTINUE),  # ended at its max_epochs, given more: trains on
        ("killed", False, 5, NEW),  # resume false: a new run, the earlier one set aside
        ("empty", True, 5, NEW),  # nothing to continue
    ],
)
def test_one_restart_decision_is_followed_by_record_and_checkpoint_loader(tmp_path, state, resume, max_epochs,
                                                                          action):  # fmt: skip
    run = tmp_path / "run"
    if state != "empty":
        _finished_run(run) if state == "finished" else record_run(run, {"learning_rate": 0.0001}, seed=0)
        torch.save({}, run / "checkpoint_epoch=3.pt")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    decided = decide_restart(run, None, resume=resume, max_epochs=max_epochs)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # deciding moves and writes nothing
    decision = record_run(run, {"learning_rate": 0.0001}, seed=0, resume=resume, max_epochs=max_epochs)
    assert decision.action == decided.action == action and decision.record["seed"] == 0
    # the checkpoint loader follows the record's decision: the checkpoint it names, or none (a new run)
    assert resume_checkpoint(decision) == (str(run / "checkpoint_epoch=3.pt") if action == CONTINUE else None)
    assert (run / "checkpoint_epoch=3.pt").is_file() is (action == CONTINUE)
    assert len(list(tmp_path.glob("run.bak-*"))) == (1 if action == NEW and state != "empty" else 0)


def test_a_run_with_other_settings_is_refused_before_anything_moves(tmp_path):
    run = tmp_path / "run"
    record_run(run, {"learning_rate": 0.0001}, seed=0)
    torch.save({}, run / "checkpoint_epoch=1.pt")
    with pytest.raises(SettingError, match="seed: recorded 0, now 1"):
        record_run(run, {"learning_rate": 0.0001}, seed=1)
    assert (run / "checkpoint_epoch=1.pt").is_file() and not list(tmp_path.glob("run.bak-*"))
    assert json.loads((run / RECORD_FILE).read_text())["seed"] == 0


def _adam(lr=1e-3):
    weight, bias = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.zeros(3))
    return torch.optim.Adam([{"params": [weight], "weight_decay": 2e-4}, {"params": [bias]}], lr=lr)


def test_the_optimizer_that_was_built_is_recorded_whole(tmp_path):
    """The record holds the optimizer object a run trains with (class, defaults, groups), whatever config built it;
    a run that continues with another one stops before training."""
    run = tmp_path / "run"
    decision = record_run(run, Stage2Settings(), seed=0)
    record = record_components(decision, optimizer=_adam())
    optimizer = record["components"]["optimizer"]
    assert optimizer["class"] == "torch.optim.adam.Adam" and optimizer["defaults"]["lr"] == 1e-3
    assert optimizer["param_groups"] == [{"parameters": 6, "weight_decay": 2e-4}, {"parameters": 3}]
    assert json.loads((run / RECORD_FILE).read_text())["components"] == record["components"]
    torch.save({}, run / "checkpoint_epoch=1.pt")
    decision = record_run(run, Stage2Settings(), seed=0)  # a restart: keeps the optimizer its record holds
    assert decision.continues and decision.record["components"] == record["components"]
    record_components(decision, optimizer=_adam())  # the same optimizer: continues
    with pytest.raises(SettingError, match=r"components.optimizer.class: recorded 'torch.optim.adam.Adam', now "
                                           r"'torch.optim.adamw.AdamW'"):  # fmt: skip
        record_components(decision, optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))]))
    with pytest.raises(SettingError, match=r"components.optimizer.defaults.lr: recorded 0.001, now 0.01"):
        record_components(decision, optimizer=_adam(lr=1e-2))
    with pytest.raises(ValueError, match="decision must be a RestartDecision"):
        record_components(str(run), optimizer=_adam())


def test_the_loss_that_was_built_is_recorded_by_its_classes(tmp_path):
    """A loss function is recorded by its class path and those of its parts (not its attributes, which a ramp
    changes while it trains); a continued run with another loss stops before training."""
    from monai.losses import DeepSupervisionLoss, DiceLoss

    run = tmp_path / "run"
    decision = record_run(run, Stage2Settings(), seed=0)
    loss = DeepSupervisionLoss(DiceLoss())
    record = record_components(decision, loss_function=loss)
    assert record["components"]["loss_function"] == {
        "class": "monai.losses.ds_loss.DeepSupervisionLoss",
        "modules": {"loss": {"class": "monai.losses.dice.DiceLoss"}},
    }
    torch.save({}, run / "checkpoint_epoch=1.pt")
    decision = record_run(run, Stage2Settings(), seed=0)
    record_components(decision, loss_function=DeepSupervisionLoss(DiceLoss(sigmoid=True)))  # the same classes
    with pytest.raises(SettingError, match=r"components.loss_function.class: recorded 'monai.losses.ds_loss."
                                           r"DeepSupervisionLoss', now 'monai.losses.dice.DiceLoss'"):
        record_components(decision, loss_function=DiceLoss())


def test_a_run_recorded_before_its_components_continues(tmp_path, caplog):
    run = tmp_path / "run"
    record_run(run, Stage2Settings(), seed=0)
    torch.save({}, run / "checkpoint_epoch=1.pt")
    decision = record_run(run, Stage2Settings(), seed=0)
    record_components(decision, optimizer=_adam())
    assert "components.optimizer" in caplog.text and decision.continues


@pytest.mark.parametrize(
    "start",
    [
        {"start": "stage1", "encoder_init": "auto", "weights": "models/encoder_stage1.pt", "weights_sha256": "ab"},
        {"start": "pretrained", "encoder_init": "pretrained", "weights": "timm"},
        {"start": "random", "encoder_init": "random", "weights": None},
        None,  # a network without an encoder: none recorded
    ],
)
def test_model_json_records_where_the_encoder_started(tmp_path, start):
    model = tmp_path / "model.pt"
    torch.save({}, model)
    unetpp = {"architecture": "unetpp", "encoder_name": None, "fusion": None, "refine": None, "image_size": 112}
    settings = ModelSettings(**({} if start is not None else unetpp))
    write_model_settings(model, RecordedModel(settings, start))
    content = json.loads((tmp_path / "model.json").read_text())
    assert content.get("encoder_start") == start and ("encoder_start" in content) is (start is not None)
    record = ModelRecord(model)  # beside the settings, never one of them: the settings read back whole
    assert record.encoder_start == start and record.settings == settings
    assert read_model_settings(model) == settings.to_dict()
    check_model_digest(model)


def test_a_model_record_without_an_encoder_start_still_loads(tmp_path):
    model = tmp_path / "model.pt"
    torch.save({}, model)
    write_model_settings(model, ModelSettings())  # as an earlier version wrote it
    assert "encoder_start" not in json.loads((tmp_path / "model.json").read_text())
    assert ModelRecord(model).encoder_start is None
