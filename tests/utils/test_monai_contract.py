"""The parts of MONAI's bundle config the package relies on, stated as tests.

``setup.cfg`` bounds ``monai`` below the next minor version (``<1.7``): a newer MONAI is taken only when these tests
pass with it. The bundles build each settings object as a component whose arguments are its values
(``model_settings: {_target_: ...ModelSettings, image_size: 224}``), overridden at ``model_settings#image_size``,
read by other items as ``'@model_settings#<field>'`` (a sibling value) or ``'$@model_settings.<field>'`` (the
checked object); a layered config sets a value of an object of an earlier file with an ``a#b`` key
(``run_settings#stage1_epochs: 300`` in ``configs/train_stage1.yaml``); the serving configs name bound methods of
objects (``'$@pipeline.network()'``). Nothing reads MONAI's resolver state.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import monai
from monai.bundle import ConfigParser
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from spectraflow_monai.utils.settings import ModelSettings

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def _monai_requirement() -> SpecifierSet:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    lines = [ln.strip() for ln in config["options"]["install_requires"].splitlines()]
    return SpecifierSet(next(ln for ln in lines if ln.startswith("monai"))[len("monai"):])


def test_monai_is_bounded_below_the_next_minor_version():
    spec = _monai_requirement()
    assert Version("1.7.0") not in spec and Version("1.6.1") in spec, spec
    assert Version(monai.__version__.split("+")[0]) in spec, (monai.__version__, spec)


def test_a_settings_object_is_a_component_of_its_values():
    parser = ConfigParser({
        "model_settings": {"_target_": "spectraflow_monai.utils.settings.ModelSettings", "image_size": 28,
                           "fusion": "add", "out_channels": "@model_settings#num_classes", "num_classes": 3},
        "size": "$@model_settings.image_size",
        "raw": "@model_settings#fusion",
    })  # fmt: skip
    parser.update({"model_settings#image_size": 42})
    assert parser.get_parsed_content("size") == 42 and parser.get_parsed_content("raw") == "add"
    settings = parser.get_parsed_content("model_settings")
    assert isinstance(settings, ModelSettings) and settings.fusion == "add" and settings.out_channels == 3


def test_a_layered_file_sets_a_value_of_an_earlier_files_object(tmp_path):
    first, second = tmp_path / "train.yaml", tmp_path / "stage1.yaml"
    first.write_text("run_settings: {a: 1, b: 2}\n")
    second.write_text("run_settings#b: 3\n")
    merged = ConfigParser.load_config_files([str(first), str(second)])
    assert merged["run_settings"] == {"a": 1, "b": 3}


def test_a_component_can_name_a_bound_method_of_another():
    parser = ConfigParser({"settings": {"_target_": "spectraflow_monai.utils.settings.ModelSettings"},
                           "size": "$@settings.replace(image_size=56).image_size"})  # fmt: skip
    assert parser.get_parsed_content("size") == 56
