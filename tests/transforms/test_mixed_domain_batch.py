"""Tests for spectraflow_monai.transforms.mixed_domain_batch (exact image/mask ratio per Stage-1 mini-batch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import DataLoader, Dataset
from monai.utils import set_determinism

from spectraflow_monai.transforms import (
    MIXED_DOMAIN_VIEWS,
    MaskToImage,
    MixedDomainCollate,
    RandMixedDomaind,
    num_masks,
)


def _samples(n: int, size: int = 8) -> list[dict]:
    out = []
    for i in range(n):
        mask = np.zeros((1, size, size), dtype=np.float32)
        mask[0, 1 : 2 + i % 5, 2:6] = 1
        out.append({"image": torch.full((3, size, size), float(i) + 10.0), "label": torch.as_tensor(mask)})
    return out


@pytest.mark.parametrize(
    "batch_size, ratio, expected",
    [(8, 0.5, 4), (8, 0.0, 0), (8, 1.0, 8), (5, 0.5, 2), (6, 0.25, 2), (7, 0.3, 2), (2, 0.5, 1)],
)
def test_num_masks_is_round_of_ratio_times_batch(batch_size, ratio, expected):
    assert num_masks(batch_size, ratio) == expected == round(ratio * batch_size)


@pytest.mark.parametrize("batch_size, ratio", [(8, 0.5), (6, 0.25), (5, 0.5), (4, 1.0), (4, 0.0)])
def test_every_batch_holds_exactly_round_ratio_masks(batch_size, ratio):
    set_determinism(seed=0)
    loader = DataLoader(
        Dataset(_samples(30)), batch_size=batch_size, shuffle=True, drop_last=True,
        collate_fn=MixedDomainCollate(mask_ratio=ratio), num_workers=0,
    )
    render = MaskToImage()
    for batch in loader:
        domain = batch["domain"]
        assert domain.shape == (batch_size,) and domain.dtype == torch.int64
        assert int(domain.sum()) == num_masks(batch_size, ratio)
        assert "label" not in batch  # the mask is an input only, never a target
        for row in range(batch_size):
            image = batch["image"][row]
            if domain[row] == 1:
                assert image.min() < 0  # a rendered, normalised 0/1 mask
                assert torch.allclose(image, render(torch.as_tensor(image[:1] > image.min()).float()), atol=1e-5)
            else:
                assert float(image.min()) >= 10.0  # the original image untouched
    set_determinism(seed=None)


def test_per_sample_flip_varies_but_collate_does_not():
    """The old per-sample Bernoulli mixing varies the batch composition; the collate never does."""
    set_determinism(seed=0)
    flips = RandMixedDomaind(mask_ratio=0.5).set_random_state(seed=1)
    counts = {int(sum(int(flips(s)["domain"]) for s in _samples(8))) for _ in range(20)}
    assert len(counts) > 1
    collate = MixedDomainCollate(mask_ratio=0.5)
    assert {int(collate(_samples(8))["domain"].sum()) for _ in range(20)} == {4}
    set_determinism(seed=None)


def test_reproducible_for_a_seed_and_varies_across_batches():
    def draws():
        set_determinism(seed=3)
        collate = MixedDomainCollate(mask_ratio=0.5)
        return [tuple(collate(_samples(8))["domain"].tolist()) for _ in range(6)]

    first = draws()
    assert first == draws()
    assert len(set(first)) > 1
    set_determinism(seed=None)


def test_list_items_are_flattened():
    collate = MixedDomainCollate(mask_ratio=0.5)
    s = _samples(4)
    batch = collate([[s[0], s[1]], [s[2], s[3]]])
    assert batch["image"].shape == (4, 3, 8, 8) and int(batch["domain"].sum()) == 2


def _epoch_views(views: str, n: int = 12, batch_size: int = 4) -> dict[int, list[int]]:
    """sample id -> the domains (0 image, 1 mask) one shuffled epoch showed it in."""
    set_determinism(seed=0)
    loader = DataLoader(Dataset(_samples(n)), batch_size=batch_size, shuffle=True, drop_last=True, num_workers=0,
                        collate_fn=MixedDomainCollate(mask_ratio=0.5, views=views))  # fmt: skip
    shown: dict[int, list[int]] = {}
    render = MaskToImage()
    for batch in loader:
        rows = batch_size * (2 if views == "both" else 1)
        assert batch["image"].shape[0] == batch["domain"].shape[0] == rows
        assert int(batch["domain"].sum()) == rows // 2
        if views == "both":  # the images first, then the same pairs' masks
            assert batch["domain"].tolist() == [0] * batch_size + [1] * batch_size
            ids = [int(batch["image"][r].min()) - 10 for r in range(batch_size)]
            for r, i in enumerate(ids):
                mask = batch["image"][batch_size + r]
                assert torch.allclose(mask, render(torch.as_tensor(_samples(n)[i]["label"])), atol=1e-5)
            for i in ids:
                shown.setdefault(i, []).extend([0, 1])
        else:
            for r in range(batch_size):
                image = batch["image"][r]
                if int(batch["domain"][r]) == 0:
                    shown.setdefault(int(image.min()) - 10, []).append(0)
                else:  # a mask: find its pair by the rendered mask (the masks of _samples differ by row count)
                    match = [i for i, s in enumerate(_samples(n)) if torch.allclose(image, render(s["label"]), atol=1e-5)]
                    shown.setdefault(("mask", tuple(match)), []).append(1)
    set_determinism(seed=None)
    return shown


def test_epoch_shows_each_pair_once_as_image_or_mask():
    shown = _epoch_views("either")
    images = [i for i, d in shown.items() if isinstance(i, int)]
    masks = sum(len(d) for k, d in shown.items() if not isinstance(k, int))
    assert all(shown[i] == [0] for i in images)  # no image twice
    assert len(images) + masks == 12 and masks == 6  # 12 pairs, each once: 6 as images, 6 as masks


def test_epoch_shows_each_pair_as_image_and_mask_with_both():
    shown = _epoch_views("both")
    assert sorted(shown) == list(range(12)) and all(v == [0, 1] for v in shown.values())


def test_views_names():
    assert MIXED_DOMAIN_VIEWS == ("either", "both")


@pytest.mark.parametrize(
    "kwargs",
    [{"mask_ratio": -0.1}, {"mask_ratio": 1.5}, {"mask_ratio": True}, {"mask_ratio": "half"},
     {"mask_key": "image"}, {"domain_key": "label"}, {"keys": ()}, {"std": [0.0, 1.0, 1.0]},
     {"views": "all"}, {"views": "both", "mask_ratio": 0.25}, {"views": "both", "mask_ratio": 0.0}],
)
def test_ill_arguments(kwargs):
    with pytest.raises(ValueError):
        MixedDomainCollate(**kwargs)


def test_missing_mask_is_named():
    with pytest.raises(ValueError, match="label"):
        MixedDomainCollate(mask_ratio=1.0)([{"image": torch.zeros(3, 8, 8)}, {"image": torch.zeros(3, 8, 8)}])


# --- the device form: RandMixedDomainBatchd on a collated batch ---------------------------------------------------
from spectraflow_monai.transforms import MaskToImage, RandMixedDomainBatchd  # noqa: E402


@pytest.mark.parametrize("batch_size, ratio", [(8, 0.5), (5, 0.5), (7, 0.3), (4, 0.0), (4, 1.0)])
def test_device_form_exact_count_and_rendering(batch_size, ratio):
    g = torch.Generator().manual_seed(0)
    image = torch.randn(batch_size, 3, 8, 8, generator=g)
    label = (torch.rand(batch_size, 1, 8, 8, generator=g) > 0.5).float()
    out = RandMixedDomainBatchd(mask_ratio=ratio).set_random_state(0)({"image": image, "label": label})
    chosen = out["domain"].bool()
    assert out["domain"].dtype == torch.int64 and int(chosen.sum()) == num_masks(batch_size, ratio)
    assert "label" not in out
    renderer = MaskToImage()
    for i in range(batch_size):
        expected = renderer.render(label[i]) if chosen[i] else image[i]
        torch.testing.assert_close(out["image"][i], expected)


def test_device_form_views_both_determinism_and_errors():
    image, label = torch.randn(4, 3, 6, 6), (torch.rand(4, 1, 6, 6) > 0.5).float()
    out = RandMixedDomainBatchd(views="both", drop_mask=False)({"image": image, "label": label})
    assert out["image"].shape[0] == 8 and out["domain"].tolist() == [0] * 4 + [1] * 4
    assert out["label"].shape[0] == 8
    a = RandMixedDomainBatchd().set_random_state(3)({"image": image, "label": label})
    b = RandMixedDomainBatchd().set_random_state(3)({"image": image, "label": label})
    assert torch.equal(a["domain"], b["domain"]) and torch.equal(a["image"], b["image"])
    with pytest.raises(ValueError, match="mask_key"):
        RandMixedDomainBatchd()({"image": image})
    with pytest.raises(ValueError, match="mask_ratio"):
        RandMixedDomainBatchd(mask_ratio=1.5)


def test_render_batch_matches_render_label_maps():
    labels = torch.randint(0, 9, (3, 1, 5, 5)).float()
    labels[2] = 0
    for kw in ({"binarize": False}, {"binarize": False, "max_label": 8}, {}):
        m2i = MaskToImage(**kw)
        batch = m2i.render_batch(labels)
        for i in range(3):
            torch.testing.assert_close(batch[i], m2i.render(labels[i]))
