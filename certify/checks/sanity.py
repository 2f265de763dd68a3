"""Suspect-model sanity checks (Brown et al. 2018, Appendix E; AutoAttack's checks).

``sanity``: before any attack, look for models that defeat fixed attacks instead of being
robust: randomised outputs (the same input gives different scores), saturated or one-hot
outputs (score-based attacks get no signal), and probabilities instead of logits. Each finding
is a warning on the card.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from certify.checks.base import (
    Check,
    CheckContext,
    Measurement,
)
from certify.checks.confidence import top_probability
from certify.data import Dataset
from certify.kinds import SanityKind
from certify.models.base import Model
from certify.params import Param, Params
from certify.rundir import SampleRecord

if TYPE_CHECKING:
    import torch

#: Interpolation points on each path from a sample (to its seeded noise image, to its
#: negative) that look for a label change.
BOUNDARY_GRID = 4
#: Bisection steps that close in on the label change found on that grid (to 1/8192 of the way);
#: the probe uses the point of smallest top-2 margin they visit.
BOUNDARY_STEPS = 10
#: The quantised-score probe (issue 27): this many noise draws around each of at most
#: ``QUANT_SAMPLES`` samples, uniform in an L∞ ball of ``QUANT_EPSILON`` (8/255 / 8).
QUANT_DRAWS = 32
QUANT_SAMPLES = 10
QUANT_EPSILON = 1 / 255
#: Outputs are *quantised* when more than this share of the draws answer bit-identically to the
#: unperturbed input, or when every change seen is a whole multiple of one step.
QUANT_IDENTICAL_SHARE = 0.5
#: The fewest repeats a randomness probe may use: with 3, a model that randomises one answer in
#: five goes unseen half the time (0.8^3); with 10, about one time in ten (0.8^10).
MIN_REPEATS = 10


def top2_margin(scores: torch.Tensor, output: str) -> torch.Tensor:
    """``[N]`` top-1 minus top-2 probability (softmax of logits): small near a boundary."""
    import torch

    p = torch.softmax(scores.float(), dim=1) if output == "logits" else scores.float()
    if p.shape[1] < 2:
        return torch.ones(p.shape[0])
    top = p.topk(2, dim=1).values
    return top[:, 0] - top[:, 1]


def _repeat(model: Model, x: torch.Tensor, repeats: int, tolerance: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query ``x`` ``repeats`` times: (first scores, any output changed, any label changed)."""
    import torch

    outs = [model.predict(x).float().cpu() for _ in range(repeats)]
    stacked = torch.stack(outs)
    spread = stacked.amax(dim=0) - stacked.amin(dim=0)
    scale = outs[0].abs().amax(dim=1).clamp(min=1.0)
    random = (spread.amax(dim=1) / scale) > tolerance
    flips = torch.stack([o.argmax(1) for o in outs]).ne(outs[0].argmax(1)).any(dim=0)
    return outs[0], random, flips


def quantisation_probe(model: Model, x: torch.Tensor, clean: torch.Tensor,
                       seeds: Sequence[int], draws: int = QUANT_DRAWS,
                       epsilon: float = QUANT_EPSILON) -> list[tuple[int, float, bool]]:
    """Per sample of ``x`` (answered ``clean``): ``draws`` seeded noise draws of L∞ size
    ``epsilon``, each queried once. Returns (draws answered bit-identically to ``clean``,
    smallest nonzero output change seen or 0, whether every change seen is a whole multiple of
    that smallest one: the outputs move in steps)."""
    import torch

    out = []
    for k, seed in enumerate(seeds):
        gen = torch.Generator().manual_seed(int(seed) % (2**63))
        noise = (2 * torch.rand((draws, *x.shape[1:]), generator=gen) - 1) * epsilon
        probe = (x[k:k + 1].cpu() + noise).clamp(0, 1).to(x.device, x.dtype)
        diff = (model.predict(probe).float().cpu() - clean[k:k + 1].float().cpu()).abs()
        identical = int((diff.amax(dim=1) == 0).sum())
        moved = diff[diff > 0]
        if not len(moved):
            out.append((identical, 0.0, True))
            continue
        step = float(moved.min())
        ratio = moved / step
        out.append((identical, step, _whole_multiples(ratio)))
    return out


def _whole_multiples(ratio: torch.Tensor) -> bool:
    """Whether every ratio is within 0.001 of a whole number, at most 10,000 (beyond that any
    set of continuous changes would pass as steps of its smallest one)."""
    return bool((ratio <= 1e4).all() and ((ratio - ratio.round()).abs() <= 1e-3).all())


class SanityRecord(SampleRecord, total=False):
    """A sanity record: what repeating the sample's query showed (and near its boundary), and
    on the probed samples what small noise did to the outputs (``quant_*``)."""

    random: bool
    label_flips: bool
    confidence: float
    output: str
    saturated: bool
    one_hot: bool
    random_near_boundary: bool
    label_flips_near_boundary: bool
    boundary_margin: float
    quant_identical: int
    quant_step: float
    quant_stepped: bool


class Sanity(SanityKind, Check[SanityRecord]):
    """Suspect-model checks before any attack: randomness, saturation, probabilities.

    Randomness is probed twice per sample, each with ``repeats`` queries of one input: on the
    sample itself, and on a near-boundary input, where a model that randomises only when it
    is unsure (a small top-2 margin) shows it. The near-boundary input lies on a straight path
    from the sample, to a noise image seeded by the sample or else to the sample's negative:
    ``BOUNDARY_GRID`` points along each find where the label first changes and
    ``BOUNDARY_STEPS`` bisection steps close in on it, probing the point of smallest top-2
    margin visited (where the label never changes, the grid point of smallest margin).

    Parameters: ``repeats`` (queries of the same input; at least 10, default 10),
    ``saturation_threshold`` (a top probability at or above it counts as saturated; 0.999),
    ``saturated_share`` (warn when more samples than this are saturated; 0.5), ``tolerance``
    (output change counted as random), ``near_boundary`` (also probe near-boundary inputs;
    true). Queries per sample: ``2 * repeats + 2 * BOUNDARY_GRID`` plus up to
    ``BOUNDARY_STEPS``.

    **Quantised scores** (issue 27): around at most ``QUANT_SAMPLES`` samples,
    ``QUANT_DRAWS`` draws of small uniform noise (:func:`quantisation_probe`). When most draws
    answer bit-identically, or every change is a whole multiple of one step, the outputs are
    quantised (rounded scores, as many inference APIs return): score-based attacks then get
    little signal, and no score-based attack row may PASS on its own (the runner applies it).
    """


    suite_params: ClassVar[Params] = Params(
        Param("repeats", int, MIN_REPEATS,
              "queries of one input, on the sample and on its near-boundary input; fewer "
              f"than {MIN_REPEATS} miss models that randomise only sometimes",
              low=MIN_REPEATS),
        Param("saturation_threshold", float, 0.999,
              "a top-class probability at or above it counts as saturated"),
        Param("saturated_share", float, 0.5,
              "warn when more than this share of the samples is saturated"),
        Param("tolerance", float, 1e-5,
              "the largest change between repeated answers (relative to the scores' scale) "
              "that still counts as the same answer; a larger one is random"),
        Param("near_boundary", bool, True,
              "also probe each sample's near-boundary input (on the straight path to a noise "
              "image or to the sample's negative, where the label first changes), where a "
              "model that randomises only when unsure shows it"),
    )

    def __init__(self, repeats: int = MIN_REPEATS, saturation_threshold: float = 0.999,
                 saturated_share: float = 0.5, tolerance: float = 1e-5,
                 near_boundary: bool = True) -> None:
        self.repeats = repeats
        self.saturation_threshold = saturation_threshold
        self.saturated_share = saturated_share
        self.tolerance = tolerance
        self.near_boundary = near_boundary

    def _boundary(self, model: Model, x: torch.Tensor, label: torch.Tensor,
                  index: Sequence[int], ctx: CheckContext
                  ) -> tuple[torch.Tensor, list[int]]:
        """Near-boundary inputs ``[N, C, H, W]`` and the queries each cost to find."""
        import torch

        n = x.shape[0]
        noise = torch.stack([
            torch.rand(tuple(x.shape[1:]), generator=torch.Generator().manual_seed(
                ctx.seed(i, 1) % (2**63))) for i in index]).to(x.device, x.dtype)
        # paths from the sample: to its seeded noise image, and to its negative
        targets = torch.stack([noise, 1 - x])  # [P, N, C, H, W]
        paths = targets.shape[0]
        alphas = torch.arange(1, BOUNDARY_GRID + 1, dtype=torch.float64) / BOUNDARY_GRID

        def blend(a: torch.Tensor, rows: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
            w = a.to(x.dtype).to(x.device).view(-1, *([1] * (x.dim() - 1)))
            return (1 - w) * x[rows] + w * targets[path.to(x.device), rows.to(x.device)]

        rows = torch.arange(n)
        # grid point g = (path, alpha) in path order, so the first change is on the first path
        g_path = torch.arange(paths).repeat_interleave(BOUNDARY_GRID)
        g_alpha = alphas.repeat(paths)
        grid = torch.cat([blend(a.repeat(n), rows, p.repeat(n))
                          for p, a in zip(g_path, g_alpha, strict=True)])
        scores = model.predict(grid).float().cpu()
        steps = len(g_alpha)
        labels = scores.argmax(1).view(steps, n)
        margins = top2_margin(scores, model.info.output).view(steps, n)
        queries = [steps] * n
        changed = labels.ne(label.view(1, n))
        crossed = changed.any(dim=0)
        first = changed.to(torch.int64).argmax(dim=0)  # the first grid point past a change
        nearest = margins.argmin(dim=0)
        alpha, path = g_alpha[nearest], g_path[nearest]
        sub = crossed.nonzero().flatten()
        if len(sub):
            f = first[sub]
            path_s = g_path[f]
            hi_s = g_alpha[f]
            lo_s = hi_s - 1 / BOUNDARY_GRID  # the grid point before it on the same path
            # the point of smallest margin seen so far: the grid point past the change
            best, best_margin = hi_s.clone(), margins[f, sub]
            for _ in range(BOUNDARY_STEPS):
                mid = (lo_s + hi_s) / 2
                scores = model.predict(blend(mid, sub, path_s)).float().cpu()
                moved = scores.argmax(1).ne(label[sub])
                hi_s = torch.where(moved, mid, hi_s)
                lo_s = torch.where(moved, lo_s, mid)
                margin = top2_margin(scores, model.info.output)
                closer = margin < best_margin
                best = torch.where(closer, mid, best)
                best_margin = torch.where(closer, margin, best_margin)
            alpha[sub], path[sub] = best, path_s
            for j in sub.tolist():
                queries[j] += BOUNDARY_STEPS
        return blend(alpha, rows, path), queries

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[SanityRecord]:
        import torch

        first, random, flips = _repeat(model, x, self.repeats, self.tolerance)
        conf = top_probability(first, model.info.output)
        p = torch.softmax(first, 1) if model.info.output == "logits" else first
        one_hot = (p.max(dim=1).values >= 1 - 1e-6) & (p.sum(dim=1) - 1).abs().lt(1e-4)
        rows: list[SanityRecord] = [
            {"random": bool(r), "label_flips": bool(f), "confidence": float(c),
                 "output": model.info.output,
                 "saturated": bool(c >= self.saturation_threshold), "one_hot": bool(o),
                 "queries": self.repeats}
                for r, f, c, o in zip(random.tolist(), flips.tolist(), conf.tolist(),
                                      one_hot.tolist(), strict=True)]
        probed = self._probe_positions(ctx)
        at = [j for j, i in enumerate(index) if int(i) in probed]
        if at and model.info.output != "labels":
            found = quantisation_probe(model, x[at], first[at],
                                       [ctx.seed(int(index[j]), 2) for j in at])
            for j, (identical, step, stepped) in zip(at, found, strict=True):
                rows[j].update({"quant_identical": identical, "quant_step": step,
                                "quant_stepped": stepped,
                                "queries": rows[j]["queries"] + QUANT_DRAWS})
        if not self.near_boundary:
            return rows
        near, queries = self._boundary(model, x, first.argmax(1), index, ctx)
        b_first, b_random, b_flips = _repeat(model, near, self.repeats, self.tolerance)
        margin = top2_margin(b_first, model.info.output)
        for r, q, br, bf, m in zip(rows, queries, b_random.tolist(), b_flips.tolist(),
                                   margin.tolist(), strict=True):
            r.update({"random_near_boundary": bool(br), "label_flips_near_boundary": bool(bf),
                      "boundary_margin": float(m), "queries": r["queries"] + q + self.repeats})
        return rows

    @staticmethod
    def _probe_positions(ctx: CheckContext) -> set[int]:
        """The dataset indices the quantised-score probe uses: at most ``QUANT_SAMPLES`` of
        the check's own, evenly spread over its ordered selection."""
        sel = ctx.selected
        if not sel:
            return set()
        n, m = len(sel), min(QUANT_SAMPLES, len(sel))
        return {int(sel[(k * n) // m]) for k in range(m)}

    def outcome_bits(self, records: list[SanityRecord]) -> dict[str, list[bool]]:
        """Per sample: randomised (anywhere), randomised near the boundary, saturated."""
        bits = {"random": [_randomised(r) for r in records],
                "saturated": [bool(r["saturated"]) for r in records]}
        if records and "random_near_boundary" in records[0]:
            bits["random_near_boundary"] = [bool(r["random_near_boundary"]) for r in records]
        return bits

    def summarize(self, records: list[SanityRecord], data: Dataset) -> Measurement:
        import torch

        n = len(records) or 1
        rnd = sum(_randomised(r) for r in records) / n
        probed = bool(records) and "random_near_boundary" in records[0]
        b_rnd = sum(bool(r.get("random_near_boundary")) for r in records) / n
        only_near = sum(bool(r.get("random_near_boundary")) and not r["random"]
                        for r in records)
        flips = sum(bool(r["label_flips"] or r.get("label_flips_near_boundary"))
                    for r in records) / n
        sat = sum(r["saturated"] for r in records) / n
        hot = sum(r["one_hot"] for r in records) / n
        output = records[0]["output"] if records else ""
        warnings = []
        if rnd > 0:
            near = (f"; {only_near} of them only near the decision boundary, where the model "
                    "is unsure" if only_near else "")
            warnings.append(
                f"randomised model: the same input gave different outputs for {rnd:.0%} of the "
                f"samples ({flips:.0%} changed label){near}; fixed attacks can be defeated by "
                "randomness, so robust accuracies on this card may be inflated and no attack "
                "can PASS (Brown et al. 2018, Appendix E)")
        # with logits, attacks read the logits, so a saturated softmax costs them nothing
        if output != "logits" and (sat > self.saturated_share or hot > self.saturated_share):
            warnings.append(
                f"saturated outputs: {max(sat, hot):.0%} of the samples get a top probability "
                f"of at least {self.saturation_threshold} ({hot:.0%} exactly one-hot); "
                "score-based attacks get little or no signal from such outputs")
        if output == "probs":
            warnings.append(
                "the model returns probabilities, not logits: score-based attacks work on "
                "log-probabilities, which lose precision when probabilities saturate "
                "(AutoAttack's check)")
        quant = [r for r in records if "quant_identical" in r]
        identical = sum(int(r["quant_identical"]) for r in quant)
        draws = QUANT_DRAWS * len(quant)
        steps = [float(r["quant_step"]) for r in quant if float(r["quant_step"]) > 0]
        stepped = bool(steps) and all(bool(r["quant_stepped"]) for r in quant) and \
            _whole_multiples(torch.tensor(steps) / min(steps))
        quantised = bool(quant) and (identical > QUANT_IDENTICAL_SHARE * draws or stepped)
        if quantised:
            how = (f"{identical} of {draws} draws answered bit-identically"
                   if identical > QUANT_IDENTICAL_SHARE * draws else
                   f"every change was a whole multiple of {min(steps):.3g}")
            warnings.append(
                f"quantised scores: small random noise (L∞ {QUANT_EPSILON:.3g}, {QUANT_DRAWS} "
                f"draws around each of {len(quant)} samples) moved the outputs in steps or "
                f"not at all ({how}); score-based attacks get little signal from such outputs, "
                "so none of them may PASS on its own")
        margins = sorted(float(r["boundary_margin"]) for r in records if "boundary_margin" in r)
        metrics = {"nondeterministic_share": rnd, "label_flip_share": flips,
                   "saturated_share": sat, "one_hot_share": hot, "n": len(records)}
        if probed:
            metrics["boundary_nondeterministic_share"] = b_rnd
        if margins:
            metrics["boundary_margin_median"] = margins[len(margins) // 2]
        if quant:
            metrics["quantised"] = float(quantised)
            metrics["quantisation_identical_share"] = identical / draws
        return Measurement(
            metrics=metrics,
            details={"repeats": self.repeats, "output": output, "near_boundary": probed,
                     "boundary_grid": 2 * BOUNDARY_GRID, "boundary_steps": BOUNDARY_STEPS,
                     "quantisation": {"samples": len(quant), "draws": QUANT_DRAWS,
                                      "epsilon": QUANT_EPSILON, "identical": identical,
                                      "smallest_step": min(steps) if steps else None,
                                      "quantised": quantised} if quant else None},
            warnings=warnings,
        )


def _randomised(record: SanityRecord) -> bool:
    """Whether a sanity record saw different outputs for the same input, anywhere."""
    return bool(record["random"] or record.get("random_near_boundary"))
