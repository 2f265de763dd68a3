"""No confident mistakes (Brown et al. 2018) and suspect-model sanity checks.

``coverage``: accuracy at a coverage level, as on the unrestricted-adversarial-examples
leaderboard: abstain on the (1 − coverage) share of inputs with the lowest top score, and
report accuracy on the rest; plus the confident-mistake rate (wrong with top score at or above
a threshold). A model with an explicit abstain output declares its class id; predicting it
counts as abstaining.

``sanity``: before any attack, look for models that defeat fixed attacks instead of being
robust (Brown et al., Appendix E; AutoAttack's checks): randomised outputs (the same input gives
different scores), saturated or one-hot outputs (score-based attacks get no signal), and
probabilities instead of logits. Each finding is a warning on the card.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from certify.checks.base import (
    Check,
    CheckContext,
    ExportMetric,
    Measurement,
    Metric,
    ResultView,
    pct,
)
from certify.data import Dataset
from certify.errors import SuiteError
from certify.models.base import Model, ModelInfo
from certify.stats import wilson_interval


def confidences(scores: torch.Tensor, output: str) -> torch.Tensor:
    """Top-class probability ``[N]`` (softmax of logits; one-hot labels give 1.0)."""
    p = torch.softmax(scores.float(), dim=1) if output == "logits" else scores.float()
    return p.max(dim=1).values


FAMILY = "Coverage, confident mistakes and suspect-model checks"

#: The coverage level at which corruption and attack results are also reported.
COVERAGE = 0.8


#: The metrics :func:`worst_case_coverage` adds to a check's result.
WORST_CASE_METRICS = (
    Metric("worst_case_accuracy_at_coverage", "accuracy at the coverage level over each "
           "sample's worst case (Brown et al. 2018)", "higher"),
    Metric("worst_case_coverage", "the coverage level of the worst-case accuracy", unit="score"),
)


def worst_case_coverage(records: list[dict[str, Any]], right: Any,
                        coverage: float = COVERAGE) -> dict[str, float]:
    """Accuracy at ``coverage`` over each sample's worst case (Brown et al. 2018).

    Each record carries ``confidence`` (the model's top probability on the sample's worst case:
    the breaking input, or the least confident correct one); ``right(record)`` says whether the
    model was right there. The least confident ``1 - coverage`` share abstains. A record marked
    ``abstained`` (its worst case is the model's explicit abstain class) ranks below every
    answer and is never counted as answered, as in the clean :class:`Coverage` check.
    """
    rows = [(float("-inf") if r.get("abstained") else r["confidence"],
             bool(right(r)) and not r.get("abstained"), bool(r.get("abstained")))
            for r in records
            if r.get("confidence") is not None and r.get("outcome") != "not_applicable"]
    keep = math.ceil(coverage * len(rows) - 1e-9)
    kept = [i for i in sorted(range(len(rows)), key=lambda i: (-rows[i][0], i))[:keep]
            if not rows[i][2]]
    return {"worst_case_accuracy_at_coverage":
            sum(rows[i][1] for i in kept) / len(kept) if kept else 0.0,
            "worst_case_coverage": coverage}


class Coverage(Check):
    """Accuracy at a coverage level and the confident-mistake rate on clean data.

    Parameters: ``coverage`` (share of inputs answered; 0.8), ``confidence_threshold`` (a
    mistake at or above it is a confident mistake; 0.9), ``abstain_class`` (class id of an
    explicit abstain output, if the model has one). One query per sample.
    """

    kind: ClassVar[str] = "coverage"
    glance_group: ClassVar[str] = "Clean, coverage and confidence"
    family: ClassVar[str] = FAMILY
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("accuracy_at_coverage", "accuracy on the answered inputs", "higher",
               threshold=True),
        Metric("confident_mistake_rate", "share of inputs that are wrong with a top probability "
               "at or above the confidence threshold", "lower", threshold=True),
        Metric("coverage", "share of inputs answered", unit="score"),
        Metric("answered", "inputs answered", unit="count"),
        Metric("n", "samples evaluated", unit="count"),
        Metric("explicit_abstentions", "predictions of the abstain class", unit="count"),
        Metric("confident_mistakes", "confident mistakes", unit="count"),
        Metric("accuracy_full_coverage", "accuracy without abstaining", "higher"),
    )
    compare_outcomes = {"confident_mistake_rate": ("confident_mistake", "lower")}
    # typed as what it is: accuracy on the answered share is not the model's accuracy
    export: ClassVar[ExportMetric | None] = ExportMetric(
        "accuracy_at_coverage", "accuracy_at_coverage", "Accuracy at coverage")

    def __init__(self, coverage: float = 0.8, confidence_threshold: float = 0.9,
                 abstain_class: int | None = None) -> None:
        self.coverage = coverage
        self.confidence_threshold = confidence_threshold
        self.abstain_class = abstain_class

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        if not isinstance(self.coverage, int | float) or not 0 < self.coverage <= 1:
            raise SuiteError(f"{where}: coverage must be in (0, 1]", hint="e.g. 0.8")
        if not isinstance(self.confidence_threshold, int | float) or not \
                0 < self.confidence_threshold <= 1:
            raise SuiteError(f"{where}: confidence_threshold must be in (0, 1]", hint="e.g. 0.9")
        if self.abstain_class is not None and (not isinstance(self.abstain_class, int)
                                               or self.abstain_class < 0):
            raise SuiteError(f"{where}: abstain_class must be a class id", hint="e.g. 43")

    def skip_reason(self, info: ModelInfo) -> str | None:
        """A labels-only model has no confidence to abstain on: skipped."""
        if info.output == "labels":
            return (f"coverage needs scores to rank inputs by confidence; {info.name} returns "
                    "labels only")
        return None

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[dict[str, Any]]:
        scores = model.predict(x)
        conf = confidences(scores, model.info.output).cpu()
        pred = scores.argmax(1).cpu()
        return [{"pred": int(p), "label": int(t), "confidence": float(c), "queries": 1,
                 "abstained": self.abstain_class is not None and int(p) == self.abstain_class}
                for p, t, c in zip(pred.tolist(), y.cpu().tolist(), conf.tolist(), strict=True)]

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Accuracy at coverage and the confident-mistake rate."""
        m = result.metrics
        return (f"accuracy {pct(m.accuracy_at_coverage)} at {pct(m.coverage)} coverage "
                f"(full coverage {pct(m.accuracy_full_coverage)}); confident mistakes "
                f"{pct(m.confident_mistake_rate)} at ≥ "
                f"{result.details['confidence_threshold']:g}")

    def outcome_bits(self, records: list[dict[str, Any]]) -> dict[str, list[bool]]:
        """Per sample: correct, and a confident mistake."""
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        return {"correct": correct,
                "confident_mistake": [not c and not r["abstained"]
                                      and r["confidence"] >= self.confidence_threshold
                                      for c, r in zip(correct, records, strict=True)]}

    def summarize(self, records: list[dict[str, Any]], data: Dataset) -> Measurement:
        n = len(records)
        # explicit abstentions rank below every answer; then the least confident abstain
        conf = [float("-inf") if r["abstained"] else r["confidence"] for r in records]
        correct = [r["pred"] == r["label"] and not r["abstained"] for r in records]
        keep = math.ceil(self.coverage * n - 1e-9)
        kept = [i for i in sorted(range(n), key=lambda i: (-conf[i], i))[:keep]
                if not records[i]["abstained"]]
        hits = sum(correct[i] for i in kept)
        wrong_confident = sum(not correct[i] and not records[i]["abstained"]
                              and conf[i] >= self.confidence_threshold for i in range(n))
        return Measurement(
            metrics={"accuracy_at_coverage": hits / len(kept) if kept else 0.0,
                     "coverage": self.coverage, "answered": len(kept), "n": n,
                     "explicit_abstentions": sum(r["abstained"] for r in records),
                     "confident_mistake_rate": wrong_confident / n if n else 0.0,
                     "confident_mistakes": wrong_confident,
                     "accuracy_full_coverage": sum(correct) / n if n else 0.0},
            intervals={"accuracy_at_coverage": wilson_interval(hits, len(kept)),
                       "confident_mistake_rate": wilson_interval(wrong_confident, n)},
            details={"confidence_threshold": self.confidence_threshold,
                     "abstain_class": self.abstain_class,
                     "confidence": "top-class probability (softmax of logits)"},
        )


#: Interpolation points on each path from a sample (to its seeded noise image, to its
#: negative) that look for a label change.
BOUNDARY_GRID = 4
#: Bisection steps that close in on the label change found on that grid (to 1/8192 of the way);
#: the probe uses the point of smallest top-2 margin they visit.
BOUNDARY_STEPS = 10
#: The fewest repeats a randomness probe may use: with 3, a model that randomises one answer in
#: five goes unseen half the time (0.8^3); with 10, about one time in ten (0.8^10).
MIN_REPEATS = 10


def top2_margin(scores: torch.Tensor, output: str) -> torch.Tensor:
    """``[N]`` top-1 minus top-2 probability (softmax of logits): small near a boundary."""
    p = torch.softmax(scores.float(), dim=1) if output == "logits" else scores.float()
    if p.shape[1] < 2:
        return torch.ones(p.shape[0])
    top = p.topk(2, dim=1).values
    return top[:, 0] - top[:, 1]


def _repeat(model: Model, x: torch.Tensor, repeats: int, tolerance: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query ``x`` ``repeats`` times: (first scores, any output changed, any label changed)."""
    outs = [model.predict(x).float().cpu() for _ in range(repeats)]
    stacked = torch.stack(outs)
    spread = stacked.amax(dim=0) - stacked.amin(dim=0)
    scale = outs[0].abs().amax(dim=1).clamp(min=1.0)
    random = (spread.amax(dim=1) / scale) > tolerance
    flips = torch.stack([o.argmax(1) for o in outs]).ne(outs[0].argmax(1)).any(dim=0)
    return outs[0], random, flips


class Sanity(Check):
    """Suspect-model checks before any attack: randomness, saturation, probabilities.

    Randomness is probed twice per sample, each with ``repeats`` queries of one input: on the
    sample itself, and on a near-boundary input, where a model that randomises only when it
    is unsure (a small top-2 margin) shows it. The near-boundary input lies on a straight path
    from the sample, to a noise image seeded by the sample or else to the sample's negative:
    ``BOUNDARY_GRID`` points along each find where the label first changes and
    ``BOUNDARY_STEPS`` bisection steps close in on it, probing the point of smallest top-2
    margin visited (where the label never changes, the grid point of smallest margin).

    Parameters: ``repeats`` (queries of the same input; at least 10, default 10),
    ``saturation_threshold`` (a top probability at or above it counts as saturated; 0.999),
    ``saturated_share`` (warn when more samples than this are saturated; 0.5), ``tolerance``
    (output change counted as random), ``near_boundary`` (also probe near-boundary inputs;
    true). Queries per sample: ``2 * repeats + 2 * BOUNDARY_GRID`` plus up to
    ``BOUNDARY_STEPS``.
    """

    kind: ClassVar[str] = "sanity"
    glance_group: ClassVar[str] = "Clean, coverage and confidence"
    family: ClassVar[str] = FAMILY
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("nondeterministic_share", "share of samples whose repeated queries differ, on "
               "the sample or near its decision boundary", "lower", threshold=True),
        Metric("boundary_nondeterministic_share", "share of samples whose repeated queries "
               "differ near the decision boundary", "lower", optional=True),
        Metric("saturated_share", "share of samples with a saturated top probability", "lower",
               threshold=True),
        Metric("label_flip_share", "share of samples whose label changed between repeats, on "
               "the sample or near its decision boundary", "lower"),
        Metric("one_hot_share", "share of samples answered one-hot", "lower"),
        Metric("boundary_margin_median", "median top-2 probability margin of the "
               "near-boundary inputs", unit="score", optional=True),
        Metric("n", "samples evaluated", unit="count"),
    )

    def __init__(self, repeats: int = MIN_REPEATS, saturation_threshold: float = 0.999,
                 saturated_share: float = 0.5, tolerance: float = 1e-5,
                 near_boundary: bool = True) -> None:
        self.repeats = repeats
        self.saturation_threshold = saturation_threshold
        self.saturated_share = saturated_share
        self.tolerance = tolerance
        self.near_boundary = near_boundary

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        if not isinstance(self.repeats, int) or self.repeats < MIN_REPEATS:
            raise SuiteError(f"{where}: repeats must be an integer >= {MIN_REPEATS}",
                             hint=f"fewer repeats miss models that randomise only sometimes; "
                                  f"e.g. {MIN_REPEATS}")

    def _boundary(self, model: Model, x: torch.Tensor, label: torch.Tensor,
                  index: Sequence[int], ctx: CheckContext
                  ) -> tuple[torch.Tensor, list[int]]:
        """Near-boundary inputs ``[N, C, H, W]`` and the queries each cost to find."""
        n = x.shape[0]
        noise = torch.stack([
            torch.rand(tuple(x.shape[1:]), generator=torch.Generator().manual_seed(
                ctx.seed(i, 1) % (2**63))) for i in index]).to(x.device, x.dtype)
        # paths from the sample: to its seeded noise image, and to its negative
        targets = torch.stack([noise, 1 - x])  # [P, N, C, H, W]
        paths = targets.shape[0]
        alphas = torch.arange(1, BOUNDARY_GRID + 1, dtype=torch.float64) / BOUNDARY_GRID

        def blend(a: torch.Tensor, rows: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
            w = a.to(x.dtype).to(x.device).view(-1, *([1] * (x.dim() - 1)))
            return (1 - w) * x[rows] + w * targets[path.to(x.device), rows.to(x.device)]

        rows = torch.arange(n)
        # grid point g = (path, alpha) in path order, so the first change is on the first path
        g_path = torch.arange(paths).repeat_interleave(BOUNDARY_GRID)
        g_alpha = alphas.repeat(paths)
        grid = torch.cat([blend(a.repeat(n), rows, p.repeat(n))
                          for p, a in zip(g_path, g_alpha, strict=True)])
        scores = model.predict(grid).float().cpu()
        steps = len(g_alpha)
        labels = scores.argmax(1).view(steps, n)
        margins = top2_margin(scores, model.info.output).view(steps, n)
        queries = [steps] * n
        changed = labels.ne(label.view(1, n))
        crossed = changed.any(dim=0)
        first = changed.to(torch.int64).argmax(dim=0)  # the first grid point past a change
        nearest = margins.argmin(dim=0)
        alpha, path = g_alpha[nearest], g_path[nearest]
        sub = crossed.nonzero().flatten()
        if len(sub):
            f = first[sub]
            path_s = g_path[f]
            hi_s = g_alpha[f]
            lo_s = hi_s - 1 / BOUNDARY_GRID  # the grid point before it on the same path
            # the point of smallest margin seen so far: the grid point past the change
            best, best_margin = hi_s.clone(), margins[f, sub]
            for _ in range(BOUNDARY_STEPS):
                mid = (lo_s + hi_s) / 2
                scores = model.predict(blend(mid, sub, path_s)).float().cpu()
                moved = scores.argmax(1).ne(label[sub])
                hi_s = torch.where(moved, mid, hi_s)
                lo_s = torch.where(moved, lo_s, mid)
                margin = top2_margin(scores, model.info.output)
                closer = margin < best_margin
                best = torch.where(closer, mid, best)
                best_margin = torch.where(closer, margin, best_margin)
            alpha[sub], path[sub] = best, path_s
            for j in sub.tolist():
                queries[j] += BOUNDARY_STEPS
        return blend(alpha, rows, path), queries

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[dict[str, Any]]:
        first, random, flips = _repeat(model, x, self.repeats, self.tolerance)
        conf = confidences(first, model.info.output)
        p = torch.softmax(first, 1) if model.info.output == "logits" else first
        one_hot = (p.max(dim=1).values >= 1 - 1e-6) & (p.sum(dim=1) - 1).abs().lt(1e-4)
        rows: list[dict[str, Any]] = [
            {"random": bool(r), "label_flips": bool(f), "confidence": float(c),
                 "output": model.info.output,
                 "saturated": bool(c >= self.saturation_threshold), "one_hot": bool(o),
                 "queries": self.repeats}
                for r, f, c, o in zip(random.tolist(), flips.tolist(), conf.tolist(),
                                      one_hot.tolist(), strict=True)]
        if not self.near_boundary:
            return rows
        near, queries = self._boundary(model, x, first.argmax(1), index, ctx)
        b_first, b_random, b_flips = _repeat(model, near, self.repeats, self.tolerance)
        margin = top2_margin(b_first, model.info.output)
        for r, q, br, bf, m in zip(rows, queries, b_random.tolist(), b_flips.tolist(),
                                   margin.tolist(), strict=True):
            r.update({"random_near_boundary": bool(br), "label_flips_near_boundary": bool(bf),
                      "boundary_margin": float(m), "queries": r["queries"] + q + self.repeats})
        return rows

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """How many suspect behaviours were found."""
        found = len(result.warnings)
        probe = (" and near their decision boundaries"
                 if result.metrics.boundary_nondeterministic_share is not None else "")
        return (f"{found} suspect behaviour(s) found" if found else "no suspect behaviour "
                "found (randomness, saturation, probability outputs)") + \
            f" on {result.metrics.n} samples{probe}, {result.details['repeats']} repeats each"

    def outcome_bits(self, records: list[dict[str, Any]]) -> dict[str, list[bool]]:
        """Per sample: randomised (anywhere), randomised near the boundary, saturated."""
        bits = {"random": [_randomised(r) for r in records],
                "saturated": [bool(r["saturated"]) for r in records]}
        if records and "random_near_boundary" in records[0]:
            bits["random_near_boundary"] = [bool(r["random_near_boundary"]) for r in records]
        return bits

    def summarize(self, records: list[dict[str, Any]], data: Dataset) -> Measurement:
        n = len(records) or 1
        rnd = sum(_randomised(r) for r in records) / n
        probed = bool(records) and "random_near_boundary" in records[0]
        b_rnd = sum(bool(r.get("random_near_boundary")) for r in records) / n
        only_near = sum(bool(r.get("random_near_boundary")) and not r["random"]
                        for r in records)
        flips = sum(bool(r["label_flips"] or r.get("label_flips_near_boundary"))
                    for r in records) / n
        sat = sum(r["saturated"] for r in records) / n
        hot = sum(r["one_hot"] for r in records) / n
        output = records[0]["output"] if records else ""
        warnings = []
        if rnd > 0:
            near = (f"; {only_near} of them only near the decision boundary, where the model "
                    "is unsure" if only_near else "")
            warnings.append(
                f"randomised model: the same input gave different outputs for {rnd:.0%} of the "
                f"samples ({flips:.0%} changed label){near}; fixed attacks can be defeated by "
                "randomness, so robust accuracies on this card may be inflated and no attack "
                "can PASS (Brown et al. 2018, Appendix E)")
        # with logits, attacks read the logits, so a saturated softmax costs them nothing
        if output != "logits" and (sat > self.saturated_share or hot > self.saturated_share):
            warnings.append(
                f"saturated outputs: {max(sat, hot):.0%} of the samples get a top probability "
                f"of at least {self.saturation_threshold} ({hot:.0%} exactly one-hot); "
                "score-based attacks get little or no signal from such outputs")
        if output == "probs":
            warnings.append(
                "the model returns probabilities, not logits: score-based attacks work on "
                "log-probabilities, which lose precision when probabilities saturate "
                "(AutoAttack's check)")
        margins = sorted(float(r["boundary_margin"]) for r in records if "boundary_margin" in r)
        metrics = {"nondeterministic_share": rnd, "label_flip_share": flips,
                   "saturated_share": sat, "one_hot_share": hot, "n": len(records)}
        if probed:
            metrics["boundary_nondeterministic_share"] = b_rnd
        if margins:
            metrics["boundary_margin_median"] = margins[len(margins) // 2]
        return Measurement(
            metrics=metrics,
            details={"repeats": self.repeats, "output": output, "near_boundary": probed,
                     "boundary_grid": 2 * BOUNDARY_GRID, "boundary_steps": BOUNDARY_STEPS},
            warnings=warnings,
        )


def _randomised(record: dict[str, Any]) -> bool:
    """Whether a sanity record saw different outputs for the same input, anywhere."""
    return bool(record["random"] or record.get("random_near_boundary"))
