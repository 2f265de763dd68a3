"""Square Attack (Andriushchenko et al., ECCV 2020): score-based random search, L∞ and L2.

Each iteration changes one random square window per image and keeps the change if the margin
loss drops. The window's side follows the paper's schedule: ``p`` (the fraction of pixels in
the window) starts at ``p_init`` and halves at iterations 10, 50, 200, 500, 1000, 2000, 4000,
6000 and 8000 of a 10,000-iteration run, rescaled to the query budget. Unlike batch
implementations that draw one square for the whole batch, every image draws its own window
from its own seeded stream.

``p_init`` left unset follows the authors' per-dataset choice: 0.8 for inputs up to 64×64
pixels (their AutoAttack setting for CIFAR-10, both norms; the square-attack repository runs
its MNIST and CIFAR-10 models at 0.3–0.8), and above that the square-attack repository's
ImageNet defaults (0.05 for L∞, 0.1 for L2). The ImageNet values start a 32×32 image with a
7-pixel window that shrinks to one pixel within 10% of a 1,000-query run; on the demo model
(L∞ 8/255, 1,000 queries) 0.05 broke 40 of 100 images and 0.3–1.0 broke 54–58
(benchmarks/RESULTS.md).

Threat model: L∞ or L2 ball of radius ``epsilon`` in ``[0, 1]`` pixel space; needs scores
(logits or probabilities); one query per image per iteration plus one for the start point.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, ClassVar

from certify.attacks.base import Attack, AttackResult, Uniforms, margin
from certify.norms import L2, LINF, Norm
from certify.params import Param, Params

if TYPE_CHECKING:
    import torch

_SCHEDULE = ((10, 1), (50, 2), (200, 4), (500, 8), (1000, 16), (2000, 32), (4000, 64),
             (6000, 128), (8000, 256))


_SMALL_INPUT = 64 * 64


def default_p_init(large: float, h: int, w: int) -> float:
    """``p_init`` when the suite gives none: 0.8 up to 64×64 pixels, else the attack's own
    ``large``: 0.05 (L∞) / 0.1 (L2)."""
    if h * w <= _SMALL_INPUT:
        return 0.8
    return large


def p_selection(p_init: float, it: int, n_iters: int) -> float:
    """The paper's piecewise-constant schedule of the window's pixel fraction."""
    i = int(it / max(n_iters, 1) * 10000)
    div = 512
    for bound, d in _SCHEDULE:
        if i <= bound:
            div = d
            break
    return p_init / div


def _windows(u: torch.Tensor, s: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left corners of one ``s``-sided window per row of uniforms ``u[:, :2]``."""
    top = (u[:, 0] * (h - s + 1)).long().clamp(max=h - s)
    left = (u[:, 1] * (w - s + 1)).long().clamp(max=w - s)
    return top, left


def _mask(top: torch.Tensor, left: torch.Tensor, s: int, h: int, w: int,
          device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``[n, 1, h, w]`` masks of each sample's ``s``-sided window (one scatter)."""
    import torch

    idx = _flat_window(top, left, s, w).to(device)
    m = torch.zeros(len(idx), 1, h * w, dtype=torch.bool, device=device)
    return m.scatter_(2, idx.unsqueeze(1), True).view(-1, 1, h, w)


@functools.lru_cache(maxsize=256)
def _window_offsets(s: int, w: int) -> torch.Tensor:
    """Flat offsets ``[s*s]`` of an ``s``-sided window's pixels from its top-left pixel."""
    import torch

    return (torch.arange(s).view(s, 1) * w + torch.arange(s).view(1, s)).flatten()


def _flat_window(top: torch.Tensor, left: torch.Tensor, s: int, w: int) -> torch.Tensor:
    """Flat pixel indices ``[n, s*s]`` of each sample's window, row-major inside it."""
    return (top * w + left).view(-1, 1) + _window_offsets(s, w).view(1, -1)


class _Square(Attack):
    needs_scores: ClassVar[bool] = True
    #: AutoAttack's budget.
    query_floor: ClassVar[int] = 5000
    suite_params: ClassVar[Params] = Params(
        Param("p_init", float | None, None,
              "the fraction of the image's pixels in the first square window, halved on the "
              "paper's schedule; unset: 0.8 up to 64x64 pixels, else 0.05 (L-infinity) or "
              "0.1 (L2)", low=0, low_open=True, high=1),
    )

    def __init__(self, epsilon: float, max_queries: int = 1000, p_init: float | None = None
                 ) -> None:
        self._threat(None, epsilon)
        self.max_queries = max_queries
        self.p_init = p_init

    def _loop(self, model: Any, x: torch.Tensor, y: torch.Tensor, x_best: torch.Tensor,
              rng: Uniforms, output: str, step: Any) -> AttackResult:
        """Run ``step`` on the unbroken samples until each is broken or out of queries.

        A sample leaves the active set for good once its margin is <= 0 (the margin only
        falls), so the active samples' images are kept as compact tensors, shrunk when some
        break, instead of gathered from and scattered into the whole batch every iteration.
        """
        import torch

        queries = torch.ones(len(x), dtype=torch.long)
        loss = margin(model.predict(x_best).cpu(), y.cpu(), output)
        half = torch.full((len(x),), math.inf)  # margins when half the budget was spent
        active = (loss > 0).nonzero().flatten()
        xa, xb, ya, la = x[active], x_best[active], y.cpu()[active], loss[active]
        for it in range(1, self.max_queries):
            if it == self.max_queries // 2:
                half[active] = la
            if len(active) == 0:
                break
            cand = step(it, active, xa, xb)
            new = margin(model.predict(cand).cpu(), ya, output)
            queries[active] += 1
            better = new < la
            if bool(better.any()):
                b_dev = better.to(xb.device)
                xb[b_dev] = cand[b_dev]
                la[better] = new[better]
            left = la > 0
            if not bool(left.all()):
                x_best[active[~left]] = xb[~left.to(xb.device)]
                keep = left.to(xb.device)
                active, xa, xb, ya, la = active[left], xa[keep], xb[keep], ya[left], la[left]
        x_best[active] = xb
        gap = torch.full((len(x),), math.inf)
        gap[active] = la
        return AttackResult(x_best, queries, gap=gap, half_gap=half)


class SquareLinf(_Square):
    """Square Attack in the L∞ ball (paper's Algorithm 1; ``p_init``: see the module notes)."""

    name: ClassVar[str] = "square_linf"
    norms: ClassVar[tuple[Norm, ...]] = (LINF,)
    #: ``p_init`` on images larger than 64×64 pixels when the suite gives none.
    large_p_init: ClassVar[float] = 0.05

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        import torch

        eps, (b, c, h, w) = self.epsilon, x.shape
        p_init = default_p_init(self.large_p_init, h, w) if self.p_init is None else self.p_init
        rng = Uniforms(seeds)
        # vertical stripes of ±eps: the paper's initialisation
        stripes = (rng.draw(c * w, range(b)) < 0.5).float().mul(2).sub(1).view(b, c, 1, w)
        x_best = (x + eps * stripes.to(x)).clamp(0, 1)

        def step(it: int, active: torch.Tensor, xa: torch.Tensor, xb: torch.Tensor
                 ) -> torch.Tensor:
            p = p_selection(p_init, it, self.max_queries)
            s = min(max(int(round(math.sqrt(p * h * w))), 1), h - 1)
            u = rng.draw(2 + c, active)
            top, left = _windows(u, s, h, w)
            m = _mask(top, left, s, h, w, x.device)
            signs = (u[:, 2:] < 0.5).to(x.dtype).mul_(2).sub_(1).to(x.device)
            delta = xb - xa
            # make sure the window changes the image: where the proposal, once clipped to
            # [0, 1], leaves every pixel of the window as it is (the reference code's check,
            # saturated pixels included), flip its signs, which always changes it
            cand = (xa + (eps * signs).view(-1, c, 1, 1)).clamp(0, 1)
            same = ((cand - xb).abs() < 1e-7).logical_or(~m).flatten(1).all(dim=1)
            signs = torch.where(same.view(-1, 1), -signs, signs)
            delta = torch.where(m, (eps * signs).view(-1, c, 1, 1), delta)
            return (xa + delta).clamp_(0, 1)

        return self._loop(model, x, y, x_best, rng, output, step)


def _pseudo_gaussian(hh: int, ww: int) -> torch.Tensor:
    """Concentric rectangles with weights 1/(k+1)^2, unit norm (the paper's L2 building block)."""
    import torch

    d = torch.zeros(hh, ww, dtype=torch.float64)
    ch, cw = hh // 2, ww // 2
    for k in range(max(ch, cw) + 1):
        d[max(ch - k, 0): min(ch + k + 1, hh), max(cw - k, 0): min(cw + k + 1, ww)] += \
            1.0 / (k + 1) ** 2
    unit: torch.Tensor = d / d.norm()
    return unit


@functools.lru_cache(maxsize=256)
def _meta_pattern(s: int, transpose: bool) -> torch.Tensor:
    """Two pseudo-Gaussian halves of opposite sign, unit norm (cached: callers never modify
    it; every step of every sample used to rebuild it in Python loops)."""
    import torch

    d = torch.zeros(s, s, dtype=torch.float64)
    d[: s // 2] = _pseudo_gaussian(s // 2, s)
    d[s // 2:] = -_pseudo_gaussian(s - s // 2, s)
    d = d / d.norm()
    meta: torch.Tensor = (d.T if transpose else d).float()
    return meta


@functools.lru_cache(maxsize=256)
def _meta_patterns(s: int, device: torch.device) -> torch.Tensor:
    """The meta pattern and its transpose, flattened: ``[2, s*s]`` (index 1: transposed)."""
    import torch

    return torch.stack([_meta_pattern(s, False), _meta_pattern(s, True)]).view(2, -1).to(device)


class SquareL2(_Square):
    """Square Attack in the L2 ball (paper's L2 variant; ``p_init``: see the module notes).

    Each step moves perturbation mass from a second window into a first one, shaped by the
    paper's pseudo-Gaussian meta pattern, keeping the total L2 norm at ``epsilon``.
    """

    name: ClassVar[str] = "square_l2"
    norms: ClassVar[tuple[Norm, ...]] = (L2,)
    #: ``p_init`` on images larger than 64×64 pixels when the suite gives none.
    large_p_init: ClassVar[float] = 0.1

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        import torch

        eps, (b, c, h, w) = self.epsilon, x.shape
        p_init = default_p_init(self.large_p_init, h, w) if self.p_init is None else self.p_init
        rng = Uniforms(seeds)
        s0 = max(h // 5, 1)
        off_h, off_w = (h - s0 * 5) // 2 if h >= 5 else 0, (w - s0 * 5) // 2 if w >= 5 else 0
        init = torch.zeros(b, c, h, w)
        patterns = torch.stack([_meta_pattern(s0, False), _meta_pattern(s0, True)]) \
            if s0 > 1 else torch.ones(2, 1, 1)
        for i in range(h // s0):
            for j in range(w // s0):
                r0, c0 = off_h + i * s0, off_w + j * s0
                if r0 + s0 > h or c0 + s0 > w:
                    continue
                u = rng.draw(c + 1, range(b))
                signs = (u[:, :c] < 0.5).float().mul(2).sub(1).view(b, c, 1, 1)
                # the reference transposes the meta pattern at random, per block
                pattern = patterns[(u[:, c] < 0.5).long()].view(b, 1, s0, s0)
                init[:, :, r0:r0 + s0, c0:c0 + s0] += pattern * signs
        init = init / init.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1) * eps
        x_best = (x + init.to(x)).clamp(0, 1)

        def step(it: int, active: torch.Tensor, xa: torch.Tensor, xb: torch.Tensor
                 ) -> torch.Tensor:
            n, dev = len(active), x.device
            p = p_selection(p_init, it, self.max_queries)
            s = max(int(round(math.sqrt(p * h * w))), 3)
            s = min(s + (s % 2 == 0), h - 1, w - 1)
            u = rng.draw(4 + c + 1, active)
            t1, l1 = _windows(u[:, 0:2], s, h, w)
            t2, l2 = _windows(u[:, 2:4], s, h, w)
            # the windows as flat pixel indices [n, s*s] (row-major inside the window)
            i1 = _flat_window(t1, l1, s, w).to(dev)
            i2 = _flat_window(t2, l2, s, w).to(dev)
            m1 = torch.zeros(n, 1, h * w, dtype=torch.bool, device=dev).scatter_(
                2, i1.unsqueeze(1), True)
            m2 = torch.zeros(n, 1, h * w, dtype=torch.bool, device=dev).scatter_(
                2, i2.unsqueeze(1), True)
            delta = (xb - xa).view(n, c, h * w)
            norm_img = delta.flatten(1).norm(dim=1).view(-1, 1, 1)
            sq = delta.square()
            norm_w1 = (sq * m1).sum(dim=2, keepdim=True).sqrt()
            norm_both = (sq * (m1 | m2)).sum(dim=2, keepdim=True).sqrt()
            signs = (u[:, 4:4 + c] < 0.5).float().mul(2).sub(1).view(n, c, 1).to(x)
            pat = _meta_patterns(s, dev)[(u[:, 4 + c] < 0.5).long().to(dev)]  # [n, s*s]
            new = pat.unsqueeze(1) * signs
            # every sample's first window at once: one gather reads it, one scatter writes it
            i1c = i1.unsqueeze(1).expand(n, c, s * s)
            old = delta.gather(2, i1c) / (norm_w1 + 1e-10)
            new = new + old
            budget = ((eps ** 2 - norm_img ** 2).clamp(min=0) / c + norm_both ** 2).sqrt()
            new = new / new.pow(2).sum(dim=2, keepdim=True).sqrt().clamp(min=1e-12) * budget
            delta = delta.masked_fill(m2, 0.0).scatter_(2, i1c, new)
            delta = delta / delta.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1)
            cand: torch.Tensor = (xa + delta.view(n, c, h, w) * eps).clamp(0, 1)
            return cand

        return self._loop(model, x, y, x_best, rng, output, step)
