"""``python -m spectraflow_monai <command> [options]``: the ``spectraflow`` command line (:mod:`spectraflow_monai.cli`)."""

import sys

from spectraflow_monai.cli import main

if __name__ == "__main__":
    sys.exit(main())
