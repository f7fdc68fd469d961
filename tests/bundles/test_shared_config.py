"""The two bundles share their program, written once: ``bundles/common`` holds the Stage-2 program (``train.yaml``),
Stage-1 (``train_stage1.yaml``) and the multi-GPU override, linked into each bundle's ``configs/``; each bundle's own
``configs/train.yaml``, layered over the shared program, holds only its data (what differs). Each bundle fills every
reference of the shared configs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from monai.bundle import ConfigParser

from spectraflow_monai.utils.bundles import SHARED_CONFIGS, bundle_config_files, bundle_path

BUNDLES = Path(__file__).resolve().parents[2] / "bundles"
TWO_D, SYNAPSE = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"
# the same value in both bundles' own files, on purpose: each bundle documents its own choices of it
SAME_IN_BOTH = {"dataset"}
# the runs of each bundle (config names, layered by bundle_config_files)
RUNS = {
    TWO_D: [
        ["train.yaml"], ["train.yaml", "train_stage1.yaml"], ["train.yaml", "evaluate.yaml"],
        ["train.yaml", "train_stage1.yaml", "train_stage1_mae.yaml"], ["train.yaml", "unet_baseline.yaml"],
        ["train.yaml", "unetpp_baseline.yaml", "evaluate.yaml"], ["train.yaml", "unetpp_monai_baseline.yaml"],
        ["train.yaml", "multi_gpu_train.yaml"],
        ["train.yaml", "train_stage1.yaml", "multi_gpu_train.yaml"],
    ],
    SYNAPSE: [
        ["train.yaml"], ["train.yaml", "train_stage1.yaml"], ["train.yaml", "evaluate.yaml"],
        ["train.yaml", "paper_protocol.yaml"], ["train.yaml", "train_stage1.yaml", "paper_protocol.yaml"],
        ["train.yaml", "multi_gpu_train.yaml"], ["train.yaml", "train_stage1.yaml", "multi_gpu_train.yaml"],
    ],
}  # fmt: skip
# defined for Stage-1 by the multi-GPU override, read only when Stage-1 is layered too
STAGE1_ONLY = {"stage1_sampler"}
REFERENCE = re.compile(r"@([A-Za-z_][\w#]*)")


def _yaml(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def _lookup(config, key: str):
    """The value of config id ``key`` (``#``-separated, list items by index), or ``KeyError`` when it is not there."""
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
@pytest.mark.parametrize("link", SHARED_CONFIGS)
def test_shared_configs_are_links_to_one_file(bundle, link):
    """A link, not a copy: what both bundles share cannot drift apart (the installed package and MONAI Label's
    served copies hold the contents)."""
    path = BUNDLES / bundle / "configs" / link
    assert path.is_symlink(), f"{path} must be a link to ../../common/{SHARED_CONFIGS[link]}"
    assert path.resolve() == (BUNDLES / "common" / SHARED_CONFIGS[link]).resolve()


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_bundle_train_config_restates_nothing_shared(bundle):
    """A key of the bundle's train.yaml either adds what the shared program leaves to the bundle or changes it."""
    common, own = _yaml(BUNDLES / "common" / "train.yaml"), _yaml(BUNDLES / bundle / "configs" / "train.yaml")
    restated = [k for k in own if _lookup(common, k) is not KeyError and _lookup(common, k) == own[k]]
    assert not restated, f"{bundle}/configs/train.yaml restates the shared values of {restated}"


def test_the_bundles_own_files_share_nothing_but_documented_choices():
    a, b = (_yaml(BUNDLES / n / "configs" / "train.yaml") for n in (TWO_D, SYNAPSE))
    assert {k for k in a if k in b and a[k] == b[k]} == SAME_IN_BOTH


@pytest.mark.parametrize("bundle,configs", [(b, c) for b, runs in RUNS.items() for c in runs])
def test_every_reference_resolves_in_each_run(bundle, configs):
    """Every ``@id`` of the layered configs names an id the run defines (the bundle fills what the shared program
    leaves to it: datalists, loss, postprocessing, metrics, data_source, out_channels, data_settings, budget)."""
    parser = ConfigParser()
    parser.read_config([str(f) for f in bundle_config_files(BUNDLES / bundle, configs)])
    config = parser.get()
    used = {k: v for k, v in config.items() if "train_stage1.yaml" in configs or k not in STAGE1_ONLY}
    missing = sorted(r for r in _references(used) if _lookup(config, r) is KeyError)
    assert not missing, f"{bundle} {configs}: undefined references {missing}"


def test_layering_order_and_paths():
    bundle = bundle_path(TWO_D)
    files = bundle_config_files(bundle, ["train.yaml", "train_stage1.yaml", "train_stage1_mae.yaml"])
    configs = bundle / "configs"
    assert files == [
        configs / "common_train.yaml", configs / "train.yaml", configs / "train_stage1.yaml",
        configs / "train_stage1_mae.yaml",
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        bundle_config_files(bundle, ["train.yaml", "no_such.yaml"])


@pytest.mark.parametrize("state", ["missing", "link as text"])
def test_layering_names_a_missing_shared_config(tmp_path, state):
    configs = tmp_path / "b" / "configs"
    configs.mkdir(parents=True)
    (configs / "train.yaml").write_text("dataset: synthetic\n")
    if state == "link as text":  # a checkout without symbolic links
        (configs / "common_train.yaml").write_text("../../common/train.yaml")
    with pytest.raises(FileNotFoundError, match="common_train.yaml.*a link to ../../common/train.yaml.*core.symlinks"):
        bundle_config_files(tmp_path / "b", ["train.yaml"])
