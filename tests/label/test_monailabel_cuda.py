"""MONAI Label inference on ``cuda`` for real (``pytest -m gpu``; skipped where CUDA is not available).

Both bundles' inference tasks run on ``cuda`` at the app's default precision (``auto``: bf16 where the GPU has it)
and at ``--conf precision fp32``, where the labels must match the CPU's."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")

from PIL import Image  # noqa: E402

from .test_monailabel_app import (  # noqa: E402,F401  (fixtures used by name)
    IMAGE_2D_SHAPE,
    NAME_2D,
    NAME_3D,
    VOLUME_SHAPE,
    _app,
    _quiet_app,
    app,
    served,
)

pytestmark = pytest.mark.gpu
CASES = ((NAME_2D, "img_a", IMAGE_2D_SHAPE), (NAME_3D, "ct_a", VOLUME_SHAPE))


def _label(name: str, path: str) -> np.ndarray:
    return np.asarray(Image.open(path)) if name == NAME_2D else np.asarray(nib.load(path).dataobj)


def test_infer_on_cuda_default_precision(app):
    for name, image, shape in CASES:
        label = _label(name, app.infer({"model": name, "image": image, "device": "cuda"})["file"])
        assert label.shape == shape and label.dtype == np.uint8
        assert set(np.unique(label).tolist()) <= set(range(9 if name == NAME_3D else 2))


def test_infer_on_cuda_matches_cpu_in_fp32(served):
    app = _app(served["bundles"], served["studies"], precision="fp32")
    for name, image, shape in CASES:
        labels = {
            device: _label(name, app.infer({"model": name, "image": image, "device": device})["file"])
            for device in ("cuda", "cpu")
        }
        assert labels["cuda"].shape == shape
        agree = (labels["cuda"] == labels["cpu"]).mean()  # cuDNN convolutions may use TF32: near, not exact
        assert agree > 0.95, (name, agree)
