import numpy as np
import pytest

from spectraflow_monai.utils import SettingError, check_image_size


@pytest.mark.parametrize("value", [224, 14, 56, np.int64(448)])
def test_valid_image_sizes(value):
    assert check_image_size(value) == int(value) and type(check_image_size(value)) is int


@pytest.mark.parametrize("value", ["abc", "224", 0, -14, 100, 224.0, True, None, [224]])
def test_invalid_image_size_names_setting_and_value(value):
    with pytest.raises(SettingError, match="image_size must be a positive int multiple of 14") as e:
        check_image_size(value)
    assert repr(value) in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="stage1_size"):
        check_image_size(value, name="stage1_size")
