"""The ``spectraflow_synapse_segmentation`` bundle on one's own 3D data: a Decathlon datalist JSON of NIfTI volumes.

A tiny data set is written here (4 volumes of 32x32x6 with label values {0, 3, 7}, not BTCV ids), listed in a
``dataset.json`` with a ``training`` list (no ``validation``: a seeded fraction is held out) and a ``test`` list, and
selected with the model-zoo override names ``data_list_file_path`` / ``dataset_dir``; ``label_map`` maps {0, 3, 7} to
3 classes with names from ``class_names``. Stage-1 (mask inputs), Stage-2, evaluation and inference run through
``monai.bundle`` once per module (a 2-block encoder, 28x28 slices); bad inputs stop the run before any training,
naming the file, and leave what was written untouched.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from tests.bundles.helpers import error_text, run_bundle

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "bundles" / "spectraflow_synapse_segmentation" / "configs"
TRAIN, STAGE1 = str(CONFIGS / "train.yaml"), str(CONFIGS / "train_stage1.yaml")
EVALUATE, INFERENCE = str(CONFIGS / "evaluate.yaml"), str(CONFIGS / "inference.yaml")
META = str(CONFIGS / "metadata.json")
SHAPE, AFFINE = (32, 32, 6), np.diag([1.5, 1.5, 3.0, 1.0])
LABEL_MAP = {0: 0, 3: 1, 7: 2}
CLASS_NAMES = ["background", "lesion_a", "lesion_b"]
NET = {"image_size": 28, "encoder_kwargs": {"depth": 2}, "num_classes": 3}
pytestmark = pytest.mark.xdist_group("spectraflow_synapse_own_data")


def _volume(i: int) -> tuple[np.ndarray, np.ndarray]:
    lab = np.zeros(SHAPE, np.uint8)
    lab[4 + i : 14 + i, 4:14, 1:5] = 3
    lab[18:28, 16 - i : 30 - i, 2:6] = 7
    rng = np.random.RandomState(i)
    img = rng.normal(0.0, 20.0, SHAPE) + np.where(lab == 3, 150.0, 0.0) + np.where(lab == 7, -80.0, 0.0)
    return img.astype(np.float32), lab


def _write_dataset(root: Path, n: int = 4) -> dict:
    items = []
    for i in range(n):
        img, lab = _volume(i)
        for folder, arr in (("imagesTr", img), ("labelsTr", lab)):
            os.makedirs(root / folder, exist_ok=True)
            nib.save(nib.Nifti1Image(arr, AFFINE), str(root / folder / f"ct_{i:02d}.nii.gz"))
        items.append({"image": f"imagesTr/ct_{i:02d}.nii.gz", "label": f"labelsTr/ct_{i:02d}.nii.gz"})
    spec = {"name": "own", "training": items[:-1], "test": items[-1:]}
    (root / "dataset.json").write_text(json.dumps(spec))
    return spec


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_data")
    data = root / "data"
    _write_dataset(data)
    common = {
        "bundle_root": str(root / "bundle"), "data_list_file_path": str(data / "dataset.json"),
        "dataset_dir": str(data), "label_map": LABEL_MAP, "class_names": CLASS_NAMES,
        "num_workers": 0, "progress_bar": False, "pretrained_weights": "none", **NET,
    }  # fmt: skip
    stage1 = {"stage1_epochs": 1, "stage1_batch_size": 4, "head_hidden_channels": 32, "head_num_blocks": 1}
    run_bundle([TRAIN, STAGE1], META, **common, **stage1)
    run_bundle(TRAIN, META, **common, max_epochs=1, batch_size=4, val_batch_size=6)
    yield {"root": root, "data": data, "common": common}
    shutil.rmtree(root, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def test_trains_on_the_datalist_with_a_held_out_case(trained):
    bundle = Path(trained["common"]["bundle_root"])
    assert (bundle / "models" / "encoder_stage1.pt").is_file() and (bundle / "models" / "model.pt").is_file()
    model = torch.load(bundle / "models" / "model.pt", map_location="cpu", weights_only=True)
    assert [v.shape[0] for k, v in model.items() if k.endswith("weight")][-1] == 3  # 3 output classes
    index = json.loads((bundle / "cache" / "datalist_dataset_28" / "index.json").read_text())
    # 3 training volumes: 2 train, 1 held out (val_fraction 0.2, seed 0); the test volume is never sliced
    assert sorted(index["volumes"]) == ["ct_00", "ct_01", "ct_02"]
    assert all(v["params"]["label_map"] == [[0, 0], [3, 1], [7, 2]] for v in index["volumes"].values())
    with np.load(bundle / "cache" / "datalist_dataset_28" / "casect_00" / "casect_00_slice003.npz") as npz:
        assert npz["image"].shape == (28, 28) and set(np.unique(npz["label"])) == {0, 1, 2}


def test_evaluates_the_test_list_with_the_class_names(trained):
    bundle = Path(trained["common"]["bundle_root"])
    run_bundle([TRAIN, EVALUATE], META, **trained["common"])
    with open(bundle / "eval" / "synapse_per_case.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["organ"]) for r in rows] == [("ct_03", "lesion_a"), ("ct_03", "lesion_b")]
    _, lab = _volume(3)
    assert [int(r["gt_voxels"]) for r in rows] == [int((lab == 3).sum()), int((lab == 7).sum())]
    assert "| lesion_a |" in (bundle / "eval" / "synapse_organs.md").read_text()
    pred = nib.load(str(bundle / "eval" / "predictions" / "ct_03_seg.nii.gz"))
    assert pred.shape == SHAPE and set(np.unique(np.asarray(pred.dataobj))) <= {0, 3, 7}  # the source values
    np.testing.assert_allclose(pred.affine, AFFINE, atol=1e-5)


def test_infers_the_test_list(trained, tmp_path):
    out = tmp_path / "pred"
    bundle = trained["common"]["bundle_root"]
    run_bundle(
        INFERENCE, META, bundle_root=bundle, data_list_file_path=str(trained["data"] / "dataset.json"),
        output_dir=str(out), label_map=LABEL_MAP, **NET,
    )  # fmt: skip
    assert os.listdir(out) == ["ct_03_seg.nii.gz"]
    pred = nib.load(str(out / "ct_03_seg.nii.gz"))
    assert pred.shape == SHAPE and set(np.unique(np.asarray(pred.dataobj))) <= {0, 3, 7}  # the source values


def _corrupt(data: Path, problem: str) -> str:
    """Make one problem in a copy of the data set; return the path the message must name."""
    spec = json.loads((data / "dataset.json").read_text())
    label = data / "labelsTr" / "ct_01.nii.gz"
    if problem == "missing":
        spec["training"][1]["image"] = "imagesTr/absent.nii.gz"
        named = str(data / "imagesTr" / "absent.nii.gz")
    elif problem == "size":
        nib.save(nib.Nifti1Image(np.zeros((32, 30, 6), np.uint8), AFFINE), str(label))
        named = str(label)
    elif problem == "unreadable":
        (data / "imagesTr" / "ct_01.nii.gz").write_bytes(b"not a nifti file")
        named = str(data / "imagesTr" / "ct_01.nii.gz")
    elif problem == "values":
        nib.save(nib.Nifti1Image(np.where(_volume(1)[1] == 7, 9, _volume(1)[1]).astype(np.uint8), AFFINE), str(label))
        named = str(label)
    elif problem == "empty":
        spec["validation"] = []
        named = str(data / "dataset.json")
    else:
        raise AssertionError(problem)
    (data / "dataset.json").write_text(json.dumps(spec))
    return named


@pytest.mark.parametrize(
    "problem, words",
    [
        ("missing", "does not exist"),
        ("size", "has shape (32, 30, 6) but image"),
        ("unreadable", "not a readable NIfTI image"),
        ("values", "holds value(s) [9] that the label map does not list"),
        ("empty", "'validation' list is empty"),
    ],
)
def test_bad_input_stops_before_training_and_overwrites_nothing(trained, tmp_path, problem, words):
    data = tmp_path / "data"
    _write_dataset(data)
    named = _corrupt(data, problem)
    model = Path(trained["common"]["bundle_root"]) / "models" / "model.pt"
    before = model.read_bytes()
    settings = {**trained["common"], "data_list_file_path": str(data / "dataset.json"), "dataset_dir": str(data)}
    settings["cache_dir"] = str(tmp_path / "cache")
    with pytest.raises(Exception) as info:
        run_bundle(TRAIN, META, **settings, max_epochs=1, batch_size=4, val_batch_size=6)
    text = error_text(info.value)
    assert named in text and words in text, text
    assert model.read_bytes() == before  # the trained model of the fixture is untouched


def test_dataset_dir_that_is_a_file_is_named(trained, tmp_path):
    settings = {**trained["common"], "dataset_dir": str(trained["data"] / "dataset.json")}
    with pytest.raises(Exception) as info:
        run_bundle(TRAIN, META, **{**settings, "bundle_root": str(tmp_path)})
    text = error_text(info.value)
    assert "dataset_dir" in text and "is a file, not a folder" in text, text
    assert not (tmp_path / "models").exists() and not (tmp_path / "cache").exists()


def test_dataset_dir_defaults_to_the_json_folder(trained, tmp_path):
    from tests.bundles.helpers import parse_config

    settings = {k: v for k, v in trained["common"].items() if k != "dataset_dir"}
    parser = parse_config(TRAIN, **{**settings, "cache_dir": str(tmp_path / "cache")})
    assert parser.get_parsed_content("dataset_dir") == str(trained["data"])
    assert [d["case"] for d in parser.get_parsed_content("validate#datalist")][:1] == ["ct_02"]
    assert parser.get_parsed_content("data_options#val_cases") is None and parser.get_parsed_content("layout") == "raw"
