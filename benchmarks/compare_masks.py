"""How far two folders of predicted masks (the same file names) differ: share of differing pixels and Dice.

Usage (e.g. PyTorch inference against inference through an int8 ONNX export of the same model)::

    python benchmarks/compare_masks.py predictions_pytorch predictions_onnx

Prints the number of masks, the mean and largest share of pixels that differ, the mean and smallest Dice between the
two folders' foregrounds (two empty masks: Dice 1) and how many masks are identical. Masks are read with Pillow
(PNG, ...) or nibabel (NIfTI); a file that one folder lacks is an error naming it.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def _read(path: str) -> np.ndarray:
    if path.endswith((".nii", ".nii.gz")):
        import nibabel as nib

        return np.asarray(nib.load(path).dataobj)
    from PIL import Image

    return np.asarray(Image.open(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="a folder of masks")
    parser.add_argument("second", help="a folder of masks with the same file names")
    args = parser.parse_args(argv)
    names = sorted(os.listdir(args.first))
    missing = sorted(set(names) ^ set(os.listdir(args.second)))
    if missing:
        print(f"error: {len(missing)} file(s) are in one folder only, e.g. {missing[:3]}", file=sys.stderr)
        return 2
    diff, dice = [], []
    for name in names:
        a, b = _read(os.path.join(args.first, name)) > 0, _read(os.path.join(args.second, name)) > 0
        if a.shape != b.shape:
            print(f"error: {name}: shapes differ, {a.shape} and {b.shape}", file=sys.stderr)
            return 2
        diff.append(float((a != b).mean()))
        total = int(a.sum() + b.sum())
        dice.append(1.0 if total == 0 else 2.0 * int((a & b).sum()) / total)
    print(f"{len(names)} masks | pixels differing: mean {100 * np.mean(diff):.4f} %, max {100 * np.max(diff):.4f} % | "
          f"Dice: mean {np.mean(dice):.4f}, min {np.min(dice):.4f} | identical: {sum(d == 0 for d in diff)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
