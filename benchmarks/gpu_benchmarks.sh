#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one go: inference and Stage-2 training throughput per precision,
# SpectraFlow against MONAI's 2D UNet, and the Stage-1 iteration cost; each part's output goes to <output dir>.
#
#   bash benchmarks/gpu_benchmarks.sh <kvasir-seg dir> <output dir> [num_workers=8]
#
# Random encoder weights throughout (the weights do not change the throughput); the Kvasir-SEG copy feeds the
# Stage-2 trainers through the bundle's own data pipeline.
set -euo pipefail
DATA=$(realpath "$1"); OUT=$(realpath -m "$2"); WORKERS=${3:-8}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, monai, timm; print('torch', torch.__version__, 'monai', monai.__version__, 'timm', timm.__version__)" \
    | tee -a "$OUT/gpu.txt"
set -x
python "$HERE/bench_inference.py" --device cuda --batch 32 --rounds 5 --iters 10 --precision fp32 bf16 fp16 \
    2>&1 | tee "$OUT/inference.txt"
python "$HERE/bench_stage2_throughput.py" --device cuda --dataset kvasir --dataset-dir "$DATA" \
    --num-workers "$WORKERS" --iters 60 --warmup 5 --rounds 2 --precision fp32 bf16 fp16 2>&1 | tee "$OUT/stage2.txt"
python "$HERE/bench_stage1.py" --device cuda --batch 32 --rounds 5 --iters 5 2>&1 | tee "$OUT/stage1.txt"
