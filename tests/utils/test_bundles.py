from __future__ import annotations

import pytest

import spectraflow_monai.utils.bundles as bundles
from spectraflow_monai.utils import SettingError
from spectraflow_monai.utils.bundles import (
    BUNDLE_NAMES,
    bundle_command,
    bundle_config_files,
    bundle_path,
    check_run_configs,
)


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


def test_bundle_command_lists_the_configs(tmp_path):
    """The printed equivalent command names the bundle's configs from the bundle folder, other files by path."""
    extra = tmp_path / "my_baseline.yaml"
    extra.write_text("fusion: add\n")
    bundle = bundle_path("spectraflow_2d_segmentation")
    command = bundle_command(bundle, ["train.yaml", str(extra)], {"max_epochs": 2, "dataset": "kvasir"})
    files = f"['configs/train.yaml','{extra}']"
    # a setting named by its field is printed at its id, the command a user would type
    given = "--max_epochs 2 --data_settings#dataset kvasir"
    assert command == f'python -m monai.bundle run --config_file "{files}" {given}'


@pytest.mark.parametrize(
    "configs",
    [
        ["train.yaml"],
        ["train.yaml", "train_stage1.yaml"],
        ["train.yaml", "evaluate.yaml"],
        ["train.yaml", "train_stage1.yaml", "multi_gpu_train.yaml"],
        ["train.yaml", "multi_gpu_train.yaml"],
        ["train.yaml", "unetpp_baseline.yaml", "evaluate.yaml"],
        ["inference.yaml"],
        ["inference.yaml", "inference_onnx.yaml"],
    ],
)
def test_config_lists_that_run(configs):
    bundle = bundle_path("spectraflow_2d_segmentation")
    assert bundle_config_files(bundle, configs) == [bundle / "configs" / c for c in configs]


@pytest.mark.parametrize(
    "configs, problem",
    [
        (["evaluate.yaml"], "evaluate.yaml is layered over configs/train.yaml"),
        (["train_stage1.yaml", "train.yaml"], "train_stage1.yaml is layered over configs/train.yaml"),
        (["train.yaml", "multi_gpu_train.yaml", "train_stage1.yaml"], "out of order"),
        (["train.yaml", "evaluate.yaml", "unetpp_baseline.yaml"], "not last"),
        (["train.yaml", "train_stage1.yaml", "evaluate.yaml"], "separate runs"),
        (["inference.yaml", "evaluate.yaml"], "runs alone"),
        (["inference_onnx.yaml", "inference.yaml"], "inference_onnx.yaml is layered over configs/inference.yaml"),
        (["train.yaml", "no_such.yaml"], "no_such.yaml does not exist"),
        ([], "no config file"),
    ],
)
def test_a_config_list_that_cannot_run_is_one_line(configs, problem):
    """A wrong list names the problem and the commands that work, in one line."""
    with pytest.raises(SettingError) as info:
        bundle_config_files(bundle_path("spectraflow_2d_segmentation"), configs)
    text = str(info.value)
    assert problem in text and "\n" not in text and "['configs/train.yaml','configs/train_stage1.yaml']" in text


@pytest.mark.parametrize(
    "argv, fails",
    [
        (["/x/monai/bundle/__main__.py", "run", "--config_file", "configs/train.yaml"], False),
        (["/x/monai/bundle/__main__.py", "run", "--config_file", "['configs/train.yaml','configs/evaluate.yaml']"], False),
        (["/x/monai/bundle/__main__.py", "run", "--config_file", "['configs/train_stage1.yaml','configs/train.yaml']"], True),
        (["/x/monai/bundle/__main__.py", "run", "--config_file", "configs/train.yaml,configs/nosuch.yaml"], True),
        (["pytest", "--config_file", "['configs/train_stage1.yaml']"], False),  # not a monai.bundle command line
    ],
)
def test_check_run_configs_reads_the_command_line(monkeypatch, argv, fails):
    monkeypatch.chdir(bundle_path("spectraflow_2d_segmentation"))
    if fails:
        with pytest.raises(SettingError, match="the runs are"):
            check_run_configs(argv)
    else:
        check_run_configs(argv)
