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

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from certify.attacks import ATTACKS, Attack, SpatialGrid, margin
from certify.attacks.binarization import (
    LADDER,
    PACKAGED,
    BinarizationSettings,
    ladder_test,
)
from certify.attacks.simple import cut_grid_message
from certify.checks import attack_verdict
from certify.checks.attack_card import (
    CONFIDENCE_OF,
    GALLERY_EXAMPLES,
    gallery_examples,
    keep_adversarial_images,
)
from certify.checks.attack_schedule import (
    AUTO_CAP_FACTOR,
    CONVERGENCE_SHARE,
    STALLED_SHARE,
    AttackRecord,
    AttackSchedule,
    convergence,
    robustness_curve,
    stalled_counts,
)
from certify.checks.attack_verdict import BT_NOT_L0, PASS_SCORE, RASR_MARGIN
from certify.checks.base import (
    Check,
    CheckContext,
    Measurement,
    Role,
)
from certify.checks.confidence import (
    confidences,
    top_probability,
)
from certify.data import Dataset
from certify.errors import ModelError, SuiteError
from certify.kinds import AttackKind
from certify.models.base import TRANSFER, WHITE_BOX, Model, ModelInfo
from certify.norms import NORMS, Norm, ThreatModel
from certify.norms import norm as norm_named
from certify.params import REQUIRED, Param, Params
from certify.validation import expect

if TYPE_CHECKING:
    import torch

#: What other modules read from here (the split into schedule, verdict and card).
__all__ = ["AUTO_CAP_FACTOR", "BT_NOT_L0", "CONFIDENCE_OF", "CONVERGENCE_SHARE",
           "GALLERY_EXAMPLES", "PASS_SCORE", "RASR_MARGIN", "STALLED_SHARE", "AttackCheck",
           "AttackRecord", "bt_head", "bt_positions", "convergence", "gallery_examples",
           "keep_adversarial_images", "one_hot_answers", "robustness_curve", "stalled_counts"]

#: Planted problems per attack by default (issue 17: at least 20).
BT_SAMPLES = 20
_BT_KEYS = {"samples", "n_inner", "n_boundary", "inner_gap", "closeness", "inner_shell"}


def _or(names: list[str]) -> str:
    """``a, b or c``."""
    return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"


#: Set by the check's own parameters; in ``attack_params`` they would disagree with the card.
_CHECK_KEYS = ("epsilon", "max_queries", "norm")
#: The ε sweep of APGD-CE (Carlini et al. 2019's sanity checks; issue 27): at most this many
#: of the check's correctly classified samples, attacked at these multiples of ε and at an ε
#: that reaches any image (L∞ 0.5; L2 the diagonal of the image cube, sqrt(C·H·W)).
SWEEP_SAMPLES = 20
SWEEP_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
#: Extra queries per broken sample that score-based attacks spend on a confident mistake.
CONFIDENT_QUERIES = 100


class AttackCheck(AttackKind, AttackSchedule, Check[AttackRecord]):
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

    #: Attacks spend thousands of queries per sample: record them in small units.
    record_batch: ClassVar[int | None] = 64

    suite_params: ClassVar[Params] = Params(
        Param("attack", str, REQUIRED, "the attack, by name (see the table of attacks)",
              choices=tuple(ATTACKS)),
        Param("epsilon", float | None, None,
              "the threat model's radius: L-infinity or L2 in [0, 1] pixel units (8/255 and 0.5 "
              "when unset), or for the L0 attack a whole number of pixels (10)",
              low=0, low_open=True),
        Param("norm", str | None, None,
              "the threat norm, for attacks that attack in several ("
              f"{_or([n.name for n in NORMS.values() if n.chosen])}); unset: the "
              "attack's first norm"),
        Param("max_queries", int | Literal["auto"], 1000,
              "queries per sample: a number is one run with that budget; auto runs rounds that "
              "double the budget until a run converges (white-box attacks: iterations are "
              "attack_params)", low=2),
        Param("initial_queries", int | None, None,
              "max_queries auto: round 0's queries per sample (unset: the attack's own initial "
              "budget)", low=2),
        Param("query_cap", int | None, None,
              "max_queries auto: the largest budget one round's run may have, at least twice "
              f"the initial budget (unset: {AUTO_CAP_FACTOR} times the initial budget)"),
        Param("attack_params", dict[str, Any] | None, None,
              "the attack's own parameters (see each attack's parameters below the table of "
              "attacks), checked against its declaration"),
        Param("binarization", dict[str, Any] | bool, True,
              "the binarization test: true (the packaged configuration), false (off), or "
              "settings: samples, n_inner, n_boundary, inner_gap, closeness, inner_shell"),
        Param("confident_queries", int | None, None,
              "score-based attacks: extra queries per broken sample spent raising the wrong "
              f"class's confidence in the same ball ({CONFIDENT_QUERIES} when unset; 0 turns "
              "it off)", low=0),
        Param("eps_sweep", bool, True,
              "white-box attacks that support it (APGD-CE): the ε sweep sanity check, on at "
              f"most {SWEEP_SAMPLES} samples at ε/4 to 4ε and an ε that reaches any image"),
    )

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
        #: ``own``: the row may have to PASS on its own, so ``max_queries: auto`` runs to the
        #: attack's query floor; ``cross_check``: a converged white-box attack of the threat
        #: model ran first, and this black-box attack is its gradient-masking cross-check,
        #: which needs a converged verdict, not its floor (the runner sets it: see
        #: :mod:`certify.engine.schedule`). Not a suite parameter.
        self.attack_role: Literal["own", "cross_check"] = "own"

    # -- configuration --------------------------------------------------------------------
    def _norm(self) -> Norm:
        return norm_named(self.norm) if self.norm else self.attack_class().default_norm()

    def _epsilon(self) -> float:
        norm = self._norm()
        return 0.0 if not norm.ball else float(
            self.epsilon if self.epsilon is not None else norm.default_epsilon)

    def score_based(self) -> bool:
        """Whether the attack reads scores (and so can raise a mistake's confidence)."""
        return bool(self.attack_class().needs_scores) and not self.white_box()

    def reports_coverage(self) -> bool:
        """Whether the worst cases carry a confidence worth ranking (accuracy at coverage under
        attack): score-based attacks (which then raise a break's confidence), white-box attacks
        (their highest-loss point) and the spatial grid (its most confident mistake of the
        whole grid); not a decision-based attack, which stops at the boundary."""
        return self.score_based() or self.white_box() or \
            self.attack_class().convergence == "exhaustive"

    def confident_budget(self) -> int:
        """Queries per broken sample spent raising its wrong class's confidence (0: none)."""
        if not self.score_based():
            return 0
        return CONFIDENT_QUERIES if self.confident_queries is None else self.confident_queries

    def threat_model(self) -> ThreatModel:
        """(norm, ε): the norm with the radius, or the spatial grid with 0."""
        return ThreatModel(self._norm(), self._epsilon())

    def build(self) -> Attack:
        """The configured attack object (this round's budget)."""
        norm, eps = self.threat_model()
        budget = self.initial_budget() if self.attack_class().convergence == "exhaustive" \
            else self.round_budget(self._round)
        return self.attack_class().configure(norm, eps, budget, dict(self.attack_params or {}))

    def binarization_ladder(self) -> tuple[tuple[BinarizationSettings, ...], int, int] | None:
        """(ladder hardest first, index of the packaged rung, samples), or None when off.

        The packaged configuration of the threat model (binarization.PACKAGED) and its ladder;
        a suite that sets hardness keys runs that one configuration alone (experiments).
        """
        if self.binarization is False or not self._norm().binarization or self.white_box():
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
        super().check_params(where)
        cls = self.attack_class()
        chosen = [n for n in NORMS.values() if n.name == self.norm and n.chosen]
        if self.norm is not None and not chosen:
            names = _or([n.name for n in NORMS.values() if n.chosen])
            raise SuiteError(f"{where}: norm must be {names}", hint="e.g. norm: linf")
        if chosen and chosen[0] not in cls.norms:
            other = [a for a, c in ATTACKS.items() if chosen[0] in c.norms
                     and c.reads() == cls.reads() and c.__mro__[1] is cls.__mro__[1]]
            raise SuiteError(f"{where}: {self.attack} works in "
                             f"{_or([n.name for n in cls.norms])}",
                             hint=f"use {other[0]} for {self.norm}" if other else
                             f"drop norm: {self.attack} attacks in {cls.default_norm()}")
        self._check_budget(where)
        self._check_values(where)
        try:
            attack = self.build()
            self.binarization_ladder()
        except TypeError as exc:
            raise SuiteError(f"{where}: {exc}", hint="check attack_params") from None
        if isinstance(attack, SpatialGrid) and attack.grid_size() > self.initial_budget():
            size = attack.grid_size()
            raise SuiteError(f"{where}: {cut_grid_message(size, self.initial_budget())}",
                             hint=f"raise max_queries to {size}, or lower rotation_steps / "
                                  f"translation_steps")

    def _check_budget(self, where: str) -> None:
        """``max_queries``, ``initial_queries`` and ``query_cap`` against the attack's kind."""
        if not self.auto and (self.initial_queries, self.query_cap) != (None, None):
            raise SuiteError(f"{where}: initial_queries and query_cap go with max_queries: auto",
                             hint="e.g. max_queries: auto, initial_queries: 1000")
        if not self.auto:
            return
        if self.white_box():
            raise SuiteError(f"{where}: {self.attack} is a white-box attack: it runs a fixed "
                             "number of iterations, not a query budget",
                             hint="drop max_queries; attack_params: {iterations: 100, "
                                  "restarts: 2} set its effort")
        if self.attack_class().convergence == "exhaustive":
            raise SuiteError(f"{where}: {self.attack} searches its grid exhaustively: "
                             "max_queries must be the grid size, not auto",
                             hint="e.g. max_queries: 538")
        if self.cap() < 2 * self.initial_budget():
            raise SuiteError(f"{where}: query_cap {self.cap()} leaves no room for a second "
                             f"round after {self.initial_budget()} queries",
                             hint=f"query_cap >= {2 * self.initial_budget()}, e.g. "
                                  f"{AUTO_CAP_FACTOR * self.initial_budget()}")

    def _check_values(self, where: str) -> None:
        """The rules that tie parameters to the attack, and the nested parameters (the
        binarization test's settings; ``attack_params`` from the attack's declaration)."""
        if self.confident_queries and not self.score_based():
            raise SuiteError(f"{where}: confident_queries applies to score-based attacks "
                             f"only; {self.attack} sees no scores",
                             hint="remove confident_queries from this check")
        if self.attack_class().default_norm().whole and self.epsilon is not None and (
                isinstance(self.epsilon, bool) or not isinstance(self.epsilon, int)):
            raise SuiteError(f"{where}: epsilon for {self.attack} is a number of pixels, a "
                             f"whole number, got {self.epsilon!r}", hint="e.g. epsilon: 8")
        if isinstance(self.binarization, dict):
            unknown = set(self.binarization) - _BT_KEYS
            if unknown:
                raise SuiteError(f"{where}: unknown binarization key(s) {sorted(unknown)}",
                                 hint=f"valid: {', '.join(sorted(_BT_KEYS))}")
            hints = typing.get_type_hints(BinarizationSettings) | {"samples": int}
            for k, v in self.binarization.items():
                expect(v, hints[k], f"{where}.params.binarization.{k}")
        if isinstance(self.attack_params, dict):
            own = [k for k in _CHECK_KEYS if k in self.attack_params]
            if own:
                raise SuiteError(f"{where}: {', '.join(own)} belong(s) in params, not in "
                                 f"params.attack_params",
                                 hint=f"e.g. params: {{{own[0]}: ...}}")
            self.attack_class().validate_params(self.attack_params,
                                                f"{where}.params.attack_params")

    def max_queries_per_sample(self) -> int:
        """The clean and judged queries of every round, every round's attack queries and the
        confident-mistake search; a white-box attack's only queries are its judgements (ε
        sweep included). The binarization test's planted problems, on a few samples, are
        bounded apart (:meth:`binarization_queries`)."""
        cls = self.attack_class()
        if self.white_box():
            return 2 + (len(SWEEP_FACTORS) + 1 if cls.eps_sweep and self.eps_sweep else 0)
        if cls.convergence == "exhaustive":
            return 2 + self.initial_budget()
        last = 0
        while self.auto and self.round_budget(last + 1) <= self.cap():
            last += 1
        return 2 * (last + 1) + self.total_after(last) + self.confident_budget()

    def binarization_queries(self) -> tuple[int, int]:
        """(samples the binarization test runs on, the most model queries it can spend on one
        of them): per rung of its ladder, the clean image and the planted problem's inner and
        boundary points (their features), the attack's budget on the binarized model and the
        random-sampling baseline's (each the attack's budget); (0, 0) when the test is off."""
        bt = self.binarization_ladder()
        if bt is None:
            return 0, 0
        ladder, _, samples = bt
        budget = max(int(getattr(self.build(), "max_queries", 0) or 0), 1)
        return samples, sum(1 + s.n_inner + s.n_boundary + 2 * budget for s in ladder)

    def gradients_per_sample(self) -> int:
        """The most gradient evaluations of the torch copy one sample can cost (white-box
        attacks; 0 for the others): every run, restart and target, and the ε sweep."""
        if not self.white_box():
            return 0
        attack = self.build()
        steps = int(getattr(attack, "iterations", 0)) + 1
        runs = int(getattr(attack, "restarts", 1)) * int(getattr(attack, "targets", 1))
        chooses = 1 if getattr(attack, "targets", None) else 0
        sweep = len(SWEEP_FACTORS) + 1 if self.attack_class().eps_sweep and self.eps_sweep \
            else 0
        return runs * steps + chooses + sweep * steps

    def produced_metrics(self, reference: bool) -> set[str]:
        """No binarization metrics when the test is off or the attack is spatial."""
        if self.binarization_ladder() is None:
            return set(self.metric_names) - {"binarization_score", "binarization_rasr"}
        return set(self.metric_names)

    def skip_reason(self, info: ModelInfo) -> str | None:
        """A score-based attack cannot run on a labels-only model: skipped, not refused."""
        if self.white_box():
            if info.white_box != WHITE_BOX and not info.white_box.startswith(TRANSFER):
                return (f"{self.attack} is a white-box attack; on {info.name} it is "
                        f"{info.white_box}; --surrogate MODEL.onnx runs it as a transfer "
                        "attack from a local model")
            need = self.attack_class().min_classes
            if info.num_classes < need:
                return (f"{self.attack}'s loss needs at least {need} classes, "
                        f"{info.name} has {info.num_classes} (apgd_ce applies)")
            return None
        if self.attack_class().needs_scores and info.output == "labels":
            return f"{self.attack} needs scores; {info.name} returns labels only"
        return None

    # -- measurement ----------------------------------------------------------------------
    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[AttackRecord]:
        import torch

        counter: Any = model
        output = counter.info.output
        scores = counter.predict(x)
        correct = (scores.argmax(1) == y).cpu()
        clean_conf = confidences(scores.cpu(), output)
        clean_prob = top_probability(scores.cpu(), output)
        rec: list[AttackRecord] = [
            {"outcome": "robust" if bool(c) else "misclassified", "label": int(t),
             "queries": 1, "attack_queries": 0, "confidence": float(cc),
             "probability": float(pp)}
            for c, t, cc, pp in zip(correct.tolist(), y.tolist(), clean_conf.tolist(),
                                    clean_prob.tolist(), strict=True)
        ]
        todo = [i for i in correct.nonzero().flatten().tolist()
                if not self._inherit(rec[i], ctx.broken_before.get(int(index[i])))]
        ci = torch.tensor(todo, dtype=torch.long)
        if len(ci) and self.white_box():
            self._white_box_batch(counter, self.build(), x, y, scores, ci, rec, index, ctx)
        elif len(ci):
            self._black_box_batch(counter, x, y, ci, rec, index, ctx)
        if ctx.abstain_class is not None:
            for r, p in zip(rec, scores.argmax(1).cpu().tolist(), strict=True):
                if int(r.get("adv_pred", p)) == ctx.abstain_class:
                    r["abstained"] = True  # an explicit abstention, not an answer
        self._binarization_batch(counter, x, y, scores, index, rec, ctx)
        return rec

    @staticmethod
    def _inherit(rec: AttackRecord, earlier: Mapping[str, Any] | None) -> bool:
        """Mark a correctly classified sample an earlier attack of the threat model broke
        (``earlier``: what that attack's record said) as broken without attacking it; False
        when there is no such attack."""
        if earlier is None:
            return False
        rec.update({"outcome": "broken", "inherited_from": str(earlier["by"]),
                    "broken_at": 0, "adv_pred": int(earlier["adv_pred"])})
        for key in ("confidence", "probability"):
            if key in earlier:
                rec[key] = float(earlier[key])
        return True

    def _black_box_batch(self, counter: Any, x: torch.Tensor, y: torch.Tensor,
                         ci: torch.Tensor, rec: list[AttackRecord], index: Sequence[int],
                         ctx: CheckContext) -> None:
        """Attack the samples ``ci`` with the query-based attack, judged on the model."""
        import torch

        output = counter.info.output
        stream = (1,) if self._round == 0 else (1, self._round)  # a new stream per round
        seeds = torch.tensor([ctx.seed(int(index[i]), *stream) for i in ci.tolist()])
        dev = x.device
        res = self.build()(counter, x[ci.to(dev)], y[ci.to(dev)], seeds, output,
                           threat=self.threat_model())
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
                    math.isfinite(float(res.half_gap[k])) and math.isfinite(float(res.gap[k])):
                rec[i]["gap"] = float(res.gap[k])
                rec[i]["half_gap"] = float(res.half_gap[k])
        x_final = self._confident_mistakes(counter, x[ci.to(dev)], x_adv, y[ci.to(dev)],
                                           adv_scores, [rec[i] for i in ci.tolist()],
                                           [int(index[i]) for i in ci.tolist()], ctx)
        keep_adversarial_images(rec, ci.tolist(), index, x_final, output)

    def _binarization_batch(self, counter: Any, x: torch.Tensor, y: torch.Tensor,
                            scores: torch.Tensor, index: Sequence[int],
                            rec: list[AttackRecord], ctx: CheckContext) -> None:
        """Round 0: the binarization test on the batch's samples among the check's tested
        positions (:func:`bt_positions`), whether or not the attack broke them."""
        bt = self.binarization_ladder() if self._round == 0 else None
        if bt is None:
            return
        output = counter.info.output
        norm, eps = self.threat_model()
        m0 = margin(scores.cpu(), y.cpu(), output)
        one_hot = one_hot_answers(scores, output)
        attack = self.build()
        ladder, packaged, samples = bt
        head = bt_head(counter)
        picked = bt_positions(ctx, samples)
        stride = max(1, math.ceil(ctx.n_samples / max(samples, 1)))
        n_tested = len(picked) if picked else math.ceil(ctx.n_samples / stride)
        for j, i in enumerate(index):
            if (int(i) not in picked) if picked else int(i) % stride:
                continue
            ctx.say_step("binarization test", n_tested)
            before = counter.queries
            fields = ladder_test(counter, x[j], attack, norm, eps, ctx.seed(int(i), 2),
                                 ladder, packaged, output, float(m0[j]), bool(one_hot[j]),
                                 head=head[0] if head else None)
            if head:
                fields["bt_head"] = list(head[1])
            rec[j].update(typing.cast(AttackRecord, fields))  # its keys are AttackRecord's
            rec[j]["queries"] += counter.queries - before

    def _white_box_batch(self, counter: Any, attack: Attack, x: torch.Tensor, y: torch.Tensor,
                         scores: torch.Tensor, ci: torch.Tensor, rec: list[AttackRecord],
                         index: Sequence[int], ctx: CheckContext) -> None:
        """Attack the correctly classified samples ``ci`` with gradients of the model's torch
        copy; the real model judges every proposal (one query per sample).

        The copy is compared with the model's own clean answers on the batch first
        (:func:`~certify.models.torchcopy.equivalence`); where it differs, no sample of the
        batch is attacked and each record says why (the check cannot pass).
        """
        import torch

        from certify.models.torchcopy import (
            WhiteBoxUnavailable,
            equivalence,
            transfer_source_of,
            white_box_of,
        )

        found = white_box_of(counter)
        transfer = found is None  # an endpoint's surrogate proposes (--surrogate)
        source = transfer_source_of(counter) if transfer else found
        if source is None:
            raise ModelError(f"{self.attack} needs the model's graph, which this run does not have",
                             hint="white-box attacks run on ONNX models; report this as a bug")
        try:
            copy = source.torch_copy()
            copy_scores = copy.scores(x)
        except WhiteBoxUnavailable as exc:  # the row ERRORs, the run goes on (issue 49)
            raise WhiteBoxUnavailable(f"{self.attack}: {exc}; the black-box attacks of the "
                                      "suite still apply") from None
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
                     threat=ThreatModel(norm, eps), judge=counter)
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
        if self.attack_class().eps_sweep and self.eps_sweep and not transfer:
            self._sweep(counter, copy, x, y, ci, rec, index, ctx)

    def sweep_epsilons(self, shape: Sequence[int]) -> list[float]:
        """The ε sweep's radii for images of ``shape`` (C, H, W), smallest first."""
        norm, eps = self.threat_model()
        top = norm.sweep_top(shape)
        return [f * eps for f in SWEEP_FACTORS if f * eps < top] + [top]

    def _sweep(self, counter: Any, copy: Any, x: torch.Tensor, y: torch.Tensor,
               ci: torch.Tensor, rec: list[AttackRecord], index: Sequence[int],
               ctx: CheckContext) -> None:
        """APGD-CE (one restart) at each radius of :meth:`sweep_epsilons` on the batch's swept
        samples (:func:`bt_positions` with :data:`SWEEP_SAMPLES`, correctly classified only),
        judged on the real model; each record keeps which radii broke it (``sweep_broken``)."""
        import torch

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
            attack = self.attack_class().configure(norm, e, 0, kw)
            attack.until_broken = True  # type: ignore[attr-defined]  # only breaks count here
            res = attack(copy, x[sel], y[sel], seeds, counter.info.output,
                         threat=ThreatModel(norm, e), judge=counter)
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
        import torch

        from certify.attacks.confident import maximise_confidence

        budget = self.confident_budget()
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


    # -- verdict and presentation ----------------------------------------------------------
    def summarize(self, records: list[AttackRecord], data: Dataset) -> Measurement:
        """The row's measurement (:func:`certify.checks.attack_verdict.summarize`)."""
        return attack_verdict.summarize(self, records, data)


def bt_head(model: Any) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[str]] | None:
    """The model's output head (the operations after its last linear layer) as a function on
    logits, and their names, for the binarization test to keep after its planted readout; None
    without a torch copy, without a head, or with a head that cannot run on its own."""
    import torch

    from certify.models.torchcopy import WhiteBoxUnavailable, white_box_of

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


def attack_of(check: Check[Any]) -> AttackCheck | None:
    """``check`` as an attack check where its role is an attack (:attr:`Role.ATTACK`), else
    ``None``: how the runner asks a check for its threat model and attack schedule."""
    return typing.cast(AttackCheck, check) if check.role is Role.ATTACK else None
