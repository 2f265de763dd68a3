"""Confident adversarial mistakes: after a break, raise the wrong class's confidence.

A score-based attack stops at the decision boundary, where the model's wrong answer has a low
top probability: such mistakes fall in the abstained share of an accuracy-at-coverage figure by
construction, so that figure under attack would be inflated. Brown et al. (2018) measure
*confident* adversarial mistakes instead. :func:`maximise_confidence` continues from each
broken sample's adversarial point with a bounded random search in the attack's own threat
model: a step is accepted only when the point stays adversarial (still not the true class),
stays in the ε-ball and ``[0, 1]`` (candidates are projected), and the confidence of the
current wrong answer rises (its top-two margin: what the coverage figures rank on, which a
positive scaling of the logits keeps in order). Every candidate costs one query, charged to
the sample.

Steps: L∞ sets a random square window to ±ε per channel (the Square attack's move), the
window shrinking from 10% to 1% of the pixels over the budget; L2 adds a Gaussian direction of
norm ``step·ε`` (``step`` from 0.3 down to 0.05) and projects back onto the ball. Each sample
draws from its own seeded stream, so the result does not depend on its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from certify.attacks.base import Attack, AttackResult, Predictor, Uniforms, project
from certify.attacks.base import top_two_margin as _confidence
from certify.norms import L2, LINF, NORMS, Norm, ThreatModel

#: The norms whose balls the search walks (in others the break is kept as found).
SEARCHED: tuple[Norm, ...] = (LINF, L2)


@dataclass
class ConfidentResult:
    """Per broken sample: the final point, its prediction and confidence, and the queries.

    ``confidence_first`` is the top-two margin at the point the attack broke the sample
    with; ``confidence`` the one after the search (never lower: only rises are accepted).
    """

    x_adv: torch.Tensor
    pred: torch.Tensor
    confidence_first: torch.Tensor
    confidence: torch.Tensor
    queries: torch.Tensor
    scores: torch.Tensor  # the model's answers at x_adv


class ConfidentSearch(Attack):
    """The search as a proposal: from ``x_start`` (judged adversarial, with the judge's answers
    ``start_scores``), raise the wrong answer's confidence (margin) within ``budget`` queries.

    Threat model: the breaking attack's (L∞ or L2, ``epsilon``); scores needed. Run it through
    the sealed call (:func:`maximise_confidence` does), which judges the final points.
    """

    name: ClassVar[str] = "confident_search"
    norms: ClassVar[tuple[Norm, ...]] = tuple(NORMS.values())

    def __init__(self, norm: Norm, epsilon: float, budget: int, x_start: torch.Tensor,
                 start_scores: torch.Tensor) -> None:
        self._threat(norm, epsilon)
        self.max_queries = budget
        self.x_start = x_start
        self.start_scores = start_scores

    def run(self, model: Predictor, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        """Accept a step only when it stays adversarial and its margin rises."""
        b, budget, epsilon = len(x), self.max_queries, self.epsilon
        best_x = self.x_start.clone()
        best_conf = _confidence(self.start_scores.cpu(), output)
        queries = torch.zeros(b, dtype=torch.long)
        if b == 0 or budget <= 0 or self.norm not in SEARCHED:
            return AttackResult(best_x, queries)
        rng = Uniforms(seeds)
        _, c, h, w = x.shape
        yc = y.cpu()
        everyone = torch.arange(b)
        for t in range(budget):
            frac = t / max(budget - 1, 1)
            if self.norm is LINF:
                p = 0.1 * (0.1 ** frac)  # 10% of the pixels down to 1%
                s = min(max(int(round(math.sqrt(p * h * w))), 1), h, w)
                u = rng.draw(2 + c, everyone)
                top = (u[:, 0] * (h - s + 1)).long().clamp(max=h - s)
                left = (u[:, 1] * (w - s + 1)).long().clamp(max=w - s)
                rows = torch.arange(h).view(1, h, 1)
                cols = torch.arange(w).view(1, 1, w)
                m = ((rows >= top.view(-1, 1, 1)) & (rows < top.view(-1, 1, 1) + s)
                     & (cols >= left.view(-1, 1, 1)) & (cols < left.view(-1, 1, 1) + s))
                signs = (u[:, 2:] < 0.5).float().mul(2).sub(1).view(b, c, 1, 1)
                delta = (best_x - x).cpu()
                delta = torch.where(m.unsqueeze(1), epsilon * signs, delta)
                cand = x + delta.to(x)
            else:
                step = 0.3 - 0.25 * frac
                g = torch.stack([rng.normal((c, h, w), k) for k in range(b)])
                g = g / g.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
                cand = best_x + (step * epsilon * g).to(x)
            cand = project(cand, x, self.norm, epsilon)
            scores = model.predict(cand).float().cpu()
            queries += 1
            pred = scores.argmax(1)
            conf = _confidence(scores, output)
            better = (pred != yc) & (conf > best_conf)
            if bool(better.any()):
                best_x[better.to(best_x.device)] = cand[better.to(cand.device)]
                best_conf[better] = conf[better]
        return AttackResult(best_x, queries)


def maximise_confidence(model: Predictor, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
                        adv_scores: torch.Tensor, norm: Norm, epsilon: float, budget: int,
                        seeds: torch.Tensor, output: str) -> ConfidentResult:
    """Random search for a more confident mistake from each broken sample's ``x_adv``.

    ``x`` ``[B, C, H, W]`` clean images, ``x_adv`` their (projected) adversarial points, ``y``
    the true labels, ``adv_scores`` the model's answers at ``x_adv`` (already counted),
    ``budget`` queries per sample at most (0 turns the search off). Goes through the sealed
    attack call: the final points are projected and judged there (from the model's own
    answers to them during the search, so judging costs no query), and a point the judge
    finds no longer adversarial falls back to ``x_adv``.
    """
    first = _confidence(adv_scores.cpu(), output)
    if len(x) == 0 or budget <= 0 or norm not in SEARCHED:
        return ConfidentResult(x_adv.clone(), adv_scores.argmax(1).cpu(), first, first.clone(),
                               torch.zeros(len(x), dtype=torch.long), adv_scores.cpu())
    search = ConfidentSearch(norm, epsilon, budget, x_adv, adv_scores)
    out = search(model, x, y, seeds, output, threat=ThreatModel(norm, epsilon),
                 known=(x_adv, adv_scores), recall=True)
    conf = _confidence(out.scores.float(), output)
    keep = out.success & (conf >= first)
    best_x = torch.where(keep.view(-1, 1, 1, 1).to(x_adv.device), out.x_adv, x_adv)
    pred = torch.where(keep, out.scores.argmax(1), adv_scores.argmax(1).cpu())
    scores = torch.where(keep.view(-1, 1), out.scores.float().cpu(), adv_scores.float().cpu())
    return ConfidentResult(best_x, pred, first, torch.where(keep, conf, first), out.queries,
                           scores)
