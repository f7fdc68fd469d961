from __future__ import annotations

import json

import pytest

from spectraflow_monai.apps.seg2d import DataSource
from spectraflow_monai.utils.errors import SettingError

SIZE = {"num_train": 6, "num_val": 2, "size": 28}


def test_synthetic_source_generates_once_and_subsets_training_only(tmp_path):
    source = DataSource("synthetic", tmp_path / "syn", fraction=0.5, synthetic_size=SIZE)
    assert source.name == "synthetic"
    train, val = source.datalist("train"), source.datalist("val")
    assert len(train) == 3 and len(val) == 2  # the fraction applies to the training split only
    assert (tmp_path / "syn" / "images").is_dir()


@pytest.mark.parametrize(
    "dataset,json_path,name",
    [("folder", None, "folder"), ("kvasir", None, "kvasir"), ("synthetic", "d.json", "datalist")],
)
def test_source_name_picks_the_augmentation_key(dataset, json_path, name):
    assert DataSource(dataset, "/data", data_list_file_path=json_path).name == name


def test_unknown_source_is_refused_at_construction():
    with pytest.raises(SettingError, match="dataset must be one of"):
        DataSource("no_such_set", "/data")


def test_json_source_ignores_the_synthetic_size(tmp_path):
    """A datalist JSON is the source whatever `dataset` says: nothing is generated."""
    js = tmp_path / "d.json"
    js.write_text(json.dumps({"training": []}))
    source = DataSource("synthetic", None, data_list_file_path=js, synthetic_size=SIZE)
    assert source.name == "datalist" and "generate" not in source.options
