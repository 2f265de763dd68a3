"""A gradient search over a corruption's design parameters (issue 40): adaptive brightness.

The adaptive-brightness field has a worst case: its 16 control points span the box
``[-1, 1]^16`` at the bound. The design search covers the box ever more finely, but a field
that breaks the model only near one corner the design never visits escapes it. For a model
whose graph certify holds (an ONNX file with a torch copy), this search follows the gradient of
the model's top-two logit margin with respect to the control points, from several starts (the
design point with the smallest margin, then random points of the box), with signed steps
projected back onto the box. The copy only proposes: every final point is judged on the real
model through its counted ``predict`` (one query per start), and gradient evaluations are
counted apart from queries. The copy must agree with the real model on the batch's clean
images first (:func:`~certify.models.torchcopy.equivalence`); where it does not, or where the
model has no copy (an endpoint), the search says why it did not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from certify.checks.confidence import confidences, top_probability
from certify.models.base import Model
from certify.models.torchcopy import WhiteBoxUnavailable, equivalence, white_box_of

#: Signed gradient steps per start.
STEPS = 10
#: Starts in round 0 (from the design point with the smallest margin); each later round
#: doubles them (the others from random points of the box).
STARTS = 1

Apply = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def starts_in_round(r: int) -> int:
    """Starts per sample in search round ``r`` (1, 2, 4, ...)."""
    return STARTS << r


@dataclass
class FieldFound:
    """Per searched sample: whether a start broke it on the real model, the breaking (or, when
    none broke it, the least confident) design point, the real model's answer there, its
    margin and top probability; queries and gradient evaluations spent."""

    broken: list[bool]
    params: list[list[float]]
    pred: list[int]
    conf: list[float]
    prob: list[float]
    queries: int
    gradients: int


#: Why the search did not run on a model without a graph (an endpoint).
NO_GRAPH = "the model's graph is not available (an endpoint): the design search only"


def unavailable(model: Model, x: torch.Tensor, clean_scores: torch.Tensor
                ) -> list[str | None]:
    """Per sample of the batch, why the gradient search cannot run on it, or ``None``: the
    model has no graph, the graph has no torch copy, or the copy's answer to that sample's
    clean image differs from the model's (each sample is compared on its own, so the answer
    does not depend on the batch)."""
    source = white_box_of(model)
    if source is None:
        return [NO_GRAPH] * len(x)
    try:
        copy = source.torch_copy()
        copy_scores = copy.scores(x)
    except WhiteBoxUnavailable as exc:
        return [f"no torch copy of the graph: {exc}"] * len(x)
    out: list[str | None] = []
    for j in range(len(x)):
        eq = equivalence(copy_scores[j : j + 1], clean_scores[j : j + 1], copy.quantised)
        out.append(None if eq.ok else eq.why())
    return out


def search_field(model: Model, apply: Apply, x: torch.Tensor, y: torch.Tensor,
                 bound: float, first: torch.Tensor, seeds: Sequence[int], starts: int,
                 output: str) -> FieldFound:
    """Search the control points of ``x``'s samples (``[B, C, H, W]``, labels ``y``) from
    ``starts`` starts each: the first from ``first`` (``[B, 16]``, the design point with the
    smallest margin), the others uniform in the box from each sample's ``seeds``.

    ``apply(x, params, seeds)`` is the property's transform with params ``[N, 17]`` (the
    intensity ``bound``, then the 16 control points); it must be differentiable in them.
    """
    source = white_box_of(model)
    if source is None:  # checked by the caller (:func:`unavailable`)
        raise WhiteBoxUnavailable("no graph")
    copy = source.torch_copy()
    b, dim = len(y), first.shape[1]
    rand = [torch.Generator().manual_seed(int(s)) for s in seeds]
    level = torch.full((b, 1), float(bound), device=x.device)
    no_seeds = torch.zeros(b, dtype=torch.long)

    def margin(z: torch.Tensor) -> torch.Tensor:
        true = z.gather(1, y.view(-1, 1)).squeeze(1)
        other = z.clone()
        other.scatter_(1, y.view(-1, 1), -math.inf)
        return other.max(1).values - true  # > 0: a wrong class leads

    gradients = 0
    finals = []
    for start in range(starts):  # one start of every sample at a time (bounded memory)
        if start == 0:
            c = first.float().to(x.device)
        else:
            c = torch.stack([torch.rand(dim, generator=g) * 2 - 1 for g in rand]).to(x.device)
        for k in range(STEPS):
            cg = c.detach().clone().requires_grad_(True)
            with torch.enable_grad():
                xt = apply(x, torch.cat([level, cg], 1), no_seeds)
            _, _, _, gx = copy.value_and_grad(xt.detach(), margin)
            gradients += b
            (gc,) = torch.autograd.grad(xt, cg, grad_outputs=gx)
            step = 0.5 * (1 - k / STEPS) + 0.02  # large steps first, then fine ones
            c = (c + step * torch.sign(gc)).clamp_(-1.0, 1.0)
        finals.append(torch.cat([level, c], 1))
    # the real model judges every final point (one query per start)
    params = torch.cat(finals)  # start-major: [starts * B, 17]
    ys = y.repeat(starts)
    scores = torch.cat([model.predict(apply(x, f, no_seeds)).cpu() for f in finals])
    pred = scores.argmax(1)
    conf = confidences(scores, output)
    prob = top_probability(scores, output)
    bad = (pred != ys.cpu()).view(starts, b)
    conf_v = conf.view(starts, b)
    found = FieldFound([], [], [], [], [], queries=len(c), gradients=gradients)
    for j in range(b):
        if bool(bad[:, j].any()):  # the most confident mistake among the starts
            cand = torch.where(bad[:, j], conf_v[:, j], torch.tensor(-math.inf))
        else:  # the least confident correct answer
            cand = -conf_v[:, j]
        s = int(cand.argmax())
        row = s * b + j
        found.broken.append(bool(bad[s, j]))
        found.params.append([float(v) for v in params[row].cpu()])
        found.pred.append(int(pred[row]))
        found.conf.append(float(conf[row]))
        found.prob.append(float(prob[row]))
    return found
