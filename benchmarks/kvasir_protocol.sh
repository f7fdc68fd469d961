#!/usr/bin/env bash
# The paper's Kvasir-SEG protocol (880/120 split, 224x224) for SpectraFlow and a MONAI 2D UNet with the same Stage-2
# budget, then the two metric tables side by side. Meant for a GPU; every figure it prints goes to docs/benchmarks.md
# with this command line.
#
#   bash benchmarks/kvasir_protocol.sh <kvasir-seg dir> <output dir> [stage1 epochs=300] [stage2 epochs=100] [extra overrides...]
#
# <kvasir-seg dir> holds Kvasir-SEG/images, Kvasir-SEG/masks and splits/{train,val}.txt. Stage-1 starts from the
# DINOv2 weights of timm's hub (pretrained_weights: timm, needs internet); without internet pass e.g.
# --stage2_settings#pretrained_weights /path/dinov2_vits14_pretrain.pth as an extra override (README "Encoder weights").
set -euo pipefail
DATA=$(realpath "$1"); OUT=$(realpath -m "$2"); E1=${3:-300}; E2=${4:-100}; shift $(( $# < 4 ? $# : 4 ))
HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE="$HERE/../bundles/spectraflow_2d_segmentation"
cd "$BUNDLE"
COMMON=(--data_settings#dataset kvasir --dataset_dir "$DATA" --run_settings#progress_bar False --meta_file configs/metadata.json --logging_file configs/logging.conf "$@")
SF=(--bundle_root "$OUT/spectraflow")
UN=(--bundle_root "$OUT/unet")
set -x
time python -m monai.bundle run --config_file "['configs/train.yaml','configs/train_stage1.yaml']" "${SF[@]}" "${COMMON[@]}" --run_settings#stage1_epochs "$E1"
time python -m monai.bundle run --config_file configs/train.yaml "${SF[@]}" "${COMMON[@]}" --max_epochs "$E2"
time python -m monai.bundle run --config_file "['configs/train.yaml','configs/evaluate.yaml']" "${SF[@]}" "${COMMON[@]}"
UNET="configs/unet_baseline.yaml"   # the bundle's own baseline override (run from the bundle folder)
time python -m monai.bundle run --config_file "['configs/train.yaml','$UNET']" "${UN[@]}" "${COMMON[@]}" --max_epochs "$E2"
time python -m monai.bundle run --config_file "['configs/train.yaml','$UNET','configs/evaluate.yaml']" "${UN[@]}" "${COMMON[@]}"
set +x
echo "## SpectraFlow (Stage-1 $E1 epochs, Stage-2 up to $E2 epochs)"; cat "$OUT/spectraflow/eval/summary.md"
echo "## MONAI UNet 2D (up to $E2 epochs)"; cat "$OUT/unet/eval/summary.md"
