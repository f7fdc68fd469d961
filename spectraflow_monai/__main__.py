"""Command line of spectraflow_monai: ``python -m spectraflow_monai demo [options]``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"demo": "Stage-1 -> Stage-2 -> evaluation -> report on the embedded synthetic dataset"}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: python -m spectraflow_monai <command> [options]\n\ncommands:")
        for name, what in commands.items():
            print(f"  {name:8s} {what}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}")
            return 2
        return 0
    from spectraflow_monai.demo import main as demo_main

    return demo_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
