"""Importing this module installs :func:`spectraflow_monai.utils.errors.install_excepthook`.

Bundle configs cannot call a function from their ``imports`` list (MONAI evaluates only import statements there,
before anything else), so they list ``$import spectraflow_monai.utils.excepthook``: a failing run then ends with one
line ``error: <file>: <problem>`` when a data check or a setting check stopped it. It also filters the
known-harmless library warnings (:func:`spectraflow_monai.utils.quiet.filter_known_warnings`).
"""

from __future__ import annotations

from spectraflow_monai.utils.errors import install_excepthook
from spectraflow_monai.utils.quiet import filter_known_warnings

__all__: list[str] = []

install_excepthook()
filter_known_warnings()
