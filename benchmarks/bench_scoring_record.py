"""What writing the uncertainty scores into the datastore's record costs per image as the datastore grows.

The MONAI Label app's scoring run writes each image's score into the datastore's record (``datastore_v2.json``),
which holds every image, label and info and is written whole. Written image by image (MONAI Label's
``update_image_info``, one write of the record per image), the cost per image grows with the datastore; written a few
images at a time (the app's ``lib.scoring._InfoWriter``: each score into the record in memory at once, the file
written every ``WRITE_SECONDS`` at the least and no more often than keeps the writing under ``WRITE_SHARE`` of the
run's time), it does not. Both are timed on the same datastores in interleaved rounds (median reported); the
network's own cost per image (docs/benchmarks.md, "Uncertainty scoring") is the same in both and left out: the
batched writer's clock advances ``--per-image`` seconds per image on top of the real time.

Usage::

    python benchmarks/bench_scoring_record.py --sizes 600 3000 --scores 200 --rounds 3

Prints a markdown table: milliseconds of record writing per scored image, image by image and batched, for each
datastore size, and how each grows from the smallest size to the largest. Needs MONAI Label (the ``label`` extra).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundles" / "monailabel_app"))

from lib.datastore import CheckedLocalDatastore  # noqa: E402
from lib.scoring import MODEL_KEY, SCORE_KEY, TIME_KEY, WEIGHTS_KEY, _InfoWriter  # noqa: E402


def _datastore(folder: Path, images: int) -> CheckedLocalDatastore:
    pixels = np.zeros((8, 8, 3), np.uint8)
    for i in range(images):
        Image.fromarray(pixels).save(folder / f"img{i:05d}.png")
    return CheckedLocalDatastore(str(folder), extensions=["*.png"], auto_reload=False)


def _info(i: int) -> dict:
    return {SCORE_KEY: 0.5 + i * 1e-6, MODEL_KEY: "model", WEIGHTS_KEY: "1-1", TIME_KEY: int(time.time())}


def _one_by_one(store: CheckedLocalDatastore, ids: list[str], per_image_s: float) -> float:
    started = time.perf_counter()
    for i, image_id in enumerate(ids):
        store.update_image_info(image_id, _info(i))
    return (time.perf_counter() - started) / len(ids)


def _batched(store: CheckedLocalDatastore, ids: list[str], per_image_s: float) -> float:
    """The app's writer; its clock is the real time plus ``per_image_s`` per image scored (the network's time, not
    spent here)."""
    network, started_run = [0.0], time.perf_counter()
    writer = _InfoWriter(store, clock=lambda: network[0] + time.perf_counter() - started_run)
    spent = 0.0
    for i, image_id in enumerate(ids):
        network[0] += per_image_s
        started = time.perf_counter()
        writer.add(image_id, _info(i))
        spent += time.perf_counter() - started
    started = time.perf_counter()
    writer.flush()
    return (spent + time.perf_counter() - started) / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[600, 3000], help="datastore sizes (images)")
    parser.add_argument("--scores", type=int, default=400, help="images scored per round (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--per-image", type=float, default=0.24,
                        help="seconds the network spends per image (default 0.24: a 2D image on 2 CPU threads)")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes:
            folder = Path(root) / f"store{size}"
            folder.mkdir()
            store = _datastore(folder, size)
            ids = sorted(store.list_images())[: args.scores]
            times: dict[str, list[float]] = {"one by one": [], "batched": []}
            for _ in range(args.rounds):
                times["one by one"].append(_one_by_one(store, ids, args.per_image))
                times["batched"].append(_batched(store, ids, args.per_image))
            rows[size] = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print("| datastore images | image by image, ms / image | batched, ms / image |\n| ---: | ---: | ---: |")
    for size, row in rows.items():
        print(f"| {size} | {row['one by one']:.2f} | {row['batched']:.3f} |")
    first, last = args.sizes[0], args.sizes[-1]
    for kind in ("one by one", "batched"):
        print(f"{kind}: {rows[last][kind] / rows[first][kind]:.2f}x from {first} to {last} images")


if __name__ == "__main__":
    main()
