"""Gaussian blur on the CPU as banded matrix products (the blur property's fast path).

kornia's ``gaussian_blur2d`` (separable grouped convolutions) is the reference and stays the test
oracle (tests/test_perturbations.py). On one CPU thread, in batches of 256, it was 3 to 5 times
slower than this path (benchmarks/RESULTS.md): a depthwise convolution uses little of the CPU's
vector units. A 1-D Gaussian with reflected borders is a banded ``[L, L]`` matrix, so each
separable pass is a matrix product that BLAS runs near its peak. Products with the whole band
would do ``L`` multiply-adds per value instead of ``k``; cutting the output into tiles of
``TILE`` columns, each multiplied only by the rows its band touches, costs ``TILE + k - 1`` per
value instead.

Small images go through in chunks of ``b`` images: ``[b, C, H, W]`` is copied to ``[H, b*C*W]``
(whole rows of W move, so the copy is cheap), the vertical pass left-multiplies row tiles of
that matrix, the horizontal pass right-multiplies column tiles of its ``[H*b*C, W]`` view, and
the result is copied back to ``[b, C, H, W]``. Large images go plane by plane with no copies.
Every ``torch.mm`` reads and writes strided views in place.
"""

from __future__ import annotations

import functools

import torch

TILE = 32
CHUNK_VALUES = 1 << 16  # 256 KB of float32 per chunk buffer: each pass stays in the cache
PLANE_VALUES = 1 << 14  # from 128x128 up, blur plane by plane instead


def gaussian_kernel1d(k: int, sigma: float) -> torch.Tensor:
    """The normalised Gaussian of ``k`` (odd) taps and standard deviation ``sigma``, float64."""
    t = torch.arange(k, dtype=torch.float64) - k // 2
    w = torch.exp(-t * t / (2.0 * sigma * sigma))
    return w / w.sum()


Tile = tuple[int, int, int, int, torch.Tensor, torch.Tensor]


@functools.lru_cache(maxsize=64)
def _tiles(length: int, k: int, sigma: float, dtype: torch.dtype, device: str) -> list[Tile]:
    """Column tiles ``(lo, hi, c0, c1, band[lo:hi, c0:c1], its transpose)`` of the band.

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
    tiles = []
    for c0 in range(0, length, tile):
        c1 = min(length, c0 + tile)
        used = band[:, c0:c1].ne(0).any(dim=1).nonzero().flatten()
        lo, hi = int(used.min()), int(used.max()) + 1
        m = band[lo:hi, c0:c1].to(dtype=dtype, device=device)
        tiles.append((lo, hi, c0, c1, m.contiguous(), m.t().contiguous()))
    return tiles


def gaussian_blur(x: torch.Tensor, sigma: float, k: int) -> torch.Tensor:
    """Blur ``[N, C, H, W]`` with a ``k x k`` Gaussian of standard deviation ``sigma``.

    The same result as ``kornia.filters.gaussian_blur2d(x, (k, k), (sigma, sigma))`` with
    reflected borders, to float rounding, then clamped to ``[0, 1]`` (a Gaussian's weights sum
    to one only up to rounding). ``k`` must be odd and below ``2 * min(H, W)``.
    """
    n, c, h, w = x.shape
    dev = str(x.device)
    vertical = _tiles(h, k, sigma, x.dtype, dev)
    horizontal = _tiles(w, k, sigma, x.dtype, dev)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if h * w >= PLANE_VALUES:
        # large images, one plane at a time: the vertical pass reads the input plane and the
        # horizontal pass writes the output plane, with no copies. Measured faster than the
        # chunk layout below for batches of 256 224x224 images, whose copies reach main memory.
        planes, out_planes = x.reshape(n * c, h, w), out.view(n * c, h, w)
        z = torch.empty(h, w, dtype=x.dtype, device=x.device)
        for i in range(n * c):
            src, dst = planes[i], out_planes[i]
            for lo, hi, c0, c1, _, left in vertical:
                torch.mm(left, src[lo:hi], out=z[c0:c1])
            for lo, hi, c0, c1, right, _ in horizontal:
                torch.mm(z[:, lo:hi], right, out=dst[:, c0:c1])
            dst.clamp_(0.0, 1.0)
        return out
    step = max(1, CHUNK_VALUES // (c * h * w))
    # one set of buffers for all chunks: fresh ones per chunk cost page faults every time
    buf = torch.empty(2, min(n, step) * c * h * w, dtype=x.dtype, device=x.device)
    for s0 in range(0, n, step):
        xc = x[s0 : s0 + step]
        b = len(xc)
        m = b * c * h * w
        cols = buf[0, :m].view(h, b * c, w)
        cols.copy_(xc.reshape(b * c, h, w).transpose(0, 1))
        cols = cols.view(h, b * c * w)
        z = buf[1, :m].view(h, b * c * w)
        for lo, hi, c0, c1, _, left in vertical:
            torch.mm(left, cols[lo:hi], out=z[c0:c1])
        rows = z.view(h * b * c, w)
        y = buf[0, :m].view(h * b * c, w)
        for lo, hi, c0, c1, right, _ in horizontal:
            torch.mm(rows[:, lo:hi], right, out=y[:, c0:c1])
        out[s0 : s0 + b] = y.clamp_(0.0, 1.0).view(h, b, c, w).permute(1, 2, 0, 3)
    return out
