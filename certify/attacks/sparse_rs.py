"""Sparse-RS (Croce et al., AAAI 2022): score-based random search for L0-bounded attacks.

Threat model: at most ``k`` pixels changed (all channels of a pixel count as one), each to any
value in ``[0, 1]``; ``epsilon`` is ``k``. Needs scores (logits or probabilities); one query per
image per iteration plus one for the start point, and each sample stops at its first success.

The algorithm follows the authors' L0 pixel attack (github.com/fra31/sparse-rs,
``rs_attacks.py``): the start point sets ``k`` random pixels to random corners of the colour
cube (every channel 0 or 1). Each iteration moves ``m`` of the perturbed pixels back to their
original values and perturbs ``m`` so far unchanged pixels with new random corners, and keeps
the candidate if the margin loss drops. ``m = max(floor(alpha * k), 1)``, with ``alpha``
following the paper's piecewise-constant schedule from ``alpha_init`` (``alpha_init / 2`` after
the first 50 of 10,000 iterations down to ``alpha_init / 20`` after 8,000, rescaled to the
budget); the authors run untargeted L0 attacks at ``alpha_init = 0.3``. When ``m`` is 1 the new
colour is redrawn until it differs from the pixel's current one, as in the reference.

Unlike the reference, which draws one set of positions for the whole batch, every image draws
its positions and colours from its own seeded stream, so a sample's attack does not depend on
which other samples share its batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from certify.attacks.base import Attack, AttackResult, Uniforms, margin
from certify.norms import L0, Norm
from certify.params import Param, Params

if TYPE_CHECKING:
    import torch

# (last iteration of a 10,000-iteration run, divisor of alpha_init) for the L0 attack
_SCHEDULE = ((0, 1), (50, 2), (200, 4), (500, 5), (1000, 6), (2000, 8), (4000, 10),
             (6000, 12), (8000, 15))
_REDRAWS = 64  # a 1-pixel update redraws its colour at most this often to make it differ


def alpha_selection(alpha_init: float, it: int, n_iters: int) -> float:
    """The paper's L0 schedule: the share of the ``k`` pixels resampled at iteration ``it``."""
    i = int(it / max(n_iters, 1) * 10000)
    for bound, d in _SCHEDULE:
        if i <= bound:
            return alpha_init / d
    return alpha_init / 20


class SparseRS(Attack):
    """Sparse-RS in the L0 pixel threat model (``epsilon`` = ``k`` pixels)."""

    name: ClassVar[str] = "sparse_rs"
    norms: ClassVar[tuple[Norm, ...]] = (L0,)
    needs_scores: ClassVar[bool] = True
    #: Its authors' untargeted L0 setting.
    query_floor: ClassVar[int] = 10000
    suite_params: ClassVar[Params] = Params(
        Param("alpha_init", float, 0.3,
              "the share of the k pixels resampled at the first iteration, lowered on the "
              "paper's schedule (its authors' untargeted L0 setting)",
              low=0, low_open=True, high=1),
    )

    def __init__(self, epsilon: float, max_queries: int = 1000, alpha_init: float = 0.3
                 ) -> None:
        self._threat(L0, epsilon)
        self.max_queries = max_queries
        self.alpha_init = alpha_init

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        import torch

        b, c, h, w = x.shape
        n = h * w
        k = max(0, min(int(self.epsilon), n))
        rng = Uniforms(seeds)
        gens = rng.gens
        # perm[i, :k] are sample i's perturbed pixels, perm[i, k:] the unchanged ones
        perm = torch.stack([torch.randperm(n, generator=gens[i]) for i in range(b)]) if b else \
            torch.zeros(0, n, dtype=torch.long)
        flat = x.reshape(b, c, n)
        best = flat.clone()
        if k:
            corners = torch.stack([(torch.rand(c, k, generator=gens[i]) < 0.5) for i in range(b)])
            best.scatter_(2, perm[:, :k].unsqueeze(1).expand(b, c, k).to(x.device),
                          corners.to(x.dtype).to(x.device))
        queries = torch.ones(b, dtype=torch.long)
        loss = margin(model.predict(best.view(b, c, h, w)).cpu(), y.cpu(), output)
        active = (loss > 0).nonzero().flatten()
        if k == 0:  # nothing may change: the start point is the image itself
            return AttackResult(best.view(b, c, h, w), queries)
        half = torch.full((b,), math.inf)  # margins when half the budget was spent
        xa, xb, ya, la, pa = flat[active], best[active], y.cpu()[active], loss[active], \
            perm[active]
        for it in range(1, self.max_queries):
            if it == self.max_queries // 2:
                half[active] = la
            if len(active) == 0:
                break
            m = max(int(alpha_selection(self.alpha_init, it, self.max_queries) * k), 1)
            m = min(m, k, n - k) if n > k else min(m, k)
            cand, ip, inp = self._candidates(xa, xb, pa, active, gens, k, m, n)
            new = margin(model.predict(cand.view(-1, c, h, w)).cpu(), ya, output)
            queries[active] += 1
            better = new < la
            if bool(better.any()):
                bd = better.to(xb.device)
                xb[bd] = cand[bd]
                la[better] = new[better]
                if inp is not None:  # swap the moved positions between the two sets
                    rows = better.nonzero().flatten()
                    a_pos, b_pos = ip[rows], inp[rows] + k
                    old_a = pa[rows].gather(1, a_pos)
                    old_b = pa[rows].gather(1, b_pos)
                    sub = pa[rows]
                    sub.scatter_(1, a_pos, old_b)
                    sub.scatter_(1, b_pos, old_a)
                    pa[rows] = sub
            left = la > 0
            if not bool(left.all()):
                best[active[~left]] = xb[~left.to(xb.device)]
                keep = left.to(xb.device)
                active, xa, xb, ya, la, pa = (active[left], xa[keep], xb[keep], ya[left],
                                              la[left], pa[left])
        best[active] = xb
        gap = torch.full((b,), math.inf)
        gap[active] = la
        return AttackResult(best.view(b, c, h, w), queries, gap=gap, half_gap=half)

    @staticmethod
    def _candidates(xa: torch.Tensor, xb: torch.Tensor, pa: torch.Tensor, active: torch.Tensor,
                    gens: list[torch.Generator], k: int, m: int, n: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One candidate per active sample: ``m`` perturbed pixels reset, ``m`` new ones set.

        Returns the candidates ``[A, C, H*W]``, the positions in ``perm[:, :k]`` that were
        reset and the positions in ``perm[:, k:]`` that were perturbed (``None`` when every
        pixel is in the perturbed set: then the reset pixels are recoloured instead).
        """
        import torch

        a, c = len(active), xa.shape[1]
        ids = active.tolist()
        ip = torch.stack([torch.randperm(k, generator=gens[i])[:m] for i in ids])
        inp = torch.stack([torch.randperm(n - k, generator=gens[i])[:m] for i in ids]) \
            if n > k else None
        colours = torch.stack([(torch.rand(c, m, generator=gens[i]) < 0.5) for i in ids]
                              ).to(xa.dtype)
        dev = xa.device
        p_set = pa.gather(1, ip).to(dev)
        cand = xb.clone()
        cand.scatter_(2, p_set.unsqueeze(1).expand(a, c, m),
                      xa.gather(2, p_set.unsqueeze(1).expand(a, c, m)))
        target = p_set if inp is None else pa.gather(1, inp + k).to(dev)
        idx = target.unsqueeze(1).expand(a, c, m)
        if m == 1:  # make sure a single new pixel changes colour
            current = cand.gather(2, idx).cpu()
            for j, i in enumerate(ids):
                for _ in range(_REDRAWS):
                    if not torch.equal(colours[j], current[j]):
                        break
                    colours[j] = (torch.rand(c, 1, generator=gens[i]) < 0.5).to(xa.dtype)
        cand.scatter_(2, idx, colours.to(dev))
        return cand, ip, inp
