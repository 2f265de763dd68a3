"""The corruption properties of Berghoff et al. 2021 (§3.3 and §4.2), batched and seeded.

Geometric and colour transforms are kornia's, except where a benchmark showed kornia to be the
bottleneck on the CPU: blur (filters.py) and contrast and saturation (colour.py) have fast paths
there, with kornia kept as their test oracle. Noise and the task-specific properties are written
with torch. Every ``apply`` returns images in ``[0, 1]`` of the input's shape and dtype,
and returns the input unchanged where the intensity is 0.
"""

from __future__ import annotations

import functools
import math
import typing
from typing import TYPE_CHECKING

from certify.perturbations.base import (
    BANK_SIZE,
    Property,
    bank_windows,
    per_image,
    positive_grid,
    symmetric_grid,
)

if TYPE_CHECKING:
    import torch

_SEGMENT = 1 << 16  # values per step of the noise loops: 256 KB of float32 per buffer


def _identity_where_zero(x: torch.Tensor, out: torch.Tensor, inten: torch.Tensor,
                         clamp: bool = True) -> torch.Tensor:
    import torch

    out = out.to(x.dtype)
    if clamp:  # apply functions that already return values in [0, 1] skip this pass
        out = out.clamp_(0.0, 1.0)
    keep = inten == 0
    if bool(keep.any()):  # rare in a search (candidates exclude 0), so only then pay for it
        out = torch.where(keep.view(-1, 1, 1, 1).to(out.device), x, out)
    return out


def _abs0(p: torch.Tensor) -> torch.Tensor:
    return p[:, 0].abs()


def _maxabs(p: torch.Tensor) -> torch.Tensor:
    return p.abs().max(dim=1).values


def _grid2(bound: float, steps: int) -> torch.Tensor:
    import torch

    g = symmetric_grid(bound, steps)[:, 0]
    return torch.cartesian_prod(g, g)


# -- image noise ---------------------------------------------------------------------------

def _gaussian(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import torch

    noise = per_image(seeds, tuple(x.shape[1:]), "randn", x.device)
    out = torch.addcmul(x, noise, p[:, 0].view(-1, 1, 1, 1).to(x))
    return _identity_where_zero(x, out, p[:, 0])


def _uniform(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    u = per_image(seeds, tuple(x.shape[1:]), "rand", x.device) * 2 - 1
    return _identity_where_zero(x, x + p[:, 0].view(-1, 1, 1, 1).to(x) * u, p[:, 0])


def _impulse(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # salt and pepper on each value: with probability p set to 0 or 1 (half each): one uniform
    # u decides both, u < p/2 pepper, p/2 <= u < p salt. Written as a clamp of x between two 0/1
    # bounds, lo = [p/2 <= u < p] and hi = [u >= p/2]: comparisons into float tensors and a
    # clamp are vectorised, where boolean masks and torch.where were several times slower
    # (benchmarks/RESULTS.md). The work goes in segments of at most _SEGMENT values, groups of
    # small images or parts of a large one, through buffers that stay in the cache.
    import torch

    n = len(x)
    size = math.prod(x.shape[1:])
    prob = p[:, 0].to(x)
    half = prob / 2
    if n == 0 or size > BANK_SIZE // 4 or x.device.type != "cpu":
        u = per_image(seeds, tuple(x.shape[1:]), "rand", x.device)
        pr, hf = prob.view(-1, 1, 1, 1), half.view(-1, 1, 1, 1)
        hi = torch.ge(u, hf).to(x.dtype)
        out = torch.clamp(x, torch.lt(u, pr).to(x.dtype) * hi, hi)
        return _identity_where_zero(x, out, p[:, 0], clamp=False)
    windows, rows = bank_windows(seeds, size, "rand", x.device)
    flat = x.reshape(n, size)
    out = torch.empty((n, size), dtype=x.dtype, device=x.device)
    per = _SEGMENT // size  # whole images per segment
    if per > 1:
        buf = torch.empty(3, per * size, dtype=x.dtype)
        for s0 in range(0, n, per):
            s1 = min(n, s0 + per)
            m = (s1 - s0) * size
            u = torch.index_select(windows, 0, rows[s0:s1], out=buf[2, :m].view(s1 - s0, size))
            _salt_pepper(flat[s0:s1], u, prob[s0:s1, None], half[s0:s1, None], buf[:, :m],
                         out[s0:s1])
        return _identity_where_zero(x, out.view_as(x), p[:, 0], clamp=False)
    buf = torch.empty(2, min(size, _SEGMENT), dtype=x.dtype)
    for i, (o, pi, hf) in enumerate(zip(rows.tolist(), prob.tolist(), half.tolist(),
                                        strict=True)):
        for a in range(0, size, _SEGMENT):  # the image's window of the bank, read in place
            b = min(size, a + _SEGMENT)
            _salt_pepper(flat[i, a:b], windows[o, a:b], pi, hf, buf[:, : b - a], out[i, a:b])
    return _identity_where_zero(x, out.view_as(x), p[:, 0], clamp=False)


def _salt_pepper(x: torch.Tensor, u: torch.Tensor, prob: torch.Tensor | float,
                 half: torch.Tensor | float, buf: torch.Tensor, out: torch.Tensor) -> None:
    # prob and half as python floats are compared in u's dtype: for float32 images, exactly
    # as the float32 tensors would be
    import torch

    hi = torch.ge(u, half, out=buf[0].view_as(u))
    lo = torch.lt(u, prob, out=buf[1].view_as(u)).mul_(hi)
    torch.clamp(x, lo, hi, out=out)


def _linf(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # p = [eps, corner]: uniform inside the L-inf ball, or a random corner of it
    import torch

    u = per_image(seeds, tuple(x.shape[1:]), "rand", x.device) * 2 - 1
    corner = (p[:, 1] > 0.5).view(-1, 1, 1, 1)
    delta = torch.where(corner, torch.sign(u) + (u == 0).to(u.dtype), u)
    return _identity_where_zero(x, x + p[:, 0].view(-1, 1, 1, 1).to(x) * delta, p[:, 0])


def _linf_levels(bound: float, steps: int) -> torch.Tensor:
    import torch

    eps = positive_grid(bound, steps)[:, 0]
    return torch.cartesian_prod(eps, torch.tensor([0.0, 1.0], dtype=torch.float64))


def _l0(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # k pixel locations, every channel set to 0 or 1 (the extremes change a pixel the most)
    import torch

    n, c, h, w = x.shape
    u = per_image(seeds, (h * w + c * h * w,), "rand", x.device)
    ks = p[:, 0].round().to(torch.long)
    if n and bool((ks == ks[0]).all()):  # one k (a draw at the bound): the k smallest, no sort
        k = max(0, min(int(ks[0]), h * w))
        chosen = torch.zeros(n, h * w, dtype=torch.bool, device=x.device)
        chosen.scatter_(1, u[:, : h * w].topk(k, dim=1, largest=False).indices, True)
        chosen = chosen.view(n, 1, h, w)
    else:
        rank = u[:, : h * w].argsort(dim=1).argsort(dim=1)
        chosen = (rank < ks.view(-1, 1).to(x.device)).view(n, 1, h, w)
    values = (u[:, h * w :] < 0.5).to(x.dtype).view(n, c, h, w)
    return _identity_where_zero(x, torch.where(chosen, values, x), p[:, 0])


def _l0_levels(bound: float, steps: int) -> torch.Tensor:
    import torch

    ks = torch.unique(torch.linspace(0, bound, steps + 1, dtype=torch.float64).round())
    return typing.cast(torch.Tensor, ks[ks > 0].unsqueeze(1))


# -- geometric -----------------------------------------------------------------------------

def _rotation(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    out = kornia.geometry.transform.rotate(x, p[:, 0].to(x), padding_mode="border")
    return _identity_where_zero(x, out, p[:, 0])


def _translation(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    out = kornia.geometry.transform.translate(x, p[:, :2].to(x), padding_mode="border")
    return _identity_where_zero(x, out, _maxabs(p))


def _scaling(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    factor = (1.0 + p[:, 0]).to(x).view(-1, 1).repeat(1, 2)
    out = kornia.geometry.transform.scale(x, factor, padding_mode="border")
    return _identity_where_zero(x, out, p[:, 0])


def _shearing(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # kornia shears about the top-left corner; shear about the centre instead so that the sign
    # stays in the frame: translate by -c, shear, translate back.
    import kornia
    import torch

    n, _, h, w = x.shape
    sh = p[:, :2].to(x)
    cx, cy = (w - 1) / 2, (h - 1) / 2
    m = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    m[:, 0, 0] = 1
    m[:, 1, 1] = 1
    m[:, 0, 1] = sh[:, 0]
    m[:, 1, 0] = sh[:, 1]
    m[:, 0, 2] = -sh[:, 0] * cy
    m[:, 1, 2] = -sh[:, 1] * cx
    out = kornia.geometry.transform.warp_affine(x, m, (h, w), padding_mode="border",
                                                align_corners=True)
    return _identity_where_zero(x, out, _maxabs(p))


def _blur_size(sigma: float, h: int, w: int) -> int:
    # taps out to 3 sigma, at most what a reflected border allows
    return max(1, min(2 * math.ceil(3 * sigma) + 1, 2 * (min(h, w) // 2) - 1))


def _blur(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # Each image is blurred with its own sigma and a kernel sized for that sigma alone, so an
    # image's output does not depend on the rest of the batch. A search step shares one sigma
    # across its batch, so there is usually a single group.
    import torch

    sigma = p[:, 0].clamp(min=1e-3).to(x)
    levels, group = torch.unique(sigma.cpu(), return_inverse=True)
    if len(levels) == 1:
        out = _blur_at(x, float(levels[0]))
    else:
        out = torch.empty_like(x)
        for g, s in enumerate(levels.tolist()):
            idx = (group == g).nonzero().flatten().to(x.device)
            out[idx] = _blur_at(x[idx], s)
    return _identity_where_zero(x, out, p[:, 0], clamp=x.device.type != "cpu")


def _blur_at(x: torch.Tensor, sigma: float) -> torch.Tensor:
    import kornia

    from certify.perturbations.filters import gaussian_blur

    k = _blur_size(sigma, *x.shape[-2:])
    if x.device.type == "cpu":  # banded matrix products, clamped to [0, 1] (filters.py)
        return gaussian_blur(x, sigma, k)
    # kornia's grouped convolutions are fast enough on a GPU
    return kornia.filters.gaussian_blur2d(x, (k, k), x.new_full((len(x), 2), sigma))


def _sharpen(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    out = kornia.enhance.sharpness(x, (1.0 + p[:, 0]).to(x))
    return _identity_where_zero(x, out, p[:, 0])


def _flipped(bound: float, steps: int) -> torch.Tensor:
    """The flip's one level: flipped (its bound and steps do not apply)."""
    import torch

    return torch.tensor([[1.0]], dtype=torch.float64)


def _flip(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    return _identity_where_zero(x, kornia.geometry.transform.hflip(x), p[:, 0])


# -- colour --------------------------------------------------------------------------------

def _brightness(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    out = kornia.enhance.adjust_brightness(x, p[:, 0].to(x), clip_output=True)
    return _identity_where_zero(x, out, p[:, 0])


def _contrast(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    from certify.perturbations.colour import adjust_contrast

    factor = (1.0 + p[:, 0]).to(x)
    if x.device.type == "cpu" and x.shape[1] == 3:  # kornia's formula in cached segments
        return _identity_where_zero(x, adjust_contrast(x, factor), p[:, 0], clamp=False)
    out = kornia.enhance.adjust_contrast_with_mean_subtraction(x, factor)
    return _identity_where_zero(x, out, p[:, 0])


def _saturation(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    from certify.perturbations.colour import clamped_in_segments

    factor = (1.0 + p[:, 0]).to(x)
    if x.device.type == "cpu":  # kornia a few images at a time, its temporaries in the cache
        out = clamped_in_segments(kornia.enhance.adjust_saturation, x, factor)
        return _identity_where_zero(x, out, p[:, 0], clamp=False)
    return _identity_where_zero(x, kornia.enhance.adjust_saturation(x, factor), p[:, 0])


def _hue(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia
    import torch

    out = kornia.enhance.adjust_hue(x, torch.deg2rad(p[:, 0]).to(x))
    return _identity_where_zero(x, out, p[:, 0])


def _grayscale(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia

    gray = kornia.color.rgb_to_grayscale(x).expand_as(x)
    a = p[:, 0].to(x).view(-1, 1, 1, 1)
    return _identity_where_zero(x, x * (1 - a) + gray * a, p[:, 0])


def _colour_depth(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    import kornia
    import torch

    bits = (8 - p[:, 0].round()).clamp(1, 8).to(torch.uint8).to(x.device)
    out = kornia.enhance.posterize(x, bits)
    return _identity_where_zero(x, out, p[:, 0])


def _depth_levels(bound: float, steps: int) -> torch.Tensor:
    import torch

    return torch.arange(1, int(bound) + 1, dtype=torch.float64).unsqueeze(1)


# -- task-specific -------------------------------------------------------------------------

def _adaptive_brightness(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # a smooth field: a 4x4 grid of offsets in [-d, d] upsampled bicubically over the image,
    # so some parts of the sign get brighter and others darker (Berghoff et al., Fig. 4). The
    # 16 coarse values come from the search design (p[:, 1:17], in [-1, 1]) or, without one
    # (a corruption pair), from each image's seed
    import torch.nn.functional as F

    n, _, h, w = x.shape
    if p.shape[1] >= 17:
        coarse = p[:, 1:17].to(x).view(n, 1, 4, 4)
    else:
        coarse = per_image(seeds, (1, 4, 4), "rand", x.device) * 2 - 1
    field = F.interpolate(coarse.to(x), size=(h, w), mode="bicubic",
                          align_corners=True).clamp(-1, 1)
    out = x + p[:, 0].to(x).view(-1, 1, 1, 1) * field.to(x)
    return _identity_where_zero(x, out, p[:, 0])


@functools.cache
def _quadrant_fields() -> torch.Tensor:
    """The 4x4 coarse fields that are +1 or -1 on each 2x2 quadrant, ``[16, 16]``: one corner
    against the other three first (each sign), then halves, diagonals and uniform (made once,
    when first used; callers do not modify it)."""
    import torch

    patterns = []
    for bits in range(16):
        signs = [1.0 if bits >> q & 1 else -1.0 for q in range(4)]  # TL, TR, BL, BR
        field = torch.tensor(signs).view(2, 2).repeat_interleave(2, 0).repeat_interleave(2, 1)
        patterns.append((abs(sum(signs)) != 2, abs(sum(signs)) == 4, bits, field.flatten()))
    patterns.sort(key=lambda t: t[:3])  # one odd corner (|sum| 2), then halves, then uniform
    return torch.stack([t[3] for t in patterns])


def _sobol(dim: int, seed: int, start: int, stop: int) -> torch.Tensor:
    """Points ``start:stop`` of a scrambled Sobol sequence in ``[0, 1)^dim`` (fixed seed):
    every doubling of ``stop`` fills the gaps of the points before it."""
    import torch

    if stop <= start:
        return torch.zeros(0, dim, dtype=torch.float64)
    eng = torch.quasirandom.SobolEngine(dim, scramble=True, seed=seed)
    if start:
        eng.fast_forward(start)
    return eng.draw(stop - start, dtype=torch.float64)


def _field_design(start: int, stop: int) -> torch.Tensor:
    """Coarse fields ``[stop - start, 16]`` in [-1, 1]: the 16 quadrant patterns first (a
    corner, a half, a diagonal brighter and the rest darker), then the corners of the whole
    4x4 grid (signs of a Sobol sequence) alternating with points inside it."""
    import torch

    quadrants = _quadrant_fields()
    q = len(quadrants)
    head = quadrants[start:min(stop, q)].to(torch.float64)
    a, b = max(start, q), max(stop, q)
    u = _sobol(16, 0xF1E1D, a - q, b - q) * 2 - 1
    corner = (torch.arange(a, b) % 2 == 0).view(-1, 1)
    tail = torch.where(corner, torch.sign(u) + (u == 0).to(u.dtype), u)
    return torch.cat([head, tail])


def _sticker(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    # one square sticker of side p * image side, centred on the sign's central region, with a
    # colour and orientation (Berghoff et al., Fig. 5): position, angle and colour from the
    # search design (p[:, 1:7], in [0, 1]) or, without one (a corruption pair), the image's seed
    import torch

    n, c, h, w = x.shape
    if p.shape[1] >= 7:
        r = p[:, 1:7].to(x)
    else:
        r = per_image(seeds, (7,), "rand", x.device).to(x)
    cx = (0.3 + 0.4 * r[:, 0]) * (w - 1)
    cy = (0.3 + 0.4 * r[:, 1]) * (h - 1)
    angle = r[:, 2] * (math.pi / 2)
    colour = r[:, 3:6]
    half = p[:, 0].to(x) * min(h, w) / 2
    ys = torch.arange(h, device=x.device, dtype=x.dtype).view(1, h, 1)
    xs = torch.arange(w, device=x.device, dtype=x.dtype).view(1, 1, w)
    dx, dy = xs - cx.view(-1, 1, 1), ys - cy.view(-1, 1, 1)
    cos, sin = torch.cos(angle).view(-1, 1, 1), torch.sin(angle).view(-1, 1, 1)
    u, v = cos * dx + sin * dy, -sin * dx + cos * dy
    # one pixel of anti-aliasing at the edge
    edge = (half.view(-1, 1, 1) + 0.5 - torch.maximum(u.abs(), v.abs())).clamp(0, 1)
    m = edge.unsqueeze(1)
    out = x * (1 - m) + colour[:, :c].view(n, c, 1, 1) * m
    return _identity_where_zero(x, out, p[:, 0])


def _sticker_design(start: int, stop: int) -> torch.Tensor:
    """Sticker placements ``[stop - start, 6]`` in [0, 1): x, y, angle and colour from a
    scrambled Sobol sequence, whose first 4^k points put one position in every cell of a
    2^k x 2^k grid over the sign's central region."""
    return _sobol(6, 0x571C, start, stop)


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in (
        Property("gaussian_noise", "noise", "sigma", "Gaussian noise of standard deviation "
                 "sigma on every value", ("sigma",), positive_grid, _abs0, _gaussian,
                 random=True, default_bound=0.1, default_steps=5, statistical=True),
        Property("uniform_noise", "noise", "half-width", "uniform noise in [-a, a] on every "
                 "value", ("a",), positive_grid, _abs0, _uniform, random=True,
                 default_bound=0.15, default_steps=5, statistical=True),
        Property("impulse_noise", "noise", "probability", "salt-and-pepper noise: each value "
                 "set to 0 or 1 with probability p", ("p",), positive_grid, _abs0, _impulse,
                 random=True, default_bound=0.05, default_steps=5, max_bound=1.0,
                 statistical=True),
        Property("random_linf", "pixel", "epsilon", "random sign noise: every value "
                 "changed by at most epsilon, uniform in the ball and on its corners (a random "
                 "draw, not a worst case: the square_linf attack searches the worst case)",
                 ("epsilon", "corner"), _linf_levels, _abs0, _linf, random=True,
                 default_bound=8 / 255, default_steps=4, statistical=True),
        Property("random_l0", "pixel", "pixels", "random pixel changes: k random pixels "
                 "set to extreme values (a random draw, not a worst case: the sparse_rs_l0 "
                 "attack searches the worst case)",
                 ("k",), _l0_levels, _abs0, _l0, random=True, default_bound=10,
                 default_steps=5, statistical=True),
        Property("rotation", "geometric", "degrees", "rotation about the image centre",
                 ("angle",), symmetric_grid, _abs0, _rotation, default_bound=15,
                 default_steps=5),
        Property("translation", "geometric", "pixels", "shift by (dx, dy) pixels",
                 ("dx", "dy"), _grid2, _maxabs, _translation, default_bound=3,
                 default_steps=3),
        Property("scaling", "geometric", "relative", "zoom by a factor 1 + s about the centre",
                 ("s",), symmetric_grid, _abs0, _scaling, default_bound=0.2, default_steps=4,
                 max_bound=0.9),
        Property("shearing", "geometric", "shear", "shear by (sx, sy) about the centre",
                 ("sx", "sy"), _grid2, _maxabs, _shearing, default_bound=0.2,
                 default_steps=2),
        Property("blur", "geometric", "sigma (pixels)", "Gaussian blur", ("sigma",),
                 positive_grid, _abs0, _blur, default_bound=1.5, default_steps=5),
        Property("sharpen", "geometric", "amount", "sharpening (kornia sharpness 1 + a)",
                 ("a",), positive_grid, _abs0, _sharpen, default_bound=2.0, default_steps=4),
        Property("flip", "geometric", "flipped", "horizontal flip (flip-invariant classes only)",
                 ("flipped",), _flipped,
                 _abs0, _flip, default_bound=1, default_steps=1),
        Property("brightness", "colour", "offset", "brightness offset added to every value",
                 ("delta",), symmetric_grid, _abs0, _brightness, default_bound=0.3,
                 default_steps=5),
        Property("contrast", "colour", "relative", "contrast factor 1 + c about the mean",
                 ("c",), symmetric_grid, _abs0, _contrast, default_bound=0.5,
                 default_steps=5, max_bound=1.0),
        Property("saturation", "colour", "relative", "saturation factor 1 + s", ("s",),
                 symmetric_grid, _abs0, _saturation, default_bound=0.5, default_steps=5,
                 max_bound=1.0),
        Property("hue", "colour", "degrees", "hue rotation", ("degrees",), symmetric_grid,
                 _abs0, _hue, default_bound=18, default_steps=3, max_bound=180),
        Property("grayscale", "colour", "blend", "blend towards grayscale", ("alpha",),
                 positive_grid, _abs0, _grayscale, default_bound=1.0, default_steps=4,
                 max_bound=1.0),
        Property("colour_depth", "colour", "bits removed", "fewer bits per channel "
                 "(8 - k bits)", ("k",), _depth_levels, _abs0, _colour_depth,
                 default_bound=5, default_steps=5, max_bound=7),
        Property("adaptive_brightness", "task", "offset", "smooth, spatially varying "
                 "brightness field in [-d, d] (4x4 control points, searched: each quadrant "
                 "brighter or darker first, then the grid's corners and points inside)",
                 ("delta",), positive_grid, _abs0, _adaptive_brightness, random=True,
                 default_bound=0.3, default_steps=3,
                 design_params=tuple(f"c{k}" for k in range(16)), design=_field_design,
                 gradient_design=True),
        Property("sticker", "task", "side (fraction)", "one square sticker on the sign, its "
                 "position, orientation and colour searched (a Sobol design that covers the "
                 "central region ever more finely)", ("size",), positive_grid, _abs0,
                 _sticker, random=True, default_bound=0.25, default_steps=5, max_bound=1.0,
                 design_params=("x", "y", "angle", "r", "g", "b"), design=_sticker_design),
    )
}
