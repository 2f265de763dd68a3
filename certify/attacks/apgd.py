"""APGD (Croce & Hein, ICML 2020): white-box attacks on a torch copy of the model's graph.

Auto-PGD is projected gradient ascent with momentum (α = 0.75) whose step size starts at 2ε and
halves at checkpoints ``w_j = ⌈p_j N⌉`` (``p_0 = 0``, ``p_1 = 0.22``, ``p_{j+1} = p_j +
max(p_j − p_{j−1} − 0.03, 0.06)``) when, since the last checkpoint, the loss rose in fewer than
ρ = 75% of the steps, or when neither the step size nor the best loss changed; a halving
restarts the sample from its best point. L∞ steps follow the gradient's sign, L2 steps its
normalised direction; every iterate is projected onto the ε-ball and [0, 1].

**L1** (l1-APGD, Croce & Hein, ICML 2021, "Mind the box"): every iterate is projected exactly
onto the L1 ball intersected with [0, 1] (:func:`certify.norms.project_l1_box`). A step moves
the ``k`` coordinates of largest gradient magnitude by ``±η/k`` each (the gradient's sign; L1
length η), leaving out those the box holds (at 0 with the gradient pointing down, at 1
pointing up); ``k`` starts at 20% of the coordinates, η at ε (not 2ε). As in the reference's
L1 branch (AutoAttack's ``autopgd_base.py``), the step has no momentum and η is reviewed every
4% of the iterations (:func:`l1_reviews`), not at the checkpoints above: ``k`` becomes the
best point's number of changed coordinates over 1.5, and η goes back to ε where that number
fell below 95% of the previous review's (the sample then restarts from its best point), else
is divided by 1.5 within [ε/10, ε]. Both matter: on the demo model, with the checkpoints and
the momentum instead, 100 iterations broke 30 and 66 of 100 signs at ε = 3 and 6 where these
rules break 69 and 88 (``benchmarks/apgd_l1.py``). A start is a point of the L1 sphere
(normals over their L1 norm) projected into the box; the reference's (normals projected onto
the ball and the box) broke as many there (ε = 12, three seeds: 99, 96 and 97 of 100 against
97 each). Restarts, grouping, gradient counting and the convergence evidence (``late``, from
the checkpoints) are the L∞/L2 ones.

``apgd_ce`` maximises the cross-entropy; ``apgd_t`` the targeted DLR loss
``−(z_y − z_t) / (z_π1 − (z_π3 + z_π4)/2)`` against each of the top ``targets`` other classes
in turn (models with fewer than 4 classes have no DLR denominator: use ``apgd_ce``).
Restarts (``restarts``, and each target for APGD-T) run on the samples still unbroken, each
from a new random point of the ball (per-sample seeded streams).

The proposer is a :class:`~certify.models.torchcopy.TorchCopy` reached through the sealed
call's counting proxy, which counts gradient evaluations (one per image per iteration, plus
one at each start); the proposals are judged by the real model. Gradients are taken at the
copy's cut (the last linear layer's output), decisions on its whole graph, so a rounding or
saturating head does not starve the attack (BPDA, Athalye et al. 2018).

**Convergence evidence.** ``late`` marks samples first broken after the second-to-last
checkpoint of their run, or by any restart after the first: the robust accuracy was still
moving when the budget ended (:func:`certify.checks.attack.convergence` counts them).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from certify.attacks.base import Attack, AttackResult, Predictor, Uniforms, project
from certify.errors import AttackProtocolError
from certify.norms import L1, L2, LINF, Norm
from certify.params import Param, Params

if TYPE_CHECKING:
    import torch

#: Momentum of the update (the paper's α).
ALPHA = 0.75
#: Share of steps since the last checkpoint that must have raised the loss (the paper's ρ).
RHO = 0.75
#: L1: the share of coordinates a step moves at first (l1-APGD's initial sparsity).
L1_TOPK = 0.2
#: L1: the sparsity and the step size are reviewed every this share of the iterations.
L1_REVIEW = 0.04
#: L1: at a review, the step size goes back to ε where the best point's changed coordinates
#: fell below this share of the previous review's, else is divided by
#: :data:`L1_STEP_DIVISOR`, never below ε / :data:`L1_MIN_STEP`; ``k`` becomes those changed
#: coordinates over the divisor.
L1_SHRUNK = 0.95
L1_STEP_DIVISOR = 1.5
L1_MIN_STEP = 10.0

Loss = Callable[["torch.Tensor"], "torch.Tensor"]


class Differentiable(Predictor, Protocol):
    """A proposer with gradients: the sealed call's proxy around a torch copy."""

    def value_and_grad(self, x: torch.Tensor, loss: Loss
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(whole-graph scores ``[N, K]``, cut logits ``[N, K]``, ``loss(cut)`` ``[N]``, its
        gradient with respect to ``x`` ``[N, C, H, W]``)."""
        ...


def l1_reviews(n_iter: int) -> list[int]:
    """The iterations at which l1-APGD reviews its sparsity and step size: every
    ``max(⌊0.04 N⌋, 1)``."""
    every = max(int(round(L1_REVIEW * n_iter, 9)), 1)
    return list(range(every, n_iter + 1, every))


def checkpoints(n_iter: int) -> list[int]:
    """The iterations at which the step size is reviewed: ``⌈p_j N⌉`` for ``j ≥ 1``."""
    p = [0.0, 0.22]
    while p[-1] < 1.0:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    # rounded first: 0.22 + 0.19 + 0.16 is 0.5700000000000001 in floats, whose ceiling is 58
    at = [math.ceil(round(pj * n_iter, 9)) for pj in p[1:]]
    out = sorted({w for w in at if w <= n_iter})
    return [w for w in out if w > 0]


#: The runs after a sample's first (restarts, APGD-T's targets) go as one batch of the
#: still-unbroken samples while that batch stays within this many bytes of images; larger
#: groups go in as many runs per batch as fit. One run alone would leave a handful of
#: samples per batch late in a check, where each step costs its fixed overhead, not its
#: arithmetic (APGD-T's 9 targets × 101 steps on the demo's few samples APGD-CE left); a
#: fixed rule, not a timing, so records never depend on the machine.
RUN_GROUP_BYTES = 4 << 20


def run_group(runs_left: int, samples: int, numel: int, itemsize: int = 4) -> int:
    """How many of the ``runs_left`` runs go in one batch of ``samples`` images of ``numel``
    values: as many as fit :data:`RUN_GROUP_BYTES`, at least one."""
    per_run = max(1, samples * numel * itemsize)
    return max(1, min(runs_left, RUN_GROUP_BYTES // per_run))


def ce_loss(y: torch.Tensor) -> Loss:
    """Per-sample cross-entropy of the cut logits against the true labels."""
    import torch.nn.functional as F

    return lambda z: F.cross_entropy(z, y, reduction="none")


def dlr_targeted_loss(y: torch.Tensor, target: torch.Tensor) -> Loss:
    """Per-sample targeted DLR loss (needs at least 4 classes)."""
    def loss(z: torch.Tensor) -> torch.Tensor:
        s = z.sort(dim=1, descending=True).values
        zy = z.gather(1, y.view(-1, 1)).squeeze(1)
        zt = z.gather(1, target.view(-1, 1)).squeeze(1)
        return -(zy - zt) / (s[:, 0] - 0.5 * (s[:, 2] + s[:, 3]) + 1e-12)
    return loss


class APGD(Attack):
    """APGD with cross-entropy (``apgd_ce``): see the module docstring.

    ``epsilon``: the ball's radius; ``norm``: ``linf``, ``l2`` or ``l1`` (l1-APGD: the module
    docstring; ε in [0, 1] pixel units summed over all values, e.g. 12 on 3×32×32 images);
    ``iterations`` per run (100, as AutoAttack); ``restarts``: runs per sample, the later ones
    only on the still unbroken samples (2 by default, so convergence can be judged across
    restarts).
    """

    name: ClassVar[str] = "apgd_ce"
    norms: ClassVar[tuple[Norm, ...]] = (LINF, L2, L1)
    needs_scores: ClassVar[bool] = True
    needs_gradients: ClassVar[bool] = True
    convergence: ClassVar[str] = "checkpoints"
    eps_sweep: ClassVar[bool] = True
    suite_params: ClassVar[Params] = Params(
        Param("iterations", int, 100, "gradient steps per run (AutoAttack's 100)", low=1),
        Param("restarts", int, 2,
              "runs per sample from random points of the ball, the later ones only on the "
              "still unbroken samples (2, so convergence can be judged across restarts)",
              low=1),
    )

    def __init__(self, epsilon: float = 8 / 255, norm: Norm | str = LINF, iterations: int = 100,
                 restarts: int = 2, max_queries: int = 0) -> None:
        self._threat(norm, epsilon)
        if iterations < 1 or restarts < 1:
            raise TypeError("iterations and restarts must be at least 1")
        self.iterations = int(iterations)
        self.restarts = int(restarts)
        self.max_queries = int(max_queries)  # white-box: no model queries to propose
        #: Stop a run once every sample of its batch is broken (the ε sweep, which records
        #: only whether each radius broke a sample); the check's own runs go on to their
        #: last step, whose later adversarial iterates the card's confidences read. Not a
        #: constructor parameter: the suite cannot set it.
        self.until_broken = False

    @classmethod
    def configure(cls, norm: Norm, epsilon: float, max_queries: int,
                  params: dict[str, Any]) -> Attack:
        """White-box: iterations and restarts (``params``) set its effort, not queries."""
        return cls(**(dict(params) | {"epsilon": epsilon, "norm": norm}))

    def params(self) -> dict[str, Any]:
        """The constructor parameters."""
        return {"epsilon": self.epsilon, "norm": self.norm.name,
                "iterations": self.iterations, "restarts": self.restarts}

    def runs(self, model: Differentiable, x: torch.Tensor, y: torch.Tensor
             ) -> tuple[list[tuple[int, torch.Tensor | None]], int]:
        """(restart, per-sample target or ``None`` for cross-entropy) for each run a sample
        gets, in order, and the gradient evaluations per sample spent choosing them:
        ``restarts`` cross-entropy runs, nothing spent."""
        return [(r, None) for r in range(self.restarts)], 0

    def run(self, model: Predictor, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        import torch

        grad_model = typing.cast(Differentiable, model)  # the proxy refuses a plain model
        rng = Uniforms(seeds)
        b = len(x)
        best = x.clone()
        broken = torch.zeros(b, dtype=torch.bool)
        late = torch.zeros(b, dtype=torch.bool)
        plan, spent = self.runs(grad_model, x, y)
        grads = torch.full((b,), spent, dtype=torch.long)
        done = 0
        while done < len(plan):
            todo = (~broken).nonzero().flatten()
            if not len(todo):
                break
            k = 1 if done == 0 else run_group(len(plan) - done, len(todo), x[0].numel(),
                                              x.element_size())
            group = plan[done : done + k]
            done += k
            idx = todo.to(x.device)
            rows = idx.repeat(k)  # run j's rows are the j-th block of len(todo)
            targets = [t for _, t in group]
            loss = ce_loss(y[rows]) if targets[0] is None else dlr_targeted_loss(
                y[rows], torch.cat([t[idx] for t in targets if t is not None]))
            # a sample's start draws come in run order, as when the runs go one by one
            x_adv, hit, hit_late, used = self._run_once(
                grad_model, x[rows], y[rows], loss, rng, todo.tolist() * k)
            grads[todo] += used * k
            n = len(todo)
            hits = hit.view(k, n)
            first = torch.where(hits.any(0), hits.int().argmax(0), k - 1)  # else the last run
            pick = (first * n + torch.arange(n)).to(x.device)
            best[idx] = x_adv[pick]
            restarts = torch.tensor([r for r, _ in group])
            # the robust accuracy still moved: late in its run, or in a restart after the first
            late[todo] |= hits.any(0) & (hit_late.view(k, n)[first, torch.arange(n)]
                                         | (restarts[first] > 0))
            broken[todo] |= hits.any(0)
        return AttackResult(best, torch.zeros(b, dtype=torch.long), gradients=grads,
                            late=late)

    def _run_once(self, model: Differentiable, x: torch.Tensor, y: torch.Tensor, loss: Loss,
                  rng: Uniforms, ids: list[int]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """One APGD run on a batch: (proposals, broken ``[B]``, broken after the second-to-last
        checkpoint ``[B]``, gradient evaluations per sample)."""
        import torch

        norm, eps, n_iter = self.norm, self.epsilon, self.iterations
        b = len(x)
        x_adv = project(x + self._start(x, rng, ids), x, norm, eps)
        scores, _, cur, grad = model.value_and_grad(x_adv, loss)
        broken = (scores.argmax(1) != y).cpu()
        x_best_adv = torch.where(broken.view(-1, 1, 1, 1).to(x.device), x_adv, x)
        x_best, loss_best, grad_best = x_adv.clone(), cur.clone(), grad.clone()
        l1 = norm == L1  # l1-APGD's own step, sparsity and reviews
        step = torch.full((b,), (1.0 if l1 else 2.0) * eps, device=x.device)
        if l1:  # the adaptive sparsity: share of coordinates a step moves, and the last count
            n_fts = x[0].numel()
            topk = torch.full((b,), L1_TOPK, device=x.device)
            sparsity = torch.full((b,), float(n_fts), device=x.device)
            reviews = l1_reviews(n_iter)
        history = [cur.clone()]
        marks = checkpoints(n_iter)
        since = 0
        reduced = torch.zeros(b, dtype=torch.bool, device=x.device)
        best_at_mark = loss_best.clone()
        broken_at = torch.where(broken, 0, -1)
        x_prev = x_adv.clone()
        steps = n_iter
        for i in range(n_iter):
            if self.until_broken and bool(broken.all()):
                steps = i
                break
            a = ALPHA if i > 0 else 1.0
            d = _sparse_direction(grad, x_adv, topk) if l1 else norm.direction(grad)
            z = project(x_adv + step.view(-1, 1, 1, 1) * d, x, norm, eps)
            if l1:  # l1-APGD steps without momentum
                x_new = z
            else:
                x_new = project(x_adv + a * (z - x_adv) + (1 - a) * (x_adv - x_prev), x, norm,
                                eps)
            x_prev, x_adv = x_adv, x_new
            scores, _, cur, grad = model.value_and_grad(x_adv, loss)
            wrong = (scores.argmax(1) != y).cpu()
            x_best_adv[wrong.to(x.device)] = x_adv[wrong.to(x.device)]
            broken_at = torch.where(wrong & ~broken, i + 1, broken_at)
            broken |= wrong
            history.append(cur.clone())
            better = cur > loss_best
            x_best[better], grad_best[better], loss_best[better] = \
                x_adv[better], grad[better], cur[better]
            since += 1
            if l1:
                if i + 1 not in reviews:
                    continue
                now = (x_best != x).flatten(1).sum(dim=1).to(step)
                shrunk = now / sparsity < L1_SHRUNK
                topk = now / n_fts / L1_STEP_DIVISOR
                step = torch.where(shrunk, eps, step / L1_STEP_DIVISOR).clamp(
                    eps / L1_MIN_STEP, eps)
                sparsity = now
                x_adv = torch.where(shrunk.view(-1, 1, 1, 1), x_best, x_adv)
                grad = torch.where(shrunk.view(-1, 1, 1, 1), grad_best, grad)
            elif i + 1 in marks:
                rises = sum((history[-j] > history[-j - 1]).float()
                            for j in range(1, since + 1))
                oscillating = rises <= since * RHO
                stuck = ~reduced & (best_at_mark >= loss_best)
                halve = oscillating | stuck
                reduced, best_at_mark = halve, loss_best.clone()
                step = torch.where(halve, step / 2, step)
                x_adv = torch.where(halve.view(-1, 1, 1, 1), x_best, x_adv)
                grad = torch.where(halve.view(-1, 1, 1, 1), grad_best, grad)
                since = 0
        out = torch.where(broken.view(-1, 1, 1, 1).to(x.device), x_best_adv, x_best)
        second_last = marks[-2] if len(marks) >= 2 else 0
        return out, broken, broken_at > second_last, steps + 1

    def _start(self, x: torch.Tensor, rng: Uniforms, ids: list[int]) -> torch.Tensor:
        """A random point of the ball's surface per sample (:meth:`certify.norms.Norm.start`:
        the reference's starts), which :meth:`_run_once` projects into the box."""
        return (self.epsilon * self.norm.start(rng, ids, tuple(x.shape[1:]))).to(x)


class APGDTargeted(APGD):
    """APGD-T (``apgd_t``): the targeted DLR loss against the top ``targets`` other classes
    (by the copy's clean logits), one run per target on the still unbroken samples."""

    name: ClassVar[str] = "apgd_t"
    min_classes: ClassVar[int] = 4
    eps_sweep: ClassVar[bool] = False
    suite_params: ClassVar[Params] = Params(
        APGD.suite_params["iterations"],
        Param("restarts", int, 1,
              "runs per sample and target from random points of the ball, on the still "
              "unbroken samples", low=1),
        Param("targets", int, 9,
              "the top other classes (by the copy's clean logits) attacked in turn, one run "
              "each, most likely first", low=1),
    )

    def __init__(self, epsilon: float = 8 / 255, norm: Norm | str = LINF, iterations: int = 100,
                 restarts: int = 1, targets: int = 9, max_queries: int = 0) -> None:
        super().__init__(epsilon, norm, iterations, restarts, max_queries)
        if targets < 1:
            raise TypeError("targets must be at least 1")
        self.targets = int(targets)

    def params(self) -> dict[str, Any]:
        """The constructor parameters, targets included."""
        return super().params() | {"targets": self.targets}

    def runs(self, model: Differentiable, x: torch.Tensor, y: torch.Tensor
             ) -> tuple[list[tuple[int, torch.Tensor | None]], int]:
        """One run per (target rank, restart): targets are the top other classes of the
        copy's clean logits, most likely first (one gradient evaluation per sample reads
        them)."""
        _, logits, _, _ = model.value_and_grad(x, lambda z: z.sum(dim=1) * 0)
        k = logits.shape[1]
        if k < 4:
            raise AttackProtocolError(
                f"{self.name} needs at least 4 classes (its DLR loss), the model has {k}",
                hint="use apgd_ce on models with fewer than 4 classes")
        ranked = logits.clone()
        ranked.scatter_(1, y.view(-1, 1), float("-inf"))
        order = ranked.argsort(dim=1, descending=True)
        return [(r, order[:, t]) for t in range(min(self.targets, k - 1))
                for r in range(self.restarts)], 1


def _sparse_direction(grad: torch.Tensor, x_adv: torch.Tensor, topk: torch.Tensor
                      ) -> torch.Tensor:
    """l1-APGD's direction ``[B, C, H, W]``, L1 length 1: the gradient's sign on each sample's
    ``⌈topk · n⌉`` coordinates of largest gradient magnitude among those the box lets move in
    the gradient's direction (ties at the threshold included), spread evenly."""
    import torch

    n = grad[0].numel()
    g = grad.flatten(1)
    xa = x_adv.flatten(1)
    free = ~(((xa <= 0) & (g < 0)) | ((xa >= 1) & (g > 0)))
    size = torch.where(free, g.abs(), torch.zeros_like(g))
    k = (n - ((1 - topk) * n).floor()).clamp(1, n).long().view(-1, 1)
    kth = size.sort(dim=1, descending=True).values.gather(1, k - 1)
    pick = free & (size >= kth) & (size > 0)
    signs = torch.where(pick, g.sign(), torch.zeros_like(g))
    out: torch.Tensor = signs / signs.abs().sum(dim=1, keepdim=True).clamp(min=1)
    return out.view_as(grad)
