"""Colour transforms on the CPU in cache-sized segments (the contrast and saturation fast paths).

kornia's colour functions work on the whole batch at once, and each of their elementwise steps
makes a batch-sized temporary that goes out of the cache and back. Its contrast also builds a
luma image only to average it (``addcmul`` with 0-dim weight tensors: about 70 us per 224x224
image on one thread here, more than copying the image) and four temporaries for
``clamp(x * f + m * (1 - f))``. On one CPU thread contrast took about 6 times as long as copying
the batch, saturation about 13 times (benchmarks/RESULTS.md). Here the work goes a few whole
images at a time so that temporaries stay in the cache, and contrast takes the mean luma from
the channel means, then writes its output in one multiply and two in-place passes. kornia stays
the reference and the test oracle (tests/test_perturbations.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

SEGMENT_VALUES = 1 << 16  # values per segment (256 KB of float32), at least one image
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as kornia.color.rgb_to_grayscale


def segments(x: torch.Tensor) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive groups of whole images of about SEGMENT_VALUES values."""
    per = max(1, SEGMENT_VALUES // max(1, math.prod(x.shape[1:])))
    for s0 in range(0, len(x), per):
        yield s0, min(len(x), s0 + per)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Contrast about each image's mean luma, clamped to ``[0, 1]``: RGB ``[N, 3, H, W]``.

    ``kornia.enhance.adjust_contrast_with_mean_subtraction(x, factor).clamp(0, 1)`` to float
    rounding: ``x * f + m * (1 - f)`` with the same two roundings, where the mean luma ``m`` is
    taken from the channel means (the luma of the means) instead of the mean of a luma image.
    """
    n, c = x.shape[:2]
    means = x.reshape(n, c, -1).mean(dim=2)
    # elementwise, not a matrix-vector product: BLAS's sums depend on the batch size, and an
    # image's output must not
    w = torch.tensor(GRAY_WEIGHTS, dtype=x.dtype, device=x.device)
    mean = means[:, 0] * w[0] + means[:, 1] * w[1] + means[:, 2] * w[2]
    bias = mean * (1 - factor)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    for s0, s1 in segments(x):
        o = out[s0:s1]
        torch.mul(x[s0:s1], factor[s0:s1].view(-1, 1, 1, 1), out=o)
        o.add_(bias[s0:s1].view(-1, 1, 1, 1)).clamp_(0.0, 1.0)
    return out


def clamped_in_segments(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                        x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``fn(x, factor).clamp(0, 1)`` computed segment by segment (``fn`` works image by image,
    so the values are the same as in one call)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    for s0, s1 in segments(x):
        out[s0:s1] = fn(x[s0:s1], factor[s0:s1]).clamp_(0.0, 1.0)
    return out
