#!/usr/bin/env bash
# The same short Kvasir-SEG Stage-2 run with the training data path of MONAI (per-sample augmentation in worker
# processes) and with the device path (cache on the training device, the same augmentation batched), for several
# seeds, then the paper's evaluation of each: the two paths draw different random numbers, so their metrics should
# agree within the seeds' spread. Prints one table (mDSC, mIoU, HD95 per run, and the mean per path).
#
#   bash benchmarks/data_path_accuracy.sh <kvasir dir> <output dir> [epochs] [image size] [seeds...] [-- overrides]
#   bash benchmarks/data_path_accuracy.sh ../shared/data/kvasir-seg runs/data_path 6 112 0 1
#
# Without DINOv2 weights (no hub here) the encoder starts random and every block trains (encoder_init random,
# trainable_blocks all); pass e.g. "-- --stage2_settings#pretrained_weights /w/dinov2_vits14_pretrain.pth --stage2_settings#encoder_init pretrained
# --stage2_settings#trainable_blocks 1" for the paper's start. Device: the bundle's default (cuda:0 when available).
set -euo pipefail
DATA=${1:?kvasir dir}; OUT=${2:?output dir}; EPOCHS=${3:-6}; SIZE=${4:-112}
shift $(( $# < 4 ? $# : 4 ))
SEEDS=(); EXTRA=()
while (( $# )); do
    if [[ $1 == -- ]]; then shift; EXTRA=("$@"); break; fi
    SEEDS+=("$1"); shift
done
(( ${#SEEDS[@]} )) || SEEDS=(0 1)
BUNDLE="$(cd "$(dirname "$0")/../bundles/spectraflow_2d_segmentation" && pwd)"
DATA=$(cd "$DATA" && pwd); mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
COMMON=(--data_settings#dataset kvasir --dataset_dir "$DATA" --model_settings#image_size "$SIZE" --max_epochs "$EPOCHS" --run_settings#progress_bar False
        --stage2_settings#pretrained_weights none --stage2_settings#encoder_init random --stage2_settings#trainable_blocks all)
cd "$BUNDLE"
for path in monai device; do
    for seed in "${SEEDS[@]}"; do
        run="$OUT/${path}_seed$seed"
        if [[ ! -f "$run/eval/summary.json" ]]; then
            echo "=== $path, seed $seed -> $run"
            python -m monai.bundle run --config_file configs/train.yaml --bundle_root "$run" --data_settings#data_seed "$seed" \
                --data_settings#data_path "$path" "${COMMON[@]}" "${EXTRA[@]}"
            python -m monai.bundle run --config_file "['configs/train.yaml','configs/evaluate.yaml']" \
                --bundle_root "$run" --data_settings#data_seed "$seed" --data_settings#dataset kvasir --dataset_dir "$DATA" --run_settings#progress_bar False
        fi
    done
done
python - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
keys = ("mDSC", "mIoU", "hd95_monai_empty_as_diagonal")
rows = {}
for run in sorted(out.glob("*_seed*")):
    summary = json.loads((run / "eval" / "summary.json").read_text())
    rows.setdefault(run.name.split("_seed")[0], []).append((run.name, *(float(summary[k]) for k in keys)))
print("| run | mDSC (%) | mIoU (%) | HD95 (px, missed = diagonal) |\n| --- | ---: | ---: | ---: |")
for path, rs in rows.items():
    for name, d, i, h in rs:
        print(f"| {name} | {100 * d:.2f} | {100 * i:.2f} | {h:.2f} |")
    mean = [statistics.mean(r[j] for r in rs) for j in (1, 2, 3)]
    print(f"| **{path}: mean of {len(rs)}** | {100 * mean[0]:.2f} | {100 * mean[1]:.2f} | {mean[2]:.2f} |")
PY
