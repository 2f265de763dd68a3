"""--executor ray: a local Ray instance on 127.0.0.1, started by certify, gives the local metrics.

Covers the demo (a small suite of every check kind) and a suite with an attack in budget rounds
on 2 workers, a worker killed mid-run, resume across executors both ways, the run-wide budget
across workers, and the install hint without Ray.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from certify.errors import CARD_WRITTEN_CODES, EXIT_ERROR

import builders

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLASSES = [f"c{i}" for i in range(43)]
N = 48


@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("ray") / "d.npz", N,
                                       seed=31)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("raysuite") / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "ray-test", "classes": CLASSES, "seed": 9,
                                    "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "rotation", "kind": "corruption",
         "params": {"property": "rotation", "bound": 15, "steps": 4}},
        # the threat model's white-box attack runs first and hands its breaks on to square
        # (issue 62: under Ray they were attacked again, and square's row differed)
        {"id": "apgd", "kind": "attack", "samples": 32, "params": {
            "attack": "apgd_ce", "norm": "linf", "epsilon": 0.15, "eps_sweep": False,
            "attack_params": {"iterations": 10, "restarts": 1}, "binarization": False}},
        # rounds (max_queries: auto) are synchronised across workers and resumes
        {"id": "square", "kind": "attack", "samples": 32, "params": {
            "attack": "square_linf", "epsilon": 0.15, "max_queries": "auto",
            "initial_queries": 40, "query_cap": 320, "binarization": False}},
        {"id": "noise", "kind": "corruption",
         "params": {"property": "gaussian_noise", "bound": 0.1, "steps": 3, "max_draws": 128}},
    ]}))
    return path


def _args(model: Path, suite: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(model), "--suite", str(suite), "--data", str(data), "--out", str(out),
            "--no-pdf", *extra]


@pytest.fixture(scope="module")
def local(model_path, suite, data, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("local") / "run"
    proc = builders.run_cli(*_args(model_path, suite, data, out, "--batch-size", "8"))
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    return builders.measurement(out)


def _popen(*args: str) -> subprocess.Popen[str]:
    exe = Path(sys.executable).parent / "certify"
    return subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=builders.interruptible)


def _wait_for_record(out: Path, check: str, proc: subprocess.Popen[str], timeout: float = 120
                     ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = out / "records.jsonl"
        if path.exists() and f'"check":"{check}"' in path.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no {check} record within {timeout} s")


def _ray_processes(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """The processes of the Ray instance that the certify process ``proc`` started (its
    descendants: Ray's servers and workers), never another run's on the same machine."""
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _ray_workers(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    found = []
    for p in _ray_processes(proc):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if cmd.startswith("ray::_Worker"):
            found.append(p)
    return found


def _listening_addresses(proc: subprocess.Popen[str]) -> set[str]:
    addrs = set()
    for p in _ray_processes(proc):
        try:
            conns = p.net_connections(kind="tcp")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        addrs |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
    return addrs


def test_demo_on_two_workers_matches_the_local_run(demo_small_suite, demo_small_run, tmp_path):
    """The demo (a small suite with one check of each kind, the reference model included)."""
    out = tmp_path / "ray-demo"
    proc = _popen("demo", "--suite", str(demo_small_suite), "--out", str(out), "--no-pdf",
                  "--executor", "ray", "--workers", "2")
    _wait_for_record(out, "clean", proc, timeout=300)
    addrs = _listening_addresses(proc)  # while Ray runs: nothing but loopback
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    assert addrs and addrs <= {"127.0.0.1", "::ffff:127.0.0.1"}, addrs
    # the signed measurement is byte-identical to the local run's
    assert builders.measurement(out) == builders.measurement(demo_small_run)


def test_killed_worker_is_replaced(model_path, suite, data, local, tmp_path):
    out = tmp_path / "run"
    proc = _popen(*_args(model_path, suite, data, out, "--executor", "ray", "--workers", "2"))
    _wait_for_record(out, "square", proc)
    victims = _ray_workers(proc)
    assert victims, "no Ray worker process found"
    # the workers do the run's work at the driver's priority (Ray's default niceness of 15
    # left them a few percent of a core beside other work: 365 s against 46 s)
    assert {v.nice() for v in victims} == {psutil.Process(proc.pid).nice()}
    victims[0].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode in CARD_WRITTEN_CODES, stderr
    assert "died; replacing it" in stderr
    assert builders.measurement(out) == local
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    keys = [(r["check"], r["i"]) for r in rows]
    assert len(keys) == len(set(keys)), "no sample recorded twice"


@pytest.mark.parametrize("first, then", [("local", "ray"), ("ray", "local")])
def test_resume_across_executors(first, then, model_path, suite, data, local, tmp_path):
    out = tmp_path / "run"
    proc = _popen(*_args(model_path, suite, data, out, "--executor", first, "--batch-size",
                         "4"))
    # cut during rotation (the check before square): the tail after square's first record is
    # short enough for the run to end before the signal lands on a loaded machine; square's
    # rounds then all run on the other executor
    _wait_for_record(out, "rotation", proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    kept = (out / "records.jsonl").read_text().splitlines()
    proc = builders.run_cli(*_args(model_path, suite, data, out, "--executor", then,
                                   "--resume"))
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.measurement(out) == local
    rows = (out / "records.jsonl").read_text().splitlines()
    assert rows[:len(kept)] == kept
    keys = [(json.loads(r)["check"], json.loads(r)["i"]) for r in rows]
    assert len(keys) == len(set(keys))


def test_run_budget_holds_across_workers(model_path, suite, data, tmp_path):
    out = tmp_path / "run"
    proc = builders.run_cli(*_args(model_path, suite, data, out, "--executor", "ray",
                                   "--query-budget", "2000"))
    assert proc.returncode == EXIT_ERROR, proc.stderr  # a check ran out of queries
    r = json.loads((out / "results.json").read_text())
    assert r["measurement"]["queries"]["total"] <= 2000
    errored = [c for c in r["measurement"]["checks"] if c["status"] == "ERROR"]
    assert errored and all("budget" in c["error"] for c in errored)


def test_without_ray_the_hint_says_how_to_install(model_path, suite, data, tmp_path):
    code = ("import sys; sys.modules['ray'] = None; from certify.cli import main; "
            "sys.argv = ['certify'] + sys.argv[1:]; main()")
    proc = subprocess.run([sys.executable, "-c", code,
                           *_args(model_path, suite, data, tmp_path / "o", "--executor", "ray")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert 'certify[ray]' in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # the executor is a pre-check: no run folder


def test_endpoint_concurrency_and_budget_hold_across_workers(model_path, suite, data,
                                                             tmp_path):
    from servers import OnnxHttpServer

    server = OnnxHttpServer(model_path)
    try:
        proc = builders.run_cli(*_args(server.v2_url, suite, data, tmp_path / "run",
                                       "--executor", "ray", "--workers", "2",
                                       "--concurrency", "2", "--http-batch", "4",
                                       "--query-budget", "2000"))
        served = server.images_served
        too_many = builders.run_cli(*_args(server.v2_url, suite, data, tmp_path / "o",
                                           "--executor", "ray", "--workers", "3",
                                           "--concurrency", "2"))
    finally:
        server.stop()
    assert proc.returncode == EXIT_ERROR, proc.stderr  # a check ran out of queries
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    traffic = r["provenance"]["traffic"]["model"]
    # one request in flight per worker, and a hedge beside it at most (≤ 5% of requests)
    assert 1 <= server.max_in_flight <= 2 + min(2, traffic["hedges"]), server.max_in_flight
    assert traffic["hedges"] <= 0.05 * traffic["requests"]
    assert r["measurement"]["queries"]["total"] <= 2000
    # the workers' traffic is added to the driver's: every image the server ran is accounted,
    # a hedge's images too unless its loser was closed before the server ran it; where a
    # worker's counts could only be read as of an earlier reply (it was replaced, or its final
    # counts could not be read: both logged), the card says its counts are a lower bound
    said = (proc.stderr, traffic)
    assert traffic["images"] <= served, said
    if traffic["workers_counted_early"] == 0:
        assert served <= traffic["images"] + traffic["hedged_images"], said
    else:
        assert "ray worker" in proc.stderr, said
    checks = r["measurement"]["checks"]
    assert any(c["status"] == "ERROR" and "budget" in c["error"] for c in checks)
    assert too_many.returncode == 2 and "--concurrency" in too_many.stderr


def test_ray_flags_without_the_ray_executor_are_refused(model_path, suite, data, tmp_path):
    proc = builders.run_cli(*_args(model_path, suite, data, tmp_path / "o", "--workers", "3"))
    assert proc.returncode == 2 and "--executor ray" in proc.stderr
