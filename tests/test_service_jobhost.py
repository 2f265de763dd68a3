"""Warm job hosts (issue 53 point 4): runs forked from a process that imported them once.

A real ``certify serve`` with one worker slot, so that its one job host forks every run. The
worker's log names, for each run, the child that ran it and the host that forked it
(``run ID: process P in job host H``) and each host's readiness.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest
from service_fixture import Service, job_processes, post_run, slow_attack_suite, small_inputs

pytestmark = pytest.mark.e2e

_PLACED = re.compile(r"run ([0-9a-f]{32}): process (\d+) in job host (\d+)")
_READY = re.compile(r"job host (\d+) ready \(imports [0-9.]+ s of CPU, (\d+) thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small suite (clean accuracy, noise) and its data."""
    return small_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def slow_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A suite whose run lasts long enough to be interrupted (Square L∞, 2,000 queries)."""
    return slow_attack_suite(tmp_path_factory.mktemp("slow"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, inputs: tuple[Path, Path]):
    """One service with one worker slot (so one job host at a time)."""
    home = tmp_path_factory.mktemp("jobhost") / "home"
    svc = Service(home, "--workers", "1", "--dataset", f"small={inputs[1]}",
                  "--heartbeat", "0.5", "--lease", "5").start()
    yield svc
    svc.stop()


def _submit(svc: Service, token: str, suite: Path, samples: int = 12, seed: int = 0) -> str:
    r = post_run(svc, token, suite, samples=str(samples), seed=str(seed))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _placed(svc: Service) -> list[tuple[str, int, int]]:
    """(run id, child pid, host pid) of each start of a run, in order."""
    return [(m.group(1), int(m.group(2)), int(m.group(3)))
            for m in _PLACED.finditer(svc.log())]


def _ready(svc: Service) -> list[tuple[int, int]]:
    """(host pid, its threads) of each job host that became ready, in order."""
    return [(int(m.group(1)), int(m.group(2))) for m in _READY.finditer(svc.log())]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _first_log_time(svc: Service, run_id: str) -> dt.datetime:
    """When the run's process wrote its first log line (its job.log, as the store has it)."""
    text = (svc.home / "store" / "runs" / run_id / "job.log").read_text()
    stamp = re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", text, re.M)
    assert stamp, text
    return dt.datetime.strptime(stamp.group(0), "%Y-%m-%d %H:%M:%S,%f")


def _placed_time(svc: Service, run_id: str, child: int) -> dt.datetime:
    """When the worker logged that the run's process was forked."""
    for line in svc.log().splitlines():
        if f"run {run_id}: process {child} in job host" in line:
            return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"no start of {run_id} in the log")


def _running_child(svc: Service, run_id: str, token: str) -> int:
    """The pid of the run's process once it has written records."""
    svc.wait_run(run_id, token, states=("running",))
    records = svc.home / "work" / "runs" / run_id / "out" / "records.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = job_processes(svc.home, run_id)
        if pids and records.exists() and records.stat().st_size > 0:
            return pids[0]
        time.sleep(0.05)
    pytest.fail(f"run {run_id} did not start computing\n{svc.log()}")


def _measurement(svc: Service, run_id: str) -> dict:
    doc = json.loads((svc.home / "store" / "runs" / run_id / "out" / "results.json")
                     .read_text())
    return {k: v for k, v in doc["measurement"].items() if k != "certify_version"}


def test_runs_in_a_row_are_forked_by_one_warm_host(
        service: Service, inputs: tuple[Path, Path]) -> None:
    """Two runs in a row are children of the same job host, which imported once (one ready
    report, one thread when it forks); each child logs its first line within a fraction of the
    seconds a fresh interpreter spends importing certify and torch."""
    suite, _ = inputs
    token = service.token("submit")
    ids = []
    for seed in (1, 2):
        ids.append(_submit(service, token, suite, seed=seed))
        assert service.wait_run(ids[-1], token)["state"] == "done"
    placed = {rid: (child, host) for rid, child, host in _placed(service)}
    (child1, host1), (child2, host2) = placed[ids[0]], placed[ids[1]]
    assert host1 == host2 and child1 != child2, placed
    assert _alive(host1) and b"certify.service.jobhost" in Path(
        f"/proc/{host1}/cmdline").read_bytes()
    assert _ready(service).count((host1, 1)) == 1, service.log()
    for rid, child in zip(ids, (child1, child2), strict=True):
        gap = (_first_log_time(service, rid) - _placed_time(service, rid, child))
        assert gap.total_seconds() < 1.5, (rid, gap)
    assert not job_processes(service.home)  # each child exited with its run


def test_a_crashing_child_ends_its_run_error_and_the_host_serves_the_next_run(
        service: Service, inputs: tuple[Path, Path], slow_suite: Path) -> None:
    """A run's process that aborts (as a model crashing its runtime ends it) ends the run
    ``error`` saying so, as the job process did; its job host lives on and forks the next
    run."""
    suite, _ = inputs
    token = service.token("submit")
    run = _submit(service, token, slow_suite, samples=40)
    child = _running_child(service, run, token)
    host = _parent(child)
    os.kill(child, signal.SIGABRT)
    doc = service.wait_run(run, token)
    assert doc["state"] == "error" and "SIGABRT" in doc["error"], doc
    assert doc["attempts"] == 1
    assert _alive(host)
    nxt = _submit(service, token, suite, seed=3)
    assert service.wait_run(nxt, token)["state"] == "done"
    assert [h for rid, _c, h in _placed(service) if rid == nxt] == [host]


@pytest.mark.slow
def test_sigkill_of_the_job_host_mid_run_loses_nothing(
        service: Service, inputs: tuple[Path, Path], slow_suite: Path) -> None:
    """A job host killed while its child computes takes the child with it (parent-death
    signal); the run goes back on the queue, a fresh host resumes it from its records, and it
    ends ``done`` with a valid card and the measurement of an uninterrupted run."""
    token = service.token("submit")
    run = _submit(service, token, slow_suite, samples=16, seed=5)
    child = _running_child(service, run, token)
    # issue 60: a running run's folder and its job log are the service user's only
    folder = service.home / "work" / "runs" / run
    log = Path(os.readlink(f"/proc/{child}/fd/1"))
    assert log == folder / "job.log"
    assert [stat.S_IMODE(p.stat().st_mode) for p in (folder, folder / "out", log)] == [
        0o700, 0o700, 0o600]
    host = _parent(child)
    os.kill(host, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the run's process outlived its job host"
    doc = service.wait_run(run, token)
    assert doc["state"] == "done" and doc["attempts"] >= 2, doc
    hosts = [h for rid, _c, h in _placed(service) if rid == run]
    assert hosts[0] == host and hosts[-1] != host, hosts
    assert hosts[-1] in [h for h, _t in _ready(service)]
    card = service.get(f"/runs/{run}/card.html", token)
    assert card.status_code == 200
    v = service.post("/verify", files={"file": ("card.html", card.content)}).json()
    assert v["valid"] is True and v["run_id"] == run, v
    again = _submit(service, token, slow_suite, samples=16, seed=5)
    assert service.wait_run(again, token)["state"] == "done"
    assert _measurement(service, run) == _measurement(service, again)


def _readable_memory(pid: int) -> bytes:
    """Every readable mapping of process ``pid`` (needs ptrace rights: root here)."""
    out = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            lo, hi = (int(v, 16) for v in span.split("-"))
            try:
                mem.seek(lo)
                out.append(mem.read(hi - lo))
            except (OSError, OverflowError, ValueError):
                continue
    return b"".join(out)


def test_a_runs_secret_never_passes_through_the_host(tmp_path: Path) -> None:
    """The attack: a host that read run A's secret keeps copies of it in freed memory, which
    every child it forks later (another tenant's run) inherits. The secret goes from the
    worker into the child's own pipe instead: after run A the host's whole memory holds no
    copy, and the child got it (it ends with its run's own failure, not at the pipe)."""
    from certify.service.jobhost import JobHost

    if os.geteuid() != 0:
        pytest.skip("reading another process's memory needs root here")
    host = JobHost("secret-test")
    try:
        folder = tmp_path / "run"
        folder.mkdir()
        secret = "certify-secret-" + os.urandom(12).hex()
        job = host.run(folder, secret, 4 << 30)
        assert job.wait(120), "the child did not end"
        assert host.pid is not None
        memory = _readable_memory(host.pid)
        assert len(memory) > 10_000_000  # the host's imports were read
        assert secret.encode() not in memory
        # the child read its secret and went on to the job (which has no job.json here)
        log = (folder / "job.log").read_text(errors="replace")
        assert secret not in log
        assert job.returncode not in (None, 70), (job.returncode, log[-2000:])
    finally:
        host.close()


def test_a_frozen_job_host_never_hides_a_finished_run(
        service: Service, inputs: tuple[Path, Path], slow_suite: Path) -> None:
    """Issue 65: a job host stopped (SIGSTOP) while its run computes. The run's child writes
    its outcome and exits; the host can neither reap it nor report it. The worker sees the
    child's end itself (its pidfd), replaces the silent host, and records the run ``done``
    with its measurement within a couple of heartbeats; the next run starts on a new host."""
    suite, _ = inputs
    token = service.token("submit")
    run = _submit(service, token, slow_suite, samples=8, seed=11)
    child = _running_child(service, run, token)
    host = _parent(child)
    os.kill(host, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 300
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the run did not finish"
        exited = time.monotonic()
        doc = service.wait_run(run, token)
        waited = time.monotonic() - exited
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(host, signal.SIGCONT)
    assert doc["state"] == "done", doc
    assert waited < 4.0, waited  # heartbeat 0.5 s; the host gets 1 s to report
    assert not _alive(host)
    assert "has not reported it: the host is replaced" in service.log()
    assert _measurement(service, run)["verdict"]
    nxt = _submit(service, token, suite, seed=12)
    assert service.wait_run(nxt, token)["state"] == "done"
    hosts = [h for rid, _c, h in _placed(service) if rid == nxt]
    assert hosts and hosts[0] != host, hosts
