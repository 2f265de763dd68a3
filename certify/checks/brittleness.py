"""Black-box brittle score from LIME explanations (Vora et al. 2023).

For each sample: superpixels from scikit-image's SLIC (LIME's default quickshift gives only 1-4
superpixels on a 32x32 sign, which makes the score meaningless); ``k`` random on/off masks over
them (the first keeps every superpixel), hidden superpixels filled with their mean colour as
LIME does; the exponential kernel ``sqrt(exp(-d^2 / width^2))`` on the cosine distance of each
mask to the all-on mask; and a weighted ridge regression (alpha 1, with intercept, as LIME's
default regressor) of the model's probability for its own top class on the masks. Its weights
``w`` (one per superpixel, dimension ``d``) give **brittle score = (1/n) Σ ‖w‖₁ / d** (Eq. 2).
Needs no labels and no gradients: only ``predict``. With a reference model the check also
reports the relative improvement R.I. = (ref − model) / ref (Eq. 3), computed on the same
superpixels and masks: positive when this model's score is lower than the reference's.

Uncertainty: a percentile bootstrap over samples gives the score's 95% interval, and a paired
bootstrap (the same resampled samples for model and reference, whose masks are shared) gives
R.I.'s. Stability: every sample is also scored on a regular grid of square cells (about
``n_segments`` of them, the same number of masks); when SLIC and the grid rank model and
reference differently, or R.I.'s interval contains 0, no difference is resolved.

The score is only comparable between models on the same data and the same segmentation.

Speed: the masked images of several samples (both segmentations) are built with one ``where``
over a mask matrix and sent to the model in chunks of ``_CHUNK`` images across samples, the
next chunk being built while the model runs on the current one; one ridge solve per sample and
segmentation serves model and reference (the design matrix and kernel are shared). A sample's
masks come from its own seed, so its result does not depend on the batching.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from skimage.segmentation import slic
from threadpoolctl import threadpool_limits

from certify.canonical import JSONLike
from certify.checks.base import (
    Check,
    CheckContext,
    ExportMetric,
    Measurement,
    Metric,
    ResultView,
)
from certify.data import Dataset
from certify.errors import SuiteError
from certify.images import ImageSink
from certify.models.base import Model, ModelInfo
from certify.perturbations.base import mix_seed
from certify.rundir import SampleRecord

#: Masked images built per hand-off to the models (across samples); each model call is then
#: split into onnxruntime calls of ``certify.models.onnx.CPU_CHUNK`` images on the CPU, which
#: is where smaller batches run faster. Building 2,048 at a time rather than 256 was 10-18%
#: faster with two models (the check: model and reference) and with one (benchmarks/RESULTS.md).
#: Bounds memory (~12 KB per 3x32x32 image).
_CHUNK = 2048
#: Bootstrap resamples for the intervals.
BOOTSTRAP = 2000
#: Stream of the grid segmentation's masks (``ctx.seed(i, _GRID_STREAM)``) and the bootstrap's.
_GRID_STREAM = 1
_BOOT_STREAM = 0xB007


def segment(img: torch.Tensor, n_segments: int, compactness: float) -> np.ndarray:
    """SLIC superpixels of a ``[C, H, W]`` image: int labels ``[H, W]`` numbered 0..d-1."""
    arr = img.detach().cpu().permute(1, 2, 0).numpy().astype(np.float64)
    channel_axis = -1 if arr.shape[2] == 3 else None
    seg = slic(arr if channel_axis is not None else arr[..., 0], n_segments=n_segments,
               compactness=compactness, sigma=0, start_label=0, channel_axis=channel_axis)
    _, seg = np.unique(seg, return_inverse=True)
    return seg.reshape(arr.shape[:2])


def grid_segment(height: int, width: int, n_segments: int) -> np.ndarray:
    """A regular grid of square cells (side ``round(sqrt(H*W / n_segments))``), labels
    ``[H, W]`` numbered 0..d-1 row by row; cells at the right and bottom edges may be cut."""
    side = max(1, int(round(float(np.sqrt(height * width / n_segments)))))
    rows = np.arange(height) // side
    cols = np.arange(width) // side
    return rows[:, None] * (int(cols.max()) + 1) + cols[None, :]


def lime_kernel(distances: np.ndarray, width: float) -> np.ndarray:
    """LIME's default kernel: ``sqrt(exp(-d^2 / width^2))``."""
    return np.sqrt(np.exp(-(distances ** 2) / width ** 2))


def cosine_to_all_on(masks: np.ndarray) -> np.ndarray:
    """Cosine distance of each binary mask row to the all-ones row."""
    ones = np.ones(masks.shape[1])
    dots = masks @ ones
    norms = np.linalg.norm(masks, axis=1) * np.linalg.norm(ones)
    with np.errstate(invalid="ignore", divide="ignore"):
        sim = np.where(norms > 0, dots / norms, 0.0)
    return 1.0 - sim


def weighted_ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, alpha: float = 1.0
                   ) -> tuple[np.ndarray, Any]:
    """Ridge regression with sample weights and an unpenalised intercept (as scikit-learn).

    ``y`` is ``[k]`` or ``[k, m]`` (``m`` targets fitted at once on the same design); the
    coefficients are ``[d]`` or ``[d, m]`` and the intercept a float or ``[m]``.
    """
    sw = w / w.sum()
    xm = sw @ x
    ym = sw @ y
    xc, yc = x - xm, y - ym
    a = xc.T @ (xc * w[:, None]) + alpha * np.eye(x.shape[1])
    rhs = xc.T @ (w * yc if y.ndim == 1 else w[:, None] * yc)
    coef = np.linalg.solve(a, rhs)
    return coef, ym - xm @ coef


def _one_blas_thread() -> Any:
    """BLAS on one thread for the small ridge solves: a ``[1000, 64]`` fit takes under 1 ms on
    one thread, and 5-20 ms when a multi-threaded BLAS wakes threads on a busy machine."""
    return threadpool_limits(limits=1, user_api="blas")


def _probabilities(scores: torch.Tensor, output: str) -> torch.Tensor:
    if output == "logits":
        return torch.softmax(scores.float(), dim=1)
    return scores.float()


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of bootstrap replicates (finite ones)."""
    v = values[np.isfinite(values)]
    if not len(v):
        return (float("nan"), float("nan"))
    lo, hi = np.percentile(v, [2.5, 97.5])
    return (float(lo), float(hi))


def relative_improvement(model: Any, reference: Any) -> Any:
    """R.I. = (reference − model) / reference (Eq. 3); elementwise on arrays, 0 where the
    reference score is 0."""
    m, r = np.asarray(model, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(r > 0, (r - m) / np.where(r > 0, r, 1.0), 0.0)
    return float(out) if out.ndim == 0 else out


def direction_words(ri: float, interval: tuple[float, float] | None, grid_ri: float | None
                    ) -> tuple[bool, str]:
    """Whether R.I. is a resolved difference, and the sentence the card shows.

    Resolved only when R.I.'s 95% interval excludes 0 and the grid segmentation ranks the two
    models the same way as SLIC (``grid_ri`` of the same sign, when given).
    """
    if interval is None or not all(np.isfinite(interval)) or interval[0] <= 0 <= interval[1]:
        return False, ("no difference resolved: R.I.'s 95% interval contains 0")
    if grid_ri is not None and np.sign(grid_ri) != np.sign(ri):
        return False, ("no difference resolved: the grid segmentation ranks the two models "
                       "the other way round")
    pct = abs(100 * ri)
    if ri > 0:
        return True, (f"{pct:.0f}% lower than the reference (less brittle, i.e. more robust "
                      "by this score)")
    return True, (f"{pct:.0f}% higher than the reference (more brittle, i.e. less robust by "
                  "this score)")


def _heatmap(img: torch.Tensor, seg: np.ndarray, weights: list[float], vmax: float
             ) -> np.ndarray:
    """The image with each superpixel tinted by its weight (red up, blue down), upscaled to
    64x64 (nearest neighbour), as ``[H, W, 3]`` floats in [0, 1]."""
    base = img.detach().cpu().permute(1, 2, 0).numpy()
    gray = base.mean(axis=2, keepdims=True).repeat(3, axis=2) * 0.5 + 0.25
    wmap = np.asarray(weights)[seg] / max(vmax, 1e-12)
    tint = np.zeros_like(gray)
    tint[..., 0] = np.clip(wmap, 0, 1)
    tint[..., 2] = np.clip(-wmap, 0, 1)
    out = np.clip(gray * (1 - np.abs(wmap)[..., None] * 0.8) + tint * 0.8, 0, 1)
    rows = (np.arange(64) * out.shape[0]) // 64
    cols = (np.arange(64) * out.shape[1]) // 64
    picked: np.ndarray = out[rows][:, cols]
    return picked


@dataclass
class _Job:
    """One sample under one segmentation: its masks, and the fill of its hidden cells."""

    img: torch.Tensor  # [C, H, W]
    seg: np.ndarray  # [H, W] labels 0..d-1
    masks: np.ndarray  # [k, d] float 0/1, row 0 all ones

    def __post_init__(self) -> None:
        segt = torch.from_numpy(self.seg).long().to(self.img.device).flatten()
        d = self.masks.shape[1]
        flat = self.img.flatten(1)  # [C, HW]
        sums = torch.zeros(flat.shape[0], d, device=flat.device,
                           dtype=flat.dtype).index_add_(1, segt, flat)
        counts = torch.bincount(segt, minlength=d).clamp(min=1)
        self._flat = flat
        self._fill = (sums / counts)[:, segt]  # [C, HW] mean colour of each pixel's cell
        self._segt = segt
        self._keep = torch.from_numpy(self.masks > 0.5).to(flat.device)  # [k, d] bool

    def images(self, start: int, stop: int) -> torch.Tensor:
        """Masked images ``start:stop`` as ``[n, C, H, W]``: one gather and one ``where``."""
        keep = self._keep[start:stop][:, self._segt].unsqueeze(1)  # [n, 1, HW]
        out = torch.where(keep, self._flat.unsqueeze(0), self._fill.unsqueeze(0))
        return out.view(-1, *self.img.shape)


def _chunks(jobs: list[_Job], chunk: int) -> Iterator[list[tuple[int, int, int]]]:
    """Pieces ``(job, start, stop)`` grouped into model calls of at most ``chunk`` images."""
    piece: list[tuple[int, int, int]] = []
    room = chunk
    for j, job in enumerate(jobs):
        start, k = 0, len(job.masks)
        while start < k:
            stop = min(k, start + room)
            piece.append((j, start, stop))
            room -= stop - start
            start = stop
            if room == 0:
                yield piece
                piece, room = [], chunk
    if piece:
        yield piece


def _build(jobs: list[_Job], piece: list[tuple[int, int, int]]) -> torch.Tensor:
    return torch.cat([jobs[j].images(a, b) for j, a, b in piece])


def predict_jobs(models: Sequence[Model], jobs: list[_Job], chunk: int = _CHUNK
                 ) -> list[list[np.ndarray]]:
    """Each model's class probabilities ``[k, classes]`` (float64) on each job's masked images.

    Masked images go to the models in calls of at most ``chunk`` images that span jobs; the
    next call's images are built in a worker thread while the models run.
    """
    out: list[list[list[np.ndarray]]] = [[[] for _ in jobs] for _ in models]
    pieces = list(_chunks(jobs, chunk))
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_build, jobs, pieces[0]) if pieces else None
        for n, piece in enumerate(pieces):
            assert pending is not None
            imgs = pending.result()
            pending = pool.submit(_build, jobs, pieces[n + 1]) if n + 1 < len(pieces) else None
            for mi, model in enumerate(models):
                probs = _probabilities(model.predict(imgs), model.info.output)
                probs_np = probs.cpu().numpy().astype(np.float64)
                at = 0
                for j, a, b in piece:
                    out[mi][j].append(probs_np[at:at + b - a])
                    at += b - a
    return [[np.concatenate(parts) for parts in per_model] for per_model in out]


class BrittlenessRecord(SampleRecord, total=False):
    """A brittleness record: LIME weights and their L1 norm per superpixel, per segmentation
    (SLIC, and the grid's ``grid_``), of the model and of the reference (``ref_``)."""

    d: int
    top: int
    l1_per_dim: float
    grid_d: int
    grid_l1_per_dim: float
    weights: list[float]
    check_seed: int
    ref_top: int
    ref_l1_per_dim: float
    ref_grid_l1_per_dim: float
    ref_weights: list[float]


#: The per-sample values a brittleness record keeps for paired comparisons.
_VALUE_KEYS: tuple[Literal["l1_per_dim", "ref_l1_per_dim", "grid_l1_per_dim",
                           "ref_grid_l1_per_dim"], ...] = (
    "l1_per_dim", "ref_l1_per_dim", "grid_l1_per_dim", "ref_grid_l1_per_dim")


class Brittleness(Check[BrittlenessRecord]):
    """Brittle score (Eq. 2) of the model, and R.I. (Eq. 3) against a reference model.

    Parameters: ``num_masks`` (k, LIME's ``num_samples``), ``n_segments`` and ``compactness``
    (SLIC settings; the grid has about ``n_segments`` square cells), ``kernel_width`` (LIME's
    0.25), ``alpha`` (ridge, LIME's 1.0), ``max_heatmaps`` (samples shown on the card). Threat
    model: none; ``2 * num_masks`` queries per sample and model (SLIC and grid).
    """

    kind: ClassVar[str] = "brittleness"
    family: ClassVar[str] = "Black-box brittle score (LIME)"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("brittle_score", "mean L1 norm of LIME weights per superpixel (Vora et al. "
               "2023, Eq. 2), SLIC superpixels", "lower", unit="score", threshold=True),
        Metric("relative_improvement", "R.I. = (reference - model) / reference (Eq. 3), SLIC; "
               "positive: this model scores lower", "higher", unit="score", threshold=True,
               optional=True),
        Metric("reference_brittle_score", "the reference model's brittle score", "lower",
               unit="score", optional=True),
        Metric("brittle_score_grid", "brittle score on a regular grid of square cells",
               "lower", unit="score"),
        Metric("relative_improvement_grid", "R.I. on the grid segmentation", "higher",
               unit="score", optional=True),
        Metric("reference_brittle_score_grid", "the reference model's grid brittle score",
               "lower", unit="score", optional=True),
        Metric("n", "samples explained", unit="count"),
        Metric("superpixels_mean", "mean superpixels per sample", unit="score"),
    )
    compare_values = {"brittle_score": "l1_per_dim", "brittle_score_grid": "grid_l1_per_dim"}
    export: ClassVar[ExportMetric | None] = ExportMetric("brittle_score", "brittle_score",
                                                         "Brittle score (LIME)")
    #: LIME spends 2 * num_masks queries per sample and model: record in small units.
    record_batch: ClassVar[int | None] = 8

    def __init__(self, num_masks: int = 1000, n_segments: int = 64, compactness: float = 20.0,
                 kernel_width: float = 0.25, alpha: float = 1.0, max_heatmaps: int = 4) -> None:
        self.num_masks = num_masks
        self.n_segments = n_segments
        self.compactness = compactness
        self.kernel_width = kernel_width
        self.alpha = alpha
        self.max_heatmaps = max_heatmaps

    def check_params(self, where: str) -> None:
        """Validate the parameters when the suite loads."""
        if not isinstance(self.num_masks, int) or self.num_masks < 10:
            raise SuiteError(f"{where}: num_masks must be an integer >= 10", hint="e.g. 1000")
        if not isinstance(self.n_segments, int) or self.n_segments < 2:
            raise SuiteError(f"{where}: n_segments must be an integer >= 2", hint="e.g. 64")
        for name in ("compactness", "kernel_width", "alpha"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise SuiteError(f"{where}: {name} must be a positive number", hint="see docs")

    def produced_metrics(self, reference: bool) -> set[str]:
        """``relative_improvement`` needs a reference model (``--reference``)."""
        return set(self.metric_names) - (set() if reference else {"relative_improvement"})

    def skip_reason(self, info: ModelInfo) -> str | None:
        """Skip a labels-only model: the brittle score is defined on class probabilities."""
        if info.output == "labels":
            return f"brittleness needs scores; {info.name} returns labels only"
        return None

    def masks(self, d: int, seed: int) -> np.ndarray:
        """``num_masks`` random on/off rows over ``d`` superpixels; row 0 keeps everything."""
        g = torch.Generator().manual_seed(seed)
        m = torch.randint(0, 2, (self.num_masks, d), generator=g).numpy().astype(np.float64)
        m[0] = 1.0
        return m

    @staticmethod
    def masked_images(img: torch.Tensor, seg: np.ndarray, masks: np.ndarray) -> torch.Tensor:
        """Images with hidden superpixels filled by their mean colour ``[k, C, H, W]``."""
        return _Job(img, seg, masks).images(0, len(masks))

    def fit(self, masks: np.ndarray, probs: Sequence[np.ndarray], tops: Sequence[int]
            ) -> list[np.ndarray]:
        """LIME weights ``[d]`` for each model's probabilities ``[k, classes]`` of its class
        ``tops[i]``: one weighted ridge solve for all of them (same masks and kernel)."""
        weights = lime_kernel(cosine_to_all_on(masks), self.kernel_width)
        y = np.stack([p[:, t] for p, t in zip(probs, tops, strict=True)], axis=1)
        coef, _ = weighted_ridge(masks, y, weights, self.alpha)
        return [coef[:, i] for i in range(coef.shape[1])]

    def explain(self, model: Model, img: torch.Tensor, seg: np.ndarray, masks: np.ndarray,
                label: int | None = None) -> tuple[np.ndarray, int]:
        """LIME weights for ``label`` (default: the model's top class on the image)."""
        probs = predict_jobs([model], [_Job(img, seg, masks)])[0][0]
        top = int(np.argmax(probs[0])) if label is None else label
        return self.fit(masks, [probs], [top])[0], top

    def explain_many(self, model: Model, imgs: Sequence[torch.Tensor],
                     segs: Sequence[np.ndarray], masks: Sequence[np.ndarray],
                     chunk: int = _CHUNK) -> list[tuple[np.ndarray, int]]:
        """:meth:`explain` for several images at once (their masked images batched across
        images in model calls of at most ``chunk``): the same weights, faster."""
        jobs = [_Job(i, s, m) for i, s, m in zip(imgs, segs, masks, strict=True)]
        probs = predict_jobs([model], jobs, chunk)[0]
        out = []
        with _one_blas_thread():
            for job, p in zip(jobs, probs, strict=True):
                top = int(np.argmax(p[0]))
                out.append((self.fit(job.masks, [p], [top])[0], top))
        return out

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[BrittlenessRecord]:
        models = [model] if ctx.reference is None else [model, ctx.reference]
        jobs: list[_Job] = []
        for j, i in enumerate(index):
            seg = segment(x[j], self.n_segments, self.compactness)
            grid = grid_segment(x.shape[2], x.shape[3], self.n_segments)
            jobs.append(_Job(x[j], seg, self.masks(int(seg.max()) + 1, ctx.seed(int(i)))))
            jobs.append(_Job(x[j], grid, self.masks(int(grid.max()) + 1,
                                                    ctx.seed(int(i), _GRID_STREAM))))
        probs = predict_jobs(models, jobs)
        with _one_blas_thread():
            return self._records(jobs, probs, ctx)

    def _records(self, jobs: list[_Job], probs: list[list[np.ndarray]], ctx: CheckContext
                 ) -> list[BrittlenessRecord]:
        out = []
        for j in range(len(jobs) // 2):
            s, g = 2 * j, 2 * j + 1
            # each model's own top class on the unmasked image (row 0 of the SLIC job)
            tops = [int(np.argmax(p[s][0])) for p in probs]
            ws = self.fit(jobs[s].masks, [p[s] for p in probs], tops)
            wg = self.fit(jobs[g].masks, [p[g] for p in probs], tops)
            d, dg = jobs[s].masks.shape[1], jobs[g].masks.shape[1]
            rec: BrittlenessRecord = {"d": d, "top": tops[0],
                                      "l1_per_dim": float(np.abs(ws[0]).sum() / d),
                                      "grid_d": dg,
                                      "grid_l1_per_dim": float(np.abs(wg[0]).sum() / dg),
                                      "weights": [float(v) for v in ws[0]],
                                      "check_seed": int(ctx.check_seed),
                                      "queries": 2 * self.num_masks}
            if len(probs) > 1:
                rec.update({"ref_top": tops[1],
                            "ref_l1_per_dim": float(np.abs(ws[1]).sum() / d),
                            "ref_grid_l1_per_dim": float(np.abs(wg[1]).sum() / dg),
                            "ref_weights": [float(v) for v in ws[1]],
                            "ref_queries": 2 * self.num_masks})
            out.append(rec)
        return out

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """The brittle score with its interval, and the comparison with the reference in
        words (or "no difference resolved")."""
        m, iv = result.metrics, result.intervals
        text = f"brittle score {m.brittle_score:.4g}"
        if iv.get("brittle_score"):
            lo, hi = iv["brittle_score"]
            text += f" (95% CI {lo:.4g}–{hi:.4g})"
        text += f" on {m.n} samples"
        if m.relative_improvement is not None:
            words = result.details.get("comparison", {}).get("words", "")
            text += (f"; reference {m.reference_brittle_score:.4g}, "
                     f"R.I. {100 * m.relative_improvement:+.1f}%: {words}")
        return text

    def outcome_bits(self, records: list[BrittlenessRecord]) -> dict[str, list[bool]]:
        """No binary outcome: the brittle score is continuous (see ``sample_values``)."""
        return {}

    def sample_values(self, records: list[BrittlenessRecord]) -> dict[str, list[float]]:
        """Per-sample L1 norm per superpixel, of the model and of the reference, per
        segmentation."""
        out: dict[str, list[float]] = {}
        for key in _VALUE_KEYS:
            if records and all(key in r for r in records):
                out[key] = [float(r[key]) for r in records]
        return out

    def summarize(self, records: list[BrittlenessRecord], data: Dataset) -> Measurement:
        n = len(records)
        sink = ImageSink()
        per = np.array([r["l1_per_dim"] for r in records], dtype=np.float64)
        grid = np.array([r.get("grid_l1_per_dim", np.nan) for r in records], dtype=np.float64)
        score = float(per.mean()) if n else 0.0
        metrics: dict[str, Any] = {
            "brittle_score": score, "brittle_score_grid": float(grid.mean()) if n else 0.0,
            "n": n, "superpixels_mean": float(np.mean([r["d"] for r in records])) if n else 0.0}
        intervals: dict[str, tuple[float, float]] = {}
        has_ref = n > 0 and all("ref_l1_per_dim" in r for r in records)
        comparison: dict[str, Any] = {}
        if n:
            # percentile bootstrap over samples, seeded from the check seed; the same resampled
            # indices serve every metric, so R.I.'s interval is paired (same samples and masks)
            seed = mix_seed(int(records[0].get("check_seed", 0)), _BOOT_STREAM)
            idx = np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP, n))
            boot = per[idx].mean(axis=1)
            boot_grid = grid[idx].mean(axis=1)
            intervals["brittle_score"] = percentile_interval(boot)
            intervals["brittle_score_grid"] = percentile_interval(boot_grid)
            if has_ref:
                ref = np.array([r["ref_l1_per_dim"] for r in records], dtype=np.float64)
                ref_grid = np.array([r.get("ref_grid_l1_per_dim", np.nan) for r in records],
                                    dtype=np.float64)
                ref_boot, ref_boot_grid = ref[idx].mean(axis=1), ref_grid[idx].mean(axis=1)
                metrics["reference_brittle_score"] = float(ref.mean())
                metrics["reference_brittle_score_grid"] = float(ref_grid.mean())
                ri = relative_improvement(score, ref.mean())
                ri_grid = relative_improvement(grid.mean(), ref_grid.mean())
                metrics["relative_improvement"] = ri
                metrics["relative_improvement_grid"] = ri_grid
                intervals["reference_brittle_score"] = percentile_interval(ref_boot)
                intervals["reference_brittle_score_grid"] = percentile_interval(ref_boot_grid)
                intervals["relative_improvement"] = percentile_interval(
                    relative_improvement(boot, ref_boot))
                intervals["relative_improvement_grid"] = percentile_interval(
                    relative_improvement(boot_grid, ref_boot_grid))
                resolved, words = direction_words(
                    ri, intervals["relative_improvement"],
                    ri_grid if np.isfinite(ri_grid) else None)
                comparison = {"resolved": resolved, "words": words,
                              "segmentations_agree": bool(np.sign(ri) == np.sign(ri_grid))}
        warnings = []
        if comparison and not comparison["segmentations_agree"]:
            warnings.append("SLIC and the grid segmentation rank the model and the reference "
                            "differently: R.I. is not a finding")
        heatmaps: list[dict[str, JSONLike]] = []
        for r in records[: self.max_heatmaps]:
            img = data.x[r["i"]]
            seg = segment(img, self.n_segments, self.compactness)
            vmax = max(max(abs(v) for v in r["weights"]),
                       max((abs(v) for v in r.get("ref_weights", [0.0])), default=0.0))
            entry: dict[str, JSONLike] = {
                "id": r["id"], "index": r["i"], "label_name": data.class_names[r["top"]],
                "image": sink.add(_heatmap(img, seg, [0.0] * r["d"], 1.0)),
                "model": sink.add(_heatmap(img, seg, r["weights"], vmax))}
            if "ref_weights" in r:
                entry["reference"] = sink.add(_heatmap(img, seg, r["ref_weights"], vmax))
            heatmaps.append(entry)
        grid_cells = (int(np.mean([r["grid_d"] for r in records]))
                      if n and all("grid_d" in r for r in records) else 0)
        return Measurement(
            metrics=metrics, intervals=intervals, warnings=warnings,
            details={"segmentation": {"method": "skimage.segmentation.slic",
                                      "n_segments": self.n_segments,
                                      "compactness": self.compactness, "sigma": 0},
                     "grid": {"cells": grid_cells,
                              "side": int(round(float(np.sqrt(
                                  data.x.shape[2] * data.x.shape[3] / self.n_segments))))
                              if n else 0},
                     "bootstrap": {"resamples": BOOTSTRAP, "kind": "percentile, over samples; "
                                   "paired for R.I."},
                     "comparison": comparison,
                     "num_masks": self.num_masks, "kernel_width": self.kernel_width,
                     "alpha": self.alpha, "reference": has_ref,
                     "note": "comparable only between models on the same data and segmentation",
                     "heatmaps": heatmaps},
            images=sink.images,
        )
