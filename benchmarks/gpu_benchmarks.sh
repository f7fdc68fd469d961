#!/usr/bin/env bash
# The GPU checks and figures of docs/benchmarks.md in one go, each part under its own time limit, each writing its
# own file in <output dir> as it runs:
#
#   bash benchmarks/gpu_benchmarks.sh <kvasir-seg dir> <output dir> [num_workers=12] [stage1 epochs=3] [stage2 epochs=8] \
#       [extra bundle overrides of the Kvasir protocol, split at spaces, e.g. --stage2_settings#pretrained_weights /w/dinov2_vits14.pth]
#   bash benchmarks/gpu_benchmarks.sh --dry-run <output dir>    # the same parts on the CPU at tiny sizes (a check of
#                                                               # this script; no GPU, no data set, no protocol)
#
#   tests.txt      pytest -m gpu: the CUDA paths for real (Stage-1 / Stage-2 epochs in bf16 and fp16, SliceInferer,
#                  NCCL, MONAI Label inference on cuda)
#   inference.txt  inference images/s, fp32 / bf16, batch 32, 224x224 (bench_inference.py)
#   stage2.txt     Stage-2 training images/s in bf16: SpectraFlow-S, MONAI UNet, U-Net++ (the bundle's trainers and
#                  data pipeline on the Kvasir-SEG copy; bench_stage2_throughput.py)
#   stage1.txt     Stage-1 training iteration images/s in bf16 (bench_stage1.py)
#   kvasir.txt     a short Kvasir-SEG protocol in bf16: Stage-1 -> Stage-2 -> evaluation with the 2D bundle; the
#                  per-epoch wall times are in its epoch log lines
#   boundary.txt   the boundary term's distance maps: MONAI's (cuCIM where installed) against the torch transform
#                  (bench_boundary_loss.py, figures also in boundary.json)
#   host.txt       host-side time per image of the Stage-2 trainer process, classic vs device data path
#                  (bench_host_overhead.py, figures also in host.json)
#   util_<part>.txt  utilization.gpu samples (nvidia-smi, every 250 ms) while stage2 and kvasir run
#
# At the end collect_gpu_results.py writes benchmarks/results/<gpu>-<date>.json (keys device, stage2_images_per_s,
# unetpp_stage2_images_per_s, stage1_images_per_s, inference_images_per_s, encoder_images_per_s, protocol_minutes,
# gpu_busy_fraction_*, ...; a dry run writes <output dir>/dry-run.json instead).
#
# Per-part limits in seconds (environment): T_TESTS=150 T_INFER=60 T_STAGE2=120 T_STAGE1=45 T_KVASIR=200 T_BOUNDARY=30
# T_HOST=60; RUN_DIR: the Kvasir protocol's bundle_root (default <output dir>/kvasir_run); PARTS: the parts to run
# (default all seven). A part that runs over is stopped (SIGINT, SIGKILL 10 s later), its file keeps what it printed,
# and the next part starts. The default limits add up to about 11 minutes: where one command may run 10 minutes, run
# it twice with the same <output dir>, e.g. PARTS="tests inference stage2 stage1" then PARTS="boundary host kvasir"
# (each run ends by collecting every part file present in <output dir>).
# Data path: DATA_PATH (default device: the cache on the GPU, batched augmentation; monai for the per-sample path) and
# LOG_EVERY (default 50: the loss read back every 50 steps) for the Stage-2 part and the Kvasir protocol.
# Encoder weights: random throughout (no model hub on a GPU machine without internet; the weights do not change the
# throughput). The Kvasir protocol's Dice is therefore that of a random-initialised encoder, not the paper's setup.
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; set -- /nonexistent "${1:-/tmp/gpu_benchmarks_dry_run}"; fi
if [ $# -lt 2 ]; then sed -n 2,40p "$0"; exit 2; fi
DATA=$(realpath -m "$1"); OUT=$(realpath -m "$2"); WORKERS=${3:-12}; E1=${4:-3}; E2=${5:-8}; shift $(( $# < 5 ? $# : 5 ))
EXTRA="$*"
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
RUN_DIR=${RUN_DIR:-$OUT/kvasir_run}   # the protocol's bundle_root (checkpoints: put it outside a size-limited folder)
export DATA OUT WORKERS E1 E2 EXTRA PY REPO RUN_DIR DRY
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

part() {  # part <name> <seconds> <command...>: run under `timeout`, output to <name>.txt
    local name=$1 limit=$2; shift 2
    case " ${PARTS:-tests inference stage2 stage1 kvasir boundary host} " in *" $name "*) ;; *) return 0 ;; esac
    local start=$SECONDS sampler=""
    echo "== $name (limit $limit s): $*" | tee "$OUT/$name.txt"
    if [ "$DRY" = 0 ] && { [ "$name" = stage2 ] || [ "$name" = kvasir ]; }; then  # the GPU's busy fraction
        nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 250 >"$OUT/util_$name.txt" 2>/dev/null &
        sampler=$!
    fi
    timeout -s INT -k 10 "$limit" "$@" >>"$OUT/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/$name.txt"
    if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; fi
}

kvasir_protocol() {  # Stage-1 (E1 epochs) -> Stage-2 (up to E2 epochs) -> evaluation, bf16, random encoder
    cd "$REPO/bundles/spectraflow_2d_segmentation" || return 1
    local common=(--bundle_root "$RUN_DIR" --data_settings#dataset kvasir --dataset_dir "$DATA" --precision bf16
        --run_settings#num_workers "$WORKERS" --run_settings#progress_bar False --stage2_settings#pretrained_weights none
        --data_settings#data_path "${DATA_PATH:-device}" --run_settings#log_every "${LOG_EVERY:-50}"
        --meta_file configs/metadata.json --logging_file configs/logging.conf $EXTRA)
    local t0=$SECONDS
    $PY -m monai.bundle run --config_file "['configs/train.yaml','configs/train_stage1.yaml']" "${common[@]}" \
        --run_settings#stage1_epochs "$E1" || return 1
    echo "stage-1: $E1 epochs in $((SECONDS - t0)) s (process start and data caching included)"
    t0=$SECONDS
    $PY -m monai.bundle run --config_file configs/train.yaml "${common[@]}" --max_epochs "$E2" || return 1
    echo "stage-2: $E2 epochs in $((SECONDS - t0)) s (process start and data caching included)"
    t0=$SECONDS
    $PY -m monai.bundle run --config_file "['configs/train.yaml','configs/evaluate.yaml']" "${common[@]}" || return 1
    echo "evaluation in $((SECONDS - t0)) s"
    cat "$RUN_DIR/eval/summary.md"
}
export -f kvasir_protocol

if [ "$DRY" = 1 ]; then  # the CPU, tiny sizes: checks that every part runs and that the record is written
    { echo "name, memory.total, driver_version"; echo "dry run (CPU), -, -"
      $PY -c "import torch, monai, timm; print('torch', torch.__version__, 'monai', monai.__version__, 'timm', timm.__version__)"
    } >"$OUT/gpu.txt" 2>&1
    cd "$REPO" || exit 1
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    part inference "${T_INFER:-300}" $PY "$HERE/bench_inference.py" --device cpu --batch 1 --size 224 --rounds 1 --iters 1 \
        --threads 1 --precision fp32
    part stage2 "${T_STAGE2:-300}" $PY "$HERE/bench_stage2_throughput.py" --tiny --threads 1 --precision fp32 \
        --models spectraflow unetpp
    part stage1 "${T_STAGE1:-120}" $PY "$HERE/bench_stage1.py" --size 28 --batch 2 --rounds 1 --threads 1 --no-breakdown
    part boundary "${T_BOUNDARY:-60}" $PY "$HERE/bench_boundary_loss.py" --batch 2 --size 32 --rounds 1 --classes 1 9 \
        --json "$OUT/boundary.json"
    part host "${T_HOST:-120}" $PY "$HERE/bench_host_overhead.py" --tiny --json "$OUT/host.json"
    $PY "$HERE/collect_gpu_results.py" "$OUT" --dry-run --precision fp32
    exit $?
fi

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, monai, timm; print('torch', torch.__version__, 'monai', monai.__version__, 'timm', timm.__version__)"
} >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
cd "$REPO" || exit 1
part tests "${T_TESTS:-150}" $PY -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests/gpu tests/label/test_monailabel_cuda.py
part inference "${T_INFER:-60}" $PY "$HERE/bench_inference.py" --device cuda --batch 32 --rounds 5 --iters 10 \
    --precision fp32 bf16
part stage2 "${T_STAGE2:-120}" $PY "$HERE/bench_stage2_throughput.py" --device cuda --dataset kvasir \
    --dataset-dir "$DATA" --num-workers "$WORKERS" --iters 40 --warmup 5 --precision bf16 \
    --models spectraflow unet unetpp --override "data_path=${DATA_PATH:-device}" --override "log_every=${LOG_EVERY:-50}"
part stage1 "${T_STAGE1:-45}" $PY "$HERE/bench_stage1.py" --device cuda --batch 32 --rounds 5 --iters 5 \
    --precision bf16 --no-breakdown
part boundary "${T_BOUNDARY:-30}" $PY "$HERE/bench_boundary_loss.py" --device cuda --batch 8 --size 224 --classes 1 9 \
    --json "$OUT/boundary.json"
part host "${T_HOST:-60}" $PY "$HERE/bench_host_overhead.py" --device cuda --json "$OUT/host.json"
part kvasir "${T_KVASIR:-200}" bash -c kvasir_protocol
$PY "$HERE/collect_gpu_results.py" "$OUT" --precision bf16
