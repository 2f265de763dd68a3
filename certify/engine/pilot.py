"""The run's time, estimated from a pilot before the main pass (issue 62: a run planned at "at
most 6.1 min" of model time took 9.4).

**The probe and the pilot.** Before the main pass the model answers the run's first
:data:`PROBE_SAMPLES` samples (its seeded class-stratified order, which every check's selection
starts with), once: which it answers right and which wrong. Then every check runs, in the
runner's order and schedule, on a pilot of its own samples: the first :data:`PILOT_SAMPLES`
of the probe's right answers and its first wrong one (a wrong answer is often decided at
once, a right one searched or attacked to the end: both are priced, each at its share of the
check's samples), and one sample of its binarization test where it has one. Each check's
pilot is timed whole and counted: its queries and gradient evaluations per sample, and its own
work (set-up, transforms, attack steps, the binarization ladder) that the calibrated rates of
:mod:`certify.engine.plan` leave out. The main pass **keeps** the pilot's records of a check
that is not an attack and has no query budget of its own (every draw is seeded per sample, so
such a record does not depend on its batch). An attack's records depend on its batch (APGD
groups its restarts by the batch's size and counts their gradient evaluations per group; the
gallery keeps each batch's first broken samples), so its pilot samples are evaluated again and
its pilot costs time only. The runs' measurements with and without the pilot are equal
(``tests/test_pilot.py``; the demo's too).

**Two figures**, for the evaluation (loading the model before it and writing the card after it
are not included):

- *expected*: each check's units per sample as its pilot measured them (right and wrong
  answers and the binarization samples apart), times its samples still to do, at the rates
  calibrated in the executor's lanes, plus its own work beyond its model work once (it follows
  an attack's iterations and a check's set-up rather than its samples), plus the pilot's time.
  An endpoint's, not calibrated: seconds per request and per image fitted to the pilot's checks
  (:func:`request_costs`), the main pass's requests as full as the pilot's per sample, at most
  a batch, the binarization test's one query a request;
- *at most*: each check's most queries and gradient evaluations (the plan's bound) at the
  costlier of the calibrated rates and its pilot's all-in cost per unit (its small batches and
  set-up make that dearer than the main pass's), times :data:`AT_MOST_MARGIN`; a check
  without a bound of its own at its pilot's seconds per sample, times the margin.

A model unit is a query at the calibrated query rate, or a gradient evaluation at the gradient
rate (an endpoint: a query at the pilot's seconds per query).
"""

from __future__ import annotations

import logging
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from certify.canonical import JSONLike
from certify.data import Dataset
from certify.engine.plan import Rates, _duration, binarization_cost, per_sample, samples_of
from certify.engine.records import record_queries
from certify.rundir import SampleRecord
from certify.suite import CheckSpec

log = logging.getLogger("certify")

#: Samples per check the pilot evaluates that the model answers right (fewer where the check
#: has fewer), beside one it answers wrong and one of its binarization test.
PILOT_SAMPLES = 4
#: The samples the run's probe asks the model before the pilot (the first of the run's seeded
#: class-stratified order, so inside every check's selection as far as it goes): which it
#: answers right, for each check's share and the pilot's choice.
PROBE_SAMPLES = 64
#: By default a run is estimated when its plan's model time at most reaches this (seconds;
#: the pilot costs a few seconds, which a short run need not spend), or an endpoint's queries
#: at most reach :data:`ESTIMATE_FROM_QUERIES`; ``--estimate`` asks for it whatever the run.
ESTIMATE_FROM_S = 120.0
ESTIMATE_FROM_QUERIES = 200_000
#: What "at most" multiplies its bound by: the noise of a shared machine between the pilot's
#: timing and the main pass's.
AT_MOST_MARGIN = 1.5


def pilot_positions(selected: Sequence[int], right: Sequence[int], wrong: Sequence[int],
                    binarization: set[int]) -> tuple[list[int], int]:
    """The pilot's samples of a check whose selection is ``selected`` and whose binarization
    test runs on ``binarization``, from the run's probe (``right``, ``wrong``: the probe's
    samples the model answers right and wrong, in the run's seeded class-stratified order):
    the first :data:`PILOT_SAMPLES` right ones and the first wrong one of the selection (so
    both kinds are priced), and one of the test's samples where none of those is one. Returns
    (dataset indices in selection order, how many of them the test uses)."""
    mine = set(selected)
    chosen = set([i for i in right if i in mine][:PILOT_SAMPLES]
                 + [i for i in wrong if i in mine][:1])
    if binarization and not chosen & binarization:
        chosen.add(min(binarization))
    return [i for i in selected if i in chosen], len(chosen & binarization)


@dataclass
class Units:
    """Queries and gradient evaluations (of one sample, or summed)."""

    queries: float = 0.0
    gradients: float = 0.0

    def add(self, queries: float, gradients: float) -> None:
        """Count one more record's."""
        self.queries += queries
        self.gradients += gradients

    def scaled(self, k: float) -> Units:
        """These units times ``k``."""
        return Units(self.queries * k, self.gradients * k)

    def cost(self, rates: Rates) -> float:
        """Model units: queries and gradient evaluations weighed by the calibrated rates (an
        endpoint's, not calibrated: its queries)."""
        if rates.query_s is None:
            return self.queries
        return self.queries * rates.query_s + self.gradients * (rates.gradient_s or 0.0)


@dataclass
class PilotCheck:
    """What the pilot measured of one check."""

    id: str
    #: The check's samples, and how many of them its binarization test uses.
    samples: int
    tested: int
    #: Seconds the pilot spent on it, and its samples (of them, binarization samples).
    seconds: float = 0.0
    pilot_samples: int = 0
    pilot_tested: int = 0
    #: Units of the pilot's samples outside the binarization test, and of those inside it.
    plain: Units = field(default_factory=Units)
    bt: Units = field(default_factory=Units)
    #: Of the plain ones: the samples the model answers right and their units, and the wrong
    #: ones' (a wrong answer is often decided at once), and the share of the check's samples
    #: it answers right (from the run's probe: :data:`PROBE_SAMPLES`).
    right: Units = field(default_factory=Units)
    wrong: Units = field(default_factory=Units)
    pilot_right: int = 0
    pilot_wrong: int = 0
    right_share: float = 1.0
    #: An endpoint's requests the pilot sent for it (0 for a model in this process).
    requests: int = 0
    #: Samples the main pass kept from the pilot (set when it does; the estimate, made before,
    #: takes them as kept).
    kept: int = 0
    #: Why the pilot measured nothing (a skip by the schedule, an error), or None.
    none: str | None = None

    @property
    def spent(self) -> Units:
        """The pilot's units of this check, all its samples."""
        return Units(self.plain.queries + self.bt.queries,
                     self.plain.gradients + self.bt.gradients)

    def count(self, records: Mapping[int, SampleRecord], tested_at: set[int],
              right: set[int]) -> None:
        """Count the pilot's ``records`` (dataset index -> record): the binarization test's
        samples (``tested_at``) apart, the others as answered right (``right``) or wrong."""
        for i, r in records.items():
            u = Units(record_queries(r), int(typing.cast(int, r.get("gradients", 0))))
            if i in tested_at:
                self.bt.add(u.queries, u.gradients)
                continue
            self.plain.add(u.queries, u.gradients)
            if i in right:
                self.right.add(u.queries, u.gradients)
                self.pilot_right += 1
            else:
                self.wrong.add(u.queries, u.gradients)
                self.pilot_wrong += 1

    def per_unit(self, rates: Rates) -> float | None:
        """Seconds per model unit, all in (None where the pilot spent none)."""
        units = self.spent.cost(rates)
        return self.seconds / units if units > 0 else None

    def expected_units(self) -> Units:
        """The units of the samples the main pass has still to do (the pilot's taken as kept),
        at the pilot's per-sample measurements."""
        plain, tested = self.expected_split()
        return Units(plain.queries + tested.queries, plain.gradients + tested.gradients)

    def expected_split(self) -> tuple[Units, Units]:
        """:meth:`expected_units` apart: (the plain samples', the binarization samples')."""
        plain_n = self.pilot_samples - self.pilot_tested
        left_plain = max(0, self.samples - self.tested - plain_n)
        left_tested = max(0, self.tested - self.pilot_tested)
        plain = Units()
        if self.pilot_right + self.pilot_wrong == 0:  # not told apart: the plain samples alike
            plain = self.plain.scaled(left_plain / plain_n) if plain_n else Units()
        # each kind of answer at its share of the check's samples (all at the one piloted)
        right = (self.right_share if self.pilot_wrong else 1.0) if self.pilot_right else 0.0
        for units, n, share in ((self.right, self.pilot_right, right),
                                (self.wrong, self.pilot_wrong, 1.0 - right)):
            if n:
                u = units.scaled(left_plain * share / n)
                plain.add(u.queries, u.gradients)
        if self.pilot_tested:
            tested = self.bt.scaled(left_tested / self.pilot_tested)
        else:  # no test sample was piloted: price the test's samples as plain ones
            tested = self.plain.scaled(left_tested / plain_n) if plain_n else Units()
        return plain, tested

    def expected_requests(self, request_batch: int) -> float:
        """An endpoint's requests for :meth:`expected_split`: the binarization test's one
        query a request (one planted problem at a time); the others' requests as full as the
        pilot's were per sample, scaled to the main pass's samples, at most a batch each."""
        plain, tested = self.expected_split()
        pilot_plain = self.pilot_samples - self.pilot_tested
        requests = max(1.0, self.requests - self.bt.queries)
        per = self.plain.queries / requests if self.plain.queries else 1.0
        scale = max(1.0, (self.samples - self.tested) / max(1, pilot_plain))
        full = max(1.0, min(float(request_batch), per * scale))
        return plain.queries / full + tested.queries


@dataclass(frozen=True)
class Bound:
    """The plan's bound of one check: most queries and gradient evaluations in all (``None``
    queries: the check bounds its own by a budget the plan does not price)."""

    queries: int | None
    gradients: int


def bounds_of(checks: Sequence[CheckSpec], data: Dataset, skips: Mapping[str, str]
              ) -> dict[str, Bound]:
    """The plan's bound of every check that runs (see :func:`certify.engine.plan.log_plan`)."""
    out = {}
    for spec in checks:
        if spec.id in skips:
            continue
        queries, gradients = per_sample(spec)
        n = samples_of(spec, data)
        _, bt_q = binarization_cost(spec, data)
        out[spec.id] = Bound(None if queries is None else queries * n + bt_q, gradients * n)
    return out


def long_run(bounds: Mapping[str, Bound], rates: Rates) -> str | None:
    """Why a run is too short to need an estimate by default (``None``: it may be long): its
    plan's model time at most below :data:`ESTIMATE_FROM_S`, or an endpoint's queries at most
    below :data:`ESTIMATE_FROM_QUERIES` (checks without a bound of their own, the sanity and
    clean-accuracy checks and the brittle score, are left out: a few passes over their
    samples)."""
    bounds = {k: b for k, b in bounds.items() if b.queries is not None}
    if rates.query_s is None:
        queries = sum(b.queries or 0 for b in bounds.values())
        return None if queries >= ESTIMATE_FROM_QUERIES else \
            f"a short run: at most {queries:,} queries"
    if rates.gradient_s is None and any(b.gradients for b in bounds.values()):
        return None
    seconds = sum(Units(b.queries or 0, b.gradients).cost(rates) for b in bounds.values())
    return None if seconds >= ESTIMATE_FROM_S else \
        f"a short run: model time at most {_duration(seconds)}"


@dataclass
class Estimate:
    """The run's expected and at-most seconds, and how they were made."""

    expected_s: float
    at_most_s: float
    pilot_s: float
    pilot_samples: int
    checks: dict[str, dict[str, float]]

    def to_doc(self) -> dict[str, JSONLike]:
        """For the provenance's timings (``results.json``)."""
        return {"expected_s": round(self.expected_s, 3), "at_most_s": round(self.at_most_s, 3),
                "pilot_s": round(self.pilot_s, 3), "pilot_samples": self.pilot_samples,
                "margin": AT_MOST_MARGIN,
                "checks": self.checks,
                "rule": "expected: the pilot's units per sample (right and wrong answers at "
                        "their shares) times the samples left at the calibrated rates, plus "
                        "each check's own work beyond its model work once (an endpoint: its "
                        "fitted costs per request and per image); at most: the plan's bound "
                        "at the costlier of the calibrated rates and the pilot's, times "
                        f"{AT_MOST_MARGIN}"}


def request_costs(pilots: Mapping[str, PilotCheck]) -> tuple[float, float]:
    """An endpoint's (seconds per request, seconds per image), fitted to the pilot's checks
    (least squares over each check's seconds = a x requests + b x images, neither below 0)."""
    rows = [(p.requests, p.spent.queries, p.seconds) for p in pilots.values()
            if p.none is None and p.requests > 0]
    if not rows:
        return 0.0, 0.0
    a_, b_, t_ = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
    (a, b), *_ = np.linalg.lstsq(np.stack([a_, b_], 1), t_, rcond=None)
    if a < 0 or b < 0:  # one term alone
        a, b = (float(t_.sum() / a_.sum()), 0.0) if b < 0 else (0.0, float(t_.sum() / b_.sum()))
    return float(a), float(b)


def estimate(pilots: Mapping[str, PilotCheck], bounds: Mapping[str, Bound], rates: Rates,
             pilot_s: float, request_batch: int | None = None) -> Estimate:
    """The run's estimate from the pilot of each check (see the module docstring); an
    endpoint's (``request_batch``: its images per request) from the requests' costs the pilot
    measured (:func:`request_costs`)."""
    per_request = per_image = 0.0
    if rates.query_s is None:  # an endpoint: its seconds per query, as the pilot paid them
        per_request, per_image = request_costs(pilots)
        spent = sum(p.spent.queries for p in pilots.values())
        rates = Rates(pilot_s / spent if spent else None, None,
                      f"the pilot's {_duration(pilot_s)} over its {spent:,.0f} queries")
    expected, at_most, doc = pilot_s, pilot_s, {}
    for cid, bound in bounds.items():
        p = pilots.get(cid)
        e = 0.0
        if p is not None and p.none is None and request_batch is not None and p.requests:
            e = per_request * p.expected_requests(request_batch) \
                + per_image * p.expected_units().queries
        elif p is not None and p.none is None and rates.query_s is not None:
            # the model's work at the calibrated rates, and the check's own once: what its
            # pilot took beyond its model work (set-up, an attack's steps, which follow its
            # iterations rather than its samples; on a small model most of a check's time)
            own = max(0.0, p.seconds - p.spent.cost(rates))
            e = p.expected_units().cost(rates) + own
        m: float
        if bound.queries is not None and rates.query_s is not None:
            # the checks' own work: the pilot's seconds per unit, all in (its small batches
            # and each check's set-up make that dearer than the main pass's), where higher
            unit = max(1.0, (p.per_unit(rates) or 0.0) if p is not None else 0.0)
            m = AT_MOST_MARGIN * unit * Units(bound.queries, bound.gradients).cost(rates)
        elif p is not None and p.pilot_samples:
            m = AT_MOST_MARGIN * p.seconds / p.pilot_samples * p.samples
        else:  # neither a bound nor a pilot: nothing to stand on
            m = math.inf
        m = max(m, e)
        expected += e
        at_most += m
        doc[cid] = {"expected_s": round(e, 3), "at_most_s": round(m, 3) if m != math.inf
                    else -1.0, "pilot_s": round(p.seconds, 3) if p else 0.0}
    n = max((p.pilot_samples for p in pilots.values()), default=0)
    return Estimate(expected, at_most, pilot_s, n, doc)


def log_estimate(e: Estimate) -> None:
    """Say the estimate before the main pass."""
    at_most = "unknown (a check has neither a bound nor a pilot)" if e.at_most_s == math.inf \
        else _duration(e.at_most_s)
    log.info("run time: expected about %s, at most %s for the evaluation (loading the model "
             "and writing the card come on top); from a %s pilot on up to %d samples per "
             "check, whose records the main pass keeps where they are its own",
             _duration(e.expected_s), at_most, _duration(e.pilot_s), e.pilot_samples)
