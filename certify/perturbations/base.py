"""The property interface shared by every perturbation.

A property (Berghoff et al. 2021, §3.3) is a family of image transforms with a scalar
*intensity* (degrees, pixels, noise sigma, ...). Its search space inside a bound is a sorted list
of candidate parameter vectors; random properties try each intensity level several times with
per-image seeds. ``apply`` is pure: the same images, parameters and seeds give the same output.

Shapes: images ``[N, C, H, W]`` float in ``[0, 1]``; parameters ``[N, P]``; seeds ``[N]`` int64.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Combine integers into one 63-bit seed (splitmix64 steps; order matters)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & MASK64)) & MASK64
        h = (h + 0x9E3779B97F4A7C15) & MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        h = z ^ (z >> 31)
    return h & ((1 << 63) - 1)


def mix_seeds(*parts: int | Sequence[int] | np.ndarray) -> torch.Tensor:
    """:func:`mix_seed` element-wise over equal-length sequences (scalars broadcast), as an
    int64 tensor: the same values, computed with numpy's wrapping uint64 arithmetic."""
    import torch

    arrays = [np.asarray(p, dtype=np.int64).astype(np.uint64) if not isinstance(p, int)
              else np.uint64(int(p) & MASK64) for p in parts]
    n = max((a.size for a in arrays if isinstance(a, np.ndarray)), default=1)
    h = np.full(n, 0x9E3779B97F4A7C15, dtype=np.uint64)
    golden = np.uint64(0x9E3779B97F4A7C15)
    m1, m2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    with np.errstate(over="ignore"):
        for a in arrays:
            h = h ^ a
            h = h + golden
            z = (h ^ (h >> s30)) * m1
            z = (z ^ (z >> s27)) * m2
            h = z ^ (z >> s31)
    return torch.from_numpy((h & np.uint64((1 << 63) - 1)).astype(np.int64))


def generators(seeds: torch.Tensor) -> list[torch.Generator]:
    """One CPU generator per image seed."""
    import torch

    out = []
    for s in seeds.tolist():
        g = torch.Generator()
        g.manual_seed(int(s))
        out.append(g)
    return out


BANK_SIZE = 1 << 23


@functools.lru_cache(maxsize=8)
def _bank(draw: str, device: str) -> torch.Tensor:
    import torch

    g = torch.Generator().manual_seed(0xC3471F7 if draw == "rand" else 0x9A55)
    fn = torch.rand if draw == "rand" else torch.randn
    return fn(BANK_SIZE, generator=g).to(device)


def bank_windows(seeds: torch.Tensor, n: int, draw: str, device: torch.device,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every window of ``n`` consecutive numbers of the seeded bank, and each image's row.

    Returns a read-only view ``[span, n]`` of the bank (row ``o`` is ``bank[o:o + n]``; do not
    write into it) and the rows ``[N]`` that the seeds pick, on the bank's device.
    """
    bank = _bank(draw, str(device))
    span = BANK_SIZE - n
    return bank.as_strided((span, n), (1, 1)), seeds.to(bank.device) % span


def per_image(seeds: torch.Tensor, shape: tuple[int, ...], draw: str, device: torch.device,
              ) -> torch.Tensor:
    """One seeded draw per image (``rand`` or ``randn``), ``[N, *shape]``, a new tensor.

    Each image reads a contiguous window of a fixed bank of 2^23 random numbers, at an offset
    derived from its own seed, so its noise depends on its seed only, not on the other images
    in the batch. Seeding a generator per image cost more than the transform itself
    (benchmarks/RESULTS.md); slicing the bank is cheap and works the same on a GPU, and one
    ``index_select`` over the bank's windows gathers a whole batch without a Python loop.
    """
    import torch

    n = math.prod(shape)
    if n > BANK_SIZE // 4:
        # very large images: fall back to one generator per image
        fn = torch.rand if draw == "rand" else torch.randn
        return torch.stack([fn(shape, generator=g) for g in generators(seeds)]).to(device)
    windows, rows = bank_windows(seeds, n, draw, device)
    return windows.index_select(0, rows).view(len(seeds), *shape)


ApplyFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
#: A search design: ``design(start, stop)`` gives rows ``start:stop`` ``[stop - start, E]`` of a
#: fixed, endless sequence of points in a property's continuous parameters (its position,
#: colour, field...), the same for every sample; doubling ``stop`` refines the search.
DesignFn = Callable[[int, int], "torch.Tensor"]
#: Bits of a candidate's seed key that hold its try (the rest: its intensity level).
_TRY_BITS = 24


class RoundCandidates(typing.NamedTuple):
    """One search round's new candidates, weakest first: parameter rows ``[T, P]`` (level
    parameters, then design parameters), intensities ``[T]`` and seed keys ``[T]`` (level and
    try: a random draw's seed is the sample's seed with this key, whatever the round)."""

    rows: torch.Tensor
    intensity: torch.Tensor
    keys: torch.Tensor


@dataclass(frozen=True)
class Property:
    """One robustness property: how to search it and how to apply it.

    ``levels(bound, steps)`` returns candidate parameter rows ``[T, P]``; ``intensity(params)``
    maps rows to their scalar intensity ``[T]`` (0 is the identity). Random properties
    (``random=True``) are tried ``tries`` times per level with distinct seeds.
    """

    name: str
    family: str
    unit: str
    description: str
    params: tuple[str, ...]
    levels: Callable[[float, int], torch.Tensor]
    intensity: Callable[[torch.Tensor], torch.Tensor]
    apply: ApplyFn
    random: bool = False
    default_bound: float = 1.0
    default_steps: int = 5
    max_bound: float | None = None
    #: Continuous parameters searched by a design (:data:`DesignFn`) rather than drawn from
    #: each sample's seed; ``apply`` reads them after the level parameters when present.
    design_params: tuple[str, ...] = ()
    design: DesignFn | None = None
    #: A random corruption (noise) with no worst case within its bound: decided per sample as
    #: a statement about its distribution at the bound, with a stated confidence, rather than
    #: searched (a large enough draw breaks anything, so no search converges on it).
    statistical: bool = False
    #: ``apply`` is differentiable in the design parameters: a model with a torch copy adds
    #: a gradient search over them (:mod:`certify.checks.field_search`).
    gradient_design: bool = False

    def bound_rows(self, bound: float, steps: int) -> torch.Tensor:
        """The level rows at the bound (the highest intensity), ``[R, P]``: a statistical
        property's draws cycle through them (``random_linf``: inside the ball and on its
        corners)."""
        rows = self._grid_rows(bound, steps)
        inten = self.intensity(rows)
        return rows[inten >= inten.max() - 1e-12].float()

    def lower_rows(self, bound: float, steps: int) -> torch.Tensor:
        """The level rows below the bound, weakest first (a statistical property's curve)."""
        import torch

        rows = self._grid_rows(bound, steps)
        inten = self.intensity(rows)
        keep = inten < inten.max() - 1e-12
        order = torch.argsort(inten[keep], stable=True)
        return rows[keep][order].float()

    def round_candidates(self, bound: float, steps: int, tries: int, r: int
                         ) -> RoundCandidates:
        """Round ``r``'s new candidates of an escalating search inside ``bound``.

        A grid property refines its grid: round ``r`` tries the points of the grid of
        ``steps * 2**r`` steps that coarser rounds did not (none once the grid cannot get
        finer, e.g. whole bits or a flip: the search is then exhaustive). A random property
        doubles its tries per level: ``tries`` in round 0, then as many again as all earlier
        rounds together; a property with a design takes those tries from its design's
        sequence instead of the sample's seed. The identity (intensity 0) is left out.
        """
        import torch

        if not self.random:
            rows = self._grid_rows(bound, steps << r)
            if r:
                seen = {tuple(v) for v in self._grid_rows(bound, steps << (r - 1)).tolist()}
                fresh = [k for k, v in enumerate(rows.tolist()) if tuple(v) not in seen]
                rows = rows[torch.tensor(fresh, dtype=torch.long)]
            inten = self.intensity(rows)
            order = torch.argsort(inten, stable=True)
            return RoundCandidates(rows[order].float(), inten[order],
                                   torch.zeros(len(rows), dtype=torch.long))
        levels = self._grid_rows(bound, steps)
        lo, hi = (0, tries) if r == 0 else (tries << (r - 1), tries << r)
        n_lv, n_try = len(levels), hi - lo
        lv = torch.arange(n_lv).repeat_interleave(n_try)
        tri = torch.arange(lo, hi).repeat(n_lv)
        rows = levels[lv]
        if self.design is not None:
            rows = torch.cat([rows, self.design(lo, hi).to(torch.float64).repeat(n_lv, 1)],
                             dim=1)
        inten = self.intensity(levels)[lv]
        order = torch.argsort(inten, stable=True)
        keys = (lv << _TRY_BITS) | tri
        return RoundCandidates(rows[order].float(), inten[order], keys[order])

    def _grid_rows(self, bound: float, steps: int) -> torch.Tensor:
        """The level grid's rows with intensity above 0, rounded to 1e-9 (so that a finer
        grid's copy of a coarser grid's point compares equal)."""
        import torch

        rows = (self.levels(bound, steps).to(torch.float64) * 1e9).round() / 1e9
        return rows[self.intensity(rows) > 0]

    def candidates(self, bound: float, steps: int, tries: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                          torch.Tensor]:
        """Sorted (params ``[T, P]``, intensity ``[T]``, try index ``[T]``) inside ``bound``.

        The identity (intensity 0) is left out: the clean prediction already covers it.
        """
        import torch

        rows = self.levels(bound, steps).to(torch.float64)
        inten = self.intensity(rows)
        keep = inten > 0
        rows, inten = rows[keep], inten[keep]
        repeat = tries if self.random else 1
        rows = rows.repeat_interleave(repeat, dim=0)
        inten = inten.repeat_interleave(repeat)
        tri = torch.arange(repeat).repeat(int(keep.sum()))
        order = torch.argsort(inten, stable=True)
        return rows[order].float(), inten[order], tri[order]


def symmetric_grid(bound: float, steps: int) -> torch.Tensor:
    """``2 * steps + 1`` values evenly spread over ``[-bound, bound]`` as a column."""
    import torch

    pos = torch.linspace(0, bound, steps + 1, dtype=torch.float64)[1:]
    return torch.cat([-pos.flip(0), torch.zeros(1, dtype=torch.float64), pos]).unsqueeze(1)


def positive_grid(bound: float, steps: int) -> torch.Tensor:
    """``steps`` values evenly spread over ``(0, bound]`` as a column."""
    import torch

    return torch.linspace(0, bound, steps + 1, dtype=torch.float64)[1:].unsqueeze(1)
