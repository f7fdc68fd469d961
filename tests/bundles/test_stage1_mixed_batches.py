"""Both bundles' Stage-1 loaders give every mini-batch exactly round(mask_ratio * B) masks (SpectraFlow, Sec. 4.1:
"mixed with a fixed sampling ratio to form Stage-1 mini-batches"), also with the per-process samplers of DDP."""

from __future__ import annotations

from pathlib import Path

import pytest
from monai.data import DataLoader, DistributedSampler
from monai.utils import set_determinism

from spectraflow_monai.transforms import num_masks
from tests.bundles.helpers import parse_config, stage1_program

CONFIGS = Path(__file__).resolve().parents[2] / "bundles" / "spectraflow_2d_segmentation" / "configs"


@pytest.mark.parametrize("mask_ratio, batch_size", [(0.5, 4), (0.25, 4), (0.4, 5)])
def test_2d_bundle_stage1_batches_hold_exact_mask_count(tmp_path, mask_ratio, batch_size):
    parser = parse_config(
        [str(CONFIGS / "train.yaml"), str(CONFIGS / "train_stage1.yaml")],
        bundle_root=str(tmp_path), dataset_dir=str(tmp_path / "data"), image_size=28, num_workers=0,
        synthetic_size={"num_train": 10, "num_val": 2}, mask_ratio=mask_ratio, stage1_batch_size=batch_size,
        cache_rate=0.0, encoder_kwargs={"depth": 2}, pretrained_weights="none",
    )  # fmt: skip
    set_determinism(seed=0)
    program = stage1_program(parser)
    loader = program.data_loader
    counts = [int(batch["domain"].sum()) for _ in range(3) for batch in loader]
    assert counts and set(counts) == {num_masks(batch_size, mask_ratio)}
    # two DDP ranks, each with its own sampler and the bundle's collate: each per-process batch is exact
    dataset, collate = program.dataset, program.mixed_domain
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, even_divisible=True)
        ranked = DataLoader(dataset, batch_size=2, sampler=sampler, drop_last=True, collate_fn=collate)
        assert {int(b["domain"].sum()) for b in ranked} == {num_masks(2, mask_ratio)}
    set_determinism(seed=None)


@pytest.mark.parametrize("bundle", ["spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"])
def test_stage1_views_both_shows_every_pair_as_image_and_mask(bundle, tmp_path):
    """``stage1_views: both``: a mini-batch of B pairs holds their B images and their B masks."""
    configs = CONFIGS.parent.parent / bundle / "configs"
    files = [str(configs / "train.yaml"), str(configs / "train_stage1.yaml")]
    root = {"bundle_root": str(tmp_path)}  # the Stage-1 program lists its data (generated there, not in the clone)
    parser = parse_config(files, stage1_views="both", **root)
    collate = parser.get_parsed_content("stage1").mixed_domain_collate()
    assert collate.views == "both" and collate.mask_ratio == 0.5
    default = parse_config(files, **root)
    assert default.get_parsed_content("stage1").mixed_domain_collate().views == "either"


def test_2d_bundle_stage1_views_both_loader(tmp_path):
    parser = parse_config(
        [str(CONFIGS / "train.yaml"), str(CONFIGS / "train_stage1.yaml")],
        bundle_root=str(tmp_path), dataset_dir=str(tmp_path / "data"), image_size=28, num_workers=0,
        synthetic_size={"num_train": 8, "num_val": 2}, stage1_batch_size=4, cache_rate=0.0, stage1_views="both",
        encoder_kwargs={"depth": 2}, pretrained_weights="none",
    )  # fmt: skip
    set_determinism(seed=0)
    batches = list(stage1_program(parser).data_loader)
    assert len(batches) == 2  # 8 pairs, 4 per mini-batch: the number of iterations is that of `either`
    for batch in batches:
        assert batch["domain"].tolist() == [0] * 4 + [1] * 4
    set_determinism(seed=None)


@pytest.mark.parametrize(
    "settings, expected",
    [({}, (True, 1.0, 0.01, "dim")),
     ({"latent_norm": False, "meanflow_adaptive_p": 0.0, "dispersive_normalize": None}, (False, 0.0, 0.01, None)),
     ({"meanflow_adaptive_p": 0.5, "meanflow_adaptive_c": 0.1}, (True, 0.5, 0.1, "dim"))],
)  # fmt: skip
def test_stage1_objective_settings_reach_the_losses_and_trainer(tmp_path, settings, expected):
    """latent_norm, meanflow_adaptive_p / _c and dispersive_normalize are bundle settings of Stage-1's objects."""
    parser = parse_config(
        [str(CONFIGS / "train.yaml"), str(CONFIGS / "train_stage1.yaml")], **settings, bundle_root=str(tmp_path),
        image_size=28, encoder_kwargs={"depth": 2}, num_workers=0, synthetic_size={"num_train": 4, "num_val": 2},
        cache_rate=0.0, pretrained_weights="none", stage1_batch_size=2,
    )  # fmt: skip
    trainer = stage1_program(parser).trainer
    meanflow, dispersive = trainer.meanflow_loss, trainer.dispersive_loss
    assert trainer.latent_norm == expected[0]
    assert (meanflow.adaptive_p, meanflow.adaptive_c, dispersive.normalize) == expected[1:]
