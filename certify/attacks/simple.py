"""Baselines: random search in the ε-ball, and the brute-force spatial grid attack.

Random search is also what the binarization test's R-ASR uses: how often blind sampling with
the same number of queries finds an adversarial point (Zimmermann et al. 2022, §3.1).
The spatial attack tries every rotation × translation on a grid and keeps the model's most
confident mistake among them (Engstrom et al. 2019, used by Brown et al. 2018).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from certify.attacks.base import Attack, AttackResult, Predictor, Uniforms, top_two_margin
from certify.errors import AttackProtocolError, SuiteError
from certify.norms import L2, LINF, SPATIAL, Norm
from certify.norms import norm as norm_named
from certify.params import Param, Params

if TYPE_CHECKING:
    import torch


def random_ball_points(x: torch.Tensor, norm: Norm | str, epsilon: float, u: torch.Tensor,
                       gauss: torch.Tensor | None = None, corner: torch.Tensor | None = None,
                       ) -> torch.Tensor:
    """Points in the ε-ball around ``x``: uniform, or on its boundary (corners for L∞, the
    sphere for L2): :meth:`certify.norms.Norm.ball_points`."""
    return norm_named(norm).ball_points(x, epsilon, u, gauss, corner)


#: Images per model call that :func:`first_success` aims for once few samples are left: each
#: remaining sample sends that many consecutive draws at once (a batch of one planted problem
#: of the binarization test would otherwise cost one model call per draw).
CALL_IMAGES = 64


def first_success(model: Predictor, x: torch.Tensor, y: torch.Tensor, steps: int,
                  candidates: Callable[[int, torch.Tensor], torch.Tensor],
                  call_images: int = CALL_IMAGES) -> tuple[AttackResult, torch.Tensor]:
    """Query ``candidates(step, active)`` for the samples not yet fooled; keep the first hit.

    While ``call_images`` or more samples are unbroken, one call asks one draw of each. With
    fewer, one call asks ``call_images // len(active)`` consecutive steps of each (at most the
    steps left): ``candidates`` is still called step by step, so every sample's draws and its
    first hit are those of one draw per call; the steps after a hit in the same call were
    queried too, and are counted (the model saw them).

    Returns the proposal and, per sample, the step of its first hit (``-1``: none).
    """
    import torch

    b = len(x)
    queries = torch.zeros(b, dtype=torch.long)
    hit_step = torch.full((b,), -1, dtype=torch.long)
    x_adv = x.clone()
    q = 0
    while q < steps:
        active = (hit_step < 0).nonzero().flatten()
        if len(active) == 0:
            break
        k = max(1, min(steps - q, call_images // len(active)))
        cand = torch.cat([candidates(q + j, active) for j in range(k)])
        wrong = (model.predict(cand).argmax(1).cpu().view(k, len(active))
                 != y[active].cpu().view(1, -1))
        queries[active] += k
        hit = wrong.any(0)
        first = wrong.int().argmax(0)[hit]  # each hit sample's first wrong step in the call
        cols = hit.nonzero().flatten()
        x_adv[active[cols]] = cand.view(k, len(active), *x.shape[1:])[first, cols]
        hit_step[active[cols]] = q + first
        q += k
    return AttackResult(x_adv, queries), hit_step


class RandomSearch(Attack):
    """Blind random sampling in the ε-ball (half uniform inside, half on corners / sphere).

    Threat model: L∞ or L2; labels suffice; one query per draw.
    """

    name: ClassVar[str] = "random"
    norms: ClassVar[tuple[Norm, ...]] = (LINF, L2)
    needs_scores: ClassVar[bool] = False
    query_floor: ClassVar[int] = 5000

    def __init__(self, epsilon: float, max_queries: int = 1000, norm: Norm | str = LINF) -> None:
        self._threat(norm, epsilon)
        self.max_queries = max_queries

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        import torch

        rng = Uniforms(seeds)
        shape = tuple(x.shape[1:])

        def candidates(q: int, active: torch.Tensor) -> torch.Tensor:
            u = rng.draw(math.prod(shape), active).view(len(active), *shape)
            gauss = None
            if self.norm.needs_normals:
                gauss = torch.stack([rng.normal(shape, int(i)) for i in active])
            corner = torch.full((len(active),), q % 2 == 1)
            return random_ball_points(x[active], self.norm, self.epsilon, u.to(x), gauss,
                                      corner)

        return first_success(model, x, y, self.max_queries, candidates)[0]


class SpatialGrid(Attack):
    """Every rotation × translation on a grid; the most confident mistake of the grid wins.

    ``max_rotation`` degrees and ``max_translation`` pixels, ``rotation_steps`` and
    ``translation_steps`` grid points per side (Brown et al. 2018 use ±30°, ±3 px).
    Threat model: spatial (no pixel-norm bound); labels suffice. The search is exhaustive: every
    sample is tried at every grid point (``grid_size()`` queries), so ``max_queries`` must cover
    the whole grid; a smaller budget is refused, never a silently cut grid. Of the grid points
    the model gets wrong, the one with the largest top-two margin (its most confident mistake,
    as Brown et al.'s ``SpatialGridAttack`` keeps the highest-loss misclassified transform) is
    the proposal; a labels-only model has no margin, and the weakest wrong point is kept.
    """

    name: ClassVar[str] = "spatial_grid"
    norms: ClassVar[tuple[Norm, ...]] = (SPATIAL,)
    needs_scores: ClassVar[bool] = False
    convergence: ClassVar[str] = "exhaustive"
    suite_params: ClassVar[Params] = Params(
        Param("max_rotation", float, 30.0, "the largest rotation tried, in degrees, either way "
                                           "(Brown et al. 2018: 30)", low=0),
        Param("max_translation", float, 3.0, "the largest shift tried, in pixels, along each "
                                             "axis either way (Brown et al. 2018: 3)", low=0),
        Param("rotation_steps", int, 5, "grid points per side of the rotations (0: none)",
              low=0),
        Param("translation_steps", int, 3, "grid points per side of each axis's shifts (0: "
                                           "none)", low=0),
    )

    def __init__(self, max_rotation: float = 30.0, max_translation: float = 3.0,
                 rotation_steps: int = 5, translation_steps: int = 3,
                 max_queries: int | None = None) -> None:
        if rotation_steps < 0 or translation_steps < 0:
            raise TypeError("rotation_steps and translation_steps must be at least 0")
        self.max_rotation = max_rotation
        self.max_translation = max_translation
        self.rotation_steps = rotation_steps
        self.translation_steps = translation_steps
        self.max_queries = max_queries  # type: ignore[assignment]  # None: the whole grid
        self._threat(SPATIAL, 0.0)

    @classmethod
    def configure(cls, norm: Norm, epsilon: float, max_queries: int,
                  params: dict[str, Any]) -> Attack:
        """No ε: the grid's extent (``params``) is the threat model; the budget must cover it."""
        return cls(**(dict(params) | {"max_queries": max_queries}))

    def grid(self) -> torch.Tensor:
        """Rows of (angle, dx, dy), weakest first, identity excluded."""
        import torch

        def sym(b: float, s: int) -> torch.Tensor:
            pos = torch.linspace(0, b, s + 1)[1:]
            return torch.cat([torch.zeros(1), pos, -pos])

        g = torch.cartesian_prod(sym(self.max_rotation, self.rotation_steps),
                                 sym(self.max_translation, self.translation_steps),
                                 sym(self.max_translation, self.translation_steps))
        g = g[(g != 0).any(dim=1)]
        key = torch.maximum(g[:, 0].abs() / max(self.max_rotation, 1e-9),
                            g[:, 1:].abs().max(dim=1).values / max(self.max_translation, 1e-9))
        return g[torch.argsort(key, stable=True)]

    def grid_size(self) -> int:
        """Grid points, identity excluded: the queries an unbroken sample costs.

        Counted from the extents, without building the grid (a suite's validation imports no
        torch): each axis has ``2 * steps + 1`` values, all 0 when its extent is 0, else one;
        the points whose three values are all 0 are left out. Equal to ``len(grid())``.
        """
        axes = ((self.max_rotation, self.rotation_steps),
                (self.max_translation, self.translation_steps),
                (self.max_translation, self.translation_steps))
        return (math.prod(2 * s + 1 for _, s in axes)
                - math.prod(2 * s + 1 if b == 0 else 1 for b, s in axes))

    def transform(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Rotate then translate each image by its row of (angle, dx, dy)."""
        import kornia

        r = kornia.geometry.transform.rotate(x, rows[:, 0].to(x), padding_mode="border")
        return kornia.geometry.transform.translate(r, rows[:, 1:].to(x), padding_mode="border")

    def run(self, model: Any, x: torch.Tensor, y: torch.Tensor, seeds: torch.Tensor,
            output: str) -> AttackResult:
        import torch

        g = self.grid()
        if self.max_queries is not None and len(g) > self.max_queries:
            raise SuiteError(cut_grid_message(len(g), self.max_queries),
                             hint=f"raise max_queries to {len(g)} or use fewer grid steps")
        b = len(x)
        best = torch.full((b,), float("-inf"))
        rows = torch.zeros(b, g.shape[1])
        x_adv = x.clone()
        yc = y.cpu()
        for q in range(len(g)):
            cand = self.transform(x, g[q].expand(b, -1))
            scores = model.predict(cand).float().cpu()
            conf = top_two_margin(scores, output)
            better = (scores.argmax(1) != yc) & (conf > best)
            if bool(better.any()):
                best[better] = conf[better]
                rows[better] = g[q]
                x_adv[better.to(x_adv.device)] = cand[better.to(cand.device)]
        return AttackResult(x_adv, torch.full((b,), len(g), dtype=torch.long), params=rows)

    def project_proposal(self, proposal: AttackResult, x: torch.Tensor, norm: Norm,
                         epsilon: float) -> torch.Tensor:
        """The proposed grid point applied to each clean image (none: the image itself).

        The candidate images themselves are not trusted: only a rotation and translation on
        the grid is in the threat model.
        """
        import torch

        rows = proposal.params
        if rows is None or tuple(rows.shape) != (len(x), 3):
            raise AttackProtocolError(f"{self.name} proposed no grid point per sample",
                                      hint="report this as a bug")
        out = x.clone()
        grid = self.grid()
        for values in sorted({tuple(r) for r in rows.tolist()}):
            row = torch.tensor(values, dtype=rows.dtype)
            if not bool(row.ne(0).any()):
                continue
            if not bool((grid == row).all(dim=1).any()):
                raise AttackProtocolError(f"{self.name} proposed {row.tolist()}, which is "
                                          "not on its grid", hint="report this as a bug")
            sel = (rows == row).all(dim=1).nonzero().flatten().to(x.device)
            out[sel] = self.transform(x[sel], row.expand(len(sel), -1))
        return out


def cut_grid_message(size: int, budget: int) -> str:
    """Why a spatial grid larger than its query budget is refused."""
    return (f"the spatial grid has {size} points but max_queries is {budget}: the grid would be "
            f"cut to its first {budget} points")
