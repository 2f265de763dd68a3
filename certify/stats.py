"""The statistics certify uses, in one place: confidence intervals (Wilson, Clopper–Pearson),
the sequential binomial test of random corruptions, and the tests ``certify compare`` and the
preprocessing probe decide with (McNemar's exact test, Newcombe's intervals of a difference of
proportions, Holm's step-down correction, the bootstrap of a mean difference).

Pure Python apart from the bootstrap (numpy) and the binomial tail of McNemar's test (scipy),
each imported where used: checks and the card import this module without either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Returns ``(0.0, 1.0)`` for ``n == 0`` (nothing is known). The interval stays inside
    ``[0, 1]`` and is sensible at 0 and ``n`` successes, unlike the normal approximation.
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} outside 0..{n}")
    z = two_sided_z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


def two_sided_z(confidence: float) -> float:
    """The standard-normal quantile of a two-sided ``confidence`` level: the ``z`` with
    ``P(|Z| <= z) = confidence`` (1.96 at 0.95), by bisection on erf (no scipy needed). The one
    normal quantile of certify: the one-sided ``q`` quantile (``q >= 0.5``) is
    ``two_sided_z(2 * q - 1)``."""
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
    z = two_sided_z(confidence)
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


def _log_pmf(n: int, p: float) -> list[float]:
    """log P(X = i) for i = 0..n, X ~ Binomial(n, p), 0 < p < 1."""
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return [top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
            for i in range(n + 1)]


def _log_sum(terms: list[float]) -> float:
    m = max(terms)
    return m + math.log(sum(math.exp(t - m) for t in terms)) if m > -math.inf else -math.inf


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)`` (exact, summed in log space)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return min(1.0, math.exp(_log_sum(_log_pmf(n, p)[: k + 1])))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """The one-sided exact (Clopper–Pearson) upper confidence bound at level ``1 - alpha`` on a
    binomial proportion after ``k`` successes in ``n`` trials: the ``p`` with
    ``P(X <= k; n, p) = alpha`` (1 when ``k == n``), by bisection."""
    if n <= 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if binomial_cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """The one-sided exact lower confidence bound at level ``1 - alpha`` (0 when ``k == 0``)."""
    if n <= 0 or k <= 0:
        return 0.0
    return 1.0 - clopper_pearson_upper(n - k, n, alpha)


def _pmf(n: int, p: float, upto: int) -> list[float]:
    """P(X = i) for i = 0..min(n, upto), X ~ Binomial(n, p), 0 <= p <= 1."""
    m = min(n, upto)
    if p <= 0.0:
        return [1.0] + [0.0] * m
    if p >= 1.0:
        return [0.0] * m + ([1.0] if m == n else [0.0])
    return [math.exp(t) for t in _log_pmf(n, p)[: m + 1]]


class OutcomeProbabilities(NamedTuple):
    """What a sequential test does with a sample of a given failure probability: the
    probabilities of each decision and the expected draws."""

    robust: float
    not_robust: float
    undecided: float
    mean_draws: float


class SequentialBinomialTest:
    """Decide per sample whether its failure probability ``p`` is at most ``delta``, from
    failures seen in draws that stop as soon as the answer is known.

    Looks happen after a schedule of draw counts fixed before any draw (``looks``). At a look
    the sample is *not robust* when the exact one-sided binomial test rejects ``p <= delta``
    (equivalently, the one-sided Clopper–Pearson lower bound on ``p`` exceeds ``delta``); at
    a look of ``robust_looks`` it is *robust* when the test rejects ``p > delta`` (the upper
    bound is at most ``delta``); otherwise it goes on, and after the last look it stays
    undecided. With ``alpha = 1 - confidence``, the not-robust side tests at
    ``alpha / len(looks)`` at every look and the robust side at ``alpha / len(robust_looks)``
    at its own looks (Bonferroni over each side's looks), so a sample whose ``p`` exceeds
    ``delta`` is called robust, or one whose ``p`` is at most ``delta`` is called not robust,
    with probability at most ``alpha`` whatever look decides it.

    The thresholds are integer failure counts per look (``robust_max``: at most this many
    failures decides robust, -1 when no count does; ``not_robust_min``: at least this many
    decides not robust, ``n + 1`` when none does), computed once from the binomial
    distribution at ``delta``.
    """

    def __init__(self, delta: float, confidence: float, looks: tuple[int, ...],
                 robust_looks: tuple[int, ...] | None = None) -> None:
        if not 0 < delta < 1 or not 0 < confidence < 1:
            raise ValueError("delta and confidence must lie in (0, 1)")
        if not looks or any(b <= a for a, b in zip(looks, looks[1:], strict=False)) \
                or looks[0] < 1:
            raise ValueError(f"looks must be increasing positive draw counts, got {looks}")
        robust_looks = looks if robust_looks is None else robust_looks
        if not robust_looks or not set(robust_looks) <= set(looks):
            raise ValueError("the robust side's looks must be looks of the schedule")
        self.delta = delta
        self.confidence = confidence
        self.looks = looks
        self.robust_looks = tuple(sorted(robust_looks))
        alpha = 1.0 - confidence
        self.alpha_per_look = alpha / len(looks)
        self.alpha_robust = alpha / len(self.robust_looks)
        self.robust_max: list[int] = []
        self.not_robust_min: list[int] = []
        for n in looks:
            terms = _log_pmf(n, delta)
            k = -1
            if n in self.robust_looks:  # the largest k with P(X <= k) <= alpha_robust
                acc = -math.inf
                while k + 1 <= n:
                    nxt = _log_sum([acc, terms[k + 1]])
                    if math.exp(nxt) > self.alpha_robust:
                        break
                    k, acc = k + 1, nxt
            self.robust_max.append(k)
            j, acc = n + 1, -math.inf  # the smallest j with P(X >= j) <= alpha_per_look
            while j - 1 >= 0:
                nxt = _log_sum([acc, terms[j - 1]])
                if math.exp(nxt) > self.alpha_per_look:
                    break
                j, acc = j - 1, nxt
            self.not_robust_min.append(j)

    @classmethod
    def schedule(cls, delta: float, confidence: float, first: int, budget: int
                 ) -> SequentialBinomialTest:
        """The schedule certify uses: the robust side looks first at the fewest draws ``m``
        after which a sample without failures is robust, then at ``2m``, ``4m``, ... while at
        most half the budget, and at the budget; the not-robust side also looks earlier, at
        ``first``, ``2 * first``, ... below ``m`` (a sample that fails often stops there)."""
        alpha = 1.0 - confidence
        looks_r = 1
        for _ in range(64):  # the robust looks' count and the first robust look agree
            m = max(1, math.ceil(math.log(alpha / looks_r) / math.log1p(-delta) - 1e-9))
            robust = [m] if m < budget else []
            while robust and robust[-1] * 2 <= budget // 2:
                robust.append(robust[-1] * 2)
            robust = [n for n in robust if n < budget] + [budget]
            if len(robust) <= looks_r:
                break
            looks_r = len(robust)
        early, n = [], first
        while n < robust[0]:
            early.append(n)
            n *= 2
        return cls(delta, confidence, tuple(early + robust), tuple(robust))

    def decide(self, look: int, failures: int) -> str | None:
        """``"robust"``, ``"not_robust"`` or ``None`` (undecided) at look number ``look``."""
        if failures <= self.robust_max[look]:
            return "robust"
        if failures >= self.not_robust_min[look]:
            return "not_robust"
        return None

    def outcome_probabilities(self, p: float) -> OutcomeProbabilities:
        """For a sample whose draws fail independently with probability ``p``: the exact
        probabilities that the test decides it robust, not robust or leaves it undecided after
        the last look, and its expected draws (dynamic programming over the failure count of
        the samples still going, from one look to the next)."""
        if not 0 <= p <= 1:
            raise ValueError(f"p must lie in [0, 1], got {p}")
        going = [1.0]  # going[f]: P(still undecided with f failures so far)
        robust = not_robust = draws = 0.0
        done = 0
        for look, n in enumerate(self.looks):
            step = n - done
            draws += step * sum(going)
            top = self.robust_max[look]
            # counts from here on decide not robust (robust wins a tie, as in decide())
            cut = max(self.not_robust_min[look], top + 1)
            pmf = _pmf(step, p, max(0, cut - 1))
            after = [0.0] * min(cut, len(going) + step)
            for f, w in enumerate(going):
                if w == 0.0:
                    continue
                for k, q in enumerate(pmf[: len(after) - f]):
                    after[f + k] += w * q
            not_robust += sum(going) - sum(after)
            robust += sum(after[: top + 1])
            going = [0.0] * (top + 1) + after[top + 1 :] if top >= 0 else after
            done = n
        left = max(0.0, sum(going))
        robust, not_robust = min(1.0, robust), max(0.0, min(1.0, not_robust))
        return OutcomeProbabilities(robust, not_robust, left, draws)

    def can_decide_robust(self) -> bool:
        """Whether any look can decide a sample robust (no failure in the last look's draws)."""
        return max(self.robust_max) >= 0

    def fewest_robust_draws(self) -> int | None:
        """The fewest draws of the schedule after which a sample without failures is robust."""
        return next((n for n, k in zip(self.looks, self.robust_max, strict=True) if k >= 0),
                    None)

    def describe(self) -> str:
        """The rule in words (for the card)."""
        return (f"exact one-sided binomial tests (Clopper–Pearson) at looks after "
                f"{', '.join(str(n) for n in self.looks)} draws: not robust at every look at "
                f"level {self.alpha_per_look:.2g} = (1 − {self.confidence:g}) / "
                f"{len(self.looks)}, robust at the looks after "
                f"{', '.join(str(n) for n in self.robust_looks)} draws at level "
                f"{self.alpha_robust:.2g} = (1 − {self.confidence:g}) / "
                f"{len(self.robust_looks)} (Bonferroni over each side's looks): a sample is "
                f"decided wrongly in either direction with probability at most "
                f"{1 - self.confidence:.2g}")


# --- comparing two runs (certify compare) and two preprocessings (certify.probe) ---------------

def mcnemar_exact(worse: int, better: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: they split as a fair coin would
    (``2 * P(X <= min)``, capped at 1; 1.0 with no discordant pair)."""
    from scipy.stats import binom

    d = worse + better
    if d == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(worse, better), d, 0.5)))


def holm(pvalues: list[float], alpha: float = 0.05
         ) -> tuple[list[float], list[bool], list[float]]:
    """Holm's step-down procedure: adjusted p-values, rejections, and the per-test level
    ``alpha / (m - rank)`` used for each (rank of its p-value, 0 for the smallest)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (pvalues[i], i))
    adjusted = [1.0] * m
    reject = [False] * m
    levels = [alpha] * m
    running = 0.0
    still = True
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
        levels[i] = alpha / (m - rank)
        still = still and pvalues[i] <= levels[i]
        reject[i] = still
    return adjusted, reject, levels


def newcombe_unpaired(k_old: int, n_old: int, k_new: int, n_new: int,
                      confidence: float) -> tuple[float, float]:
    """Interval of ``p_new - p_old`` for independent samples (Newcombe 1998, method 10)."""
    p1, p0 = k_new / n_new, k_old / n_old
    l1, u1 = wilson_interval(k_new, n_new, confidence)
    l0, u0 = wilson_interval(k_old, n_old, confidence)
    d = p1 - p0
    return (d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2),
            d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2))


def newcombe_paired(both: int, old_only: int, new_only: int, neither: int,
                    confidence: float) -> tuple[float, float]:
    """Interval of ``p_new - p_old`` for paired binary outcomes (Newcombe 1998b, method 10):
    the two Wilson intervals combined with the correlation of the pairs."""
    n = both + old_only + new_only + neither
    p1, p0 = (both + new_only) / n, (both + old_only) / n
    l1, u1 = wilson_interval(both + new_only, n, confidence)
    l0, u0 = wilson_interval(both + old_only, n, confidence)
    margins = ((both + old_only) * (new_only + neither) * (both + new_only)
               * (old_only + neither))
    phi = 0.0 if margins == 0 else (both * neither - old_only * new_only) / math.sqrt(margins)
    d = p1 - p0
    lo = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u0 - p0) + (u0 - p0) ** 2))
    hi = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p0 - l0) + (p0 - l0) ** 2))
    return (d - lo, d + hi)


#: An interval of a difference as a function of its confidence level.
IntervalAt = Callable[[float], tuple[float, float]]


def p_from_interval(interval: IntervalAt) -> float:
    """The smallest two-sided level at which ``interval(confidence)`` excludes 0 (bisection
    between 1e-12 and 1)."""
    lo_a, hi_a = 1e-12, 1.0 - 1e-9
    lo, hi = interval(1 - lo_a)
    if lo > 0 or hi < 0:
        return lo_a
    for _ in range(60):
        mid = math.sqrt(lo_a * hi_a)
        lo, hi = interval(1 - mid)
        if lo > 0 or hi < 0:
            hi_a = mid
        else:
            lo_a = mid
    return hi_a


def normal_interval(centre: float, se: float) -> IntervalAt:
    """The normal approximation's interval ``centre ± z * se`` at each confidence."""
    return lambda conf: (centre - two_sided_z(conf) * se, centre + two_sided_z(conf) * se)


#: Bootstrap resamples of a mean difference (seeded: deterministic).
BOOTSTRAP = 4000


def bootstrap_diffs(old: np.ndarray, new: np.ndarray, paired: bool, seed: int = 0,
                    resamples: int = BOOTSTRAP) -> np.ndarray:
    """Bootstrap distribution of ``mean(new) - mean(old)`` (paired: resample sample indices
    common to both; unpaired: each run's values independently). Seeded: deterministic."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if paired:
        d = new - old
        idx = rng.integers(0, len(d), size=(resamples, len(d)))
        return np.asarray(d[idx].mean(axis=1))
    io = rng.integers(0, len(old), size=(resamples, len(old)))
    inew = rng.integers(0, len(new), size=(resamples, len(new)))
    return np.asarray(new[inew].mean(axis=1) - old[io].mean(axis=1))


def bootstrap_p(boot: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "no difference": twice the smaller share of the
    resampled differences on either side of 0 (each count plus one)."""
    below = int((boot <= 0).sum())
    above = int((boot >= 0).sum())
    return min(1.0, 2 * (min(below, above) + 1) / (len(boot) + 1))


def bootstrap_interval(boot: np.ndarray) -> IntervalAt:
    """The percentile interval of a bootstrap distribution at each confidence."""
    import numpy as np

    return lambda conf: (float(np.quantile(boot, (1 - conf) / 2)),
                         float(np.quantile(boot, 1 - (1 - conf) / 2)))
