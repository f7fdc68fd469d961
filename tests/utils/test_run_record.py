"""Tests of spectraflow_monai.utils.run_record: data fingerprints, the restart decision and the model settings beside
a model file (the bundles use them end to end in tests/bundles/test_run_records.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from spectraflow_monai.utils import SettingError
from spectraflow_monai.utils.run_record import (
    RECORD_FILE,
    ModelRecord,
    check_model_settings,
    data_fingerprint,
    model_settings_path,
    record_run,
    write_model_settings,
)


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
        ({"data_settings": {"label_map": {"2": 1}}}, "settings.label_map.2: recorded '<not set>', now 1"),
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
    assert named in text and "--resume false" in text and "--bundle_root" in text
    # starting over keeps the earlier run (checkpoints and record) aside
    record_run(tmp_path / "run", **{**base, **change}, resume=False)
    assert len(list(tmp_path.glob("run.bak-*"))) == 1
    assert json.loads((tmp_path / "run" / RECORD_FILE).read_text())["seed"] == change.get("seed", 0)


def test_data_settings_are_recorded_with_the_settings(tmp_path):
    """A bundle's own data settings join the shared settings in the record; one name cannot have two values."""
    record_run(tmp_path / "run", {"learning_rate": 1}, data_settings={"hu_window": [-125, 275]})
    record = json.loads((tmp_path / "run" / RECORD_FILE).read_text())
    assert record["settings"] == {"learning_rate": 1, "hu_window": [-125, 275]}
    with pytest.raises(SettingError, match="data_settings 'learning_rate' = 2 contradicts settings 'learning_rate' = 1"):
        record_run(tmp_path / "other", {"learning_rate": 1}, data_settings={"learning_rate": 2})


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
