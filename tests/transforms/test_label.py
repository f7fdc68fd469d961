import numpy as np
import pytest
import torch
from monai.data import MetaTensor

from spectraflow_monai.transforms import BinarizeLabel, BinarizeLabeld
from spectraflow_monai.utils.errors import DataError


def test_rgb_jpeg_mask_reduced_and_thresholded():
    x = MetaTensor(torch.tensor([[[0.0, 100.0, 128.0, 255.0]]]).repeat(3, 1, 1), meta={"filename_or_obj": "m.jpg"})
    x[0, 0, 1] = 130  # channels (130, 100, 100): mean 110 -> background; first and max -> foreground
    out = BinarizeLabel()(x)
    assert isinstance(out, MetaTensor) and out.meta["filename_or_obj"] == "m.jpg"
    assert out.shape == (1, 1, 4) and out.dtype == torch.float32
    assert out.tolist() == [[[0.0, 0.0, 1.0, 1.0]]]
    assert BinarizeLabel(channel_reduction="first")(x).tolist() == [[[0.0, 1.0, 1.0, 1.0]]]
    assert BinarizeLabel(channel_reduction="max")(x).tolist() == [[[0.0, 1.0, 1.0, 1.0]]]
    per_channel = BinarizeLabel(channel_reduction=None)(x)
    assert per_channel.shape == (3, 1, 4) and per_channel[:, 0, 1].tolist() == [1.0, 0.0, 0.0]


def test_numpy_instance_labels():
    out = BinarizeLabel(threshold=1, dtype=np.uint8)(np.array([[[0, 1, 7, 40]]], dtype=np.uint8))
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.tolist() == [[[0, 1, 1, 1]]]


def test_dict_reads_threshold_from_data():
    label = torch.tensor([[[0.0, 1.0, 200.0]]])
    t = BinarizeLabeld("label")
    assert t({"label": label, "label_threshold": 1})["label"].tolist() == [[[0.0, 1.0, 1.0]]]
    assert t({"label": label, "label_threshold": 128})["label"].tolist() == [[[0.0, 0.0, 1.0]]]
    assert BinarizeLabeld("label", threshold=2)({"label": label, "label_threshold": 1})["label"].sum() == 1
    with pytest.raises(ValueError, match="label_threshold"):
        t({"label": label})
    with pytest.raises(ValueError, match="label_threshold"):
        t({"label": label, "label_threshold": "high"})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"threshold": "a"}, "threshold"),
        ({"threshold": float("nan")}, "threshold"),
        ({"channel_reduction": "median"}, "channel_reduction"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BinarizeLabel(**kwargs)
    with pytest.raises(ValueError, match="channel-first"):
        BinarizeLabel()(torch.ones(3))


def _mask(values, name="m.png"):
    return MetaTensor(torch.tensor([[values]], dtype=torch.float32), meta={"filename_or_obj": name})


def test_check_values_reads_0_1_masks_and_tolerates_jpeg_noise():
    t = BinarizeLabel(check_values=True)
    assert t(_mask([0.0, 1.0, 1.0, 0.0])).tolist() == [[[0.0, 1.0, 1.0, 0.0]]]  # not all background
    assert t(_mask([0.0, 3.0, 250.0, 255.0])).tolist() == [[[0.0, 0.0, 1.0, 1.0]]]  # JPEG noise near 0 and 255
    rgb = MetaTensor(torch.tensor([[[0.0, 1.0, 1.0]]]).repeat(3, 1, 1), meta={"filename_or_obj": "rgb.png"})
    assert t(rgb).tolist() == [[[0.0, 1.0, 1.0]]]
    d = BinarizeLabeld("label", check_values=True)
    assert d({"label": _mask([0.0, 1.0]), "label_threshold": 128})["label"].tolist() == [[[0.0, 1.0]]]
    # label maps (threshold 1) are not value-checked
    assert d({"label": _mask([0.0, 1.0, 2.0]), "label_threshold": 1})["label"].tolist() == [[[0.0, 1.0, 1.0]]]


@pytest.mark.parametrize("values, shown", [([0.0, 1.0, 2.0, 2.0], "{0, 1, 2}"), ([0.0, 128.0, 128.0, 255.0], "128")])
def test_check_values_rejects_other_value_sets_naming_the_file(values, shown):
    with pytest.raises(DataError, match="not a binary mask") as e:
        BinarizeLabel(check_values=True)(_mask(values, "/data/masks/case_7.png"))
    assert "/data/masks/case_7.png" in str(e.value) and shown in str(e.value)
    assert BinarizeLabel()(_mask(values)).shape == (1, 1, 4)  # unchecked by default


@pytest.mark.parametrize("kwargs", [{"check_values": "yes"}, {"max_grey_fraction": 1.5}])
def test_bad_check_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        BinarizeLabel(**kwargs)


@pytest.mark.parametrize(
    "label_map, num_classes, expected",
    [
        ({255: 0, 0: 1}, 2, [255, 0]),
        ({0: 0, 1: 1, 5: 2}, 3, [0, 1, 5]),
        ({0: 0, 100: 1, 101: 1, 7: 2}, 3, [0, 100, 7]),
        ({0: 0, 3: 2}, 3, [0, 1, 3]),  # class 1 has no source value: its index
        (None, 2, None),
    ],
)
def test_inverse_label_map(label_map, num_classes, expected):
    from spectraflow_monai.data import inverse_label_map

    assert inverse_label_map(label_map, num_classes) == expected


def test_save_label_values_writes_source_values_and_keeps_the_classes(tmp_path):
    from monai.data import MetaTensor
    from PIL import Image

    from spectraflow_monai.transforms import SaveLabelValuesd

    classes = torch.zeros(1, 6, 5)
    classes[0, 1:3, 1:4] = 1
    pred = MetaTensor(classes, meta={"filename_or_obj": "em0.png"})
    writer = SaveLabelValuesd("pred", values=[255, 0], output_dir=str(tmp_path), output_postfix="seg",
                              output_ext=".png", writer="PILWriter", output_dtype=np.uint8, separate_folder=False,
                              print_log=False)  # fmt: skip
    out = writer({"pred": pred})
    assert torch.equal(out["pred"], classes)  # the metrics after the writer still see class indices
    saved = np.asarray(Image.open(tmp_path / "em0_seg.png"))
    assert sorted(np.unique(saved).tolist()) == [0, 255] and (saved == 0).sum() == 6
    with pytest.raises(ValueError, match="values"):
        SaveLabelValuesd("pred", values=[0.5, 1], output_dir=str(tmp_path))


def test_jpeg_saved_0_1_mask_names_label_threshold(tmp_path):
    """A 0/1 mask saved as JPEG holds compression noise around 0 and 1: the message names the setting that reads it."""
    from spectraflow_monai.transforms.label import binary_mask_threshold

    noisy = np.random.default_rng(0).integers(0, 2, (32, 32)).astype(np.uint8)  # JPEG noise around 0 ...
    noisy[8:24, 8:24] += 1  # ... and around 1: values 0, 1, 2
    with pytest.raises(DataError, match="label_threshold': 1"):
        binary_mask_threshold(noisy, tmp_path / "m.jpg")


@pytest.mark.parametrize("scale", [1, 255])
def test_binarize_without_a_threshold_entry_reads_the_values(scale):
    """An entry without ``label_threshold`` (e.g. MONAI Label's datastore pairs): with ``check_values`` the mask's
    values decide (0/1 or 0/255); without it the missing entry is an error."""
    import torch

    from spectraflow_monai.transforms.label import BinarizeLabeld

    mask = torch.zeros(1, 4, 4)
    mask[0, 1:3, 1:3] = scale
    out = BinarizeLabeld("label", check_values=True)({"label": mask})["label"]
    assert out.sum() == 4 and set(out.unique().tolist()) == {0.0, 1.0}
    with pytest.raises(ValueError, match="label_threshold"):
        BinarizeLabeld("label")({"label": mask})
