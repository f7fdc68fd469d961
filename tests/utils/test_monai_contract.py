"""The parts of MONAI the package relies on beyond its documented component calls, stated as tests.

``setup.cfg`` bounds ``monai`` below the next minor version (``<1.7``): a newer MONAI is taken only when these tests
pass with it. The bundles' settings objects read the top-level values of the config MONAI is resolving by field
name (``SettingsObject.from_bundle`` / ``utils.bundles.bundle_values``), through the ``ReferenceResolver`` that
resolves the config item; the serving configs name bound methods of objects (``'$@pipeline.network()'``).
"""

from __future__ import annotations

import configparser
from pathlib import Path

import monai
from monai.bundle import ConfigParser
from monai.bundle.reference_resolver import ReferenceResolver
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


def test_the_reference_resolver_holds_what_bundle_values_reads():
    assert callable(getattr(ReferenceResolver, "get_resolved_content", None))
    assert "items" in ReferenceResolver().__dict__


def test_a_settings_object_reads_the_top_level_values_being_resolved():
    parser = ConfigParser({
        "image_size": 28,
        "fusion": "add",
        "model_settings": {"_target_": "spectraflow_monai.utils.settings.ModelSettings.from_bundle"},
        "size": "$@model_settings.image_size",
    })
    parser.update({"image_size": 42})
    assert parser.get_parsed_content("size") == 42
    settings = parser.get_parsed_content("model_settings")
    assert isinstance(settings, ModelSettings) and settings.fusion == "add"
