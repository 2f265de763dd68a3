"""How to split the CPU between the in-process executor's lanes: one shared onnxruntime pool, or
one single-threaded session per lane.

The demo's standard model on batches of 24 generated signs, for ``--seconds`` per layout:

1. one caller, one session with 1 intra-op thread (the unit);
2. one caller, one session with a thread per core (onnxruntime's default);
3. one caller per core calling one session whose pool spans every core;
4. one caller per core, each with its own 1-thread session;
5. one caller per core calling one 1-thread session (certify's lanes on the CPU: with one
   intra-op thread a run executes on its caller's thread, so callers do not queue).

Images per second, summed over callers. ``DeviceChoice.onnx_threads`` (certify/device.py)
follows from the comparison of 3 with 4 and 5.

Run: ``.venv/bin/python benchmarks/onnx_callers.py [--seconds 5]``
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import onnxruntime as ort

from certify.api import demo_model_path
from certify.demo.synthetic import generate


def _session(threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(demo_model_path("standard")), so,
                                providers=["CPUExecutionProvider"])


def _rate(sessions: list[ort.InferenceSession], seconds: float, batch: np.ndarray) -> float:
    """Images per second with one caller thread per entry of ``sessions``."""
    done = [0] * len(sessions)
    name = sessions[0].get_inputs()[0].name
    stop = time.perf_counter() + seconds

    def call(i: int) -> None:
        while time.perf_counter() < stop:
            sessions[i].run(None, {name: batch})
            done[i] += len(batch)

    for s in sessions:  # warm up
        s.run(None, {name: batch})
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(sessions))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def main() -> None:
    """Measure the five layouts and print a markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    x, _ = generate(1, seed=5)
    s0 = _session(1)
    shape = s0.get_inputs()[0].shape
    batch = x[:24].astype(np.float32) / 255.0
    if shape[1] == 3:  # NCHW
        batch = batch.transpose(0, 3, 1, 2)
    batch = np.ascontiguousarray(batch)
    shared = _session(cores)
    rows = [("1 caller, 1-thread session", _rate([s0], args.seconds, batch)),
            (f"1 caller, {cores}-thread session", _rate([shared], args.seconds, batch)),
            (f"{cores} callers, one {cores}-thread session",
             _rate([shared] * cores, args.seconds, batch)),
            (f"{cores} callers, each its own 1-thread session",
             _rate([s0] + [_session(1) for _ in range(cores - 1)], args.seconds, batch)),
            (f"{cores} callers, one 1-thread session (certify's lanes)",
             _rate([s0] * cores, args.seconds, batch))]
    unit = rows[0][1]
    print(f"demo standard model, batches of 24, {cores} cores, {args.seconds:g} s each")
    print("| layout | images/s | vs 1 thread |")
    print("|---|---:|---:|")
    for label, rate in rows:
        print(f"| {label} | {rate:,.0f} | {rate / unit:.2f} |")


if __name__ == "__main__":
    main()
