"""The paper's experiments as commands (``spectraflow experiment <name>``), each a set of bundle runs."""

from .robustness import ROBUSTNESS_SCALES, robustness_markdown, run_robustness
from .runner import ExperimentRunner, read_summary

__all__ = ["ROBUSTNESS_SCALES", "ExperimentRunner", "read_summary", "robustness_markdown", "run_robustness"]
