"""Each bundle folder stands alone, as model-zoo bundles do: ``configs/train.yaml`` is the whole Stage-2 run,
Stage-1, evaluation and multi-GPU layer at most one more file after it, and no file is a link or a fragment. The
program both bundles share is Python (:mod:`spectraflow_monai.apps.stages`); the configs build one object of each
settings kind from their values."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
import yaml
from monai.bundle import ConfigParser

from spectraflow_monai.utils.bundles import bundle_config_files
from spectraflow_monai.utils.settings import DataSettings, ModelSettings, RunSettings, Stage1Settings, Stage2Settings

BUNDLES = Path(__file__).resolve().parents[2] / "bundles"
TWO_D, SYNAPSE = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"
# the runs of each bundle (config names, as their READMEs list them)
RUNS = {
    TWO_D: [
        ["train.yaml"], ["train.yaml", "train_stage1.yaml"], ["train.yaml", "evaluate.yaml"],
        ["train.yaml", "unet_baseline.yaml"], ["train.yaml", "unetpp_baseline.yaml", "evaluate.yaml"],
        ["train.yaml", "unetpp_monai_baseline.yaml"],
        ["train.yaml", "unetpp_zhou_literal_baseline.yaml", "evaluate.yaml"],
        ["train.yaml", "multi_gpu_train.yaml"], ["train.yaml", "train_stage1.yaml", "multi_gpu_train.yaml"],
        ["inference.yaml"], ["inference.yaml", "inference_onnx.yaml"],
    ],
    SYNAPSE: [
        ["train.yaml"], ["train.yaml", "train_stage1.yaml"], ["train.yaml", "evaluate.yaml"],
        ["train.yaml", "paper_protocol.yaml"], ["train.yaml", "paper_protocol.yaml", "train_stage1.yaml"],
        ["train.yaml", "multi_gpu_train.yaml"], ["train.yaml", "train_stage1.yaml", "multi_gpu_train.yaml"],
        ["inference.yaml"], ["inference.yaml", "inference_onnx.yaml"],
    ],
}  # fmt: skip
REFERENCE = re.compile(r"@([A-Za-z_][\w#]*)")
SETTINGS = {
    "model_settings": ModelSettings, "data_settings": DataSettings, "stage1_settings": Stage1Settings,
    "stage2_settings": Stage2Settings, "run_settings": RunSettings,
}  # fmt: skip
def _lookup(config, key: str):
    node = config
    for part in key.split("#"):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return KeyError
    return node


def _references(node) -> set[str]:
    if isinstance(node, str):
        return set(REFERENCE.findall(node))
    if isinstance(node, dict):
        return set().union(*(_references(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(_references(v) for v in node)) if node else set()
    return set()


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_a_bundle_folder_holds_plain_files_only(bundle):
    """No symbolic links: a copied or zipped folder, or a clone without core.symlinks, is the whole bundle."""
    links = [p for p in (BUNDLES / bundle).rglob("*") if p.is_symlink()]
    assert not links, links
    assert not (BUNDLES / "common").exists()


@pytest.mark.parametrize("bundle,configs", [(b, c) for b, runs in RUNS.items() for c in runs])
def test_every_reference_resolves_in_each_run(bundle, configs):
    """Every ``@id`` of a run's configs names an id the run defines, and no config patches a key (``a#b``) of
    another file but train.yaml."""
    parser = ConfigParser()
    parser.read_config([str(f) for f in bundle_config_files(BUNDLES / bundle, configs)])
    config = parser.get()
    missing = sorted(r for r in _references(config) if _lookup(config, r) is KeyError)
    assert not missing, f"{bundle} {configs}: undefined references {missing}"


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
@pytest.mark.parametrize("name", ["train.yaml", "inference.yaml"])
def test_standalone_configs_patch_nothing(bundle, name):
    """The configs that run alone define whole items (no ``a#b`` key that needs another file)."""
    with open(BUNDLES / bundle / "configs" / name) as f:
        keys = yaml.safe_load(f)
    assert not [k for k in keys if "#" in k], name


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
@pytest.mark.parametrize("key, kind", list(SETTINGS.items()))
def test_each_settings_object_is_a_component_of_its_values(bundle, key, kind):
    """The configs build each settings object as a MONAI component whose arguments are its values (no frame
    walking, no line per field elsewhere): every argument is a field, a setting given by its field name from Python
    reaches the object (``settings_overrides``), and so does one given at its id on the command line."""
    from spectraflow_monai.utils.bundles import setting_ids, settings_overrides

    files = [str(f) for f in bundle_config_files(BUNDLES / bundle, ["train.yaml", "train_stage1.yaml"])]
    parser = ConfigParser()
    parser.read_config(files)
    config = parser.get()
    assert config[key]["_target_"] == f"spectraflow_monai.utils.settings.{kind.__name__}"
    fields = {f.name for f in dataclasses.fields(kind)}
    assert set(config[key]) - {"_target_"} <= fields, set(config[key]) - fields
    ids = setting_ids(config)
    assert all(ids[name] in (name, f"{key}#{name}") for name in fields if ids.get(name, "").startswith(key)), ids
    values = {"encoder_kwargs": {"depth": 2}, "image_size": 28, "learning_rate": 0.003, "stage1_epochs": 3,
              "num_workers": 1, "data_seed": 5, "mask_ratio": 0.25}  # fmt: skip
    parser.update(settings_overrides(config, values))
    built = parser.get_parsed_content(key)
    assert isinstance(built, kind)
    for name in fields & set(values):
        assert getattr(built, name) == values[name], name


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
@pytest.mark.parametrize(
    "configs, bare, given, value",
    [
        ("['configs/train.yaml']", "image_size", "model_settings#image_size", "112"),
        ("['configs/inference.yaml']", "input_dir", "inference_settings#input_dir", "/data/images"),
        ("['configs/inference.yaml','configs/inference_onnx.yaml']", "output_dir", "inference_settings#output_dir",
         "/data/out"),
        ("['configs/inference.yaml']", "data_list_file_path", "inference_settings#data_list_file_path", "/d.json"),
    ],
)  # fmt: skip
def test_a_setting_given_by_its_bare_name_on_the_command_line_is_refused(bundle, configs, bare, given, value):
    """``--image_size 112`` (``--input_dir /data``) would add a top-level id that nothing reads (MONAI keeps any
    override): the run's first step refuses it naming the id to give."""
    from spectraflow_monai.utils.bundles import check_run_configs
    from spectraflow_monai.utils.errors import SettingError

    argv = ["python", "-m", "monai.bundle", "run", "--config_file", configs, f"--{bare}", value]
    cwd = os.getcwd()
    os.chdir(BUNDLES / bundle)
    try:
        with pytest.raises(SettingError, match=rf"--{bare} is not read by this config; give --{given}\."):
            check_run_configs(argv)
        check_run_configs(argv[:-2] + [f"--{given}", value, "--dataset_dir", "/data"])
    finally:
        os.chdir(cwd)


def test_the_stage1_and_multi_gpu_configs_are_references_only():
    """What both bundles share is Python: their Stage-1 and multi-GPU files hold references, no program."""
    for name in ("train_stage1.yaml", "multi_gpu_train.yaml"):
        texts = [(BUNDLES / b / "configs" / name).read_text() for b in (TWO_D, SYNAPSE)]
        assert texts[0] == texts[1], name
        lines = [ln for ln in texts[0].splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        program = [ln for ln in lines if re.search(r"[@$]|_target_", ln)]  # the rest: Stage-1's value lines
        assert len(program) <= 30, (name, len(program))


STAGE2_VALUES = {"learning_rate": 3e-4, "weight_decay": 0.02, "boundary_beta": 0.05, "boundary_beta_max": 0.3,
                 "boundary_ramp_epochs": 7}  # fmt: skip


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_the_stage2_optimizer_and_loss_are_the_records(bundle, tmp_path):
    """Stage-2's optimizer and loss are built from stage2_settings, which the run record writes whole: non-default
    values reach the running objects; a value set on the component itself is refused in one line."""
    from spectraflow_monai.utils.errors import SettingError
    from tests.bundles.helpers import parse_config

    train = str(BUNDLES / bundle / "configs" / "train.yaml")
    common = {"bundle_root": str(tmp_path), "encoder_kwargs": {"depth": 2}, "image_size": 28}
    parser = parse_config(train, **common, **STAGE2_VALUES)
    settings = parser.get_parsed_content("stage2_settings")
    optimizer, loss = parser.get_parsed_content("train#optimizer"), parser.get_parsed_content("train#loss")
    assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [(3e-4, 0.02)]
    assert (settings.learning_rate, settings.weight_decay) == (3e-4, 0.02)
    assert (loss.beta_start, loss.beta_max, loss.ramp_epochs) == (0.05, 0.3, 7)
    assert (settings.boundary_beta, settings.boundary_beta_max, settings.boundary_ramp_epochs) == (0.05, 0.3, 7)
    parser = parse_config(train, **common, **{"train#optimizer#lr": 0.01})
    with pytest.raises(Exception) as info:
        parser.get_parsed_content("train#optimizer")
    text = str(info.value.__cause__ or info.value)
    assert "train#optimizer#lr=0.01 (give --stage2_settings#learning_rate instead)" in text and isinstance(
        info.value.__cause__ or info.value, SettingError
    )


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_the_training_network_is_the_model_settings(bundle, tmp_path):
    """train.yaml's network_def is built from model_settings (what model.json records) and Stage-2's trainable
    blocks; a value set on network_def itself is refused in one line naming the settings to give."""
    from spectraflow_monai.networks import SpectraFlowNet
    from spectraflow_monai.utils.errors import SettingError
    from tests.bundles.helpers import parse_config

    train = str(BUNDLES / bundle / "configs" / "train.yaml")
    common = {"bundle_root": str(tmp_path), "encoder_kwargs": {"depth": 2}, "image_size": 42, "fusion": "concat",
              "trainable_blocks": "all", "pretrained_weights": "none"}  # fmt: skip
    parser = parse_config(train, **common)
    network, model = parser.get_parsed_content("network_def"), parser.get_parsed_content("model_settings")
    assert isinstance(network, SpectraFlowNet) and network.encoder.img_size == model.image_size == 42
    assert model.fusion == "concat" and all(p.requires_grad for p in network.encoder.parameters())
    parser = parse_config(train, **common, **{"network_def#img_size": 56})
    with pytest.raises(Exception) as info:
        parser.get_parsed_content("network_def")
    error = info.value.__cause__ or info.value
    assert isinstance(error, SettingError) and "network_def#img_size=56" in str(error)
    assert "--model_settings#<field>: image_size" in str(error)


def _code_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_each_train_yaml_holds_values_data_transforms_and_references():
    """The sizes the shared program moved to Python keeps: each ``train.yaml`` at most 400 lines, at most 150
    distinct lines (not blank, not a comment) that the two bundles' files both hold, and at most 10 lines that only
    forward a value under its own name (``x: '@x'``: the settings objects hold their values; only MONAI's ids that
    MONAI Label sets or MONAI's checks look for at the top level, ``bundle_root``, ``device``, ``dataset_dir``, and
    the ``precision`` that evaluation reads too, are read by reference)."""
    texts = {b: (BUNDLES / b / "configs" / "train.yaml").read_text() for b in (TWO_D, SYNAPSE)}
    forward = re.compile(r"""^\s+([A-Za-z0-9_]+): *'@\1' *(#.*)?$""")
    for bundle, text in texts.items():
        assert len(text.splitlines()) <= 400, bundle
        forwarded = [m.group(1) for m in map(forward.match, text.splitlines()) if m]
        assert len(forwarded) <= 10, (bundle, forwarded)
    shared = set(_code_lines(texts[TWO_D])) & set(_code_lines(texts[SYNAPSE]))
    assert len(shared) <= 150, len(shared)


def test_the_synapse_serving_configs_forward_at_most_10_values():
    """Evaluation and inference of the Synapse bundle spread no value into ids and gather none back: together they
    hold at most 10 lines that forward a value under its own name (``x: '@x'``): MONAI's wiring of its evaluator
    (``device``, ``network``, ``inferer``, ``postprocessing``, ``dataset``: the properties ``check_properties`` looks
    for) and the few values read in two places; what inference segments and writes is one settings object."""
    forward = re.compile(r"""^\s+([A-Za-z0-9_]+): *'@\1' *(#.*)?$""")
    forwarded = {
        name: [m.group(1) for m in map(forward.match, (BUNDLES / SYNAPSE / "configs" / name).read_text().splitlines())
               if m]
        for name in ("evaluate.yaml", "inference.yaml", "inference_onnx.yaml")
    }  # fmt: skip
    assert sum(map(len, forwarded.values())) <= 10, forwarded


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
@pytest.mark.parametrize("config", ["evaluate.yaml", "inference.yaml"])
def test_serving_configs_read_the_record_as_one_object(bundle, config):
    """Evaluation and inference take the model's pipeline from ``models/model.json`` whole
    (``ModelPipeline.from_record``): no id per recorded field (``'$@model_record.<field>'``), no gather-back check of
    the transforms' values (``check_model_settings``), and every preprocessing step is the pipeline's."""
    text = (BUNDLES / bundle / "configs" / config).read_text()
    assert "$@model_record." not in text and "check_model_settings" not in text
    assert "spectraflow_monai.apps.pipelines.ModelPipeline.from_record" in text
    # no model setting is an id of its own here, nor forwarded: a value given is an entry of `model_settings`
    fields = {f.name for f in dataclasses.fields(ModelSettings)}
    assert not fields & set(yaml.safe_load(text)), sorted(fields & set(yaml.safe_load(text)))
    forwarded = re.findall(r"""^\s*([A-Za-z0-9_]+): *'@\1'""", text, flags=re.M)
    assert not fields & set(forwarded), forwarded
    for transform in ("NormalizeIntensityd", "Resized", "CTWindowd", "RepeatChanneld"):
        assert f"_target_: {transform}" not in text, transform
