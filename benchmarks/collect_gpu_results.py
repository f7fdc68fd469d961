"""Collect the part files of ``gpu_benchmarks.sh`` into one JSON record (``benchmarks/results/<gpu>-<date>.json``).

Usage::

    python benchmarks/collect_gpu_results.py <output dir of gpu_benchmarks.sh> [--results-dir benchmarks/results]
        [--dry-run] [--train-images 880] [--stage1-epochs 300] [--stage2-epochs 100] [--precision bf16]

Keys (``null`` where the part did not run or printed nothing usable):

- ``device``: the GPU's name (``nvidia-smi``; the CPU on a dry run);
- ``stage2_images_per_s`` / ``unetpp_stage2_images_per_s``: Stage-2 training images/s of SpectraFlow-S and of U-Net++
  (the paper's Fig. 5 baseline) at ``--precision``, same run, same data path (``stage2.txt``,
  ``bench_stage2_throughput.py``, data loading included);
- ``stage1_images_per_s``: Stage-1 images/s end to end: the training images over the median Stage-1 epoch time of
  the Kvasir protocol's epoch lines (``kvasir.txt``; the first epoch left out when there are at least 3) or, without
  them, the Stage-1 iteration of ``bench_stage1.py`` on a synthetic batch (``stage1.txt``, no data loading);
  ``stage1_source`` says which;
- ``inference_images_per_s`` / ``encoder_images_per_s``: SpectraFlowNet-S and the bare encoder at batch 32
  (``inference.txt``, ``bench_inference.py``) at ``--precision`` (float32 where that is missing);
- ``protocol_minutes``: the paper's Kvasir protocol (``--stage1-epochs`` + ``--stage2-epochs``) projected from the
  median measured epoch times of each stage (``kvasir.txt``), or from the images/s above when the protocol did not
  run (``protocol_source``);
- ``gpu_busy_fraction_stage2`` / ``gpu_busy_fraction_protocol``: mean ``utilization.gpu`` / 100 sampled by
  ``nvidia-smi`` while those parts ran (``util_stage2.txt``, ``util_kvasir.txt``);
- ``boundary_maps_ratio``: MONAI's distance maps (cuCIM where installed, else scipy) over the torch ones, per class
  count (``boundary.json``); ``host_overhead``: ``bench_host_overhead.py``'s figures (``host.json``).

A dry run (``--dry-run``) writes ``dry-run.json`` into the output dir instead (CPU smoke figures, never committed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
from pathlib import Path

ROW = re.compile(r"^\|\s*(?P<name>[^|]+?)\s*\|\s*(?P<cells>.*)\|\s*$")
EPOCH = re.compile(r"(?P<stage>Stage-[12]) epoch (?P<epoch>\d+)/\d+ .*?\|\s*(?P<seconds>[0-9.]+)s\s*(\||$)", re.M)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def table_rows(text: str) -> list[tuple[str, list[str]]]:
    """The rows of the markdown tables in ``text``: ``(first cell, other cells)``, header and rule rows skipped."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line.strip())
        if not m or set(m["cells"].replace("|", "").strip()) <= set("-: "):
            continue
        cells = [c.strip() for c in m["cells"].split("|")]
        try:
            float(cells[1] if len(cells) > 1 else "x")
        except ValueError:
            if not any(_number(c) is not None for c in cells):
                continue  # a header row
        rows.append((m["name"], cells))
    return rows


def _number(text: str) -> float | None:
    try:
        return float(text.rstrip("x"))
    except ValueError:
        return None


def stage2_figures(text: str, precision: str) -> dict[str, float | None]:
    """SpectraFlow's and U-Net++'s images/s at ``precision`` from ``bench_stage2_throughput.py``'s table."""
    out: dict[str, float | None] = {"stage2_images_per_s": None, "unetpp_stage2_images_per_s": None}
    for name, cells in table_rows(text):
        if len(cells) < 2 or cells[0] != precision:
            continue
        if name.startswith("SpectraFlow"):
            out["stage2_images_per_s"] = _number(cells[1])
        elif name.startswith("U-Net++"):
            out["unetpp_stage2_images_per_s"] = _number(cells[1])
    return out


def inference_figures(text: str, precision: str) -> dict[str, float | None]:
    """SpectraFlowNet's and the bare encoder's images/s (``bench_inference.py``), ``precision`` else fp32."""
    found: dict[tuple[str, str], float | None] = {}
    for name, cells in table_rows(text):
        if len(cells) >= 3:
            kind = "encoder" if "encoder (bare)" in name else "net" if name.startswith("SpectraFlowNet") else None
            if kind:
                found[kind, cells[0].lower()] = _number(cells[2])
    pick = {p for _, p in found}
    chosen = precision if any(p.startswith(precision) for p in pick) else "fp32"

    def get(kind: str) -> float | None:
        return next((v for (k, p), v in found.items() if k == kind and p.startswith(chosen)), None)

    return {"inference_images_per_s": get("net"), "encoder_images_per_s": get("encoder"), "inference_precision": chosen}


def stage1_iteration_images_per_s(text: str) -> float | None:
    """The Stage-1 iteration's images/s (second row of ``bench_stage1.py``'s table)."""
    rows = [cells for _, cells in table_rows(text) if len(cells) >= 2]
    return _number(rows[1][1]) if len(rows) > 1 else None


def epoch_seconds(text: str) -> dict[str, list[float]]:
    """``{"Stage-1": [s, ...], "Stage-2": [...]}`` from the epoch summary lines of the protocol's log."""
    out: dict[str, list[float]] = {"Stage-1": [], "Stage-2": []}
    for m in EPOCH.finditer(text):
        out[m["stage"]].append(float(m["seconds"]))
    return out


def _typical(seconds: list[float]) -> float | None:
    """Median epoch time, the first (warm-up, compilation) epoch left out when at least 3 were measured."""
    if not seconds:
        return None
    return statistics.median(seconds[1:] if len(seconds) >= 3 else seconds)


def busy_fraction(text: str) -> float | None:
    values = [float(v) for v in re.findall(r"^\s*(\d+(?:\.\d+)?)\s*$", text, flags=re.M)]
    return round(statistics.mean(values) / 100.0, 3) if values else None


def collect(out_dir: Path, args: argparse.Namespace) -> dict:
    gpu = _read(out_dir / "gpu.txt").splitlines()
    device = gpu[1].split(",")[0].strip() if len(gpu) > 1 and "," in gpu[1] else (gpu[0].strip() if gpu else "")
    record: dict = {"device": device or None, "precision": args.precision, "dry_run": bool(args.dry_run)}
    record.update(stage2_figures(_read(out_dir / "stage2.txt"), args.precision))
    record.update(inference_figures(_read(out_dir / "inference.txt"), args.precision))
    epochs = epoch_seconds(_read(out_dir / "kvasir.txt"))
    s1, s2 = _typical(epochs["Stage-1"]), _typical(epochs["Stage-2"])
    record["protocol_epochs_measured"] = {k: len(v) for k, v in epochs.items()}
    if s1:
        record["stage1_images_per_s"], record["stage1_source"] = round(args.train_images / s1, 2), "protocol epochs"
    else:
        record["stage1_images_per_s"] = stage1_iteration_images_per_s(_read(out_dir / "stage1.txt"))
        record["stage1_source"] = "bench_stage1.py iteration (synthetic batch, no data loading)"
    if s1 and s2:
        minutes = (args.stage1_epochs * s1 + args.stage2_epochs * s2) / 60.0
        record["protocol_source"] = "median measured epoch times"
    elif record["stage1_images_per_s"] and record["stage2_images_per_s"]:
        n = args.train_images
        seconds = args.stage1_epochs * n / record["stage1_images_per_s"]
        minutes = (seconds + args.stage2_epochs * n / record["stage2_images_per_s"]) / 60.0
        record["protocol_source"] = "images/s above (no validation, no process start)"
    else:
        minutes, record["protocol_source"] = None, None
    record["protocol_minutes"] = round(minutes, 1) if minutes is not None else None
    record["gpu_busy_fraction_stage2"] = busy_fraction(_read(out_dir / "util_stage2.txt"))
    record["gpu_busy_fraction_protocol"] = busy_fraction(_read(out_dir / "util_kvasir.txt"))
    for key, name in (("boundary_maps_ratio", "boundary.json"), ("host_overhead", "host.json")):
        path = out_dir / name
        record[key] = json.loads(path.read_text()) if path.is_file() and path.stat().st_size else None
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="the output dir of gpu_benchmarks.sh")
    parser.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--dry-run", action="store_true", help="write <out_dir>/dry-run.json (CPU smoke figures)")
    parser.add_argument("--train-images", type=int, default=880, help="Kvasir-SEG training images (default 880)")
    parser.add_argument("--stage1-epochs", type=int, default=300, help="the protocol's Stage-1 epochs (default 300)")
    parser.add_argument("--stage2-epochs", type=int, default=100, help="the protocol's Stage-2 epochs (default 100)")
    parser.add_argument("--precision", default="bf16", help="the precision the figures are read at (default bf16)")
    args = parser.parse_args()
    record = collect(args.out_dir, args)
    if args.dry_run:
        target = args.out_dir / "dry-run.json"
    else:
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", record["device"] or "unknown-gpu").strip("-").lower()
        args.results_dir.mkdir(parents=True, exist_ok=True)
        target = args.results_dir / f"{gpu}-{datetime.date.today().isoformat()}.json"
    target.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {target}")
    print(json.dumps({k: v for k, v in record.items() if not isinstance(v, dict)}, indent=1))


if __name__ == "__main__":
    main()
