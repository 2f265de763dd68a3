"""The attack interface: black-box attacks that only call ``predict``.

An attack is constructed from its suite parameters and ``run`` on a batch of samples with one
seed per sample. It returns candidate adversarial images and the queries it spent per sample.
It never grades itself: the caller projects the candidates onto the threat model
(:func:`project`), queries the model once more and decides success from that answer.

Shapes: ``x`` ``[B, C, H, W]`` in ``[0, 1]``, ``y`` ``[B]``, seeds ``[B]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from certify.perturbations.base import generators


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


def project(x_adv: torch.Tensor, x: torch.Tensor, norm: str, epsilon: float) -> torch.Tensor:
    """Clip candidates to the ε-ball around ``x`` and to ``[0, 1]``.

    L∞ and L2: the radius ``epsilon``. L0: ``epsilon`` is a number of pixels ``k``; all channels
    of a pixel count as one, and the ``k`` pixels with the largest change (largest absolute
    change over their channels) keep it while every other pixel is reset to ``x``.
    """
    delta = x_adv - x
    if norm == "l0":  # the kept pixels' values exactly, the others exactly x's
        keep = l0_keep(delta, int(epsilon)).ne(0).any(dim=1, keepdim=True)
        return torch.where(keep, x_adv, x).clamp(0.0, 1.0)
    if norm == "linf":
        delta = delta.clamp(-epsilon, epsilon)
    elif norm == "l2":
        n = delta.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
        delta = delta * torch.clamp(epsilon / n, max=1.0)
    return (x + delta).clamp(0.0, 1.0)


def l0_keep(delta: torch.Tensor, k: int) -> torch.Tensor:
    """``delta`` ``[B, C, H, W]`` with all but its ``k`` most changed pixels zeroed."""
    b, _, h, w = delta.shape
    size = delta.abs().amax(dim=1).flatten(1)  # [B, H*W]
    if k >= h * w:
        return delta
    keep = torch.zeros_like(size, dtype=torch.bool)
    if k > 0:
        keep.scatter_(1, size.topk(k, dim=1).indices, True)
    return delta * keep.view(b, 1, h, w).to(delta.dtype)


def changed_pixels(x_adv: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Pixels (all channels of a pixel count as one) where ``x_adv`` differs from ``x``, ``[B]``."""
    return (x_adv != x).any(dim=1).flatten(1).sum(dim=1)


def margin(scores: torch.Tensor, y: torch.Tensor, output: str) -> torch.Tensor:
    """Margin loss ``s_y - max_{j != y} s_j`` (log-probabilities for probability outputs).

    Negative means misclassified.
    """
    s = torch.log(scores.clamp(min=1e-12)) if output == "probs" else scores
    true = s.gather(1, y.view(-1, 1)).squeeze(1)
    other = s.clone()
    other.scatter_(1, y.view(-1, 1), float("-inf"))
    return true - other.max(dim=1).values


class Uniforms:
    """Per-sample random streams: ``draw(k, idx)`` gives ``[len(idx), k]`` uniforms.

    Every sample draws from its own generator, so its attack does not depend on which other
    samples share its batch.
    """

    def __init__(self, seeds: torch.Tensor) -> None:
        self.gens = generators(seeds)

    def draw(self, k: int, idx: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """``k`` uniforms in ``[0, 1)`` for each listed sample."""
        ids = idx.tolist() if isinstance(idx, torch.Tensor) else idx
        return torch.stack([torch.rand(k, generator=self.gens[i]) for i in ids])

    def normal(self, shape: tuple[int, ...], i: int) -> torch.Tensor:
        """Standard normals of ``shape`` from sample ``i``'s stream."""
        return torch.randn(shape, generator=self.gens[i])


class Attack:
    """Base class: subclasses set ``name``, ``norm``, ``needs_scores`` and write ``run``."""

    name: ClassVar[str] = ""
    norm: ClassVar[str] = "linf"  # linf | l2 | l0 | spatial
    needs_scores: ClassVar[bool] = True
    epsilon: float
    max_queries: int

    def params(self) -> dict[str, Any]:
        """The constructor parameters (as given in the suite)."""
        return dict(vars(self))

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        """Attack the batch; ``model.predict`` is the only access to the model."""
        raise NotImplementedError
