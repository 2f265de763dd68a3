"""Confident adversarial mistakes: after a break, raise the wrong class's confidence.

A score-based attack stops at the decision boundary, where the model's wrong answer has a low
top probability: such mistakes fall in the abstained share of an accuracy-at-coverage figure by
construction, so that figure under attack would be inflated. Brown et al. (2018) measure
*confident* adversarial mistakes instead. :func:`maximise_confidence` continues from each
broken sample's adversarial point with a bounded random search in the attack's own threat
model: a step is accepted only when the point stays adversarial (still not the true class),
stays in the ε-ball and ``[0, 1]`` (candidates are projected), and the top probability of the
current wrong answer rises. Every candidate costs one query, charged to the sample.

Steps: L∞ sets a random square window to ±ε per channel (the Square attack's move), the
window shrinking from 10% to 1% of the pixels over the budget; L2 adds a Gaussian direction of
norm ``step·ε`` (``step`` from 0.3 down to 0.05) and projects back onto the ball. Each sample
draws from its own seeded stream, so the result does not depend on its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from certify.attacks.base import Uniforms, project


def _top_probability(scores: torch.Tensor, output: str) -> torch.Tensor:
    """Top-class probability (softmax of logits), as the coverage figures read it."""
    p = torch.softmax(scores.float(), dim=1) if output == "logits" else scores.float()
    return p.max(dim=1).values


@dataclass
class ConfidentResult:
    """Per broken sample: the final point, its prediction and confidence, and the queries.

    ``confidence_first`` is the top probability at the point the attack broke the sample
    with; ``confidence`` the one after the search (never lower: only rises are accepted).
    """

    x_adv: torch.Tensor
    pred: torch.Tensor
    confidence_first: torch.Tensor
    confidence: torch.Tensor
    queries: torch.Tensor


def maximise_confidence(model: Any, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
                        adv_scores: torch.Tensor, norm: str, epsilon: float, budget: int,
                        seeds: torch.Tensor, output: str) -> ConfidentResult:
    """Random search for a more confident mistake from each broken sample's ``x_adv``.

    ``x`` ``[B, C, H, W]`` clean images, ``x_adv`` their (projected) adversarial points, ``y``
    the true labels, ``adv_scores`` the model's answers at ``x_adv`` (already counted),
    ``budget`` queries per sample at most (0 turns the search off). ``model.predict`` is the
    only access to the model.
    """
    b = len(x)
    first = _top_probability(adv_scores.cpu(), output)
    best_x, best_conf = x_adv.clone(), first.clone()
    best_pred = adv_scores.argmax(1).cpu()
    queries = torch.zeros(b, dtype=torch.long)
    if b == 0 or budget <= 0 or norm not in ("linf", "l2"):
        return ConfidentResult(best_x, best_pred, first, best_conf, queries)
    rng = Uniforms(seeds)
    _, c, h, w = x.shape
    yc = y.cpu()
    everyone = torch.arange(b)
    for t in range(budget):
        frac = t / max(budget - 1, 1)
        if norm == "linf":
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
        cand = project(cand, x, norm, epsilon)
        scores = model.predict(cand).float().cpu()
        queries += 1
        pred = scores.argmax(1)
        conf = _top_probability(scores, output)
        better = (pred != yc) & (conf > best_conf)
        if bool(better.any()):
            best_x[better.to(best_x.device)] = cand[better.to(cand.device)]
            best_conf[better] = conf[better]
            best_pred[better] = pred[better]
    return ConfidentResult(best_x, best_pred, first, best_conf, queries)
