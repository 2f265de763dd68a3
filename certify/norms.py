"""Threat norms and threat models as values (in the spirit of foolbox's ``LpDistance``).

A :class:`Norm` knows everything certify asks of a threat norm: its name and symbol, its order
on the card, its default radius and unit, how to measure a perturbation, project onto its ball
intersected with the pixel box ``[0, 1]``, test membership, step along a gradient, draw random
points of its ball and boundary (the binarization test's planted problems), and how to write
a radius in words. A :class:`ThreatModel` is a norm and a radius, hashable, and serialised in
results as the norm's name and the radius, as before.

Nothing outside this module compares a norm's name (``tests/test_layout.py`` holds that): a
new norm is a new :class:`Norm` here and the attacks that attack in it. The module imports
no torch at load: the report layer reads norms too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch


class Draws(Protocol):
    """Per-sample random streams (:class:`certify.attacks.base.Uniforms`)."""

    def draw(self, k: int, idx: Sequence[int]) -> torch.Tensor:
        """``k`` uniforms in ``[0, 1)`` for each listed sample."""
        ...

    def normal(self, shape: tuple[int, ...], i: int) -> torch.Tensor:
        """Standard normals of ``shape`` from sample ``i``'s stream."""
        ...


class Norm:
    """A threat norm: see the module docstring. The instances are the module's constants
    (:data:`LINF`, :data:`L2`, :data:`L1`, :data:`L0`, :data:`SPATIAL`); :func:`norm` finds one
    by name. A norm equals (and hashes as) its name, so a table keyed by norms finds an entry
    by the name a suite or results hold."""

    #: The name in suites and results (``linf``).
    name: ClassVar[str] = ""
    #: The symbol on the card (``L∞``).
    symbol: ClassVar[str] = ""
    #: Threat models are listed in this order of their norms, then by radius.
    order: ClassVar[int] = 9
    #: The radius when a suite gives none.
    default_epsilon: ClassVar[float] = 0.0
    #: The radius's unit in words (``pixels``), empty for pixel-value units.
    unit: ClassVar[str] = ""
    #: The radius is a whole number (a count of pixels).
    whole: ClassVar[bool] = False
    #: The ball is a set of pixel changes (a perturbation is shown by its changed pixels).
    sparse: ClassVar[bool] = False
    #: The binarization test has planted problems in this norm's ball; otherwise the words
    #: the card gives for its absence.
    binarization: ClassVar[bool] = False
    no_binarization: ClassVar[str] = ""
    #: Where an attack row in this norm has no binarization test by nature: why, on its card.
    binarization_note: ClassVar[str | None] = None
    #: A suite may choose it with an attack check's ``norm`` (for attacks that attack in
    #: several norms); the others follow from the attack.
    chosen: ClassVar[bool] = False
    #: The threat model is a ball of perturbations (not a grid of transforms).
    ball: ClassVar[bool] = True
    #: Random draws of the binarization test and the random baseline need normals.
    needs_normals: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"Norm({self.name})"

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        # a norm is its name: tables keyed by norm find it by the name results and suites hold
        if isinstance(other, Norm):
            return other.name == self.name
        return isinstance(other, str) and other == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self) -> tuple[Callable[[str], Norm], tuple[str]]:
        # unpickled (a Ray worker) as the same constant, so identity and equality hold
        return norm, (self.name,)

    # -- words ------------------------------------------------------------------------------
    def radius_text(self, eps: float) -> str:
        """The radius in a few characters (``0.5``)."""
        return f"{eps:g}"

    def short(self, eps: float) -> str:
        """The threat model in a few characters: ``L∞ 8/255``, ``L2 0.5``, ``L0 8 px``."""
        return f"{self.symbol} {self.radius_text(eps)}"

    def headline(self, eps: float) -> str:
        """The threat model in a check's headline: ``linf ε=0.03137``."""
        return f"{self.name} ε={eps:.4g}"

    def card_text(self, eps: float, num: Callable[[float, int], str], grid: bool = True) -> str:
        """The threat model on a card's attack section (``num(value, digits)`` formats a
        number as the card does): ``linf, ε = 0.0314``."""
        return f"{self.name}, ε = {num(eps, 4)}"

    # -- geometry (torch) -------------------------------------------------------------------
    def size(self, delta: torch.Tensor) -> torch.Tensor:
        """``[B]``: the norm of each flattened perturbation ``delta`` ``[B, D]``."""
        raise NotImplementedError(f"the {self.name} threat model has no size")

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
        """Candidates clipped to the ε-ball around ``x`` and to ``[0, 1]``."""
        return (x + (x_adv - x)).clamp(0.0, 1.0)

    def inside(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float,
               rtol: float = 1e-6) -> torch.Tensor:
        """``[B]`` bool: each candidate lies in ``[0, 1]`` and in the ε-ball around ``x`` (up
        to a relative float tolerance ``rtol`` on the radius)."""
        valid = ((x_adv >= 0) & (x_adv <= 1)).flatten(1).all(dim=1)
        return valid & (self.size((x_adv - x).flatten(1)) <= epsilon * (1 + rtol))

    def direction(self, grad: torch.Tensor) -> torch.Tensor:
        """The steepest-ascent step of unit size along ``grad`` ``[B, C, H, W]``."""
        raise NotImplementedError(f"no gradient steps in the {self.name} threat model")

    def start(self, draws: Draws, ids: list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """A random point of the unit ball's surface per listed sample (an attack's start)."""
        raise NotImplementedError(f"no random starts in the {self.name} threat model")

    def ball_points(self, x: torch.Tensor, epsilon: float, u: torch.Tensor,
                    gauss: torch.Tensor | None = None, corner: torch.Tensor | None = None,
                    ) -> torch.Tensor:
        """Points in the ε-ball around ``x``: uniform, or on its boundary where ``corner``
        ``[B]`` is set. ``u``: uniforms shaped like ``x``; ``gauss``: normals shaped like ``x``
        (norms that :attr:`needs_normals`)."""
        raise NotImplementedError(f"no random points of the {self.name} ball")

    def sweep_top(self, shape: Sequence[int]) -> float:
        """A radius that reaches any image of ``shape`` (C, H, W) from any other."""
        raise NotImplementedError(f"no ε sweep in the {self.name} threat model")


class _Linf(Norm):
    name = "linf"
    symbol = "L∞"
    order = 0
    chosen = True
    default_epsilon = 8 / 255
    binarization = True
    no_binarization = " (binarization: false)"

    def radius_text(self, eps: float) -> str:
        k = round(eps * 255)
        if k and abs(eps * 255 - k) < 0.05:
            return f"{k}/255"
        return f"{eps:g}"

    def size(self, delta: torch.Tensor) -> torch.Tensor:
        return delta.abs().amax(dim=1)

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
        return (x + (x_adv - x).clamp(-epsilon, epsilon)).clamp(0.0, 1.0)

    def direction(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.sign()

    def start(self, draws: Draws, ids: list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """Uniform in the cube, scaled out to its surface (the reference's starts)."""
        t = (2 * draws.draw(math.prod(shape), ids) - 1).view(len(ids), *shape)
        return t / t.flatten(1).abs().amax(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)

    def ball_points(self, x: torch.Tensor, epsilon: float, u: torch.Tensor,
                    gauss: torch.Tensor | None = None, corner: torch.Tensor | None = None,
                    ) -> torch.Tensor:
        """Uniform in the cube, or on its corners."""
        import torch

        delta = (u * 2 - 1) * epsilon
        if corner is not None:
            delta = torch.where(corner.view(-1, 1, 1, 1), torch.sign(delta) * epsilon, delta)
        return (x + delta.to(x)).clamp(0, 1)

    def sweep_top(self, shape: Sequence[int]) -> float:
        return 0.5


class _L2(Norm):
    name = "l2"
    symbol = "L2"
    order = 1
    chosen = True
    default_epsilon = 0.5
    binarization = True
    no_binarization = " (binarization: false)"
    needs_normals = True

    def size(self, delta: torch.Tensor) -> torch.Tensor:
        return delta.norm(dim=1)

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
        import torch

        delta = x_adv - x
        n = delta.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
        return (x + delta * torch.clamp(epsilon / n, max=1.0)).clamp(0.0, 1.0)

    def direction(self, grad: torch.Tensor) -> torch.Tensor:
        n = grad.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
        out: torch.Tensor = grad / (n + 1e-12)
        return out

    def start(self, draws: Draws, ids: list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """On the sphere (normals, normalised)."""
        import torch

        t = torch.stack([draws.normal(shape, i) for i in ids])
        return t / t.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)

    def ball_points(self, x: torch.Tensor, epsilon: float, u: torch.Tensor,
                    gauss: torch.Tensor | None = None, corner: torch.Tensor | None = None,
                    ) -> torch.Tensor:
        """Uniform in the ball, or on its sphere."""
        import torch

        assert gauss is not None
        d = gauss / gauss.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)
        n = d[0].numel()
        radius = u.flatten(1)[:, 0] ** (1.0 / n)  # uniform in the ball
        if corner is not None:
            radius = torch.where(corner, torch.ones_like(radius), radius)
        delta = d * radius.view(-1, 1, 1, 1) * epsilon
        return (x + delta.to(x)).clamp(0, 1)

    def sweep_top(self, shape: Sequence[int]) -> float:
        return math.sqrt(math.prod(shape))


class _L1(Norm):
    """L1: the radius is in [0, 1] pixel units summed over all C·H·W values (12 for 3×32×32
    images is Croce & Hein 2021's CIFAR-10 radius). The ball meets the pixel box in corners a
    clip after a projection onto the ball alone would miss: :meth:`project` is the exact
    Euclidean projection onto their intersection (:func:`project_l1_box`). White-box attacks
    only (l1-APGD); the binarization test has no L1 rung."""

    name = "l1"
    symbol = "L1"
    order = 2
    chosen = True
    default_epsilon = 12.0
    no_binarization = " (not available for L1)"
    needs_normals = True

    def size(self, delta: torch.Tensor) -> torch.Tensor:
        """Summed in float64: a float32 sum of thousands of terms drifts by more than the
        membership test's tolerance."""
        return delta.double().abs().sum(dim=1)

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
        return project_l1_box(x_adv, x, epsilon)

    def inside(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float,
               rtol: float = 1e-6) -> torch.Tensor:
        """The offset taken in float64 (exact for float32 images), then :meth:`size`."""
        valid = ((x_adv >= 0) & (x_adv <= 1)).flatten(1).all(dim=1)
        delta = (x_adv.double() - x.double()).flatten(1)
        return valid & (self.size(delta) <= epsilon * (1 + rtol))

    def direction(self, grad: torch.Tensor) -> torch.Tensor:
        """Steepest ascent in L1: the sign of the largest gradient magnitude (ties share the
        unit step). l1-APGD widens it to its adaptive top-k (:mod:`certify.attacks.apgd`)."""
        import torch

        g = grad.flatten(1)
        top = g.abs() == g.abs().amax(dim=1, keepdim=True)
        signs = torch.where(top, g.sign(), torch.zeros_like(g))
        out: torch.Tensor = signs / signs.abs().sum(dim=1, keepdim=True).clamp(min=1)
        return out.view_as(grad)

    def start(self, draws: Draws, ids: list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """On the sphere (normals over their L1 norm)."""
        import torch

        t = torch.stack([draws.normal(shape, i) for i in ids])
        return t / t.flatten(1).abs().sum(dim=1).clamp(min=1e-12).view(-1, 1, 1, 1)

    def sweep_top(self, shape: Sequence[int]) -> float:
        """The cube's L1 diameter, C·H·W."""
        return float(math.prod(shape))


class _L0(Norm):
    """L0: the radius is a number of pixels ``k``; all channels of a pixel count as one."""

    name = "l0"
    symbol = "L0"
    order = 3
    default_epsilon = 10
    unit = "pixels"
    whole = True
    sparse = True
    no_binarization = " (not available for L0)"
    binarization_note = ("binarization test not available for L0 threat models: its planted "
                         "problem is built in an L∞ or L2 ball, so this attack's strength is "
                         "unverified")

    def short(self, eps: float) -> str:
        return f"L0 {eps:g} px"

    def headline(self, eps: float) -> str:
        return f"l0 k={eps:.0f} pixels"

    def card_text(self, eps: float, num: Callable[[float, int], str], grid: bool = True) -> str:
        return f"l0, k = {num(eps, 0)} pixels"

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
        """The ``k`` pixels with the largest change (largest absolute change over their
        channels) keep their values exactly; every other pixel is reset to ``x``'s."""
        import torch

        keep = l0_keep(x_adv - x, int(epsilon)).ne(0).any(dim=1, keepdim=True)
        return torch.where(keep, x_adv, x).clamp(0.0, 1.0)

    def inside(self, x_adv: torch.Tensor, x: torch.Tensor, epsilon: float,
               rtol: float = 1e-6) -> torch.Tensor:
        """Exactly: at most ``k`` pixels changed."""
        valid = ((x_adv >= 0) & (x_adv <= 1)).flatten(1).all(dim=1)
        return valid & (changed_pixels(x_adv, x) <= int(epsilon))


class _Spatial(Norm):
    """Rotations and translations on a grid: no ball, no radius."""

    name = "spatial"
    symbol = "spatial"
    order = 4
    ball = False
    no_binarization = " (binarization: false)"

    def short(self, eps: float) -> str:
        return "spatial"

    def headline(self, eps: float) -> str:
        return "spatial grid"

    def card_text(self, eps: float, num: Callable[[float, int], str], grid: bool = True) -> str:
        return "rotation × translation grid" if grid else "spatial"


LINF: Norm = _Linf()
L2: Norm = _L2()
L1: Norm = _L1()
L0: Norm = _L0()
SPATIAL: Norm = _Spatial()
#: Every norm, in card order.
NORMS: dict[str, Norm] = {n.name: n for n in sorted((LINF, L2, L1, L0, SPATIAL),
                                                      key=lambda n: n.order)}


def norm(name: str | Norm) -> Norm:
    """The norm of this name (a :class:`Norm` is returned as it is); ``KeyError`` naming the
    valid ones for an unknown name."""
    if isinstance(name, Norm):
        return name
    try:
        return NORMS[name]
    except KeyError:
        raise KeyError(f"unknown threat norm {name!r} (valid: {', '.join(NORMS)})") from None


class ThreatModel(NamedTuple):
    """A norm and a radius: what an attack's proposals are projected onto and what a
    threat-model row of the card groups. Hashable, and unpacks as ``norm, epsilon``; results
    keep ``norm`` as its name."""

    norm: Norm
    epsilon: float

    @staticmethod
    def of(name: str | Norm, epsilon: float) -> ThreatModel:
        """The threat model of a norm (or its name) and a radius."""
        return ThreatModel(norm(name), float(epsilon))


def threat_name(name: str, eps: float) -> str:
    """A threat model in a few characters from its serialised form: ``L∞ 8/255``, ``L2 0.5``,
    ``L0 8 px``, ``spatial`` (an unknown norm by its name)."""
    found = NORMS.get(name)
    return found.short(eps) if found is not None else f"{name} {eps:g}"


def card_text(name: str, eps: float, num: Callable[[float, int], str], grid: bool = True) -> str:
    """:meth:`Norm.card_text` from a threat model's serialised form."""
    found = NORMS.get(name)
    return found.card_text(eps, num, grid) if found is not None else f"{name}, ε = {num(eps, 4)}"


def order_key(name: str, eps: float) -> tuple[int, str, float]:
    """Sort key of a serialised threat model: its norm's order, its name, its radius."""
    found = NORMS.get(name)
    return (found.order if found is not None else 9, name, eps)


def project_l1_box(x_adv: torch.Tensor, x: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The nearest point (Euclidean) to ``x_adv`` in ``{z : ||z − x||_1 ≤ ε, 0 ≤ z ≤ 1}``,
    per sample of ``[B, C, H, W]`` (``x`` in ``[0, 1]``).

    The solution soft-thresholds the offset ``w = x_adv − x`` by one multiplier λ ≥ 0 and
    clips it to the room the box leaves each coordinate in ``w``'s direction:
    ``d_i = sign(w_i) · min(max(|w_i| − λ, 0), room_i)``; λ is 0 where the clipped offset is
    already within ε, else the root of the piecewise-linear, non-increasing
    ``g(λ) = Σ_i min(max(|w_i| − λ, 0), room_i) = ε``. The root is found exactly from g's
    breakpoints (:func:`_l1_root`). Only the coordinates with the largest ``|w_i|`` can move,
    so the search starts on the :data:`L1_CANDIDATES` largest and widens (×4) for the samples
    where λ came out below an excluded ``|w_i|`` (the search over the candidates alone is
    exact exactly when λ is not below any excluded one). Arithmetic in float64; the result is
    rounded towards ``x`` coordinate by coordinate, so it lies in the box exactly and its L1
    distance to ``x`` is at most ε up to float64 rounding. A point already in both is returned
    unchanged.
    """
    import torch

    shape, dtype = x_adv.shape, x_adv.dtype
    x64 = x.detach().flatten(1).double()
    w = x_adv.detach().flatten(1).double() - x64
    a = w.abs()
    room = torch.where(w > 0, 1 - x64, x64).clamp(min=0)
    lam = torch.zeros(len(w), dtype=torch.float64, device=w.device)
    over = torch.minimum(a, room).sum(dim=1) > epsilon
    if bool(over.any()):
        lam[over] = _l1_multiplier(a[over], room[over], float(epsilon), L1_CANDIDATES)
    d = torch.sign(w) * torch.minimum((a - lam.view(-1, 1)).clamp(min=0), room)
    out = (x64 + d).clamp(0.0, 1.0).to(dtype)
    if dtype != torch.float64:  # round towards x where rounding to nearest moved away from it
        away = (out.double() - x64).abs() > d.abs()
        out = torch.where(away, torch.nextafter(out, x.detach().flatten(1).to(dtype)), out)
    return out.view(shape).to(x_adv.device)


#: Coordinates :func:`project_l1_box` first searches λ on (per sample; widened as needed).
L1_CANDIDATES = 256


def _l1_multiplier(a: torch.Tensor, room: torch.Tensor, epsilon: float, k: int
                   ) -> torch.Tensor:
    """λ ``[B]`` with ``Σ_i min(max(a_i − λ, 0), room_i) = ε`` (float64 ``[B, n]`` rows whose
    λ is positive), searched on each row's ``k`` largest ``a_i``, then wider where needed."""
    if k >= a.shape[1]:
        return _l1_root(a, room, epsilon)
    top, idx = a.topk(k + 1, dim=1)
    lam = _l1_root(top[:, :k], room.gather(1, idx[:, :k]), epsilon)
    # an excluded coordinate does not move at any λ at or above its a_i
    wider = lam < top[:, k]
    if bool(wider.any()):
        lam[wider] = _l1_multiplier(a[wider], room[wider], epsilon, 4 * k)
    return lam


def _l1_root(a: torch.Tensor, room: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The root of ``g(λ) = Σ_i min(max(a_i − λ, 0), room_i) = ε`` per row, from g's
    breakpoints sorted once: ``g(λ) = Σ_{p > λ} s_p (p − λ)`` over the points ``a_i`` (sign
    +1, where a coordinate starts to move) and ``a_i − room_i`` (sign −1, where the box stops
    it), so on the segment below the m-th largest point ``g = S_m − λ W_m`` with running sums
    S and W; ε lies on the last segment whose upper end has ``g ≤ ε``. Clamped at 0."""
    import torch

    pts = torch.cat([a, a - room], dim=1)
    signs = torch.cat([torch.ones_like(a), -torch.ones_like(room)], dim=1)
    p, order = pts.sort(dim=1, descending=True)
    s = signs.gather(1, order)
    big_s, big_w = (s * p).cumsum(dim=1), s.cumsum(dim=1)
    at = big_s - p * big_w  # g at each point, non-decreasing along the sort
    m = ((at <= epsilon).sum(dim=1) - 1).clamp(min=0).view(-1, 1)
    root = (big_s.gather(1, m) - epsilon) / big_w.gather(1, m).clamp(min=1)
    return root.view(-1).clamp(min=0)


def l0_keep(delta: torch.Tensor, k: int) -> torch.Tensor:
    """``delta`` ``[B, C, H, W]`` with all but its ``k`` most changed pixels zeroed."""
    import torch

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
