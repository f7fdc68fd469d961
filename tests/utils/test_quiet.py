"""The known-harmless library warnings are filtered, and only those."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from spectraflow_monai.utils.quiet import filter_known_warnings, trusted_bundle_configs
from tests.bundles.helpers import layered

CONFIG = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_2d_segmentation" / "configs" / "train.yaml"


def _monai_hd95_of_an_empty_prediction() -> None:
    from monai.metrics import HausdorffDistanceMetric

    gt = torch.zeros(1, 1, 8, 8)
    gt[..., 2:5, 2:5] = 1
    HausdorffDistanceMetric(include_background=True, percentile=95)(torch.zeros_like(gt), gt)


def _messages(filtered: bool, action) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if filtered:
            filter_known_warnings()
        action()
    return [str(w.message) for w in caught]


def test_known_library_warnings_are_filtered_and_others_are_not():
    assert any("is all 0" in m for m in _messages(False, _monai_hd95_of_an_empty_prediction))  # MONAI's own text
    assert not any("is all 0" in m for m in _messages(True, _monai_hd95_of_an_empty_prediction))

    def others():
        warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile`.", FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
        warnings.warn("the prediction is all wrong", UserWarning)

    assert _messages(True, others) == ["something else is deprecated", "the prediction is all wrong"]


def test_own_configs_parse_without_the_config_notice(tmp_path, monkeypatch):
    from monai.bundle import create_workflow

    monkeypatch.chdir(tmp_path)  # bundle_root '.': its first initialize steps make folders there

    def parse():  # what monai.bundle.run does first: the notice, then the workflow (its initialize stops here: no
        try:  # Stage-1 export in the working folder)
            meta = str(CONFIG.parent / "metadata.json")
            create_workflow(config_file=layered(CONFIG), meta_file=meta, logging_file=False)
        except RuntimeError:
            pass

    assert any("Only proceed if this config is from a source you trust" in m for m in _messages(False, parse))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with trusted_bundle_configs():
            parse()
    assert not any("source you trust" in str(w.message) for w in caught)


def test_monai_nvimagecodec_notices_are_filtered(caplog, monkeypatch):
    import logging

    from monai.transforms import LoadImage

    from spectraflow_monai.utils.quiet import KNOWN_HARMLESS_LOG_RECORDS

    name = KNOWN_HARMLESS_LOG_RECORDS[0][0]
    monkeypatch.setattr(logging.getLogger(name), "filters", [])  # as before any filter of this process
    caplog.set_level(logging.WARNING, logger=name)
    unfiltered = _messages(False, LoadImage)  # LoadImage registers every reader, NvImgCodecPydicomReader included
    if not any("nvImageCodec" in r.getMessage() for r in caplog.records):
        pytest.skip("this MONAI / pydicom / nvImageCodec set-up prints no nvImageCodec notice")
    assert any("nvImageCodec" in m for m in unfiltered)
    caplog.clear()
    filtered = _messages(True, LoadImage)
    assert not any("nvImageCodec" in m for m in filtered)
    assert not any("nvImageCodec" in r.getMessage() for r in caplog.records)
    logging.getLogger(name).warning("another notice")  # only the known record is dropped
    assert [r.getMessage() for r in caplog.records] == ["another notice"]
