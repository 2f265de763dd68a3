"""Robust accuracy under a query-based attack, validated by the binarization test.

For every sample the check queries the model once (clean), runs the attack on the correctly
classified ones, projects the attack's output onto the threat model (ε-ball and [0, 1]),
queries once more and counts a success only from that answer: attacks never grade themselves.
On a seeded, evenly spread subset of samples it then runs the binarization test
(:mod:`certify.checks.binarization`) with the same attack configuration. An attack whose test
score is below 0.95, or not clearly above random sampling (R-ASR + 0.1), is reported as too
weak to support the robust accuracy it measured, and the check's verdict becomes WARN.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import typing
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from certify.attacks import ATTACKS, Attack, SpatialGrid, margin, project
from certify.attacks.simple import cut_grid_message
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
from certify.checks.binarization import (
    LADDER,
    NECESSARY_ONLY,
    PACKAGED,
    BinarizationSettings,
    ladder_scores,
    ladder_test,
    passes,
)
from certify.checks.confidence import WORST_CASE_METRICS, confidences, worst_case_coverage
from certify.data import Dataset
from certify.errors import SuiteError
from certify.models.base import Model, ModelInfo
from certify.stats import wilson_interval
from certify.validation import expect

PASS_SCORE = 0.95
RASR_MARGIN = 0.1
_DEFAULT_EPS = {"linf": 8 / 255, "l2": 0.5}
_BT_KEYS = {"samples", "n_inner", "n_boundary", "inner_gap", "closeness", "inner_shell"}
#: Planted problems per attack by default (issue 17: at least 20).
BT_SAMPLES = 20
#: Set by the check's own parameters; in ``attack_params`` they would disagree with the card.
_CHECK_KEYS = ("epsilon", "max_queries", "norm")


class AttackCheck(Check):
    """Robust accuracy at ε under one attack and budget (queries per sample).

    Parameters: ``attack`` (square_linf, square_l2, hopskipjump, random, spatial_grid),
    ``epsilon`` (L∞ or L2 radius in [0, 1] pixel units; 8/255 and 0.5 by default), ``norm``
    (for hopskipjump and random), ``max_queries`` per sample, ``attack_params`` (extra
    constructor arguments of the attack), ``binarization`` (``false``, or settings: samples,
    n_inner, n_boundary, inner_gap, closeness).
    """

    kind: ClassVar[str] = "attack"
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
        *WORST_CASE_METRICS,
    )
    export: ClassVar[ExportMetric | None] = ExportMetric("robust_accuracy", "robust_accuracy",
                                                         "Robust accuracy")
    #: Attacks spend thousands of queries per sample: record them in small units.
    record_batch: ClassVar[int | None] = 16

    def __init__(self, attack: str, epsilon: float | None = None, norm: str | None = None,
                 max_queries: int = 1000, attack_params: dict[str, Any] | None = None,
                 binarization: dict[str, Any] | bool = True) -> None:
        self.attack = attack
        self.epsilon = epsilon
        self.norm = norm
        self.max_queries = max_queries
        self.attack_params = attack_params
        self.binarization = binarization

    # -- configuration --------------------------------------------------------------------
    def _norm(self) -> str:
        cls = ATTACKS[self.attack]
        if cls.name == "hopskipjump":
            return self.norm or "l2"
        if cls.name == "random":
            return self.norm or "linf"
        return cls.norm

    def _epsilon(self) -> float:
        norm = self._norm()
        return 0.0 if norm == "spatial" else float(
            self.epsilon if self.epsilon is not None else _DEFAULT_EPS[norm])

    def threat_model(self) -> tuple[str, float]:
        """(norm, ε): ``linf``/``l2`` with the radius, or ``spatial`` with 0."""
        return self._norm(), self._epsilon()

    def build(self) -> Attack:
        """The configured attack object."""
        cls = ATTACKS[self.attack]
        kw: dict[str, Any] = dict(self.attack_params or {})
        if cls.name == "spatial_grid":
            kw["max_queries"] = self.max_queries
            return cls(**kw)
        kw.update(epsilon=self._epsilon(), max_queries=self.max_queries)
        if cls.name in ("hopskipjump", "random"):
            kw["norm"] = self._norm()
        return cls(**kw)

    def _bt(self) -> tuple[tuple[BinarizationSettings, ...], int, int] | None:
        """(ladder hardest first, index of the packaged rung, samples), or None when off.

        The packaged configuration of the threat model (binarization.PACKAGED) and its ladder;
        a suite that sets hardness keys runs that one configuration alone (experiments).
        """
        if self.binarization is False or self._norm() == "spatial":
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
        if not isinstance(self.max_queries, int) or self.max_queries < 2:
            raise SuiteError(f"{where}: max_queries must be an integer >= 2", hint="e.g. 1000")
        if self.epsilon is not None and (not isinstance(self.epsilon, int | float)
                                         or self.epsilon <= 0):
            raise SuiteError(f"{where}: epsilon must be positive", hint="e.g. 0.0314 (8/255)")
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
        if isinstance(attack, SpatialGrid) and attack.grid_size() > self.max_queries:
            size = attack.grid_size()
            raise SuiteError(f"{where}: {cut_grid_message(size, self.max_queries)}",
                             hint=f"raise max_queries to {size}, or lower rotation_steps / "
                                  f"translation_steps")

    def produced_metrics(self, reference: bool) -> set[str]:
        """No binarization metrics when the test is off or the attack is spatial."""
        if self._bt() is None:
            return set(self.metric_names) - {"binarization_score", "binarization_rasr"}
        return set(self.metric_names)

    def validate(self, info: ModelInfo) -> None:
        """Refuse a score-based attack on a labels-only model before any query."""
        if ATTACKS[self.attack].needs_scores and info.output == "labels":
            raise SuiteError(
                f"attack {self.attack} needs scores but {info.name} returns labels only",
                hint="use hopskipjump, random or spatial_grid for labels-only models",
            )

    # -- measurement ----------------------------------------------------------------------
    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[dict[str, Any]]:
        counter: Any = model
        output = counter.info.output
        attack, norm, eps = self.build(), self._norm(), self._epsilon()
        scores = counter.predict(x)
        correct = (scores.argmax(1) == y).cpu()
        m0 = margin(scores.cpu(), y.cpu(), output)
        one_hot = one_hot_answers(scores, output)
        clean_conf = confidences(scores.cpu(), output)
        rec: list[dict[str, Any]] = [
            {"outcome": "robust" if bool(c) else "misclassified", "label": int(t),
             "queries": 1, "attack_queries": 0, "confidence": float(cc)}
            for c, t, cc in zip(correct.tolist(), y.tolist(), clean_conf.tolist(), strict=True)
        ]
        ci = correct.nonzero().flatten()
        if len(ci):
            seeds = torch.tensor([ctx.seed(int(index[i]), 1) for i in ci.tolist()])
            dev = x.device
            res = attack.run(counter, x[ci.to(dev)], y[ci.to(dev)], seeds, output)
            x_adv = res.x_adv if norm == "spatial" else project(res.x_adv, x[ci.to(dev)],
                                                               norm, eps)
            adv_scores = counter.predict(x_adv).cpu()
            pred = adv_scores.argmax(1)
            adv_conf = confidences(adv_scores, output)
            for k, i in enumerate(ci.tolist()):
                broken = int(pred[k]) != int(y[i])
                rec[i].update({"outcome": "broken" if broken else "robust",
                               "attack_queries": int(res.queries[k]),
                               "queries": 2 + int(res.queries[k]),
                               "confidence": float(adv_conf[k])})
                if broken:
                    rec[i]["adv_pred"] = int(pred[k])
                elif res.start_failed is not None and bool(res.start_failed[k]):
                    rec[i]["start_failed"] = True  # never attacked: robust, unverified
        bt = self._bt()
        if bt is not None:
            ladder, packaged, samples = bt
            picked = bt_positions(ctx, samples)
            stride = max(1, math.ceil(ctx.n_samples / max(samples, 1)))
            for j, i in enumerate(index):
                if (int(i) not in picked) if picked else int(i) % stride:
                    continue
                before = counter.queries
                fields = ladder_test(counter, x[j], attack, norm, eps, ctx.seed(int(i), 2),
                                     ladder, packaged, output, float(m0[j]),
                                     bool(one_hot[j]))
                rec[j].update(fields)
                rec[j]["queries"] += counter.queries - before
        return rec

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """Robust accuracy with its interval, the threat model and the binarization test."""
        m, d = result.metrics, result.details
        bound = "spatial grid" if d["norm"] == "spatial" else f"{d['norm']} ε={d['epsilon']:.4g}"
        text = (f"robust accuracy {pct(m.robust_accuracy)} (95% CI "
                f"{interval_text(result.intervals['robust_accuracy'])}) under {d['attack']} at "
                f"{bound}, ≤{d['max_queries']} queries")
        bt = d.get("binarization")
        if bt:
            ci = result.intervals.get("binarization_score")
            ci_text = f", 95% CI {interval_text(ci)}" if ci else ""
            hardest = bt.get("hardest_passed")
            text += (f"; binarization test {m.binarization_score:.2f}{ci_text} "
                     f"(R-ASR {m.binarization_rasr:.2f}); hardest configuration passed: "
                     f"{hardest['label'] if hardest else 'none'}")
        return text

    def summarize(self, records: list[dict[str, Any]], data: Dataset) -> Measurement:
        n = len(records)
        correct = [r for r in records if r["outcome"] != "misclassified"]
        robust = sum(r["outcome"] == "robust" for r in records)
        broken = sum(r["outcome"] == "broken" for r in records)
        aq = [r["attack_queries"] for r in correct]
        metrics: dict[str, Any] = {
            "robust_accuracy": robust / n if n else 0.0,
            "attack_success_rate": broken / len(correct) if correct else 0.0,
            "clean_accuracy": len(correct) / n if n else 0.0,
            "n": n, "n_robust": robust, "n_broken": broken,
            "queries_median": statistics.median(aq) if aq else 0,
            "queries_mean": statistics.fmean(aq) if aq else 0.0,
            "queries_max": max(aq) if aq else 0,
            **worst_case_coverage(records, lambda r: r["outcome"] == "robust"),
        }
        intervals = {"robust_accuracy": wilson_interval(robust, n),
                     "attack_success_rate": wilson_interval(broken, len(correct))}
        details: dict[str, Any] = {
            "attack": self.attack, "norm": self._norm(), "epsilon": self._epsilon(),
            "max_queries": self.max_queries, "attack_params": self.build().params(),
            "queries_histogram": _histogram(aq, self.max_queries),
        }
        warnings: list[str] = []
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
                "rasr_queries": self.max_queries,
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
        return Measurement(metrics=metrics, intervals=intervals, details=details,
                           warnings=warnings)


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
