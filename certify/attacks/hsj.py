"""HopSkipJump (Chen, Jordan and Wainwright, IEEE S&P 2020): decision-based, L2 or L∞.

Needs only the predicted label. From an adversarial starting point (up to ``init_tries``
uniform-noise images, the paper's start; where none leaves the true class, a second start of
up to ``init_tries`` coarse, blocky noise images; then a coarse binary search towards the image)
every iteration t

1. binary-searches the segment to the image down to the paper's tolerance θ (θ = d^-3/2 for
   L2, d^-2 for L∞, of the segment), so the point sits on the decision boundary;
2. estimates the boundary's normal from the signs of ``n_t = init_evals·√t`` (at most
   ``max_evals``) random probes at radius δ_t (0.1 at t = 1, then √d·θ·dist for L2 and
   d·θ·dist for L∞), with the mean answer subtracted as a baseline when the answers are mixed;
3. steps along that estimate (L∞: its sign) by dist/√t, halving until the point is adversarial
   again (the paper's geometric progression).

The tolerance matters: probes at δ_t move a point by about δ_t/√d across the boundary, which
is θ·dist for L2; a looser binary search leaves the point further than that on the
adversarial side, every probe answers "adversarial" and the estimate is noise.

All samples advance in lockstep, so each binary-search step, probe set and step-size trial is
one batched query; every random draw comes from the sample's own seeded stream, so a run is
repeatable and a sample's result does not depend on its batch. A sample stops once its best
point is within ``epsilon`` or its budget cannot pay for the next query.

A sample with no adversarial start is not attacked: its candidate is the image itself and
``AttackResult.start_failed`` says so, for the caller to report.

Threat model: L2 or L∞ ball of radius ``epsilon``; success means a final point within
``epsilon`` (the caller checks). Query budget per sample: ``max_queries``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from certify.attacks.base import Attack, AttackResult, Uniforms
from certify.norms import L2, LINF, Norm
from certify.params import Param, Params

if TYPE_CHECKING:
    import torch

_MIN_STEP = 1e-8
_INIT_TOL = 1e-3  # coarse binary search of the starting point, as in the reference
_STARTS = ("uniform", "coarse")  # the paper's start, then the second one (see _Run.noise)
_COARSE_CELLS = 4


def estimate_direction(adversarial: torch.Tensor, dirs: torch.Tensor, linf: bool
                       ) -> torch.Tensor:
    """The Monte-Carlo estimate of the boundary normal from one probe set (Chen et al. 2020,
    Algorithm 2 and Eq. 16).

    ``adversarial`` ``[n]`` holds the probes' answers (true or 1: adversarial), ``dirs``
    ``[n, C, H, W]`` their directions (the clipped probe minus the boundary point, over δ).
    Returns the update direction ``[C, H, W]``: unit L2 norm, or its sign for L∞.
    """
    phi = adversarial.to(dirs) * 2 - 1
    # Mixed answers (|mean φ| < 1): subtract the mean as a baseline, which lowers the
    # estimate's variance (Eq. 16). When all answers agree the baseline would zero the
    # estimate; then it is ±mean(dirs), as in the authors' code.
    if phi.mean().abs() < 1:
        phi = phi - phi.mean()
    g = (phi.view(-1, *([1] * (dirs.dim() - 1))) * dirs).mean(dim=0)
    return g.sign() if linf else g / g.norm().clamp(min=1e-12)


class HopSkipJump(Attack):
    """HopSkipJump, untargeted, with the paper's schedules (θ, δ_t, n_t, geometric steps)."""

    name: ClassVar[str] = "hopskipjump"
    norms: ClassVar[tuple[Norm, ...]] = (L2, LINF)
    needs_scores: ClassVar[bool] = False
    #: 1,000 queries buy about five iterations on a 32×32 image, which broke none of 20
    #: benchmark images that 5,000 break 8–10 of (benchmarks/RESULTS.md).
    initial_queries: ClassVar[int] = 5000
    #: It needs about 100·sqrt(t) queries per iteration t: 25,000 buy about 40 iterations.
    query_floor: ClassVar[int] = 25000
    convergence: ClassVar[str] = "distance"
    needs_start: ClassVar[bool] = True
    suite_params: ClassVar[Params] = Params(
        Param("init_evals", int, 100,
              "probes of the boundary's normal at iteration 1 (init_evals * sqrt(t) at "
              "iteration t)", low=1),
        Param("max_evals", int, 1000, "the most probes of the boundary's normal per iteration",
              low=1),
        Param("init_tries", int, 100,
              "noise images tried for an adversarial start, per kind of start (uniform, then "
              "coarse)", low=1),
    )

    def __init__(self, epsilon: float, max_queries: int = 1000, norm: Norm | str = L2,
                 init_evals: int = 100, max_evals: int = 1000, init_tries: int = 100) -> None:
        self._threat(norm, epsilon)
        self.max_queries = max_queries
        self.init_evals = init_evals
        self.max_evals = max_evals
        self.init_tries = init_tries

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        return _Run(self, model, x, y, seeds).attack()


class _Run:
    """One lockstep run of HopSkipJump over a batch (state kept per sample)."""

    def __init__(self, attack: HopSkipJump, model: Any, x: torch.Tensor, y: torch.Tensor,
                 seeds: torch.Tensor) -> None:
        import torch

        self.a, self.model, self.x = attack, model, x
        self.y = y.cpu()
        self.rng = Uniforms(seeds)
        self.linf = attack.norm is LINF
        b = len(x)
        self.d = x[0].numel()
        self.theta = self.d ** -2.0 if self.linf else self.d ** -1.5
        self.used = torch.zeros(b, dtype=torch.long)
        self.live = torch.ones(b, dtype=torch.bool)
        self.best = x.clone()
        self.best_dist = torch.full((b,), math.inf)
        #: The best distance while at most half of the budget was spent (convergence).
        self.half_dist = torch.full((b,), math.inf)
        self.start_failed = torch.zeros(b, dtype=torch.bool)

    # -- queries and bookkeeping ------------------------------------------------------------
    def payable(self, idx: torch.Tensor, want: torch.Tensor | None = None) -> torch.Tensor:
        """Positions in ``idx`` (where ``want``) of live samples that can pay one more query."""
        import torch

        pos = torch.arange(len(idx)) if want is None else want.nonzero().flatten()
        pos = pos[self.live[idx[pos]]]
        ok = self.used[idx[pos]] < self.a.max_queries
        self.live[idx[pos[~ok]]] = False
        return pos[ok]

    def adversarial(self, owner: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
        """One batched query; ``owner[k]`` is the sample that row ``k`` is charged to."""
        import torch

        self.used.index_add_(0, owner, torch.ones(len(owner), dtype=torch.long))
        pred: torch.Tensor = self.model.predict(pts).argmax(1).cpu()
        return (pred != self.y[owner]).cpu()

    def dist(self, pts: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        diff = (pts - self.x[idx]).flatten(1).cpu()
        return diff.abs().max(dim=1).values if self.linf else diff.norm(dim=1)

    def keep_best(self, idx: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
        """Record adversarial points ``pts`` of samples ``idx``; return their distances."""
        dist = self.dist(pts, idx)
        better = dist < self.best_dist[idx]
        self.best[idx[better]] = pts[better]
        self.best_dist[idx[better]] = dist[better]
        early = idx[self.used[idx] <= self.a.max_queries // 2]
        self.half_dist[early] = self.best_dist[early]
        return dist

    def blend(self, idx: torch.Tensor, a: torch.Tensor, alpha: torch.Tensor,
              linf: bool) -> torch.Tensor:
        """Points between the images (alpha 0) and the adversarial points ``a`` (alpha 1)."""
        import torch

        x = self.x[idx]
        al = alpha.to(x).view(-1, 1, 1, 1)
        if not linf:
            return (1 - al) * x + al * a
        r = al * (a - x).flatten(1).abs().max(dim=1).values.view(-1, 1, 1, 1)
        return torch.minimum(torch.maximum(a, x - r), x + r)

    def boundary(self, idx: torch.Tensor, a: torch.Tensor, tol: float,
                 linf: bool) -> torch.Tensor:
        """Binary search from adversarial ``a`` towards the images down to ``tol``."""
        import torch

        lo = torch.zeros(len(idx))
        hi = torch.ones(len(idx))
        while True:
            open_ = self.payable(idx, (hi - lo) > tol)
            if not len(open_):
                break
            mid = (lo[open_] + hi[open_]) / 2
            ok = self.adversarial(idx[open_], self.blend(idx[open_], a[open_], mid, linf))
            hi[open_] = torch.where(ok, mid, hi[open_])
            lo[open_] = torch.where(ok, lo[open_], mid)
        return self.blend(idx, a, hi, linf)

    # -- the attack -----------------------------------------------------------------------
    def noise(self, kind: str, i: int) -> torch.Tensor:
        """One starting candidate for sample ``i`` from its own stream.

        ``uniform``: i.i.d. uniform pixels (the paper's start). ``coarse``: uniform noise on a
        ``_COARSE_CELLS`` × ``_COARSE_CELLS`` grid of cells per channel, upsampled to the
        image (nearest): smooth, blocky images that a classifier sends to many more classes
        than pixel noise, which it often maps to one class.
        """
        import torch

        c, h, w = self.x.shape[1:]
        gen = self.rng.gens[i]
        if kind == "uniform":
            return torch.rand((c, h, w), generator=gen)
        cells = torch.rand((1, c, min(_COARSE_CELLS, h), min(_COARSE_CELLS, w)), generator=gen)
        return torch.nn.functional.interpolate(cells, size=(h, w), mode="nearest")[0]

    def start(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A misclassified noise image per sample: the paper's start, then a second one.

        First up to ``init_tries`` uniform-noise draws; for samples none of them moves out of
        the true class, up to ``init_tries`` coarse-noise draws (:meth:`noise`), all from the
        sample's own seeded stream in that order. Samples with neither are marked in
        ``start_failed`` and not attacked.
        """
        import torch

        found = torch.zeros(len(self.x), dtype=torch.bool)
        start = self.x.clone()
        for kind in _STARTS:
            for _ in range(self.a.init_tries):
                idx = (~found).nonzero().flatten()
                idx = idx[self.payable(idx)]
                if not len(idx):
                    break
                cand = torch.stack([self.noise(kind, int(i)) for i in idx]).to(self.x)
                ok = self.adversarial(idx, cand)
                start[idx[ok]] = cand[ok]
                found[idx[ok]] = True
        self.start_failed = ~found
        self.live &= found
        idx = found.nonzero().flatten()
        return idx, start[idx]

    def gradient(self, idx: torch.Tensor, cur: torch.Tensor, t: int, dist: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Monte-Carlo estimate of the boundary normal at ``cur``; returns (kept idx, update)."""
        import torch

        shape = tuple(self.x.shape[1:])
        n_t = int(min(self.a.init_evals * math.sqrt(t), self.a.max_evals))
        if t == 1:
            delta = torch.full((len(idx),), 0.1)
        else:
            delta = (self.d if self.linf else math.sqrt(self.d)) * self.theta * dist
        probes, dirs, owners, keep = [], [], [], []
        for k, i in enumerate(idx.tolist()):
            # keep one query for the step-size search
            n = min(n_t, self.a.max_queries - int(self.used[i]) - 1)
            if n < 2:
                self.live[i] = False
                continue
            gen = self.rng.gens[i]
            u = torch.randn((n, *shape), generator=gen) if not self.linf else \
                torch.rand((n, *shape), generator=gen) * 2 - 1
            u = (u / u.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)).to(cur)
            dk = float(delta[k])
            p = (cur[k].unsqueeze(0) + dk * u).clamp(0, 1)
            probes.append(p)
            dirs.append((p - cur[k].unsqueeze(0)) / dk)
            owners.append(torch.full((n,), i, dtype=torch.long))
            keep.append(k)
        if not keep:
            return idx[:0], cur[:0]
        owner = torch.cat(owners)
        ans = self.adversarial(owner, torch.cat(probes)).to(cur)
        updates = [estimate_direction(a, p_dirs, self.linf) for p_dirs, a in
                   zip(dirs, torch.split(ans, [len(o) for o in owners]), strict=True)]
        kept = torch.tensor(keep, dtype=torch.long)
        return idx[kept], torch.stack(updates)

    def step(self, idx: torch.Tensor, cur: torch.Tensor, update: torch.Tensor,
             size: torch.Tensor) -> torch.Tensor:
        """Geometric progression: halve the step until the moved point is adversarial."""
        import torch

        out = cur.clone()
        pending = torch.arange(len(idx))
        size = size.clone()
        while len(pending):
            pending = pending[self.payable(idx[pending])]
            if not len(pending):
                break
            s = size[pending].to(cur).view(-1, 1, 1, 1)
            pts = (cur[pending] + s * update[pending]).clamp(0, 1)
            ok = self.adversarial(idx[pending], pts)
            out[pending[ok]] = pts[ok]
            size[pending[~ok]] /= 2
            pending = pending[~ok]
            pending = pending[size[pending] >= _MIN_STEP]
        return out

    def attack(self) -> AttackResult:
        import torch

        idx, start = self.start()
        if len(idx):
            start = self.boundary(idx, start, _INIT_TOL, linf=False)
            self.keep_best(idx, start)
            cur = self.boundary(idx, start, self.theta, self.linf)
            dist = self.keep_best(idx, cur)
        t = 1
        while len(idx):
            go = self.live[idx] & (self.best_dist[idx] > self.a.epsilon)
            idx, cur, dist = idx[go], cur[go], dist[go]
            if not len(idx):
                break
            kept, update = self.gradient(idx, cur, t, dist)
            sel = torch.isin(idx, kept)
            idx, cur, dist = idx[sel], cur[sel], dist[sel]
            if not len(idx):
                break
            moved = self.step(idx, cur, update, dist / math.sqrt(t))
            cur = self.boundary(idx, moved, self.theta, self.linf)
            dist = self.keep_best(idx, cur)
            t += 1
        return AttackResult(self.best, self.used.clone(), self.start_failed.clone(),
                            gap=self.best_dist - self.a.epsilon,
                            half_gap=self.half_dist - self.a.epsilon)
