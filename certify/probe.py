"""Which input preprocessing does a model expect? Probe it on a few labelled samples.

A model trained on 0–255 pixels, on ImageNet-normalised or ``[-1, 1]`` inputs, or on
OpenCV's BGR images answers near chance when it is fed 0–1 RGB, and nothing in an ONNX file or
an endpoint says which it wants. :func:`probe_preprocessing` asks the model the same labelled
samples through every candidate preprocessing (value range 0–1 or 0–255; mean/std none,
ImageNet's, CIFAR-10's (two common stds), CIFAR-100's, MNIST's, 0.5/0.5 or ImageNet's mean on
0–255 as Caffe models take it; channel order RGB or BGR; and the layout where the model does
not state it) and ranks them by the **mean log-probability the model gives the true labels**
(its log-likelihood, each sample's clipped below at :data:`LOGLIK_FLOOR` × -log K; accuracy
where the model answers labels only), which separates candidates
that an inaccurate model gets right equally often; a candidate clearly less accurate than the
most accurate one (exact McNemar) ranks behind the others whatever its likelihood, as a
model unsure of everything can be surer of its labels at a wrong scale. Candidates the
paired 95% interval of the difference (or a difference under :data:`TIE_NATS`) cannot tell
from the best are tied, and a stated prior from the input size and the
class count breaks the tie (:func:`prior_rank`: 32×32 with 10 or 100 classes, CIFAR's
statistics; 28×28, MNIST's; 160 pixels or more, ImageNet's) before the list order.

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
from certify.stats import mcnemar_exact, wilson_interval

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
#: A best candidate whose accuracy's 95% interval lies wholly below this share of the probe's
#: labels is far from them: a model under test is expected to get most of its own test set
#: right, and one that gets most wrong through every candidate was given none it was trained
#: with (or labels in another class order). An 80% model is not far.
FAR = 0.5
#: "None of those tried" is also said when the best candidate's mean log-likelihood is within
#: this many nats of the uniform model's (-log K: a model that knows nothing) and its accuracy
#: interval does not clear :data:`FAR`, and when no candidate's accuracy interval lies above
#: chance.
UNIFORM_MARGIN_NATS = 0.5
#: Each sample's log-probability of its label is clipped below at ``LOGLIK_FLOOR × log K``
#: (-2 log K: twice the loss of a uniform guess), so that a mislabelled sample, or a confident
#: wrong answer of an over-confident model, cannot outweigh the rest: without the clip a
#: model at its own preprocessing, confident and right on 80% of the labels, lost to a wrong
#: preprocessing that made it less sure of everything.
LOGLIK_FLOOR = 2
#: Two candidates whose labels' mean log-likelihoods differ by less than this many nats are
#: not told apart, however tight the interval: a likelihood grows with the model's confidence,
#: and a ReLU network is surer of the same answers on inputs scaled up by a fifth (CIFAR-10's
#: two common stds), which says nothing about which scale it was trained on.
TIE_NATS = 0.05
#: The z of a two-sided 95% interval.
Z95 = 1.959963984540054
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
    """One candidate's clean accuracy and log-likelihood on the probe samples."""

    candidate: Candidate
    correct: int
    n: int
    #: per sample: whether the candidate's top class was the label
    hits: tuple[bool, ...] = field(repr=False)
    error: str | None = None
    #: per sample: the log-probability the model gave the label (``None``: labels only)
    loglik: tuple[float, ...] | None = field(default=None, repr=False)

    @property
    def mean_loglik(self) -> float | None:
        """Mean log-probability of the labels (nats; ``None`` for a labels-only model)."""
        if not self.loglik:
            return None
        return sum(self.loglik) / len(self.loglik)

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
    return mcnemar_exact(only_a, only_b)


@dataclass(frozen=True)
class ProbeReport:
    """Every candidate's accuracy and log-likelihood on the same probe samples, best first
    (:func:`rank`)."""

    scores: tuple[Score, ...]
    num_classes: int
    queries: int
    #: whether the best was chosen among tied candidates by the prior, and the prior's reason
    tie_broken_by_prior: bool = False
    prior_reason: str = ""

    @property
    def n(self) -> int:
        """Probe samples."""
        return self.scores[0].n if self.scores else 0

    @property
    def best(self) -> Score:
        """The chosen candidate (the first in :func:`rank`'s order)."""
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
        """Whether ``a`` fits the labels better than ``b`` beyond chance variation (see
        :func:`clearly_better`)."""
        return clearly_better(a, b)

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
        if best.mean_loglik is not None:
            lines[0] += f", mean log-probability of the labels {best.mean_loglik:.3f} nats"
        if second is not None:
            margin = best.accuracy - second.accuracy
            p = mcnemar_p(best.hits, second.hits)
            diff = loglik_difference(best, second)
            by = (f"mean log-probability {diff[0]:.3f} nats higher (95% CI {diff[1]:.3f} to "
                  f"{diff[2]:.3f})" if diff is not None and not more_accurate(best, second)
                  else f"{100 * margin:.1f} points more accurate, exact McNemar p = {p:.2g}")
            if self.clearly_better(best, second):
                lines.append(f"runner-up: {second.candidate.label()} with "
                             f"{pct(second.accuracy)}: clearly worse ({by})")
            elif self.tie_broken_by_prior:
                lines.append(f"runner-up: {second.candidate.label()} with "
                             f"{pct(second.accuracy)}: not clearly worse ({by}); the tie is "
                             f"broken by the prior for {self.prior_reason}")
            else:
                lines.append(f"runner-up: {second.candidate.label()} with "
                             f"{pct(second.accuracy)}: NOT clearly worse ({by}); the probe "
                             f"cannot tell them apart on {best.n} samples: check the model's "
                             "documentation, or probe more samples (--samples)")
        if self.near_chance(best):
            lines.append(f"the best accuracy is at chance level (1/{self.num_classes} = "
                         f"{pct(self.chance)}): no candidate fits; check that the labels match "
                         "the model's classes (their order, --labels) and that the model is an "
                         "image classifier of this data")
        elif self.none_fits():
            lines.append(self.far_warning())
        return lines

    def none_fits(self) -> bool:
        """Whether the model's preprocessing may be none of those tried (the stated rule): no
        candidate's accuracy interval lies above chance; or the best candidate's accuracy
        interval lies wholly below :data:`FAR`; or its mean log-likelihood is within
        :data:`UNIFORM_MARGIN_NATS` of the uniform model's while its accuracy interval does
        not clear :data:`FAR` (a model right on most labels fits, however unsure it is)."""
        if not any(s.interval[0] > self.chance for s in self.scores):
            return True
        lo, hi = self.best.interval
        if hi < FAR:
            return True
        ll = self.best.mean_loglik
        return ll is not None and lo < FAR \
            and ll < -math.log(self.num_classes) + UNIFORM_MARGIN_NATS

    def far_warning(self) -> str:
        """The warning for a best candidate far from the labels (:meth:`none_fits`), with the
        flags that state a preprocessing by hand."""
        best = self.best
        tried = ", ".join(["none", *(name.split(" (")[0] for name, _, _ in STATISTICS)])
        ll = best.mean_loglik
        lo, hi = best.interval
        fit = (f"agrees with only {pct(best.accuracy)} of the {best.n} labelled samples (95% CI "
               f"{pct(lo)}–{pct(hi)}, below {pct(FAR)})" if hi < FAR or ll is None else
               f"gives the labels a mean log-probability of {ll:.2f} nats, within "
               f"{UNIFORM_MARGIN_NATS:g} of a model that knows nothing "
               f"({-math.log(self.num_classes):.2f})")
        return (f"even the best candidate {fit}: the model's own preprocessing "
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
            "ranked_by": ("mean log-probability of the labels, after the candidates clearly "
                          "less accurate than the most accurate one" if self.best.loglik
                          else "accuracy (the model answers labels only)"),
            "candidates": [
                {"preprocessing": s.candidate.label(), "correct": s.correct,
                 "accuracy": s.accuracy, "flags": " ".join(s.candidate.flags()),
                 **({"mean_log_likelihood": s.mean_loglik} if s.loglik else {}),
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
    kind = model.info.output
    for c in cands:
        view = model.with_preprocessing(c.preprocessing, c.layout)
        counter = QueryCounter(view, shared=shared)
        error = None
        loglik: tuple[float, ...] | None = None
        try:
            out = torch.cat([counter.predict(x[i:i + batch_size]).float().cpu()
                             for i in range(0, len(x), batch_size)])
            hits = tuple(bool(h) for h in (out.argmax(dim=1) == labels).tolist())
            if kind != "labels":
                logp = (out.clamp(min=1e-12).log() if kind == "probs"
                        else torch.log_softmax(out, dim=1))
                floor = -LOGLIK_FLOOR * math.log(num_classes)
                loglik = tuple(max(float(v), floor)
                               for v in logp[torch.arange(len(labels)), labels])
        except NonFiniteOutput:
            hits = (False,) * len(labels)
            error = "non-finite outputs"
        queries += counter.queries
        scores.append(Score(c, sum(hits), len(hits), hits, error, loglik))
    return rank(scores, num_classes, queries, tuple(int(d) for d in x.shape[1:]))


def loglik_difference(a: Score, b: Score) -> tuple[float, float, float] | None:
    """The mean of ``a``'s per-sample log-likelihood minus ``b``'s on the same samples, with
    its paired 95% interval (normal approximation); ``None`` without log-likelihoods."""
    if not a.loglik or not b.loglik or len(a.loglik) != len(b.loglik):
        return None
    d = [x - y for x, y in zip(a.loglik, b.loglik, strict=True)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) if n > 1 else 0.0
    half = Z95 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def more_accurate(a: Score, b: Score) -> bool:
    """Whether ``a`` is right on more of the probe samples than ``b`` beyond chance variation:
    an exact McNemar test at :data:`SIGNIFICANCE`."""
    return a.correct > b.correct and mcnemar_p(a.hits, b.hits) < SIGNIFICANCE


def clearly_better(a: Score, b: Score) -> bool:
    """Whether ``a`` fits the labels better than ``b`` beyond chance variation: ``a`` is
    clearly more accurate (:func:`more_accurate`); or, neither being so, the paired 95%
    interval of their log-likelihoods' difference lies above 0 and the difference is at least
    :data:`TIE_NATS` (where both have one)."""
    if more_accurate(a, b):
        return True
    if more_accurate(b, a):
        return False
    diff = loglik_difference(a, b)
    return diff is not None and diff[1] > 0 and diff[0] >= TIE_NATS


def prior_rank(c: Candidate, shape: tuple[int, ...], num_classes: int) -> tuple[int, str]:
    """How likely a candidate is before any answer, from the input size and the class count
    (0 most likely), and the reason in words: 32×32 images with 10 classes are CIFAR-10's
    (CIFAR-10's statistics first), with 100 CIFAR-100's; 28×28, MNIST's; images of 160 pixels
    or more ImageNet's. Otherwise every candidate ranks alike (the list order decides)."""
    h, w = (shape[-2], shape[-1]) if len(shape) >= 2 else (0, 0)
    if (h, w) == (32, 32) and num_classes in (10, 100):
        want, why = (("CIFAR-10", "32×32 images with 10 classes (CIFAR-10)") if
                     num_classes == 10 else ("CIFAR-100", "32×32 images with 100 classes "
                                                          "(CIFAR-100)"))
    elif (h, w) == (28, 28):
        want, why = "MNIST", "28×28 images (MNIST)"
    elif min(h, w) >= 160:
        want, why = "ImageNet", f"{h}×{w} images (ImageNet)"
    else:
        return 0, ""
    return (0 if c.values.startswith(want) else 1), why


def rank(scores: Sequence[Score], num_classes: int, queries: int,
         shape: tuple[int, ...] = ()) -> ProbeReport:
    """Scores best first: by mean log-likelihood of the labels (by correct answers for a
    labels-only model), after every candidate clearly less accurate than the most accurate one
    (exact McNemar, :func:`more_accurate`) has been put behind the others: a likelihood
    rewards a confident model, and an untrained or badly calibrated one can be surer of its
    labels at a wrong scale while getting fewer of them right. The best is chosen among the
    candidates the probe cannot tell from the top one (:func:`clearly_better`) by
    :func:`prior_rank`, then by the candidates' list order (plain before normalised, each
    statistic's canonical form first); the rest follow."""
    by_likelihood = any(s.loglik for s in scores)
    valid = [s for s in scores if s.error is None]
    most = max(valid, key=lambda s: s.correct) if valid else None
    behind = [most is not None and more_accurate(most, s) for s in scores]

    def key(i: int) -> tuple[bool, float, int]:
        if not by_likelihood:
            return (behind[i], -scores[i].correct, i)
        ll = scores[i].mean_loglik  # a candidate without one (non-finite answers) goes last
        return (behind[i], -ll if ll is not None else math.inf, i)

    order = sorted(range(len(scores)), key=key)
    if not order:
        return ProbeReport((), num_classes, queries)
    top = scores[order[0]]
    tied = [i for i in order
            if scores[i] is top or (scores[i].error is None and not behind[i]
                                    and _tied(top, scores[i]))]
    prior = {i: prior_rank(scores[i].candidate, shape, num_classes) for i in tied}
    chosen = min(tied, key=lambda i: (prior[i][0], i))  # then the candidates' list order
    broken = chosen != order[0]
    order = [chosen, *(i for i in order if i != chosen)]
    return ProbeReport(tuple(scores[i] for i in order), num_classes, queries, broken,
                       prior[chosen][1] if broken else "")


def _tied(a: Score, b: Score) -> bool:
    """Whether the probe cannot tell ``b`` from ``a``, the top candidate: neither is clearly
    better (:func:`clearly_better`)."""
    return not clearly_better(a, b) and not clearly_better(b, a)


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
