"""Random corruptions decided per sample with a stated confidence (issue 40).

Gaussian, uniform and impulse noise (and the ``random_linf`` / ``random_l0`` INFO rows) have no
worst case within their bound: a large enough draw breaks any classifier, and the worst of N
draws keeps falling with N, so no search converges on it. Following randomized smoothing
(Cohen et al. 2019), a sample is judged on its *failure probability* ``p`` under the noise at
the property's bound: it is **robust at level δ** when an exact one-sided upper confidence
bound on ``p`` is at most δ, **not robust** when the lower bound exceeds δ, and **undecided**
otherwise. Draws are sequential: a sample stops at the first look of a fixed schedule (16, 32,
64 draws for samples that fail often, then the fewest draws that can show a sample robust,
twice that, ... up to the cap ``max_draws``) where it is decided, and a sample still undecided
at a look draws on to the next; each side of the test splits ``α = 1 - confidence`` over its
own looks, every look up to the cap, fixed before any draw (Bonferroni,
:class:`~certify.stats.SequentialBinomialTest`), so the stated confidence holds for a sample
whatever look decided it.

**The cap.** The default cap (:data:`DEFAULT_MAX_DRAWS`, 512) is the smallest cap of the
doubling schedule (16, 32, 64, ...) at which a sample failing on a fifth of δ (1% of draws at
δ = 5%) is decided robust at confidence 0.99 with probability at least 0.95, computed exactly
over the plan's looks (:func:`deciding_cap`; 0.998 at 512, 0.891 at the former default of
256). Every plan states that probability and its expected draws (:meth:`DrawPlan.power`).

The robust share counts undecided samples on both sides of its interval: from the Wilson
lower bound of the decided-robust count to the Wilson upper bound of decided-robust plus
undecided. The average accuracy under the noise (Hendrycks and Dietterich's ImageNet-C figure)
comes from every sample's first look of draws, shown beside it as information.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

from certify.checks.base import CheckContext, pct
from certify.checks.confidence import WorstSeen, confidences, top_probability
from certify.errors import SuiteError
from certify.models.base import Model
from certify.params import Param, Params
from certify.stats import (
    OutcomeProbabilities,
    SequentialBinomialTest,
    clopper_pearson_lower,
    clopper_pearson_upper,
    wilson_interval,
)

if TYPE_CHECKING:
    import torch

#: Draws per sample before the first look (and the draws every sample gets for the average
#: accuracy under the noise).
FIRST_LOOK = 16
DEFAULT_DELTA = 0.05
DEFAULT_CONFIDENCE = 0.99
#: The cap on draws per sample: :func:`deciding_cap` at the defaults (a test holds it there).
DEFAULT_MAX_DRAWS = 512
#: A plan's power is stated for a sample failing on δ / POWER_DIVISOR of its draws (1% at
#: δ = 5%), and the default cap decides such a sample robust with at least POWER_TARGET.
POWER_DIVISOR = 5
POWER_TARGET = 0.95
#: The most draws a suite may ask for per sample.
MAX_DRAWS_LIMIT = 1 << 20
#: Seed keys of a statistical property's draws: (kind, level, draw).
_AT_BOUND, _BELOW = 40, 41
#: The suite parameters of a decision by draws (a random corruption's, a pair's with one),
#: unset meaning the packaged defaults; each check's declaration says for which of its
#: properties they apply.
DRAW_PARAMS = Params(
    Param("delta", float | None, None,
          "the failure probability under the noise a sample may have and still count as "
          f"robust ({DEFAULT_DELTA:g} when unset)", low=0, low_open=True, high=1,
          high_open=True),
    Param("confidence", float | None, None,
          "the confidence of each sample's decision by sequential exact binomial tests "
          f"({DEFAULT_CONFIDENCE:g} when unset)", low=0.5, high=1, high_open=True),
    Param("max_draws", int | None, None,
          f"the most noise draws per sample at the bound ({DEFAULT_MAX_DRAWS} when unset); "
          "samples still undecided count on both sides of the interval",
          low=1, high=MAX_DRAWS_LIMIT),
)


@dataclass(frozen=True)
class DrawPlan:
    """How a random corruption is decided: the failure probability ``delta`` a robust sample
    may have, the ``confidence`` of each sample's decision, and the cap on draws per sample
    (``max_draws``, at the bound: a sample still undecided at a look draws on to the next, up
    to the cap)."""

    delta: float
    confidence: float
    max_draws: int

    @cached_property
    def test(self) -> SequentialBinomialTest:
        """The sequential test (its looks double from :data:`FIRST_LOOK` to ``max_draws``)."""
        return SequentialBinomialTest.schedule(self.delta, self.confidence,
                                               min(FIRST_LOOK, self.max_draws), self.max_draws)

    def power_at(self, p: float) -> OutcomeProbabilities:
        """What the plan does with a sample failing on ``p`` of its draws (exact)."""
        return self.test.outcome_probabilities(p)

    @cached_property
    def power(self) -> OutcomeProbabilities:
        """What the plan does with a sample failing on δ / :data:`POWER_DIVISOR` of its draws
        (exact, over its looks): the chance it is decided robust within the cap, and its
        expected draws."""
        return self.power_at(self.delta / POWER_DIVISOR)

    def cost_note(self) -> str:
        """The plan's draws per sample, in words (the run's query plan line): its looks, the
        cap, and what the cap buys a sample that fails now and then."""
        t, pw = self.test, self.power
        return (f"noise draws per sample: looks after {', '.join(str(n) for n in t.looks)}; "
                f"a sample still undecided at a look draws on, up to the cap of "
                f"{self.max_draws:,}; one failing on {pct(self.delta / POWER_DIVISOR)} of draws "
                f"is decided robust within the cap with probability {pw.robust:.1%} "
                f"({pw.mean_draws:,.0f} draws expected), one that never fails stops after "
                f"{t.fewest_robust_draws()}")

    def sentence(self) -> str:
        """What a robust sample means, in words (the card's row reading)."""
        return (f"kept its label in at least {pct(1 - self.delta)} of noise draws, at "
                f"{pct(self.confidence)} confidence")

    def reading(self) -> str:
        """The row's kind, in words."""
        return (f"random corruption: robust at δ = {pct(self.delta)} with confidence "
                f"{pct(self.confidence)}")

    def to_details(self) -> dict[str, Any]:
        """The plan and its rule, for the result's details."""
        t = self.test
        return {"delta": self.delta, "confidence": self.confidence,
                "max_draws": self.max_draws, "looks": list(t.looks),
                "alpha_per_look": t.alpha_per_look, "rule": t.describe(),
                "fewest_robust_draws": t.fewest_robust_draws(),
                "power": {"failure_probability": self.delta / POWER_DIVISOR,
                          "decided_robust": self.power.robust,
                          "mean_draws": self.power.mean_draws},
                "sentence": self.sentence(), "reading": self.reading()}


def deciding_cap(delta: float, confidence: float, p: float, target: float) -> int | None:
    """The smallest cap of the doubling schedule (:data:`FIRST_LOOK` times a power of two, at
    most :data:`MAX_DRAWS_LIMIT`) whose plan decides a sample failing on ``p`` of its draws
    robust with probability at least ``target`` (exact, over the plan's looks); ``None`` when
    none does (``p`` too close to ``delta``)."""
    cap = FIRST_LOOK
    while cap <= MAX_DRAWS_LIMIT:
        if DrawPlan(delta, confidence, cap).power_at(p).robust >= target:
            return cap
        cap *= 2
    return None


def draw_plan(delta: Any, confidence: Any, max_draws: Any, where: str) -> DrawPlan:
    """The plan from suite parameters (``None``: the packaged default), or a SuiteError."""
    d = DEFAULT_DELTA if delta is None else delta
    c = DEFAULT_CONFIDENCE if confidence is None else confidence
    m = DEFAULT_MAX_DRAWS if max_draws is None else max_draws
    DRAW_PARAMS.validate({"delta": d, "confidence": c, "max_draws": m}, where)
    plan = DrawPlan(float(d), float(c), int(m))
    if not plan.test.can_decide_robust():
        need = math.ceil(math.log(1 - plan.confidence) / math.log1p(-plan.delta) - 1e-9)
        good = deciding_cap(plan.delta, plan.confidence, plan.delta / POWER_DIVISOR,
                            POWER_TARGET) if need <= MAX_DRAWS_LIMIT else None
        more = (f" ({good:,} decides a sample failing on {pct(plan.delta / POWER_DIVISOR)} "
                f"of draws robust in at least {pct(POWER_TARGET)} of cases)" if good else "")
        raise SuiteError(
            f"{where}: {m} draws cannot show any sample robust at delta {plan.delta:g} with "
            f"confidence {plan.confidence:g} (not even without a failure)",
            hint=(f"raise max_draws to at least {need}{more}, or delta"
                  if need <= MAX_DRAWS_LIMIT else
                  f"no max_draws up to {MAX_DRAWS_LIMIT} can: raise delta or lower confidence"))
    return plan


class Drawn(NamedTuple):
    """Per sample of a batch, after its sequential draws: the decision (``robust``,
    ``not_robust``, ``None`` undecided or not decided at all), draws and failures at the bound,
    the look that decided it (-1), the first failing draw and its prediction (-1), the most
    confident mistake's draw, prediction, margin and top probability (-1 / NaN), the least
    confident correct answer's margin and probability (NaN), the first draw's failure, and the
    correct answers among the first look's draws (for the average accuracy)."""

    decision: list[str | None]
    draws: list[int]
    failures: list[int]
    look: list[int]
    first_fail: list[int]
    first_pred: list[int]
    worst: list[int]
    worst_pred: list[int]
    worst_conf: list[float]
    worst_prob: list[float]
    least_conf: list[float]
    least_prob: list[float]
    fail0: list[bool]
    first_correct: list[int]


#: ``perturb(rows, draws)``: the images of batch rows ``rows`` ``[M]`` at draw numbers
#: ``draws`` ``[M]`` (a row may appear with several draws).
Perturb = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]

#: The most bytes of images one model call of the draws gets.
CHUNK_BYTES = 6 << 20


def sequential_draws(model: Model, y: torch.Tensor, decide: torch.Tensor,
                     also: torch.Tensor, perturb: Perturb, plan: DrawPlan,
                     image_bytes: int) -> Drawn:
    """Draw for the ``decide`` samples of a batch until each is decided or the budget is spent;
    the ``also`` samples get the first look's draws only (the average accuracy counts them:
    samples misclassified before any noise).

    Between two looks no decision is taken, so the draws of a look go to the model together,
    in calls of at most :data:`CHUNK_BYTES` (``image_bytes``: one image's).
    """
    import torch

    b = len(y)
    test = plan.test
    ys = y.cpu()
    output = model.info.output
    draws = torch.zeros(b, dtype=torch.long)
    failures = torch.zeros(b, dtype=torch.long)
    first_correct = torch.zeros(b, dtype=torch.long)
    look_of = torch.full((b,), -1, dtype=torch.long)
    seen = WorstSeen(b)
    fail0 = torch.zeros(b, dtype=torch.bool)
    decision: list[str | None] = [None] * b
    active = decide.cpu().nonzero().flatten()
    extra = (also.cpu() & ~decide.cpu()).nonzero().flatten()
    per_call = max(1, CHUNK_BYTES // max(1, image_bytes))
    drawn = 0
    for look, upto in enumerate(test.looks):
        rows = torch.cat([active, extra]) if look == 0 else active
        if len(rows) == 0:
            break
        step = max(1, per_call // len(rows))
        for t0 in range(drawn, upto, step):
            t1 = min(upto, t0 + step)
            ts = torch.arange(t0, t1).repeat_interleave(len(rows))  # draw-major
            rr = rows.repeat(t1 - t0)
            scores = model.predict(perturb(rr, ts)).cpu()
            pred = scores.argmax(1)
            bad = pred != ys[rr]
            conf = confidences(scores, output)
            prob = top_probability(scores, output)
            draws.index_add_(0, rr, torch.ones_like(rr))
            failures.index_add_(0, rr, bad.long())
            if look == 0:
                first_correct.index_add_(0, rr, (~bad).long())
            if t0 == 0:
                fail0[rows] = bad[: len(rows)]
            # draw-major order: the first failing draw of a row is its first bad entry, and
            # ties of confidence keep the earliest draw (a stable scan of the entries)
            for k in range(t1 - t0):
                sl = slice(k * len(rows), (k + 1) * len(rows))
                seen.update(rows, t0 + k, bad[sl], conf[sl], pred[sl], prob[sl])
        drawn = upto
        still = []
        for j in active.tolist():
            d = test.decide(look, int(failures[j]))
            if d is None:
                still.append(j)
            else:
                decision[j] = d
                look_of[j] = look
        active = torch.tensor(still, dtype=torch.long)
    seen.finish()
    return Drawn(decision, draws.tolist(), failures.tolist(), look_of.tolist(),
                 seen.first.tolist(), seen.first_pred.tolist(), seen.worst.tolist(),
                 seen.worst_pred.tolist(), seen.worst_conf.tolist(), seen.worst_prob.tolist(),
                 seen.least_conf.tolist(), seen.least_prob.tolist(), fail0.tolist(),
                 first_correct.tolist())


def level_failures(model: Model, y: torch.Tensor, rows: Sequence[int], perturb: Perturb,
                   levels: int) -> list[list[bool]]:
    """One draw per sample ``rows`` at each of ``levels`` intensities below the bound
    (``perturb(rows, levels)``, one model call): whether it failed, ``[len(rows)][levels]``."""
    import torch

    if not rows or not levels:
        return [[] for _ in rows]
    idx = torch.tensor(list(rows), dtype=torch.long)
    out = torch.zeros(levels, len(idx), dtype=torch.bool)
    for lv in range(levels):  # one model call per level: the batch's size at most
        bad = model.predict(perturb(idx, torch.full_like(idx, lv))).cpu().argmax(1)
        out[lv] = bad != y.cpu()[idx]
    return out.t().tolist()


def share_interval(robust: int, undecided: int, n: int) -> tuple[float, float]:
    """The robust share's 95% interval counting undecided samples on both sides: the Wilson
    lower bound of ``robust / n`` to the Wilson upper bound of ``(robust + undecided) / n``."""
    return (wilson_interval(robust, n)[0], wilson_interval(robust + undecided, n)[1])


def mean_accuracy(correct: Sequence[int], draws: Sequence[int]) -> tuple[float, tuple[float,
                                                                                     float]]:
    """The average accuracy under the noise over samples (each its share of correct draws)
    and a 95% normal interval over samples (the samples are independent; their draws are
    not), clipped to [0, 1]; NaN without samples."""
    acc = [c / d for c, d in zip(correct, draws, strict=True) if d]
    if not acc:
        return math.nan, (0.0, 1.0)
    m = sum(acc) / len(acc)
    if len(acc) < 2:
        return m, (0.0, 1.0)
    sd = math.sqrt(sum((a - m) ** 2 for a in acc) / (len(acc) - 1))
    half = 1.959964 * sd / math.sqrt(len(acc))
    return m, (max(0.0, m - half), min(1.0, m + half))


def failure_curve(intensities: Sequence[float], failed: Sequence[Sequence[bool]],
                  confidence: float) -> list[dict[str, Any]]:
    """The failure probability per intensity (one draw per sample at each, so the draws are
    independent): its estimate and exact one-sided upper bound at ``confidence``, and the
    share kept correct at that bound (``score``)."""
    out: list[dict[str, Any]] = [{"intensity": 0.0, "failures": 0, "n": len(failed),
                                  "failure_share": 0.0, "failure_lower": 0.0,
                                  "failure_upper": 0.0, "score": 1.0}]
    for k, lv in enumerate(intensities):
        col = [bool(f[k]) for f in failed if len(f) > k]
        n, fails = len(col), sum(col)
        upper = clopper_pearson_upper(fails, n, 1 - confidence) if n else 1.0
        out.append({"intensity": float(lv), "failures": fails, "n": n,
                    "failure_share": fails / n if n else None,
                    "failure_lower": clopper_pearson_lower(fails, n, 1 - confidence)
                    if n else 0.0,
                    "failure_upper": upper, "score": 1.0 - upper if n else None})
    return out


def seed_at_bound(ctx: CheckContext, sample: int, t: int, part: int = 0) -> int:
    """The seed of draw ``t`` at the bound of sample ``sample`` (``part``: a pair's noise)."""
    return ctx.seed(sample, _AT_BOUND, part, t)


def seeds_at_bound(ctx: CheckContext, samples: Sequence[int], ts: Sequence[int],
                   part: int = 0) -> torch.Tensor:
    """:func:`seed_at_bound` for many draws at once."""
    return ctx.seeds(samples, _AT_BOUND, part, ts)


def seeds_below(ctx: CheckContext, samples: Sequence[int], levels: Sequence[int],
                part: int = 0) -> torch.Tensor:
    """The seeds of the one draw per level below the bound, for many at once."""
    return ctx.seeds(samples, _BELOW, part, levels)
