import numpy as np
import pytest
import torch
from monai.data import MetaTensor
from monai.transforms import Compose

from spectraflow_monai.transforms import (
    CORRUPTION_KINDS,
    CORRUPTION_SEVERITIES,
    BrightnessCorruption,
    BrightnessCorruptiond,
    ContrastCorruption,
    ContrastCorruptiond,
    Corruption,
    Corruptiond,
    GaussianBlurCorruption,
    GaussianBlurCorruptiond,
    GaussianNoiseCorruption,
    GaussianNoiseCorruptiond,
    corruption_parameter,
)

ARRAY = {
    "brightness": BrightnessCorruption,
    "contrast": ContrastCorruption,
    "gaussian_blur": GaussianBlurCorruption,
    "gaussian_noise": GaussianNoiseCorruption,
}
DICT = {
    "brightness": BrightnessCorruptiond,
    "contrast": ContrastCorruptiond,
    "gaussian_blur": GaussianBlurCorruptiond,
    "gaussian_noise": GaussianNoiseCorruptiond,
}


def image(shape=(3, 12, 14), seed=0):
    """A smooth-ish image in [0.2, 0.6] with an edge (so every corruption changes it, none saturates at once)."""
    rng = np.random.RandomState(seed)
    img = 0.2 + 0.2 * rng.rand(*shape).astype(np.float32)
    img[:, : shape[1] // 2] += 0.2
    return img


def as_type(img, kind):
    if kind == "numpy":
        return img
    if kind == "torch":
        return torch.as_tensor(img)
    return MetaTensor(torch.as_tensor(img), meta={"filename_or_obj": "case_0.png"})


@pytest.mark.parametrize("kind", CORRUPTION_KINDS)
@pytest.mark.parametrize("container", ["numpy", "torch", "meta"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_type_shape_dtype_and_range_kept(kind, container, dtype):
    img = as_type(image().astype(dtype), container)
    for transform in (ARRAY[kind](severity=3), Corruption(kind, 3)):
        out = transform(img)
        assert type(out) is type(img)
        assert tuple(out.shape) == tuple(img.shape)
        assert out.dtype == img.dtype
        values = np.asarray(out)
        assert values.min() >= 0.0 and values.max() <= 1.0
        if container == "meta":
            assert out.meta["filename_or_obj"] == "case_0.png"


@pytest.mark.parametrize("kind", CORRUPTION_KINDS)
@pytest.mark.parametrize("container", ["numpy", "torch", "meta"])
def test_severity_zero_is_the_identity(kind, container):
    img = as_type(image() * 1.5 - 0.1, container)  # values outside [0, 1] are not even clipped
    for transform in (ARRAY[kind](severity=0), Corruption(kind, 0)):
        assert transform(img) is img
    for transform in (DICT[kind](keys="image", severity=0), Corruptiond("image", kind=kind, severity=0)):
        out = transform({"image": img, "label": "unchanged"})
        assert out["image"] is img and out["label"] == "unchanged"


@pytest.mark.parametrize("kind", CORRUPTION_KINDS)
def test_effect_grows_with_severity(kind):
    img = image()
    changes = [float(np.abs(Corruption(kind, s)(img) - img).mean()) for s in range(6)]
    assert changes[0] == 0.0
    assert all(b > a for a, b in zip(changes, changes[1:])), changes


@pytest.mark.parametrize("kind", CORRUPTION_KINDS)
def test_dictionary_matches_array(kind):
    img = image()
    data = {"image": torch.as_tensor(img), "label": np.ones((1, 12, 14), np.uint8)}
    out = DICT[kind](keys="image", severity=2)(data)
    np.testing.assert_allclose(np.asarray(out["image"]), np.asarray(ARRAY[kind](severity=2)(torch.as_tensor(img))))
    assert out["label"] is data["label"]
    np.testing.assert_allclose(
        np.asarray(Corruptiond("image", kind=kind, severity=2)(data)["image"]), np.asarray(out["image"])
    )


def test_parameters_follow_the_table():
    img = image()
    np.testing.assert_allclose(BrightnessCorruption(2)(img), np.clip(img + 0.2, 0, 1), atol=1e-6)
    mean = img.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(ContrastCorruption(4)(img), (img - mean) * 0.1 + mean, atol=1e-6)
    assert corruption_parameter("gaussian_blur", 5) == 6.0 and corruption_parameter("gaussian_noise", 1) == 0.08
    assert all(len(v) == 6 for v in CORRUPTION_SEVERITIES.values())
    # the blur keeps a constant image constant (replicated border, no dark frame)
    flat = np.full((1, 9, 9), 0.7, np.float32)
    np.testing.assert_allclose(GaussianBlurCorruption(5)(flat), flat, atol=1e-4)
    assert GaussianBlurCorruption(1)(torch.rand(1, 5, 6, 7)).shape == (1, 5, 6, 7)
    # the noise has the tabled spread where it is not clipped
    mid = np.full((1, 64, 64), 0.5, np.float32)
    assert np.std(GaussianNoiseCorruption(1, seed=3)(mid) - mid) == pytest.approx(0.08, rel=0.1)


def test_noise_is_reproducible_for_a_seed():
    img = image()
    a1, a2 = GaussianNoiseCorruption(3, seed=7), GaussianNoiseCorruption(3, seed=7)
    first = [a1(img), a1(img)]
    np.testing.assert_array_equal(first[0], a2(img))
    np.testing.assert_array_equal(first[1], a2(img))
    assert not np.array_equal(first[0], first[1])  # fresh noise per call
    assert not np.array_equal(GaussianNoiseCorruption(3, seed=8)(img), first[0])
    d1 = Corruptiond("image", kind="gaussian_noise", severity=3, seed=7)
    np.testing.assert_array_equal(d1({"image": img})["image"], first[0])
    # a seeded Compose reseeds the transform (monai.utils.set_determinism does the same)
    pipeline = Compose([GaussianNoiseCorruptiond("image", severity=2, seed=None)])
    pipeline.set_random_state(seed=11)
    out1 = pipeline({"image": img})["image"]
    pipeline.set_random_state(seed=11)
    np.testing.assert_array_equal(pipeline({"image": img})["image"], out1)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: BrightnessCorruption(6), "severity"),
        (lambda: ContrastCorruption(-1), "severity"),
        (lambda: GaussianBlurCorruption(1.5), "severity"),
        (lambda: GaussianNoiseCorruption(True), "severity"),
        (lambda: GaussianNoiseCorruption(1, seed=-1), "seed"),
        (lambda: Corruption("fog", 1), "kind"),
        (lambda: Corruptiond("image", kind="contrast", severity="2"), "severity"),
        (lambda: corruption_parameter("blur", 1), "kind"),
    ],
)
def test_ill_arguments_raise(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_blur_rejects_non_image_shapes():
    with pytest.raises(ValueError, match="img"):
        GaussianBlurCorruption(1)(np.zeros((4, 4), np.float32))
