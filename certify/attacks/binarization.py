"""The binarization test (Zimmermann et al. 2022, Algorithm 1): is the attack strong enough?

For a test image x_c the test builds a binary classifier h = g ∘ f* from the model's own
feature extractor f* and a new linear readout g, trained to separate N_i points inside the
(1 - gap)·ε ball (x_c included) from N_b points on the ε boundary (corners for L∞, the sphere
for L2). If g separates them perfectly, every boundary point is an ε-bounded adversarial
example of h at x_c, so a sound attack must find one. The test score is the attack's success
rate on such planted problems; the R-ASR is how often random sampling in the ball with the same
number of queries succeeds (how hard the test is).

Features: the ONNX model's penultimate tensor when the graph has one; otherwise the model's
output vector (log-probabilities for probability outputs), which the card reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from certify.attacks import Attack, AttackResult, project
from certify.attacks.base import Predictor, Uniforms
from certify.attacks.simple import random_ball_points
from certify.norms import NORMS, Norm, ThreatModel
from certify.norms import norm as norm_named

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BinarizationSettings:
    """Hardness knobs (the reference implementation's N_i 999, N_b 1, gap 0.05 by default).

    Harder: more inner points (``n_inner``), a smaller gap between the inner ball and the
    boundary (``inner_gap``, 1 - ξ in the paper), and the readout's threshold closer to the
    planted boundary point (``closeness``: 0 at the highest inner score, 1 at the boundary
    point's score), which shrinks the region of planted adversarial examples (§4.3), and
    inner points on the shell of the (1 - gap)·ε ball (``inner_shell``: the share of them on
    its corners for L∞, its sphere for L2; the rest uniform inside). Uniform inner points in an
    L∞ ball have |δ| ≈ ε/2 per pixel, so a readout learns "a corner" and any random corner is
    adversarial; inner points on the shell force it to learn the planted corner's direction.
    """

    n_inner: int = 999
    n_boundary: int = 1
    inner_gap: float = 0.05
    closeness: float = 0.5
    inner_shell: float = 0.0

    def label(self) -> str:
        """Short name for tables and the card, e.g. ``N_i=999 gap=0.01 closeness=0.999``."""
        return (f"N_i={self.n_inner} N_b={self.n_boundary} gap={self.inner_gap:g} "
                f"closeness={self.closeness:g} shell={self.inner_shell:g}")


#: Test configurations per threat model, hardest first (§4.3: start as hard as possible and
#: ease until the attack passes). The same ladder for every model and budget.
LADDER: dict[Norm, tuple[BinarizationSettings, ...]] = {
    norm: (
        BinarizationSettings(n_inner=999, inner_gap=0.01, closeness=0.999, inner_shell=1.0),
        BinarizationSettings(n_inner=999, inner_gap=0.02, closeness=0.99, inner_shell=0.5),
        BinarizationSettings(n_inner=999, inner_gap=0.05, closeness=0.9),
        BinarizationSettings(n_inner=499, inner_gap=0.05, closeness=0.5),
    )
    for norm in NORMS.values() if norm.binarization
}

#: The packaged test configuration per threat model, on which the pass rule is applied: one
#: rung of :data:`LADDER`, chosen by benchmarks/binarization_power.py (benchmarks/RESULTS.md,
#: "Binarization test power"), not tuned per budget or per model.
PACKAGED: dict[Norm, BinarizationSettings] = {norm: ladder[0] for norm, ladder in LADDER.items()}

#: Attacks for which no rung of the ladder told a starved budget from an adequate one on the
#: demo model (benchmarks/RESULTS.md, "Binarization test power"): for them the test is a
#: necessary condition only, and the card says so. A measured fact about the ladder, recorded
#: by hand from the benchmark, not computed at run time.
NECESSARY_ONLY: dict[str, str] = {
    # Square L∞ at 100 queries solved the packaged rung on 16 of 20 benchmark signs but on 10
    # of 10 others, in under 100 queries, at every hardness tried (gap 0.001, closeness 0.9999).
    "square_linf": "measured on certify's demo model: starved at 100 queries, Square L∞ still "
                   "solved the packaged configuration on 10 of 10 signs, in 22 to 91 queries",
    # HopSkipJump at 1,000 and at 5,000 queries scored the same on every rung (0.60 on the
    # packaged one): what decides a planted problem for it is settled in its first iterations.
    "hopskipjump": "measured on certify's demo model: HopSkipJump scored 0.60 on the packaged "
                   "configuration at 1,000 and at 5,000 queries alike",
    # Square L2 scored 1.00 on the packaged rung at 1,000 queries while a white-box PGD left
    # 24% of the demo's standard model robust against its 67% (issue 27): the planted readout
    # sits on the penultimate tensor, so the test does not see what starves the attack.
    "square_l2": "measured on certify's demo model: Square L2 scored 1.00 on the packaged "
                 "configuration at 1,000 queries, where it left 67% of the signs robust and a "
                 "white-box PGD 24%",
}


class BinarizedModel:
    """h(x) = g(f*(x)): two classes, 0 = like x_c (inner), 1 = planted adversarial side.

    Scores mimic the original model's output kind and logit range (the paper's footnote 3).
    With ``head`` (the operations after the real model's last linear layer, from its torch
    copy), the planted readout takes that layer's place and the head follows it, as in the real
    model: a head that starves an attack of signal starves it on the planted problem too.
    """

    def __init__(self, model: Any, feature_fn: Any, w: torch.Tensor, threshold: float,
                 scale: float, output: str, one_hot: bool = False,
                 head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.model = model
        self.head = head
        self.feature_fn = feature_fn
        self.w = w
        self.threshold = threshold
        self.scale = scale
        self.output = output
        self.one_hot = one_hot

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """The readout's raw score ``w · f*(x)`` (class 1 when above the threshold)."""
        raw: torch.Tensor = self.feature_fn(x).float().cpu() @ self.w
        return raw

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Two-class scores in the original model's convention."""
        import torch

        z = self.scale * (self.score(x) - self.threshold)
        logits = torch.stack([torch.zeros_like(z), z], dim=1)
        if self.head is not None and self.output != "labels":
            # the model's own output head after the planted readout (issue 27): a head that
            # rounds or saturates the real model's scores does the same to these
            return self.head(logits).float()
        if self.output == "probs":
            return torch.softmax(logits, dim=1)
        if self.output == "labels" or self.one_hot:
            return torch.nn.functional.one_hot((z > 0).long(), 2).float()
        return logits


def _readout(f_in: torch.Tensor, f_b: torch.Tensor) -> torch.Tensor | None:
    """A linear direction that puts every boundary feature above every inner one, or None.

    Logistic regression on the raw features, as in the reference implementation, with one
    common scale for conditioning. Not per-feature standardisation: a ReLU unit that is zero
    on every inner point would get a weight of ~1e6, and the readout would become a needle
    (one dead unit firing) whose flat score gives a score-based attack nothing to follow.
    """
    import torch

    mu = f_in.mean(dim=0)
    sd = f_in.std(dim=0).mean().clamp(min=1e-6)
    a, b = (f_in - mu) / sd, (f_b - mu) / sd
    x = torch.cat([a, b]).double()
    t = torch.cat([torch.zeros(len(a)), torch.ones(len(b))]).double()
    weight = torch.where(t > 0, len(a) / max(len(b), 1), 1.0).double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    c = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, c], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        z = x @ w + c
        loss = (weight * torch.nn.functional.binary_cross_entropy_with_logits(
            z, t, reduction="none")).mean() + 1e-4 * (w * w).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    opt.step(closure)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        direction = (w / sd.double()).float()
        s_in, s_b = f_in @ direction, f_b @ direction
        if float(s_b.min()) > float(s_in.max()):
            return direction
    return None


class LadderRung(TypedDict):
    """One rung of the ladder on one sample: the test's result and random sampling's."""

    bt: str
    rasr: bool | None


class BinarizationFields(TypedDict, total=False):
    """What the binarization test adds to a sample's record (its packaged rung's figures).

    ``bt`` is ``success``, ``failure`` or ``setup_failed`` (then ``bt_reason`` says why);
    ``bt_rasr`` whether random sampling solved the same planted problem; ``bt_queries`` the
    images the test sent to the real model (features included); ``bt_ladder`` every rung run.
    """

    bt: str
    bt_reason: str
    bt_features: str
    bt_attack_queries: int
    bt_rasr_queries: int
    bt_queries: int
    bt_rasr: bool | None
    bt_ladder: list[LadderRung | None]
    bt_head: list[str]


def binarization_test(
    counter: Any,
    x_c: torch.Tensor,
    attack: Attack,
    norm: Norm | str,
    epsilon: float,
    seed: int,
    settings: BinarizationSettings,
    output: str,
    original_margin: float,
    one_hot: bool = False,
    rasr_queries: int | None = None,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> BinarizationFields:
    """Run the test for one image ``x_c`` ``[C, H, W]``; returns the per-sample record fields.

    Every query (features included) goes through ``counter``. The R-ASR baseline samples the
    ball with ``rasr_queries`` queries (default: the attack's full ``max_queries`` budget, not
    only what the attack spent before it stopped: an attack that stops early on an easy
    problem must not shrink its own baseline).
    """
    import torch

    norm = norm_named(norm)

    if counter.has_features():
        feature_fn, source = counter.features, "penultimate"
    elif output == "labels":
        return {"bt": "setup_failed", "bt_reason": "labels-only model exposes no features",
                "bt_features": "none", "bt_queries": 0, "bt_rasr": None}
    else:
        def feature_fn(x: torch.Tensor) -> torch.Tensor:
            s = counter.predict(x)
            return torch.log(s.clamp(min=1e-12)) if output == "probs" else s
        source = "output"
    before = counter.queries
    rng = Uniforms(torch.tensor([seed]))
    shape = tuple(x_c.shape)
    n_i, n_b = settings.n_inner, settings.n_boundary
    x0 = x_c.unsqueeze(0)
    u = rng.draw(math.prod(shape) * (n_i + n_b), [0]).view(n_i + n_b, *shape)
    gauss = None
    if norm.needs_normals:
        gauss = torch.stack([rng.normal(shape, 0) for _ in range(n_i + n_b)])
    shell = torch.arange(n_i) < round(settings.inner_shell * n_i)
    inner = random_ball_points(x0.expand(n_i, *shape), norm, (1 - settings.inner_gap) * epsilon,
                               u[:n_i].to(x_c), None if gauss is None else gauss[:n_i],
                               corner=shell)
    boundary = random_ball_points(x0.expand(n_b, *shape), norm, epsilon, u[n_i:].to(x_c),
                                  None if gauss is None else gauss[n_i:],
                                  corner=torch.ones(n_b, dtype=torch.bool))
    pts = torch.cat([x0, inner, boundary])
    feats = torch.cat([feature_fn(pts[i:i + 512]).float().cpu()
                       for i in range(0, len(pts), 512)])
    direction = _readout(feats[: n_i + 1], feats[n_i + 1:])
    if direction is None:
        return {"bt": "setup_failed", "bt_reason": "readout could not separate inner and "
                "boundary points", "bt_features": source,
                "bt_queries": counter.queries - before, "bt_rasr": None}
    s_in, s_b = feats[: n_i + 1] @ direction, feats[n_i + 1:] @ direction
    threshold = float(s_in.max() + settings.closeness * (s_b.min() - s_in.max()))
    s_c = float(s_in[0])
    scale = max(abs(original_margin), 1e-3) / max(threshold - s_c, 1e-12)
    h = BinarizedModel(counter, feature_fn, direction, threshold, scale, output, one_hot,
                       head if source == "penultimate" else None)
    y0 = torch.zeros(1, dtype=torch.long, device=x_c.device)
    res = attack(h, x0, y0, torch.tensor([seed + 1]), output, threat=ThreatModel(norm, epsilon))
    success = bool(res.success[0])
    used = max(int(res.queries[0]), 1)
    budget = rasr_queries if rasr_queries is not None else int(attack.max_queries)
    rasr, rasr_used = random_asr(h, x_c, norm, epsilon, max(budget, 1), seed + 2)
    return {"bt": "success" if success else "failure", "bt_features": source,
            "bt_attack_queries": used, "bt_rasr_queries": rasr_used,
            "bt_queries": counter.queries - before, "bt_rasr": rasr}



class RandomBaseline(Attack):
    """The R-ASR's blind sampling on one planted problem, as a proposal for the sealed call.

    The draws of :class:`~certify.attacks.RandomSearch` (alternately uniform in the ball and on
    its corners / sphere), sent ``chunk`` at a time rather than one per call: the same budget
    and the same distribution, the wall time of a few batched calls. A chunk is counted whole.
    Proposes the first adversarial draw, else the last one (both were queried, so the sealed
    call judges them from the model's own answers). Threat model: ``norm``, ``epsilon``;
    labels suffice; batch of one sample.
    """

    name: ClassVar[str] = "random_baseline"
    norms: ClassVar[tuple[Norm, ...]] = tuple(LADDER)
    needs_scores: ClassVar[bool] = False

    def __init__(self, norm: Norm, epsilon: float, max_queries: int, chunk: int = 250) -> None:
        self._threat(norm, epsilon)
        self.max_queries = max_queries
        self.chunk = chunk

    def run(self, model: Predictor, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        """Sample until a draw leaves class ``y`` or the budget is spent."""
        import torch

        x_c = x[0]
        rng = Uniforms(seeds[:1])
        shape = tuple(x_c.shape)
        spent, last = 0, x
        while spent < self.max_queries:
            n = min(self.chunk, self.max_queries - spent)
            u = torch.stack([rng.draw(math.prod(shape), [0]).view(shape) for _ in range(n)])
            gauss = torch.stack([rng.normal(shape, 0) for _ in range(n)]) \
                if self.norm.needs_normals else None
            corner = (torch.arange(spent, spent + n) % 2) == 1
            cand = random_ball_points(x_c.unsqueeze(0).expand(n, *shape), self.norm,
                                      self.epsilon, u.to(x_c),
                                      None if gauss is None else gauss.to(x_c), corner)
            cand = project(cand, x_c.unsqueeze(0), self.norm, self.epsilon)
            spent += n
            hit = (model.predict(cand).argmax(1).cpu() != y[0].cpu()).nonzero().flatten()
            last = cand[int(hit[0]) if len(hit) else n - 1].unsqueeze(0)
            if len(hit):
                break
        return AttackResult(last, torch.tensor([spent]))


def random_asr(h: BinarizedModel, x_c: torch.Tensor, norm: Norm, epsilon: float, budget: int,
               seed: int, chunk: int = 250) -> tuple[bool, int]:
    """Random sampling's success on one planted problem: (found, queries spent).

    :class:`RandomBaseline` through the sealed attack call.
    """
    import torch

    y0 = torch.zeros(1, dtype=torch.long, device=x_c.device)
    out = RandomBaseline(norm, epsilon, budget, chunk)(h, x_c.unsqueeze(0), y0,
                                                      torch.tensor([seed]), "labels",
                                                      recall=True)
    return bool(out.success[0]), int(out.queries[0])


def ladder_test(
    counter: Any,
    x_c: torch.Tensor,
    attack: Attack,
    norm: Norm,
    epsilon: float,
    seed: int,
    ladder: tuple[BinarizationSettings, ...],
    packaged: int,
    output: str,
    original_margin: float,
    one_hot: bool = False,
    every_rung: bool = False,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> BinarizationFields:
    """The ladder (hardest first) on one image; the record fields.

    Rungs down to the packaged one (index ``packaged``) always run, so the packaged rung and
    every harder one are measured on every sample; below it the sample descends only until
    the attack solves a rung (§4.3: ease the test until the attack passes), unless
    ``every_rung``. The top-level fields (``bt``, ``bt_rasr``, ...) are the packaged rung's,
    on which the pass rule is applied; ``bt_ladder`` holds each rung run (``bt``: success /
    failure / setup_failed, ``rasr``), ``None`` for a rung skipped because a harder one was
    solved. Each rung is a new planted problem; the attack keeps its initial budget.
    """
    before = counter.queries
    rungs: list[LadderRung | None] = []
    top: BinarizationFields = {}
    solved = False
    for k, settings in enumerate(ladder):
        if k > packaged and solved and not every_rung:
            rungs.append(None)
            continue
        fields = binarization_test(counter, x_c, attack, norm, epsilon, seed + 10 * k, settings,
                                   output, original_margin, one_hot, head=head)
        rungs.append({"bt": fields["bt"], "rasr": fields["bt_rasr"]})
        solved = solved or fields["bt"] == "success"
        if k == packaged:
            top = fields
    return {**top, "bt_ladder": rungs, "bt_queries": counter.queries - before}


def ladder_scores(records: Sequence[BinarizationFields], n_rungs: int
                  ) -> list[dict[str, Any]]:
    """Per rung: tested, successes, random-sampling successes, setup failures, skipped.

    A sample that skipped a rung because the attack solved a harder one counts as tested and
    solved there (a planted problem solved under harder settings is taken as solved under
    easier ones); the R-ASR counts only the samples that ran the rung. Rungs down to the
    packaged one are run on every sample, so their figures are measured, never inferred.
    """
    out = []
    for k in range(n_rungs):
        rows = [r["bt_ladder"][k] for r in records if len(r.get("bt_ladder") or ()) > k]
        ran = [r for r in rows if r is not None and r["bt"] in ("success", "failure")]
        skipped = sum(r is None for r in rows)
        out.append({"tested": len(ran) + skipped,
                    "success": sum(r["bt"] == "success" for r in ran) + skipped,
                    "rasr_success": sum(bool(r["rasr"]) for r in ran),
                    "rasr_tested": len(ran),
                    "setup_failed": sum(r is not None and r["bt"] == "setup_failed"
                                        for r in rows),
                    "skipped": skipped})
    return out


def passes(success: int, rasr_success: int, tested: int, pass_score: float,
           rasr_margin: float, rasr_tested: int | None = None) -> bool:
    """The paper's rule on point estimates: score ≥ pass_score and ≥ R-ASR + rasr_margin."""
    if tested == 0:
        return False
    asr = success / tested
    rasr = rasr_success / rasr_tested if rasr_tested else (0.0 if rasr_tested == 0 else
                                                            rasr_success / tested)
    return asr >= pass_score and asr >= rasr + rasr_margin
