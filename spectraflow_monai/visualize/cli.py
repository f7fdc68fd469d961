"""Command line of the evaluation report: ``spectraflow report`` (also ``python -m spectraflow_monai.visualize.cli``).

Writes ``OUTPUT/report.md`` with :func:`~spectraflow_monai.visualize.report.write_report`::

    spectraflow report --output eval --log-dir Stage-1=logs/stage1 --log-dir Stage-2=logs --datalist val.json

Options:

- ``--output DIR`` (required; ``--eval-dir`` is the former name): the evaluation folder (``summary.md``,
  ``metrics.csv``, ``predictions/``); the report and its figures are written into it.
- ``--log-dir NAME=DIR`` (repeatable): a TensorBoard folder and its label in the curves figure.
- the evaluated images, for the overlays, read as the 2D bundle reads them (its data sources, its reader for every
  format it takes: PNG, JPEG, BMP, GIF, TIFF including those Pillow cannot open):

  - ``--datalist FILE``: the bundle's Decathlon datalist JSON (``training`` / optional ``validation`` / optional
    ``test``): the ``--split`` the bundle scores; or a plain list / a dict of lists (``--datalist-key KEY``, default
    keys ``validation``, ``val``, ``test``, ``testing``). Relative paths start at ``--dataset-dir``, else at the JSON's
    own folder (as ``data_list_file_path`` in the bundle);
  - ``--dataset NAME --dataset-dir DIR``: ``folder`` (``DIR/images`` + ``DIR/masks``, as ``--dataset folder`` in the
    bundle) or a preset (``kvasir``, ``isic2016``, ``glas``, ``synthetic``);
  - ``--split`` (``test``: what ``configs/evaluate.yaml`` scores), ``--val-fraction`` (0.2) and ``--data-seed`` (0)
    as the bundle's ``val_fraction`` / ``data_seed`` (the hold-out of a source without a validation list);
    ``--label-classes`` as the bundle's ``label_classes`` (label maps: contours of every class but background).
- ``--title TEXT``, ``--num-images N`` (6), ``--seed S`` (0), ``--image-size PX`` (the overlay panel size; default:
  the image size of ``--model``'s record, else the size of the predictions).
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["main"]

#: ``--dataset`` values: the 2D bundle's own sources (its presets are listed by ``spectraflow_monai.apps.seg2d``)
DATASETS = ("folder", "kvasir", "isic2016", "glas", "synthetic")


def _resolve(entry: Any, base: str) -> Any:
    if not isinstance(entry, Mapping):
        return entry
    out = dict(entry)
    for key in ("image", "label"):
        value = out.get(key)
        if isinstance(value, str) and not os.path.isabs(value):
            out[key] = os.path.normpath(os.path.join(base, value))
    return out


def _load_datalist(path: str, key: str | None, dataset_dir: str | None = None) -> list[dict] | None:
    """Entries of a plain datalist JSON (a list or a dict of lists), relative paths resolved against ``dataset_dir``
    or the JSON's folder; None for the bundle's Decathlon JSON (a dict with a ``training`` list and no ``key``)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--datalist '{path}' does not exist.")
    with open(path) as f:
        data = json.load(f)
    base = dataset_dir or os.path.dirname(os.path.abspath(path))
    if isinstance(data, Mapping):
        if key is None and "training" in data:
            return None
        keys = [key] if key else ["validation", "val", "test", "testing"]
        for k in keys:
            if k in data:
                return [_resolve(e, base) for e in data[k]]
        raise ValueError(f"--datalist '{path}' is a dict without any of the keys {keys}; its keys: {sorted(data)}.")
    if not isinstance(data, list):
        raise ValueError(f"--datalist '{path}' must hold a list of entries or a dict of lists.")
    return [_resolve(e, base) for e in data]


def _label_classes(text: str | None) -> Any:
    """``--label-classes`` as the bundle's ``label_classes``: a Python literal (list / dict) or null."""
    if text is None or text.strip().lower() in ("", "none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise argparse.ArgumentTypeError(
            f"--label-classes must be a list or dict literal as in the bundle, e.g. \"['background', 'polyp']\" or "
            f"\"{{'background': 255, 'membrane': 0}}\", got {text!r}."
        ) from e


def _parse_log_dir(text: str) -> tuple[str, str]:
    label, sep, folder = text.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"--log-dir must be NAME=DIR (e.g. Stage-2=logs), got {text!r}.")
    return label, folder


def main(argv: Sequence[str] | None = None, prog: str = "spectraflow report") -> int:
    """Write the report of an evaluation run: ``spectraflow report --output DIR [options]``.

    Args:
        argv: the arguments after the command name; None reads ``sys.argv[1:]``.
        prog: program name shown in the usage and error lines. Defaults to ``"spectraflow report"``.

    Returns:
        0 on success (the path of ``report.md`` is printed); bad input exits with status 2 and one error line.
    """
    parser = argparse.ArgumentParser(
        prog=prog, description="Write OUTPUT/report.md (metric table, training curves, prediction overlays)."
    )
    parser.add_argument("--output", "--eval-dir", dest="output", required=True, metavar="DIR",
                        help="evaluation output folder (summary.md, predictions/), where report.md is written "
                        "(--eval-dir is the former name)")
    parser.add_argument("--log-dir", action="append", type=_parse_log_dir, default=[], metavar="NAME=DIR",
                        help="TensorBoard folder with a label, repeatable (e.g. Stage-1=logs/stage1 Stage-2=logs)")
    parser.add_argument("--datalist", metavar="FILE",
                        help="datalist JSON of the evaluated images: the bundle's data_list_file_path (training / "
                        "validation / test lists), or a list / dict of lists; relative paths start at --dataset-dir, "
                        "else at the JSON's folder")
    parser.add_argument("--datalist-key", help="key of the list in a plain dict datalist (default: validation/val/test)")
    parser.add_argument("--dataset", choices=DATASETS,
                        help="the bundle's data source instead of --datalist: folder (DIR/images + DIR/masks) or a "
                        "preset")
    parser.add_argument("--dataset-dir", metavar="DIR", help="data folder of --dataset; base of --datalist's paths")
    parser.add_argument("--split", default="test",
                        help="split of --dataset / the bundle's datalist JSON (default: test, what evaluation scores)")
    parser.add_argument("--val-fraction", type=float, default=0.2,
                        help="the bundle's val_fraction: hold-out of a source without a validation list (default 0.2)")
    parser.add_argument("--data-seed", type=int, default=0, help="the bundle's data_seed (default: 0)")
    parser.add_argument("--label-classes", type=_label_classes, default=None, metavar="CLASSES",
                        help="the bundle's label_classes for label maps, e.g. \"{'background': 255, 'membrane': 0}\" "
                        "(default: binary masks)")
    parser.add_argument("--title", default="SpectraFlow report", help="report title (default: SpectraFlow report)")
    parser.add_argument("--num-images", type=int, default=6, help="number of overlay images (default: 6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the overlay choice without metrics.csv")
    parser.add_argument("--image-size", type=int, default=None,
                        help="side length of the overlay panels in pixels, the evaluation resolution (default: the "
                        "image_size of --model's record, else the size of the predictions)")
    parser.add_argument("--model", metavar="FILE",
                        help="the evaluated model (the bundle's models/model.pt): its record beside it (model.json) "
                        "gives the image size and label_classes; a value given that contradicts it is refused")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    if args.datalist and args.dataset:
        parser.error("give either --datalist or --dataset, not both.")
    if args.dataset and not args.dataset_dir:
        parser.error("--dataset needs --dataset-dir.")
    if args.image_size is not None and args.image_size < 8:
        parser.error(f"--image-size must be >= 8, got {args.image_size}.")
    try:
        args.image_size, args.label_classes = _recorded_settings(args.model, args.image_size, args.label_classes)
        from spectraflow_monai.apps.seg2d import build_datalist
        from spectraflow_monai.data import label_mode
        from spectraflow_monai.visualize.report import write_report

        mode = label_mode(args.label_classes)
        source = {"split": args.split, "seed": args.data_seed, "val_fraction": args.val_fraction,
                  "label_classes": args.label_classes}
        datalist = None
        if args.datalist:
            datalist = _load_datalist(args.datalist, args.datalist_key, args.dataset_dir)
            if datalist is None:  # the bundle's data_list_file_path
                datalist = build_datalist("datalist", args.dataset_dir, data_list_file_path=args.datalist, **source)
        elif args.dataset:
            datalist = build_datalist(args.dataset, args.dataset_dir, **source)
        log_dirs = dict(args.log_dir) if args.log_dir else None
        path = write_report(args.output, datalist=datalist, log_dirs=log_dirs, title=args.title,
                            num_images=args.num_images, seed=args.seed, image_size=args.image_size,
                            label_map=mode.label_map)
    except (OSError, ValueError) as e:  # bad input: one line naming the file / argument, no traceback
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(path)
    return 0


def _recorded_settings(model: str | None, image_size: int | None, label_classes: Any) -> tuple[int | None, Any]:
    """The image size and label classes of the report: the given ones, checked against the record beside ``model``
    (:class:`~spectraflow_monai.utils.run_record.ModelRecord`: a contradiction is a ``SettingError`` naming both),
    else the record's; without a model, the given ones (image size None: the report takes the predictions' size)."""
    if model is None:
        return image_size, label_classes
    from spectraflow_monai.utils.run_record import ModelRecord

    if not os.path.isfile(model):
        raise FileNotFoundError(f"--model {model!r} is not a file (the bundle's models/model.pt).")
    given = {"image_size": image_size, "label_classes": label_classes}
    record = ModelRecord(model, given=given)
    return record.image_size, record.label_classes


if __name__ == "__main__":
    sys.exit(main(prog="python -m spectraflow_monai.visualize.cli"))
