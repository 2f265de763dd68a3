"""Property tests of the perturbations (Hypothesis): identity, range, determinism, monotony."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certify.perturbations import PROPERTIES

pytestmark = pytest.mark.unit

NAMES = sorted(PROPERTIES)
settings.register_profile("certify", deadline=None, max_examples=15,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("certify")


def _images(seed: int, n: int = 3, size: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g)


def _params(name: str, frac: float, n: int) -> torch.Tensor:
    prop = PROPERTIES[name]
    rows, inten, _ = prop.candidates(prop.default_bound, prop.default_steps, 1)
    row = rows[min(len(rows) - 1, int(frac * len(rows)))]
    return row.expand(n, -1).clone()


@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**31 - 1))
def test_intensity_zero_is_identity(name, seed):
    x = _images(seed)
    p = torch.zeros(len(x), len(PROPERTIES[name].params))
    out = PROPERTIES[name].apply(x, p, torch.arange(len(x)) + seed)
    assert torch.equal(out, x)


@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**31 - 1),
       frac=st.floats(0, 1), size=st.sampled_from([8, 16, 32]))
def test_range_shape_dtype_and_determinism(name, seed, frac, size):
    x = _images(seed, size=size)
    p = _params(name, frac, len(x))
    seeds = torch.arange(len(x)) * 7 + seed
    out = PROPERTIES[name].apply(x, p, seeds)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert torch.equal(out, PROPERTIES[name].apply(x, p, seeds))
    assert torch.equal(out[1:2], PROPERTIES[name].apply(x[1:2], p[1:2], seeds[1:2]))


@pytest.mark.parametrize("name", ["blur", "gaussian_noise", "uniform_noise", "impulse_noise",
                                  "adaptive_brightness"])
@given(seed=st.integers(0, 2**31 - 1))
def test_monotone_in_intensity(name, seed):
    x = _images(seed, n=2, size=32)
    prop = PROPERTIES[name]
    seeds = torch.tensor([seed, seed + 1])
    levels = torch.linspace(0, prop.default_bound, 6)
    dist = []
    for lv in levels:
        p = torch.full((2, len(prop.params)), float(lv))
        dist.append(float((prop.apply(x, p, seeds) - x).abs().mean()))
    assert all(b >= a - 1e-6 for a, b in zip(dist, dist[1:], strict=False)), dist
    assert dist[-1] > dist[0]


def test_random_properties_differ_by_seed():
    x = _images(0)
    for name, prop in PROPERTIES.items():
        if not prop.random:
            continue
        p = _params(name, 1.0, len(x))
        a = prop.apply(x, p, torch.tensor([1, 2, 3]))
        b = prop.apply(x, p, torch.tensor([4, 5, 6]))
        assert not torch.equal(a, b), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_matches_cpu():
    x = _images(0, size=32)
    for name, prop in PROPERTIES.items():
        p = _params(name, 0.7, len(x))
        seeds = torch.arange(len(x))
        cpu = prop.apply(x, p, seeds)
        gpu = prop.apply(x.cuda(), p.cuda(), seeds).cpu()
        assert torch.allclose(cpu, gpu, atol=1e-4), name


# -- fast paths against their references ---------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (3, 3, 32, 32), (2, 1, 37, 70), (1, 3, 130, 129),
                                   (2, 3, 96, 64), (1, 3, 224, 224)])
@pytest.mark.parametrize("sigma", [0.3, 1.0, 3.0])
def test_blur_matches_kornia(shape, sigma):
    # the banded-matrix blur (tiles of rows and columns, runs of interior tiles batched, all
    # planes' interior tiles in one product where the height is a multiple of the tile) is
    # kornia's gaussian_blur2d with reflected borders, to float rounding
    import kornia

    from certify.perturbations.filters import gaussian_blur
    from certify.perturbations.properties import _blur_size

    x = torch.rand(*shape, generator=torch.Generator().manual_seed(len(shape) + shape[-1]))
    k = _blur_size(sigma, *shape[-2:])
    ref = kornia.filters.gaussian_blur2d(x, (k, k), (sigma, sigma))
    out = gaussian_blur(x, sigma, k)
    assert torch.allclose(out, ref.clamp(0, 1), rtol=0, atol=2e-6)
    p = torch.full((shape[0], 1), sigma)
    assert torch.allclose(PROPERTIES["blur"].apply(x, p, torch.arange(shape[0])),
                          ref.clamp(0, 1), rtol=0, atol=2e-6)


@pytest.mark.parametrize("shape", [(5, 3, 8, 8), (30, 3, 32, 32), (3, 3, 160, 150)])
def test_contrast_and_saturation_match_kornia(shape):
    # the segmented fast paths (colour.py) against kornia on the whole batch: contrast to float
    # rounding (its mean luma comes from the channel means), saturation exactly
    import kornia

    x = torch.rand(*shape, generator=torch.Generator().manual_seed(shape[0]))
    c = torch.linspace(-1.0, 1.0, shape[0]).unsqueeze(1)
    c[shape[0] // 2] = 0.0
    seeds = torch.arange(shape[0])
    ref = kornia.enhance.adjust_contrast_with_mean_subtraction(x, 1.0 + c[:, 0]).clamp(0, 1)
    ref[shape[0] // 2] = x[shape[0] // 2]  # c = 0 is the identity
    out = PROPERTIES["contrast"].apply(x, c, seeds)
    assert torch.allclose(out, ref, rtol=0, atol=1e-6)
    ref = kornia.enhance.adjust_saturation(x, 1.0 + c[:, 0]).clamp(0, 1)
    ref[shape[0] // 2] = x[shape[0] // 2]
    assert torch.equal(PROPERTIES["saturation"].apply(x, c, seeds), ref)
    for name in ("contrast", "saturation"):  # an image's output does not depend on the batch
        full = PROPERTIES[name].apply(x, c, seeds)
        for i in (0, shape[0] - 1):
            assert torch.equal(full[i : i + 1], PROPERTIES[name].apply(x[i : i + 1], c[i : i + 1],
                                                                       seeds[i : i + 1]))


@pytest.mark.parametrize("size", [24, 49, 65])  # 49, 65: sizes that once left a 1-wide tile
def test_blur_per_image_sigma_is_independent_of_the_batch(size):
    x = _images(3, n=5, size=size)
    p = torch.tensor([[0.3], [1.5], [0.0], [1.5], [0.9]])
    out = PROPERTIES["blur"].apply(x, p, torch.arange(5))
    for i in range(5):
        assert torch.equal(out[i : i + 1], PROPERTIES["blur"].apply(x[i : i + 1], p[i : i + 1],
                                                                   torch.arange(1)))
    assert torch.equal(out[2], x[2])


@pytest.mark.parametrize("size", [8, 32, 160])  # 3x160x160 goes in segments of one image
def test_impulse_matches_reference(size):
    # the clamp formulation sets exactly the values a plain torch.where of the definition does,
    # whatever the batch: each image's noise comes from its seed alone
    from certify.perturbations.base import per_image

    x = _images(5, n=4, size=size)
    p = torch.tensor([[0.05], [0.3], [0.0], [1.0]])
    seeds = torch.tensor([11, 2**40 + 7, 3, 5])
    u = per_image(seeds, tuple(x.shape[1:]), "rand", x.device)
    prob = p[:, 0].view(-1, 1, 1, 1)
    ref = torch.where(u < prob, (u >= prob / 2).to(x.dtype), x)
    ref[2] = x[2]
    out = PROPERTIES["impulse_noise"].apply(x, p, seeds)
    assert torch.equal(out, ref)
    for i in range(4):
        assert torch.equal(out[i : i + 1],
                           PROPERTIES["impulse_noise"].apply(x[i : i + 1], p[i : i + 1],
                                                             seeds[i : i + 1]))
    changed = (out != x).float().mean().item()
    assert 0.0 < changed < 0.6
