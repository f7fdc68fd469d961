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
