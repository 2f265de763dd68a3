"""The service under load and across a crash: concurrent submissions, SIGKILL and restart."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from service_fixture import CERTIFY, Service, job_processes, post_run, small_inputs

from builders import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _demo_model() -> Path:
    from certify.api import demo_model_path

    return demo_model_path("standard")


def _submit(svc: Service, token: str, suite: Path, samples: int, seed: int) -> str:
    r = post_run(svc, token, suite, samples=str(samples), seed=str(seed))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _measurement(svc: Service, run_id: str) -> dict:
    from certify.service.job import OUT_DIR

    doc = json.loads((svc.home / "store" / "runs" / run_id / OUT_DIR / "results.json")
                     .read_text())
    return doc["measurement"]


def _comparable(m: dict) -> dict:
    """A measurement without what legitimately differs between two runs of the same work."""
    return {k: v for k, v in m.items() if k not in ("certify_version",)}


def _await_records(svc: Service, ids: list[str], n: int) -> None:
    """Wait until ``n`` of the runs have records: in their worker's scratch folder while they
    run, in the store once they ended."""
    def has_records(run_id: str) -> bool:
        scratch = svc.home / "work" / "runs" / run_id / "out" / "records.jsonl"
        stored = svc.home / "store" / "runs" / run_id / "out" / "records.jsonl"
        return any(p.exists() and p.stat().st_size > 0 for p in (scratch, stored))

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(has_records(i) for i in ids) >= n:
            return
        time.sleep(0.1)
    pytest.fail("no run started\n" + svc.log())


def _follow(svc: Service, token: str, run_id: str, events: list[str]) -> None:
    """An event-stream client that stays connected until the server ends the stream."""
    with requests.get(f"{svc.url}/api/v1/runs/{run_id}/events", stream=True, timeout=60,
                      headers={"Authorization": f"Bearer {token}"}) as r:
        with contextlib.suppress(requests.RequestException):
            for line in r.iter_lines():
                if line.startswith(b"event: "):
                    events.append(line[7:].decode())


def test_sigterm_then_sigkill_mid_run_then_restart_completes_every_run_once(
        tmp_path: Path) -> None:
    """Issue 28 item 2: SIGTERM with runs running, queued and followed puts the running runs
    back on the queue (none ends ``error``), ends the event stream and shuts down within
    --lease seconds; then a crash (SIGKILL) mid-run; after each restart every run finishes
    once, with the measurement of an uninterrupted run."""
    suite, data = small_inputs(tmp_path / "in", per_class=4)
    home = tmp_path / "home"
    lease = 3.0
    args = ("--workers", "2", "--lease", str(lease), "--heartbeat", "0.5",
            "--dataset", f"small={data}")
    svc = Service(home, *args).start()
    token = svc.token("submit", "--max-concurrent", "10")
    seeds = [1, 2, 3, 4]
    ids = [_submit(svc, token, suite, samples=172, seed=s) for s in seeds]
    _await_records(svc, ids, 2)
    events: list[str] = []
    follower = threading.Thread(target=_follow, args=(svc, token, ids[0], events))
    follower.start()
    time.sleep(0.5)
    assert svc.proc is not None
    began = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    svc.proc.wait(30)
    took = time.monotonic() - began
    follower.join(10)
    assert took <= lease, f"shutdown took {took:.1f} s\n{svc.log()}"
    assert "shutdown" in events and not follower.is_alive(), events
    assert "SIGKILL" not in svc.log()
    svc = Service(home, *args)  # the same home and runs, a new port
    svc.start()
    states = [svc.get(f"/runs/{i}", token).json() for i in ids]
    assert all(d["state"] in ("queued", "running") and not d["error"] for d in states), states
    _await_records(svc, ids, 3)
    svc.kill()
    # The job processes die with the server (parent-death signal): no orphan keeps writing.
    deadline = time.monotonic() + 10
    while job_processes(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not job_processes(home)
    svc2 = Service(home, *args)
    svc2.port, svc2.url = svc.port, svc.url
    svc2.start()
    try:
        docs = [svc2.wait_run(i, token, timeout=600) for i in ids]
        assert [d["state"] for d in docs] == ["done"] * 4, [d.get("error") for d in docs]
        assert any(d["attempts"] >= 2 for d in docs)  # some were resumed
        listed = svc2.get("/runs?limit=500", token).json()
        assert listed["total"] == 4  # no run lost or duplicated
        # The same runs uninterrupted, on the restarted server: identical measurements.
        again = [_submit(svc2, token, suite, samples=172, seed=s) for s in seeds]
        for first, second in zip(ids, again, strict=True):
            assert svc2.wait_run(second, token, timeout=600)["state"] == "done"
            assert _comparable(_measurement(svc2, first)) == \
                _comparable(_measurement(svc2, second))
        # Each finished run is in the log exactly once.
        indices = [svc2.get(f"/runs/{i}", token).json()["log_index"] for i in ids + again]
        assert len(set(indices)) == 8
        assert svc2.get("/log").json()["tree_size"] == 8
    finally:
        svc2.stop()


def test_twenty_concurrent_submissions_all_complete(tmp_path: Path) -> None:
    suite, data = small_inputs(tmp_path / "in")
    svc = Service(tmp_path / "home", "--workers", "2", "--dataset", f"small={data}").start()
    try:
        token = svc.token("submit", "--max-concurrent", "20")
        with ThreadPoolExecutor(20) as pool:
            ids = list(pool.map(lambda i: _submit(svc, token, suite, samples=12, seed=i % 5),
                                range(20)))
        assert len(set(ids)) == 20
        docs = [svc.wait_run(i, token, timeout=900) for i in ids]
        assert all(d["state"] == "done" for d in docs), [d.get("error") for d in docs]
        # Correct results: runs with the same seed measured exactly the same, and the same as
        # `certify run` of that work outside the service.
        by_seed: dict[int, list[dict]] = {}
        for d in docs:
            by_seed.setdefault(d["options"]["seed"], []).append(
                _comparable(_measurement(svc, d["id"])))
        assert sorted(by_seed) == [0, 1, 2, 3, 4]
        for group in by_seed.values():
            assert all(m == group[0] for m in group)
        out = tmp_path / "cli"
        r = run_cli("run", _demo_model(), "--suite", suite, "--data", data, "--samples", "12",
                    "--seed", "3", "--out", out, "--no-pdf", "-q")
        assert r.returncode == 0, r.stderr
        cli = json.loads((out / "results.json").read_text())["measurement"]
        assert [c["metrics"] for c in cli["checks"]] == \
            [c["metrics"] for c in by_seed[3][0]["checks"]]
        assert svc.get("/log").json()["tree_size"] == 20
    finally:
        svc.stop()


def test_token_limits_and_cancelling_a_queued_run(tmp_path: Path) -> None:
    """With no workers nothing starts: the concurrency limit and the budget are exact."""
    suite, data = small_inputs(tmp_path / "in")
    svc = Service(tmp_path / "home", "--workers", "0", "--dataset", f"small={data}").start()
    try:
        limited = svc.token("submit", "--max-concurrent", "1")
        first = _submit(svc, limited, suite, samples=12, seed=0)
        r = post_run(svc, limited, suite)
        assert r.status_code == 429 and "limit is 1" in r.json()["detail"]
        r = svc.post(f"/runs/{first}/cancel", limited)
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        other = svc.token("submit")
        # another token's run answers as a missing one (issue 38)
        assert svc.post(f"/runs/{first}/cancel", other).status_code == 404
        _submit(svc, limited, suite, samples=12, seed=0)  # the slot is free again
        # A queued run holds the token's remaining query budget until it ends.
        budget = svc.token("submit", "--query-budget", "500")
        _submit(svc, budget, suite, samples=12, seed=0)
        r = post_run(svc, budget, suite)
        assert r.status_code == 429 and "held by its 1 queued" in r.json()["detail"]
    finally:
        svc.stop()


def test_model_refusals_time_limit_and_revocation(tmp_path: Path) -> None:
    """A model the runner refuses ends its run ``error`` with `certify run`'s own message; a
    run over the time limit is stopped; a revoked token is refused."""
    import onnx
    from onnx import TensorProto, helper

    suite, data = small_inputs(tmp_path / "in")
    slow = tmp_path / "slow.yaml"
    from builders import write_small_suite

    write_small_suite(slow, "slow", [{"id": "square", "kind": "attack", "params": {
        "attack": "square_linf", "epsilon": 0.03, "max_queries": 5000, "binarization": False}}])
    # A valid ONNX model that is no image classifier: it passes the static checks.
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7])])
    wrong = tmp_path / "wrong.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              str(wrong))
    svc = Service(tmp_path / "home", "--workers", "1", "--dataset", f"small={data}",
                  # long enough for a run's process to start and refuse the model on a loaded
                  # machine (two test workers, one of them running many service processes)
                  "--run-timeout", "12", "--heartbeat", "0.5").start()
    try:
        token = svc.token("submit")
        with wrong.open("rb") as m, suite.open("rb") as s:
            r = svc.post("/runs", token, files={"model": ("wrong.onnx", m),
                                                "suite_file": ("small.yaml", s)},
                         data={"dataset": "small"})
        assert r.status_code == 202, r.text
        doc = svc.wait_run(r.json()["id"], token)
        cli = run_cli("run", wrong, "--suite", suite, "--data", data, "--out", tmp_path / "cli")
        assert doc["state"] == "error" and doc["exit_code"] == cli.returncode != 0
        message = doc["error"].split(" (hint:")[0]
        assert message and message in " ".join(cli.stderr.split()), (doc["error"], cli.stderr)
        long = _submit(svc, token, slow, samples=40, seed=0)
        doc = svc.wait_run(long, token)
        assert doc["state"] == "error" and "time limit of 12 s" in doc["error"]
        assert not job_processes(svc.home, long)
        listed = subprocess.run([CERTIFY, "serve", "token", "list", "--home", str(svc.home)],
                                capture_output=True, text=True, check=True).stdout
        token_id = listed.split()[0]
        subprocess.run([CERTIFY, "serve", "token", "revoke", "--home", str(svc.home), token_id],
                       check=True, capture_output=True)
        r = svc.get("/runs", token)
        assert r.status_code == 401 and "revoked" in r.json()["detail"]
    finally:
        svc.stop()
