"""The brittle score's onnxruntime calls are sized per model (issue 42 point 3): the size a
model's timed calls choose changes how fast the check runs, never its records."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import certify.checks.brittleness as brittleness
from certify.checks.base import CheckContext
from certify.checks.brittleness import Brittleness, CallSizer, call_sizer
from certify.data.loaders import Dataset
from certify.demo.synthetic import generate
from certify.device import choose_device, usable_cpus
from certify.models import onnx as onnx_model
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel, cpu_call_size

import builders

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def models(model_path, tmp_path_factory):
    """Two small CNNs (model and reference): timings do not matter here, outputs do."""
    dev = choose_device("cpu")
    ref = builders.export(builders.make_net(seed=1), tmp_path_factory.mktemp("ref") / "r.onnx")
    return OnnxModel(model_path, dev), OnnxModel(ref, dev)


@pytest.fixture(scope="module")
def images():
    x, _ = generate(1, seed=7, classes=[1, 14, 25, 38])
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float()[:4] / 255


def _spy(monkeypatch, model):
    """The sizes of ``model``'s onnxruntime calls, as they happen."""
    calls: list[int] = []
    run = model.session.run

    def counting(names, feed):
        calls.append(len(next(iter(feed.values()))))
        return run(names, feed)

    monkeypatch.setattr(model.session, "run", counting)
    return calls


def _records(check, models, images, monkeypatch, sizes):
    """The check's records (model and reference) with every model's calls forced to one of
    ``sizes``, and the sizes of the standard model's onnxruntime calls."""
    with monkeypatch.context() as mp:
        mp.setattr(brittleness, "call_sizer", lambda model: CallSizer(sizes))
        calls = _spy(mp, models[0])
        ctx = CheckContext(check_seed=3, device=torch.device("cpu"), class_names=[],
                           reference=QueryCounter(models[1]))
        counter = QueryCounter(models[0])
        recs = check.run_batch(counter, images, torch.zeros(len(images)),
                               list(range(len(images))), ctx)
    assert counter.queries == sum(r["queries"] for r in recs)
    return recs, calls


def test_records_are_bit_identical_whatever_the_call_size(models, images, monkeypatch):
    # 4 samples x 2 segmentations x 200 masks = 1,600 images per model: one hand-off, in calls
    # of 61 (cutting across samples), of 1,024 and 576, or timed ones of 64 to 512 and the rest
    check = Brittleness(num_masks=200, max_heatmaps=0)
    odd, calls_odd = _records(check, models, images, monkeypatch, (61,))
    large, calls_large = _records(check, models, images, monkeypatch, (1024,))
    timed, calls_timed = _records(check, models, images, monkeypatch, (64, 128, 256, 512))
    assert max(calls_odd) == 61 and max(calls_large) == 1024 and 64 in calls_timed
    assert sum(calls_odd) == sum(calls_large) == sum(calls_timed) == 1600
    assert odd == large == timed  # floats compared exactly, weights included
    data = Dataset(x=images, y=torch.zeros(len(images), dtype=torch.long),
                   ids=[str(i) for i in range(len(images))],
                   class_names=[f"c{k}" for k in range(43)], source="synthetic", layout="NCHW")
    metrics = [check.summarize([{**r, "i": i, "id": str(i)} for i, r in enumerate(recs)],
                               data).metrics for recs in (odd, large)]
    assert metrics[0] == metrics[1]


def test_the_sizer_times_each_size_then_takes_the_fastest():
    sizer = CallSizer((2, 4))
    assert sizer.size == 2  # the default before any timing (CPU_CHUNK is not a candidate)
    assert sizer.plan(10) == ([2, 4, 2, 2], 2)  # one call of each size timed, the rest at 2
    sizer.record(2, 1.0)  # 0.5 s per image
    sizer.record(4, 1.0)  # 0.25 s per image
    assert sizer.size == 4
    assert sizer.plan(10) == ([4, 2, 4], 2)  # timed until each size has two timings
    sizer.record(4, 1.0)
    sizer.record(2, 1.0)
    assert sizer.plan(3) == ([3], 0)  # a hand-off too small to time
    plans = [sizer.plan(10) for _ in range(brittleness._RETIME)]  # noqa: SLF001
    assert [timing for _, timing in plans].count(2) == 1  # timed again once every _RETIME
    assert plans[0] == ([4, 4, 2], 0)
    for _ in range(brittleness._KEEP):  # noqa: SLF001 - the load changed: 4 is slow now
        sizer.record(4, 40.0)
    assert sizer.size == 2 and len(sizer.times[4]) == brittleness._KEEP  # noqa: SLF001


def test_one_sizer_per_model_through_its_counters(models):
    sizer = call_sizer(QueryCounter(QueryCounter(models[0])))
    assert sizer is not None and sizer is call_sizer(QueryCounter(models[0]))
    assert sizer is not call_sizer(models[1])
    endpoint = SimpleNamespace(info=SimpleNamespace(provider="HTTP (v2)"))
    assert call_sizer(endpoint) is None
    fixed = SimpleNamespace(info=SimpleNamespace(provider="CPUExecutionProvider",
                                                 batch="fixed 8 (chunked)"))
    assert call_sizer(fixed) is None  # its calls are 8 images whatever the check asks


def test_cpu_call_size_sets_the_onnxruntime_calls_within_its_block(models, monkeypatch):
    m = models[0]
    calls = _spy(monkeypatch, m)
    x = torch.rand(600, *m.input_shape)
    default = m.predict(x)
    with cpu_call_size(512):
        sized = m.predict(x)
    assert calls == [onnx_model.CPU_CHUNK, onnx_model.CPU_CHUNK, 88, 512, 88]
    assert torch.equal(default, sized)
    with pytest.raises(ValueError):
        with cpu_call_size(0):
            pass


def test_masked_images_are_the_same_bits_on_any_number_of_threads(models, images, monkeypatch):
    # issue 66: a hand-off is built on as many threads as a model call computes on; each row
    # is written by one thread, so the records cannot depend on it
    check = Brittleness(num_masks=200, max_heatmaps=0)
    recs = {}
    for threads in (1, 2, 3):
        with monkeypatch.context() as mp:
            mp.setattr(brittleness, "build_threads", lambda models, t=threads: t)
            recs[threads], _ = _records(check, models, images, monkeypatch, (1024,))
    assert recs[1] == recs[2] == recs[3]
    jobs = [brittleness._Job(img, brittleness.grid_segment(32, 32, 16),  # noqa: SLF001
                             check.masks(16, i)) for i, img in enumerate(images)]
    piece = [(0, 150, 200), (1, 0, 200), (2, 0, 37)]  # cut across jobs, as _chunks does
    with ThreadPoolExecutor(4) as pool:
        built = [brittleness._build(jobs, piece, pool=pool, parts=parts).clone()  # noqa: SLF001
                 for parts in (1, 2, 5)]
    assert all(torch.equal(built[0], b) for b in built[1:])
    assert torch.equal(built[0][50:250], jobs[1].images(0, 200))


def test_row_runs_cover_every_row_once_in_equal_runs():
    piece = [(0, 150, 200), (1, 0, 200), (2, 0, 37)]  # 287 rows
    for parts in (1, 2, 3, 4, 9):
        runs = brittleness._row_runs(piece, parts)  # noqa: SLF001
        # at most one run per _MIN_RUN rows, so no thread gets a sliver
        assert len(runs) == max(1, min(parts, 287 // brittleness._MIN_RUN))  # noqa: SLF001
        rows = [(j, a + r) for run in runs for j, a, b, _ in run for r in range(b - a)]
        assert sorted(rows) == sorted((j, a + r) for j, a, b in piece for r in range(b - a))
        outs = sorted(at + r for run in runs for _, a, b, at in run for r in range(b - a))
        assert outs == list(range(287))
        sizes = [sum(b - a for _, a, b, _ in run) for run in runs]
        assert max(sizes) - min(sizes) <= 1


def test_build_threads_follow_the_model_calls_threads(model_path):
    # the engine's lanes: their share of the cores each (one on 2 cores), so a lane builds on
    # that many; a single caller's session on onnxruntime's default builds on every CPU this
    # process may use; an endpoint on one
    dev = choose_device("cpu")
    lane = OnnxModel(model_path, dev, threads=1)
    default = OnnxModel(model_path, dev)
    assert brittleness.build_threads([QueryCounter(lane)]) == 1
    assert brittleness.build_threads([default]) == default.cpu_threads == usable_cpus()
    assert brittleness.build_threads([default, QueryCounter(lane)]) == 1
    endpoint = SimpleNamespace(info=SimpleNamespace(provider="HTTP (v2)"))
    assert brittleness.build_threads([default, endpoint]) == 1
    # the pool's threads sleep soon after a call, so the build gets the cores
    opts = default.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.spin_duration_us") == str(
        onnx_model.SPIN_US)


def test_a_thread_keeps_small_buffers_and_drops_large_ones():
    def kept():
        return getattr(brittleness._KEPT, "buffers", [])  # noqa: SLF001

    def run() -> tuple[list, list]:
        small = brittleness._buffers(2, (2000, 3, 1024))  # noqa: SLF001 - 2 x 24.6 MB
        again = brittleness._buffers(1, (100, 3, 1024))  # noqa: SLF001
        assert np.shares_memory(small[0], again[0])  # reused, not mapped afresh
        mid = list(kept())
        brittleness._buffers(1, (2000, 3, 3000))  # noqa: SLF001 - 72 MB: over _KEPT_BYTES
        return mid, list(kept())

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: the test's thread keeps none
        mid, after = pool.submit(run).result()
    assert len(mid) == 2 and after == []


def test_one_softmax_per_hand_off_gives_each_call_s_own_values(models):
    # the scores of a hand-off's calls go through one softmax and one argmax; each row's
    # values are those of a softmax and argmax of its own call's scores
    m = models[0]
    imgs = torch.rand(600, *m.input_shape)
    probs, tops = brittleness.predict_handoff(m, imgs, CallSizer((61,)))
    with cpu_call_size(61):
        scores = [m.predict(imgs[a:a + 61]) for a in range(0, 600, 61)]
    assert np.array_equal(probs, np.concatenate([torch.softmax(s, 1).numpy() for s in scores]))
    assert np.array_equal(tops, np.concatenate([s.argmax(1).numpy() for s in scores]))


def test_predictions_outlive_the_thread_s_kept_buffers(models, images):
    # a thread reuses its buffers on its next call: nothing returned may point into them
    check = Brittleness(num_masks=200, max_heatmaps=0)
    seg = brittleness.grid_segment(32, 32, 16)
    first = brittleness.predict_jobs(  # noqa: SLF001 - the job type is private
        [models[0]], [brittleness._Job(images[0], seg, check.masks(16, 0))])[0][0]  # noqa: SLF001
    kept = (first.probs.copy(), first.labels.copy())
    brittleness.predict_jobs([models[0]], [brittleness._Job(  # noqa: SLF001
        images[1], seg, check.masks(16, 1))])
    assert np.array_equal(first.probs, kept[0]) and np.array_equal(first.labels, kept[1])


def test_a_failure_on_a_build_thread_reaches_the_caller(images, monkeypatch):
    check = Brittleness(num_masks=200, max_heatmaps=0)
    jobs = [brittleness._Job(img, brittleness.grid_segment(32, 32, 16),  # noqa: SLF001
                             check.masks(16, i)) for i, img in enumerate(images)]
    write = brittleness._write  # noqa: SLF001
    caller = threading.get_ident()

    def failing(jobs, out, run):
        if threading.get_ident() != caller:
            raise MemoryError("planted on a build thread")
        write(jobs, out, run)

    monkeypatch.setattr(brittleness, "_write", failing)
    with ThreadPoolExecutor(1) as pool, pytest.raises(MemoryError, match="planted"):
        brittleness._build(jobs, [(0, 0, 200), (1, 0, 200)], pool=pool, parts=2)  # noqa: SLF001
