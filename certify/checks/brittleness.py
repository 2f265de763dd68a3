"""Black-box brittle score from LIME explanations (Vora et al. 2023).

For each sample: superpixels from scikit-image's SLIC (LIME's default quickshift gives only 1-4
superpixels on a 32x32 sign, which makes the score meaningless); ``k`` random on/off masks over
them (the first keeps every superpixel), hidden superpixels filled with their mean colour as
LIME does; the exponential kernel ``sqrt(exp(-d^2 / width^2))`` on the cosine distance of each
mask to the all-on mask; and a weighted ridge regression (alpha 1, with intercept, as LIME's
default regressor) of the model's probability for its own top class on the masks. Its weights
``w`` (one per superpixel, dimension ``d``) give **brittle score = (1/n) Σ ‖w‖₁ / d** (Eq. 2).
Needs no labels and no gradients: only ``predict``.

That regression target moves when only the scale of the logits moves (the softmax of ``c * z``
is flatter for ``c < 1`` and sharper for ``c > 1``; the decisions are the same), so the score
is also reported on a **decision-target variant** (not the paper's): the same LIME fit on
``1`` when the masked image's top class is still the model's top class on the unmasked image,
else ``0``. An argmax is unchanged by a positive scaling of the logits (and by any increasing
map of the scores), so that variant is too. With a reference model the check reports the
relative improvement R.I. = (ref − model) / ref (Eq. 3), computed on the same superpixels and
masks, **on the decision-target variant** (``relative_improvement``; positive when this model's
score is lower); Vora et al.'s R.I. on their probability target is kept beside it
(``relative_improvement_probability``) and moves with the logit scale.

Uncertainty: a percentile bootstrap over samples gives each score's 95% interval, and a paired
bootstrap (the same resampled samples for model and reference, whose masks are shared) gives
R.I.'s. Stability: every sample is also scored on a regular grid of square cells (about
``n_segments`` of them, the same number of masks); when SLIC and the grid rank model and
reference differently, or R.I.'s interval contains 0, no difference is resolved.

The score is only comparable between models on the same data and the same segmentation.

Speed: the masked images of several samples (both segmentations) are built into one reused
buffer per hand-off to the models (``_CHUNK`` images across samples) by bit operations on the
float32 images (exactly the original pixel or the cell's mean colour, as a ``where`` would
give, at half its cost); for a model that does not compute on this CPU (an endpoint, a GPU) the
next hand-off is built while the models run on the current one; on this CPU it is built in
line, on as many threads as a model call computes on (a single caller's onnxruntime session:
every core it may use; an engine lane's: its share of the cores, ``DeviceChoice.onnx_threads``,
one each on 2 cores). One ridge solve per sample and
segmentation serves every target of model and reference (the design matrix and kernel are
shared). A sample's masks come from its own seed, so its result does not depend on the
batching. On a GTSRB-size CNN certify's work around the model is about a quarter of the
forward passes' time (benchmarks/RESULTS.md, issue 29). On onnxruntime's CPU provider each
model gets calls of the size that its own timed calls found fastest (:class:`CallSizer`): the
best size moves with the model and with the load on the machine (issue 42).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from certify.canonical import JSONLike
from certify.checks.base import (
    Check,
    CheckContext,
    Measurement,
)
from certify.data import Dataset
from certify.images import ImageSink
from certify.kinds import BrittlenessKind
from certify.models.base import Model, ModelInfo, unwrapped
from certify.params import Param, Params
from certify.perturbations.base import mix_seed
from certify.rundir import SampleRecord

if TYPE_CHECKING:
    import torch
    from threadpoolctl import ThreadpoolController

#: Masked images built per hand-off to the models (across samples); on onnxruntime's CPU
#: provider each model then gets them in calls sized by its :class:`CallSizer`. Building 2,048
#: at a time rather than 256 was 10-18% faster with two models (the check: model and
#: reference) and with one (benchmarks/RESULTS.md). Bounds memory (~12 KB per 3x32x32 image).
_CHUNK = 2048
#: The onnxruntime call sizes a :class:`CallSizer` times (images; their sum fits a hand-off).
#: No one size is best: on 2 cores (benchmarks/RESULTS.md, issues 29 and 42) the 0.8 M-MAC
#: GTSRB CNN ran 12% faster per image in calls of 256 than of 1,000 with the host quiet, and
#: with it busy (load 6-9) 1.37x slower than in calls of 1,024 (``explain_many`` at 1.33x the
#: 1,000-image floor against 1.20x); the 7.6 M-MAC demo model under load: 128 at 1.53x the
#: floor, 256 at 1.26x, 1,024 at 1.05x. Calls of 16-64 were never the fastest, nor 2,048 by
#: more than 5% over 1,024.
CALL_SIZES = (128, 256, 512, 1024)
#: A model's call sizes are timed again on every ``_RETIME``-th hand-off: the host's speed
#: changes within tens of seconds, and the best size with it.
_RETIME = 8
#: Timings kept per call size (the most recent); the median decides.
_KEEP = 3
#: Fewest masked images per thread when a hand-off is built on several (a smaller run
#: costs more in hand-over than it saves).
_MIN_RUN = 64
#: Masked images built per pass of the bit operations: 128 3x32x32 images (1.5 MB) stay
#: in cache from one pass to the next; 2 x 1,000 images took 5.6 ms against 7.3 in passes
#: over all 1,000 (benchmarks/RESULTS.md, issue 66).
_BUILD_ROWS = 128
#: Bootstrap resamples for the intervals.
BOOTSTRAP = 2000
#: Stream of the grid segmentation's masks (``ctx.seed(i, _GRID_STREAM)``) and the bootstrap's.
_GRID_STREAM = 1
_BOOT_STREAM = 0xB007
#: The card's words for the basis of ``relative_improvement``.
DECISION_BASIS = ("R.I. on the decision-target variant, which a positive scaling of the logits "
                  "leaves unchanged")
PROBABILITY_BASIS = ("Vora et al.'s R.I. on the probability of the top class, which moves with "
                     "the scale of the logits")


def segment(img: torch.Tensor, n_segments: int, compactness: float) -> np.ndarray:
    """SLIC superpixels of a ``[C, H, W]`` image: int labels ``[H, W]`` numbered 0..d-1."""
    # imported here: scikit-image (and the SciPy modules it loads) is about 0.4 s of every
    # process's start-up, and only runs with a brittleness check segment images
    from skimage.segmentation import slic

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


_BLAS: list[ThreadpoolController] = []


def _one_blas_thread() -> Any:
    """BLAS on one thread for the small ridge solves: a ``[1000, 64]`` fit takes under 1 ms on
    one thread, and 5-20 ms when a multi-threaded BLAS wakes threads on a busy machine. The
    controller is made once (inspecting the loaded libraries costs about 1 ms)."""
    from threadpoolctl import ThreadpoolController

    if not _BLAS:
        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=1, user_api="blas")


def _probabilities(scores: torch.Tensor, output: str) -> torch.Tensor:
    import torch

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


_ALL_ON = np.uint32(0xFFFFFFFF)


@dataclass
class _Job:
    """One sample under one segmentation: its masks, and the fill of its hidden cells.

    The masked images are made on the CPU from the float32 bit patterns:
    ``fill ^ (on & (pixel ^ fill))`` with ``on`` all ones where the pixel's cell is kept, which
    is exactly the pixel or exactly its cell's mean colour (two passes of numpy bit operations,
    about half the time of a ``where``).
    """

    img: torch.Tensor  # [C, H, W] float32
    seg: np.ndarray  # [H, W] labels 0..d-1
    masks: np.ndarray  # [k, d] float 0/1, row 0 all ones

    def __post_init__(self) -> None:
        import torch

        img = self.img.detach().cpu().float()
        segt = torch.from_numpy(np.ascontiguousarray(self.seg)).long().flatten()
        d = self.masks.shape[1]
        flat = img.flatten(1)  # [C, HW]
        sums = torch.zeros(flat.shape[0], d, dtype=flat.dtype).index_add_(1, segt, flat)
        counts = torch.bincount(segt, minlength=d).clamp(min=1)
        fill = (sums / counts)[:, segt].contiguous()  # [C, HW] mean colour of each pixel's cell
        self._fill = fill.numpy().view(np.uint32)
        self._diff = flat.contiguous().numpy().view(np.uint32) ^ self._fill
        self._cell = segt.numpy()  # [HW] each pixel's cell
        self._on = np.where(self.masks > 0.5, _ALL_ON, np.uint32(0))  # [k, d]

    def images_into(self, out: np.ndarray, start: int, stop: int) -> None:
        """Write masked images ``start:stop`` into ``out`` (uint32 ``[n, C, HW]``, the float32
        images' bits)."""
        for a in range(start, stop, _BUILD_ROWS):  # rows that stay in cache between passes
            b = min(stop, a + _BUILD_ROWS)
            on = np.take(self._on[a:b], self._cell, axis=1)  # [n, HW]
            part = out[a - start:b - start]
            np.bitwise_and(on[:, None, :], self._diff[None], out=part)
            part ^= self._fill

    def images(self, start: int, stop: int) -> torch.Tensor:
        """Masked images ``start:stop`` as ``[n, C, H, W]`` float32 on the CPU."""
        import torch

        out = np.empty((stop - start, *self._fill.shape), dtype=np.uint32)
        self.images_into(out, start, stop)
        return torch.from_numpy(out.view(np.float32)).view(-1, *self.img.shape)


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


def _build(jobs: list[_Job], piece: list[tuple[int, int, int]],
           buffer: np.ndarray | None = None, pool: ThreadPoolExecutor | None = None,
           parts: int = 1) -> torch.Tensor:
    """One hand-off's masked images, written into one buffer (no concatenation): ``buffer``
    (uint32 ``[>= n, C, HW]``) when given, so that hand-offs reuse memory already mapped
    (allocating 25 MB afresh per hand-off cost as much as building into it).

    With a ``pool`` and ``parts`` > 1 the rows are written in ``parts`` equal runs at once,
    one in this thread and the others on the pool (numpy's bit operations release the GIL):
    the images are the same bits whatever the split, each row being written by one thread.
    """
    import torch

    total = sum(b - a for _, a, b in piece)
    first = jobs[piece[0][0]]
    shape = first._fill.shape  # noqa: SLF001 - same module
    out = (np.empty((total, *shape), dtype=np.uint32) if buffer is None
           else buffer[:total])
    runs = _row_runs(piece, parts if pool is not None else 1)
    waits = [pool.submit(_write, jobs, out, run) for run in runs[1:]] if pool else []
    _write(jobs, out, runs[0])
    for w in waits:
        w.result()
    imgs = torch.from_numpy(out.view(np.float32)).view(total, *first.img.shape)
    return imgs if first.img.device.type == "cpu" else imgs.to(first.img.device)


def _row_runs(piece: list[tuple[int, int, int]], parts: int
              ) -> list[list[tuple[int, int, int, int]]]:
    """``piece``'s rows split into ``parts`` runs of (nearly) equal length, each a list of
    ``(job, start, stop, at)``: job rows ``start:stop`` go to output rows from ``at``."""
    total = sum(b - a for _, a, b in piece)
    parts = max(1, min(parts, total // _MIN_RUN))
    edges = [total * i // parts for i in range(parts + 1)]
    runs: list[list[tuple[int, int, int, int]]] = [[] for _ in range(parts)]
    at = 0
    for j, a, b in piece:
        for r in range(parts):  # the piece's rows [at, at + b - a) cut at the runs' edges
            lo, hi = max(at, edges[r]), min(at + b - a, edges[r + 1])
            if lo < hi:
                runs[r].append((j, a + lo - at, a + hi - at, lo))
        at += b - a
    return runs


def _write(jobs: list[_Job], out: np.ndarray, run: list[tuple[int, int, int, int]]) -> None:
    """Write one run of masked images (:func:`_row_runs`) into ``out``."""
    for j, a, b, at in run:
        jobs[j].images_into(out[at:at + b - a], a, b)


def build_threads(models: Sequence[Model]) -> int:
    """Threads that build a hand-off's masked images in line: the CPU threads one call of the
    models computes on (they wait while it is built), 1 where a model is not on this CPU.

    In the engine's lanes each onnxruntime session has the lane's share of the cores
    (``DeviceChoice.onnx_threads``: one each on 2 cores), so the lanes together build on
    every core; a session left to onnxruntime's default (a single caller's) builds on every
    core this process may use.
    """
    threads = []
    for m in models:
        inner: Any = unwrapped(m)
        if not _local_cpu(m) or not isinstance(getattr(inner, "cpu_threads", None), int):
            return 1
        threads.append(int(inner.cpu_threads))
    return max(1, min(threads, default=1))


@dataclass
class Predictions:
    """One model's outputs on one job's masked images: class probabilities ``[k, classes]``
    (float32) and the top class of each image's scores ``[k]`` (an argmax of the model's own
    scores, which a positive scaling of logits leaves unchanged)."""

    probs: np.ndarray
    labels: np.ndarray

    def targets(self, top: int) -> tuple[np.ndarray, np.ndarray]:
        """The two regression targets for class ``top`` (float64 ``[k]``): its probability
        (Vora et al.) and whether it is still the top class (the decision-target variant)."""
        return (self.probs[:, top].astype(np.float64),
                (self.labels == top).astype(np.float64))


def _local_cpu(model: Model) -> bool:
    """Whether the model computes on this machine's CPU (onnxruntime's CPU provider)."""
    return model.info.provider == "CPUExecutionProvider"


class CallSizer:
    """Images per onnxruntime call for one model on this CPU, chosen from timed calls of the
    check's own masked images (no extra queries).

    A hand-off of at least ``sum(sizes)`` images is a timing one while a size has been timed
    fewer than twice, and on every ``_RETIME``-th hand-off: one call of each size (in an order
    that rotates), then the rest at the chosen size; every other hand-off goes in calls of the
    size whose median time per image over its last ``_KEEP`` timings is lowest (``CPU_CHUNK``
    before any timing). Results do not depend on it: onnxruntime's CPU provider gave
    bit-identical scores per image in calls of 1 to 2,048 images on every model measured
    (benchmarks/RESULTS.md, issue 42), and tests/test_brittleness_calls.py holds the check's
    records to that. Only the timings depend on the load on the machine, and they choose.
    """

    def __init__(self, sizes: Sequence[int] = CALL_SIZES) -> None:
        from certify.models.onnx import CPU_CHUNK

        self.sizes = tuple(sizes)
        self.default = CPU_CHUNK if CPU_CHUNK in self.sizes else self.sizes[0]
        self.times: dict[int, list[float]] = {s: [] for s in self.sizes}
        self.handoffs = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """The size with the lowest median seconds per image (``default`` before timing)."""
        with self._lock:
            timed = {s: float(np.median(v)) for s, v in self.times.items() if v}
        return min(timed, key=lambda s: timed[s]) if timed else self.default

    def plan(self, n: int) -> tuple[list[int], int]:
        """The call sizes for a hand-off of ``n`` images, and how many of them (the first) to
        time: one of each size, or none."""
        with self._lock:
            k = self.handoffs
            self.handoffs += 1
            due = k % _RETIME == 0 or any(len(v) < 2 for v in self.times.values())
        best = self.size
        turn = k % len(self.sizes)
        calls = (list(self.sizes[turn:] + self.sizes[:turn]) if due and n >= sum(self.sizes)
                 else [])
        timing = len(calls)
        rest = n - sum(calls)
        calls += [best] * (rest // best) + ([rest % best] if rest % best else [])
        return calls, timing

    def record(self, size: int, seconds: float) -> None:
        """One timed call of ``size`` images."""
        with self._lock:
            kept = self.times[size]
            kept.append(seconds / size)
            del kept[:-_KEEP]


_SIZERS: weakref.WeakKeyDictionary[Any, CallSizer] = weakref.WeakKeyDictionary()
_SIZERS_LOCK = threading.Lock()


def call_sizer(model: Model) -> CallSizer | None:
    """The :class:`CallSizer` of the model behind ``model``'s query counters (one per model
    for the process, made on first use), or ``None`` for a model that does not run on
    onnxruntime's CPU provider (an endpoint or a GPU gets each hand-off in one call) or whose
    graph fixes its batch (its calls are that batch whatever the caller asks)."""
    if not _local_cpu(model) or model.info.batch.startswith("fixed"):
        return None
    inner = unwrapped(model)
    with _SIZERS_LOCK:
        try:
            sizer = _SIZERS.get(inner)
            if sizer is None:
                sizer = _SIZERS[inner] = CallSizer()
        except TypeError:  # not weakly referable or not hashable: sized afresh per call
            sizer = CallSizer()
    return sizer


_KEPT = threading.local()
#: The most a thread keeps in masked-image buffers between calls: two hand-offs of 2,048
#: images of up to 4,096 floats (3 x 32 x 32 images: 50 MB), or one of up to 8,192; a call
#: that needs more gets buffers made afresh and leaves the thread keeping none.
_KEPT_BYTES = 64 << 20


def _buffers(n: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    """``n`` uint32 buffers of ``shape``: views of this thread's buffers from its last call,
    grown where too small. A sample explained alone (``--samples all`` runs in batches of
    one) builds 2 x 1,000 images per call, and mapping 25 MB afresh each time cost as much
    as building into it. A thread keeps at most two, ``_KEPT_BYTES`` in all (a call that
    needs more gets fresh buffers and leaves none kept), and nothing once it ends."""
    need = int(np.prod(shape))
    kept: list[np.ndarray] = getattr(_KEPT, "buffers", [])
    out = [kept[i] if i < len(kept) and kept[i].size >= need
           else np.empty(need, dtype=np.uint32) for i in range(n)]
    keep = out + kept[n:]
    _KEPT.buffers = keep if sum(b.nbytes for b in keep) <= _KEPT_BYTES else []
    return [b[:need].reshape(shape) for b in out]


def predict_handoff(model: Model, imgs: torch.Tensor, sizer: CallSizer | None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The model's class probabilities (float32 ``[n, classes]``) and the top class of its
    scores (``[n]``) on one hand-off: in one call without a ``sizer``, else in the calls it
    plans (timed when it says so). Both are copies: nothing returned points into ``imgs``."""
    from certify.models.onnx import cpu_call_size

    if sizer is None:
        scores = model.predict(imgs)
        return (np.array(_probabilities(scores, model.info.output).cpu().numpy()),
                scores.argmax(dim=1).cpu().numpy())
    import torch

    calls, timing = sizer.plan(len(imgs))
    parts = []
    at = 0
    for c, size in enumerate(calls):
        t = time.perf_counter()
        with cpu_call_size(size):
            parts.append(model.predict(imgs[at:at + size]))
        if c < timing:
            sizer.record(size, time.perf_counter() - t)
        at += size
    # one softmax and one argmax for the hand-off, not one per call (each row's are its own)
    scores = parts[0] if len(parts) == 1 else torch.cat(parts)
    return (np.array(_probabilities(scores, model.info.output).cpu().numpy()),
            scores.argmax(dim=1).cpu().numpy())


def predict_jobs(models: Sequence[Model], jobs: list[_Job], chunk: int | None = None,
                 overlap: bool | None = None) -> list[list[Predictions]]:
    """Each model's :class:`Predictions` on each job's masked images.

    Masked images go to the models in hand-offs of at most ``chunk`` (default ``_CHUNK``)
    images that span jobs, each in calls sized by the model's :func:`call_sizer`.
    ``overlap``: build the next call's images in a worker thread while the models run; by
    default only when a model does not compute on this machine's CPU (an endpoint, a GPU).
    On the CPU, onnxruntime already keeps every core busy, and building in line was faster
    (benchmarks/RESULTS.md, issue 29); in line, a hand-off is built on the threads a model
    call computes on (:func:`build_threads`), which wait for it, into this thread's kept
    buffers (:func:`_buffers`), and each model's scores go through one softmax per hand-off.
    """
    chunk = _CHUNK if chunk is None else chunk
    if overlap is None:
        overlap = not all(_local_cpu(m) for m in models)
    probs: list[list[list[np.ndarray]]] = [[[] for _ in jobs] for _ in models]
    labels: list[list[list[np.ndarray]]] = [[[] for _ in jobs] for _ in models]
    pieces = list(_chunks(jobs, chunk))
    sizers = [call_sizer(m) for m in models]
    # two buffers, taken in turn: the one being built is never the one the models are on
    # (a hand-off's buffer is reused two hand-offs later, after its model calls returned)
    size = max((sum(b - a for _, a, b in piece) for piece in pieces), default=0)
    shape = jobs[0]._fill.shape if jobs else (0,)  # noqa: SLF001 - same module
    buffers = _buffers(min(2 if overlap else 1, len(pieces)), (size, *shape))
    parts = 1 if overlap else build_threads(models)
    with ThreadPoolExecutor(max_workers=max(1, parts - 1)) as pool:
        pending = (pool.submit(_build, jobs, pieces[0], buffers[0])
                   if pieces and overlap else None)
        for n, piece in enumerate(pieces):
            if pending is None:
                imgs = _build(jobs, piece, buffers[0], pool, parts)
            else:
                imgs = pending.result()
                pending = (pool.submit(_build, jobs, pieces[n + 1], buffers[(n + 1) % 2])
                           if n + 1 < len(pieces) else None)
            for mi, model in enumerate(models):
                # copies: nothing kept may point into a buffer that is about to be rewritten
                p, top = predict_handoff(model, imgs, sizers[mi])
                at = 0
                for j, a, b in piece:
                    probs[mi][j].append(p[at:at + b - a])
                    labels[mi][j].append(top[at:at + b - a])
                    at += b - a
    return [[Predictions(np.concatenate(p), np.concatenate(t)) for p, t in zip(pm, tm,
                                                                                strict=True)]
            for pm, tm in zip(probs, labels, strict=True)]


class BrittlenessRecord(SampleRecord, total=False):
    """A brittleness record: LIME weights and their L1 norm per superpixel, per segmentation
    (SLIC, and the grid's ``grid_``), per target (the probability of the top class, and the
    decision-target variant's ``decision_``), of the model and of the reference (``ref_``)."""

    d: int
    top: int
    l1_per_dim: float
    grid_d: int
    grid_l1_per_dim: float
    decision_l1_per_dim: float
    grid_decision_l1_per_dim: float
    weights: list[float]
    check_seed: int
    ref_top: int
    ref_l1_per_dim: float
    ref_grid_l1_per_dim: float
    ref_decision_l1_per_dim: float
    ref_grid_decision_l1_per_dim: float
    ref_weights: list[float]


_ValueKey = Literal["l1_per_dim", "ref_l1_per_dim", "grid_l1_per_dim", "ref_grid_l1_per_dim",
                    "decision_l1_per_dim", "ref_decision_l1_per_dim",
                    "grid_decision_l1_per_dim", "ref_grid_decision_l1_per_dim"]
#: The per-sample values a brittleness record keeps for paired comparisons.
_VALUE_KEYS: tuple[_ValueKey, ...] = (
    "l1_per_dim", "ref_l1_per_dim", "grid_l1_per_dim", "ref_grid_l1_per_dim",
    "decision_l1_per_dim", "ref_decision_l1_per_dim", "grid_decision_l1_per_dim",
    "ref_grid_decision_l1_per_dim")


@dataclass(frozen=True)
class _Score:
    """One brittle score: its metric, the per-sample key, the reference's, and R.I.'s."""

    metric: str
    key: _ValueKey
    ref_metric: str
    ref_key: _ValueKey
    ri_metric: str


#: Every score the check reports (the paper's target, then the decision-target variant, on
#: SLIC and on the grid). ``relative_improvement`` is the decision-target variant's.
_SCORES = (
    _Score("brittle_score", "l1_per_dim", "reference_brittle_score", "ref_l1_per_dim",
           "relative_improvement_probability"),
    _Score("brittle_score_grid", "grid_l1_per_dim", "reference_brittle_score_grid",
           "ref_grid_l1_per_dim", "relative_improvement_probability_grid"),
    _Score("brittle_score_decision", "decision_l1_per_dim",
           "reference_brittle_score_decision", "ref_decision_l1_per_dim",
           "relative_improvement"),
    _Score("brittle_score_decision_grid", "grid_decision_l1_per_dim",
           "reference_brittle_score_decision_grid", "ref_grid_decision_l1_per_dim",
           "relative_improvement_grid"),
)



class Brittleness(BrittlenessKind, Check[BrittlenessRecord]):
    """Brittle score (Eq. 2) of the model, and R.I. (Eq. 3) against a reference model.

    Parameters: ``num_masks`` (k, LIME's ``num_samples``), ``n_segments`` and ``compactness``
    (SLIC settings; the grid has about ``n_segments`` square cells), ``kernel_width`` (LIME's
    0.25), ``alpha`` (ridge, LIME's 1.0), ``max_heatmaps`` (samples shown on the card). Threat
    model: none; ``2 * num_masks`` queries per sample and model (SLIC and grid). Each fit has
    two targets, the probability of the top class (Vora et al.) and the decision-target
    variant (scale-free); R.I. is the variant's.
    """

    #: LIME spends 2 * num_masks queries per sample and model: record in small units.
    record_batch: ClassVar[int | None] = 8

    suite_params: ClassVar[Params] = Params(
        Param("num_masks", int, 1000,
              "k, masked images per sample and segmentation (LIME's num_samples)", low=10),
        Param("n_segments", int, 64,
              "about this many SLIC superpixels per image; the grid segmentation has about as "
              "many square cells", low=2),
        Param("compactness", float, 20.0, "SLIC's compactness (higher: squarer superpixels)",
              low=0, low_open=True),
        Param("kernel_width", float, 0.25, "LIME's kernel width on the masks' cosine distance",
              low=0, low_open=True),
        Param("alpha", float, 1.0, "the ridge penalty of LIME's linear fit",
              low=0, low_open=True),
        Param("max_heatmaps", int, 4, "samples whose LIME heatmaps the card shows"),
    )

    def __init__(self, num_masks: int = 1000, n_segments: int = 64, compactness: float = 20.0,
                 kernel_width: float = 0.25, alpha: float = 1.0, max_heatmaps: int = 4) -> None:
        self.num_masks = num_masks
        self.n_segments = n_segments
        self.compactness = compactness
        self.kernel_width = kernel_width
        self.alpha = alpha
        self.max_heatmaps = max_heatmaps

    def produced_metrics(self, reference: bool) -> set[str]:
        """Both R.I.s need a reference model (``--reference``)."""
        return set(self.metric_names) - (set() if reference else {
            "relative_improvement", "relative_improvement_probability"})

    def skip_reason(self, info: ModelInfo) -> str | None:
        """Skip a labels-only model: the brittle score is defined on class probabilities."""
        if info.output == "labels":
            return f"brittleness needs scores; {info.name} returns labels only"
        return None

    def masks(self, d: int, seed: int) -> np.ndarray:
        """``num_masks`` random on/off rows over ``d`` superpixels; row 0 keeps everything."""
        import torch

        g = torch.Generator().manual_seed(seed)
        m = torch.randint(0, 2, (self.num_masks, d), generator=g).numpy().astype(np.float64)
        m[0] = 1.0
        return m

    @staticmethod
    def masked_images(img: torch.Tensor, seg: np.ndarray, masks: np.ndarray) -> torch.Tensor:
        """Images with hidden superpixels filled by their mean colour ``[k, C, H, W]``."""
        return _Job(img, seg, masks).images(0, len(masks))

    def fit(self, masks: np.ndarray, targets: Sequence[np.ndarray]) -> list[np.ndarray]:
        """LIME weights ``[d]`` for each regression target ``[k]``: one weighted ridge solve
        for all of them (same masks and kernel)."""
        weights = lime_kernel(cosine_to_all_on(masks), self.kernel_width)
        coef, _ = weighted_ridge(masks, np.stack(targets, axis=1), weights, self.alpha)
        return [coef[:, i] for i in range(coef.shape[1])]

    def explain(self, model: Model, img: torch.Tensor, seg: np.ndarray, masks: np.ndarray,
                label: int | None = None, decision: bool = False) -> tuple[np.ndarray, int]:
        """LIME weights for ``label`` (default: the model's top class on the image), on its
        probability (LIME's target) or, with ``decision``, on the decision-target variant."""
        pred = predict_jobs([model], [_Job(img, seg, masks)])[0][0]
        top = int(pred.labels[0]) if label is None else label
        return self.fit(masks, [pred.targets(top)[int(decision)]])[0], top

    def explain_many(self, model: Model, imgs: Sequence[torch.Tensor],
                     segs: Sequence[np.ndarray], masks: Sequence[np.ndarray],
                     chunk: int | None = None, decision: bool = False,
                     overlap: bool | None = None) -> list[tuple[np.ndarray, int]]:
        """:meth:`explain` for several images at once (their masked images batched across
        images in model calls; ``chunk`` and ``overlap`` as :func:`predict_jobs`): the same
        weights, faster."""
        jobs = [_Job(i, s, m) for i, s, m in zip(imgs, segs, masks, strict=True)]
        preds = predict_jobs([model], jobs, chunk, overlap)[0]
        out = []
        with _one_blas_thread():
            for job, p in zip(jobs, preds, strict=True):
                top = int(p.labels[0])
                out.append((self.fit(job.masks, [p.targets(top)[int(decision)]])[0], top))
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
        preds = predict_jobs(models, jobs)
        with _one_blas_thread():
            return self._records(jobs, preds, ctx)

    def _records(self, jobs: list[_Job], preds: list[list[Predictions]], ctx: CheckContext
                 ) -> list[BrittlenessRecord]:
        out = []
        for j in range(len(jobs) // 2):
            s, g = 2 * j, 2 * j + 1
            # each model's own top class on the unmasked image (row 0 of the SLIC job)
            tops = [int(p[s].labels[0]) for p in preds]
            # targets: every model's probability, then every model's decision indicator
            ts = [p[s].targets(t) for p, t in zip(preds, tops, strict=True)]
            tg = [p[g].targets(t) for p, t in zip(preds, tops, strict=True)]
            ws = self.fit(jobs[s].masks, [t[0] for t in ts] + [t[1] for t in ts])
            wg = self.fit(jobs[g].masks, [t[0] for t in tg] + [t[1] for t in tg])
            d, dg = jobs[s].masks.shape[1], jobs[g].masks.shape[1]
            nm = len(preds)

            def l1(w: np.ndarray, dim: int) -> float:
                return float(np.abs(w).sum() / dim)

            rec: BrittlenessRecord = {"d": d, "top": tops[0],
                                      "l1_per_dim": l1(ws[0], d),
                                      "grid_d": dg,
                                      "grid_l1_per_dim": l1(wg[0], dg),
                                      "decision_l1_per_dim": l1(ws[nm], d),
                                      "grid_decision_l1_per_dim": l1(wg[nm], dg),
                                      "weights": [float(v) for v in ws[0]],
                                      "check_seed": int(ctx.check_seed),
                                      "queries": 2 * self.num_masks}
            if nm > 1:
                rec.update({"ref_top": tops[1],
                            "ref_l1_per_dim": l1(ws[1], d),
                            "ref_grid_l1_per_dim": l1(wg[1], dg),
                            "ref_decision_l1_per_dim": l1(ws[nm + 1], d),
                            "ref_grid_decision_l1_per_dim": l1(wg[nm + 1], dg),
                            "ref_weights": [float(v) for v in ws[1]],
                            "ref_queries": 2 * self.num_masks})
            out.append(rec)
        return out

    def outcome_bits(self, records: list[BrittlenessRecord]) -> dict[str, list[bool]]:
        """No binary outcome: the brittle score is continuous (see ``sample_values``)."""
        return {}

    def sample_values(self, records: list[BrittlenessRecord]) -> dict[str, list[float]]:
        """Per-sample L1 norm per superpixel, of the model and of the reference, per
        segmentation and target."""
        out: dict[str, list[float]] = {}
        for key in _VALUE_KEYS:
            if records and all(key in r for r in records):
                out[key] = [float(r[key]) for r in records]
        return out

    def summarize(self, records: list[BrittlenessRecord], data: Dataset) -> Measurement:
        n = len(records)
        sink = ImageSink()
        metrics: dict[str, Any] = {
            "n": n, "superpixels_mean": float(np.mean([r["d"] for r in records])) if n else 0.0}
        intervals: dict[str, tuple[float, float]] = {}
        has_ref = n > 0 and all("ref_l1_per_dim" in r for r in records)
        # percentile bootstrap over samples, seeded from the check seed; the same resampled
        # indices serve every metric, so R.I.'s interval is paired (same samples and masks)
        seed = mix_seed(int(records[0].get("check_seed", 0)), _BOOT_STREAM) if n else 0
        idx = np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP, n)) if n else None
        ri: dict[str, float] = {}
        for sc in _SCORES:
            if sc.metric not in ("brittle_score", "brittle_score_grid") and not (
                    n and all(sc.key in r for r in records)):
                continue  # the variant is missing from records made before it
            per = np.array([r.get(sc.key, np.nan) for r in records], dtype=np.float64)
            metrics[sc.metric] = float(per.mean()) if n else 0.0
            if idx is None:
                continue
            boot = per[idx].mean(axis=1)
            intervals[sc.metric] = percentile_interval(boot)
            if has_ref and all(sc.ref_key in r for r in records):
                ref = np.array([r[sc.ref_key] for r in records], dtype=np.float64)
                ref_boot = ref[idx].mean(axis=1)
                metrics[sc.ref_metric] = float(ref.mean())
                intervals[sc.ref_metric] = percentile_interval(ref_boot)
                ri[sc.ri_metric] = relative_improvement(per.mean(), ref.mean())
                metrics[sc.ri_metric] = ri[sc.ri_metric]
                intervals[sc.ri_metric] = percentile_interval(
                    relative_improvement(boot, ref_boot))
        comparison: dict[str, Any] = {}
        comparison_probability: dict[str, Any] = {}
        for out, name, basis in ((comparison, "relative_improvement", DECISION_BASIS),
                                 (comparison_probability, "relative_improvement_probability",
                                  PROBABILITY_BASIS)):
            if name in ri:
                grid_ri = ri[f"{name}_grid"]
                resolved, words = direction_words(ri[name], intervals[name],
                                                  grid_ri if np.isfinite(grid_ri) else None)
                out.update({"resolved": resolved, "words": words, "basis": basis,
                            "segmentations_agree": bool(np.sign(ri[name]) == np.sign(grid_ri))})
        warnings = []
        if comparison and not comparison["segmentations_agree"]:
            warnings.append("SLIC and the grid segmentation rank the model and the reference "
                            "differently on the decision-target variant: R.I. is not a finding")
        if (comparison and comparison_probability and comparison["resolved"]
                and comparison_probability["resolved"]
                and np.sign(ri["relative_improvement"])
                != np.sign(ri["relative_improvement_probability"])):
            warnings.append("Vora et al.'s R.I. on the probability target and the R.I. on the "
                            "decision-target variant rank the model and the reference "
                            "differently: the probability target depends on the scale of the "
                            "logits")
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
                     "comparison_probability": comparison_probability,
                     "targets": {"brittle_score": "the model's probability of its own top "
                                 "class on the masked image (Vora et al.)",
                                 "brittle_score_decision": "1 where the masked image's top "
                                 "class is the model's top class on the unmasked image, else 0 "
                                 "(a variant; unchanged by a positive scaling of the logits)",
                                 "relative_improvement": DECISION_BASIS,
                                 "relative_improvement_probability": PROBABILITY_BASIS},
                     "num_masks": self.num_masks, "kernel_width": self.kernel_width,
                     "alpha": self.alpha, "reference": has_ref,
                     "note": "comparable only between models on the same data and segmentation",
                     "heatmaps": heatmaps},
            images=sink.images,
        )
