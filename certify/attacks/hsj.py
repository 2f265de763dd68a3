"""HopSkipJump (Chen, Jordan and Wainwright, IEEE S&P 2020): decision-based, L2 or L∞.

Needs only the predicted label. From an adversarial starting point it alternates a binary
search to the decision boundary, a Monte-Carlo estimate of the boundary's normal from the
signs of ``num_evals`` random probes, and a geometric step along that estimate. Every random
draw comes from the sample's own seeded stream, so a run is repeatable.

Threat model: L2 or L∞ ball of radius ``epsilon``; success means a final point within
``epsilon`` (the caller checks). Query budget per sample: ``max_queries``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from certify.attacks.base import Attack, AttackResult, Uniforms


class _Budget(Exception):
    pass


class HopSkipJump(Attack):
    """HopSkipJump, untargeted, with the paper's defaults for the gradient estimate."""

    name: ClassVar[str] = "hopskipjump"
    needs_scores: ClassVar[bool] = False

    def __init__(self, epsilon: float, max_queries: int = 1000, norm: str = "l2",
                 init_evals: int = 100, max_evals: int = 1000, init_tries: int = 100) -> None:
        self.epsilon = epsilon
        self.max_queries = max_queries
        self.norm = norm  # type: ignore[misc]
        self.init_evals = init_evals
        self.max_evals = max_evals
        self.init_tries = init_tries

    def _dist(self, a: torch.Tensor, b: torch.Tensor) -> float:
        d = (a - b).flatten()
        return float(d.abs().max() if self.norm == "linf" else d.norm())

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        rng = Uniforms(seeds)
        x_adv = x.clone()
        queries = torch.zeros(len(x), dtype=torch.long)
        for i in range(len(x)):
            x_adv[i], queries[i] = self._one(model, x[i], int(y[i]), rng, i)
        return AttackResult(x_adv, queries)

    def _one(self, model: Any, x: torch.Tensor, y: int, rng: Uniforms, i: int
             ) -> tuple[torch.Tensor, int]:
        used = 0
        d = x.numel()
        theta = d ** -1.5 if self.norm == "l2" else d ** -2.0

        def adversarial(batch: torch.Tensor) -> torch.Tensor:
            nonlocal used
            if used + len(batch) > self.max_queries:
                raise _Budget
            used += len(batch)
            return (model.predict(batch).argmax(1) != y).cpu()

        def blend(a: torch.Tensor, alpha: float) -> torch.Tensor:
            if self.norm == "l2":
                return (1 - alpha) * x + alpha * a
            r = alpha * float((a - x).abs().max())
            return torch.minimum(torch.maximum(a, x - r), x + r)

        def boundary(a: torch.Tensor) -> torch.Tensor:
            lo, hi = 0.0, 1.0  # blend(a, hi) is adversarial
            tol = theta if self.norm == "l2" else theta * d
            tol = max(tol, 1e-4)
            while hi - lo > tol:
                mid = (lo + hi) / 2
                if bool(adversarial(blend(a, mid).unsqueeze(0))[0]):
                    hi = mid
                else:
                    lo = mid
            return blend(a, hi)

        best = x.clone()
        try:
            start = None
            for _ in range(self.init_tries):
                cand = torch.rand(x.shape, generator=rng.gens[i]).to(x)
                if bool(adversarial(cand.unsqueeze(0))[0]):
                    start = cand
                    break
            if start is None:
                return x.clone(), used
            cur = boundary(start)
            best = cur
            dist = self._dist(cur, x)
            for t in range(1, 10_000):
                if dist <= self.epsilon:
                    break
                delta = (math.sqrt(d) if self.norm == "l2" else d) * theta * dist
                n = int(min(self.init_evals * math.sqrt(t), self.max_evals))
                n = max(2, min(n, self.max_queries - used - 1))
                if self.norm == "l2":
                    u = rng.normal((n, *x.shape), i).to(x)
                else:
                    u = (torch.rand((n, *x.shape), generator=rng.gens[i]) * 2 - 1).to(x)
                u = u / u.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
                probes = (cur.unsqueeze(0) + delta * u).clamp(0, 1)
                u = (probes - cur.unsqueeze(0)) / delta
                phi = adversarial(probes).to(x).mul(2).sub(1)
                if phi.abs().mean() < 1:  # mixed answers: the baseline lowers the variance
                    phi = phi - phi.mean()
                grad = (phi.view(-1, 1, 1, 1) * u).mean(dim=0)
                if self.norm == "l2":
                    update = grad / grad.norm().clamp(min=1e-12)
                else:
                    update = grad.sign()
                step = dist / math.sqrt(t)
                while True:
                    cand = (cur + step * update).clamp(0, 1)
                    if bool(adversarial(cand.unsqueeze(0))[0]):
                        break
                    step /= 2
                    if step < 1e-8:
                        cand = cur
                        break
                cur = boundary(cand)
                new = self._dist(cur, x)
                if new < dist:
                    best, dist = cur, new
        except _Budget:
            pass
        return best, used
