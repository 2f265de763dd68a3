"""Two details of the Square Attack checked against the reference code's behaviour
(Andriushchenko et al.'s square-attack repository, read for the algorithm):

- L∞: a proposal that, once clipped to [0, 1], leaves its window unchanged is never sent (the
  reference resamples it), so no query is wasted on saturated pixels;
- L2: the initialisation's meta pattern is transposed at random per block.
"""

from __future__ import annotations

import pytest
import torch

from certify.attacks import SquareL2, SquareLinf
from certify.attacks.square import _meta_pattern

pytestmark = pytest.mark.unit


class NeverFooled:
    """Answers the same scores for every image (the true class always wins by 5) and keeps
    every image it was asked about."""

    def __init__(self) -> None:
        self.asked: list[torch.Tensor] = []

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        self.asked.append(x.clone())
        s = torch.zeros(len(x), 10)
        s[:, 0] = 5.0
        return s


def test_linf_never_queries_a_proposal_that_clipping_leaves_unchanged():
    # a saturated image: +ε is clipped away, so half of all sign draws would change nothing
    x = torch.ones(4, 3, 16, 16)
    x[1] = 0.0
    x[2, :, :8] = 1.0
    x[2, :, 8:] = 0.0
    x[3] = 0.5
    model = NeverFooled()
    SquareLinf(epsilon=0.1, max_queries=300)(model, x, torch.zeros(4, dtype=torch.long),
                                              torch.arange(4), "logits")
    start, *proposals = model.asked[:-1]  # the last call is the sealed call's judgement
    assert len(proposals) == 299
    for cand in proposals:  # the best point never moves: every proposal must differ from it
        moved = (cand - start).abs().flatten(1).amax(dim=1)
        assert bool((moved > 1e-7).all()), moved


def test_l2_initialisation_transposes_the_meta_pattern_at_random():
    n, eps = 64, 0.5
    x = torch.full((n, 3, 32, 32), 0.5)
    res = SquareL2(epsilon=eps, max_queries=1)(NeverFooled(), x, torch.zeros(n, dtype=torch.long),
                                               torch.arange(n), "logits")
    delta = res.x_adv - x
    s0, off = 32 // 5, (32 - 5 * (32 // 5)) // 2
    block = delta[:, 0, off:off + s0, off:off + s0].flatten(1)
    block = block / block.norm(dim=1, keepdim=True)
    plain, transposed = _meta_pattern(s0, False).flatten(), _meta_pattern(s0, True).flatten()
    as_plain = (block @ plain).abs() > 0.999
    as_transposed = (block @ transposed).abs() > 0.999
    assert bool((as_plain ^ as_transposed).all())  # each block is one of the two
    assert 10 < int(as_transposed.sum()) < n - 10  # and both occur, about half each
    assert torch.allclose(delta.flatten(1).norm(dim=1), torch.full((n,), eps), atol=1e-4)
