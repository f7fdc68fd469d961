"""A synthetic abdominal CT phantom in the Synapse (BTCV) layouts, for tests and bundle smoke runs.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation") evaluates on the Synapse multi-organ CT data set, which cannot be shipped. This phantom writes small
volumes with the same file layout, label ids and intensity range, so that the whole Synapse pipeline (datalists,
HU windowing, the 13 -> 8 label mapping, slice caching, slice-wise training and 3D evaluation) runs end to end
without the real data:

- a body ellipse (fat rim at -100 HU, soft tissue at ~40 HU) in air (-1000 HU) with a vertebral column (~600 HU);
- the eight Synapse organs with their BTCV label ids at plausible positions in RAS+ orientation (liver large on the
  subject's right, spleen left, kidneys posterior, aorta a tube left of the spine, inferior vena cava to its right,
  stomach left anterior, a small gallbladder under the liver, an elongated pancreas across the midline) with
  CT-like intensities (liver ~60, kidneys ~150 (contrast), aorta ~200 HU);
- distractor structures that the Synapse mapping turns into background: esophagus (BTCV 5) and inferior vena cava
  (BTCV 9);
- Gaussian noise; an anisotropic voxel spacing recorded in the affine.

Every case is generated from ``(seed, case id)`` only, so a case looks the same whichever other cases are written.

Command line::

    spectraflow synthetic-ct --output DIR [--cases 5 6 7 40 1 2] [--layout raw|transunet|both]
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spectraflow_monai.apps.synapse.constants import SYNAPSE_TEST_CASES, format_case_id
from spectraflow_monai.utils.files import atomic_path, write_text_atomic

__all__ = [
    "DEFAULT_SYNTHETIC_CASES",
    "PHANTOM_MANIFEST",
    "phantom_parameters",
    "synthetic_ct_volume",
    "generate_synthetic_ct",
    "main",
]

#: file written into the phantom's root with the parameters it was generated with.
PHANTOM_MANIFEST = "synthetic_ct.json"

#: default cases: four of the TransUNet training split (40 is the Synapse bundle's held-out validation case on the
#: phantom) and two of its test split.
DEFAULT_SYNTHETIC_CASES: tuple[int, ...] = (5, 6, 7, 40, 1, 2)

# (BTCV id, HU, centre (u, v, w), radii (u, v, w)) in fractions of the field of view; u: towards the subject's
# right, v: anterior, w: superior (RAS+). Painted in order, later structures overwrite earlier ones.
_ELLIPSOIDS: tuple[tuple[int, float, tuple[float, float, float], tuple[float, float, float]], ...] = (
    (6, 60.0, (0.68, 0.52, 0.62), (0.20, 0.19, 0.42)),  # liver
    (1, 50.0, (0.25, 0.38, 0.66), (0.08, 0.10, 0.22)),  # spleen
    (7, 15.0, (0.36, 0.63, 0.64), (0.11, 0.10, 0.24)),  # stomach
    (4, 5.0, (0.62, 0.69, 0.40), (0.05, 0.05, 0.16)),  # gallbladder
    (2, 150.0, (0.65, 0.29, 0.36), (0.06, 0.07, 0.22)),  # right kidney
    (3, 150.0, (0.35, 0.29, 0.42), (0.06, 0.07, 0.22)),  # left kidney
    (11, 45.0, (0.47, 0.50, 0.42), (0.17, 0.045, 0.12)),  # pancreas, elongated left-right
)
# (BTCV id or 0, HU, centre (u, v), radius, w range): tubes along the cranio-caudal axis.
_TUBES: tuple[tuple[int, float, tuple[float, float], float, tuple[float, float]], ...] = (
    (0, 600.0, (0.50, 0.19), 0.065, (0.0, 1.0)),  # vertebral column (background)
    (8, 200.0, (0.45, 0.37), 0.040, (0.0, 1.0)),  # aorta
    (9, 160.0, (0.57, 0.39), 0.040, (0.0, 1.0)),  # inferior vena cava (distractor -> 0)
    (5, 40.0, (0.43, 0.45), 0.028, (0.72, 1.0)),  # esophagus (distractor -> 0)
)
_AIR, _FAT, _SOFT = -1000.0, -100.0, 40.0


def _check_shape_spacing(shape: Sequence[int], spacing: Sequence[float]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if len(shape) != 3 or any(int(s) != s or s < 8 for s in shape[:2]) or int(shape[2]) != shape[2] or shape[2] < 2:
        raise ValueError(f"shape must be (H, W, D) with H, W >= 8 and D >= 2 ints, got {shape!r}.")
    if len(spacing) != 3 or any(not (0 < float(s) < float("inf")) for s in spacing):
        raise ValueError(f"spacing must be three positive finite numbers (mm), got {spacing!r}.")
    return tuple(int(s) for s in shape), tuple(float(s) for s in spacing)


def synthetic_ct_volume(
    case: int | str, shape: Sequence[int] = (96, 96, 24), seed: int = 0, noise_std: float = 12.0
) -> tuple[np.ndarray, np.ndarray]:
    """Generate one phantom case in memory.

    Args:
        case: case id (its number seeds the case's shape perturbations together with ``seed``).
        shape: volume shape ``(H, W, D)``, axial axis last. Defaults to ``(96, 96, 24)``.
        seed: global seed. Defaults to 0.
        noise_std: standard deviation of the Gaussian noise in HU. Defaults to 12.

    Returns:
        ``(image, label)``: HU values as ``int16`` and BTCV label ids (0..13) as ``uint8``, both ``(H, W, D)``.
    """
    shape, _ = _check_shape_spacing(shape, (1.0, 1.0, 1.0))
    if not 0 <= noise_std < float("inf"):  # NaN or inf noise would write a phantom of garbage voxels
        raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std!r}.")
    cid = int(format_case_id(case))
    rng = np.random.default_rng([int(seed), cid])
    u = (np.arange(shape[0]) + 0.5)[:, None, None] / shape[0]
    v = (np.arange(shape[1]) + 0.5)[None, :, None] / shape[1]
    w = (np.arange(shape[2]) + 0.5)[None, None, :] / shape[2]
    image = np.full(shape, _AIR, dtype=np.float32)
    label = np.zeros(shape, dtype=np.uint8)

    body_r = (0.46 + rng.uniform(-0.02, 0.02), 0.36 + rng.uniform(-0.02, 0.02))
    body = ((u - 0.5) / body_r[0]) ** 2 + ((v - 0.5) / body_r[1]) ** 2 <= 1.0
    inner = ((u - 0.5) / (body_r[0] - 0.05)) ** 2 + ((v - 0.5) / (body_r[1] - 0.05)) ** 2 <= 1.0
    body, inner = np.broadcast_to(body, shape), np.broadcast_to(inner, shape)
    image[body] = _FAT
    image[inner] = _SOFT

    for btcv_id, hu, centre, radii in _ELLIPSOIDS:
        c = [x + rng.uniform(-0.02, 0.02) for x in centre]
        r = [x * rng.uniform(0.9, 1.1) for x in radii]
        phase, amp = rng.uniform(0, 2 * np.pi), rng.uniform(0.04, 0.12)
        du, dv, dw = (u - c[0]) / r[0], (v - c[1]) / r[1], (w - c[2]) / r[2]
        # lobulated cross-sections: modulate the in-plane radius with the in-plane angle
        lobes = 1.0 + amp * np.sin(2.0 * np.arctan2(dv, du) + phase)
        mask = ((du**2 + dv**2) / lobes**2 + dw**2 <= 1.0) & inner
        image[mask] = hu + rng.uniform(-5, 5)
        label[mask] = btcv_id
    for btcv_id, hu, centre, radius, (w0, w1) in _TUBES:
        c = [x + rng.uniform(-0.01, 0.01) for x in centre]
        rad = radius * rng.uniform(0.9, 1.1)
        mask = np.broadcast_to(((u - c[0]) ** 2 + (v - c[1]) ** 2 <= rad**2) & (w >= w0) & (w <= w1), shape) & inner
        image[mask] = hu + rng.uniform(-5, 5)
        label[mask] = btcv_id

    if noise_std > 0:
        image += rng.normal(0.0, noise_std, size=shape).astype(np.float32)
    return np.clip(np.rint(image), -1024, 3071).astype(np.int16), label


def _atomic_save(path: Path, write: Any) -> None:
    with atomic_path(path) as tmp:  # keeps .nii.gz so that nibabel picks the format
        write(tmp)


def phantom_parameters(
    cases: Sequence[int | str] | None = None,
    shape: Sequence[int] = (96, 96, 24),
    spacing: Sequence[float] = (0.8, 0.8, 2.5),
    seed: int = 0,
    noise_std: float = 12.0,
) -> dict[str, Any]:
    """The parameters that determine a phantom's content, normalised (what :data:`PHANTOM_MANIFEST` records).

    Takes the arguments of :func:`generate_synthetic_ct` (without ``root`` and ``layout``) with the same defaults.
    """
    shape, spacing = _check_shape_spacing(shape, spacing)
    ids = [format_case_id(c) for c in (DEFAULT_SYNTHETIC_CASES if cases is None else cases)]
    return {
        "cases": ids, "shape": list(shape), "spacing": list(spacing), "seed": int(seed), "noise_std": float(noise_std)
    }


def generate_synthetic_ct(
    root: str | os.PathLike,
    cases: Sequence[int | str] | None = None,
    shape: Sequence[int] = (96, 96, 24),
    spacing: Sequence[float] = (0.8, 0.8, 2.5),
    seed: int = 0,
    layout: str = "raw",
    noise_std: float = 12.0,
) -> dict[str, Any]:
    """Write the synthetic CT phantom under ``root`` in the raw BTCV and/or TransUNet layout.

    ``raw`` writes ``RawData/Training/img/imgXXXX.nii.gz`` (int16 HU) and ``label/labelXXXX.nii.gz`` (uint8 BTCV
    ids) with the affine ``diag(spacing)`` (RAS+). ``transunet`` writes the preprocessed form of TransUNet: the
    image windowed to [0, 1] ([-125, 275] HU) and the label mapped to the 9 Synapse classes, as
    ``train_npz/caseXXXX_sliceNNN.npz`` (one per axial slice) for cases outside TransUNet's test list and
    ``test_vol_h5/caseXXXX.npy.h5`` (``(D, H, W)``; only when h5py is installed) for test cases. ``both`` writes
    both. Files are written atomically; :data:`PHANTOM_MANIFEST` records the parameters.

    Args:
        root: output folder (created if needed).
        cases: case ids to write; ids of TransUNet's lists make :func:`synapse_datalist`'s default splits work
            with few cases. Defaults to :data:`DEFAULT_SYNTHETIC_CASES` (train 5, 6, 7, 40 and test 1, 2).
        shape: volume shape ``(H, W, D)``, axial axis last. Defaults to ``(96, 96, 24)``.
        spacing: voxel spacing in mm (anisotropic like abdominal CT). Defaults to ``(0.8, 0.8, 2.5)``.
        seed: global seed; the output is a deterministic function of ``(seed, case, shape, noise_std)``.
            Defaults to 0.
        layout: ``"raw"``, ``"transunet"`` or ``"both"``. Defaults to ``"raw"``.
        noise_std: Gaussian noise standard deviation in HU. Defaults to 12.

    Returns:
        ``{"root", "layout", "cases", "train_cases", "test_cases", "shape", "spacing", "files"}`` where ``cases`` are
        4-digit ids, ``train_cases`` / ``test_cases`` split them by TransUNet's lists and ``files`` lists the
        written paths.
    """
    if layout not in ("raw", "transunet", "both"):
        raise ValueError(f"layout must be 'raw', 'transunet' or 'both', got {layout!r}.")
    shape, spacing = _check_shape_spacing(shape, spacing)
    ids = [format_case_id(c) for c in (DEFAULT_SYNTHETIC_CASES if cases is None else cases)]
    if not ids or len(set(ids)) != len(ids):
        raise ValueError(f"cases must be a non-empty list of distinct case ids, got {cases!r}.")
    test_ids = {format_case_id(c) for c in SYNAPSE_TEST_CASES}
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    h5py = None
    if layout in ("transunet", "both") and any(c in test_ids for c in ids):
        try:
            import h5py
        except ImportError:
            warnings.warn(
                "h5py is not installed: the TransUNet test volumes (test_vol_h5) are not written "
                "(pip install spectraflow_monai[h5]).",
                stacklevel=2,
            )
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = [-(n - 1) * s / 2.0 for n, s in zip(shape, spacing)]
    files: list[str] = []
    for c in ids:
        image, label = synthetic_ct_volume(c, shape=shape, seed=seed, noise_std=noise_std)
        if layout in ("raw", "both"):
            import nibabel as nib

            for arr, sub, dtype in ((image, "img", np.int16), (label, "label", np.uint8)):
                nii = nib.Nifti1Image(arr, affine)
                nii.set_data_dtype(dtype)
                nii.header.set_xyzt_units("mm", "sec")
                nii.set_qform(affine, code=1)
                nii.set_sform(affine, code=1)
                path = root / "RawData" / "Training" / sub / f"{sub}{c}.nii.gz"
                _atomic_save(path, lambda p, _n=nii: nib.save(_n, p))
                files.append(str(path))
        if layout in ("transunet", "both"):
            windowed = ((np.clip(image.astype(np.float32), -125.0, 275.0) + 125.0) / 400.0).astype(np.float32)
            from spectraflow_monai.apps.synapse.readers import map_btcv_labels  # torch: not for --help

            mapped = map_btcv_labels(label, case=c, dtype=np.uint8)
            if c in test_ids:
                if h5py is None:
                    continue
                path = root / "test_vol_h5" / f"case{c}.npy.h5"

                def _write_h5(p: str, _img: np.ndarray = windowed, _lbl: np.ndarray = mapped) -> None:
                    with h5py.File(p, "w") as f:
                        f.create_dataset("image", data=np.moveaxis(_img, -1, 0))
                        f.create_dataset("label", data=np.moveaxis(_lbl, -1, 0))

                _atomic_save(path, _write_h5)
                files.append(str(path))
            else:
                for k in range(shape[2]):
                    path = root / "train_npz" / f"case{c}_slice{k:03d}.npz"
                    sl = (np.ascontiguousarray(windowed[..., k]), np.ascontiguousarray(mapped[..., k]))
                    _atomic_save(path, lambda p, _s=sl: np.savez(p, image=_s[0], label=_s[1]))
                    files.append(str(path))
    params = phantom_parameters(ids, shape, spacing, seed, noise_std)
    write_text_atomic(root / PHANTOM_MANIFEST, json.dumps(params, indent=1) + "\n")
    return {
        "root": str(root),
        "layout": layout,
        "cases": ids,
        "train_cases": [c for c in ids if c not in test_ids],
        "test_cases": [c for c in ids if c in test_ids],
        "shape": list(shape),
        "spacing": list(spacing),
        "files": files,
    }


def main(argv: Sequence[str] | None = None, prog: str = "spectraflow synthetic-ct") -> dict[str, Any]:
    """Command line entry point: ``spectraflow synthetic-ct --output DIR [options]``."""
    parser = argparse.ArgumentParser(prog=prog, description="Write the synthetic Synapse-like CT phantom.")
    parser.add_argument("--output", "--root", dest="output", required=True, metavar="DIR",
                        help="output folder (--root is the former name)")
    parser.add_argument("--cases", nargs="+", default=None, help="case ids (default: 5 6 7 40 1 2)")
    parser.add_argument("--shape", nargs=3, type=int, default=[96, 96, 24], metavar=("H", "W", "D"))
    parser.add_argument("--spacing", nargs=3, type=float, default=[0.8, 0.8, 2.5], metavar=("SX", "SY", "SZ"))
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--layout", choices=("raw", "transunet", "both"), default="raw",
                        help="on-disk layout: raw (BTCV release), transunet (npz/h5), both (default raw)")
    parser.add_argument("--noise-std", type=float, default=12.0, help="image noise in HU (default 12)")
    args = parser.parse_args(argv)
    info = generate_synthetic_ct(
        args.output,
        cases=args.cases,
        shape=args.shape,
        spacing=args.spacing,
        seed=args.seed,
        layout=args.layout,
        noise_std=args.noise_std,
    )
    summary = {k: v for k, v in info.items() if k != "files"}
    summary["num_files"] = len(info["files"])
    print(json.dumps(summary, indent=1))
    return info


if __name__ == "__main__":
    main()
