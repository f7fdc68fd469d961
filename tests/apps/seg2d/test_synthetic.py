import os

import numpy as np
import pytest
from PIL import Image

from spectraflow_monai.apps.seg2d import generate_synthetic_dataset, synthesize_pair, synthetic_datalist
from spectraflow_monai.apps.seg2d.synthetic import main
from spectraflow_monai.utils.errors import DatasetError


def load(path):
    return np.asarray(Image.open(path))


def test_generated_pairs(tmp_path):
    info = generate_synthetic_dataset(tmp_path, num_train=6, num_val=3, size=64, seed=5)
    assert info["skipped"] is False and info["num_train"] == 6 and 0.02 < info["foreground_fraction"] < 0.6
    train = synthetic_datalist(tmp_path, "train")
    val = synthetic_datalist(tmp_path, "val")
    assert len(train) == 6 and len(val) == 3
    assert not {d["name"] for d in train} & {d["name"] for d in val}
    means = []
    for d in train + val:
        img, mask = load(d["image"]), load(d["label"])
        assert img.shape == (64, 64, 3) and img.dtype == np.uint8
        assert mask.shape == (64, 64) and set(np.unique(mask)) <= {0, 255}
        assert 0.005 < np.mean(mask > 0) < 0.7
        fg, bg = img[mask > 0].mean(0), img[mask == 0].mean(0)
        assert np.abs(fg - bg).max() > 5  # the lesion is visible
        means.append(img.mean((0, 1)))
    assert np.std(np.asarray(means), axis=0).max() > 10  # appearance varies between images


def test_deterministic_and_idempotent(tmp_path):
    a = generate_synthetic_dataset(tmp_path / "a", num_train=3, num_val=1, size=48, seed=1)
    b = generate_synthetic_dataset(tmp_path / "b", num_train=5, num_val=2, size=48, seed=1)
    for name in ("synth_train_0000", "synth_train_0002", "synth_val_0000"):
        for sub in ("images", "masks"):  # image i depends only on (seed, split, i)
            np.testing.assert_array_equal(
                load(tmp_path / "a" / sub / f"{name}.png"), load(tmp_path / "b" / sub / f"{name}.png")
            )
    assert a["foreground_fraction"] != b["foreground_fraction"]
    other = generate_synthetic_dataset(tmp_path / "c", num_train=1, num_val=1, size=48, seed=2)
    assert not np.array_equal(
        load(tmp_path / "a/masks/synth_train_0000.png"), load(tmp_path / "c/masks/synth_train_0000.png")
    )
    assert other["seed"] == 2

    stamp = os.path.getmtime(tmp_path / "a/images/synth_train_0000.png")
    again = generate_synthetic_dataset(tmp_path / "a", num_train=3, num_val=1, size=48, seed=1)
    assert again["skipped"] is True and os.path.getmtime(tmp_path / "a/images/synth_train_0000.png") == stamp
    differs = r"other parameters \({'num_train': 3}\).*\({'num_train': 2}\).*synthetic_size"
    with pytest.raises(DatasetError, match=differs):
        generate_synthetic_dataset(tmp_path / "a", num_train=2, num_val=1, size=48, seed=1)
    generate_synthetic_dataset(tmp_path / "a", num_train=2, num_val=1, size=48, seed=1, overwrite=True)
    assert sorted(os.listdir(tmp_path / "a/images")) == [
        "synth_train_0000.png",
        "synth_train_0001.png",
        "synth_val_0000.png",
    ]
    assert len(synthetic_datalist(tmp_path / "a", "all")) == 3


def test_synthesize_pair_and_cli(tmp_path, capsys):
    img, mask = synthesize_pair(np.random.default_rng(0), size=32)
    img2, mask2 = synthesize_pair(np.random.default_rng(0), size=32)
    np.testing.assert_array_equal(img, img2)
    np.testing.assert_array_equal(mask, mask2)
    info = main(["--root", str(tmp_path), "--num-train", "2", "--num-val", "1", "--size", "32"])
    assert info["num_train"] == 2 and "written" in capsys.readouterr().out
    assert open(tmp_path / "splits" / "train.txt").read().split() == ["synth_train_0000", "synth_train_0001"]


@pytest.mark.parametrize(
    "kwargs, match", [({"num_train": 0}, "num_train"), ({"num_val": 1.5}, "num_val"), ({"size": 8}, "size")]
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_synthetic_dataset(tmp_path, **kwargs)


def test_missing_synthetic_root_suggests_generation(tmp_path):
    from spectraflow_monai.data import DatasetError

    with pytest.raises(DatasetError, match="generate=True"):
        synthetic_datalist(tmp_path / "none", "train")
