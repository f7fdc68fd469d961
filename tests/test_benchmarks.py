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
    ("bench_stage1.py", ["--size", "28", "--batch", "2", "--rounds", "1", "--threads", "1"], "Stage-1 / baseline"),
    (
        "bench_synapse.py",
        ["--shape", "32", "32", "4", "--size", "28", "--rounds", "1", "--metric-runs", "1", "--threads", "1"],
        "ratio",
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
