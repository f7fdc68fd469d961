from __future__ import annotations

import pytest

import spectraflow_monai.utils.bundles as bundles
from spectraflow_monai.utils.bundles import BUNDLE_NAMES, bundle_command, bundle_path


@pytest.mark.parametrize("name", ["spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"])
def test_bundle_path_finds_the_bundles(name):
    assert (bundle_path(name) / "configs" / "metadata.json").is_file()


def test_bundle_path_finds_the_monailabel_app():
    assert (bundle_path("monailabel_app") / "main.py").is_file()


def test_bundle_path_rejects_unknown_names():
    with pytest.raises(ValueError, match="no_such_bundle"):
        bundle_path("no_such_bundle")


def test_bundle_path_prefers_the_installed_copy(tmp_path, monkeypatch):
    """A wheel install has spectraflow_monai/bundles/<name>; it wins over a clone's bundles/ folder."""
    package = tmp_path / "site" / "spectraflow_monai"
    (package / "utils").mkdir(parents=True)
    (package / "bundles" / BUNDLE_NAMES[0]).mkdir(parents=True)
    (tmp_path / "site" / "bundles" / BUNDLE_NAMES[0]).mkdir(parents=True)
    monkeypatch.setattr(bundles, "__file__", str(package / "utils" / "bundles.py"))
    assert bundle_path() == package / "bundles" / BUNDLE_NAMES[0]


def test_bundle_path_names_both_places_when_missing(tmp_path, monkeypatch):
    (tmp_path / "spectraflow_monai" / "utils").mkdir(parents=True)
    monkeypatch.setattr(bundles, "__file__", str(tmp_path / "spectraflow_monai" / "utils" / "bundles.py"))
    with pytest.raises(FileNotFoundError, match="installed package.*clone"):
        bundle_path("spectraflow_synapse_segmentation")


def test_bundle_command_lists_the_layered_configs(tmp_path):
    """The printed equivalent command names the bundle's configs from the bundle folder, other files by path."""
    extra = tmp_path / "my_baseline.yaml"
    extra.write_text("fusion: add\n")
    bundle = bundle_path("spectraflow_2d_segmentation")
    command = bundle_command(bundle, ["train.yaml", str(extra)], {"max_epochs": 2, "dataset": "kvasir"})
    files = f"['configs/common_train.yaml','configs/train.yaml','{extra}']"
    assert command == f'python -m monai.bundle run --config_file "{files}" --max_epochs 2 --dataset kvasir'
