"""The 2D bundle's image transforms chosen by its settings: evaluation's test-time corruption (paper Fig. 5)."""

from __future__ import annotations

import pytest

from spectraflow_monai.apps.seg2d import evaluation_corruption
from spectraflow_monai.transforms import Corruptiond
from spectraflow_monai.utils.errors import SettingError


@pytest.mark.parametrize("corruption, severity, count", [(None, 1, 0), (None, 0, 0), ("contrast", 3, 1)])
def test_evaluation_corruption(corruption, severity, count):
    transforms = evaluation_corruption(corruption, severity)
    assert len(transforms) == count and all(isinstance(t, Corruptiond) for t in transforms)


@pytest.mark.parametrize(
    "corruption, severity, named",
    [("fog", 1, "corruption must be null or one of"), ("contrast", 6, "corruption_severity must be an int from 0 to 5"),
     (None, "2", "corruption_severity must be an int from 0 to 5, got '2'"), ("brightness", True, "corruption_severity")],
)  # fmt: skip
def test_evaluation_corruption_names_a_bad_setting(corruption, severity, named):
    with pytest.raises(SettingError, match=named):
        evaluation_corruption(corruption, severity)
