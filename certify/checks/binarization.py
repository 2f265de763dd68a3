"""The binarization test (Zimmermann et al. 2022, Algorithm 1): is the attack strong enough?

For a test image x_c the test builds a binary classifier h = g ∘ f* from the model's own
feature extractor f* and a new linear readout g, trained to separate N_i points inside the
(1 - gap)·ε ball (x_c included) from N_b points on the ε boundary (corners for L∞, the sphere
for L2). If g separates them perfectly, every boundary point is an ε-bounded adversarial
example of h at x_c, so a sound attack must find one. The test score is the attack's success
rate on such planted problems; the R-ASR is how often random sampling in the ball with the same
number of queries succeeds (how hard the test is).

Features: the ONNX model's penultimate tensor when the graph has one; otherwise the model's
output vector (log-probabilities for probability outputs), which the card reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from certify.attacks import Attack, RandomSearch, project
from certify.attacks.base import Uniforms
from certify.attacks.simple import random_ball_points


@dataclass(frozen=True)
class BinarizationSettings:
    """Hardness knobs (defaults of the reference implementation: N_i 999, N_b 1, gap 0.05)."""

    n_inner: int = 999
    n_boundary: int = 1
    inner_gap: float = 0.05
    closeness: float = 0.5  # where the decision threshold sits between inner and boundary


class BinarizedModel:
    """h(x) = g(f*(x)): two classes, 0 = like x_c (inner), 1 = planted adversarial side.

    Scores mimic the original model's output kind and logit range (the paper's footnote 3).
    """

    def __init__(self, model: Any, feature_fn: Any, w: torch.Tensor, threshold: float,
                 scale: float, output: str, one_hot: bool = False) -> None:
        self.model = model
        self.feature_fn = feature_fn
        self.w = w
        self.threshold = threshold
        self.scale = scale
        self.output = output
        self.one_hot = one_hot

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """The readout's raw score ``w · f*(x)`` (class 1 when above the threshold)."""
        return self.feature_fn(x).float().cpu() @ self.w

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Two-class scores in the original model's convention."""
        z = self.scale * (self.score(x) - self.threshold)
        logits = torch.stack([torch.zeros_like(z), z], dim=1)
        if self.output == "probs":
            return torch.softmax(logits, dim=1)
        if self.output == "labels" or self.one_hot:
            return torch.nn.functional.one_hot((z > 0).long(), 2).float()
        return logits


def _readout(f_in: torch.Tensor, f_b: torch.Tensor) -> torch.Tensor | None:
    """A linear direction that puts every boundary feature above every inner one, or None.

    Logistic regression on the raw features, as in the reference implementation, with one
    common scale for conditioning. Not per-feature standardisation: a ReLU unit that is zero
    on every inner point would get a weight of ~1e6, and the readout would become a needle
    (one dead unit firing) whose flat score gives a score-based attack nothing to follow.
    """
    mu = f_in.mean(dim=0)
    sd = f_in.std(dim=0).mean().clamp(min=1e-6)
    a, b = (f_in - mu) / sd, (f_b - mu) / sd
    x = torch.cat([a, b]).double()
    t = torch.cat([torch.zeros(len(a)), torch.ones(len(b))]).double()
    weight = torch.where(t > 0, len(a) / max(len(b), 1), 1.0).double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    c = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, c], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        z = x @ w + c
        loss = (weight * torch.nn.functional.binary_cross_entropy_with_logits(
            z, t, reduction="none")).mean() + 1e-4 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        direction = (w / sd.double()).float()
        s_in, s_b = f_in @ direction, f_b @ direction
        if float(s_b.min()) > float(s_in.max()):
            return direction
    return None


def binarization_test(
    counter: Any,
    x_c: torch.Tensor,
    attack: Attack,
    norm: str,
    epsilon: float,
    seed: int,
    settings: BinarizationSettings,
    output: str,
    original_margin: float,
    one_hot: bool = False,
) -> dict[str, Any]:
    """Run the test for one image ``x_c`` ``[C, H, W]``; returns the per-sample record fields.

    Every query (features included) goes through ``counter``.
    """
    if counter.has_features():
        feature_fn, source = counter.features, "penultimate"
    elif output == "labels":
        return {"bt": "setup_failed", "bt_reason": "labels-only model exposes no features",
                "bt_features": "none", "bt_queries": 0, "bt_rasr": None}
    else:
        def feature_fn(x: torch.Tensor) -> torch.Tensor:
            s = counter.predict(x)
            return torch.log(s.clamp(min=1e-12)) if output == "probs" else s
        source = "output"
    before = counter.queries
    rng = Uniforms(torch.tensor([seed]))
    shape = tuple(x_c.shape)
    n_i, n_b = settings.n_inner, settings.n_boundary
    x0 = x_c.unsqueeze(0)
    u = rng.draw(math.prod(shape) * (n_i + n_b), [0]).view(n_i + n_b, *shape)
    gauss = None
    if norm == "l2":
        gauss = torch.stack([rng.normal(shape, 0) for _ in range(n_i + n_b)])
    inner = random_ball_points(x0.expand(n_i, *shape), norm, (1 - settings.inner_gap) * epsilon,
                               u[:n_i].to(x_c), None if gauss is None else gauss[:n_i])
    boundary = random_ball_points(x0.expand(n_b, *shape), norm, epsilon, u[n_i:].to(x_c),
                                  None if gauss is None else gauss[n_i:],
                                  corner=torch.ones(n_b, dtype=torch.bool))
    pts = torch.cat([x0, inner, boundary])
    feats = torch.cat([feature_fn(pts[i:i + 512]).float().cpu()
                       for i in range(0, len(pts), 512)])
    direction = _readout(feats[: n_i + 1], feats[n_i + 1:])
    if direction is None:
        return {"bt": "setup_failed", "bt_reason": "readout could not separate inner and "
                "boundary points", "bt_features": source,
                "bt_queries": counter.queries - before, "bt_rasr": None}
    s_in, s_b = feats[: n_i + 1] @ direction, feats[n_i + 1:] @ direction
    threshold = float(s_in.max() + settings.closeness * (s_b.min() - s_in.max()))
    s_c = float(s_in[0])
    scale = max(abs(original_margin), 1e-3) / max(threshold - s_c, 1e-12)
    h = BinarizedModel(counter, feature_fn, direction, threshold, scale, output, one_hot)
    y0 = torch.zeros(1, dtype=torch.long, device=x_c.device)
    res = attack.run(h, x0, y0, torch.tensor([seed + 1]), output)
    adv = project(res.x_adv, x0, norm, epsilon)
    success = bool(h.predict(adv).argmax(1)[0] != 0)
    used = max(int(res.queries[0]), 1)
    rnd = RandomSearch(epsilon=epsilon, max_queries=used, norm=norm)
    r = rnd.run(h, x0, y0, torch.tensor([seed + 2]), output)
    r_adv = project(r.x_adv, x0, norm, epsilon)
    rasr = bool(h.predict(r_adv).argmax(1)[0] != 0)
    return {"bt": "success" if success else "failure", "bt_features": source,
            "bt_attack_queries": used, "bt_queries": counter.queries - before, "bt_rasr": rasr}
