"""The paper's experiments as commands (``spectraflow experiment <name>``), each a set of bundle runs."""

from .ablations import (
    ABLATIONS,
    STAGE1_DECODERS,
    Ablation,
    Arm,
    ablation_markdown,
    dispersive_weight_ablation,
    run_ablation,
    stage2_run,
)
from .low_data import LOW_DATA_SCALES, low_data_markdown, run_low_data
from .robustness import ROBUSTNESS_SCALES, robustness_markdown, run_robustness
from .runner import EXPERIMENT_METRICS, SCALES, ExperimentRunner, read_summary, write_csv

__all__ = [
    "ABLATIONS",
    "EXPERIMENT_METRICS",
    "LOW_DATA_SCALES",
    "ROBUSTNESS_SCALES",
    "SCALES",
    "STAGE1_DECODERS",
    "Ablation",
    "Arm",
    "ExperimentRunner",
    "ablation_markdown",
    "dispersive_weight_ablation",
    "low_data_markdown",
    "read_summary",
    "robustness_markdown",
    "run_ablation",
    "run_low_data",
    "run_robustness",
    "stage2_run",
    "write_csv",
]
