"""A synthetic 2D lesion-segmentation set, for tests, smoke runs and offline demos of SpectraFlow.

Each image holds one to three lesion-like blobs (star-shaped regions whose radius varies smoothly with the angle,
so the boundary wobbles) on a textured background. Appearance varies from image to image (background and lesion
colours, which one is brighter, texture strength, shading, blur, noise) while the geometry carries the label, so a
network has to learn shape and boundary rather than a fixed colour, in the spirit of the structure-aware pretraining
of SpectraFlow (Chen et al.).

Layout written (read by :func:`spectraflow_monai.apps.seg2d.presets.synthetic_datalist`)::

    <root>/images/synth_{train,val}_NNNN.png   RGB, size x size
    <root>/masks/synth_{train,val}_NNNN.png    8-bit, 0 = background, 255 = lesion (binarise at 128)
    <root>/splits/train.txt, val.txt           one id per line
    <root>/synthetic2d.json                    the generation parameters (written last)

Generation is deterministic: image ``i`` of a split depends only on ``(seed, split, i)``. It is idempotent: when
``synthetic2d.json`` records the same parameters the call returns at once. About 10 ms per 224x224 image.

Command line::

    spectraflow synthetic-2d --output DIR --num-train 80 --num-val 20
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from spectraflow_monai.utils.errors import DatasetError
from spectraflow_monai.utils.files import atomic_path, write_text_atomic

__all__ = ["generate_synthetic_dataset", "synthesize_pair"]

_VERSION = 1
_SPLIT_CODES = {"train": 0, "val": 1}


def _smooth_noise(rng: np.random.Generator, size: int, cells: int, channels: int = 1) -> np.ndarray:
    """Smooth random field in [0, 1] of shape (size, size, channels): bilinear upsampling of a coarse grid."""
    grid = rng.random((cells + 1, cells + 1, channels), dtype=np.float32)
    x = np.linspace(0, cells, size, dtype=np.float32)
    i0 = np.minimum(x.astype(int), cells - 1)
    f = (x - i0)[:, None]
    rows = grid[i0] * (1 - f[..., None]) + grid[i0 + 1] * f[..., None]  # (size, cells+1, ch)
    cols = rows[:, i0] * (1 - f.T[..., None]) + rows[:, i0 + 1] * f.T[..., None]  # (size, size, ch)
    return cols


def _blob_mask(rng: np.random.Generator, size: int, mask: np.ndarray) -> None:
    """Add (OR) one star-shaped blob with a smooth wobbly boundary to ``mask``."""
    r0 = rng.uniform(0.08, 0.22) * size
    cy, cx = rng.uniform(r0, size - r0, size=2)
    stretch = rng.uniform(0.7, 1.3)
    angle = rng.uniform(0, np.pi)
    amps = [rng.uniform(0.0, 0.25 / k) for k in range(2, 6)]
    phases = rng.uniform(0, 2 * np.pi, size=4)
    # the blob lies within 1.32 * r0 / 0.7 < 2 * r0 of its centre: rasterise that box only
    y0, y1 = max(int(cy - 2 * r0), 0), min(int(cy + 2 * r0) + 1, size)
    x0, x1 = max(int(cx - 2 * r0), 0), min(int(cx + 2 * r0) + 1, size)
    dy, dx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dy -= cy
    dx -= cx
    ca, sa = np.cos(angle), np.sin(angle)
    u, v = (dx * ca + dy * sa) * stretch, (-dx * sa + dy * ca) / stretch
    theta = np.arctan2(v, u)
    radius = np.ones_like(theta)
    for k, (amp, phase) in enumerate(zip(amps, phases), start=2):
        radius += amp * np.sin(k * theta + phase)
    mask[y0:y1, x0:x1] |= np.hypot(u, v) < r0 * radius


def synthesize_pair(rng: np.random.Generator, size: int = 224) -> tuple[np.ndarray, np.ndarray]:
    """Draw one (image, mask) pair.

    Args:
        rng: numpy random generator (the only source of randomness).
        size: side length in pixels. Defaults to 224.

    Returns:
        ``image`` uint8 (size, size, 3) and ``mask`` uint8 (size, size) with values 0/255.
    """
    mask = np.zeros((size, size), dtype=bool)
    for _ in range(int(rng.integers(1, 4))):
        _blob_mask(rng, size, mask)

    # colours: background and lesion differ in a random direction and by a random contrast
    bg = rng.uniform(0.25, 0.75, size=3)
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction) + 1e-8
    contrast = rng.uniform(0.12, 0.35) * (1 if rng.random() < 0.5 else -1)
    fg = np.clip(bg + contrast * (0.4 + 0.6 * np.abs(direction)) + 0.08 * rng.normal(size=3), 0.02, 0.98)

    # textures: low-frequency mottling for both, a finer texture inside the lesion
    tex_bg = _smooth_noise(rng, size, int(rng.integers(3, 9)), 3) - 0.5
    tex_fg = _smooth_noise(rng, size, int(rng.integers(10, 28)), 1) - 0.5
    soft = mask.astype(np.float32)
    # soften the lesion edge a little so the boundary is not a hard step
    from scipy.ndimage import gaussian_filter

    soft = gaussian_filter(soft, sigma=rng.uniform(0.6, 2.0))[..., None]
    img = bg.astype(np.float32) + rng.uniform(0.1, 0.3) * tex_bg
    img = img * (1 - soft) + (fg + rng.uniform(0.05, 0.25) * tex_fg) * soft

    # illumination: a smooth vignette/shading centred at a random point
    cy, cx = rng.uniform(0.2, 0.8, size=2) * size
    axis = np.arange(size, dtype=np.float32)
    shade = 1.0 - rng.uniform(0.0, 0.4) * (((axis[:, None] - cy) ** 2 + (axis[None, :] - cx) ** 2) / (size**2))
    img = img * shade[..., None]

    sigma = rng.uniform(0.0, 1.5)
    if sigma > 0.3:
        img = gaussian_filter(img, sigma=(sigma, sigma, 0))
    img = img + rng.normal(0.0, rng.uniform(0.0, 0.05), size=img.shape).astype(np.float32)
    image = (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return image, (mask.astype(np.uint8) * 255)


def _save_png(array: np.ndarray, path: str) -> None:
    from PIL import Image

    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG", compress_level=1)


def generate_synthetic_dataset(
    root: str | os.PathLike,
    num_train: int = 80,
    num_val: int = 20,
    size: int = 224,
    seed: int = 0,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write a synthetic lesion-segmentation set (see the module docstring for the layout).

    Args:
        root: output folder (created when missing).
        num_train: number of training pairs (>= 1). Defaults to 80.
        num_val: number of validation pairs (>= 1). Defaults to 20.
        size: image side in pixels (>= 16). Defaults to 224.
        seed: generator seed. Defaults to 0.
        overwrite: regenerate even when a set with the same parameters is there, and replace a set generated with
            different parameters (stale ``synth_*.png`` files are removed). Defaults to ``False``.

    Returns:
        The parameters, ``root``, ``skipped`` (True when nothing was written) and ``foreground_fraction`` (mean).

    Raises:
        ValueError: for invalid arguments.
        DatasetError: ``root`` holds a set generated with other parameters and ``overwrite`` is False.
    """
    for arg, value, low in (("num_train", num_train, 1), ("num_val", num_val, 1), ("size", size, 16)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{arg} must be an integer >= {low}, got {value!r}.")
    root = os.fspath(root)
    params = {
        "version": _VERSION,
        "num_train": int(num_train),
        "num_val": int(num_val),
        "size": int(size),
        "seed": int(seed),
    }
    manifest = os.path.join(root, "synthetic2d.json")
    if os.path.isfile(manifest) and not overwrite:
        with open(manifest) as f:
            old = json.load(f)
        if {k: old.get(k) for k in params} == params:
            return {**old, "root": root, "skipped": True}
        differs = {k: old.get(k) for k in params if old.get(k) != params[k]}
        raise DatasetError(
            f"{root!r} holds a synthetic set generated with other parameters ({differs}) than the requested ones "
            f"({ {k: params[k] for k in differs} }): request the same ones (the bundles' synthetic_size), choose "
            "another folder (dataset_dir), or replace it (overwrite=True)."
        )
    dirs = {k: os.path.join(root, k) for k in ("images", "masks", "splits")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    if os.path.exists(manifest):
        os.remove(manifest)  # a partially rewritten set must not look complete
    fg = []
    ids: dict[str, list[str]] = {}
    for split, count in (("train", num_train), ("val", num_val)):
        ids[split] = []
        for i in range(count):
            rng = np.random.default_rng([int(seed), _SPLIT_CODES[split], i])
            image, mask = synthesize_pair(rng, size)
            name = f"synth_{split}_{i:04d}"
            _save_png(image, os.path.join(dirs["images"], f"{name}.png"))
            _save_png(mask, os.path.join(dirs["masks"], f"{name}.png"))
            ids[split].append(name)
            fg.append(float(np.mean(mask > 0)))
        write_text_atomic(os.path.join(dirs["splits"], f"{split}.txt"), "\n".join(ids[split]) + "\n")
    keep = {f"{n}.png" for names in ids.values() for n in names}
    for key in ("images", "masks"):
        for fname in os.listdir(dirs[key]):
            if fname.startswith("synth_") and fname.endswith(".png") and fname not in keep:
                os.remove(os.path.join(dirs[key], fname))
    info = {**params, "foreground_fraction": float(np.mean(fg))}
    write_text_atomic(manifest, json.dumps(info, indent=2) + "\n")
    return {**info, "root": root, "skipped": False}


def main(argv: list[str] | None = None, prog: str = "spectraflow synthetic-2d") -> dict[str, Any]:
    """Command-line entry point: ``spectraflow synthetic-2d --output DIR [options]``."""
    parser = argparse.ArgumentParser(prog=prog, description="Write a synthetic 2D lesion-segmentation set.")
    parser.add_argument("--output", "--root", dest="output", required=True, metavar="DIR",
                        help="output folder (--root is the former name)")
    parser.add_argument("--num-train", type=int, default=80, help="training images (default 80)")
    parser.add_argument("--num-val", type=int, default=20, help="validation images (default 20)")
    parser.add_argument("--image-size", "--size", dest="image_size", type=int, default=224,
                        help="image side in pixels (default 224; --size is the former name)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="rewrite a set already there")
    args = parser.parse_args(argv)
    info = generate_synthetic_dataset(
        args.output, args.num_train, args.num_val, args.image_size, args.seed, args.overwrite
    )
    state = "already there" if info["skipped"] else "written"
    print(
        f"synthetic set {state}: {info['root']} ({info['num_train']} train, {info['num_val']} val, "
        f"{info['size']}x{info['size']}, mean foreground {100 * info['foreground_fraction']:.1f}%)"
    )
    return info


if __name__ == "__main__":
    main()
