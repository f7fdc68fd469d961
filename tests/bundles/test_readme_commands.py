"""The ``python -c "..."`` commands of the bundle READMEs import what they name (the package's public names)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
READMES = sorted((REPO / "bundles").glob("*/docs/README.md"))
IMPORT = re.compile(r"^\s*(from\s+spectraflow_monai[\w.]*\s+import\s+[\w, ]+|import\s+spectraflow_monai[\w.]*)\s*$")


def _imports(readme: Path) -> list[str]:
    """The import statements of every ``python -c "<code>"`` in ``readme``."""
    found = []
    for code in re.findall(r'python -c "([^"]+)"', readme.read_text()):
        found += [m.group(1) for part in code.split(";") if (m := IMPORT.match(part))]
    return found


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.parent.parent.name)
def test_readme_commands_import_what_they_name(readme):
    statements = _imports(readme)
    for statement in statements:
        words = statement.replace(",", " ").split()
        module = importlib.import_module(words[1])
        missing = [name for name in words[3:] if words[0] == "from" and not hasattr(module, name)]
        assert not missing, f"{readme}: {statement!r}: {words[1]} has no {missing}"
    if readme.parent.parent.name == "spectraflow_2d_segmentation":
        assert any("kvasir_seg_datalist" in s for s in statements), statements  # the timing command is found
