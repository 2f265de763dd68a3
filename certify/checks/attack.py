"""Robust accuracy under a query-based attack, validated by the binarization test.

For every sample the check queries the model once (clean), runs the attack on the correctly
classified ones, projects the attack's output onto the threat model (ε-ball and [0, 1]),
queries once more and counts a success only from that answer: attacks never grade themselves.
On a seeded, evenly spread subset of samples it then runs the binarization test
(:mod:`certify.attacks.binarization`) with the same attack configuration. An attack whose test
score is below 0.95, or not clearly above random sampling (R-ASR + 0.1), is reported as too
weak to support the robust accuracy it measured, and the check's verdict becomes WARN.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import math
import statistics
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch

from certify.attacks import ATTACKS, Attack, SpatialGrid, margin
from certify.attacks.binarization import (
    LADDER,
    NECESSARY_ONLY,
    PACKAGED,
    BinarizationFields,
    BinarizationSettings,
    ladder_scores,
    ladder_test,
    passes,
)
from certify.attacks.confident import maximise_confidence
from certify.attacks.simple import cut_grid_message
from certify.checks.base import (
    Check,
    CheckContext,
    ExportMetric,
    Measurement,
    Metric,
    ResultView,
    Settlement,
    interval_text,
    pct,
)
from certify.checks.confidence import (
    WORST_CASE_METRICS,
    ConfidenceRecord,
    confidences,
    top_probability,
    worst_case_coverage,
)
from certify.data import Dataset
from certify.errors import ModelError, SuiteError
from certify.images import ImageSink, decode_png, png_bytes, to_uint8
from certify.models.base import TRANSFER, WHITE_BOX, Model, ModelInfo
from certify.models.torchcopy import (
    WhiteBoxUnavailable,
    equivalence,
    transfer_source_of,
    white_box_of,
)
from certify.stats import wilson_interval
from certify.validation import expect

PASS_SCORE = 0.95
RASR_MARGIN = 0.1
_DEFAULT_EPS = {"linf": 8 / 255, "l2": 0.5, "l0": 10}
#: Shown on the card where the binarization test cannot run for the threat model.
BT_NOT_L0 = ("binarization test not available for L0 threat models: its planted problem is "
             "built in an L∞ or L2 ball, so this attack's strength is unverified")
_BT_KEYS = {"samples", "n_inner", "n_boundary", "inner_gap", "closeness", "inner_shell"}
#: Planted problems per attack by default (issue 17: at least 20).
BT_SAMPLES = 20
#: Set by the check's own parameters; in ``attack_params`` they would disagree with the card.
_CHECK_KEYS = ("epsilon", "max_queries", "norm")
#: ``max_queries: auto``: the first round's budget per attack, unless ``initial_queries`` says.
AUTO_INITIAL = {"square_linf": 1000, "square_l2": 1000, "hopskipjump": 5000, "random": 1000,
                "sparse_rs": 1000}
#: ``max_queries: auto``: the total queries per sample a round may reach, as a multiple of the
#: initial budget, unless ``query_cap`` says.
AUTO_CAP_FACTOR = 16
#: A budget is converged when at most max(1, this share of the samples) were still moving: first
#: broken in the last half of the budget, or (minimisation attacks) still being approached.
CONVERGENCE_SHARE = 0.01
#: Queries per unbroken sample a black-box attack must have spent, over at least two doubled
#: rounds (``max_queries: auto``) and converged, before its row may PASS on its own: Square's is
#: AutoAttack's (5,000), Sparse-RS's its authors' untargeted L0 setting (10,000); HopSkipJump
#: needs about 100·sqrt(t) queries per iteration t, and 25,000 buys it about 40 iterations.
#: Below its floor an attack row is evidence, never a PASS (issue 27).
QUERY_FLOORS = {"square_linf": 5000, "square_l2": 5000, "random": 5000, "sparse_rs": 10000,
                "hopskipjump": 25000}
#: The ε sweep of APGD-CE (Carlini et al. 2019's sanity checks; issue 27): at most this many
#: of the check's correctly classified samples, attacked at these multiples of ε and at an ε
#: that reaches any image (L∞ 0.5; L2 the diagonal of the image cube, sqrt(C·H·W)).
SWEEP_SAMPLES = 20
SWEEP_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
#: Robust accuracy may rise with ε by at most max(1 sample, this share) before the attack is
#: unreliable; the largest ε must break at least SWEEP_DESTROYED of the swept samples.
SWEEP_SLACK = 0.01
SWEEP_DESTROYED = 0.99
#: A run is *stalled* when at least this share of its still-unbroken samples had no accepted
#: improvement in the last half of their budget: the model's outputs gave it no signal.
STALLED_SHARE = 0.5
#: Record fields that describe one attempt on a sample; a later round's attempt replaces them.
_ATTEMPT = ("outcome", "adv_pred", "confidence", "start_failed", "gap", "half_gap", "abstained",
            "confidence_first", "confident_queries", "adv_image", "scores")
#: Record fields that are tallies over rounds or the sample's identity.
_TALLY = ("queries", "attack_queries", "ref_queries", "check", "i", "id", "label")
#: Adversarial examples a check shows on the card: the first broken samples in sample order.
#: Each record batch keeps the adversarial image of its first this-many broken samples, which
#: always include the check's first this-many (a subset's first k broken are among them).
GALLERY_EXAMPLES = 6
#: What the confidence beside an adversarial label is, per kind of model output.
CONFIDENCE_OF = {"probs": "probability", "logits": "softmax of logits",
                 "labels": "labels only: no confidence"}
#: Extra queries per broken sample that score-based attacks spend on a confident mistake.
CONFIDENT_QUERIES = 100
#: Why a decision-based attack reports no coverage-under-attack figures.
NO_COVERAGE_UNDER_ATTACK = (
    "not reported for a decision-based attack: it stops at the decision boundary and sees no "
    "scores to raise the wrong class's confidence with, so its mistakes would fall in the "
    "abstained share by construction")

#: Why a labels-only model gets no coverage-under-attack figures.
NO_COVERAGE_LABELS = ("not reported: the model answers labels only, so there is no confidence "
                      "to abstain on")


class AttackRecord(ConfidenceRecord, BinarizationFields, total=False):
    """An attack record: the sample's attempt(s) and, on the tested subset, the binarization
    test's fields.

    ``outcome`` is ``misclassified`` (never attacked), ``robust`` or ``broken``;
    ``attack_queries`` are the attack's (over all rounds; ``round_queries`` per round), and a
    break records the total queries at which it happened (``broken_at``), its ``adv_pred``,
    the round (``broken_round``) and, for the card's gallery, ``adv_image`` (a PNG, base64)
    with what its ``confidence`` is (``scores``). An unbroken sample keeps the minimisation
    attacks' ``gap`` and ``half_gap`` (convergence) or ``start_failed``. A white-box attack's
    record says when it was a ``transfer`` from an endpoint's surrogate, and whether the
    surrogate gave the sample's clean image the endpoint's answer (``surrogate_agrees``).
    """

    label: int
    attack_queries: int
    round_queries: list[int]
    adv_pred: int
    broken_at: int
    broken_round: int
    clean_changed: bool
    start_failed: bool
    gap: float
    half_gap: float
    confidence_first: float
    confident_queries: int
    adv_image: str
    scores: str
    gradients: int
    late_break: bool
    white_box_mismatch: str
    sweep_broken: list[bool]
    sweep_epsilons: list[float]
    transfer: bool
    surrogate_agrees: bool


class AttackCheck(Check[AttackRecord]):
    """Robust accuracy at ε under one attack and budget (queries per sample).

    Parameters: ``attack`` (square_linf, square_l2, hopskipjump, random, spatial_grid,
    sparse_rs), ``epsilon`` (L∞ or L2 radius in [0, 1] pixel units, 8/255 and 0.5 by default;
    for the L0 attack sparse_rs a whole number of pixels, 10 by default), ``norm``
    (for hopskipjump and random), ``max_queries`` per sample (a number: one run with that
    budget; ``auto``: rounds, below), ``initial_queries`` and ``query_cap`` (``auto`` only),
    ``attack_params`` (extra constructor arguments of the attack), ``binarization``
    (``false``, or settings: samples, n_inner, n_boundary, inner_gap, closeness),
    ``confident_queries`` (score-based attacks: extra queries per broken sample spent raising
    the wrong class's confidence, Brown et al. 2018; 100 by default, 0 turns it off;
    decision-based attacks take none and report no accuracy at coverage under attack).

    **Convergence.** Every budget is judged: it is *converged* when at most max(1, 1% of the
    samples) were first broken in the last half of the (latest) run's budget, or were still
    unbroken but approached in the last half of their run by at least the gap left (the margin
    loss for score-based attacks, the distance beyond ε for HopSkipJump; :func:`convergence`).
    An unconverged attack cannot PASS: its verdict becomes WARN "budget not converged", with the
    curve of robust accuracy against queries on the card.

    **Rounds** (``max_queries: auto``). Round 0 runs the attack with ``initial_queries`` (by
    default :data:`AUTO_INITIAL`); while that run is not converged, round *r* re-runs the
    attack from scratch on the still-unbroken samples with twice the previous run's budget
    (``initial × 2^r``, the attack's schedule for that budget, a new seed stream), until a run
    converges or the next budget would pass ``query_cap`` (by default ``AUTO_CAP_FACTOR ×
    initial``). Every round's records are kept; the runner finishes a round for all samples
    (and shards) before deciding the next. The binarization test runs in round 0 only, with the
    initial budget.
    """

    kind: ClassVar[str] = "attack"
    glance_group: ClassVar[str] = "Attacks"
    family: ClassVar[str] = "Query-based attacks validated by the binarization test"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("robust_accuracy", "share of all samples correct and not broken by the attack "
               "(an empirical upper bound)", "higher", threshold=True),
        Metric("attack_success_rate", "share of correctly classified samples the attack broke",
               "lower", threshold=True),
        Metric("binarization_score", "the attack's success rate on planted problems "
               "(Zimmermann et al. 2022)", "higher", threshold=True, optional=True),
        Metric("binarization_rasr", "random sampling's success rate on the same problems",
               optional=True),
        Metric("binarization_tested", "planted problems run", unit="count", optional=True),
        Metric("binarization_setup_failed", "samples where no planted problem could be built",
               unit="count", optional=True),
        Metric("n_start_failed", "samples counted robust only because the attack found no "
               "adversarial starting point (HopSkipJump)", unit="count", optional=True),
        Metric("clean_accuracy", "share of samples correct before the attack", "higher"),
        Metric("n", "samples evaluated", unit="count"),
        Metric("n_robust", "samples robust to the attack", unit="count"),
        Metric("n_broken", "samples the attack broke", unit="count"),
        Metric("queries_median", "median attack queries per attacked sample", unit="queries"),
        Metric("queries_mean", "mean attack queries per attacked sample", unit="queries"),
        Metric("queries_max", "most attack queries on one sample", unit="queries"),
        Metric("query_budget", "attack queries per sample a never-broken sample got, over all "
               "rounds", unit="queries"),
        Metric("rounds", "attack rounds run (max_queries: auto doubles the total per round)",
               unit="count"),
        Metric("gradient_evaluations", "white-box attacks: gradient evaluations of the torch "
               "copy over all samples (not model queries)", unit="count", optional=True),
        Metric("late_breaks", "samples first broken in the last half of the budget",
               unit="count", optional=True),
        Metric("approaching", "unbroken samples still being approached: their gap to success "
               "(margin, or distance beyond ε) fell in the last half by at least what is left",
               unit="count", optional=True),
        Metric("stalled", "unbroken samples with no accepted improvement in the last half of "
               "the latest run's budget", unit="count", optional=True),
        *(dataclasses.replace(m, optional=True) for m in WORST_CASE_METRICS),
        Metric("first_break_accuracy_at_coverage", "accuracy at the coverage level with each "
               "broken sample at the confidence of its first break (before the confident-"
               "mistake search): inflated, shown for comparison", optional=True),
        Metric("confident_queries_total", "queries spent raising broken samples' wrong-class "
               "confidence", unit="count", optional=True),
        Metric("worst_case_abstentions", "samples whose worst case is the model's explicit "
               "abstain class", unit="count", optional=True),
    )
    #: compare: both rates pair on "correct and not broken" over all samples
    compare_outcomes = {"robust_accuracy": ("robust", "higher"),
                        "attack_success_rate": ("robust", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("robust_accuracy", "robust_accuracy",
                                                         "Robust accuracy")
    #: Attacks spend thousands of queries per sample: record them in small units.
    record_batch: ClassVar[int | None] = 64

    def __init__(self, attack: str, epsilon: float | None = None, norm: str | None = None,
                 max_queries: int | Literal["auto"] = 1000, initial_queries: int | None = None,
                 query_cap: int | None = None, attack_params: dict[str, Any] | None = None,
                 binarization: dict[str, Any] | bool = True,
                 confident_queries: int | None = None, eps_sweep: bool = True) -> None:
        self.attack = attack
        self.eps_sweep = eps_sweep
        self.epsilon = epsilon
        self.norm = norm
        self.max_queries = max_queries
        self.initial_queries = initial_queries
        self.query_cap = query_cap
        self.attack_params = attack_params
        self.binarization = binarization
        self.confident_queries = confident_queries
        #: Which round this copy runs (see :meth:`for_round`); not a suite parameter.
        self._round = 0

    # -- budgets and rounds ---------------------------------------------------------------
    @property
    def auto(self) -> bool:
        """Whether the budget grows in rounds until converged (``max_queries: auto``)."""
        return self.max_queries == "auto"

    def initial_budget(self) -> int:
        """Round 0's queries per sample (the whole budget when it is a number)."""
        if not self.auto:
            return int(self.max_queries)
        if self.initial_queries is not None:
            return self.initial_queries
        return AUTO_INITIAL.get(ATTACKS[self.attack].name, 1000)

    def cap(self) -> int:
        """The largest budget one round's run may have."""
        if not self.auto:
            return self.initial_budget()
        return self.query_cap if self.query_cap is not None else \
            AUTO_CAP_FACTOR * self.initial_budget()

    def round_budget(self, r: int) -> int:
        """Queries per sample of round ``r``'s run: the initial budget, doubled each round."""
        return self.initial_budget() * (1 << r)

    def total_after(self, r: int) -> int:
        """Queries per sample a never-broken sample has spent after rounds ``0..r``."""
        return self.initial_budget() * ((1 << (r + 1)) - 1)

    def floor(self) -> int:
        """The single run's queries per sample this attack needs before its row may PASS on
        its own (:data:`QUERY_FLOORS`; 0 for white-box attacks and the exhaustive grid).
        ``max_queries: auto`` keeps doubling a converged run until it reaches this floor, while
        the cap allows."""
        name = ATTACKS[self.attack].name
        if self.white_box() or name == "spatial_grid":
            return 0
        return QUERY_FLOORS.get(name, QUERY_FLOORS["square_linf"])

    def for_round(self, r: int) -> AttackCheck:
        """A copy that runs round ``r`` (its budget and seed stream; no binarization test)."""
        c = copy.copy(self)
        c._round = r
        return c

    def next_round(self, records: dict[int, AttackRecord], done: int
                   ) -> tuple[AttackCheck, list[int]] | None:
        """After rounds ``0..done`` (merged ``records``): the next round's check and samples,
        or None when the budget is fixed, converged, or the next budget would pass the cap."""
        if not self.auto or self.round_budget(done + 1) > self.cap():
            return None
        if convergence(list(records.values()), done, self.round_budget(done))["converged"] \
                and self.round_budget(done) >= self.floor():
            return None
        todo = sorted(i for i, r in records.items() if r["outcome"] == "robust")
        return (self.for_round(done + 1), todo) if todo else None

    def merge_round(self, records: dict[int, AttackRecord], new: dict[int, AttackRecord],
                    r: int) -> dict[int, AttackRecord]:
        """Fold round ``r``'s records into the merged ones: queries add up, the new attempt
        replaces the old, and a break records the total queries at which it happened."""
        out = dict(records)
        for i, rec in new.items():
            old = out[i]
            rounds = [*old.get("round_queries", [int(old["attack_queries"])]),
                      int(rec["attack_queries"])]
            merged = typing.cast(AttackRecord, {k: v for k, v in old.items()
                                                if k not in _ATTEMPT})
            merged.update(typing.cast(AttackRecord, {k: v for k, v in rec.items()
                                                     if k not in _TALLY}))
            merged.update({
                "round_queries": rounds,
                "attack_queries": sum(rounds),
                "queries": int(old["queries"]) + int(rec["queries"]),
            })
            if "ref_queries" in old or "ref_queries" in rec:
                merged["ref_queries"] = int(old.get("ref_queries", 0)) + \
                    int(rec.get("ref_queries", 0))
            if rec["outcome"] == "misclassified":
                # The model changed its answer to the unattacked image between rounds (a
                # randomised model): it is not robust, whatever the attack did.
                merged.update({"outcome": "broken", "clean_changed": True})
            if merged["outcome"] == "broken":
                merged["broken_at"] = sum(rounds[:-1]) + int(rec["attack_queries"])
                merged["broken_round"] = r
            out[i] = merged
        return out

    # -- configuration --------------------------------------------------------------------
    def _norm(self) -> str:
        cls = ATTACKS[self.attack]
        if cls.needs_gradients:
            return self.norm or "linf"
        if cls.name == "hopskipjump":
            return self.norm or "l2"
        if cls.name == "random":
            return self.norm or "linf"
        return cls.norm

    def _epsilon(self) -> float:
        norm = self._norm()
        return 0.0 if norm == "spatial" else float(
            self.epsilon if self.epsilon is not None else _DEFAULT_EPS[norm])

    def score_based(self) -> bool:
        """Whether the attack reads scores (and so can raise a mistake's confidence)."""
        return bool(ATTACKS[self.attack].needs_scores) and not self.white_box()

    def reports_coverage(self) -> bool:
        """Whether the worst cases carry a confidence worth ranking (accuracy at coverage under
        attack): score-based attacks (which then raise a break's confidence), white-box attacks
        (their highest-loss point) and the spatial grid (its most confident mistake of the
        whole grid); not a decision-based attack, which stops at the boundary."""
        return self.score_based() or self.white_box() or self._norm() == "spatial"

    def white_box(self) -> bool:
        """Whether the attack proposes from gradients of a torch copy of the graph."""
        return bool(ATTACKS[self.attack].needs_gradients)

    def _confident_queries(self) -> int:
        if not self.score_based():
            return 0
        return CONFIDENT_QUERIES if self.confident_queries is None else self.confident_queries

    def threat_model(self) -> tuple[str, float]:
        """(norm, ε): ``linf``/``l2`` with the radius, or ``spatial`` with 0."""
        return self._norm(), self._epsilon()

    def build(self) -> Attack:
        """The configured attack object."""
        cls = ATTACKS[self.attack]
        kw: dict[str, Any] = dict(self.attack_params or {})
        if cls.name == "spatial_grid":
            kw["max_queries"] = self.initial_budget()
            return cls(**kw)
        if cls.needs_gradients:  # iterations and restarts, not queries
            kw.update(epsilon=self._epsilon(), norm=self._norm())
            return cls(**kw)
        kw.update(epsilon=self._epsilon(), max_queries=self.round_budget(self._round))
        if cls.name in ("hopskipjump", "random"):
            kw["norm"] = self._norm()
        return cls(**kw)

    def _bt(self) -> tuple[tuple[BinarizationSettings, ...], int, int] | None:
        """(ladder hardest first, index of the packaged rung, samples), or None when off.

        The packaged configuration of the threat model (binarization.PACKAGED) and its ladder;
        a suite that sets hardness keys runs that one configuration alone (experiments).
        """
        if self.binarization is False or self._norm() in ("spatial", "l0") or self.white_box():
            return None
        raw = {} if self.binarization is True else dict(self.binarization)
        samples = int(raw.pop("samples", BT_SAMPLES))
        norm = self._norm()
        if not raw:
            ladder = LADDER[norm]
            return ladder, ladder.index(PACKAGED[norm]), samples
        return (dataclasses.replace(PACKAGED[norm], **raw),), 0, samples

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        if self.attack not in ATTACKS:
            raise SuiteError(f"{where}: unknown attack {self.attack!r}",
                             hint=f"valid attacks: {', '.join(ATTACKS)}")
        if self.norm is not None and self.norm not in ("linf", "l2"):
            raise SuiteError(f"{where}: norm must be linf or l2", hint="e.g. norm: linf")
        if self.norm is not None and ATTACKS[self.attack].name.startswith("square") and \
                self.norm != ATTACKS[self.attack].norm:
            raise SuiteError(f"{where}: {self.attack} works in {ATTACKS[self.attack].norm}",
                             hint="use square_l2 for L2")
        if not self.auto and (not isinstance(self.max_queries, int) or self.max_queries < 2):
            raise SuiteError(f"{where}: max_queries must be an integer >= 2 or auto",
                             hint="e.g. 1000, or auto (rounds until converged)")
        if not self.auto and (self.initial_queries, self.query_cap) != (None, None):
            raise SuiteError(f"{where}: initial_queries and query_cap go with max_queries: auto",
                             hint="e.g. max_queries: auto, initial_queries: 1000")
        if self.auto and self.white_box():
            raise SuiteError(f"{where}: {self.attack} is a white-box attack: it runs a fixed "
                             "number of iterations, not a query budget",
                             hint="drop max_queries; attack_params: {iterations: 100, "
                                  "restarts: 2} set its effort")
        if self.auto:
            if ATTACKS[self.attack].name == "spatial_grid":
                raise SuiteError(f"{where}: spatial_grid searches its grid exhaustively: "
                                 "max_queries must be the grid size, not auto",
                                 hint="e.g. max_queries: 538")
            if self.initial_budget() < 2:
                raise SuiteError(f"{where}: initial_queries must be >= 2", hint="e.g. 1000")
            if self.cap() < 2 * self.initial_budget():
                raise SuiteError(f"{where}: query_cap {self.cap()} leaves no room for a second "
                                 f"round after {self.initial_budget()} queries",
                                 hint=f"query_cap >= {2 * self.initial_budget()}, e.g. "
                                      f"{AUTO_CAP_FACTOR * self.initial_budget()}")
        if not isinstance(self.eps_sweep, bool):
            raise SuiteError(f"{where}: eps_sweep must be true or false",
                             hint="APGD-CE's ε sweep (Carlini et al. 2019); true by default")
        if self.confident_queries is not None:
            if not isinstance(self.confident_queries, int) or self.confident_queries < 0:
                raise SuiteError(f"{where}: confident_queries must be an integer >= 0",
                                 hint=f"e.g. {CONFIDENT_QUERIES}; 0 turns it off")
            if self.confident_queries and not self.score_based():
                raise SuiteError(f"{where}: confident_queries applies to score-based attacks "
                                 f"only; {self.attack} sees no scores",
                                 hint="remove confident_queries from this check")
        if self.epsilon is not None and (not isinstance(self.epsilon, int | float)
                                         or self.epsilon <= 0):
            raise SuiteError(f"{where}: epsilon must be positive", hint="e.g. 0.0314 (8/255)")
        if ATTACKS[self.attack].norm == "l0" and self.epsilon is not None and (
                isinstance(self.epsilon, bool) or not isinstance(self.epsilon, int)):
            raise SuiteError(f"{where}: epsilon for {self.attack} is a number of pixels, a "
                             f"whole number, got {self.epsilon!r}", hint="e.g. epsilon: 8")
        if isinstance(self.binarization, dict):
            unknown = set(self.binarization) - _BT_KEYS
            if unknown:
                raise SuiteError(f"{where}: unknown binarization key(s) {sorted(unknown)}",
                                 hint=f"valid: {', '.join(sorted(_BT_KEYS))}")
        elif not isinstance(self.binarization, bool):
            raise SuiteError(f"{where}: binarization must be false or a mapping",
                             hint="e.g. binarization: {samples: 20}")
        # Nested values, typed as far as the attack's and the test's annotations say.
        if isinstance(self.binarization, dict):
            hints = typing.get_type_hints(BinarizationSettings) | {"samples": int}
            for k, v in self.binarization.items():
                expect(v, hints[k], f"{where}.params.binarization.{k}")
        if isinstance(self.attack_params, dict):
            own = [k for k in _CHECK_KEYS if k in self.attack_params]
            if own:
                raise SuiteError(f"{where}: {', '.join(own)} belong(s) in params, not in "
                                 f"params.attack_params",
                                 hint=f"e.g. params: {{{own[0]}: ...}}")
            hints = typing.get_type_hints(ATTACKS[self.attack].__init__)
            for k, v in self.attack_params.items():
                expect(v, hints.get(k, Any), f"{where}.params.attack_params.{k}")
        try:
            attack = self.build()
            self._bt()
        except TypeError as exc:
            raise SuiteError(f"{where}: {exc}", hint="check attack_params") from None
        if isinstance(attack, SpatialGrid) and attack.grid_size() > self.initial_budget():
            size = attack.grid_size()
            raise SuiteError(f"{where}: {cut_grid_message(size, self.initial_budget())}",
                             hint=f"raise max_queries to {size}, or lower rotation_steps / "
                                  f"translation_steps")

    def produced_metrics(self, reference: bool) -> set[str]:
        """No binarization metrics when the test is off or the attack is spatial."""
        if self._bt() is None:
            return set(self.metric_names) - {"binarization_score", "binarization_rasr"}
        return set(self.metric_names)

    def skip_reason(self, info: ModelInfo) -> str | None:
        """A score-based attack cannot run on a labels-only model: skipped, not refused."""
        if self.white_box():
            if info.white_box != WHITE_BOX and not info.white_box.startswith(TRANSFER):
                return (f"{self.attack} is a white-box attack; on {info.name} it is "
                        f"{info.white_box}; --surrogate MODEL.onnx runs it as a transfer "
                        "attack from a local model")
            if ATTACKS[self.attack].name == "apgd_t" and info.num_classes < 4:
                return (f"{self.attack}'s targeted DLR loss needs at least 4 classes, "
                        f"{info.name} has {info.num_classes} (apgd_ce applies)")
            return None
        if ATTACKS[self.attack].needs_scores and info.output == "labels":
            return f"{self.attack} needs scores; {info.name} returns labels only"
        return None

    # -- measurement ----------------------------------------------------------------------
    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[AttackRecord]:
        counter: Any = model
        output = counter.info.output
        attack, norm, eps = self.build(), self._norm(), self._epsilon()
        scores = counter.predict(x)
        correct = (scores.argmax(1) == y).cpu()
        m0 = margin(scores.cpu(), y.cpu(), output)
        one_hot = one_hot_answers(scores, output)
        clean_conf = confidences(scores.cpu(), output)
        clean_prob = top_probability(scores.cpu(), output)
        rec: list[AttackRecord] = [
            {"outcome": "robust" if bool(c) else "misclassified", "label": int(t),
             "queries": 1, "attack_queries": 0, "confidence": float(cc),
             "probability": float(pp)}
            for c, t, cc, pp in zip(correct.tolist(), y.tolist(), clean_conf.tolist(),
                                    clean_prob.tolist(), strict=True)
        ]
        ci = correct.nonzero().flatten()
        if len(ci) and self.white_box():
            self._white_box_batch(counter, attack, x, y, scores, ci, rec, index, ctx)
        elif len(ci):
            stream = (1,) if self._round == 0 else (1, self._round)  # a new stream per round
            seeds = torch.tensor([ctx.seed(int(index[i]), *stream) for i in ci.tolist()])
            dev = x.device
            res = attack(counter, x[ci.to(dev)], y[ci.to(dev)], seeds, output,
                         threat=(norm, eps))
            x_adv, adv_scores = res.x_adv, res.scores
            pred = adv_scores.argmax(1)
            adv_conf = confidences(adv_scores, output)
            adv_prob = top_probability(adv_scores, output)
            for k, i in enumerate(ci.tolist()):
                broken = bool(res.success[k])
                rec[i].update({"outcome": "broken" if broken else "robust",
                               "attack_queries": int(res.queries[k]),
                               "queries": 2 + int(res.queries[k]),
                               "confidence": float(adv_conf[k]),
                               "probability": float(adv_prob[k])})
                if broken:
                    rec[i]["adv_pred"] = int(pred[k])
                    rec[i]["broken_at"] = int(res.queries[k])
                elif res.start_failed is not None and bool(res.start_failed[k]):
                    rec[i]["start_failed"] = True  # never attacked: robust, unverified
                elif res.gap is not None and res.half_gap is not None and \
                        math.isfinite(float(res.half_gap[k])) and \
                        math.isfinite(float(res.gap[k])):
                    rec[i]["gap"] = float(res.gap[k])
                    rec[i]["half_gap"] = float(res.half_gap[k])
            x_final = self._confident_mistakes(counter, x[ci.to(dev)], x_adv, y[ci.to(dev)],
                                               adv_scores, [rec[i] for i in ci.tolist()],
                                               [int(index[i]) for i in ci.tolist()], ctx)
            keep_adversarial_images(rec, ci.tolist(), index, x_final, output)
        if ctx.abstain_class is not None:
            for r, p in zip(rec, scores.argmax(1).cpu().tolist(), strict=True):
                if int(r.get("adv_pred", p)) == ctx.abstain_class:
                    r["abstained"] = True  # an explicit abstention, not an answer
        bt = self._bt() if self._round == 0 else None
        if bt is not None:
            ladder, packaged, samples = bt
            head = bt_head(counter)
            picked = bt_positions(ctx, samples)
            stride = max(1, math.ceil(ctx.n_samples / max(samples, 1)))
            for j, i in enumerate(index):
                if (int(i) not in picked) if picked else int(i) % stride:
                    continue
                before = counter.queries
                fields = ladder_test(counter, x[j], attack, norm, eps, ctx.seed(int(i), 2),
                                     ladder, packaged, output, float(m0[j]),
                                     bool(one_hot[j]), head=head[0] if head else None)
                if head:
                    fields["bt_head"] = list(head[1])
                rec[j].update(typing.cast(AttackRecord, fields))  # its keys are AttackRecord's
                rec[j]["queries"] += counter.queries - before
        return rec

    def _white_box_batch(self, counter: Any, attack: Attack, x: torch.Tensor, y: torch.Tensor,
                         scores: torch.Tensor, ci: torch.Tensor, rec: list[AttackRecord],
                         index: Sequence[int], ctx: CheckContext) -> None:
        """Attack the correctly classified samples ``ci`` with gradients of the model's torch
        copy; the real model judges every proposal (one query per sample).

        The copy is compared with the model's own clean answers on the batch first
        (:func:`~certify.models.torchcopy.equivalence`); where it differs, no sample of the
        batch is attacked and each record says why (the check cannot pass).
        """
        found = white_box_of(counter)
        transfer = found is None  # an endpoint's surrogate proposes (--surrogate)
        source = transfer_source_of(counter) if transfer else found
        if source is None:
            raise ModelError(f"{self.attack} needs the model's graph, which this run does not have",
                             hint="white-box attacks run on ONNX models; report this as a bug")
        try:
            copy = source.torch_copy()
            copy_scores = copy.scores(x)
        except WhiteBoxUnavailable as exc:
            raise ModelError(f"{self.attack}: {exc}",
                             hint="the black-box attacks of the suite still apply") from None
        if transfer:
            # a transfer attack: the surrogate is another model by design (no equivalence);
            # its agreement with the endpoint on the clean images is said on the card
            agrees = (copy_scores.argmax(1).cpu() == scores.argmax(1).cpu()).tolist()
            for i in ci.tolist():
                rec[i].update({"transfer": True, "surrogate_agrees": bool(agrees[i])})
        else:
            eq = equivalence(copy_scores, scores, copy.quantised)
            if not eq.ok:
                for i in ci.tolist():
                    rec[i]["white_box_mismatch"] = eq.why()
                return
        norm, eps = self.threat_model()
        dev = x.device
        seeds = torch.tensor([ctx.seed(int(index[i]), 1) for i in ci.tolist()])
        res = attack(copy, x[ci.to(dev)], y[ci.to(dev)], seeds, counter.info.output,
                     threat=(norm, eps), judge=counter)
        adv_conf = confidences(res.scores, counter.info.output)
        adv_prob = top_probability(res.scores, counter.info.output)
        pred = res.scores.argmax(1)
        for k, i in enumerate(ci.tolist()):
            broken = bool(res.success[k])
            rec[i].update({"outcome": "broken" if broken else "robust",
                           "queries": 2, "gradients": int(res.gradients[k]),
                           "confidence": float(adv_conf[k]),
                           "probability": float(adv_prob[k])})
            if broken:
                rec[i].update({"adv_pred": int(pred[k]), "broken_at": 0,
                               "late_break": bool(res.late is not None and res.late[k])})
        keep_adversarial_images(rec, ci.tolist(), index, res.x_adv, counter.info.output)
        # the ε sweep tests a white-box attack on the model it differentiates; a transfer
        # attack differentiates another model, so its sweep would say nothing of the endpoint
        if ATTACKS[self.attack].name == "apgd_ce" and self.eps_sweep and not transfer:
            self._sweep(counter, copy, x, y, ci, rec, index, ctx)

    def sweep_epsilons(self, shape: Sequence[int]) -> list[float]:
        """The ε sweep's radii for images of ``shape`` (C, H, W), smallest first."""
        norm, eps = self.threat_model()
        top = 0.5 if norm == "linf" else math.sqrt(math.prod(shape))
        return [f * eps for f in SWEEP_FACTORS if f * eps < top] + [top]

    def _sweep(self, counter: Any, copy: Any, x: torch.Tensor, y: torch.Tensor,
               ci: torch.Tensor, rec: list[AttackRecord], index: Sequence[int],
               ctx: CheckContext) -> None:
        """APGD-CE (one restart) at each radius of :meth:`sweep_epsilons` on the batch's swept
        samples (:func:`bt_positions` with :data:`SWEEP_SAMPLES`, correctly classified only),
        judged on the real model; each record keeps which radii broke it (``sweep_broken``)."""
        picked = bt_positions(ctx, SWEEP_SAMPLES)
        at = [i for i in ci.tolist() if int(index[i]) in picked]
        if not at:
            return
        norm = self._norm()
        sel = torch.tensor(at, device=x.device)
        seeds = torch.tensor([ctx.seed(int(index[i]), 4) for i in at])
        # one restart per radius: the sweep tests the attack's behaviour across ε, not its
        # strength at ε (the check's own run does that)
        kw: dict[str, Any] = dict(self.attack_params or {}) | {"restarts": 1}
        broken: list[list[bool]] = [[] for _ in at]
        radii = self.sweep_epsilons(tuple(x.shape[1:]))
        for e in radii:
            attack = ATTACKS[self.attack](**(kw | {"epsilon": e, "norm": norm}))
            res = attack(copy, x[sel], y[sel], seeds, counter.info.output, threat=(norm, e),
                         judge=counter)
            for k, i in enumerate(at):
                broken[k].append(bool(res.success[k]))
                rec[i]["queries"] += 1
                rec[i]["gradients"] = int(rec[i].get("gradients", 0)) + int(res.gradients[k])
        for k, i in enumerate(at):
            rec[i]["sweep_broken"] = broken[k]
            rec[i]["sweep_epsilons"] = radii

    def _confident_mistakes(self, counter: Any, x: torch.Tensor, x_adv: torch.Tensor,
                            y: torch.Tensor, adv_scores: torch.Tensor,
                            recs: list[AttackRecord], index: list[int],
                            ctx: CheckContext) -> torch.Tensor:
        """Score-based attacks: raise each broken sample's wrong-class confidence.

        Spends at most ``confident_queries`` queries per broken sample
        (:func:`certify.attacks.confident.maximise_confidence`); the record keeps the
        first-break confidence (``confidence_first``) and the maximised one (``confidence``,
        which the coverage figures read), and is charged the queries. Returns the adversarial
        points the records now describe (``x_adv`` with the more confident ones swapped in).
        """
        budget = self._confident_queries()
        broken = [k for k, r in enumerate(recs) if r["outcome"] == "broken"]
        if not budget or not broken:
            return x_adv
        sel = torch.tensor(broken)
        dev = x.device
        norm, eps = self.threat_model()
        seeds = torch.tensor([ctx.seed(index[k], 3) for k in broken])
        out = maximise_confidence(counter, x[sel.to(dev)], x_adv[sel.to(dev)],
                                  y[sel.to(dev)], adv_scores[sel], norm, eps, budget, seeds,
                                  counter.info.output)
        prob = top_probability(out.scores, counter.info.output)
        for j, k in enumerate(broken):
            q = int(out.queries[j])
            recs[k].update({"confidence_first": float(out.confidence_first[j]),
                            "confidence": float(out.confidence[j]),
                            "probability": float(prob[j]),
                            "adv_pred": int(out.pred[j]),
                            "confident_queries": q,
                            "queries": recs[k]["queries"] + q})
        x_final = x_adv.clone()
        x_final[sel.to(x_final.device)] = out.x_adv.to(x_final)
        return x_final

    def _black_box_evidence(self, records: list[AttackRecord], rounds: int,
                            metrics: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
        """What a black-box attack's row can support on its own (issue 27), with a warning
        for each reason it may not PASS: a stalled last run (no signal from the outputs), a
        last run below its floor (:data:`QUERY_FLOORS`) or not preceded by a run of half its
        budget (convergence judged across two doubled rounds), and an attack the binarization
        test did not check."""
        floor, last = self.floor(), self.round_budget(rounds - 1)
        flat, judged = stalled_counts(records)
        stalled = judged > 0 and flat >= STALLED_SHARE * judged
        metrics["stalled"] = flat
        if stalled:
            warnings.append(
                f"stalled: {flat} of {judged} unbroken sample(s) had no accepted improvement in "
                f"the last half of their budget: the model's outputs gave the attack no signal "
                "(rounded or saturated scores do this); a stronger attack can only lower this "
                "robust accuracy")
        short = []
        if last < floor:
            short.append(f"its last run had {last:,} queries per sample, below its floor of "
                         f"{floor:,}" + (f" (the cap is {self.cap():,})" if self.auto else ""))
        if rounds < 2:
            short.append("its convergence was not judged across two doubled rounds "
                         "(max_queries: auto)" if not self.auto else
                         "it stopped after one round, so its convergence was not judged "
                         "across two doubled rounds")
        if self._bt() is None:
            short.append("the binarization test did not check it" +
                         (" (not available for L0)" if self._norm() == "l0" else
                          " (binarization: false)"))
        unbroken = any(r["outcome"] == "robust" for r in records)
        if short and unbroken:
            warnings.append(
                f"{self.attack} alone is evidence, not a PASS: " + "; ".join(short) +
                f"; a black-box attack may PASS on its own only after a run of at least "
                f"{floor:,} queries per sample that followed one of half that budget, "
                "converged and validated by the binarization test; a stronger attack can only "
                "lower this robust accuracy")
        return {"floor": floor, "stalled": stalled, "stalled_samples": flat,
                "unbroken_judged": judged, "short_of_pass": short,
                "can_pass": not short and not stalled}

    def _sweep_details(self, records: list[AttackRecord], warnings: list[str]
                       ) -> dict[str, Any] | None:
        """The ε sweep's robust counts per radius, and a warning when the attack is unreliable
        on this model: robust accuracy rising with ε by more than max(1, 1%) of the swept
        samples, or the largest ε breaking fewer than 99% of them."""
        done = [r for r in records if "sweep_broken" in r and "sweep_epsilons" in r]
        if not done:
            return None
        epsilons = [float(e) for e in done[0]["sweep_epsilons"]]
        swept = [r["sweep_broken"] for r in done if len(r["sweep_broken"]) == len(epsilons)]
        m = len(swept)
        robust = [sum(not b[k] for b in swept) for k in range(len(epsilons))]
        slack = max(1.0, SWEEP_SLACK * m)
        rises = [(epsilons[k], epsilons[k + 1]) for k in range(len(robust) - 1)
                 if robust[k + 1] > robust[k] + slack]
        destroyed = (m - robust[-1]) >= SWEEP_DESTROYED * m
        if rises or not destroyed:
            why = []
            if rises:
                a, b = rises[0]
                why.append(f"robust accuracy rose from ε={a:.4g} to ε={b:.4g} by more than "
                           f"max(1, 1% of {m})")
            if not destroyed:
                why.append(f"at ε={epsilons[-1]:.4g}, which reaches any image, "
                           f"{robust[-1]} of {m} swept samples stayed unbroken (at most "
                           f"{100 * (1 - SWEEP_DESTROYED):.0f}% may)")
            warnings.append("attack unreliable on this model (ε sweep, Carlini et al. 2019): "
                            + "; ".join(why) + "; a stronger attack can only lower this "
                            "robust accuracy")
        return {"epsilons": epsilons, "robust": robust, "samples": m,
                "reliable": not rises and destroyed}

    def _white_box_details(self, records: list[AttackRecord], warnings: list[str]
                           ) -> dict[str, Any]:
        """What the card says of a white-box attack: its effort, the ε sweep, and where the
        torch copy could not be used (a warning: those samples were not attacked)."""
        attack = self.build()
        mismatched = [r for r in records if "white_box_mismatch" in r]
        if mismatched:
            warnings.append(f"{len(mismatched)} sample(s) were not attacked: "
                            f"{mismatched[0]['white_box_mismatch']}; the black-box attacks of "
                            "this threat model carry the verdict")
        grads = [int(r.get("gradients", 0)) for r in records if "gradients" in r]
        moved = [r for r in records if r.get("transfer")]
        transfer = None
        if moved:
            agree = sum(bool(r.get("surrogate_agrees")) for r in moved)
            transfer = {"attacked": len(moved), "surrogate_agrees": agree,
                        "agreement": agree / len(moved)}
            warnings.append(
                f"transfer attack: {self.attack} took its gradients from the surrogate (a local "
                f"model that gave the endpoint's answer on {agree} of {len(moved)} attacked "
                "clean images) and the endpoint judged every candidate; its breaks are real, "
                "but a sample it did not break is no evidence of robustness, so this row "
                "cannot PASS; a stronger attack can only lower this robust accuracy")
        return {"iterations": getattr(attack, "iterations", None),
                "restarts": getattr(attack, "restarts", None),
                "targets": getattr(attack, "targets", None),
                "gradients_median": statistics.median(grads) if grads else 0,
                "not_attacked": len(mismatched),
                "why_not_attacked": mismatched[0]["white_box_mismatch"] if mismatched else None,
                "judged_on": "the real model (every proposal re-queried)",
                "transfer": transfer,
                "eps_sweep": self._sweep_details(records, warnings)}

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Robust accuracy with its interval, the threat model and the binarization test."""
        m, d = result.metrics, result.details
        bound = "spatial grid" if d["norm"] == "spatial" else (
            f"l0 k={d['epsilon']:.0f} pixels" if d["norm"] == "l0" else
            f"{d['norm']} ε={d['epsilon']:.4g}")
        wb = d.get("white_box")
        effort = (("transfer from the surrogate" if wb.get("transfer") else "white-box")
                  + f", {wb['iterations']} iterations × {wb['restarts']} restart(s)"
                  + (f" × {wb['targets']} target(s)" if wb.get("targets") else "")
                  + ", judged on the model" if wb else f"≤{int(m.query_budget):,} queries")
        runs = [int(r["budget"]) for r in (d.get("convergence") or {}).get("rounds", [])]
        if not wb and len(runs) > 1:
            effort = (f"runs of {', '.join(f'{b:,}' for b in runs)} queries per sample (each "
                      "round from scratch)")
        text = (f"robust accuracy {pct(m.robust_accuracy)} (95% CI "
                f"{interval_text(result.intervals['robust_accuracy'])}) under {d['attack']} at "
                f"{bound}, {effort}")
        conv = d.get("convergence")
        if conv:
            text += (f" in {int(m.rounds)} round(s), " if conv["auto"] else ", ") + \
                ("converged" if conv["converged"] else "budget not converged")
        bt = d.get("binarization")
        if bt:
            ci = result.intervals.get("binarization_score")
            ci_text = f", 95% CI {interval_text(ci)}" if ci else ""
            hardest = bt.get("hardest_passed")
            text += (f"; binarization test {m.binarization_score:.2f}{ci_text} "
                     f"(R-ASR {m.binarization_rasr:.2f}); hardest configuration passed: "
                     f"{hardest['label'] if hardest else 'none'}")
        elif d.get("binarization_note"):
            text += "; binarization test not available for L0 threat models"
        ev = d.get("evidence")
        if ev and ev.get("stalled"):
            text += "; stalled: the model's outputs gave the attack no signal"
        if ev and ev.get("short_of_pass"):
            text += "; evidence, not a PASS on its own"
        return text

    @classmethod
    def figures(cls, result: ResultView) -> dict[str, str]:
        """Robust accuracy against queries per sample, with the rounds' totals marked."""
        from certify.figures import queries_curve_svg

        conv = result.details.get("convergence")
        if not conv or result.details.get("white_box"):
            return {}
        return {"convergence": queries_curve_svg(conv["curve"],
                                                 [r["total"] for r in conv["rounds"]])}

    def summarize(self, records: list[AttackRecord], data: Dataset) -> Measurement:
        n = len(records)
        correct = [r for r in records if r["outcome"] != "misclassified"]
        robust = sum(r["outcome"] == "robust" for r in records)
        broken = sum(r["outcome"] == "broken" for r in records)
        aq = [r["attack_queries"] for r in correct]
        rounds = max((len(r.get("round_queries", [0])) for r in correct), default=1)
        total = 0 if self.white_box() else self.total_after(rounds - 1)
        metrics: dict[str, Any] = {
            "robust_accuracy": robust / n if n else 0.0,
            "attack_success_rate": broken / len(correct) if correct else 0.0,
            "clean_accuracy": len(correct) / n if n else 0.0,
            "n": n, "n_robust": robust, "n_broken": broken,
            "queries_median": statistics.median(aq) if aq else 0,
            "queries_mean": statistics.fmean(aq) if aq else 0.0,
            "queries_max": max(aq) if aq else 0,
            "query_budget": total, "rounds": rounds,
        }
        labels_only = any(r.get("scores") == "labels" for r in records)
        if self.reports_coverage() and not labels_only:
            metrics.update(worst_case_coverage(records, lambda r: r["outcome"] == "robust"))
            first = [r | {"confidence": r["confidence_first"]} if "confidence_first" in r
                     else r for r in records]
            metrics["first_break_accuracy_at_coverage"] = worst_case_coverage(
                first, lambda r: r["outcome"] == "robust")["worst_case_accuracy_at_coverage"]
            metrics["confident_queries_total"] = sum(int(r.get("confident_queries", 0))
                                                     for r in records)
            metrics["worst_case_abstentions"] = sum(bool(r.get("abstained")) for r in records)
        intervals = {"robust_accuracy": wilson_interval(robust, n),
                     "attack_success_rate": wilson_interval(broken, len(correct))}
        details: dict[str, Any] = {
            "attack": self.attack, "norm": self._norm(), "epsilon": self._epsilon(),
            "max_queries": self.max_queries, "attack_params": self.build().params(),
            "queries_histogram": _histogram(aq, total),
            "convergence": None,
            "confident_queries": self._confident_queries(),
            "coverage_under_attack": None if self.reports_coverage() and not labels_only else
            NO_COVERAGE_UNDER_ATTACK if not labels_only else NO_COVERAGE_LABELS,
        }
        warnings: list[str] = []
        if self.white_box():
            metrics["gradient_evaluations"] = sum(int(r.get("gradients", 0)) for r in records)
            details["white_box"] = self._white_box_details(records, warnings)
        if self._norm() != "spatial":  # a grid is searched exhaustively: nothing to converge
            conv = convergence(records, rounds - 1, self.round_budget(rounds - 1))
            metrics.update(late_breaks=conv["late_breaks"], approaching=conv["approaching"])
            details["convergence"] = conv | {
                "auto": self.auto, "initial": self.initial_budget(), "cap": self.cap(),
                "rounds": [{"round": k, "budget": self.round_budget(k),
                            "total": self.total_after(k),
                            "attacked": sum(len(r.get("round_queries", [0])) > k
                                            for r in correct),
                            "broken": sum(r.get("broken_round", 0) == k
                                          for r in records if r["outcome"] == "broken")}
                           for k in range(rounds)],
                "curve": robustness_curve(records, total),
            }
            if not conv["converged"] and self.white_box():
                warnings.append(
                    f"{self.attack} not converged: {conv['late_breaks']} sample(s) first broken "
                    f"after its second-to-last step-size checkpoint or by a later restart, more "
                    f"than max(1, 1% of {n}) = {conv['allowance']:g}; a stronger attack can only "
                    "lower this robust accuracy")
            elif not conv["converged"]:
                warnings.append(_unconverged(conv, total, rounds, self.auto, self.cap(), n))
        if not self.white_box() and self._norm() != "spatial":
            details["evidence"] = self._black_box_evidence(records, rounds, metrics, warnings)
        if ATTACKS[self.attack].name == "hopskipjump":
            no_start = sum(bool(r.get("start_failed")) for r in correct)
            metrics["n_start_failed"] = no_start
            if no_start:
                warnings.append(
                    f"{self.attack} found no adversarial starting point on {no_start} of "
                    f"{len(correct)} attacked samples (uniform and coarse noise): they count as "
                    f"robust without having been attacked")
        tested = [r for r in records if r.get("bt") in ("success", "failure")]
        failed_setup = [r for r in records if r.get("bt") == "setup_failed"]
        bt = self._bt()
        if bt is not None:
            asr_n = sum(r["bt"] == "success" for r in tested)
            rasr_n = sum(bool(r["bt_rasr"]) for r in tested)
            asr = asr_n / len(tested) if tested else None
            rasr = rasr_n / len(tested) if tested else None
            sources = sorted({r.get("bt_features", "none") for r in tested + failed_setup})
            metrics.update({
                "binarization_score": asr if asr is not None else 0.0,
                "binarization_rasr": rasr if rasr is not None else 0.0,
                "binarization_tested": len(tested),
                "binarization_setup_failed": len(failed_setup),
            })
            if tested:
                intervals["binarization_score"] = wilson_interval(asr_n, len(tested))
                intervals["binarization_rasr"] = wilson_interval(rasr_n, len(tested))
            trusted = passes(asr_n, rasr_n, len(tested), PASS_SCORE, RASR_MARGIN)
            ladder, packaged, samples = bt
            rungs = ladder_scores([r for r in records if "bt_ladder" in r], len(ladder))
            for k, (cfg, rung) in enumerate(zip(ladder, rungs, strict=True)):
                rung.update(label=cfg.label(), settings=vars(cfg), packaged=k == packaged,
                            passed=passes(rung["success"], rung["rasr_success"],
                                          rung["tested"], PASS_SCORE, RASR_MARGIN,
                                          rung["rasr_tested"]))
            hardest = next((r for r in rungs if r["passed"]), None)
            details["binarization"] = {
                "settings": vars(ladder[packaged]) | {"samples": samples},
                "packaged": ladder[packaged].label(),
                "ladder": rungs,
                "hardest_passed": hardest,
                "necessary_only": NECESSARY_ONLY.get(ATTACKS[self.attack].name),
                "head": next((r["bt_head"] for r in tested + failed_setup if "bt_head" in r),
                             None),
                "rasr_queries": self.initial_budget(),
                "features": sources,
                "separation_rate": len(tested) / (len(tested) + len(failed_setup))
                if tested or failed_setup else None,
                "setup_failures": [{"id": r["id"], "reason": r.get("bt_reason", "")}
                                   for r in failed_setup][:10],
                "trusted": trusted,
                "pass_score": PASS_SCORE, "rasr_margin": RASR_MARGIN,
            }
            if not tested:
                warnings.append("the binarization test could not be set up on any sample, so "
                                "the strength of this attack is unverified")
            elif not trusted:
                assert asr is not None and rasr is not None  # tested is not empty
                why = (f"its binarization-test score {asr:.2f} is below {PASS_SCORE}"
                       if asr < PASS_SCORE else
                       f"its binarization-test score {asr:.2f} is not clearly above random "
                       f"sampling (R-ASR {rasr:.2f})")
                warnings.append(f"attack too weak to support the robust accuracy it measured: "
                                f"{why}")
        else:
            details["binarization"] = None
            if self._norm() == "l0":
                details["binarization_note"] = BT_NOT_L0
        sink = ImageSink()
        details["examples"] = gallery_examples(records, data, self._norm(), sink)
        conv_doc, evidence = details.get("convergence"), details.get("evidence")
        unsettled = None
        if (details.get("white_box") or {}).get("transfer"):
            unsettled = "a transfer attack: a stronger attack can only lower it"
        elif conv_doc and not conv_doc["converged"]:
            unsettled = "the attack has not converged: a stronger attack can only lower it"
        elif evidence and evidence["stalled"]:
            unsettled = "the attack stalled: a stronger attack can only lower it"
        settled = Settlement(
            attack_converged=None if not conv_doc else bool(conv_doc["converged"]),
            stalled=bool(evidence and evidence["stalled"]),
            binarization_failed=(details["binarization"] or {}).get("trusted") is False,
            short_of_floor=bool(evidence and evidence["short_of_pass"]))
        return Measurement(metrics=metrics, intervals=intervals, details=details,
                           warnings=warnings, images=sink.images, unsettled=unsettled,
                           settled=settled)


def convergence(records: Sequence[AttackRecord], last_round: int, last_budget: int
                ) -> dict[str, Any]:
    """Whether the latest run's budget is converged, from the merged records of every round.

    ``last_round`` is the latest round and ``last_budget`` its run's queries per sample. *Late
    breaks* are samples that run first broke in the last half of its budget. *Approaching* are
    unbroken samples whose gap to success (the margin loss of score-based attacks; the distance
    beyond ε of a minimisation attack's closest adversarial point) fell in the last half of that
    run by at least the gap left: at the same pace, as many queries again would break them.
    Converged when both together are at most max(1, :data:`CONVERGENCE_SHARE` × samples).
    """
    n = len(records)
    allowance = max(1.0, CONVERGENCE_SHARE * n)
    late = sum(1 for r in records if r["outcome"] == "broken" and (
        bool(r.get("late_break")) or (  # white-box: after the second-to-last checkpoint
            int(r.get("broken_round", 0)) == last_round and "gradients" not in r
            and int(r.get("round_queries", [r["attack_queries"]])[-1]) > last_budget / 2)))
    approaching = sum(
        1 for r in records if r["outcome"] == "robust" and "gap" in r and "half_gap" in r
        and float(r["half_gap"]) > float(r["gap"])
        and float(r["gap"]) <= float(r["half_gap"]) - float(r["gap"]))
    return {"late_breaks": late, "approaching": approaching, "allowance": allowance,
            "last_budget": last_budget, "converged": late + approaching <= allowance}


def stalled_counts(records: Sequence[AttackRecord]) -> tuple[int, int]:
    """(unbroken samples whose gap to success did not move in the last half of the latest
    run's budget, unbroken samples with a recorded gap). Score-based attacks record the
    margin loss, HopSkipJump the distance beyond ε; an unchanged gap means no candidate was
    accepted (no improvement) in that half."""
    judged = [r for r in records if r["outcome"] == "robust" and "gap" in r and "half_gap" in r]
    flat = sum(float(r["gap"]) >= float(r["half_gap"]) for r in judged)
    return flat, len(judged)


def robustness_curve(records: Sequence[AttackRecord], total: int) -> list[dict[str, float]]:
    """Robust accuracy had the attack stopped after q queries per sample, for q from 0 to
    ``total`` on a doubling grid (each round's total included)."""
    n = len(records)
    correct = sum(r["outcome"] != "misclassified" for r in records)
    at = sorted(int(r.get("broken_at", r["attack_queries"])) for r in records
                if r["outcome"] == "broken")
    qs = {0, total}
    q = 1
    while q < total:
        qs.add(q)
        q *= 2
    out = []
    for q in sorted(qs):
        broken = sum(b <= q for b in at)
        out.append({"queries": q, "robust_accuracy": (correct - broken) / n if n else 0.0})
    return out


def _unconverged(conv: dict[str, Any], total: int, rounds: int, auto: bool, cap: int,
                 n: int) -> str:
    moving = (f"{conv['late_breaks']} sample(s) first broken in the last half of the "
              f"{conv['last_budget']:,}-query run")
    if conv["approaching"]:
        moving += f" and {conv['approaching']} still being approached"
    allowed = f"more than max(1, 1% of {n}) = {conv['allowance']:g}"
    if auto:
        return (f"budget not converged at the cap: after {rounds} round(s) ({total:,} queries "
                f"per unbroken sample, the last run at the cap of {cap:,}), {moving}, "
                f"{allowed}; a stronger attack can only lower this robust accuracy")
    return (f"budget not converged: with {total:,} queries per sample, {moving}, {allowed}; "
            "a stronger attack can only lower this robust accuracy (max_queries: auto grows "
            "the budget until converged)")


def bt_head(model: Any) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[str]] | None:
    """The model's output head (the operations after its last linear layer) as a function on
    logits, and their names, for the binarization test to keep after its planted readout; None
    without a torch copy, without a head, or with a head that cannot run on its own."""
    found = white_box_of(model)
    if found is None:
        return None
    try:
        copy = found.torch_copy()
    except WhiteBoxUnavailable:
        return None
    if not copy.head:
        return None
    try:
        copy.apply_head(torch.zeros(1, 2))
    except WhiteBoxUnavailable:
        return None
    return copy.apply_head, list(copy.head)


def bt_positions(ctx: CheckContext, samples: int) -> set[int]:
    """The dataset indices that get the binarization test: ``samples`` of the check's own,
    evenly spread over its ordered selection (empty when the runner did not say which)."""
    sel = ctx.selected
    if not sel:
        return set()
    n, m = len(sel), max(1, min(samples, len(sel)))
    return {int(sel[(k * n) // m]) for k in range(m)}


def one_hot_answers(scores: torch.Tensor, output: str) -> list[bool]:
    """Per sample: did the model answer with a one-hot vector? Its binarized copy then does too.

    Footnote 3 of the paper: the binarized model mimics the original's outputs. Logits are
    never one-hot, however confident the model (a softmax of a 20-logit margin rounds to 1 in
    float32): score-based attacks read the logits, so the copy answers with logits as well.
    """
    if output != "probs":
        return [False] * len(scores)
    return (scores.float().cpu().max(dim=1).values >= 1 - 1e-6).tolist()


def _histogram(values: list[int], top: int, bins: int = 10) -> list[dict[str, int]]:
    edges = [round(top * k / bins) for k in range(bins + 1)]
    out = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        out.append({"from": lo, "to": hi,
                    "count": sum(lo < v <= hi or (lo == 0 and v == 0) for v in values)})
    return out


def keep_adversarial_images(recs: list[AttackRecord], attacked: list[int],
                            index: Sequence[int], x_adv: torch.Tensor, output: str) -> None:
    """Store the adversarial image of the batch's first :data:`GALLERY_EXAMPLES` broken samples
    (in dataset order) in their records, as a lossless 8-bit PNG (base64).

    ``attacked[k]`` is the batch position of ``x_adv[k]``; ``output`` the model's kind of
    answer (what the recorded confidence is). The image is the point the record's
    ``adv_pred`` and ``confidence`` describe, so the card's gallery comes from the records
    alone: after ``--resume``, on any executor, for the round that broke the sample.
    """
    broken = sorted((k for k, j in enumerate(attacked) if recs[j]["outcome"] == "broken"),
                    key=lambda k: int(index[attacked[k]]))
    for k in broken[:GALLERY_EXAMPLES]:
        png = png_bytes(to_uint8(x_adv[k]))
        recs[attacked[k]].update({"adv_image": base64.b64encode(png).decode("ascii"),
                                  "scores": output})


def _class_name(names: Sequence[str], c: int) -> str:
    return names[c] if 0 <= c < len(names) else str(c)


def gallery_examples(records: Sequence[AttackRecord], data: Dataset | None, norm: str,
                     sink: ImageSink) -> list[dict[str, Any]]:
    """The card's adversarial examples: the first :data:`GALLERY_EXAMPLES` broken samples (in
    sample order) whose records hold their adversarial image.

    Each example names its sample, the true and the adversarial label, the adversarial label's
    confidence and what it is (:data:`CONFIDENCE_OF`), the round that broke it, and the digests
    of three images (their pixels go to ``sink``): the original, the adversarial image and the
    perturbation made visible: for L0 the changed pixels in white on black
    (``changed_pixels`` counts them), otherwise mid-grey plus the 8-bit difference times
    ``amplification`` (the largest whole factor that keeps it within [0, 255]). Without a
    dataset (records summarised on their own) there are no originals: no examples.
    """
    if data is None:
        return []
    picked = sorted((r for r in records if r["outcome"] == "broken" and "adv_image" in r),
                    key=lambda r: int(r["i"]))
    out: list[dict[str, Any]] = []
    for r in picked:
        if len(out) == GALLERY_EXAMPLES:
            break
        original = to_uint8(data.x[int(r["i"])])
        try:
            adversarial = decode_png(base64.b64decode(r["adv_image"], validate=True))
        except (ValueError, binascii.Error):
            continue  # a damaged record shows no picture; its outcome still counts
        if adversarial.shape != original.shape:
            continue
        delta = adversarial.astype("int16") - original.astype("int16")
        ex: dict[str, Any] = {
            "id": r["id"], "index": int(r["i"]), "label": int(r["label"]),
            "label_name": _class_name(data.class_names, int(r["label"])),
            "pred": int(r["adv_pred"]),
            "pred_name": _class_name(data.class_names, int(r["adv_pred"])),
            "confidence": None if r.get("scores") == "labels" or "probability" not in r
            else float(r["probability"]),
            "confidence_of": CONFIDENCE_OF.get(str(r.get("scores")), "unknown"),
            "round": int(r.get("broken_round", 0)),
        }
        if norm == "l0":
            changed = (delta != 0).any(axis=2)
            shown = (changed[..., None] * 255).repeat(3, axis=2).astype("uint8")
            ex["changed_pixels"] = int(changed.sum())
        else:
            peak = int(abs(delta).max())
            factor = max(1, 127 // peak) if peak else 1
            shown = (128 + factor * delta).clip(0, 255).astype("uint8")
            ex["amplification"] = factor
        ex.update(original=sink.add_pixels(original), adversarial=sink.add_pixels(adversarial),
                  perturbation=sink.add_pixels(shown))
        out.append(ex)
    return out
