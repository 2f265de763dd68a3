"""Gaussian blur on the CPU as banded matrix products (the blur property's fast path).

kornia's ``gaussian_blur2d`` (separable grouped convolutions) is the reference and stays the test
oracle (tests/test_perturbations.py). On one CPU thread it was 6 to 8 times slower than this
path (benchmarks/RESULTS.md): a depthwise convolution uses little of the CPU's vector units. A
1-D Gaussian with reflected borders is a banded ``[L, L]`` matrix, so each separable pass is a
matrix product that BLAS runs near its peak. Products with the whole band would do ``L``
multiply-adds per value instead of ``k``; cutting the output into tiles of ``TILE`` rows (or
columns), each multiplied only by the ``TILE + k - 1`` inputs its band touches, costs
``TILE + k - 1`` per value instead.

Away from the borders every tile's band is the same matrix, so a run of such tiles is one
batched product over overlapping strided windows of the input (``torch.bmm`` reads and writes
strided views in place): a 224x224 image takes a handful of calls instead of one per tile, which
is what lets tiles as small as 16 pay (each call costs a few microseconds). The images stay in
their own ``[N, C, H, W]`` layout: the vertical pass multiplies each plane from the left into a
buffer, the horizontal pass multiplies the buffer's rows from the right straight into the
output, a few images at a time so that both stay in the cache.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

TILE = 16
CHUNK_VALUES = 1 << 17  # 512 KB of float32 per chunk of images (at least one image)


def gaussian_kernel1d(k: int, sigma: float) -> torch.Tensor:
    """The normalised Gaussian of ``k`` (odd) taps and standard deviation ``sigma``, float64."""
    t = torch.arange(k, dtype=torch.float64) - k // 2
    w = torch.exp(-t * t / (2.0 * sigma * sigma))
    return w / w.sum()


class Run(NamedTuple):
    """``count`` tiles with the same band: tile ``j`` writes outputs ``c0 + j*width ...`` from
    the ``taps`` inputs starting at ``lo + j*width``. ``band`` is ``[taps, width]`` (input by
    output), ``band_t`` its transpose."""

    lo: int
    c0: int
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls
    width: int
    taps: int
    band: torch.Tensor
    band_t: torch.Tensor


@functools.lru_cache(maxsize=64)
def _runs(length: int, k: int, sigma: float, dtype: torch.dtype, device: str
          ) -> tuple[Run, ...]:
    """The tiles of one separable pass over ``length`` values, interior ones grouped in runs.

    ``band[i, j]`` is the weight of input ``i`` in output ``j`` after reflecting the kernel's
    taps at the borders (mirror about the edge value, not repeating it, as kornia's 'reflect').
    """
    r = k // 2
    w = gaussian_kernel1d(k, sigma)
    out_idx = torch.arange(length)
    src = out_idx.unsqueeze(0) + torch.arange(-r, r + 1).unsqueeze(1)  # [k, length]
    src = src.abs()
    src = torch.where(src >= length, 2 * (length - 1) - src, src)
    band = torch.zeros(length, length, dtype=torch.float64)
    band.index_put_((src.flatten(), out_idx.repeat(k)), w.repeat_interleave(length),
                    accumulate=True)
    tile = length if length <= 2 * TILE else TILE
    starts = list(range(0, length, tile))
    if length - starts[-1] < tile // 2 and len(starts) > 1:
        # no narrow last tile: BLAS takes another path for a product one or a few columns
        # wide, whose sums depend on the number of rows, i.e. on the rest of the batch
        starts.pop()
    runs: list[Run] = []
    for c0, c1 in zip(starts, [*starts[1:], length], strict=True):
        used = band[:, c0:c1].ne(0).any(dim=1).nonzero().flatten()
        lo, hi = int(used.min()), int(used.max()) + 1
        interior = c1 - c0 == tile < length and lo == c0 - r and hi == c1 + r
        last = runs[-1] if runs else None
        if (interior and last is not None and last.lo == last.c0 - r
                and last.width == tile and last.c0 + last.count * tile == c0
                and last.taps == hi - lo):
            runs[-1] = last._replace(count=last.count + 1)
            continue
        m = band[lo:hi, c0:c1].to(dtype=dtype, device=device)
        runs.append(Run(lo, c0, 1, c1 - c0, hi - lo, m.contiguous(), m.t().contiguous()))
    return tuple(runs)


def _window(t: torch.Tensor, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
            ) -> torch.Tensor:
    # a strided view of the contiguous tensor t's storage, ``offset`` values past t's start
    return t.as_strided(size, stride, t.storage_offset() + offset)


def _vertical(src: torch.Tensor, dst: torch.Tensor, runs: tuple[Run, ...]) -> None:
    """``dst[p] = A @ src[p]`` for every plane of ``[P, H, W]`` contiguous tensors."""
    p, h, w = src.shape
    hw = h * w
    interior = [r for r in runs if r.count > 1]
    if interior and h % interior[0].width == 0:
        # One product for the interior runs of all planes together: with H a multiple of the
        # tile, the interior tiles of consecutive planes lie on one grid of rows. The grid's
        # tiles at the planes' borders read rows of the next plane; the border runs below
        # overwrite them with the right values.
        r = interior[0]
        count = (p - 1) * (h // r.width) + r.count
        torch.bmm(r.band_t.expand(count, r.width, r.taps),
                  _window(src, r.lo * w, (count, r.taps, w), (r.width * w, w, 1)),
                  out=_window(dst, r.c0 * w, (count, r.width, w), (r.width * w, w, 1)))
        for r in runs:
            if r.count == 1:
                _vertical_run(src, dst, r, p, hw, w)
        return
    for r in runs:
        if r.count == 1:
            _vertical_run(src, dst, r, p, hw, w)
        else:
            for i in range(p):
                torch.bmm(r.band_t.expand(r.count, r.width, r.taps),
                          _window(src, i * hw + r.lo * w, (r.count, r.taps, w),
                                  (r.width * w, w, 1)),
                          out=_window(dst, i * hw + r.c0 * w, (r.count, r.width, w),
                                      (r.width * w, w, 1)))


def _vertical_run(src: torch.Tensor, dst: torch.Tensor, r: Run, p: int, hw: int, w: int
                  ) -> None:
    # one tile, every plane in one batched product
    torch.bmm(r.band_t.expand(p, r.width, r.taps),
              _window(src, r.lo * w, (p, r.taps, w), (hw, w, 1)),
              out=_window(dst, r.c0 * w, (p, r.width, w), (hw, w, 1)))


def _horizontal(src: torch.Tensor, dst: torch.Tensor, runs: tuple[Run, ...]) -> None:
    """``dst_rows = src_rows @ B`` for ``[M, W]`` contiguous tensors."""
    m, w = src.shape
    for r in runs:
        if r.count == 1:
            torch.mm(src[:, r.lo : r.lo + r.taps], r.band, out=dst[:, r.c0 : r.c0 + r.width])
        else:
            torch.bmm(_window(src, r.lo, (r.count, m, r.taps), (r.width, w, 1)),
                      r.band.expand(r.count, r.taps, r.width),
                      out=_window(dst, r.c0, (r.count, m, r.width), (r.width, w, 1)))


def gaussian_blur(x: torch.Tensor, sigma: float, k: int) -> torch.Tensor:
    """Blur ``[N, C, H, W]`` with a ``k x k`` Gaussian of standard deviation ``sigma``.

    The same result as ``kornia.filters.gaussian_blur2d(x, (k, k), (sigma, sigma))`` with
    reflected borders, to float rounding, then clamped to ``[0, 1]`` (a Gaussian's weights sum
    to one only up to rounding). ``k`` must be odd and below ``2 * min(H, W)``.
    """
    x = x.contiguous()
    n, c, h, w = x.shape
    dev = str(x.device)
    vertical = _runs(h, k, sigma, x.dtype, dev)
    horizontal = _runs(w, k, sigma, x.dtype, dev)
    out = torch.empty_like(x)
    step = max(1, CHUNK_VALUES // (c * h * w))
    # one buffer for all chunks: a fresh one per chunk cost page faults every time
    z = torch.empty(min(n, step) * c, h, w, dtype=x.dtype, device=x.device)
    for s0 in range(0, n, step):
        s1 = min(n, s0 + step)
        planes = (s1 - s0) * c
        zc = z[:planes]
        _vertical(x[s0:s1].view(planes, h, w), zc, vertical)
        oc = out[s0:s1]
        _horizontal(zc.view(planes * h, w), oc.view(planes * h, w), horizontal)
        oc.clamp_(0.0, 1.0)
    return out
