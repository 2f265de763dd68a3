"""A certified lower bound of robust accuracy: bound propagation over the model's own graph.

Every robust accuracy an attack measures is an upper bound (what the attacks could not break).
This check proves, per sample, that no perturbation of its threat model (the L∞ or L2 ball of
radius ε around the image, intersected with the pixel box ``[0, 1]``, taken through the model's
preprocessing) changes the answer: the lower bound of ``true logit − every other logit`` over
that set, computed by :mod:`certify.models.bound_ops`, exceeds the graph's numeric tolerance
against the model itself. Methods run weakest first, each on the samples the ones before left
unproved: interval bounds (IBP), then CROWN, then α-CROWN; each method's bound is intersected
with the previous one's, so the certified counts are ordered by construction.

Soundness against the model that answers: the graph is evaluated in float64; on each batch its
logits are compared with the model's own scores (onnxruntime for an ONNX file, the program for a
``.pt2``) at the clean images, as the white-box copy is (:data:`certify.models.torchcopy.
TOLERANCE` times the scores' scale). A graph that disagrees beyond that is refused, and a margin
counts only above twice that tolerance (a difference of two logits).

**Device.** Bound propagation runs on the CPU in float64, also where the run has a GPU (said
once in the log); the model's own answers come from the run's device.

**Budget.** ``seconds_per_sample`` times the batch's correct samples is the batch's time; a
stronger method starts only while time is left, and the samples it would have tried count as
*not certified* (``budget`` in their records), never as certified.

The runner puts the certified share beside its threat model's row (:mod:`certify.engine.
crosscheck`): a sample certified here and broken by an attack of the same threat model is a bug
of certify, which stops the run (exit 70) with both records.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from certify.checks.base import Check, CheckContext, Measurement
from certify.data import Dataset
from certify.errors import SuiteError
from certify.kinds import CERTIFIED_METHODS, CertifiedKind
from certify.models.base import Model
from certify.norms import L2, LINF, Norm, ThreatModel
from certify.norms import norm as norm_named
from certify.params import Param, Params
from certify.rundir import SampleRecord
from certify.stats import wilson_interval

if TYPE_CHECKING:
    import torch

log = logging.getLogger("certify")

#: The methods, weakest first (:data:`certify.models.bound_ops.METHODS`).
METHODS = ("ibp", "crown", "alpha")
#: Set once the CPU-only bound propagation was said in the log (per process).
_SAID_CPU: list[bool] = []
#: The methods' names on the card.
METHOD_NAMES = CERTIFIED_METHODS


class CertifiedRecord(SampleRecord, total=False):
    """A certified record: the label, the method that proved it (or ``None``), each method's
    lower bound of the margin where it ran, and whether the budget stopped a method."""

    label: int
    method: str | None
    margins: dict[str, float]
    tolerance: float
    budget: bool


class Certified(CertifiedKind, Check[CertifiedRecord]):
    """Certified robust accuracy within an L∞ or L2 ball by bound propagation over the model's
    ONNX graph or exported program: a lower bound beside the attacks of its threat model.

    Parameters: ``norm`` (linf or l2), ``epsilon`` (8/255 and 0.5 by default, as the attacks),
    ``methods`` (a list of ibp, crown, alpha; all three by default), ``alpha_steps`` (α-CROWN's
    optimisation steps), ``seconds_per_sample`` (the time budget), ``max_crown_neurons``
    (tensors wider than this per sample keep interval bounds as CROWN's intermediate bounds).
    """

    #: bound propagation is heavy per sample: record in small units
    record_batch: ClassVar[int | None] = 16

    suite_params: ClassVar[Params] = Params(
        Param("norm", str, "linf", "the threat norm", choices=("linf", "l2")),
        Param("epsilon", float | None, None,
              "the threat model's radius in [0, 1] pixel units (8/255 for linf and 0.5 for l2 "
              "when unset, as the attacks)", low=0, low_open=True),
        Param("methods", list[str] | None, None,
              "the bound methods, run weakest first on the samples the ones before left "
              "unproved: ibp, crown, alpha (α-CROWN); unset: all three"),
        Param("alpha_steps", int, 30, "α-CROWN: Adam steps on the lower slopes", low=1),
        Param("seconds_per_sample", float, 20.0,
              "time budget per correctly classified sample (a batch's whole budget is shared "
              "by its samples); samples a method could not try in time count as not certified",
              low=0, low_open=True),
        Param("max_crown_neurons", int, 4096,
              "CROWN's intermediate bounds only for tensors up to this many values per sample "
              "(wider ones keep interval bounds: sound, looser)", low=1),
    )

    def __init__(self, norm: str = "linf", epsilon: float | None = None,
                 methods: list[str] | None = None, alpha_steps: int = 30,
                 seconds_per_sample: float = 20.0, max_crown_neurons: int = 4096) -> None:
        self.norm = norm
        self.epsilon = epsilon
        self.methods = methods
        self.alpha_steps = alpha_steps
        self.seconds_per_sample = seconds_per_sample
        self.max_crown_neurons = max_crown_neurons
        self._graphs: dict[str, Any] = {}

    # -- configuration --------------------------------------------------------------------
    def _norm(self) -> Norm:
        return norm_named(self.norm)

    def threat_model(self) -> ThreatModel:
        """The threat model this check proves robustness in (paired with its attacks')."""
        nm = self._norm()
        return ThreatModel(nm, float(self.epsilon if self.epsilon is not None
                                     else nm.default_epsilon))

    def chosen_methods(self) -> tuple[str, ...]:
        """The methods to run, weakest first."""
        wanted = set(self.methods if self.methods is not None else METHODS)
        return tuple(m for m in METHODS if m in wanted)

    def check_params(self, where: str) -> None:
        super().check_params(where)
        if self._norm() not in (LINF, L2):
            raise SuiteError(f"{where}.params.norm: certified bounds cover linf and l2, not "
                             f"{self.norm}")
        unknown = [m for m in (self.methods or []) if m not in METHODS]
        if unknown or self.methods == []:
            raise SuiteError(f"{where}.params.methods: unknown or no method(s) "
                             f"{', '.join(map(str, unknown))}".rstrip(),
                             hint=f"choose from {', '.join(METHODS)}")
        if self.threat_model().norm is LINF and self.threat_model().epsilon > 1:
            raise SuiteError(f"{where}.params.epsilon: an L∞ radius in [0, 1] pixel units, "
                             f"not {self.epsilon}")

    def unavailable(self, model: Model) -> str | None:
        """Why this model has no certified bounds (``certified: not available (…)``), read
        from its graph before any query; ``None`` when its graph can be bounded."""
        from certify.models.bound_ops import BoundsUnavailable
        from certify.models.bound_source import bound_graph_of, check_agreement

        try:
            check_agreement(model, bound_graph_of(model, self.max_crown_neurons))
        except BoundsUnavailable as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - reading the graph failed: said, not raised
            return (f"certified: not available (graph): {type(exc).__name__}: "
                    f"{str(exc)[:200]}")
        return None

    # -- measurement ----------------------------------------------------------------------
    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[CertifiedRecord]:
        from certify.models.bound_source import bound_graph_of, margin_tolerance

        graph = bound_graph_of(model, self.max_crown_neurons)
        if ctx.device.type != "cpu" and not _SAID_CPU:
            _SAID_CPU.append(True)
            log.info("certified: bound propagation runs on the CPU in float64 (not on %s "
                     "yet); the model's own answers come from %s", ctx.device, ctx.device)
        scores = model.predict(x).detach().cpu()
        correct = scores.argmax(1) == y.cpu()
        recs: list[CertifiedRecord] = [
            {"outcome": "not_certified" if bool(c) else "misclassified", "label": int(t),
             "queries": 1, "method": None, "margins": {}, "budget": False}
            for c, t in zip(correct.tolist(), y.tolist(), strict=True)]
        todo = correct.nonzero().flatten().tolist()
        if not todo:
            return recs
        xs, ys = x.detach().cpu()[todo], y.cpu()[todo]
        tol = margin_tolerance(graph, xs, scores[todo], model.info.name)
        for r in (recs[i] for i in todo):
            r["tolerance"] = tol
        tm = self.threat_model()
        deadline = time.monotonic() + self.seconds_per_sample * len(todo)
        chosen = self.chosen_methods()
        stages = [s for s in (("ibp",), tuple(m for m in chosen if m != "ibp")) if s]
        if "ibp" not in chosen:
            stages = [tuple(chosen)]
        left = list(range(len(todo)))
        for k, stage in enumerate(stages):
            if not left:
                break
            if k and time.monotonic() > deadline:
                for j in left:
                    recs[todo[j]]["budget"] = True
                break
            names = " → ".join(METHOD_NAMES[m] for m in stage)
            ctx.say_step(f"{names} on {len(left)} sample(s)", len(left))
            found = self._bound(graph, xs[left], ys[left], tm, stage, deadline, tol)
            left = [j for j, margins in zip(left, found, strict=True)
                    if not self._record(recs[todo[j]], margins, stage, tol)]
        return recs

    @staticmethod
    def _record(rec: CertifiedRecord, margins: dict[str, float] | None,
                stage: tuple[str, ...], tol: float) -> bool:
        """Write a stage's margins into ``rec``; whether they proved the sample (its method:
        the weakest of the stage above ``tol``). ``None``: the budget stopped it."""
        if margins is None:
            rec["budget"] = True
            return False
        for m in stage:
            if m not in margins:
                continue
            v = margins[m]
            rec["margins"][m] = v if math.isfinite(v) else math.copysign(1e300, v)
            if v > tol:
                rec["outcome"], rec["method"] = "certified", m
                return True
        return False

    def _bound(self, graph: Any, x: torch.Tensor, y: torch.Tensor, tm: ThreatModel,
               stage: tuple[str, ...], deadline: float, tol: float
               ) -> list[dict[str, float] | None]:
        """Each sample's lower bounds of its margin by the stage's methods (each intersected
        with the weaker methods' by :meth:`BoundGraph.bounds`; α-CROWN only where CROWN did
        not prove it), in chunks the graph takes at once; ``None`` for a sample whose CROWN
        pass the time budget stopped (never certified)."""
        from certify.models.bound_ops import BudgetSpent

        strong = stage != ("ibp",)
        # CROWN's coefficients grow with the batch: one sample at a time; IBP takes the batch
        # where the graph does
        step = 1 if strong or not getattr(graph, "batched", True) else len(x)
        out: list[dict[str, float] | None] = []
        for s in range(0, len(x), step):
            try:
                res = graph.bounds(x[s:s + step], y[s:s + step], tm.norm, tm.epsilon,
                                   methods=stage, alpha_steps=self.alpha_steps,
                                   deadline=deadline if strong else None, enough=tol)
            except BudgetSpent:
                out.extend([None] * (len(x) - s))
                break
            values = {m: v.tolist() for m, v in res.margins.items()}
            out.extend({m: float(values[m][i]) for m in values} for i in range(len(x[s:s + step])))
        return out

    def outcome_bits(self, records: list[CertifiedRecord]) -> dict[str, list[bool]]:
        """``certified`` per sample."""
        return {"certified": [r["outcome"] == "certified" for r in records]}

    def summarize(self, records: list[CertifiedRecord], data: Dataset) -> Measurement:
        n = len(records)
        proved = [r.get("method") for r in records if r["outcome"] == "certified"]
        correct = sum(r["outcome"] in ("certified", "not_certified") for r in records)
        chosen = self.chosen_methods()
        metrics: dict[str, float] = {
            "certified_accuracy": len(proved) / n if n else 0.0,
            "clean_accuracy": correct / n if n else 0.0,
            "n": n, "n_certified": len(proved),
            "n_budget": sum(bool(r.get("budget")) for r in records)}
        for k, m in enumerate(chosen):
            metrics[f"n_certified_{m}"] = sum(p in chosen[:k + 1] for p in proved)
        tm = self.threat_model()
        tols = [float(r["tolerance"]) for r in records if "tolerance" in r]
        warnings = []
        if metrics["n_budget"]:
            warnings.append(f"the time budget ({self.seconds_per_sample:g} s per sample) ran "
                            f"out before {int(metrics['n_budget'])} sample(s) had every method: "
                            "they count as not certified")
        return Measurement(
            metrics=metrics,
            intervals={"certified_accuracy": wilson_interval(len(proved), n),
                       "clean_accuracy": wilson_interval(correct, n)},
            details={"norm": tm.norm.name, "epsilon": tm.epsilon,
                     "methods": [METHOD_NAMES[m] for m in chosen],
                     "method_keys": list(chosen), "alpha_steps": self.alpha_steps,
                     "seconds_per_sample": self.seconds_per_sample,
                     "max_crown_neurons": self.max_crown_neurons,
                     "tolerance_max": max(tols) if tols else None,
                     "by_method": {m: int(metrics[f"n_certified_{m}"]) for m in chosen}},
            warnings=warnings)


def certified_of(check: Check[Any]) -> Certified | None:
    """``check`` as a certified check (its role is a certified bound), else ``None``."""
    return check if isinstance(check, Certified) else None
