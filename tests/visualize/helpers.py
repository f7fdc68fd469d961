"""Shared inputs of the visualize tests: a tiny evaluation folder (images, masks, predictions, metrics, logs)."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

H, W = 48, 64  # raw image size (not square, so a swapped axis cannot go unnoticed)
# object boxes (row0, row1, col0, col1) in raw pixels, ground truth and prediction
GT_BOXES = {"case0": (4, 16, 6, 30), "case1": (20, 36, 10, 24), "case2": (8, 30, 36, 60)}
PRED_BOXES = {"case0": (4, 16, 6, 30), "case1": (28, 44, 10, 24), "case2": (12, 30, 40, 60)}
DICE = {"case0": 0.95, "case1": 0.40, "case2": 0.70}
SUMMARY = "| Metric | Value |\n| --- | --- |\n| mIoU (%) | 61.00 |\n| mDSC (%) | 68.33 |\n\nImages: 3.\n"


def box_mask(box: tuple[int, int, int, int]) -> np.ndarray:
    m = np.zeros((H, W), np.uint8)
    m[box[0] : box[1], box[2] : box[3]] = 255
    return m


def save_prediction(src_png: str, pred_dir: str, size: int = 224) -> None:
    """Write a prediction as the bundle does: MONAI PIL reader -> size x size binary -> SaveImage(PILWriter, 0/255)."""
    from monai.transforms import EnsureChannelFirst, LoadImage, Resize, SaveImage

    x = EnsureChannelFirst()(LoadImage(reader="PILReader", image_only=True)(src_png))
    x = Resize((size, size), mode="nearest")((x >= 128).float())
    SaveImage(output_dir=pred_dir, output_postfix="seg", output_ext=".png", writer="PILWriter", scale=255,
              separate_folder=False, print_log=False)(x)


def make_run_dir(root):
    """Fill ``root`` with a tiny evaluation folder (3 images with predictions + 1 without), TensorBoard logs of both stages."""
    for sub in ("images", "masks", "raw_pred", "eval/predictions", "logs/stage1", "logs_empty"):
        os.makedirs(root / sub)
    datalist = []
    for name in [*GT_BOXES, "case3"]:
        box = GT_BOXES.get(name, (10, 20, 10, 20))
        img = np.full((H, W, 3), 90, np.uint8)
        img[box[0] : box[1], box[2] : box[3]] = (40, 60, 200)  # blue object: only contours are pure red/green
        Image.fromarray(img).save(root / "images" / f"{name}.png")
        Image.fromarray(box_mask(box)).save(root / "masks" / f"{name}.png")
        datalist.append({"image": str(root / "images" / f"{name}.png"), "label": str(root / "masks" / f"{name}.png"),
                         "name": name, "label_threshold": 128})
        if name in PRED_BOXES:  # case3 gets no prediction
            Image.fromarray(box_mask(PRED_BOXES[name])).save(root / "raw_pred" / f"{name}.png")
            save_prediction(str(root / "raw_pred" / f"{name}.png"), str(root / "eval" / "predictions"))
    ev = root / "eval"
    (ev / "summary.md").write_text(SUMMARY)
    (ev / "summary.json").write_text("{}\n")
    rows = ["name,IoU,DSC,recall,precision,HD95 (pixels)"]
    rows += [f"{n},{d - 0.1:.2f},{d:.2f},0.9,0.8,3.0" for n, d in DICE.items()]
    (ev / "metrics.csv").write_text("\n".join(rows) + "\n")

    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(root / "logs"))
    for step in range(1, 61):
        w.add_scalar("train_loss", 1.0 / step, step)
    for epoch in range(1, 4):
        w.add_scalar("val_mean_dice", 0.2 * epoch, epoch)
        w.add_scalar("val_hd95", float("nan") if epoch == 2 else 10.0 / epoch, epoch)
    w.close()
    w = SummaryWriter(log_dir=str(root / "logs" / "stage1"))
    for step in range(5):
        w.add_scalar("loss", 2.0 - 0.1 * step, step)
        w.add_scalar("mse", 1.0 - 0.1 * step, step)
    w.close()
    return root, datalist


def png(path) -> np.ndarray:
    img = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert img.std() > 10  # not a blank canvas
    return img


def colour_pixels(img: np.ndarray, channel: int) -> int:
    """Pixels where ``channel`` is strong and both others weak (pure red / pure green contour pixels)."""
    others = [c for c in range(3) if c != channel]
    return int(((img[..., channel] > 180) & (img[..., others[0]] < 80) & (img[..., others[1]] < 80)).sum())


def rows_cols(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
