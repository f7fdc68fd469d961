"""The paper's experiments as commands (``spectraflow experiment <name>``), each a set of bundle runs."""

from .low_data import LOW_DATA_SCALES, low_data_markdown, run_low_data
from .robustness import ROBUSTNESS_SCALES, robustness_markdown, run_robustness
from .runner import EXPERIMENT_METRICS, ExperimentRunner, read_summary, write_csv

__all__ = [
    "EXPERIMENT_METRICS",
    "LOW_DATA_SCALES",
    "ROBUSTNESS_SCALES",
    "ExperimentRunner",
    "low_data_markdown",
    "read_summary",
    "robustness_markdown",
    "run_low_data",
    "run_robustness",
    "write_csv",
]
