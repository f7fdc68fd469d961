"""Command line of the evaluation report: ``spectraflow report`` (also ``python -m spectraflow_monai.visualize.cli``).

Writes ``OUTPUT/report.md`` with :func:`~spectraflow_monai.visualize.report.write_report`::

    spectraflow report --output eval --log-dir Stage-1=logs/stage1 --log-dir Stage-2=logs --datalist val.json

Options:

- ``--output DIR`` (required; ``--eval-dir`` is the former name): the evaluation folder (``summary.md``,
  ``metrics.csv``, ``predictions/``); the report and its figures are written into it.
- ``--log-dir NAME=DIR`` (repeatable): a TensorBoard folder and its label in the curves figure.
- ``--datalist FILE`` / ``--datalist-key KEY``: JSON datalist of the evaluated images (a list, or a dict of lists;
  default keys ``validation``, ``val``, ``test``, ``testing``), for the overlays.
- ``--dataset NAME --dataset-dir DIR [--split SPLIT]``: a 2D preset instead of ``--datalist``.
- ``--title TEXT``, ``--num-images N`` (6), ``--seed S`` (0), ``--image-size PX`` (224, the overlay panel size).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from spectraflow_monai.visualize.report import write_report

__all__ = ["main"]


def _load_datalist(path: str, key: str | None) -> list[dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--datalist '{path}' does not exist.")
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, Mapping):
        keys = [key] if key else ["validation", "val", "test", "testing"]
        for k in keys:
            if k in data:
                return list(data[k])
        raise ValueError(f"--datalist '{path}' is a dict without any of the keys {keys}; its keys: {sorted(data)}.")
    if not isinstance(data, list):
        raise ValueError(f"--datalist '{path}' must hold a list of entries or a dict of lists.")
    return data


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
    parser.add_argument("--datalist", help="JSON datalist of the evaluated images (a list, or a dict of lists)")
    parser.add_argument("--datalist-key", help="key of the list in a dict datalist (default: validation/val/test)")
    parser.add_argument("--dataset", help="2D preset instead of --datalist: kvasir | isic2016 | glas | synthetic")
    parser.add_argument("--dataset-dir", help="root folder of --dataset")
    parser.add_argument("--split", default="val", help="split of --dataset (default: val)")
    parser.add_argument("--title", default="SpectraFlow report", help="report title (default: SpectraFlow report)")
    parser.add_argument("--num-images", type=int, default=6, help="number of overlay images (default: 6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the overlay choice without metrics.csv")
    parser.add_argument("--image-size", type=int, default=224,
                        help="side length of the overlay panels in pixels, the evaluation resolution (default: 224)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    if args.datalist and args.dataset:
        parser.error("give either --datalist or --dataset, not both.")
    if args.dataset and not args.dataset_dir:
        parser.error("--dataset needs --dataset-dir.")
    if args.image_size < 8:
        parser.error(f"--image-size must be >= 8, got {args.image_size}.")
    try:
        datalist = None
        if args.datalist:
            datalist = _load_datalist(args.datalist, args.datalist_key)
        elif args.dataset:
            from spectraflow_monai.apps.seg2d import build_datalist

            datalist = build_datalist(args.dataset, args.dataset_dir, args.split)
        log_dirs = dict(args.log_dir) if args.log_dir else None
        path = write_report(args.output, datalist=datalist, log_dirs=log_dirs, title=args.title,
                            num_images=args.num_images, seed=args.seed, image_size=args.image_size)
    except (OSError, ValueError) as e:  # bad input: one line naming the file / argument, no traceback
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m spectraflow_monai.visualize.cli"))
