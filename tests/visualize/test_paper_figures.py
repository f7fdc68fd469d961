"""The analysis figures from arrays: t-SNE, gate maps, error spectra, model panel, and the feature spread."""

from __future__ import annotations

import numpy as np
import pytest

from spectraflow_monai.visualize.paper_figures import (
    feature_spread,
    mean_pairwise_distance,
    plot_error_spectra,
    plot_feature_tsne,
    plot_gate_maps,
    plot_model_panel,
)

RNG = np.random.default_rng(0)
IMAGE = RNG.random((32, 32, 3))
MASK = np.zeros((32, 32), bool)
MASK[8:20, 10:24] = True


@pytest.mark.parametrize(
    "features,expected",
    [([[1.0, 0.0], [-1.0, 0.0]], 2.0), ([[2.0, 0.0], [0.0, 2.0]], np.sqrt(2.0)), ([[3.0, 4.0], [3.0, 4.0]], 0.0)],
)
def test_feature_spread_known_values(features, expected):
    assert feature_spread(np.array(features)) == pytest.approx(expected)
    assert feature_spread(10 * np.array(features)) == pytest.approx(expected)  # independent of the scale


def test_mean_pairwise_distance_known_value():
    assert mean_pairwise_distance(np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])) == pytest.approx((5 + 5 + 0) / 3)


def test_feature_spread_needs_two_rows():
    with pytest.raises(ValueError, match="features"):
        feature_spread(np.ones((1, 4)))


def test_every_figure_is_written(tmp_path):
    feats = RNG.normal(size=(12, 8))
    classes = np.repeat([0, 1], 6)
    paths = [
        plot_feature_tsne({"a": (feats, classes), "b": (2 * feats, classes)}, tmp_path / "tsne.png"),
        plot_gate_maps([IMAGE, IMAGE], [RNG.random((8, 8)), np.full((8, 8), 0.5)], [MASK, MASK], tmp_path / "g.png"),
        plot_error_spectra({"m": (np.linspace(0, 0.5, 5), np.arange(1.0, 6.0))}, tmp_path / "s.png", (0.0, 0.1, 0.5)),
        plot_model_panel([IMAGE], [MASK], {"m": [MASK], "n": [np.zeros_like(MASK)]}, tmp_path / "p.png"),
    ]
    for path in paths:
        assert (tmp_path / path).stat().st_size > 0


@pytest.mark.parametrize(
    "call",
    [
        lambda p: plot_feature_tsne({}, p),
        lambda p: plot_feature_tsne({"a": (np.ones((4, 2)), np.zeros(3))}, p),
        lambda p: plot_gate_maps([IMAGE], [], [MASK], p),
        lambda p: plot_model_panel([IMAGE], [MASK], {"m": []}, p),
    ],
)
def test_bad_inputs_are_named(tmp_path, call):
    with pytest.raises(ValueError):
        call(tmp_path / "x.png")
