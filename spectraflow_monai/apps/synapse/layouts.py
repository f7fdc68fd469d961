"""Datalists of the two Synapse on-disk layouts (the BTCV release and TransUNet's preprocessed release).

Part of the Synapse pipeline (see :mod:`spectraflow_monai.apps.synapse`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spectraflow_monai.apps.synapse.constants import (
    RAW_IMAGE,
    RAW_LABEL,
    SYNAPSE_TEST_CASES,
    SYNAPSE_TRAIN_CASES,
    TU_SLICE,
    TU_TEST,
    TU_TRAIN_DIR,
    format_case_id,
)
from spectraflow_monai.data.validation import DatasetError

__all__ = ["case_list", "synapse_datalist"]

def case_list(cases: Sequence[int | str] | None, split: str) -> list[str]:
    """The case ids of ``split`` (``cases``, else TransUNet's list of the split) in the protocol's 4-digit form."""
    if cases is None:
        cases = SYNAPSE_TRAIN_CASES if split == "train" else SYNAPSE_TEST_CASES
    elif isinstance(cases, (str, int)):
        cases = [cases]
    ids = [format_case_id(c) for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"cases contains duplicates: {list(cases)!r}.")
    return ids


def _resolve_layout(root: Path, split: str, layout: str) -> str:
    if layout != "auto":
        return layout
    if (root / "RawData" / "Training").is_dir():
        return "raw"
    tu_dir = root / (TU_TRAIN_DIR if split == "train" else os.path.dirname(TU_TEST))
    if tu_dir.is_dir():
        return "transunet"
    raise DatasetError(
        f"cannot detect the Synapse layout under {str(root)!r}: expected the raw BTCV folder "
        f"{str(root / 'RawData' / 'Training')!r} or TransUNet's {str(tu_dir)!r}."
    )


def _missing_error(split: str, missing: list[tuple[str, str]]) -> DatasetError:
    shown = "; ".join(f"case {c}: {p!r}" for c, p in missing[:5])
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    return DatasetError(f"Synapse {split} split: {len(missing)} case(s) missing, expected {shown}{more}.")


def synapse_datalist(
    root: str | os.PathLike,
    split: str = "train",
    layout: str = "auto",
    cases: Sequence[int | str] | None = None,
) -> list[dict[str, Any]]:
    """Build the MONAI datalist of a Synapse split.

    Args:
        root: folder holding the data set (``RawData/`` for the raw layout; ``train_npz/`` / ``test_vol_h5/`` for
            the TransUNet layout).
        split: ``"train"`` or ``"test"``; selects the TransUNet case list when ``cases`` is None (and, for the
            TransUNet layout, the ``train_npz`` slices or the ``test_vol_h5`` volumes). Defaults to ``"train"``.
        layout: ``"raw"``, ``"transunet"`` or ``"auto"`` (raw when ``<root>/RawData/Training`` exists, else
            TransUNet). Defaults to ``"auto"``.
        cases: case ids to list instead of the split's official ones (ints or strings such as ``"0005"``).
            Defaults to None.

    Returns:
        - raw: one entry per volume ``{"image": img.nii.gz, "label": label.nii.gz, "case": "0005"}``;
        - TransUNet train: one entry per slice ``{"image": npz, "label": npz, "case": "0005", "slice": 0}``
          (load with :class:`spectraflow_monai.apps.synapse.LoadSynapseSliced`);
        - TransUNet test: one entry per volume ``{"image": h5, "label": h5, "case": "0001"}`` (read with
          :func:`load_synapse_h5`).

    Raises:
        ValueError: bad ``split`` / ``layout`` / ``cases``.
        DatasetError: ``root`` or a case of the split is missing (the message names the case and the path).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    if layout not in ("auto", "raw", "transunet"):
        raise ValueError(f"layout must be 'auto', 'raw' or 'transunet', got {layout!r}.")
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"Synapse root {str(root)!r} is not a directory.")
    ids = case_list(cases, split)
    layout = _resolve_layout(root, split, layout)
    missing: list[tuple[str, str]] = []
    out: list[dict[str, Any]] = []
    if layout == "raw":
        for c in ids:
            img, lbl = root / RAW_IMAGE.format(case=c), root / RAW_LABEL.format(case=c)
            for p in (img, lbl):
                if not p.is_file():
                    missing.append((c, str(p)))
            out.append({"image": str(img), "label": str(lbl), "case": c})
    elif split == "test":
        for c in ids:
            p = root / TU_TEST.format(case=c)
            if not p.is_file():
                missing.append((c, str(p)))
            out.append({"image": str(p), "label": str(p), "case": c})
    else:
        folder = root / TU_TRAIN_DIR
        slices: dict[str, list[tuple[int, str]]] = {}
        if folder.is_dir():
            for name in os.listdir(folder):
                m = TU_SLICE.match(name)
                if m:
                    slices.setdefault(f"{int(m.group(1)):04d}", []).append((int(m.group(2)), str(folder / name)))
        for c in ids:
            if c not in slices:
                missing.append((c, str(folder / f"case{c}_slice*.npz")))
                continue
            for k, p in sorted(slices[c]):
                out.append({"image": p, "label": p, "case": c, "slice": k})
    if missing:
        raise _missing_error(split, missing)
    return out


