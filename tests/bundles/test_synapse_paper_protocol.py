"""The Synapse bundle's paper preset (configs/paper_protocol.yaml): all 18 training cases train, the test cases
validate, and the 2D bundle's Stage-2 settings apply (SpectraFlow, Sec. 5: consistent settings across datasets)."""

from __future__ import annotations

from pathlib import Path

from tests.bundles.helpers import parse_config

CONFIGS = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_synapse_segmentation" / "configs"
TRAIN, PAPER = str(CONFIGS / "train.yaml"), str(CONFIGS / "paper_protocol.yaml")
TWO_D = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_2d_segmentation" / "configs" / "train.yaml"
PHANTOM = {"cases": [5, 6, 40, 1, 2], "shape": [24, 24, 4], "spacing": [1.0, 1.0, 2.5]}


def _cases(parser, key: str) -> set[str]:
    return {d["case"] for d in parser.get_parsed_content(key)}


def test_paper_preset_trains_on_every_training_case_and_validates_on_the_test_cases(tmp_path):
    common = {"bundle_root": str(tmp_path), "image_size": 28, "progress_bar": False, "synthetic_size": PHANTOM}
    default = parse_config(TRAIN, **common)
    assert _cases(default, "train#datalist") == {"0005", "0006"} and _cases(default, "validate#datalist") == {"0040"}
    paper = parse_config([TRAIN, PAPER], **common)
    train, val = _cases(paper, "train#datalist"), _cases(paper, "validate#datalist")
    assert train == {"0005", "0006", "0040"}  # every training case of the phantom (TransUNet's list)
    assert val == {"0001", "0002"} and not train & val  # the test cases
    two_d = parse_config(str(TWO_D))
    for key in ("stage2_settings#batch_size", "run_settings#val_batch_size", "max_epochs", "stage2_settings#lr_patience",
                "run_settings#early_stop_patience", "stage2_settings#learning_rate"):
        assert paper.get_parsed_content(key) == two_d.get_parsed_content(key), key
