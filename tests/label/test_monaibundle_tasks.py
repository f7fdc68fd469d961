"""The bundles under MONAI Label's own bundle tasks, as its ``monaibundle`` sample app serves model-zoo bundles
(``--conf models <name>`` with the bundle folder in the app's ``model/``): ``monailabel.tasks.infer.bundle.BundleInferTask``
and ``monailabel.tasks.train.bundle.BundleTrainTask``, unmodified. They read ``configs/inference.yaml`` and
``configs/train.yaml`` alone, run ``train.yaml``'s ``run`` list without ``initialize``, and write the inference
output as the input's format (a PNG needs an integer label map)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is an optional extra (pip install -e '.[label]')")

import nibabel as nib  # noqa: E402
import torch  # noqa: E402
from monai.bundle import ConfigParser  # noqa: E402
from PIL import Image  # noqa: E402

from spectraflow_monai.apps.seg2d.synthetic import synthesize_pair  # noqa: E402
from spectraflow_monai.apps.synapse import synthetic_ct_volume  # noqa: E402
from spectraflow_monai.utils.bundles import bundle_path, settings_overrides  # noqa: E402
from spectraflow_monai.utils.run_record import write_model_settings  # noqa: E402
from spectraflow_monai.utils.settings import ModelSettings  # noqa: E402

NAME_2D, NAME_3D = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"
# what a user of the sample app edits in a bundle's configs/train.yaml for a CPU machine without the hub (encoder_init
# stays the bundle's: auto, which starts from pretrained_weights while there is no Stage-1 export)
TINY_TRAIN = {
    "image_size": 28, "encoder_kwargs": {"depth": 2}, "pretrained_weights": "none",
    "num_workers": 0, "progress_bar": False, "batch_size": 2, "val_batch_size": 2, "precision": "fp32",
}  # fmt: skip
MODEL = {NAME_2D: ModelSettings(image_size=28, encoder_kwargs={"depth": 2}),
         NAME_3D: ModelSettings(image_size=28, encoder_kwargs={"depth": 2}, out_channels=9, num_classes=9,
                                hu_window=[-125.0, 275.0], nonfinite="error")}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    threads, path = torch.get_num_threads(), list(sys.path)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    sys.path[:] = path  # MONAI Label's bundle tasks edit sys.path


def _served_bundle(root: Path, name: str) -> Path:
    """The bundle folder in the app's model/ folder, with a model.pt and its record (the sample app's layout)."""
    folder = root / "model" / name
    shutil.copytree(bundle_path(name), folder, ignore=shutil.ignore_patterns("models", "data", "cache", "logs"))
    (folder / "models").mkdir()
    write_model_settings(folder / "models" / "model.pt", MODEL[name])
    parser = ConfigParser()
    parser.read_config(str(folder / "configs" / "inference.yaml"))
    parser.update({"bundle_root": str(folder)})
    torch.manual_seed(0)
    torch.save(parser.get_parsed_content("network_def").state_dict(), folder / "models" / "model.pt")
    return folder


def test_stock_infer_task_answers_a_png_with_an_integer_label_map(tmp_path):
    from monailabel.tasks.infer.bundle import BundleInferTask

    folder = _served_bundle(tmp_path, NAME_2D)
    image, _ = synthesize_pair(np.random.default_rng(0), 64)
    Image.fromarray(image[:50, :60]).save(tmp_path / "case.png")
    task = BundleInferTask(str(folder), conf={})
    assert task.is_valid()
    result, _ = task({"image": str(tmp_path / "case.png"), "device": "cpu"})
    label = np.asarray(Image.open(result))
    assert label.dtype == np.uint8 and label.shape == (50, 60)
    assert set(np.unique(label)) <= {0, 1}


def test_stock_infer_task_answers_a_volume_with_nifti(tmp_path):
    from monailabel.tasks.infer.bundle import BundleInferTask

    folder = _served_bundle(tmp_path, NAME_3D)
    volume, _ = synthetic_ct_volume(1, shape=(32, 30, 4))
    affine = np.diag([0.8, 0.8, 2.5, 1.0])
    nib.save(nib.Nifti1Image(volume, affine), str(tmp_path / "ct.nii.gz"))
    task = BundleInferTask(str(folder), conf={})
    result, _ = task({"image": str(tmp_path / "ct.nii.gz"), "device": "cpu"})
    assert str(result).endswith(".nii.gz")
    label = nib.load(result)
    assert label.shape[:3] == (32, 30, 4) and np.allclose(label.affine, affine)
    assert set(np.unique(np.asarray(label.dataobj)).tolist()) <= set(range(9))


def _write_studies(studies: Path, name: str) -> str:
    """Six labelled images (2D: PNG pairs; Synapse: NIfTI volumes with class maps 0..8); returns the glob."""
    (studies / "labels" / "final").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(6):
        if name == NAME_2D:
            image, mask = synthesize_pair(rng, 56)
            Image.fromarray(image).save(studies / f"s{i}.png")
            Image.fromarray((mask > 0).astype(np.uint8)).save(studies / "labels" / "final" / f"s{i}.png")
            continue
        volume, label = synthetic_ct_volume(i + 1, shape=(32, 32, 3))
        labels = np.clip(label, 0, 8).astype(np.uint8)  # the datastore holds the 9 classes
        nib.save(nib.Nifti1Image(volume, np.eye(4)), str(studies / f"ct{i}.nii.gz"))
        nib.save(nib.Nifti1Image(labels, np.eye(4)), str(studies / "labels" / "final" / f"ct{i}.nii.gz"))
    return "*.png" if name == NAME_2D else "*.nii.gz"


# the 2D bundle's own batch size (8) with 3 training pairs: the loader dropped its one incomplete batch and the stock
# task answered {} having trained nothing; the batch is now as large as the pairs there are
@pytest.mark.parametrize("name, batch_size", [(NAME_2D, 2), (NAME_3D, 2), (NAME_2D, 8)])
def test_stock_train_task_trains_the_bundle_on_datastore_labels(tmp_path, name, batch_size):
    from monailabel.datastore.local import LocalDatastore
    from monailabel.tasks.train.bundle import BundleTrainTask

    folder = _served_bundle(tmp_path, name)
    config = ConfigParser.load_config_file(str(folder / "configs" / "train.yaml"))
    parser = ConfigParser(config)
    parser.update(settings_overrides(config, {**TINY_TRAIN, "batch_size": batch_size}))  # at each setting's id
    ConfigParser.export_config_file(parser.config, str(folder / "configs" / "train.yaml"), fmt="yaml")
    studies = tmp_path / "studies"
    datastore = LocalDatastore(str(studies), extensions=(_write_studies(studies, name),), auto_reload=False)
    before = (folder / "models" / "model.pt").read_bytes()
    task = BundleTrainTask(str(folder), conf={})
    assert task.is_valid()
    task({"model": name, "max_epochs": 1, "device": "cpu", "val_split": 0.5, "multi_gpu": False}, datastore)
    run_record = json.loads((folder / "models" / "stage2" / "run_record.json").read_text())
    assert not (folder / "models" / "encoder_stage1.pt").exists()  # no Stage-1 run: the bundle's encoder_init finds
    assert run_record["settings"]["encoder_init"] == "auto"  # its way alone, and the record says where it started
    assert run_record["settings"]["resolved"] == {"encoder_start": "pretrained"}
    assert (folder / "models" / "model.pt").read_bytes() != before
    record = ModelSettings.from_dict(
        json.loads((folder / "models" / "model.json").read_text())["model"]
    )
    assert record.image_size == 28 and record.encoder_kwargs == {"depth": 2}
    # the annotator's next /train (same request; the finished run has no epoch left): a new run that starts from the
    # served model trains and replaces it, the finished run kept aside; never an answer that trained nothing
    served = (folder / "models" / "model.pt").read_bytes()
    task({"model": name, "max_epochs": 1, "device": "cpu", "val_split": 0.5, "multi_gpu": False}, datastore)
    assert (folder / "models" / "model.pt").read_bytes() != served
    assert len(list((folder / "models").glob("stage2.bak-*"))) == 1
    assert json.loads((folder / "models" / "stage2" / "run_record.json").read_text())["finished"]["epoch"] == 1


def test_a_model_trained_with_its_own_normalisation_is_served_with_it(tmp_path):
    """model.json's image_mean / image_std reach MONAI Label's preprocessing (the stock task and this app's)."""
    from monai.transforms import NormalizeIntensityd
    from monailabel.tasks.infer.bundle import BundleInferTask

    folder = _served_bundle(tmp_path, NAME_2D)
    mean, std = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]
    write_model_settings(folder / "models" / "model.pt", MODEL[NAME_2D].replace(image_mean=mean, image_std=std))
    task = BundleInferTask(str(folder), conf={})
    (norm,) = [t for t in task.pre_transforms({"device": "cpu"}) if isinstance(t, NormalizeIntensityd)]
    assert np.allclose(np.asarray(norm.normalizer.subtrahend, dtype=float), mean)
    assert np.allclose(np.asarray(norm.normalizer.divisor, dtype=float), std)
