"""A run stopped midway and continued with --resume gives the uninterrupted run's metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from certify.canonical import canonical_json

import builders

pytestmark = pytest.mark.e2e

N = 1500


@pytest.fixture(scope="module")
def big_npz(net, tmp_path_factory) -> Path:
    x = builders.make_images(N, seed=11)
    y = builders.make_labels(net, x, seed=11)
    p = tmp_path_factory.mktemp("big") / "big.npz"
    np.savez(p, x=x, y=y)
    return p


def _args(model: Path, data: Path, out: Path, suite: Path) -> list[str]:
    # batch size 1: one durable append per sample, so the run is slow enough to interrupt
    return ["run", str(model), "--suite", str(suite), "--data", str(data), "--out", str(out),
            "--samples", str(N), "--batch-size", "1", "--no-pdf"]


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def uninterrupted(model_path, big_npz, clean_suite, tmp_path_factory) -> dict:
    full = tmp_path_factory.mktemp("full")
    args = _args(model_path, big_npz, full, clean_suite)
    args[args.index("--batch-size") + 1] = "256"  # batching must not change any figure
    assert builders.run_cli(*args).returncode == 1
    return json.loads((full / "results.json").read_text())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_run_resumes_to_same_metrics(sig, model_path, big_npz, uninterrupted,
                                                 clean_suite, tmp_path):
    expected = uninterrupted

    out = tmp_path / "cut"
    exe = Path(sys.executable).parent / "certify"
    proc = subprocess.Popen([str(exe), *_args(model_path, big_npz, out, clean_suite)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=builders.interruptible)
    deadline = time.monotonic() + 120
    while _lines(out / "records.jsonl") < 100 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=60)
    done = _lines(out / "records.jsonl")
    assert 100 <= done < N, "the run was not stopped midway"
    assert not (out / "results.json").exists()
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert "--resume" in stderr and "Traceback" not in stderr

    resumed = builders.run_cli(*_args(model_path, big_npz, out, clean_suite), "--resume")
    assert resumed.returncode == 1, resumed.stderr
    got = json.loads((out / "results.json").read_text())
    # the signed measurement is byte-identical to the uninterrupted run's (other batch size)
    assert builders.measurement(out) == canonical_json(expected["measurement"])
    # only the records found on disk, not those this run appended
    assert 100 <= got["provenance"]["timings"]["resumed_records"] <= done
    # every sample recorded exactly once
    ids = [json.loads(line)["i"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(ids) == list(range(N))
