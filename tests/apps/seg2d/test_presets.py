import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from spectraflow_monai.apps.seg2d import (
    KVASIR_SPLIT_DIR,
    build_datalist,
    glas_datalist,
    isic2016_datalist,
    kvasir_seg_datalist,
)
from spectraflow_monai.data import DatasetError, low_data_subset
from spectraflow_monai.utils.errors import SettingError, find_input_error

# the real Kvasir-SEG copy: $SPECTRAFLOW_KVASIR_DIR, else shared/data/kvasir-seg beside the repository
KVASIR_REAL = os.environ.get(
    "SPECTRAFLOW_KVASIR_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data", "kvasir-seg"),
)


def write_image(path, size=16, seed=0, fmt=None):
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path, format=fmt)


def write_mask(path, size=16, value=255, mode="L", fmt=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    m = np.zeros((size, size), dtype=np.uint8)
    m[:8, :8] = value  # aligned with the 8x8 JPEG blocks: no ringing
    img = Image.fromarray(m)
    if mode == "RGB":
        img = img.convert("RGB")
    img.save(path, format=fmt)


def make_kvasir(root, ids=("a1", "a2", "a3", "b1", "b2"), train=("a1", "a2", "a3"), val=("b1", "b2")):
    base = os.path.join(root, "Kvasir-SEG")
    for i, n in enumerate(ids):
        write_image(os.path.join(base, "images", f"{n}.jpg"), seed=i)
        write_mask(os.path.join(base, "masks", f"{n}.jpg"), mode="RGB")
    os.makedirs(os.path.join(root, "splits"), exist_ok=True)
    for split, names in (("train", train), ("val", val)):
        with open(os.path.join(root, "splits", f"{split}.txt"), "w") as f:
            f.write("\n".join(names) + "\n")
    return base


def make_isic(root, train=("ISIC_0000000", "ISIC_0000001", "ISIC_0000002"), test=("ISIC_0000003", "ISIC_0000009")):
    for part, ids in (("Training", train), ("Test", test)):
        for i, n in enumerate(ids):
            write_image(os.path.join(root, f"ISBI2016_ISIC_Part1_{part}_Data", f"{n}.jpg"), seed=i)
            write_mask(os.path.join(root, f"ISBI2016_ISIC_Part1_{part}_GroundTruth", f"{n}_Segmentation.png"))
    with open(os.path.join(root, "ISBI2016_ISIC_Part1_Training_Data", "LICENSE.txt"), "w") as f:
        f.write("not an image")


def make_glas(root, names=("train_1", "train_2", "train_10", "testA_1", "testA_2", "testB_1")):
    base = os.path.join(root, "Warwick QU Dataset (Released 2016_07_08)")
    for i, n in enumerate(names):
        write_image(os.path.join(base, f"{n}.bmp"), seed=i)
        anno = np.zeros((16, 16), dtype=np.uint8)
        anno[2:6, 2:6], anno[8:12, 8:14], anno[12:15, 1:4] = 1, 2, 40  # instance labels, one above 32
        os.makedirs(base, exist_ok=True)
        Image.fromarray(anno).save(os.path.join(base, f"{n}_anno.bmp"))
    with open(os.path.join(base, "Grade.csv"), "w") as f:
        f.write("name,grade\n")
    return base


# ----------------------------------------------------------------------------------------------- layouts
def test_kvasir_splits_and_pairs(tmp_path):
    base = make_kvasir(tmp_path)
    train = kvasir_seg_datalist(tmp_path, "train")
    assert [d["name"] for d in train] == ["a1", "a2", "a3"]
    for d in train:
        assert d["image"] == os.path.join(base, "images", f"{d['name']}.jpg")
        assert d["label"] == os.path.join(base, "masks", f"{d['name']}.jpg")
        assert d["label_threshold"] == 128
    assert [d["name"] for d in kvasir_seg_datalist(tmp_path, "val")] == ["b1", "b2"]
    assert kvasir_seg_datalist(tmp_path, "test") == kvasir_seg_datalist(tmp_path, "val")
    assert len(kvasir_seg_datalist(tmp_path, "all")) == 5
    # root may be the Kvasir-SEG folder itself when split_dir is given
    direct = kvasir_seg_datalist(base, "train", split_dir=tmp_path / "splits")
    assert [d["name"] for d in direct] == ["a1", "a2", "a3"]


def test_isic2016_official_folders(tmp_path):
    make_isic(tmp_path)
    train = isic2016_datalist(tmp_path, "train")
    assert [d["name"] for d in train] == ["ISIC_0000000", "ISIC_0000001", "ISIC_0000002"]
    assert train[0]["label"].endswith(
        os.path.join("ISBI2016_ISIC_Part1_Training_GroundTruth", "ISIC_0000000_Segmentation.png")
    )
    test = isic2016_datalist(tmp_path, "test")
    assert [d["name"] for d in test] == ["ISIC_0000003", "ISIC_0000009"]
    assert "Test_Data" in test[0]["image"] and isic2016_datalist(tmp_path, "val") == test
    assert len(isic2016_datalist(tmp_path, "all")) == 5


def test_glas_warwick_release(tmp_path):
    base = make_glas(tmp_path)
    train = glas_datalist(tmp_path, "train")  # found in the sub-folder
    assert [d["name"] for d in train] == ["train_1", "train_2", "train_10"]  # natural order
    assert train[0]["label"] == os.path.join(base, "train_1_anno.bmp") and train[0]["label_threshold"] == 1
    assert [d["name"] for d in glas_datalist(base, "test")] == ["testA_1", "testA_2", "testB_1"]


def test_build_datalist_presets(tmp_path):
    make_kvasir(tmp_path / "k")
    make_isic(tmp_path / "i")
    make_glas(tmp_path / "g")
    assert build_datalist("kvasir", tmp_path / "k", "train") == kvasir_seg_datalist(tmp_path / "k", "train")
    assert build_datalist("Kvasir-SEG", tmp_path / "k", "val", check_masks=False)[0]["name"] == "b1"
    assert len(build_datalist("isic2016", tmp_path / "i", "test")) == 2
    assert len(build_datalist("glas", tmp_path / "g", "val")) == 3
    syn = build_datalist("synthetic", tmp_path / "s", "train", generate=True, num_train=3, num_val=2, size=32)
    assert [d["name"] for d in syn] == ["synth_train_0000", "synth_train_0001", "synth_train_0002"]
    assert syn[0]["label_threshold"] == 128
    with pytest.raises(ValueError, match="dataset must be one of"):
        build_datalist("brats", tmp_path, "train")
    with pytest.raises(ValueError, match="split"):
        build_datalist("kvasir", tmp_path / "k", "holdout")
    with pytest.raises(ValueError, match="generate=True"):
        build_datalist("synthetic", tmp_path / "s", "train", num_train=3)


def test_fraction_applies_low_data_subset(tmp_path):
    make_kvasir(tmp_path, ids=[f"i{k}" for k in range(10)], train=[f"i{k}" for k in range(10)], val=["i0"])
    sub = kvasir_seg_datalist(tmp_path, "train", fraction=0.2, seed=3)
    full = kvasir_seg_datalist(tmp_path, "train")
    assert len(sub) == 2 and sub == low_data_subset(full, 0.2, seed=3)


# ----------------------------------------------------------------------------------------- low-data subsets
def test_low_data_subset_sizes_nested_deterministic():
    data = [{"name": f"img{i:03d}", "image": f"{i}.png"} for i in range(880)]
    subsets = {f: low_data_subset(data, f, seed=0) for f in (0.1, 0.2, 0.5, 1.0)}
    assert [len(subsets[f]) for f in (0.1, 0.2, 0.5, 1.0)] == [88, 176, 440, 880]
    names = {f: {d["name"] for d in s} for f, s in subsets.items()}
    assert names[0.1] < names[0.2] < names[0.5] < names[1.0]
    assert low_data_subset(data, 0.1, seed=0) == subsets[0.1]
    assert low_data_subset(list(reversed(data)), 0.1, seed=0) == sorted(
        subsets[0.1], key=lambda d: d["name"], reverse=True
    )
    assert {d["name"] for d in low_data_subset(data, 0.1, seed=1)} != names[0.1]
    ordered = [d["name"] for d in subsets[0.2]]
    assert ordered == sorted(ordered)  # input order is kept
    assert len(low_data_subset(data[:3], 0.1)) == 1  # at least one entry


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, True, "0.5"])
def test_low_data_subset_bad_fraction(fraction):
    with pytest.raises(ValueError, match="fraction"):
        low_data_subset([{"name": "a"}], fraction)


# ------------------------------------------------------------------------------------------------ bad input
def test_missing_root_names_path_and_layout(tmp_path):
    missing = tmp_path / "nowhere"
    for fn, word in (
        (kvasir_seg_datalist, "Kvasir-SEG/images"),
        (isic2016_datalist, "ISBI2016_ISIC_Part1"),
        (glas_datalist, "train_N_anno.bmp"),
    ):
        with pytest.raises(DatasetError, match="not found") as e:
            fn(missing)
        assert str(missing) in str(e.value) and word in str(e.value)


def test_isic_missing_test_folder(tmp_path):
    make_isic(tmp_path)
    os.rename(tmp_path / "ISBI2016_ISIC_Part1_Test_GroundTruth", tmp_path / "gt")
    with pytest.raises(DatasetError, match="ISBI2016_ISIC_Part1_Test_GroundTruth"):
        isic2016_datalist(tmp_path, "test")


def test_image_without_mask_and_mask_without_image(tmp_path):
    base = make_kvasir(tmp_path)
    os.remove(os.path.join(base, "masks", "a2.jpg"))
    write_mask(os.path.join(base, "masks", "zz.jpg"))
    with pytest.raises(DatasetError) as e:
        kvasir_seg_datalist(tmp_path, "train")
    msg = str(e.value)
    assert "image(s) without a mask" in msg and os.path.join(base, "images", "a2.jpg") in msg
    assert "mask(s) without an image" in msg and os.path.join(base, "masks", "zz.jpg") in msg


def test_isic_mask_not_named_segmentation(tmp_path):
    make_isic(tmp_path)
    write_mask(os.path.join(tmp_path, "ISBI2016_ISIC_Part1_Training_GroundTruth", "ISIC_0000005.png"))
    with pytest.raises(DatasetError, match="ISIC_0000005"):
        isic2016_datalist(tmp_path, "train")


def test_glas_instance_maps_pass_mask_check_but_grey_kvasir_mask_fails(tmp_path):
    make_glas(tmp_path / "g")  # labels up to 40 are fine for label maps (threshold 1)
    assert len(glas_datalist(tmp_path / "g", "train", check_masks=True)) == 3
    base = make_kvasir(tmp_path / "k")
    grey = os.path.join(base, "masks", "a3.jpg")
    Image.fromarray(np.full((16, 16), 128, dtype=np.uint8)).save(grey)
    with pytest.raises(DatasetError, match="not a binary mask") as e:
        kvasir_seg_datalist(tmp_path / "k", "train")
    assert grey in str(e.value)
    assert len(kvasir_seg_datalist(tmp_path / "k", "train", check_masks=False)) == 3  # the check is optional
    assert len(kvasir_seg_datalist(tmp_path / "k", "val")) == 2  # only the requested split's files are decoded


def test_unreadable_image(tmp_path):
    base = make_kvasir(tmp_path)
    bad = os.path.join(base, "images", "a1.jpg")
    with open(bad, "wb") as f:
        f.write(b"this is not a jpeg")
    with pytest.raises(DatasetError, match="unreadable image") as e:
        kvasir_seg_datalist(tmp_path, "train", check_masks=False)
    assert bad in str(e.value)
    assert len(kvasir_seg_datalist(tmp_path, "train", check_images=False, check_masks=False)) == 3


def test_empty_split_file_and_unknown_ids(tmp_path):
    make_kvasir(tmp_path)
    split_file = os.path.join(tmp_path, "splits", "val.txt")
    open(split_file, "w").close()
    with pytest.raises(DatasetError, match="empty split") as e:
        kvasir_seg_datalist(tmp_path, "val")
    assert split_file in str(e.value)
    with open(split_file, "w") as f:
        f.write("b1\nnope\n")
    with pytest.raises(DatasetError, match="nope"):
        kvasir_seg_datalist(tmp_path, "val")
    os.remove(split_file)
    with pytest.raises(DatasetError, match="split file not found"):
        kvasir_seg_datalist(tmp_path, "val")


def test_empty_glas_test_split(tmp_path):
    make_glas(tmp_path, names=("train_1", "train_2"))
    with pytest.raises(DatasetError, match="empty split"):
        glas_datalist(tmp_path, "test")


def test_kvasir_without_splits_folder_uses_the_shipped_lists(tmp_path, monkeypatch):
    import spectraflow_monai.apps.seg2d.presets as datasets2d

    assert sorted(os.listdir(KVASIR_SPLIT_DIR)) == ["train.txt", "val.txt"]
    shipped = {s: open(os.path.join(KVASIR_SPLIT_DIR, f"{s}.txt")).read().split() for s in ("train", "val")}
    assert (len(shipped["train"]), len(shipped["val"])) == (880, 120)
    assert not set(shipped["train"]) & set(shipped["val"])
    # a download without splits/: the shipped lists name ids this tiny tree lacks, and the message says which file
    make_kvasir(tmp_path / "k")
    shutil.rmtree(tmp_path / "k" / "splits")
    with pytest.raises(DatasetError, match=re.escape(os.path.join(KVASIR_SPLIT_DIR, "train.txt"))):
        kvasir_seg_datalist(tmp_path / "k", "train")
    # the fallback reads whatever KVASIR_SPLIT_DIR holds; an existing splits/ folder still wins
    other = tmp_path / "shipped"
    other.mkdir()
    (other / "train.txt").write_text("a2\nb1\n")
    monkeypatch.setattr(datasets2d, "KVASIR_SPLIT_DIR", str(other))
    assert [d["name"] for d in kvasir_seg_datalist(tmp_path / "k", "train")] == ["a2", "b1"]
    make_kvasir(tmp_path / "k2")
    assert [d["name"] for d in kvasir_seg_datalist(tmp_path / "k2", "train")] == ["a1", "a2", "a3"]


@pytest.mark.skipif(not os.path.isdir(KVASIR_REAL), reason="real Kvasir-SEG not available")
def test_real_kvasir_880_120():
    for split in ("train", "val"):  # the shipped lists are this copy's lists
        with open(os.path.join(KVASIR_REAL, "splits", f"{split}.txt")) as a:
            with open(os.path.join(KVASIR_SPLIT_DIR, f"{split}.txt")) as b:
                assert a.read().split() == b.read().split()
    train = kvasir_seg_datalist(KVASIR_REAL, "train", check_images=False, check_masks=False)
    val = kvasir_seg_datalist(KVASIR_REAL, "val", check_images=False, check_masks=False)
    assert (len(train), len(val)) == (880, 120)
    assert not {d["name"] for d in train} & {d["name"] for d in val}
    assert len(kvasir_seg_datalist(KVASIR_REAL, "val", fraction=0.2)) == 24  # full checks on a subset


@pytest.mark.parametrize(
    "preset, maker, split, area", [("kvasir", make_kvasir, "train", 64), ("glas", make_glas, "train", 16 + 24 + 9)]
)
def test_entries_load_with_monai_and_binarize(tmp_path, preset, maker, split, area):
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged

    from spectraflow_monai.transforms import BinarizeLabeld

    maker(tmp_path)
    entry = build_datalist(preset, tmp_path, split)[0]
    load = Compose(
        [
            LoadImaged(["image", "label"], image_only=True),
            EnsureChannelFirstd(["image", "label"]),
            BinarizeLabeld("label"),
        ]
    )
    out = load(entry)
    assert out["image"].shape == (3, 16, 16) and out["label"].shape == (1, 16, 16)
    assert set(out["label"].unique().tolist()) == {0.0, 1.0} and int(out["label"].sum()) == area


def _load_label(entry, check_values=False):
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged

    from spectraflow_monai.transforms import BinarizeLabeld

    load = Compose(
        [
            LoadImaged(["image", "label"], reader="PILReader", image_only=True),
            EnsureChannelFirstd(["image", "label"]),
            BinarizeLabeld("label", check_values=check_values),
        ]
    )
    return load(entry)["label"]


def test_kvasir_layout_with_0_1_png_mask_keeps_its_foreground(tmp_path):
    base = make_kvasir(tmp_path)
    os.remove(os.path.join(base, "masks", "a1.jpg"))
    write_mask(os.path.join(base, "masks", "a1.png"), value=1)
    entry = kvasir_seg_datalist(tmp_path, "train")[0]
    assert entry["name"] == "a1" and entry["label_threshold"] == 1
    assert int(_load_label(entry).sum()) == 64
    # without the data check, the bundle's transform (check_values=True) reads it as 0/1 too
    unchecked = kvasir_seg_datalist(tmp_path, "train", check_masks=False)[0]
    assert unchecked["label_threshold"] == 128 and int(_load_label(unchecked, check_values=True).sum()) == 64


def test_kvasir_layout_with_label_map_mask_names_file_and_values(tmp_path):
    base = make_kvasir(tmp_path)
    os.remove(os.path.join(base, "masks", "a2.jpg"))
    path = os.path.join(base, "masks", "a2.png")
    labels = np.zeros((16, 16), dtype=np.uint8)
    labels[:8, :8], labels[8:, 8:] = 1, 2
    Image.fromarray(labels).save(path)
    with pytest.raises(DatasetError, match="not a binary mask") as e:
        kvasir_seg_datalist(tmp_path, "train")
    assert path in str(e.value) and "{0, 1, 2}" in str(e.value)
    entry = kvasir_seg_datalist(tmp_path, "train", check_masks=False)[1]
    with pytest.raises(RuntimeError) as e:  # MONAI's Compose wraps the transform's error
        _load_label(entry, check_values=True)
    cause = find_input_error(e.value)
    assert isinstance(cause, DatasetError) and path in str(cause) and "{0, 1, 2}" in str(cause)


def test_truncated_bmp_image_is_named(tmp_path):
    base = make_glas(tmp_path)
    bad = os.path.join(base, "train_2.bmp")
    with open(bad, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[:-100])  # the header is intact: only decoding notices
    with pytest.raises(DatasetError, match="unreadable image") as e:
        glas_datalist(tmp_path, "train")
    assert bad in str(e.value)


@pytest.mark.skipif(not os.path.isdir(KVASIR_REAL), reason="real Kvasir-SEG not available")
def test_real_kvasir_masks_load_as_binary():
    entries = kvasir_seg_datalist(KVASIR_REAL, "val", fraction=0.1)  # full checks on 12 images
    assert {d["label_threshold"] for d in entries} == {128}
    for entry in entries[:3]:
        label = _load_label(entry, check_values=True)
        assert set(label.unique().tolist()) == {0.0, 1.0}
        mask = np.asarray(Image.open(entry["label"]).convert("L"))
        assert int(label.sum()) == int((mask >= 128).sum())


def test_bad_arguments_are_setting_errors(tmp_path):
    make_kvasir(tmp_path)
    for call in (
        lambda: build_datalist("brats", tmp_path, "train"),
        lambda: build_datalist("kvasir", tmp_path, "holdout"),
        lambda: kvasir_seg_datalist(tmp_path, "train", fraction=2.0),
    ):
        with pytest.raises(SettingError) as e:  # a ValueError whose message ends a bundle run's output
            call()
        assert isinstance(e.value, ValueError) and "got" in str(e.value)


def test_glas_validation_on_the_test_split_is_warned_with_the_alternative(tmp_path, caplog):
    """GlaS has no validation split: validating on its test split is warned with the alternative, val_from_train,
    which holds out training images so that the test set stays unseen."""
    from spectraflow_monai.apps.seg2d import build_datalist

    make_glas(tmp_path, names=("train_1", "train_2", "train_3", "train_4", "train_5", "testA_1", "testB_1"))
    caplog.set_level("INFO")
    val = build_datalist("glas", tmp_path, "val")
    assert {e["name"] for e in val} == {"testA_1", "testB_1"}
    assert "validation uses its test split" in caplog.text and "val_from_train" in caplog.text
    caplog.clear()
    opts = {"val_from_train": 0.4}
    train, val, test = (build_datalist("glas", tmp_path, s, **opts) for s in ("train", "val", "test"))
    assert "validation uses its test split" not in caplog.text
    assert len(val) == 2 and all(e["name"].startswith("train_") for e in val)
    assert {e["name"] for e in train} | {e["name"] for e in val} == {f"train_{i}" for i in range(1, 6)}
    assert not {e["name"] for e in train} & {e["name"] for e in val}
    assert {e["name"] for e in test} == {"testA_1", "testB_1"}
    with pytest.raises(ValueError, match="val_from_train"):
        build_datalist("glas", tmp_path, "val", val_from_train=1.5)


def test_a_dataset_dir_that_is_a_file_is_not_a_folder(tmp_path):
    file = tmp_path / "kvasir-seg.zip"
    file.write_bytes(b"PK")
    with pytest.raises(DatasetError, match=r"kvasir: '.*kvasir-seg.zip' is not a folder \(it is a file\)"):
        kvasir_seg_datalist(file)
    with pytest.raises(DatasetError, match="dataset folder not found"):
        kvasir_seg_datalist(tmp_path / "missing")
