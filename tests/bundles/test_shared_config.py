"""The two bundles share their method: the YAML pieces meant to be the same (encoder and weights, Stage-1, the
Stage-2 optimisation and checkpointing) are identical in both, so a fix in one bundle cannot silently miss the
other. Dataset-specific pieces (data, losses, metrics, budgets) are listed as the allowed differences."""

from __future__ import annotations

from pathlib import Path

import pytest
from monai.bundle import ConfigParser

BUNDLES = Path(__file__).resolve().parents[2] / "bundles"
TWO_D, SYNAPSE = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"

SHARED_CONSTANTS = [
    "bundle_root", "ckpt_dir", "output_dir", "log_dir", "data_fraction", "data_seed", "data_list_file_path",
    "val_fraction", "image_size", "device", "encoder_name", "encoder_kwargs", "pretrained_weights", "encoder_init",
    "stage1_encoder", "model_path", "encoder_initialization", "trainable_blocks", "fusion", "refine", "num_workers",
    "cache_rate", "learning_rate", "weight_decay", "min_learning_rate", "lr_factor", "val_interval", "boundary_beta",
    "boundary_beta_max", "boundary_ramp_epochs", "progress_bar", "resume", "stage2_dir", "stage2_checkpoints_kept",
    "train_sampler", "val_sampler", "image_mean", "image_std", "network", "run", "encoder_settings", "process_group", "error_log",
    "imports",
]  # fmt: skip
SHARED_STAGE2 = [
    "train#run", "train#optimizer", "train#random_state", "train#checkpoint", "train#resume_path", "train#checkpoint_saver",
    "validate#lr_scheduler", "validate#model_saver", "validate#early_stop",
    "validate#evaluator",
]  # fmt: skip
STAGE1_CONSTANTS = [
    "stage1_epochs", "stage1_batch_size", "stage1_accumulation_steps", "stage1_start_lr", "stage1_end_lr",
    "stage1_weight_decay", "mask_ratio", "dispersive_weight", "dispersive_variant", "dispersive_tau",
    "dispersive_normalize", "meanflow_ratio_unequal", "ema_decay", "head_hidden_channels", "head_num_blocks",
    "head_condition_on_domain", "latent_norm", "stage1_checkpoint_interval", "stage1_checkpoints_kept",
    "stage1_views", "meanflow_adaptive_p", "meanflow_adaptive_c",
    "resume_from", "stage1_dir", "stage1_sampler", "run_record#not_compared", "unread_settings", "run_setup#folders",
    "run",
]  # fmt: skip
# the Synapse masks are organ label maps merged into one foreground (binarize); everything else of Stage-1 is shared
STAGE1_DIFFERENT = {"mixed_domain"}


def _raw(bundle: str, *files: str) -> ConfigParser:
    parser = ConfigParser()
    parser.read_config([str(BUNDLES / bundle / "configs" / f) for f in files])
    return parser


@pytest.mark.parametrize("key", SHARED_CONSTANTS + SHARED_STAGE2)
def test_stage2_pieces_are_identical(key):
    assert _raw(TWO_D, "train.yaml")[key] == _raw(SYNAPSE, "train.yaml")[key], key


@pytest.mark.parametrize("key", STAGE1_CONSTANTS)
def test_stage1_constants_are_identical(key):
    assert _raw(TWO_D, "train.yaml", "train_stage1.yaml")[key] == _raw(SYNAPSE, "train.yaml", "train_stage1.yaml")[key]


def test_stage1_section_is_identical_but_for_the_mask_rendering():
    a = _raw(TWO_D, "train.yaml", "train_stage1.yaml")["stage1"]
    b = _raw(SYNAPSE, "train.yaml", "train_stage1.yaml")["stage1"]
    assert set(a) == set(b)
    assert {k for k in a if a[k] != b[k]} == STAGE1_DIFFERENT
    assert {k: v for k, v in a["mixed_domain"].items() if k != "binarize"} == {
        k: v for k, v in b["mixed_domain"].items() if k != "binarize"
    }
