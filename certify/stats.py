"""Small statistics shared by checks: confidence intervals."""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Returns ``(0.0, 1.0)`` for ``n == 0`` (nothing is known). The interval stays inside
    ``[0, 1]`` and is sensible at 0 and ``n`` successes, unlike the normal approximation.
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside 0..{n}")
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


def _z(confidence: float) -> float:
    """Two-sided standard-normal quantile, by bisection on erf (no scipy needed)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    target = confidence
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def wilson_bounds(p: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson interval at proportion ``p`` (not necessarily k/n) for ``n`` samples."""
    z = _z(confidence)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


#: The most samples :func:`samples_to_decide` looks at.
MAX_DECIDING_SAMPLES = 10**9


def samples_to_decide(p: float, bound: float, confidence: float = 0.95) -> int | None:
    """The smallest sample size whose Wilson interval at proportion ``p`` excludes ``bound``.

    At the observed rate ``p``, that many samples would put the whole interval on one side of
    ``bound`` (and so decide a threshold there). ``None`` when no sample size does: ``p`` equals
    the bound, or the size needed passes :data:`MAX_DECIDING_SAMPLES`. The interval's bound
    moves monotonically towards ``p`` as ``n`` grows, so a doubling then bisection search finds
    it.
    """
    if not (math.isfinite(p) and math.isfinite(bound)) or p == bound:
        return None

    def decided(n: int) -> bool:
        lo, hi = wilson_bounds(p, n, confidence)
        return lo > bound if p > bound else hi < bound

    hi = 1
    while not decided(hi):
        hi *= 2
        if hi > MAX_DECIDING_SAMPLES:
            return None
    lo = hi // 2  # not decided (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if decided(mid):
            hi = mid
        else:
            lo = mid
    return hi
