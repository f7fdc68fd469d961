#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one go: inference and Stage-2 training throughput per precision,
# SpectraFlow against MONAI's 2D UNet, and the Stage-1 iteration cost; each part's output goes to its own file in
# <output dir>, written as it runs.
#
#   bash benchmarks/gpu_benchmarks.sh <kvasir-seg dir> <output dir> [num_workers=8] [seconds per part=180]
#
# Each part runs under its own time limit (a part that runs over it is stopped, its file keeps what it printed, and
# the next part starts), so one slow part cannot take the others with it on a time-limited machine. Random encoder
# weights throughout (the weights do not change the throughput); the Kvasir-SEG copy feeds the Stage-2 trainers
# through the bundle's own data pipeline.
set -uo pipefail
DATA=$(realpath "$1"); OUT=$(realpath -m "$2"); WORKERS=${3:-8}; LIMIT=${4:-180}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

part() {  # part <name> <command...>: run under `timeout` (SIGINT, then SIGKILL 10 s later), output to <name>.txt
    local name=$1; shift
    echo "== $name: $*" | tee "$OUT/$name.txt"
    timeout -s INT -k 10 "$LIMIT" "$@" >>"$OUT/$name.txt" 2>&1
    echo "== $name: exit $? after $SECONDS s" | tee -a "$OUT/$name.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
python -c "import torch, monai, timm; print('torch', torch.__version__, 'monai', monai.__version__, 'timm', timm.__version__)" \
    >>"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
part inference python "$HERE/bench_inference.py" --device cuda --batch 32 --rounds 5 --iters 10 \
    --precision fp32 bf16 fp16
part stage2 python "$HERE/bench_stage2_throughput.py" --device cuda --dataset kvasir --dataset-dir "$DATA" \
    --num-workers "$WORKERS" --iters 60 --warmup 5 --rounds 2 --precision fp32 bf16 fp16
part stage1 python "$HERE/bench_stage1.py" --device cuda --batch 32 --rounds 5 --iters 5
