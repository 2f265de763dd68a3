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
superpixels and masks.

The score is only comparable between models on the same data and the same segmentation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from skimage.segmentation import slic

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

_CHUNK = 4096


def segment(img: torch.Tensor, n_segments: int, compactness: float) -> np.ndarray:
    """SLIC superpixels of a ``[C, H, W]`` image: int labels ``[H, W]`` numbered 0..d-1."""
    arr = img.detach().cpu().permute(1, 2, 0).numpy().astype(np.float64)
    channel_axis = -1 if arr.shape[2] == 3 else None
    seg = slic(arr if channel_axis is not None else arr[..., 0], n_segments=n_segments,
               compactness=compactness, sigma=0, start_label=0, channel_axis=channel_axis)
    _, seg = np.unique(seg, return_inverse=True)
    return seg.reshape(arr.shape[:2])


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
                   ) -> tuple[np.ndarray, float]:
    """Ridge regression with sample weights and an unpenalised intercept (as scikit-learn)."""
    sw = w / w.sum()
    xm = sw @ x
    ym = float(sw @ y)
    xc, yc = x - xm, y - ym
    a = xc.T @ (xc * w[:, None]) + alpha * np.eye(x.shape[1])
    coef = np.linalg.solve(a, xc.T @ (w * yc))
    return coef, ym - float(xm @ coef)


def _probabilities(scores: torch.Tensor, output: str) -> torch.Tensor:
    if output == "logits":
        return torch.softmax(scores.float(), dim=1)
    return scores.float()


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
    return out[rows][:, cols]


class Brittleness(Check):
    """Brittle score (Eq. 2) of the model, and R.I. (Eq. 3) against a reference model.

    Parameters: ``num_masks`` (k, LIME's ``num_samples``), ``n_segments`` and ``compactness``
    (SLIC settings), ``kernel_width`` (LIME's 0.25), ``alpha`` (ridge, LIME's 1.0),
    ``max_heatmaps`` (samples shown on the card). Threat model: none; ``num_masks`` queries per
    sample and model.
    """

    kind: ClassVar[str] = "brittleness"
    family: ClassVar[str] = "Black-box brittle score (LIME)"
    metrics: ClassVar[tuple[Metric, ...]] = (
        Metric("brittle_score", "mean L1 norm of LIME weights per superpixel (Vora et al. "
               "2023, Eq. 2)", "lower", unit="score", threshold=True),
        Metric("relative_improvement", "R.I. = (reference - model) / reference (Eq. 3)",
               "higher", unit="score", threshold=True, optional=True),
        Metric("reference_brittle_score", "the reference model's brittle score", "lower",
               unit="score", optional=True),
        Metric("n", "samples explained", unit="count"),
        Metric("superpixels_mean", "mean superpixels per sample", unit="score"),
    )
    export: ClassVar[ExportMetric | None] = ExportMetric("brittle_score", "brittle_score",
                                                         "Brittle score (LIME)")
    #: LIME spends num_masks queries per sample and model: record in small units.
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
        segt = torch.from_numpy(seg).long().to(img.device)
        d = int(segt.max()) + 1
        flat = img.flatten(1)  # [C, HW]
        sums = torch.zeros(img.shape[0], d, device=img.device).index_add_(1, segt.flatten(), flat)
        counts = torch.bincount(segt.flatten(), minlength=d).clamp(min=1)
        fudged = (sums / counts)[:, segt]  # mean colour per superpixel, [C, H, W]
        keep = torch.from_numpy(masks).to(img)[:, segt]  # [k, H, W]
        return img.unsqueeze(0) * keep.unsqueeze(1) + fudged.unsqueeze(0) * (1 - keep).unsqueeze(1)

    def explain(self, model: Model, img: torch.Tensor, seg: np.ndarray, masks: np.ndarray,
                label: int | None = None) -> tuple[np.ndarray, int]:
        """LIME weights for ``label`` (default: the model's top class on the image)."""
        imgs = self.masked_images(img, seg, masks)
        out = torch.cat([model.predict(imgs[i:i + _CHUNK]) for i in range(0, len(imgs), _CHUNK)])
        probs = _probabilities(out, model.info.output).cpu().numpy().astype(np.float64)
        top = int(np.argmax(probs[0])) if label is None else label
        weights = lime_kernel(cosine_to_all_on(masks), self.kernel_width)
        coef, _ = weighted_ridge(masks, probs[:, top], weights, self.alpha)
        return coef, top

    def run_batch(self, model: Model, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[dict[str, Any]]:
        out = []
        ref = ctx.reference
        for j, i in enumerate(index):
            seg = segment(x[j], self.n_segments, self.compactness)
            d = int(seg.max()) + 1
            masks = self.masks(d, ctx.seed(int(i)))
            w, top = self.explain(model, x[j], seg, masks)
            rec: dict[str, Any] = {"d": d, "top": top, "l1_per_dim": float(np.abs(w).sum() / d),
                                   "weights": [float(v) for v in w],
                                   "queries": self.num_masks}
            if ref is not None:
                wr, topr = self.explain(ref, x[j], seg, masks)
                rec.update({"ref_top": topr, "ref_l1_per_dim": float(np.abs(wr).sum() / d),
                            "ref_weights": [float(v) for v in wr],
                            "ref_queries": self.num_masks})
            out.append(rec)
        return out

    @classmethod
    def headline(cls, result: ResultView) -> str:
        """The brittle score, and R.I. against the reference when there is one."""
        m = result.metrics
        text = f"brittle score {m.brittle_score:.4g} on {m.n} samples"
        if m.relative_improvement is not None:
            text += (f"; reference {m.reference_brittle_score:.4g}, "
                     f"R.I. {100 * m.relative_improvement:+.1f}%")
        return text

    def outcome_bits(self, records: list[dict[str, Any]]) -> dict[str, list[bool]]:
        """No binary outcome: the brittle score is continuous (see ``sample_values``)."""
        return {}

    def sample_values(self, records: list[dict[str, Any]]) -> dict[str, list[float]]:
        """Per-sample L1 norm per superpixel, of the model and of the reference."""
        out = {"l1_per_dim": [float(r["l1_per_dim"]) for r in records]}
        if records and all("ref_l1_per_dim" in r for r in records):
            out["ref_l1_per_dim"] = [float(r["ref_l1_per_dim"]) for r in records]
        return out

    def summarize(self, records: list[dict[str, Any]], data: Dataset) -> Measurement:
        n = len(records)
        sink = ImageSink()
        per = np.array([r["l1_per_dim"] for r in records])
        score = float(per.mean()) if n else 0.0
        se = float(per.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
        metrics: dict[str, Any] = {"brittle_score": score, "n": n,
                                   "superpixels_mean": float(np.mean([r["d"] for r in records]))
                                   if n else 0.0}
        intervals = {"brittle_score": (score - 1.96 * se, score + 1.96 * se)}
        has_ref = n > 0 and all("ref_l1_per_dim" in r for r in records)
        if has_ref:
            ref = float(np.mean([r["ref_l1_per_dim"] for r in records]))
            metrics["reference_brittle_score"] = ref
            metrics["relative_improvement"] = (ref - score) / ref if ref > 0 else 0.0
        heatmaps = []
        for r in records[: self.max_heatmaps]:
            img = data.x[r["i"]]
            seg = segment(img, self.n_segments, self.compactness)
            vmax = max(max(abs(v) for v in r["weights"]),
                       max((abs(v) for v in r.get("ref_weights", [0.0])), default=0.0))
            entry = {"id": r["id"], "index": r["i"], "label_name": data.class_names[r["top"]],
                     "image": sink.add(_heatmap(img, seg, [0.0] * r["d"], 1.0)),
                     "model": sink.add(_heatmap(img, seg, r["weights"], vmax))}
            if "ref_weights" in r:
                entry["reference"] = sink.add(_heatmap(img, seg, r["ref_weights"], vmax))
            heatmaps.append(entry)
        return Measurement(
            metrics=metrics, intervals=intervals,
            details={"segmentation": {"method": "skimage.segmentation.slic",
                                      "n_segments": self.n_segments,
                                      "compactness": self.compactness, "sigma": 0},
                     "num_masks": self.num_masks, "kernel_width": self.kernel_width,
                     "alpha": self.alpha, "reference": has_ref,
                     "note": "comparable only between models on the same data and segmentation",
                     "heatmaps": heatmaps},
            images=sink.images,
        )
