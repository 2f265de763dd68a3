"""Corruption properties (Berghoff et al. 2021, §3.3–§4.3) and their robustness score.

A sample is *robust* to a property when the model's prediction stays correct for every tried
transform within the bound; the **robustness score** is the share of robust samples among the
correctly classified ones (§3.4). Candidates are tried from the weakest intensity up and a
sample's search stops at its first failure, so each record keeps the smallest intensity that
broke it, which gives the score as a function of the bound (the card's curve) for free.

Threat model: natural corruptions, not adversarial ones: a grid over each deterministic
property's parameters, and ``tries`` seeded random draws per intensity level for random ones.
Queries per sample: one clean query plus at most the number of candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import torch

from certify.canonical import JSONLike
from certify.checks.base import (
    Check,
    CheckContext,
    ExportMetric,
    Measurement,
    Metric,
    ResultView,
    interval_text,
    pct,
)
from certify.checks.confidence import (
    WORST_CASE_METRICS,
    ConfidenceRecord,
    confidences,
    worst_case_coverage,
)
from certify.data import Dataset
from certify.errors import SuiteError
from certify.images import ImageSink
from certify.models.base import Model
from certify.perturbations import PROPERTIES, Property
from certify.stats import wilson_interval
from certify.validation import expect_keys

Apply = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


#: Properties renamed because they were random draws shown as if they were worst cases:
#: old name -> (new name, the attack check kind that searches the worst case in that norm).
RENAMED = {"linf": ("random_linf", "square_linf"), "l0": ("random_l0", "sparse_rs")}


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
    b = prop.default_bound if bound is None else bound
    s = prop.default_steps if steps is None else steps
    if isinstance(b, bool) or not isinstance(b, int | float) or b <= 0:
        raise SuiteError(f"{where}: bound must be a positive number, got {b!r}",
                         hint=f"{prop.name} is measured in {prop.unit}")
    if prop.max_bound is not None and b > prop.max_bound:
        raise SuiteError(f"{where}: bound {b} exceeds {prop.max_bound} for {prop.name}",
                         hint=f"{prop.name} is measured in {prop.unit}")
    if not isinstance(s, int) or isinstance(s, bool) or s < 1:
        raise SuiteError(f"{where}: steps must be a positive integer", hint="e.g. steps: 5")
    return float(b), s


FAMILY = "Corruption properties (noise, geometric, colour, stickers)"

class SearchResult(NamedTuple):
    """Per sample: breaking candidate (-1 if none), label predicted there, queries, and the
    confidence of the worst case found (at the break, or the lowest over the tries; NaN when
    the sample was not searched)."""

    broken_at: torch.Tensor
    broken_pred: torch.Tensor
    queries: torch.Tensor
    confidence: torch.Tensor


def search(
    model: Model,
    x: torch.Tensor,
    y: torch.Tensor,
    alive: torch.Tensor,
    candidates: torch.Tensor,
    apply: Apply,
    seed_of: Callable[[int, int], int],
    index: Sequence[int],
) -> SearchResult:
    """Try candidates in order on the ``alive`` samples, stopping each at its first failure."""
    b = len(y)
    broken_at = torch.full((b,), -1, dtype=torch.long)
    broken_pred = torch.full((b,), -1, dtype=torch.long)
    queries = torch.zeros(b, dtype=torch.long)
    conf = torch.full((b,), float("nan"))
    alive = alive.clone().cpu()
    output = model.info.output
    for t in range(len(candidates)):
        ai = alive.nonzero().flatten()
        if len(ai) == 0:
            break
        params = candidates[t].expand(len(ai), -1).to(x.device)
        seeds = torch.tensor([seed_of(int(index[i]), t) for i in ai.tolist()], dtype=torch.long)
        xt = apply(x[ai.to(x.device)], params, seeds)
        scores = model.predict(xt).cpu()
        pred = scores.argmax(1)
        c = confidences(scores, output)
        queries[ai] += 1
        bad = pred != y[ai.to(y.device)].cpu()
        hit = ai[bad]
        broken_at[hit] = t
        broken_pred[hit] = pred[bad]
        conf[hit] = c[bad]
        ok = ai[~bad]
        conf[ok] = torch.fmin(conf[ok], c[~bad])
        alive[hit] = False
    return SearchResult(broken_at, broken_pred, queries, conf)


class CorruptionRecord(ConfidenceRecord, total=False):
    """A corruption record: label, clean prediction, and the first break found (its
    intensity, transform parameters, prediction and seed, which regenerate it)."""

    label: int
    pred: int
    break_intensity: float
    break_params: list[float]
    break_pred: int
    break_seed: int


class PairRecord(CorruptionRecord, total=False):
    """A corruption-pair record: the joint outcome, and each property's alone."""

    outcome_first: str
    outcome_second: str


CR = TypeVar("CR", bound=CorruptionRecord)


class _CorruptionBase(Check[CR]):
    family: ClassVar[str] = FAMILY
    glance_group: ClassVar[str] = "Corruptions"

    def _clean(self, model: Model, x: torch.Tensor, y: torch.Tensor, ctx: CheckContext,
               flip_only: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Clean predictions, correctness, applicability and confidence ``[B]`` each."""
        scores = model.predict(x)
        pred = scores.argmax(1)
        conf = confidences(scores.cpu(), model.info.output)
        correct = (pred == y).cpu()
        applicable = torch.ones_like(correct)
        if flip_only:
            allowed = torch.tensor(sorted(ctx.flip_invariant_classes), dtype=torch.long)
            applicable = torch.isin(y.cpu(), allowed)
        return pred.cpu(), correct, applicable, conf

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


class Corruption(_CorruptionBase[CorruptionRecord]):
    """Robustness score of one corruption property within a bound (Berghoff et al. 2021).

    Parameters: ``property`` (see :data:`certify.perturbations.PROPERTIES`), ``bound`` (in the
    property's unit; default per property), ``steps`` (grid resolution or number of intensity
    levels), ``tries`` (seeded draws per level for random properties), ``max_examples`` (failure
    examples kept for the card's gallery).
    """

    kind: ClassVar[str] = "corruption"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("robustness_score", "share of correctly classified samples that stay correct "
               "for every tried transform within the bound", "higher", threshold=True),
        *WORST_CASE_METRICS,
        Metric("n_evaluated", "correctly classified samples searched", unit="count"),
        Metric("n_robust", "samples robust within the bound", unit="count"),
        Metric("n_misclassified", "samples wrong before any transform", unit="count"),
        Metric("n_not_applicable", "samples the property does not apply to", unit="count"),
        Metric("candidates", "transforms tried per sample at most", unit="count"),
    )
    compare_outcomes = {"robustness_score": ("robust", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("robustness_score", "robustness_score",
                                                         "Robustness score")

    def __init__(self, property: str, bound: float | None = None, steps: int | None = None,
                 tries: int = 4, max_examples: int = 4) -> None:
        self.property = property
        self.bound = bound
        self.steps = steps
        self.tries = tries
        self.max_examples = max_examples

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        prop = _property(self.property, where)
        _bound_steps(prop, self.bound, self.steps, where)
        if not isinstance(self.tries, int) or self.tries < 1:
            raise SuiteError(f"{where}: tries must be a positive integer", hint="e.g. tries: 4")

    def _candidates(self) -> tuple[Property, torch.Tensor, torch.Tensor]:
        prop = PROPERTIES[self.property]
        bound, steps = _bound_steps(prop, self.bound, self.steps, self.kind)
        rows, inten, _ = prop.candidates(bound, steps, self.tries)
        return prop, rows, inten

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[CorruptionRecord]:
        prop, rows, inten = self._candidates()
        pred, correct, applicable, clean_conf = self._clean(model, x, y, ctx,
                                                            prop.name == "flip")
        found = search(model, x, y, correct & applicable, rows, prop.apply, ctx.seed, index)
        broken_at, broken_pred, queries = found.broken_at, found.broken_pred, found.queries
        worst = torch.where(found.confidence.isnan(), clean_conf, found.confidence)
        out = []
        for j, i in enumerate(index):
            t = int(broken_at[j])
            rec: CorruptionRecord = {
                "outcome": self._outcome(bool(correct[j]), bool(applicable[j]), t >= 0),
                "label": int(y[j]), "pred": int(pred[j]), "queries": 1 + int(queries[j]),
                "confidence": float(worst[j]),
            }
            if ctx.abstain_class is not None and ctx.abstain_class == (
                    int(broken_pred[j]) if t >= 0 else int(pred[j])):
                rec["abstained"] = True  # worst case: an explicit abstention
            if t >= 0:
                rec.update({"break_intensity": float(inten[t]),
                            "break_params": [float(v) for v in rows[t]],
                            "break_pred": int(broken_pred[j]),
                            "break_seed": ctx.seed(int(i), t)})
            out.append(rec)
        return out

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Score with its interval, the bound and the sample count."""
        m, d = result.metrics, result.details
        text = (f"robustness {pct(m.robustness_score)} (95% CI "
                f"{interval_text(result.intervals['robustness_score'])}) within "
                f"{d['bound']:g} {d['unit']}, n={m.n_evaluated}")
        for c in d.get("worst_case_comparison") or ():
            text += (f"; a random draw: {pct(c['surviving_share'])} survive the worst-case "
                     f"search {c['attack_check']} at the same bound")
        return text

    @classmethod
    def figures(cls, result: ResultView) -> dict[str, str]:
        """The robustness curve over the bound."""
        from certify.figures import curve_svg

        return {"curve": curve_svg(result.details["curve"], result.details["unit"])}

    def summarize(self, records: list[CorruptionRecord], data: Dataset) -> Measurement:
        prop, rows, inten = self._candidates()
        sink = ImageSink()
        robust, evaluated = self._score([r["outcome"] for r in records])
        levels = [0.0, *sorted({float(v) for v in inten.tolist()})]
        broken = [r["break_intensity"] for r in records if r["outcome"] == "broken"]
        curve = [
            {"intensity": lv, "score": (evaluated - sum(b <= lv + 1e-12 for b in broken))
             / evaluated if evaluated else None}
            for lv in levels
        ]
        return Measurement(
            metrics={
                "robustness_score": robust / evaluated if evaluated else 0.0,
                **worst_case_coverage(records, lambda r: r["outcome"] == "robust"),
                "n_evaluated": evaluated,
                "n_robust": robust,
                "n_misclassified": sum(r["outcome"] == "misclassified" for r in records),
                "n_not_applicable": sum(r["outcome"] == "not_applicable" for r in records),
                "candidates": len(rows),
            },
            intervals={"robustness_score": wilson_interval(robust, evaluated)},
            details={
                "property": prop.name,
                "family": prop.family,
                "description": prop.description,
                "unit": prop.unit,
                "param_names": list(prop.params),
                "bound": _bound_steps(prop, self.bound, self.steps, self.kind)[0],
                "search": "random" if prop.random else "grid",
                "curve": curve,
                "examples": self._examples(prop.apply, records, data, sink),
            },
            images=sink.images,
        )

    def _examples(self, apply: Apply, records: list[CorruptionRecord], data: Dataset,
                  sink: ImageSink) -> list[dict[str, Any]]:
        """Regenerate the weakest breaking transforms for the gallery (deterministic).

        Each example keeps what regenerates it (sample, parameters, seed) and the digests of
        its two images; the pixels go to ``sink``.
        """
        broken = sorted((r for r in records if r["outcome"] == "broken"),
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


class CorruptionPair(_CorruptionBase[PairRecord]):
    """Two properties combined over their joint parameter space (Berghoff et al. 2021, §4.3).

    ``first`` and ``second`` are ``{property, bound, steps}`` mappings. Reports the joint
    robustness score, each property's own score on the same grids, and the change against the
    weaker of the two (negative: the combination finds failures neither finds alone).
    """

    kind: ClassVar[str] = "corruption_pair"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("robustness_score", "share of correctly classified samples that stay correct "
               "over the joint grid of both properties", "higher", threshold=True),
        Metric("change_vs_weaker", "joint score minus the weaker property's own score",
               "higher", unit="score", threshold=True),
        Metric("score_first", "the first property's own score on its grid", "higher"),
        Metric("score_second", "the second property's own score on its grid", "higher"),
        *WORST_CASE_METRICS,
        Metric("n_evaluated", "correctly classified samples searched", unit="count"),
        Metric("n_robust", "samples robust to the combination", unit="count"),
        Metric("joint_only_failures", "samples only the combination breaks", unit="count"),
        Metric("candidates", "transforms tried per sample at most", unit="count"),
    )
    compare_outcomes = {"robustness_score": ("robust", "higher")}
    export: ClassVar[ExportMetric | None] = ExportMetric("robustness_score", "robustness_score",
                                                         "Joint robustness score")

    def __init__(self, first: dict[str, Any], second: dict[str, Any], tries: int = 2,
                 max_examples: int = 4) -> None:
        self.first = first
        self.second = second
        self.tries = tries
        self.max_examples = max_examples

    def _spec(self, part: Any, where: str) -> tuple[Property, float, int]:
        if not isinstance(part, dict) or set(part) - {"property", "bound", "steps"}:
            raise SuiteError(f"{where} must be a mapping with keys property, bound, steps",
                             hint="e.g. first: {property: rotation, bound: 10, steps: 2}")
        expect_keys(where, part, {"property": str, "bound": float | None, "steps": int | None})
        prop = _property(part.get("property"), where)
        if prop.name == "flip":
            raise SuiteError(f"{where}: flip cannot be combined", hint="test flip on its own")
        b, s = _bound_steps(prop, part.get("bound"), part.get("steps"), where)
        return prop, b, s

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        self._spec(self.first, f"{where}.params.first")
        self._spec(self.second, f"{where}.params.second")
        if not isinstance(self.tries, int) or self.tries < 1:
            raise SuiteError(f"{where}: tries must be a positive integer", hint="e.g. tries: 2")

    def _grids(self) -> dict[str, Any]:
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
        g = self._grids()
        pred, correct, _, clean_conf = self._clean(model, x, y, ctx, False)
        ra = search(model, x, y, correct, g["ra"], g["a"].apply,
                    lambda i, t: ctx.seed(i, 1, t), index)
        rb = search(model, x, y, correct, g["rb"], g["b"].apply,
                    lambda i, t: ctx.seed(i, 2, t), index)
        ba, qa, bb, qb = ra.broken_at, ra.queries, rb.broken_at, rb.queries
        # a failure of either property alone is already a failure of the combination
        alive = correct & (ba < 0) & (bb < 0)
        rj = search(model, x, y, alive, g["joint"], g["apply"],
                    lambda i, t: ctx.seed(i, 3, t), index)
        bj, pj, qj = rj.broken_at, rj.broken_pred, rj.queries
        # worst case: the confidence at the first break found, else the lowest seen
        worst = clean_conf.clone()
        for part in (rj, rb, ra):
            seen = ~part.confidence.isnan()
            worst[seen] = torch.fmin(worst[seen], part.confidence[seen])
        for part in (ra, rb, rj):
            hit = part.broken_at >= 0
            worst[hit] = part.confidence[hit]
        out = []
        for j, i in enumerate(index):
            c = bool(correct[j])
            joint_broken = (ba[j] >= 0) or (bb[j] >= 0) or (bj[j] >= 0)
            rec: PairRecord = {
                "outcome": self._outcome(c, True, bool(joint_broken)),
                "outcome_first": self._outcome(c, True, bool(ba[j] >= 0)),
                "outcome_second": self._outcome(c, True, bool(bb[j] >= 0)),
                "label": int(y[j]), "pred": int(pred[j]),
                "queries": 1 + int(qa[j] + qb[j] + qj[j]),
                "confidence": float(worst[j]),
            }
            if ctx.abstain_class is not None:
                # the worst case's prediction: the same part whose confidence was kept
                worst_pred = int(pred[j])
                for part in (ra, rb, rj):
                    if int(part.broken_at[j]) >= 0:
                        worst_pred = int(part.broken_pred[j])
                if worst_pred == ctx.abstain_class:
                    rec["abstained"] = True
            t = int(bj[j])
            if t >= 0:
                rec.update({"break_params": [float(v) for v in g["joint"][t]],
                            "break_pred": int(pj[j]),
                            "break_seed": ctx.seed(int(i), 3, t)})
            out.append(rec)
        return out

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Joint score, each property alone, and the change against the weaker."""
        m = result.metrics
        return (f"joint robustness {pct(m.robustness_score)}; alone "
                f"{pct(m.score_first)} and {pct(m.score_second)}; change vs weaker "
                f"{100 * m.change_vs_weaker:+.1f} points")

    @classmethod
    def section_figures(cls, results: Sequence[ResultView]) -> dict[str, str]:
        """The matrix of the combinations' joint robustness scores (checks that ran)."""
        from certify.figures import pair_matrix_svg

        pairs = [(r.details["first"], r.details["second"], float(r.metrics.robustness_score))
                 for r in results if r.status not in ("ERROR", "SKIPPED")]
        return {"matrix": pair_matrix_svg(pairs)} if pairs else {}

    def outcome_bits(self, records: list[PairRecord]) -> dict[str, list[bool]]:
        """Joint outcomes, plus robustness to each property alone."""
        bits = super().outcome_bits(records)
        bits["first_robust"] = [r["outcome_first"] == "robust" for r in records]
        bits["second_robust"] = [r["outcome_second"] == "robust" for r in records]
        return bits

    def summarize(self, records: list[PairRecord], data: Dataset) -> Measurement:
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


#: Random-noise pixel properties and the threat model of the attacks that search their worst
#: case: property -> norm of the matching attack checks (ε is the property's bound).
RANDOM_PIXEL_NORMS = {"random_linf": "linf", "random_l0": "l0"}
