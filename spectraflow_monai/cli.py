"""The ``spectraflow`` command line (also ``python -m spectraflow_monai``): one program, one subcommand per tool.

Every subcommand takes ``--help``; the option names are shared where they mean the same thing (``--output`` for the
folder a command writes, ``--image-size``, ``--seed``, ``--precision``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: subcommand -> (module with ``main(argv, prog)``, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "spectraflow_monai.demo",
        "Stage-1 -> Stage-2 -> evaluation -> report with the 2D bundle on a generated synthetic set",
    ),
    "report": ("spectraflow_monai.visualize.cli", "write report.md (metrics, curves, overlays) of an evaluation run"),
    "synthetic-2d": ("spectraflow_monai.apps.seg2d.synthetic", "write the synthetic 2D lesion set (images/, masks/)"),
    "synthetic-ct": ("spectraflow_monai.apps.synapse.phantom", "write the synthetic Synapse-like CT phantom (NIfTI)"),
    "export-onnx": (
        "spectraflow_monai.apps.onnx_export",
        "write a bundle model's ONNX file beside it (models/model.onnx) for inference with onnxruntime",
    ),
    "experiment": (
        "spectraflow_monai.experiments.cli",
        "the paper's experiments (robustness, low-data, ablations, figures) and active-learning",
    ),
}


def _usage() -> str:
    lines = ["usage: spectraflow <command> [options]   (or: python -m spectraflow_monai <command> [options])", "",
             "commands:"]
    lines += [f"  {name:13s} {what}" for name, (_, what) in COMMANDS.items()]
    lines += ["", "spectraflow <command> --help lists the options of a command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``spectraflow <command> [options]``; returns the exit status (2 for an unknown command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(_usage(), file=sys.stderr)
        print(f"\nspectraflow: unknown command {name!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    result = module.main(rest, prog=f"spectraflow {name}")
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
