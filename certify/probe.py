"""Which input preprocessing does a model expect? Probe it on a few labelled samples.

A model trained on 0–255 pixels, on ImageNet-normalised or ``[-1, 1]`` inputs, or on
OpenCV's BGR images answers near chance when it is fed 0–1 RGB, and nothing in an ONNX file or
an endpoint says which it wants. :func:`probe_preprocessing` asks the model the same labelled
samples through every candidate preprocessing (value range 0–1 or 0–255; mean/std none,
ImageNet's, CIFAR-10's (two common stds), CIFAR-100's, MNIST's, 0.5/0.5 or ImageNet's mean on
0–255 as Caffe models take it; channel order RGB or BGR; and the layout where the model does
not state it) and ranks them by clean accuracy, with
an exact McNemar test between the best and the runner-up on the same samples.

``certify init`` uses it to write a suite; a run whose clean accuracy is at chance level uses
it to name the preprocessing that would fix it (:func:`chance_diagnosis`). Every query goes
through a :class:`~certify.models.base.QueryCounter` charged to the caller's budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from certify.errors import ModelError, NonFiniteOutput
from certify.models.base import Budget, Model, Preprocessing, QueryCounter, Reconfigurable
from certify.stats import wilson_interval

if TYPE_CHECKING:
    import torch

#: ImageNet's per-channel mean and std (RGB, for pixels in [0, 1]): torchvision's constants.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The normalisations trained models commonly use (RGB, for pixels in [0, 1]), by name: the
#: training set's per-channel mean and std (CIFAR-10's std also as the widely copied
#: (0.2023, 0.1994, 0.2010) of the kuangliu/pytorch-cifar recipes; MNIST's single channel for
#: every channel).
STATISTICS: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = (
    ("ImageNet mean/std", IMAGENET_MEAN, IMAGENET_STD),
    ("CIFAR-10 mean/std", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    ("CIFAR-10 mean, std 0.2023/0.1994/0.2010", (0.4914, 0.4822, 0.4465),
     (0.2023, 0.1994, 0.2010)),
    ("CIFAR-100 mean/std", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    ("MNIST mean/std", (0.1307,) * 3, (0.3081,) * 3),
    ("[-1, 1] (mean/std 0.5)", (0.5,) * 3, (0.5,) * 3),
)
#: A best candidate that agrees with fewer of the probe's labels than this is said to be far
#: from them: the model's preprocessing may be none of those tried.
FAR = 0.9
#: Samples a probe uses at most (class-stratified by the caller).
PROBE_SAMPLES = 64
#: Two candidates whose exact McNemar p-value is at or above this are "not clearly" apart.
SIGNIFICANCE = 0.05

_NONE = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


@dataclass(frozen=True)
class Candidate:
    """One way of turning certify's ``[0, 1]`` RGB images into the model's input."""

    preprocessing: Preprocessing
    layout: str
    #: What the value range and normalisation are, in words (``0–255``, ``ImageNet mean/std``)
    values: str

    def label(self) -> str:
        """The candidate in a few words, e.g. ``0–255, RGB, NHWC``."""
        return f"{self.values}, {self.preprocessing.channel_order}, {self.layout}"

    def same_as(self, other: Candidate) -> bool:
        """Whether two candidates feed the model the same numbers."""
        return _key(self) == _key(other)

    def flags(self, current: Candidate | None = None) -> list[str]:
        """``certify run`` options that select this candidate (only those that differ from
        ``current``; all of them without it)."""
        pre, cur = self.preprocessing, (current.preprocessing if current else None)
        out: list[str] = []
        if cur is None or pre.input_scale != cur.input_scale:
            out.append(f"--input-scale {_num(pre.input_scale)}")
        if cur is None or pre.mean != cur.mean or pre.std != cur.std:
            out.append("--mean " + " ".join(_num(v) for v in pre.mean))
            out.append("--std " + " ".join(_num(v) for v in pre.std))
        if cur is None or pre.channel_order != cur.channel_order:
            out.append(f"--channel-order {pre.channel_order}")
        if current is not None and self.layout != current.layout:
            out.append(f"--input-layout {self.layout}")
        return out

    def suite_keys(self, current: Candidate | None = None) -> list[str]:
        """The suite's ``preprocessing`` keys that select it, as ``key: value`` (those that
        differ from ``current``)."""
        pre, cur = self.preprocessing, (current.preprocessing if current else None)
        out: list[str] = []
        if cur is None or pre.input_scale != cur.input_scale:
            out.append(f"input_scale: {_num(pre.input_scale)}")
        if cur is None or pre.mean != cur.mean or pre.std != cur.std:
            out.append(f"mean: [{', '.join(_num(v) for v in pre.mean)}]")
            out.append(f"std: [{', '.join(_num(v) for v in pre.std)}]")
        if cur is None or pre.channel_order != cur.channel_order:
            out.append(f"channel_order: {pre.channel_order}")
        return out

    def expects(self, current: Candidate) -> str:
        """What the model probably expects, in words, where this candidate differs from
        ``current`` (e.g. ``0–255 input``)."""
        parts = []
        if self.values != current.values:
            parts.append(f"{self.values} input")
        if self.preprocessing.channel_order != current.preprocessing.channel_order:
            parts.append(f"{self.preprocessing.channel_order} channel order")
        if self.layout != current.layout:
            parts.append(f"{self.layout} layout")
        return " and ".join(parts) or "this preprocessing"


def _num(v: float) -> str:
    return f"{v:g}" if float(v) != int(v) else str(int(v))


def _key(c: Candidate) -> tuple[Any, ...]:
    p = c.preprocessing
    s = p.input_scale
    # (x * s - m) / d is the same map as (x - m / s) / (d / s): compare in [0, 1] units
    return (tuple(round(m / s, 6) for m in p.mean), tuple(round(d / s, 6) for d in p.std),
            p.channel_order, c.layout)


def _values(pre: Preprocessing) -> str:
    """The value range / normalisation of a preprocessing, in words."""
    s = pre.input_scale
    mean = tuple(m / s for m in pre.mean)
    std = tuple(d / s for d in pre.std)

    def near(a: Sequence[float], b: Sequence[float]) -> bool:
        return all(abs(x - y) < 1e-4 for x, y in zip(a, b, strict=True))

    if near(pre.mean, _NONE[0]) and near(pre.std, _NONE[1]):
        return "0–1" if s == 1 else "0–255" if s == 255 else f"0–{_num(s)}"
    if len(mean) == len(std) == 3:
        for name, m, d in STATISTICS:
            if near(mean, m) and near(std, d):
                return name
    if near(mean, IMAGENET_MEAN) and near(pre.std, _NONE[1]) and s == 255:
        return "0–255 minus ImageNet mean"
    return (f"scale {_num(s)}, mean {[round(m, 4) for m in pre.mean]}, "
            f"std {[round(d, 4) for d in pre.std]}")


def candidate(pre: Preprocessing, layout: str) -> Candidate:
    """A :class:`Candidate` for a given preprocessing and layout."""
    return Candidate(pre, layout, _values(pre))


def candidates(layouts: Sequence[str], current: Candidate | None = None) -> list[Candidate]:
    """Every candidate preprocessing for the given layouts, ``current`` first (ties go to it),
    then the plain ones before the normalised ones and RGB before BGR."""
    ranges: list[tuple[float, tuple[float, ...], tuple[float, ...]]] = [
        (1.0, *_NONE),
        (255.0, *_NONE),
        *((1.0, mean, std) for _, mean, std in STATISTICS),
        (255.0, tuple(255 * m for m in IMAGENET_MEAN), (1.0, 1.0, 1.0)),
    ]
    out: list[Candidate] = [current] if current is not None else []
    for layout in layouts:
        for order in ("RGB", "BGR"):
            for scale, mean, std in ranges:
                c = candidate(Preprocessing(input_scale=scale, mean=mean, std=std,
                                            channel_order=order), layout)
                if not any(c.same_as(o) for o in out):
                    out.append(c)
    return out


@dataclass(frozen=True)
class Score:
    """One candidate's clean accuracy on the probe samples."""

    candidate: Candidate
    correct: int
    n: int
    #: per sample: whether the candidate's top class was the label
    hits: tuple[bool, ...] = field(repr=False)
    error: str | None = None

    @property
    def accuracy(self) -> float:
        """Share of probe samples classified correctly."""
        return self.correct / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """95% Wilson interval of the accuracy."""
        return wilson_interval(self.correct, self.n)


def mcnemar_p(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for paired outcomes: whether ``a`` and ``b`` differ on
    the same samples more often one way than the other (1.0 when they never disagree)."""
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class ProbeReport:
    """Every candidate's accuracy on the same probe samples, best first."""

    scores: tuple[Score, ...]
    num_classes: int
    queries: int

    @property
    def n(self) -> int:
        """Probe samples."""
        return self.scores[0].n if self.scores else 0

    @property
    def best(self) -> Score:
        """The candidate with the most correct answers (the earliest on a tie)."""
        return self.scores[0]

    @property
    def runner_up(self) -> Score | None:
        """The best candidate that feeds the model other numbers than the best."""
        return self.scores[1] if len(self.scores) > 1 else None

    @property
    def chance(self) -> float:
        """Chance-level accuracy, 1/K."""
        return 1.0 / self.num_classes

    def clearly_better(self, a: Score, b: Score) -> bool:
        """Whether ``a`` is right on more probe samples than ``b`` beyond chance variation
        (exact McNemar test at :data:`SIGNIFICANCE` on the same samples)."""
        return a.correct > b.correct and mcnemar_p(a.hits, b.hits) < SIGNIFICANCE

    def near_chance(self, score: Score) -> bool:
        """Whether a candidate's accuracy is at chance level (see :func:`at_chance`)."""
        return at_chance(score.accuracy, score.interval, self.num_classes)

    def score_of(self, c: Candidate) -> Score | None:
        """The score of the candidate that feeds the model the same numbers as ``c``."""
        return next((s for s in self.scores if s.candidate.same_as(c)), None)

    def explanation(self) -> list[str]:
        """Why the best candidate was picked, in sentences (and when it should not be trusted)."""
        best, second = self.best, self.runner_up
        lines = [f"best: {best.candidate.label()} with {pct(best.accuracy)} "
                 f"({best.correct}/{best.n}) on {best.n} labelled samples"]
        if second is not None:
            margin = best.accuracy - second.accuracy
            p = mcnemar_p(best.hits, second.hits)
            if self.clearly_better(best, second):
                lines.append(f"runner-up: {second.candidate.label()} with "
                             f"{pct(second.accuracy)}: {100 * margin:.1f} points lower, clearly "
                             f"(exact McNemar p = {p:.2g})")
            else:
                lines.append(f"runner-up: {second.candidate.label()} with "
                             f"{pct(second.accuracy)}: NOT clearly worse ("
                             f"{100 * margin:.1f} points, exact McNemar p = {p:.2g}); the "
                             "probe cannot tell them apart on "
                             f"{best.n} samples: check the model's documentation, or probe "
                             "more samples (--samples)")
        if self.near_chance(best):
            lines.append(f"the best accuracy is at chance level (1/{self.num_classes} = "
                         f"{pct(self.chance)}): no candidate fits; check that the labels match "
                         "the model's classes (their order, --labels) and that the model is an "
                         "image classifier of this data")
        elif best.accuracy < FAR:
            lines.append(self.far_warning())
        return lines

    def far_warning(self) -> str:
        """The warning for a best candidate far from the labels (below :data:`FAR`), with the
        flags that state a preprocessing by hand."""
        best = self.best
        tried = ", ".join(["none", *(name.split(" (")[0] for name, _, _ in STATISTICS)])
        return (f"even the best candidate agrees with only {pct(best.accuracy)} of the "
                f"{best.n} labelled samples (under {pct(FAR)}): the model's own preprocessing "
                f"may be none of those tried (0–1 or 0–255; mean/std {tried}; RGB or BGR). If "
                "you know it, state it: --input-scale S --mean R G B --std R G B "
                "--channel-order RGB|BGR (preprocessing: in the suite); the suite written uses "
                f"the best candidate ({' '.join(best.candidate.flags())})")

    def to_doc(self, current: Candidate | None = None) -> dict[str, Any]:
        """Plain JSON for the measurement: each candidate's accuracy, best first."""
        return {
            "n": self.n,
            "queries": self.queries,
            "current": None if current is None else current.label(),
            "candidates": [
                {"preprocessing": s.candidate.label(), "correct": s.correct,
                 "accuracy": s.accuracy, "flags": " ".join(s.candidate.flags()),
                 **({"error": s.error} if s.error else {})}
                for s in self.scores
            ],
        }


def pct(v: float) -> str:
    """A share as a percentage with one decimal."""
    return f"{100 * v:.1f}%"


def at_chance(accuracy: float, interval: tuple[float, float] | Sequence[float | None],
              num_classes: int) -> bool:
    """Whether a clean accuracy is at chance level for ``num_classes`` classes: its 95%
    interval reaches down to 1/K or below, or it is within 5 points of 1/K."""
    chance = 1.0 / max(1, num_classes)
    lo = interval[0] if interval and interval[0] is not None else accuracy
    return float(lo) <= chance or accuracy <= chance + 0.05


def layouts_of(model: Model) -> list[str]:
    """The layouts worth probing: the model's own, or both where it is a guess (a v1
    endpoint given no ``--input-layout``)."""
    from certify.models.http import HttpModel

    if isinstance(model, HttpModel) and model.layout_guessed:
        return [model.layout, "NCHW" if model.layout == "NHWC" else "NHWC"]
    return [model.info.layout]


def probe_preprocessing(
    model: Model,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    *,
    current: Candidate | None = None,
    layouts: Sequence[str] | None = None,
    budget: Budget | None = None,
    batch_size: int = 64,
) -> ProbeReport:
    """Every candidate preprocessing's clean accuracy on ``x`` ``[N, C, H, W]`` in ``[0, 1]``
    with labels ``y``, best first.

    ``model`` must be :class:`~certify.models.base.Reconfigurable` (ONNX files and endpoints
    are). ``layouts`` are tried where the model does not state its own (default: its own).
    Queries (``len(x)`` per candidate) go through a counter charged to ``budget``.
    """
    import torch

    if not isinstance(model, Reconfigurable):
        raise ModelError(f"{model.info.name} cannot be asked through another preprocessing",
                         hint="set the preprocessing in the suite by hand")
    layouts = list(layouts or [model.info.layout])
    cands = candidates(layouts, current)
    labels = y.cpu()
    scores: list[Score] = []
    queries = 0
    shared = (budget,) if budget is not None else ()
    for c in cands:
        view = model.with_preprocessing(c.preprocessing, c.layout)
        counter = QueryCounter(view, shared=shared)
        error = None
        try:
            preds = torch.cat([counter.predict(x[i:i + batch_size]).argmax(dim=1).cpu()
                               for i in range(0, len(x), batch_size)])
            hits = tuple(bool(h) for h in (preds == labels).tolist())
        except NonFiniteOutput:
            hits = (False,) * len(labels)
            error = "non-finite outputs"
        queries += counter.queries
        scores.append(Score(c, sum(hits), len(hits), hits, error))
    order = sorted(range(len(scores)), key=lambda i: (-scores[i].correct, i))
    return ProbeReport(tuple(scores[i] for i in order), num_classes, queries)


def chance_diagnosis(report: ProbeReport, current: Candidate, accuracy: float,
                     interval: Sequence[float | None]) -> str | None:
    """The warning for a run whose clean ``accuracy`` is at chance level when another
    preprocessing is clearly better on the probe samples, naming the fix; ``None`` when none
    is (the chance level then has another cause than the preprocessing)."""
    best = report.best
    mine = report.score_of(current)
    if best.candidate.same_as(current) or mine is None or report.near_chance(best) \
            or not report.clearly_better(best, mine):
        return None
    k = report.num_classes
    flags = " ".join(best.candidate.flags(current))
    keys = ", ".join(best.candidate.suite_keys(current))
    lo, hi = (interval[0], interval[1]) if len(interval) == 2 else (None, None)
    ci = f" (95% CI {pct(float(lo))}–{pct(float(hi))})" if lo is not None and hi is not None \
        else ""
    return (f"clean accuracy {pct(accuracy)}{ci} is at chance level (1/{k} = {pct(1 / k)}); "
            f"with {flags} it is {pct(best.accuracy)} on {best.n} probe samples (as given: "
            f"{pct(mine.accuracy)}): the model probably expects "
            f"{best.candidate.expects(current)}. Rerun with {flags}, or set "
            f"preprocessing: {{{keys}}} in the suite")
