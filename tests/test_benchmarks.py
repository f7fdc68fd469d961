"""The benchmark scripts still run (tiny settings; the timing figures themselves live in docs/benchmarks.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

CASES = [
    # 224: MONAI UNet needs a multiple of 16 and SwinUNETR of 32
    ("bench_inference.py", ["--size", "224", "--batch", "1", "--rounds", "1", "--iters", "1"], "ratio to bare encoder"),
    ("bench_boundary_loss.py", ["--size", "32", "--batch", "2", "--classes", "1", "3", "--rounds", "1"],
     "maps ratio MONAI / torch"),
    ("bench_stage1.py", ["--size", "28", "--batch", "2", "--rounds", "1", "--threads", "1"], "Stage-1 / baseline"),
    (
        "bench_stage1.py",
        ["--size", "28", "--batch", "2", "--rounds", "1", "--threads", "1", "--precision", "bf16", "--no-breakdown"],
        "precision bf16",
    ),
    (
        "bench_synapse.py",
        ["--shape", "32", "32", "4", "--size", "28", "--rounds", "1", "--metric-runs", "1", "--threads", "1"],
        "ratio",
    ),
    ("bench_precision.py", ["--tiny", "--threads", "1"], "bf16 / fp32 speed-up"),
    ("bench_uncertainty.py", ["--size", "28", "--images", "2", "--batch", "2", "--rounds", "1", "--threads", "1"],
     "ratio to inference"),
    ("bench_host_overhead.py", ["--tiny"], "host-side (ms/image)"),
    ("bench_stage2_throughput.py", ["--tiny", "--threads", "1"], "SpectraFlow bf16 / fp32"),
    # the paper's Fig. 5 baseline beside the two
    (
        "bench_stage2_throughput.py",
        ["--tiny", "--threads", "1", "--precision", "fp32", "--models", "spectraflow", "unet", "unetpp"],
        "SpectraFlow / U-Net++ at fp32",
    ),
    # a second round keeps --warmup + --iters iterations (a rerun of a finished ignite engine would take the loader's
    # whole length: 3 batches in the tiny set, 2 in the epoch)
    ("bench_stage2_throughput.py", ["--tiny", "--threads", "1", "--precision", "fp32", "--rounds", "2"], "round 2:"),
    (
        "bench_stage2_throughput.py",
        ["--tiny", "--threads", "1", "--no-loader", "--precision", "fp32"],
        "one fixed batch, no data loading",
    ),
]


@pytest.mark.parametrize("script,args,expect", CASES, ids=[c[0] for c in CASES])
def test_benchmark_script_runs(script, args, expect):
    if script == "bench_inference.py":
        pytest.importorskip("einops", reason="MONAI's SwinUNETR needs einops (pip install -e '.[bench]')")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], cwd=BENCH, env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert expect in out, out[-4000:]
    if script == "bench_precision.py":
        assert "native bfloat16 flags:" in out and "(b) Agreement of a trained model: skipped" in out
    if script == "bench_stage2_throughput.py" and "--no-loader" not in args and "--precision" not in args:
        assert "network output bfloat16" in out and "network output float32" in out
    if script == "bench_stage2_throughput.py":
        assert "GFLOP per training image" in out and "UNet / SpectraFlow FLOPs per training image" in out
    if "unetpp" in args:
        assert "U-Net++ / SpectraFlow FLOPs per training image" in out and "U-Net++ 2D (unetpp_baseline.yaml)" in out
    if "--no-loader" in args:
        assert "not the target's measurement" in out and "network output float32" in out


def test_bench_precision_trained_model_agreement(tmp_path):
    """Part (b) of bench_precision.py on a toy dataset and a toy 2D bundle model."""
    import torch

    from spectraflow_monai.apps.seg2d import generate_synthetic_dataset
    from spectraflow_monai.networks import SpectraFlowNet

    generate_synthetic_dataset(tmp_path / "data", num_train=2, num_val=2, size=28, seed=0)
    net = SpectraFlowNet(out_channels=1, img_size=28, encoder_kwargs={"depth": 2})
    torch.save({"model": net.state_dict()}, tmp_path / "model.pt")
    args = ["--tiny", "--threads", "1", "--parts", "b", "--model", str(tmp_path / "model.pt"), "--data",
            str(tmp_path / "data"), "--model-size", "28", "--override", "encoder_kwargs={depth: 2}"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_precision.py"), *args],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "thresholded predictions agree on" in out and "Dice moves by" in out, out[-4000:]


def test_collect_gpu_results_reads_the_part_files(tmp_path):
    """collect_gpu_results.py turns gpu_benchmarks.sh's part files into the record with the issue's keys."""
    import json

    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu.txt").write_text("name, memory.total [MiB], driver_version\nNVIDIA H200, 143771 MiB, 580\n")
    (out / "stage2.txt").write_text(
        "| model | precision | images/s | ratio to UNet (same precision) | ratio to own first precision |\n"
        "| --- | --- | ---: | ---: | ---: |\n"
        "| SpectraFlow-S (bundle) | bf16 | 300.50 | 1.1 | - |\n"
        "| U-Net++ 2D (unetpp_baseline.yaml) | bf16 | 150.25 | 0.5 | - |\n"
    )
    (out / "inference.txt").write_text(
        "| model | precision | params (M) | images/s | ratio to bare encoder | ratio to its fp32 |\n| --- |\n"
        "| DINOv2 ViT-S encoder (bare) | fp32 | 22.0 | 1000.00 | 1.000 | - |\n"
        "| DINOv2 ViT-S encoder (bare) | bf16 | 22.0 | 2000.00 | 1.000 | 2.00x |\n"
        "| SpectraFlowNet-S (DAF + fdconv) | bf16 | 23.0 | 1900.00 | 0.950 | 2.00x |\n"
    )
    (out / "stage1.txt").write_text("| iteration | s/iteration |\n| --- |\n| baseline | 0.1 | 80.00 |\n| Stage-1 | 0.2 | 40.00 |\n")
    lines = [f"Stage-1 epoch {e}/3 | loss 1 | lr 1e-05 | {s}s" for e, s in ((1, 9.0), (2, 2.2), (3, 2.0))]
    lines += [f"Stage-2 epoch {e}/3 | train_loss 1 | lr 1e-4 | {s}s | best val_mean_dice 0.5 (epoch 1)"
              for e, s in ((1, 8.0), (2, 3.0), (3, 3.0))]  # fmt: skip
    (out / "kvasir.txt").write_text("\n".join(lines) + "\n")
    (out / "util_stage2.txt").write_text("90\n100\n")
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "collect_gpu_results.py"), str(out), "--results-dir", str(results)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (written,) = results.glob("nvidia-h200-*.json")
    record = json.loads(written.read_text())
    assert record["device"] == "NVIDIA H200"
    assert record["stage2_images_per_s"] == 300.5 and record["unetpp_stage2_images_per_s"] == 150.25
    assert record["inference_images_per_s"] == 1900.0 and record["encoder_images_per_s"] == 2000.0
    assert record["stage1_images_per_s"] == round(880 / 2.1, 2) and record["stage1_source"] == "protocol epochs"
    assert record["protocol_minutes"] == round((300 * 2.1 + 100 * 3.0) / 60, 1)
    assert record["gpu_busy_fraction_stage2"] == 0.95 and record["gpu_busy_fraction_protocol"] is None


@pytest.mark.slow
def test_gpu_benchmarks_dry_run(tmp_path):
    """gpu_benchmarks.sh --dry-run: every part but the GPU tests and the protocol, on the CPU, and the record."""
    pytest.importorskip("einops", reason="bench_inference.py's SwinUNETR needs einops")
    import json

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(BENCH / "gpu_benchmarks.sh"), "--dry-run", str(tmp_path)], env=env, capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    record = json.loads((tmp_path / "dry-run.json").read_text())
    for key in ("device", "stage2_images_per_s", "unetpp_stage2_images_per_s", "stage1_images_per_s",
                "inference_images_per_s", "encoder_images_per_s", "protocol_minutes"):  # fmt: skip
        assert key in record and record[key] is not None, key
    assert record["dry_run"] is True and not list((BENCH / "results").glob("dry*"))


def test_compare_masks(tmp_path):
    import numpy as np
    from PIL import Image

    for folder, value in (("a", 255), ("b", 0)):
        (tmp_path / folder).mkdir()
        mask = np.zeros((10, 10), np.uint8)
        mask[:5] = 255
        mask[0, 0] = value  # one pixel of 100 differs
        Image.fromarray(mask).save(tmp_path / folder / "x.png")
    out = subprocess.run([sys.executable, str(BENCH / "compare_masks.py"), str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "1 masks | pixels differing: mean 1.0000 %" in out.stdout and "identical: 0" in out.stdout
    (tmp_path / "b" / "y.png").write_bytes((tmp_path / "b" / "x.png").read_bytes())
    out = subprocess.run([sys.executable, str(BENCH / "compare_masks.py"), str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "in one folder only" in out.stderr
