"""Corruption properties (Berghoff et al. 2021, §3.3–§4.3) and their robustness score.

A sample is *robust* to a bounded, parameterised property when the model's prediction stays
correct for every transform within the bound; the **robustness score** is the share of robust
samples among the correctly classified ones (§3.4). "Every transform" is a search, not a
sample: the check escalates its search in rounds under the attacks' convergence rule until the
robust share stops falling, within a stated query budget per sample:

- a grid property (rotation, translation, blur, ...) refines its grid: round ``r`` tries the
  points of the grid of ``steps * 2**r`` steps that earlier rounds did not (sub-pixel
  translations from round 1); a grid that cannot get finer (whole bits, a flip) is exhaustive
  after round 0;
- a property with a search design (stickers: position, angle and colour; the adaptive-
  brightness field: its 16 control points) doubles its design points per intensity level each
  round, the next points of a fixed design that covers their space ever more finely; on a
  model with a torch copy, the brightness field's control points are also searched along the
  model's gradient (:mod:`certify.checks.field_search`).

Round 0 and round 1 always run (convergence is judged across a doubling); a later round runs on
the samples still robust while the last round broke more than max(1, 1% of the evaluated
samples) and the next round fits in ``max_queries`` per sample (default: 8 times round 0's
candidates, or rounds 0-2 if more: a 2-D grid's refinements grow fourfold). A search that stops
on its budget has not converged: the check cannot PASS, and the card says so. Within a round
every candidate is tried on every searched sample, so each record keeps the weakest break (the
card's intensity curve) and the most confident mistake found (the worst case the coverage
figures read, Brown et al. 2018).

Random corruptions (Gaussian, uniform and impulse noise; ``random_linf`` and ``random_l0``,
INFO rows beside the attacks of the same bound) have no worst case within their bound: they are
decided per sample from noise draws at a stated confidence (:mod:`certify.checks.noise`), and a
pair with one of them decides it with the other transform at its searched worst case.

Threat model: natural corruptions, not adversarial ones. Queries per sample: one clean query
per round plus that round's candidates (and the gradient search's judged points), or the clean
query plus the draws.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

from certify.canonical import JSONLike
from certify.checks import noise
from certify.checks.attack import CONVERGENCE_SHARE
from certify.checks.base import (
    Check,
    CheckContext,
    Measurement,
    Settlement,
)
from certify.checks.confidence import (
    ConfidenceRecord,
    WorstSeen,
    confidences,
    top_probability,
    worst_case_coverage,
)
from certify.data import Dataset
from certify.errors import SuiteError
from certify.images import ImageSink
from certify.kinds import CorruptionKind, CorruptionPairKind
from certify.models.base import Model
from certify.norms import L0, LINF, Norm
from certify.params import REQUIRED, Param, Params
from certify.perturbations import PROPERTIES, Property
from certify.perturbations.base import RoundCandidates
from certify.stats import wilson_interval

if TYPE_CHECKING:
    import torch

Apply = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]


#: Properties renamed because they were random draws shown as if they were worst cases:
#: old name -> (new name, the attack check kind that searches the worst case in that norm).
RENAMED = {LINF.name: ("random_linf", "square_linf"), L0.name: ("random_l0", "sparse_rs")}


def _property(name: Any, where: str) -> Property:
    if isinstance(name, str) and name in RENAMED:
        new, attack = RENAMED[name]
        raise SuiteError(
            f"{where}: property {name!r} is now {new!r}: it is a random draw, not a worst case",
            hint=f"use property: {new} for random noise; the worst case in this norm is "
                 f"searched by an attack check (kind: attack, attack: {attack})")
    if name not in PROPERTIES:
        raise SuiteError(f"{where}: unknown property {name!r}",
                         hint=f"valid properties: {', '.join(PROPERTIES)}")
    return PROPERTIES[name]


def _bound_steps(prop: Property, bound: Any, steps: Any, where: str) -> tuple[float, int]:
    """The bound and steps (the property's defaults where unset); a bound beyond the
    property's largest is refused (their types and ranges are declared: :data:`PART`)."""
    b = prop.default_bound if bound is None else bound
    s = prop.default_steps if steps is None else steps
    if prop.max_bound is not None and b > prop.max_bound:
        raise SuiteError(f"{where}: bound {b} exceeds {prop.max_bound} for {prop.name}",
                         hint=f"{prop.name} is measured in {prop.unit}")
    return float(b), s


#: A property, its bound and its steps: a ``corruption`` check's first parameters, and the
#: keys of each part of a ``corruption_pair``.
PART = Params(
    Param("property", str, REQUIRED, "the corruption property (see the table of properties)"),
    Param("bound", float | None, None,
          "the largest intensity searched (or drawn, for noise), in the property's unit; "
          "unset: the property's default bound", low=0, low_open=True),
    Param("steps", int | None, None,
          "round 0's grid resolution, or for noise the intensity levels below the bound on "
          "the card's curve; unset: the property's default", low=1),
)



class CorruptionRecord(ConfidenceRecord, total=False):
    """A corruption record: label, clean prediction, the weakest break found (its intensity,
    transform parameters, prediction and seed, which regenerate it), the most confident
    mistake found (``worst_*``), and the search's rounds (queries per round, breaking round)."""

    label: int
    pred: int
    break_intensity: float
    break_params: list[float]
    break_pred: int
    break_seed: int
    worst_params: list[float]
    worst_pred: int
    worst_seed: int
    round_queries: list[int]
    broken_round: int
    clean_changed: bool
    # a random corruption's draws (issue 40): at the bound, the deciding look, the first
    # draw's failure, the correct answers among the first look's draws, one draw per level
    # below the bound
    draws: int
    failures: int
    decided_look: int
    fail0: bool
    first_correct: int
    first_draws: int
    below_failed: list[bool]
    # the gradient search over a design (adaptive_brightness on a model with a torch copy):
    # what it did ("ran", "broken", or "not run: why") and its gradient evaluations
    field_search: str
    field_search_skipped: str
    gradients: int


class PairRecord(CorruptionRecord, total=False):
    """A corruption-pair record: the joint outcome, and each property's alone."""

    outcome_first: str
    outcome_second: str
    # a pair with a random corruption: the other transform's worst point and its seed
    other_params: list[float]
    other_seed: int


CR = TypeVar("CR", bound=CorruptionRecord)

class _CorruptionBase(Check[CR]):

    def _clean(self, model: Model, x: torch.Tensor, y: torch.Tensor, ctx: CheckContext,
               flip_only: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Clean predictions, correctness, applicability, confidence (margin) and top
        probability ``[B]`` each."""
        return self._clean_scored(model, x, y, ctx, flip_only)[1:]

    def _clean_scored(self, model: Model, x: torch.Tensor, y: torch.Tensor, ctx: CheckContext,
                      flip_only: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_clean` with the clean scores ``[B, K]`` first."""
        import torch

        scores = model.predict(x)
        pred = scores.argmax(1)
        conf = confidences(scores.cpu(), model.info.output)
        prob = top_probability(scores.cpu(), model.info.output)
        correct = (pred == y).cpu()
        applicable = torch.ones_like(correct)
        if flip_only:
            allowed = torch.tensor(sorted(ctx.flip_invariant_classes), dtype=torch.long)
            applicable = torch.isin(y.cpu(), allowed)
        return scores.detach(), pred.cpu(), correct, applicable, conf, prob

    @staticmethod
    def _outcome(correct: bool, applicable: bool, broken: bool) -> str:
        if not applicable:
            return "not_applicable"
        if not correct:
            return "misclassified"
        return "broken" if broken else "robust"

    @staticmethod
    def _score(outcomes: Sequence[str]) -> tuple[int, int]:
        """(robust, evaluated) samples among these outcomes."""
        robust = sum(o == "robust" for o in outcomes)
        evaluated = sum(o in ("robust", "broken") for o in outcomes)
        return robust, evaluated


class FullSearch(NamedTuple):
    """Per sample, over every candidate tried: the first (weakest) break (-1 if none) and its
    prediction, the most confident mistake (-1 if none), its prediction, margin and top
    probability, and the least confident correct answer's margin and probability (NaN when
    the sample was not searched)."""

    first: torch.Tensor
    first_pred: torch.Tensor
    worst: torch.Tensor
    worst_pred: torch.Tensor
    worst_conf: torch.Tensor
    worst_prob: torch.Tensor
    least_conf: torch.Tensor
    least_prob: torch.Tensor
    #: the least confident correct answer's candidate, the strongest of equal margins (-1 if
    #: none: a labels-only model's margins are all equal, so its strongest candidate)
    least: torch.Tensor


def search_all(model: Model, x: torch.Tensor, y: torch.Tensor, searched: torch.Tensor,
               candidates: torch.Tensor, apply: Apply, seed_of: Callable[[int, int], int],
               index: Sequence[int]) -> FullSearch:
    """Try every candidate (weakest first) on the ``searched`` samples, keeping the first
    break and the most confident mistake (largest top-two margin of a wrong answer)."""
    import torch

    b = len(y)
    seen = WorstSeen(b)
    least = torch.full((b,), -1, dtype=torch.long)
    least_at = torch.full((b,), float("inf"))  # ties of the least margin: the later candidate
    ai = searched.cpu().nonzero().flatten()
    output = model.info.output
    xs, ys = x[ai.to(x.device)], y[ai.to(y.device)].cpu()
    for t in range(len(candidates) if len(ai) else 0):
        params = candidates[t].expand(len(ai), -1).to(x.device)
        seeds = torch.tensor([seed_of(int(index[i]), t) for i in ai.tolist()], dtype=torch.long)
        scores = model.predict(apply(xs, params, seeds)).cpu()
        pred = scores.argmax(1)
        c = confidences(scores, output)
        bad = pred != ys
        seen.update(ai, t, bad, c, pred, top_probability(scores, output))
        tie = ~bad & (c <= least_at[ai])
        least[ai[tie]] = t
        least_at[ai[tie]] = c[tie]
    seen.finish()
    return FullSearch(seen.first, seen.first_pred, seen.worst, seen.worst_pred,
                      seen.worst_conf, seen.worst_prob, seen.least_conf, seen.least_prob, least)


#: The default query budget per sample, in round 0's candidates.
BUDGET_FACTOR = 8


class Corruption(CorruptionKind, _CorruptionBase[CorruptionRecord]):
    """Robustness score of one corruption property within a bound (Berghoff et al. 2021).

    Parameters: ``property`` (see :data:`certify.perturbations.PROPERTIES`), ``bound`` (in the
    property's unit; default per property), ``steps`` (round 0's grid resolution or number of
    intensity levels), ``tries`` (round 0's draws per level for random properties),
    ``max_queries`` (the search's budget per sample, clean queries excluded; default 8 times
    round 0's candidates, or rounds 0-2 if more), ``max_examples`` (failure examples kept for
    the card's gallery).
    """


    suite_params: ClassVar[Params] = Params(
        *PART,
        Param("tries", int | None, None,
              "round 0's design points or draws per intensity level, for properties with "
              "random or designed parameters (4 when unset); refused for noise",
              low=1, high=1 << 16),
        Param("max_queries", int | None, None,
              "the search's budget per sample, clean queries excluded, at least round 0's "
              f"candidates; unset: {BUDGET_FACTOR} times round 0's candidates, or rounds 0-2 "
              "if more; refused for noise", low=1),
        Param("max_examples", int, 4, "failure examples kept for the card's gallery"),
        *(dataclasses.replace(p, meaning="random corruptions (noise): " + p.meaning)
          for p in noise.DRAW_PARAMS),
    )

    def __init__(self, property: str, bound: float | None = None, steps: int | None = None,
                 tries: int | None = None, max_queries: int | None = None,
                 max_examples: int = 4, delta: float | None = None,
                 confidence: float | None = None, max_draws: int | None = None) -> None:
        self.property = property
        self.bound = bound
        self.steps = steps
        self.tries = tries
        self.max_queries = max_queries
        self.max_examples = max_examples
        self.delta = delta
        self.confidence = confidence
        self.max_draws = max_draws
        self._round = 0

    def get_params(self) -> dict[str, Any]:
        """The parameters as the suite gave them, with ``tries`` at its default of 4 for a
        searched property (as results before issue 40 recorded it) and the random
        corruptions' ``delta``, ``confidence`` and ``max_draws`` only when given."""
        params = super().get_params()
        for k in ("delta", "confidence", "max_draws"):
            if params.get(k) is None:
                params.pop(k, None)
        if params.get("tries") is None:
            if self.property in PROPERTIES and PROPERTIES[self.property].statistical:
                params.pop("tries", None)
            else:
                params["tries"] = self._tries()
        return params

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        super().check_params(where)
        prop = _property(self.property, where)
        _bound_steps(prop, self.bound, self.steps, where)
        if prop.statistical:
            given = [k for k in ("tries", "max_queries") if getattr(self, k) is not None]
            if given:
                raise SuiteError(
                    f"{where}: {prop.name} is a random corruption, decided per sample from "
                    f"noise draws at its bound, not searched: {' and '.join(given)} no longer "
                    "apply", hint="set delta (default 0.05), confidence (default 0.99) and "
                    f"max_draws (default {noise.DEFAULT_MAX_DRAWS}) instead")
            noise.draw_plan(self.delta, self.confidence, self.max_draws, where)
            return
        given = [k for k in ("delta", "confidence", "max_draws") if getattr(self, k) is not None]
        if given:
            raise SuiteError(f"{where}: {' and '.join(given)} apply to random corruptions "
                             f"only; {prop.name} is searched for its worst case",
                             hint="use max_queries to set its search's budget")
        if self.max_queries is not None:
            first = len(self._round_candidates(0).rows)
            if self.max_queries < first:
                raise SuiteError(f"{where}: max_queries must be an integer of at least {first} "
                                 "(round 0's candidates per sample)",
                                 hint=f"e.g. max_queries: {BUDGET_FACTOR * first}, or leave it "
                                      f"out for {BUDGET_FACTOR} times round 0")

    # -- the search's rounds --------------------------------------------------------------
    def _prop(self) -> tuple[Property, float, int]:
        prop = PROPERTIES[self.property]
        bound, steps = _bound_steps(prop, self.bound, self.steps, self.kind)
        return prop, bound, steps

    def _tries(self) -> int:
        return 4 if self.tries is None else int(self.tries)

    def _round_candidates(self, r: int) -> RoundCandidates:
        prop, bound, steps = self._prop()
        return prop.round_candidates(bound, steps, self._tries(), r)

    def statistical(self) -> bool:
        """Whether the property is a random corruption decided per sample at a stated
        confidence (:mod:`certify.checks.noise`) rather than searched."""
        return PROPERTIES[self.property].statistical

    def plan(self) -> noise.DrawPlan:
        """A random corruption's draw plan (δ, confidence, draws per sample at most)."""
        return noise.draw_plan(self.delta, self.confidence, self.max_draws, self.kind)

    def plan_note(self) -> str | None:
        """A random corruption's draws per sample: its looks and the cap."""
        return self.plan().cost_note() if self.statistical() else None

    def random_norm(self) -> Norm | None:
        """The norm whose ball a random pixel property draws from (its bound the radius), or
        ``None`` for every other property."""
        return RANDOM_PIXEL_NORMS.get(self.property)

    def searched(self) -> bool:
        """Whether the check searches in rounds: random_linf and random_l0 stay one round of
        random draws (the attack of the same bound searches their worst case)."""
        return self.property not in RANDOM_PIXEL_NORMS

    def budget(self) -> int:
        """The search's queries per sample at most (clean queries excluded); for a random
        corruption its draws at the bound and one below it per lower level."""
        if self.statistical():
            prop, bound, steps = self._prop()
            return self.plan().max_draws + len(prop.lower_rows(bound, steps))
        if not self.searched():
            return len(self._round_candidates(0).rows)
        if self.max_queries is not None:
            return int(self.max_queries)
        first_three = sum(len(self._round_candidates(r).rows) for r in range(3))
        return max(BUDGET_FACTOR * len(self._round_candidates(0).rows), first_three)

    def planned(self) -> list[int]:
        """Each round's candidates per sample, as far as the budget allows (the rounds that
        may run; later rounds run only while the last one broke more than the allowance)."""
        sizes, total, r, budget = [], 0, 0, self.budget()
        while r < 64:
            n = len(self._round_candidates(r).rows)
            if n == 0 or total + n > budget:
                break
            sizes.append(n)
            total += n
            r += 1
        return sizes

    def max_queries_per_sample(self) -> int:
        """Every round that fits the budget, each with its clean query."""
        if self.statistical():
            return 1 + self.budget()
        planned = self.planned()
        extra = 0
        if PROPERTIES[self.property].gradient_design:  # the gradient search's judged points
            from certify.checks import field_search

            extra = sum(field_search.starts_in_round(r) for r in range(len(planned)))
        return sum(planned) + max(1, len(planned)) + extra

    def for_round(self, r: int) -> Corruption:
        """A copy that runs round ``r`` of the search."""
        c = copy.copy(self)
        c._round = r
        return c

    def search_state(self, records: Sequence[CorruptionRecord]) -> dict[str, Any]:
        """Where the search stands after the merged ``records``' rounds: how many rounds ran,
        what each broke, and whether it converged, is exhaustive or stopped on its budget."""
        evaluated = [r for r in records if r["outcome"] in ("robust", "broken")]
        n = len(evaluated)
        allowance = max(1.0, CONVERGENCE_SHARE * n)
        done = max((len(r.get("round_queries", [0])) for r in evaluated), default=1)
        planned = self.planned()
        rounds = []
        for k in range(done):
            rounds.append({"round": k,
                           "candidates": planned[k] if k < len(planned) else
                           len(self._round_candidates(k).rows),
                           "searched": sum(len(r.get("round_queries", [0])) > k
                                           for r in evaluated),
                           "broken": sum(int(r.get("broken_round", 0)) == k
                                         for r in evaluated if r["outcome"] == "broken")})
        late = rounds[-1]["broken"] if done > 1 else None
        robust_left = any(r["outcome"] == "robust" for r in evaluated)
        nxt = len(self._round_candidates(done).rows)
        spent = sum(x["candidates"] for x in rounds)
        if not self.searched():
            why, ok = ("a random draw, not searched: the attack at the same bound searches the "
                       "worst case"), False
        elif n == 0:
            why, ok = "nothing to search: no sample was classified correctly", True
        elif not robust_left:
            why, ok = "every evaluated sample broke: no search can lower the score", True
        elif done > 1 and late is not None and late <= allowance:
            why, ok = (f"converged: round {done - 1} broke {late} more sample(s), at most "
                       f"max(1, 1% of {n}) = {allowance:g}"), True
        elif nxt == 0:
            why, ok = "exhaustive: the grid cannot get finer, every point of it was tried", True
        else:
            ok = False
            why = (f"not converged: round {done - 1} broke {late} more sample(s), more than "
                   f"max(1, 1% of {n}) = {allowance:g}, and the next round's {nxt:,} "
                   f"candidates would pass the budget of {self.budget():,} queries per sample"
                   if late is not None else
                   f"not converged: round 1's {nxt:,} candidates would pass the budget of "
                   f"{self.budget():,} queries per sample, so convergence was not judged "
                   "across a doubling")
        return {"rounds": rounds, "converged": ok, "searched": self.searched(), "why": why,
                "late_breaks": late or 0, "allowance": allowance, "budget": self.budget(),
                "spent": spent, "evaluated": n}

    def next_round(self, records: dict[int, CorruptionRecord], done: int
                   ) -> tuple[Corruption, list[int]] | None:
        """Round ``done + 1`` on the samples still robust, unless the search converged, is
        exhaustive, or the round would pass the budget (see :meth:`search_state`)."""
        if self.statistical():
            return None  # decided per sample inside its batch (sequential draws)
        rows = list(records.values())
        todo = sorted(i for i, r in records.items() if r["outcome"] == "robust")
        if not todo:
            return None
        evaluated = sum(r["outcome"] in ("robust", "broken") for r in rows)
        late = sum(int(r.get("broken_round", 0)) == done for r in rows
                   if r["outcome"] == "broken")
        if done >= 1 and late <= max(1.0, CONVERGENCE_SHARE * evaluated):
            return None
        planned = self.planned()
        if done + 1 >= len(planned):
            return None  # exhaustive, or past the budget (search_state says which)
        return self.for_round(done + 1), todo

    def merge_round(self, records: dict[int, CorruptionRecord], new: dict[int, CorruptionRecord],
                    r: int) -> dict[int, CorruptionRecord]:
        """Fold round ``r``'s records in: queries add up; a break found now replaces the
        robust record's worst case; a clean answer that changed between rounds (a randomised
        model) is a break."""
        out = dict(records)
        for i, rec in new.items():
            old = out[i]
            merged = typing.cast(CorruptionRecord, dict(old))
            merged["round_queries"] = [*old.get("round_queries", [int(old["queries"])]),
                                       int(rec["queries"])]
            merged["queries"] = int(old["queries"]) + int(rec["queries"])
            if "gradients" in rec or "gradients" in old:
                merged["gradients"] = int(old.get("gradients", 0)) + int(rec.get("gradients", 0))
            if "field_search" in rec:  # a later round's "not run" keeps what ran before
                ran = str(old.get("field_search", "")) in ("ran", "broken")
                if rec["field_search"] in ("ran", "broken") or not ran:
                    merged["field_search"] = rec["field_search"]
                else:
                    merged["field_search_skipped"] = str(rec["field_search"])
            if rec["outcome"] == "broken":
                for k in ("outcome", "confidence", "probability", "abstained", "break_intensity",
                          "break_params", "break_pred", "break_seed", "worst_params",
                          "worst_pred", "worst_seed"):
                    if k in rec:
                        merged[k] = rec[k]
                merged["broken_round"] = r
            elif rec["outcome"] == "misclassified":
                merged.update({"outcome": "broken", "clean_changed": True, "broken_round": r,
                               "confidence": rec["confidence"], "break_pred": rec["pred"],
                               "break_intensity": 0.0, "break_params": [],
                               "break_seed": 0})
            elif rec["outcome"] == "robust" and rec["confidence"] < old["confidence"]:
                merged["confidence"] = rec["confidence"]  # the least confident correct answer
                if "probability" in rec:
                    merged["probability"] = rec["probability"]
            out[i] = merged
        return out

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[CorruptionRecord]:
        prop = self._prop()[0]
        if prop.statistical:
            return self._run_draws(model, x, y, index, ctx)
        cands = self._round_candidates(self._round)
        scores, pred, correct, applicable, clean_conf, clean_prob = self._clean_scored(
            model, x, y, ctx, prop.name == "flip")
        keys = cands.keys.tolist()

        def seed_of(i: int, t: int) -> int:
            return ctx.seed(i, keys[t])

        found = search_all(model, x, y, correct & applicable, cands.rows, prop.apply, seed_of,
                           index)
        n_cand = len(cands.rows)
        grad = self._field_search(model, x, y, scores, index, ctx,
                                  correct & applicable & (found.first < 0), cands,
                                  found) if prop.gradient_design else None
        out = []
        for j, i in enumerate(index):
            searched = bool(correct[j]) and bool(applicable[j])
            t, w = int(found.first[j]), int(found.worst[j])
            rec: CorruptionRecord = {
                "outcome": self._outcome(bool(correct[j]), bool(applicable[j]), t >= 0),
                "label": int(y[j]), "pred": int(pred[j]),
                "queries": 1 + (n_cand if searched else 0),
            }
            if w >= 0:
                rec.update({"confidence": float(found.worst_conf[j]),
                            "probability": float(found.worst_prob[j])})
            elif searched and not bool(found.least_conf[j].isnan()):
                rec.update({"confidence": min(float(found.least_conf[j]), float(clean_conf[j])),
                            "probability": float(found.least_prob[j])
                            if float(found.least_conf[j]) < float(clean_conf[j])
                            else float(clean_prob[j])})
            else:
                rec.update({"confidence": float(clean_conf[j]),
                            "probability": float(clean_prob[j])})
            worst_pred = int(found.worst_pred[j]) if w >= 0 else int(pred[j])
            if ctx.abstain_class is not None and ctx.abstain_class == worst_pred:
                rec["abstained"] = True  # worst case: an explicit abstention
            if t >= 0:
                rec.update({"break_intensity": float(cands.intensity[t]),
                            "break_params": [float(v) for v in cands.rows[t]],
                            "break_pred": int(found.first_pred[j]),
                            "break_seed": seed_of(int(i), t),
                            "worst_params": [float(v) for v in cands.rows[w]],
                            "worst_pred": int(found.worst_pred[j]),
                            "worst_seed": seed_of(int(i), w)})
                if self._round:
                    rec["broken_round"] = self._round
            if grad is not None and searched:
                self._fold_field(rec, grad, j, ctx)
            out.append(rec)
        return out

    def _field_search(self, model: Model, x: torch.Tensor, y: torch.Tensor,
                      scores: torch.Tensor, index: Sequence[int], ctx: CheckContext,
                      todo: torch.Tensor,
                      cands: RoundCandidates, found: FullSearch
                      ) -> tuple[dict[int, tuple[bool, list[float], int, float, float]], int,
                                 dict[int, str]]:
        """The gradient search over the design parameters on the samples ``todo`` (still
        robust after this round's design points), from :func:`field_search.starts_in_round`
        starts each (:mod:`certify.checks.field_search`). Returns per batch row (broken,
        params, prediction, margin, probability), the starts per sample, and per batch row
        why the search did not run there."""
        import torch

        from certify.checks import field_search
        from certify.models.torchcopy import WhiteBoxUnavailable

        prop, bound, _ = self._prop()
        starts = field_search.starts_in_round(self._round)
        rows = todo.nonzero().flatten().tolist()
        if not rows:
            return {}, starts, {}
        whys = field_search.unavailable(model, x[torch.tensor(rows).to(x.device)],
                                        scores[torch.tensor(rows).to(scores.device)])
        skipped = {j: w for j, w in zip(rows, whys, strict=True) if w is not None}
        rows = [j for j in rows if j not in skipped]
        if not rows:
            return {}, starts, skipped
        at = torch.tensor(rows, dtype=torch.long)
        first = cands.rows[found.least[at].clamp(min=0)][:, 1:]
        seeds = [ctx.seed(int(index[j]), 0xF1E1D, self._round) for j in rows]
        dev = x.device
        try:
            res = field_search.search_field(model, prop.apply, x[at.to(dev)], y[at.to(dev)],
                                            bound, first, seeds, starts, model.info.output)
        except WhiteBoxUnavailable as exc:  # an operation failed on the gradient's path
            return {}, starts, {**skipped, **{j: f"the torch copy failed: {exc}" for j in rows}}
        per = {j: (res.broken[k], res.params[k], res.pred[k], res.conf[k], res.prob[k])
               for k, j in enumerate(rows)}
        return per, starts, skipped

    def _fold_field(self, rec: CorruptionRecord,
                    grad: tuple[dict[int, tuple[bool, list[float], int, float, float]], int,
                                dict[int, str]], j: int, ctx: CheckContext) -> None:
        """Fold the gradient search's finding for batch row ``j`` into its record."""
        from certify.checks import field_search

        per, starts, skipped = grad
        if j in skipped:
            rec["field_search"] = f"not run: {skipped[j]}"
            return
        if j not in per:
            return
        broken, params, pred, conf, prob = per[j]
        rec["queries"] += starts
        rec["gradients"] = starts * field_search.STEPS
        rec["field_search"] = "broken" if broken else "ran"
        if broken:
            _, bound, _ = self._prop()
            rec.update({"outcome": "broken", "confidence": conf, "probability": prob,
                        "break_intensity": float(bound), "break_params": params,
                        "break_pred": pred, "break_seed": 0, "worst_params": params,
                        "worst_pred": pred, "worst_seed": 0})
            rec.pop("abstained", None)
            if ctx.abstain_class is not None and ctx.abstain_class == pred:
                rec["abstained"] = True
            if self._round:
                rec["broken_round"] = self._round
        elif conf < rec["confidence"]:
            rec["confidence"], rec["probability"] = conf, prob

    # -- random corruptions: decided per sample from sequential draws (issue 40) -------------
    def _run_draws(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                   ctx: CheckContext) -> list[CorruptionRecord]:
        import torch

        prop, bound, steps = self._prop()
        plan = self.plan()
        top, lower = prop.bound_rows(bound, steps), prop.lower_rows(bound, steps)
        below = _levels_of(prop, lower)
        pred, correct, _, clean_conf, clean_prob = self._clean(model, x, y, ctx, False)
        ids = [int(i) for i in index]

        ids_t = torch.tensor(ids, dtype=torch.long)

        def at_bound(rows: torch.Tensor, ts: torch.Tensor) -> torch.Tensor:
            # draw t of sample i uses the bound's row (t + i) mod R (random_linf: inside the
            # ball and on its corners, alternately)
            who = ids_t[rows]
            params = top[(ts + who) % len(top)]
            seeds = noise.seeds_at_bound(ctx, who.tolist(), ts.tolist())
            return prop.apply(x[rows.to(x.device)], params.to(x.device), seeds)

        def at_level(rows: torch.Tensor, lvs: torch.Tensor) -> torch.Tensor:
            who = ids_t[rows]
            params = torch.stack([below[a][i % len(below[a])]
                                  for i, a in zip(who.tolist(), lvs.tolist(), strict=True)])
            seeds = noise.seeds_below(ctx, who.tolist(), lvs.tolist())
            return prop.apply(x[rows.to(x.device)], params.to(x.device), seeds)

        everyone = torch.ones(len(y), dtype=torch.bool)
        drawn = noise.sequential_draws(model, y, correct, everyone, at_bound, plan,
                                       x[0].numel() * x.element_size())
        ci = correct.nonzero().flatten().tolist()
        curve = noise.level_failures(model, y, ci, at_level, len(below))
        below_of = dict(zip(ci, curve, strict=True))
        out = []
        for j, i in enumerate(ids):
            c = bool(correct[j])
            decision = drawn.decision[j]
            outcome = ("misclassified" if not c else "robust" if decision == "robust"
                       else "broken" if decision == "not_robust" else "undecided")
            rec: CorruptionRecord = {
                "outcome": outcome, "label": int(y[j]), "pred": int(pred[j]),
                "queries": 1 + drawn.draws[j] + len(below_of.get(j, [])),
                "draws": drawn.draws[j], "failures": drawn.failures[j],
                "first_correct": drawn.first_correct[j],
                "first_draws": min(drawn.draws[j], plan.test.looks[0]),
            }
            if c:
                rec.update({"decided_look": drawn.look[j], "fail0": drawn.fail0[j],
                            "below_failed": below_of[j]})
            w = drawn.worst[j]
            if c and w >= 0:  # the most confident mistake among the draws
                rec.update({"confidence": drawn.worst_conf[j],
                            "probability": drawn.worst_prob[j]})
            elif c and not math.isnan(drawn.least_conf[j]) and \
                    drawn.least_conf[j] < float(clean_conf[j]):
                rec.update({"confidence": drawn.least_conf[j],
                            "probability": drawn.least_prob[j]})
            else:
                rec.update({"confidence": float(clean_conf[j]),
                            "probability": float(clean_prob[j])})
            worst_pred = drawn.worst_pred[j] if c and w >= 0 else int(pred[j])
            if ctx.abstain_class is not None and ctx.abstain_class == worst_pred:
                rec["abstained"] = True
            t = drawn.first_fail[j]
            if c and t >= 0:  # the first failing draw regenerates the gallery's example
                rec.update({"break_intensity": float(bound),
                            "break_params": [float(v) for v in top[(t + i) % len(top)]],
                            "break_pred": drawn.first_pred[j],
                            "break_seed": noise.seed_at_bound(ctx, i, t),
                            "worst_params": [float(v) for v in top[(w + i) % len(top)]],
                            "worst_pred": drawn.worst_pred[j],
                            "worst_seed": noise.seed_at_bound(ctx, i, w)})
            out.append(rec)
        return out

    def _summarize_draws(self, records: list[CorruptionRecord], data: Dataset) -> Measurement:
        prop, bound, steps = self._prop()
        plan = self.plan()
        sink = ImageSink()
        robust = sum(r["outcome"] == "robust" for r in records)
        broken = sum(r["outcome"] == "broken" for r in records)
        undecided = sum(r["outcome"] == "undecided" for r in records)
        n = robust + broken + undecided
        searched = [r for r in records if r["outcome"] in ("robust", "broken", "undecided")]
        levels = [float(prop.intensity(g[:1].double())[0])
                  for g in _levels_of(prop, prop.lower_rows(bound, steps))]
        curve = noise.failure_curve(
            [*levels, bound],
            [[*r.get("below_failed", []), bool(r.get("fail0"))] for r in searched],
            plan.confidence)
        acc, acc_iv = noise.mean_accuracy([int(r.get("first_correct", 0)) for r in records],
                                          [int(r.get("first_draws", 0)) for r in records])
        draws = [int(r.get("draws", 0)) for r in searched]
        unsettled = None
        if undecided:
            unsettled = (f"{undecided} sample(s) still undecided at the cap of "
                         f"{plan.max_draws:,} noise draws each count on both sides of the "
                         "interval: a larger cap (max_draws) decides "
                         "them, more samples narrow it")
        # examples: the first failing draw of the samples shown not robust
        shown = [r for r in records if r["outcome"] == "broken"]
        details: dict[str, JSONLike] = {
            "property": prop.name, "family": prop.family, "description": prop.description,
            "unit": prop.unit, "param_names": [*prop.params, *prop.design_params],
            "bound": bound, "search": "statistical",
            "statistical": {**plan.to_details(), "robust": robust, "not_robust": broken,
                            "undecided": undecided, "evaluated": n,
                            "draws": sum(draws), "most_draws": max(draws, default=0),
                            "decided_by_look": [sum(int(r.get("decided_look", -1)) == k
                                                    for r in searched)
                                                for k in range(len(plan.test.looks))]},
            "reading": plan.reading(),
            "curve": curve,
            "examples": self._examples(prop.apply, shown, data, sink),
            "method": ("4: random corruption decided per sample at the bound by sequential "
                       f"exact binomial tests (delta {plan.delta:g}, confidence "
                       f"{plan.confidence:g}, looks {list(plan.test.looks)} up to the cap); "
                       "undecided samples on both sides of the interval"),
        }
        return Measurement(
            metrics={
                "robustness_score": robust / n if n else 0.0,
                # each record's worst case is its most confident mistake among the draws, if
                # any: right only where no draw failed
                **worst_case_coverage(records, lambda r: r["outcome"] == "robust"
                                      and not r.get("failures")),
                "n_evaluated": n, "n_robust": robust, "n_undecided": undecided,
                "n_misclassified": sum(r["outcome"] == "misclassified" for r in records),
                "n_not_applicable": 0,
                "candidates": max(draws, default=0) + len(levels),
                "mean_accuracy_under_noise": acc,
                "delta": plan.delta, "confidence": plan.confidence,
                "mean_draws": sum(draws) / len(draws) if draws else 0.0,
            },
            intervals={"robustness_score": noise.share_interval(robust, undecided, n),
                       "mean_accuracy_under_noise": acc_iv},
            details=details,
            images=sink.images,
            unsettled=unsettled,
            settled=Settlement(random_draw=not self.searched(), statistical=True),
        )

    def summarize(self, records: list[CorruptionRecord], data: Dataset) -> Measurement:
        prop, bound, _ = self._prop()
        if prop.statistical:
            return self._summarize_draws(records, data)
        sink = ImageSink()
        robust, evaluated = self._score([r["outcome"] for r in records])
        state = self.search_state(records)
        levels = sorted({0.0, *(float(r["break_intensity"]) for r in records
                                if r["outcome"] == "broken" and "break_intensity" in r),
                         *(float(v) for v in self._round_candidates(0).intensity.tolist())})
        broken = [float(r.get("break_intensity", 0.0)) for r in records
                  if r["outcome"] == "broken"]
        curve = [
            {"intensity": lv, "score": (evaluated - sum(b <= lv + 1e-12 for b in broken))
             / evaluated if evaluated else None}
            for lv in levels
        ]
        warnings: list[str] = []
        unsettled = None
        reading = ("worst case within the bound (searched, converged)" if state["converged"]
                   else "worst case (search not converged)")
        if not state["converged"] and self.searched():
            warnings.append(f"{prop.name}: the search {state['why']}; a stronger search can only "
                            "lower this robustness score, so it cannot PASS")
            unsettled = "the search has not converged: a stronger search can only lower it"
        field = self._field_summary(records) if prop.gradient_design else None
        if field is not None and field["samples_not_run"] and not field["no_graph"]:
            # the model has a graph, but the copy could not search some samples: a search
            # certify should have run is missing, so the row cannot PASS
            warnings.append(f"{prop.name}: the gradient search over the field did not run on "
                            f"{field['samples_not_run']} sample(s) ("
                            f"{'; '.join(str(w) for w in typing.cast(list[str], field['not_run']))}"
                            "): there, only the design search stands, which misses fields it "
                            "does not visit")
        changed = sum(bool(r.get("clean_changed")) for r in records)
        if changed:
            warnings.append(f"{changed} sample(s) changed their clean answer between search "
                            "rounds (a randomised model?): counted as broken")
        return Measurement(
            metrics={
                "robustness_score": robust / evaluated if evaluated else 0.0,
                **worst_case_coverage(records, lambda r: r["outcome"] == "robust"),
                "n_evaluated": evaluated,
                "n_robust": robust,
                "n_misclassified": sum(r["outcome"] == "misclassified" for r in records),
                "n_not_applicable": sum(r["outcome"] == "not_applicable" for r in records),
                "candidates": state["spent"],
                "rounds": len(state["rounds"]),
                "late_breaks": state["late_breaks"],
            },
            intervals={"robustness_score": wilson_interval(robust, evaluated)},
            details={
                "property": prop.name,
                "family": prop.family,
                "description": prop.description,
                "unit": prop.unit,
                "param_names": [*prop.params, *prop.design_params],
                "bound": bound,
                "search": ("design" if prop.design is not None else "random") if prop.random
                else "grid",
                "search_rounds": state,
                "reading": reading,
                **({"gradient_search": field,
                    "method": "4: searched in rounds under the convergence rule, the design "
                              "points with a gradient search over them where the model has a "
                              "graph; worst case the most confident mistake"}
                   if field is not None else {}),
                "curve": curve,
                "examples": self._examples(prop.apply, records, data, sink),
            },
            warnings=warnings,
            images=sink.images,
            unsettled=unsettled,
            settled=Settlement(random_draw=not self.searched(),
                               search_converged=bool(state["converged"]) if self.searched()
                               else None),
        )

    @staticmethod
    def _field_summary(records: list[CorruptionRecord]) -> dict[str, JSONLike]:
        """What the gradient search over the design did: samples it searched and broke,
        gradient evaluations, and why it did not run where it did not."""
        from certify.checks import field_search

        ran = [r for r in records if r.get("field_search") in ("ran", "broken")]
        notes = [str(r.get(k, "")) for r in records
                 for k in ("field_search", "field_search_skipped")]
        skipped = sorted({n[len("not run: "):] for n in notes if n.startswith("not run: ")})
        rounds = max((len(r.get("round_queries", [0])) for r in ran), default=1)
        missed = sum(any(str(r.get(k, "")).startswith("not run: ")
                         for k in ("field_search", "field_search_skipped")) for r in records)
        return {"searched": len(ran), "broken": sum(r["field_search"] == "broken" for r in ran),
                "gradients": sum(int(r.get("gradients", 0)) for r in records),
                "steps": field_search.STEPS,
                "starts": [field_search.starts_in_round(k) for k in range(rounds)],
                "not_run": skipped, "samples_not_run": missed,
                "no_graph": skipped == [field_search.NO_GRAPH]}

    def _examples(self, apply: Apply, records: list[CorruptionRecord], data: Dataset,
                  sink: ImageSink) -> list[dict[str, Any]]:
        """Regenerate the weakest breaking transforms for the gallery (deterministic).

        Each example keeps what regenerates it (sample, parameters, seed) and the digests of
        its two images; the pixels go to ``sink``.
        """
        import torch

        broken = sorted((r for r in records if r["outcome"] == "broken"
                         and r.get("break_params")),
                        key=lambda r: (r["break_intensity"], r["i"]))[: self.max_examples]
        names = data.class_names
        out = []
        for r in broken:
            x = data.x[r["i"] : r["i"] + 1]
            xt = apply(x, torch.tensor([r["break_params"]], dtype=torch.float32),
                       torch.tensor([r["break_seed"]], dtype=torch.long))
            out.append({
                "id": r["id"], "label": r["label"], "label_name": names[r["label"]],
                "pred": r["break_pred"], "pred_name": names[r["break_pred"]]
                if 0 <= r["break_pred"] < len(names) else str(r["break_pred"]),
                "intensity": r["break_intensity"], "params": r["break_params"],
                "seed": r["break_seed"], "index": r["i"],
                "original": sink.add(x[0]), "perturbed": sink.add(xt[0]),
            })
        return out


class CorruptionPair(CorruptionPairKind, _CorruptionBase[PairRecord]):
    """Two properties combined over their joint parameter space (Berghoff et al. 2021, §4.3).

    ``first`` and ``second`` are ``{property, bound, steps}`` mappings. Reports the joint
    robustness score, each property's own score on the same grids, and the change against the
    weaker of the two (negative: the combination finds failures neither finds alone).
    """


    suite_params: ClassVar[Params] = Params(
        Param("first", dict[str, Any], REQUIRED,
              "the first property, a mapping {property, bound, steps} (as a corruption check's; "
              "bound and steps default to the property's); flip cannot be combined"),
        Param("second", dict[str, Any], REQUIRED,
              "the second property, as first; at most one of the two may be noise"),
        Param("tries", int, 2, "draws per intensity level for properties with random "
                               "parameters", low=1),
        Param("max_examples", int, 4, "failure examples kept for the card's gallery"),
        *(dataclasses.replace(p, meaning="pairs with noise: " + p.meaning)
          for p in noise.DRAW_PARAMS),
    )

    def __init__(self, first: dict[str, Any], second: dict[str, Any], tries: int = 2,
                 max_examples: int = 4, delta: float | None = None,
                 confidence: float | None = None, max_draws: int | None = None) -> None:
        self.first = first
        self.second = second
        self.tries = tries
        self.max_examples = max_examples
        self.delta = delta
        self.confidence = confidence
        self.max_draws = max_draws

    def _spec(self, part: dict[str, Any], where: str) -> tuple[Property, float, int]:
        PART.refuse_unknown(part, where, "a part of a corruption_pair")
        PART.validate(part, where)
        prop = _property(part.get("property"), where)
        if prop.name == "flip":
            raise SuiteError(f"{where}: flip cannot be combined", hint="test flip on its own")
        b, s = _bound_steps(prop, part.get("bound"), part.get("steps"), where)
        return prop, b, s

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        super().check_params(where)
        pa = self._spec(self.first, f"{where}.params.first")[0]
        pb = self._spec(self.second, f"{where}.params.second")[0]
        if pa.statistical and pb.statistical:
            raise SuiteError(f"{where}: {pa.name} and {pb.name} are both random corruptions; "
                             "a pair decides one of them by draws with the other at its "
                             "searched worst case", hint="pair a random corruption with a "
                             "bounded transform (blur, rotation, ...)")
        if pa.statistical or pb.statistical:
            noise.draw_plan(self.delta, self.confidence, self.max_draws, where)
        else:
            given = [k for k in ("delta", "confidence", "max_draws")
                     if getattr(self, k) is not None]
            if given:
                raise SuiteError(f"{where}: {' and '.join(given)} apply to pairs with a random "
                                 "corruption only", hint="leave them out for two bounded "
                                 "transforms, which are searched over their joint grid")

    def max_queries_per_sample(self) -> int:
        """The clean query, the grids, and with a random corruption both draw budgets."""
        if self.statistical():
            _, _, _, gp, gbound, gsteps, _ = self._parts()
            plan = noise.draw_plan(self.delta, self.confidence, self.max_draws, self.kind)
            return 1 + len(gp.candidates(gbound, gsteps, self.tries)[0]) + 2 * plan.max_draws
        g = self._grids()
        return 1 + len(g["ra"]) + len(g["rb"]) + len(g["joint"])

    def plan_note(self) -> str | None:
        """With a random corruption: its draws per sample, taken twice (alone and with the
        other transform at its worst point)."""
        if not self.statistical():
            return None
        plan = noise.draw_plan(self.delta, self.confidence, self.max_draws, self.kind)
        return f"twice (alone and with the other transform), {plan.cost_note()}"

    def statistical(self) -> bool:
        """Whether one part is a random corruption (the pair is then decided by draws)."""
        return (PROPERTIES[self._spec(self.first, "first")[0].name].statistical
                or PROPERTIES[self._spec(self.second, "second")[0].name].statistical)

    def _grids(self) -> dict[str, Any]:
        import torch

        pa, ba, sa = self._spec(self.first, "first")
        pb, bb, sb = self._spec(self.second, "second")
        ra, ia, _ = pa.candidates(ba, sa, self.tries)
        rb, ib, _ = pb.candidates(bb, sb, self.tries)
        na, nb = len(pa.params), len(pb.params)
        za, zb = torch.zeros(1, na), torch.zeros(1, nb)
        fa, fb = torch.cat([za, ra]), torch.cat([zb, rb])
        ja = torch.cat([torch.zeros(1, dtype=ia.dtype), ia]) / ba
        jb = torch.cat([torch.zeros(1, dtype=ib.dtype), ib]) / bb
        pairs = [(i, j) for i in range(len(fa)) for j in range(len(fb)) if i and j]
        pairs.sort(key=lambda ij: (float(max(ja[ij[0]], jb[ij[1]])), ij))
        joint = torch.stack([torch.cat([fa[i], fb[j]]) for i, j in pairs]) if pairs else \
            torch.zeros(0, na + nb)

        def apply(x: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
            return pb.apply(pa.apply(x, p[:, :na], seeds), p[:, na:], seeds ^ 0x5EED)

        return {"a": pa, "b": pb, "ra": ra, "rb": rb, "joint": joint, "apply": apply,
                "na": na, "nb": nb}

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[PairRecord]:
        if self.statistical():
            return self._run_draws(model, x, y, index, ctx)
        g = self._grids()
        pred, correct, _, clean_conf, _ = self._clean(model, x, y, ctx, False)
        # every part is searched whole on every correct sample, so that the worst case is the
        # most confident mistake of all three grids
        ra = search_all(model, x, y, correct, g["ra"], g["a"].apply,
                        lambda i, t: ctx.seed(i, 1, t), index)
        rb = search_all(model, x, y, correct, g["rb"], g["b"].apply,
                        lambda i, t: ctx.seed(i, 2, t), index)
        rj = search_all(model, x, y, correct, g["joint"], g["apply"],
                        lambda i, t: ctx.seed(i, 3, t), index)
        ba, bb, bj = ra.first, rb.first, rj.first
        n_all = len(g["ra"]) + len(g["rb"]) + len(g["joint"])
        out = []
        for j, i in enumerate(index):
            c = bool(correct[j])
            joint_broken = (ba[j] >= 0) or (bb[j] >= 0) or (bj[j] >= 0)
            rec: PairRecord = {
                "outcome": self._outcome(c, True, bool(joint_broken)),
                "outcome_first": self._outcome(c, True, bool(ba[j] >= 0)),
                "outcome_second": self._outcome(c, True, bool(bb[j] >= 0)),
                "label": int(y[j]), "pred": int(pred[j]),
                "queries": 1 + (n_all if c else 0),
                "confidence": float(clean_conf[j]),
            }
            parts = [p for p in (ra, rb, rj) if int(p.worst[j]) >= 0]
            worst_pred = int(pred[j])
            if parts:  # the most confident mistake of the three grids
                top = max(parts, key=lambda p: float(p.worst_conf[j]))
                rec["confidence"] = float(top.worst_conf[j])
                worst_pred = int(top.worst_pred[j])
            elif c:  # the least confident correct answer
                seen = [float(p.least_conf[j]) for p in (ra, rb, rj)
                        if not bool(p.least_conf[j].isnan())]
                rec["confidence"] = min([float(clean_conf[j]), *seen])
            if ctx.abstain_class is not None and worst_pred == ctx.abstain_class:
                rec["abstained"] = True
            t = int(bj[j])
            if t >= 0 and ba[j] < 0 and bb[j] < 0:  # only the combination breaks it
                rec.update({"break_params": [float(v) for v in g["joint"][t]],
                            "break_pred": int(rj.first_pred[j]),
                            "break_seed": ctx.seed(int(i), 3, t)})
            out.append(rec)
        return out

    # -- a pair with a random corruption (issue 40) ---------------------------------------------
    def _parts(self) -> tuple[Property, float, int, Property, float, int, bool]:
        """(noise, its bound and steps, the other transform, its bound and steps, whether the
        noise is the first part)."""
        pa, ba, sa = self._spec(self.first, "first")
        pb, bb, sb = self._spec(self.second, "second")
        if pa.statistical:
            return pa, ba, sa, pb, bb, sb, True
        return pb, bb, sb, pa, ba, sa, False

    def _run_draws(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                   ctx: CheckContext) -> list[PairRecord]:
        """The other transform searched over its grid alone; the noise decided alone and on
        top of the other transform at its searched worst case (the grid point with the
        smallest margin), both by sequential draws at the noise's bound."""
        import torch

        sp, sbound, ssteps, gp, gbound, gsteps, noise_first = self._parts()
        plan = noise.draw_plan(self.delta, self.confidence, self.max_draws, self.kind)
        top = sp.bound_rows(sbound, ssteps)
        grid = gp.candidates(gbound, gsteps, self.tries)[0]
        ids = [int(i) for i in index]
        pred, correct, _, clean_conf, _ = self._clean(model, x, y, ctx, False)
        found = search_all(model, x, y, correct, grid, gp.apply,
                           lambda i, t: ctx.seed(i, 1, t), index)
        g_broken = found.first >= 0
        at = found.least.clamp(min=0)  # the other transform's worst point (correct samples)

        ids_t = torch.tensor(ids, dtype=torch.long)
        other_seeds = ctx.seeds(ids, 1, at.tolist())

        def noisy(xs: torch.Tensor, rows: torch.Tensor, ts: torch.Tensor, part: int
                  ) -> torch.Tensor:
            who = ids_t[rows]
            params = top[(ts + who) % len(top)]
            seeds = noise.seeds_at_bound(ctx, who.tolist(), ts.tolist(), part)
            return sp.apply(xs, params.to(x.device), seeds)

        def other(xs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return gp.apply(xs, grid[at[rows]].to(x.device), other_seeds[rows])

        def alone(rows: torch.Tensor, ts: torch.Tensor) -> torch.Tensor:
            return noisy(x[rows.to(x.device)], rows, ts, 1)

        def joint(rows: torch.Tensor, ts: torch.Tensor) -> torch.Tensor:
            xs = x[rows.to(x.device)]
            if noise_first:
                return other(noisy(xs, rows, ts, 2), rows)
            return noisy(other(xs, rows), rows, ts, 2)

        size = x[0].numel() * x.element_size()
        da = noise.sequential_draws(model, y, correct, correct, alone, plan, size)
        todo = correct & ~g_broken
        dj = noise.sequential_draws(model, y, todo, todo, joint, plan, size)

        def said(d: str | None) -> str:
            return "robust" if d == "robust" else "broken" if d == "not_robust" else "undecided"

        out = []
        for j, i in enumerate(ids):
            c = bool(correct[j])
            s_out = said(da.decision[j]) if c else "misclassified"
            g_out = self._outcome(c, True, bool(g_broken[j]))
            joint_out = ("misclassified" if not c else "broken" if bool(g_broken[j])
                         or s_out == "broken" else said(dj.decision[j]))
            if joint_out == "robust" and s_out == "undecided":
                joint_out = "undecided"  # robust together needs the noise alone decided too
            rec: PairRecord = {
                "outcome": joint_out,
                "outcome_first": s_out if noise_first else g_out,
                "outcome_second": g_out if noise_first else s_out,
                "label": int(y[j]), "pred": int(pred[j]),
                "queries": 1 + (len(grid) if c else 0) + da.draws[j] + dj.draws[j],
                "confidence": float(clean_conf[j]),
                "draws": da.draws[j] + dj.draws[j],
                "failures": da.failures[j] + dj.failures[j],
            }
            mistakes = [v for v in (float(found.worst_conf[j]), da.worst_conf[j],
                                    dj.worst_conf[j]) if not math.isnan(v)]
            if c and mistakes:  # the most confident mistake of the search and the draws
                rec["confidence"] = max(mistakes)
            elif c:  # the least confident correct answer
                seen = [v for v in (float(found.least_conf[j]), da.least_conf[j],
                                    dj.least_conf[j]) if not math.isnan(v)]
                rec["confidence"] = min([float(clean_conf[j]), *seen])
            t = dj.first_fail[j]
            if c and joint_out == "broken" and g_out == "robust" and s_out == "robust" \
                    and t >= 0:  # only the combination breaks it: its first failing draw
                rec.update({"break_params": [float(v) for v in top[(t + i) % len(top)]],
                            "break_pred": dj.first_pred[j],
                            "break_seed": noise.seed_at_bound(ctx, i, t, 2),
                            "other_params": [float(v) for v in grid[int(at[j])]],
                            "other_seed": ctx.seed(i, 1, int(at[j]))})
            out.append(rec)
        return out

    def _summarize_draws(self, records: list[PairRecord], data: Dataset) -> Measurement:
        import torch

        sp, sbound, ssteps, gp, gbound, gsteps, noise_first = self._parts()
        plan = noise.draw_plan(self.delta, self.confidence, self.max_draws, self.kind)
        grid = gp.candidates(gbound, gsteps, self.tries)[0]
        sink = ImageSink()
        evaluated = [r for r in records if r["outcome"] != "misclassified"]
        n = len(evaluated)
        rj = sum(r["outcome"] == "robust" for r in evaluated)
        uj = sum(r["outcome"] == "undecided" for r in evaluated)
        ra = sum(r["outcome_first"] == "robust" for r in evaluated)
        rb = sum(r["outcome_second"] == "robust" for r in evaluated)
        sj, sa, sb = (v / n if n else 0.0 for v in (rj, ra, rb))
        only_joint = [r for r in records if "break_params" in r]
        examples: list[dict[str, JSONLike]] = []
        names = data.class_names
        for r in sorted(only_joint, key=lambda r: r["i"])[: self.max_examples]:
            x = data.x[r["i"] : r["i"] + 1]
            xg = torch.tensor([r["other_params"]], dtype=torch.float32)
            sg = torch.tensor([r["other_seed"]], dtype=torch.long)
            xs = torch.tensor([r["break_params"]], dtype=torch.float32)
            ss = torch.tensor([r["break_seed"]], dtype=torch.long)
            xt = (gp.apply(sp.apply(x, xs, ss), xg, sg) if noise_first
                  else sp.apply(gp.apply(x, xg, sg), xs, ss))
            examples.append({
                "id": r["id"], "label": r["label"], "label_name": names[r["label"]],
                "pred": r["break_pred"], "pred_name": names[r["break_pred"]]
                if 0 <= r["break_pred"] < len(names) else str(r["break_pred"]),
                "params": [*r["break_params"], *r["other_params"]] if noise_first
                else [*r["other_params"], *r["break_params"]],
                "seed": r["break_seed"], "index": r["i"],
                "original": sink.add(x[0]), "perturbed": sink.add(xt[0]),
            })
        draws = [int(r.get("draws", 0)) for r in evaluated]
        how = (f"{gp.name} at its searched worst case (of its {len(grid)} grid points, the one "
               f"with the smallest margin, the strongest of equal margins; a point that breaks "
               f"it alone breaks the pair), {sp.name} drawn at its bound: the pair is decided at "
               f"that one point of {gp.name}, not over its whole grid")
        unsettled = None
        if uj:
            unsettled = (f"{uj} sample(s) still undecided at the cap of {plan.max_draws:,} "
                         "noise draws each count on both sides of the interval: a larger cap "
                         "(max_draws) decides them, "
                         "more samples narrow it")
        a_name, b_name = (sp.name, gp.name) if noise_first else (gp.name, sp.name)
        a_bound, b_bound = (sbound, gbound) if noise_first else (gbound, sbound)
        a_params, b_params = (sp.params, gp.params) if noise_first else (gp.params, sp.params)
        return Measurement(
            metrics={"robustness_score": sj, "score_first": sa, "score_second": sb,
                     **worst_case_coverage(records, lambda r: r["outcome"] == "robust"
                                           and not r.get("failures")),
                     "change_vs_weaker": sj - min(sa, sb), "n_evaluated": n,
                     "n_robust": rj, "joint_only_failures": len(only_joint),
                     "candidates": len(grid) + max(draws, default=0), "n_undecided": uj},
            intervals={"robustness_score": noise.share_interval(rj, uj, n)},
            details={"first": a_name, "second": b_name, "first_bound": a_bound,
                     "second_bound": b_bound, "param_names": [*a_params, *b_params],
                     "examples": examples, "how": how, "reading": plan.reading(),
                     "statistical": {**plan.to_details(), "undecided": uj, "evaluated": n,
                                     "draws": sum(draws)},
                     "method": "4: the random corruption decided by sequential draws (looks "
                               f"{list(plan.test.looks)} up to the cap) with the other "
                               "transform at its searched worst case"},
            images=sink.images, unsettled=unsettled,
            settled=Settlement(statistical=True),
        )

    def outcome_bits(self, records: list[PairRecord]) -> dict[str, list[bool]]:
        """Joint outcomes, plus robustness to each property alone."""
        bits = super().outcome_bits(records)
        bits["first_robust"] = [r["outcome_first"] == "robust" for r in records]
        bits["second_robust"] = [r["outcome_second"] == "robust" for r in records]
        return bits

    def summarize(self, records: list[PairRecord], data: Dataset) -> Measurement:
        import torch

        if self.statistical():
            return self._summarize_draws(records, data)
        g = self._grids()
        sink = ImageSink()
        rj, n = self._score([r["outcome"] for r in records])
        ra, _ = self._score([r["outcome_first"] for r in records])
        rb, _ = self._score([r["outcome_second"] for r in records])
        sj, sa, sb = (v / n if n else 0.0 for v in (rj, ra, rb))
        only_joint = [r for r in records if "break_params" in r]
        examples: list[dict[str, JSONLike]] = []
        for r in sorted(only_joint, key=lambda r: r["i"])[: self.max_examples]:
            x = data.x[r["i"] : r["i"] + 1]
            xt = g["apply"](x, torch.tensor([r["break_params"]]),
                            torch.tensor([r["break_seed"]], dtype=torch.long))
            names = data.class_names
            examples.append({
                "id": r["id"], "label": r["label"], "label_name": names[r["label"]],
                "pred": r["break_pred"], "pred_name": names[r["break_pred"]],
                "params": r["break_params"], "seed": r["break_seed"], "index": r["i"],
                "original": sink.add(x[0]), "perturbed": sink.add(xt[0]),
            })
        return Measurement(
            metrics={"robustness_score": sj, "score_first": sa, "score_second": sb,
                     **worst_case_coverage(records, lambda r: r["outcome"] == "robust"),
                     "change_vs_weaker": sj - min(sa, sb), "n_evaluated": n,
                     "n_robust": rj, "joint_only_failures": len(only_joint),
                     "candidates": len(g["ra"]) + len(g["rb"]) + len(g["joint"])},
            intervals={"robustness_score": wilson_interval(rj, n)},
            details={"first": g["a"].name, "second": g["b"].name,
                     "first_bound": self._spec(self.first, "first")[1],
                     "second_bound": self._spec(self.second, "second")[1],
                     "param_names": [*g["a"].params, *g["b"].params],
                     "examples": examples},
            images=sink.images,
        )


def _levels_of(prop: Property, rows: torch.Tensor) -> list[torch.Tensor]:
    """``rows`` grouped by intensity, weakest first (random_linf: two rows per level)."""
    inten = prop.intensity(rows.double())
    out: list[torch.Tensor] = []
    for v in sorted({round(float(a), 9) for a in inten.tolist()}):
        out.append(rows[(inten - v).abs() < 1e-9])
    return out


#: Random-noise pixel properties and the threat model of the attacks that search their worst
#: case: property -> norm of the matching attack checks (ε is the property's bound).
RANDOM_PIXEL_NORMS: dict[str, Norm] = {"random_linf": LINF, "random_l0": L0}
