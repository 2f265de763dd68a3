"""The attack interface: attacks propose, one sealed call judges (foolbox 3's ``__call__``).

An attack is constructed from its suite parameters; its ``run`` proposes candidate adversarial
images for a batch of samples (one seed per sample) and says how many queries it spent per
sample. It never grades itself. Every caller goes through :meth:`Attack.__call__`, which runs
the proposal against a counting proxy of the proposing model, refuses a query count other than
the proxy's (:class:`~certify.errors.AttackProtocolError`), projects each proposal onto the
threat model (an out-of-ball proposal is judged on its projected point; the spatial grid's
proposed rotation and translation are applied to the clean image), asks the judging model once
and decides success with one criterion: the judge's top class is not the true label.

Shapes: ``x`` ``[B, C, H, W]`` in ``[0, 1]``, ``y`` ``[B]``, seeds ``[B]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, final

from certify.errors import AttackProtocolError
from certify.norms import LINF, Norm, ThreatModel
from certify.norms import norm as norm_named
from certify.norms import project_l1_box as project_l1_box  # re-exported for the attacks
from certify.perturbations.base import generators

if TYPE_CHECKING:
    import torch


@dataclass
class AttackResult:
    """Candidates ``x_adv`` ``[B, C, H, W]`` and queries spent per sample ``[B]``.

    ``start_failed`` ``[B]`` bool, from attacks that need an adversarial starting point
    (HopSkipJump): true where none was found, so the sample was never attacked and its
    candidate is the image itself. ``None`` from attacks without such a start.

    ``gap`` and ``half_gap`` ``[B]``: how far each sample still was from success at the end of
    the budget and when half of it was spent (``inf`` where unknown): the margin loss for
    score-based attacks (success at 0), the distance beyond ε of the closest adversarial point
    for minimisation attacks such as HopSkipJump. They tell whether an unbroken sample was
    still being approached when the budget ran out (convergence). ``None`` from attacks that
    do not track it.
    """

    x_adv: torch.Tensor
    queries: torch.Tensor
    start_failed: torch.Tensor | None = None
    gap: torch.Tensor | None = None
    half_gap: torch.Tensor | None = None
    #: Spatial attacks: the proposed transform per sample (``[B, P]``, zeros for none); the
    #: sealed call applies it to the clean image instead of trusting ``x_adv``.
    params: torch.Tensor | None = None
    #: Gradient evaluations per sample ``[B]`` (white-box proposers); not model queries.
    gradients: torch.Tensor | None = None
    #: ``[B]`` bool, from attacks that judge their own convergence by checkpoints and restarts
    #: (APGD): first broken late in the run, so the robust accuracy was still moving.
    late: torch.Tensor | None = None


@dataclass
class AttackOutcome:
    """What the sealed call decided for a batch of ``B`` samples.

    ``x_adv`` ``[B, C, H, W]``: the judged points (projected proposals); ``scores`` ``[B, K]``
    (CPU): the judge's answers there; ``success`` ``[B]`` bool: the judge's top class is not
    the true label. ``queries`` ``[B]``: the proposal's queries per sample, whose sum is what
    the counting proxy saw; ``judge_queries``: images the judge was asked about by the call
    (answers recalled from the proxy's memory cost none); ``gradients`` ``[B]``: gradient
    evaluations, counted apart from queries. The other fields are the proposal's own
    convergence evidence (see :class:`AttackResult`).
    """

    x_adv: torch.Tensor
    scores: torch.Tensor
    success: torch.Tensor
    queries: torch.Tensor
    judge_queries: int
    gradients: torch.Tensor
    start_failed: torch.Tensor | None = None
    gap: torch.Tensor | None = None
    half_gap: torch.Tensor | None = None
    params: torch.Tensor | None = None
    late: torch.Tensor | None = None


class Predictor(Protocol):
    """Anything an attack may query: ``predict(x[N, C, H, W]) -> scores[N, K]``."""

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Scores for a batch."""
        ...


class CountingProxy:
    """The proposing model as an attack sees it: counts every image it forwards.

    With ``remember``, it keeps the model's answer to each image it forwarded (keyed by the
    image's bytes), so the judge can be answered from the model's own earlier answer to the
    very same point instead of a new query: for searches whose final points were all queried
    on the way (the confident-mistake search, the random baseline of the binarization test).
    """

    def __init__(self, model: Predictor, remember: bool = False) -> None:
        self.model = model
        self.queries = 0
        self.gradients = 0
        self._memory: dict[bytes, torch.Tensor] | None = {} if remember else None

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Forward ``x``, counting ``len(x)`` queries."""
        self.queries += int(x.shape[0])
        scores = self.model.predict(x)
        if self._memory is not None:
            self.learn(x, scores)
        return scores

    def value_and_grad(self, x: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A white-box proposer's forward and backward pass, counting ``len(x)`` gradient
        evaluations (not queries): see :class:`~certify.models.torchcopy.TorchCopy`."""
        f = getattr(self.model, "value_and_grad", None)
        if f is None:
            raise AttackProtocolError(
                "a white-box attack was given a model without gradients",
                hint="white-box attacks need a torch copy of an ONNX graph; report this as a bug")
        self.gradients += int(x.shape[0])
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] = f(x, loss)
        return out

    def learn(self, x: torch.Tensor, scores: torch.Tensor) -> None:
        """Remember the model's answers ``scores`` to the images ``x`` (no query)."""
        if self._memory is None:
            return
        cpu = scores.detach().cpu()
        for row, key in enumerate(_keys(x)):
            self._memory[key] = cpu[row]

    def recall(self, x: torch.Tensor) -> list[torch.Tensor | None]:
        """The remembered answer to each image of ``x``, ``None`` where there is none."""
        if self._memory is None:
            return [None] * int(x.shape[0])
        return [self._memory.get(key) for key in _keys(x)]


def _keys(x: torch.Tensor) -> list[bytes]:
    flat = x.detach().float().cpu().contiguous().view(int(x.shape[0]), -1)
    return [bytes(row.numpy().tobytes()) for row in flat]


def project(x_adv: torch.Tensor, x: torch.Tensor, norm: Norm | str, epsilon: float
            ) -> torch.Tensor:
    """Clip candidates to the ε-ball of ``norm`` (or its name) around ``x`` and to ``[0, 1]``
    (:meth:`certify.norms.Norm.project`)."""
    return norm_named(norm).project(x_adv, x, epsilon)


def inside(x_adv: torch.Tensor, x: torch.Tensor, norm: Norm | str, epsilon: float,
           rtol: float = 1e-6) -> torch.Tensor:
    """``[B]`` bool: each candidate lies in ``[0, 1]`` and in the ε-ball around ``x``
    (:meth:`certify.norms.Norm.inside`)."""
    return norm_named(norm).inside(x_adv, x, epsilon, rtol)


def margin(scores: torch.Tensor, y: torch.Tensor, output: str) -> torch.Tensor:
    """Margin loss ``s_y - max_{j != y} s_j`` (log-probabilities for probability outputs).

    Negative means misclassified.
    """
    import torch

    s = torch.log(scores.clamp(min=1e-12)) if output == "probs" else scores
    true = s.gather(1, y.view(-1, 1)).squeeze(1)
    other = s.clone()
    other.scatter_(1, y.view(-1, 1), float("-inf"))
    return true - other.max(dim=1).values


#: Probabilities below this count as this in a log-probability margin (a rounded or one-hot
#: probability output answers exact zeros).
PROB_FLOOR = 1e-30


def top_two_margin(scores: torch.Tensor, output: str) -> torch.Tensor:
    """Scale-free confidence ``[N]``: top-1 minus top-2 logit (log-probability for probability
    outputs, floored at :data:`PROB_FLOOR`); 0 for a labels-only output, which has none.

    A positive scaling of the logits scales every margin by the same factor, so rankings and
    quantiles of it keep their order; adding a constant to every logit leaves it unchanged.
    """
    import torch

    s = scores.float()
    if output == "labels" or s.ndim != 2 or s.shape[1] < 2:
        return torch.zeros(s.shape[0])
    if output != "logits":
        s = torch.log(s.clamp(min=PROB_FLOOR))
    top = s.topk(2, dim=1).values
    return (top[:, 0] - top[:, 1]).nan_to_num(nan=0.0, posinf=float(torch.finfo().max))


class Uniforms:
    """Per-sample random streams: ``draw(k, idx)`` gives ``[len(idx), k]`` uniforms.

    Every sample draws from its own generator, so its attack does not depend on which other
    samples share its batch.
    """

    def __init__(self, seeds: torch.Tensor) -> None:
        self.gens = generators(seeds)

    def draw(self, k: int, idx: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """``k`` uniforms in ``[0, 1)`` for each listed sample."""
        import torch

        ids = idx.tolist() if isinstance(idx, torch.Tensor) else idx
        return torch.stack([torch.rand(k, generator=self.gens[i]) for i in ids])

    def normal(self, shape: tuple[int, ...], i: int) -> torch.Tensor:
        """Standard normals of ``shape`` from sample ``i``'s stream."""
        import torch

        return torch.randn(shape, generator=self.gens[i])


class Attack:
    """Base class: an attack declares what it is (the facts below) and writes ``run``.

    The facts are what a scheduler and a verdict ask of an attack, instead of its name:

    - its **threat model**: the norms it attacks in (``norms``, the first is its default) and,
      per instance, ``norm`` and ``epsilon`` (:meth:`threat_model`);
    - its **capabilities**: whether it reads scores (``needs_scores``; a decision-based attack
      reads labels only) or gradients of a torch copy (``needs_gradients``, white-box);
    - its **budgets**: the first round's queries per sample under ``max_queries: auto``
      (``initial_queries``) and the single run's queries per sample it needs before its row may
      PASS on its own (``query_floor``; 0 where no query budget applies);
    - how its **convergence** is judged (``convergence``): ``margin`` (score-based: the margin
      loss still falling), ``distance`` (minimisation: the distance beyond ε still falling),
      ``checkpoints`` (white-box: breaks after the step-size checkpoints or by a later restart)
      or ``exhaustive`` (a grid searched to its end: nothing to converge);
    - ``needs_start``: it needs an adversarial starting point and may find none;
    - ``min_classes``: the fewest classes its loss needs; ``eps_sweep``: it supports the ε
      sweep of Carlini et al. 2019's sanity checks.

    Callers never call ``run``: they call the attack (:meth:`__call__`, final), which seals
    the bookkeeping (query count, projection, re-query, success) in one place.
    """

    name: ClassVar[str] = ""
    #: The threat norms the attack attacks in (:mod:`certify.norms`); the first is the default.
    norms: ClassVar[tuple[Norm, ...]] = (LINF,)
    needs_scores: ClassVar[bool] = True
    #: White-box: proposes from gradients of a torch copy of the graph (no model queries).
    needs_gradients: ClassVar[bool] = False
    #: ``max_queries: auto``: round 0's queries per sample.
    initial_queries: ClassVar[int] = 1000
    #: Queries per sample of one converged run before the attack's row may PASS on its own.
    query_floor: ClassVar[int] = 0
    #: How convergence is judged: ``margin``, ``distance``, ``checkpoints`` or ``exhaustive``.
    convergence: ClassVar[str] = "margin"
    #: Needs an adversarial starting point (and reports ``start_failed`` where it found none).
    needs_start: ClassVar[bool] = False
    #: The fewest classes the attack's loss needs.
    min_classes: ClassVar[int] = 2
    #: Supports the ε sweep (a white-box attack re-run at multiples of ε).
    eps_sweep: ClassVar[bool] = False
    #: The threat norm this instance attacks in (one of ``norms``).
    norm: Norm
    epsilon: float
    max_queries: int

    @classmethod
    def default_norm(cls) -> Norm:
        """The norm the attack attacks in when none is given."""
        return cls.norms[0]

    @classmethod
    def reads(cls) -> str:
        """What the attack reads of the model: ``gradients``, ``scores`` or ``labels``."""
        return "gradients" if cls.needs_gradients else "scores" if cls.needs_scores \
            else "labels"

    @classmethod
    def decision_based(cls) -> bool:
        """A black-box attack that reads labels only (works on any model)."""
        return not cls.needs_scores and not cls.needs_gradients

    @classmethod
    def configure(cls, norm: Norm, epsilon: float, max_queries: int,
                  params: dict[str, Any]) -> Attack:
        """The attack for a threat model and a query budget, with extra constructor
        ``params``: each attack knows which of these its constructor takes."""
        kw = dict(params) | {"epsilon": epsilon, "max_queries": max_queries}
        if len(cls.norms) > 1:
            kw["norm"] = norm
        return cls(**kw)

    def _threat(self, norm: Norm | str | None, epsilon: float) -> None:
        """Set the instance's threat model, refusing a norm the attack does not attack in."""
        try:
            found = self.default_norm() if norm is None else norm_named(norm)
        except KeyError:
            found = None
        if found is None or found not in self.norms:
            raise TypeError(f"{self.name or type(self).__name__} attacks in "
                            f"{' or '.join(n.name for n in self.norms)}, not {str(norm)!r}")
        self.norm = found
        self.epsilon = float(epsilon)

    def threat_model(self) -> ThreatModel:
        """(norm, ε) of this instance: what its proposals are projected onto by default."""
        return ThreatModel(self.norm, float(self.epsilon))

    def params(self) -> dict[str, Any]:
        """The constructor parameters (as given in the suite; a norm by its name)."""
        return {k: v.name if isinstance(v, Norm) else v for k, v in vars(self).items()}

    def run(self, model: Predictor, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        """Propose candidates for the batch; ``model.predict`` is the only access to the model."""
        raise NotImplementedError

    def project_proposal(self, proposal: AttackResult, x: torch.Tensor, norm: Norm,
                         epsilon: float) -> torch.Tensor:
        """The points to judge: each proposal projected onto the threat model around ``x``."""
        return project(proposal.x_adv, x, norm, epsilon)

    @final
    def __call__(self, model: Predictor, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
                 output: str, *, threat: ThreatModel | tuple[Norm | str, float] | None = None,
                 judge: Predictor | None = None,
                 known: tuple[torch.Tensor, torch.Tensor] | None = None,
                 recall: bool = False) -> AttackOutcome:
        """Run the proposal on ``model``, then project, re-query and decide success once.

        ``x`` ``[B, C, H, W]`` in ``[0, 1]``, ``y`` ``[B]`` true labels, ``seeds`` ``[B]``.
        ``threat`` is the (norm, ε) the proposals are projected onto (default: the instance's
        own, :meth:`threat_model`). ``judge`` answers for the projected points (default:
        ``model``); a proposer that differs from the judge (a torch copy of an ONNX graph, a
        surrogate) is how white-box and transfer attacks plug in. With ``recall`` (judge =
        model only), points the proposal already queried are judged by the model's own
        answer to them, remembered by the counting proxy, and not asked again; ``known``
        seeds that memory with points and the judge's earlier answers to them. Raises
        :class:`~certify.errors.AttackProtocolError` when the proposal's reported queries
        differ from what the proxy counted.
        """
        import torch

        proxy = CountingProxy(model, remember=recall and judge is None)
        if known is not None:
            proxy.learn(*known)
        proposal = self.run(proxy, x, y, seeds, output)
        claimed = proposal.queries
        if tuple(claimed.shape) != (len(x),) or tuple(proposal.x_adv.shape) != tuple(x.shape):
            raise AttackProtocolError(
                f"attack {self.name or type(self).__name__} returned candidates of shape "
                f"{tuple(proposal.x_adv.shape)} with {tuple(claimed.shape)} query counts for a "
                f"batch of shape {tuple(x.shape)}",
                hint="the attack's evidence is not used; report this as a bug")
        if int(claimed.sum()) != proxy.queries:
            raise AttackProtocolError(
                f"attack {self.name or type(self).__name__} reported {int(claimed.sum())} "
                f"queries but the model was asked about {proxy.queries} images",
                hint="the attack's evidence is not used; report this as a bug")
        grads = proposal.gradients
        if (int(grads.sum()) if grads is not None else 0) != proxy.gradients:
            raise AttackProtocolError(
                f"attack {self.name or type(self).__name__} reported "
                f"{int(grads.sum()) if grads is not None else 0} gradient evaluations but the "
                f"proposer computed {proxy.gradients}",
                hint="the attack's evidence is not used; report this as a bug")
        norm, epsilon = ThreatModel.of(*threat) if threat is not None else self.threat_model()
        x_adv = self.project_proposal(proposal, x, norm, epsilon)
        if recall and norm.ball:
            # A proposal inside the ball up to float rounding keeps its exact bytes, so the
            # model's remembered answer to it applies (re-projecting a point on the L2 sphere
            # can move it by one ulp, which would cost a query to judge the same point).
            keep = inside(proposal.x_adv, x, norm, epsilon).view(-1, 1, 1, 1)
            x_adv = torch.where(keep.to(x_adv.device), proposal.x_adv.to(x_adv), x_adv)
        scores, asked = _judge(x_adv, judge or model, proxy if recall else None)
        gradients = grads.clone() if grads is not None else \
            torch.zeros(len(x), dtype=torch.long)
        return AttackOutcome(x_adv, scores, scores.argmax(1) != y.cpu(), claimed.clone(),
                             asked, gradients, proposal.start_failed, proposal.gap,
                             proposal.half_gap, proposal.params, proposal.late)


def _judge(x_adv: torch.Tensor, judge: Predictor, memory: CountingProxy | None
           ) -> tuple[torch.Tensor, int]:
    """The judge's answers ``[B, K]`` (CPU) at ``x_adv`` and how many images it was asked."""
    import torch

    known = memory.recall(x_adv) if memory is not None else [None] * len(x_adv)
    missing = [k for k, s in enumerate(known) if s is None]
    if len(missing) == len(known):
        return judge.predict(x_adv).cpu(), len(missing)
    rows: list[torch.Tensor | None] = list(known)
    if missing:
        sel = torch.tensor(missing, device=x_adv.device)
        for k, s in zip(missing, judge.predict(x_adv[sel]).cpu(), strict=True):
            rows[k] = s
    return torch.stack([r for r in rows if r is not None]), len(missing)
