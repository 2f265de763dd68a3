"""Worker threads: claim a run, start its process, watch it, record how it ended.

Each of ``--workers N`` threads runs one run at a time in a process of its own, forked by the
thread's warm job host (:mod:`certify.service.jobhost`: a process that has imported certify,
torch and the card's renderers once, so that a run starts computing at once), with an
address-space limit and a wall-clock limit, in its own process group, with the parent-death
signal set: a model that crashes or hangs ends its run ``error``, and a killed server (or a
killed job host) leaves no orphan writing to the store. While the process runs the thread
renews the run's lease (carrying its progress) every heartbeat; a cancelled run's process group
is killed. A run whose job host died under it goes back on the queue and resumes from its
records; the host is replaced. A finished run's signed statement is appended to the
transparency log. A run submitted to this process is claimed at once (:func:`queue.on_enqueue`);
runs submitted elsewhere are found by polling every :data:`CLAIM_POLL_S` seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from certify.errors import EXIT_INTERNAL, EXIT_INTERRUPTED
from certify.rundir import RECORDS_FILE, RUN_FILE
from certify.service import job, queue
from certify.service.config import ServeConfig
from certify.service.db import CANCELLED, DONE, ERROR, QUEUED, RUNNING, Run, RunOptions, utcnow
from certify.service.jobhost import HostBroken, HostDied, JobHost, JobProcess
from certify.service.private import make_private_dir
from certify.service.store import (
    NotInStore,
    Store,
    StoreError,
    fetch_file,
    fetch_tree,
    read_bytes,
    run_prefix,
)

if TYPE_CHECKING:
    from certify.service.secrets import SecretBox
    from certify.service.tlog import TransparencyLog

log = logging.getLogger("certify.service")

#: A run's records go to the store in a new segment every this many records or seconds.
SEGMENT_RECORDS, SEGMENT_SECONDS = 256, 10.0
#: An idle worker looks for runs submitted to other processes this often (seconds).
CLAIM_POLL_S = 0.5
#: Seconds a job host has to report a run's child that the kernel says has exited, before the
#: worker takes the host for frozen (stopped, wedged) and replaces it: the run's outcome, if
#: the child wrote one, is then recorded as if the host had reported it.
HOST_SILENT_S = 1.0
#: Attempts of one run that may each lose their job host before the run ends an error.
HOST_ATTEMPTS = 5
_ATTEMPT_DIR = re.compile(r"[0-9]{4,}")
_SEGMENT_NAME = re.compile(r"([0-9]{8})\.jsonl")


class RecordSegments:
    """A run's records in the store as numbered segments,
    ``runs/<id>/records/<attempt>/<n>.jsonl``: each attempt (each claim of the run) writes
    its own series, so a worker that lost its lease and still writes cannot spoil the series
    that another worker resumes from.

    :meth:`restore` rebuilds ``records.jsonl`` from the latest earlier attempt's series (its
    segments from 0 up to the first gap; or a finished or pre-segment run's
    ``out/records.jsonl``), cut to its last complete line, and the first :meth:`poll` sends
    that as this attempt's segment 0. While the run's process appends to ``records.jsonl``,
    :meth:`poll` sends the complete lines written since the last segment as the next segment
    once there are :data:`SEGMENT_RECORDS` of them or :data:`SEGMENT_SECONDS` have passed: a
    worker lost with its machine loses at most the records of its last segment. ``run.json``
    (the run's fingerprint) goes with the first poll. :meth:`publish` sends the finished run's
    files; :meth:`cleanup` drops the series once the run's end is recorded.
    """

    def __init__(self, store: Store, run_id: str, attempt: int, out: Path,
                 every: int = SEGMENT_RECORDS, seconds: float = SEGMENT_SECONDS) -> None:
        self.store, self.out, self.every, self.seconds = store, out, every, seconds
        self.base = run_prefix(run_id)
        self.attempt = attempt
        self.next = 0
        self.offset = 0
        self._last = time.monotonic()
        self._run_sent: bytes | None = None

    def _segment(self, n: int, attempt: int | None = None) -> str:
        return f"{self.base}/records/{attempt or self.attempt:04d}/{n:08d}.jsonl"

    def _series(self) -> dict[int, set[int]]:
        found: dict[int, set[int]] = {}
        for key in self.store.list(f"{self.base}/records/"):
            parts = key.split("/")
            m = _SEGMENT_NAME.fullmatch(parts[-1])
            if len(parts) >= 2 and _ATTEMPT_DIR.fullmatch(parts[-2]) and m:
                found.setdefault(int(parts[-2]), set()).add(int(m.group(1)))
        return found

    def restore(self) -> int:
        """Rebuild ``records.jsonl`` and ``run.json`` from the store; the records restored."""
        records = self.out / RECORDS_FILE
        series = self._series()
        earlier = [a for a, ns in series.items() if a < self.attempt and 0 in ns]
        with records.open("wb") as f:
            if earlier:
                best, n = max(earlier), 0
                while n in series[best]:
                    f.write(read_bytes(self.store, self._segment(n, best)))
                    n += 1
        if not earlier and self.store.size(f"{self.base}/{job.OUT_DIR}/{RECORDS_FILE}"):
            fetch_file(self.store, f"{self.base}/{job.OUT_DIR}/{RECORDS_FILE}", records)
        data = records.read_bytes()
        complete = data[:data.rfind(b"\n") + 1]  # a torn last line is the job's to redo
        if complete != data:
            records.write_bytes(complete)
        try:
            fetch_file(self.store, f"{self.base}/{job.OUT_DIR}/{RUN_FILE}",
                       self.out / RUN_FILE)
        except NotInStore:
            pass
        if not complete:
            records.unlink()  # nothing to resume
            return 0
        n = complete.count(b"\n")
        log.info("%s: resuming from %d records in the store", self.base, n)
        return n

    def poll(self, force: bool = False) -> None:
        """Send ``run.json`` if it changed, and the next segment if it is due (``force``:
        whatever complete lines there are)."""
        from certify.service.store import put_bytes

        run_file = self.out / RUN_FILE
        if run_file.exists():
            data = run_file.read_bytes()
            if data != self._run_sent:
                put_bytes(self.store, f"{self.base}/{job.OUT_DIR}/{RUN_FILE}", data)
                self._run_sent = data
        records = self.out / RECORDS_FILE
        try:
            size = records.stat().st_size
        except FileNotFoundError:
            return
        if size <= self.offset:
            return
        due = force or time.monotonic() - self._last >= self.seconds
        with records.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        chunk = chunk[:chunk.rfind(b"\n") + 1]  # complete lines only: one may be in flight
        lines = chunk.count(b"\n")
        if lines == 0 or not (due or lines >= self.every):
            return
        put_bytes(self.store, self._segment(self.next), chunk)
        self.offset += len(chunk)
        self.next += 1
        self._last = time.monotonic()

    def flush(self) -> None:
        """Send what is left (the run's process has ended); a store that does not answer is
        logged: the records are then lost with this node, as the segments allow."""
        try:
            self.poll(force=True)
        except StoreError as exc:
            log.warning("%s: the last records did not reach the store: %s", self.base, exc)

    def publish(self) -> None:
        """Send the finished run's written files (card, results, signature, the whole
        records file) to ``runs/<id>/out/``."""
        for path in sorted(self.out.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                rel = path.relative_to(self.out).as_posix()
                with path.open("rb") as f:
                    self.store.put(f"{self.base}/{job.OUT_DIR}/{rel}", f)

    def cleanup(self) -> None:
        """Drop every attempt's segments (the run's end is recorded; ``out/records.jsonl``
        holds them all)."""
        from certify.service.store import delete_prefix

        try:
            delete_prefix(self.store, f"{self.base}/records")
        except StoreError as exc:
            log.warning("%s: its records segments stay in the store: %s", self.base, exc)


def input_keys(run: Run) -> list[str]:
    """The store keys (or key prefixes, ending in ``/``) a run reads: its model's folder, its
    uploaded suite and dataset, its reference and surrogate models' folders."""
    opts: RunOptions = run.options or {}
    keys = []
    for ref in (run.model_ref if run.model_kind == "onnx" else None, opts.get("reference"),
                opts.get("surrogate")):
        if ref:  # models/<digest>/<name>.onnx: the whole folder (external data)
            keys.append(ref.rsplit("/", 1)[0] + "/")
    for ref in (run.suite, run.dataset):
        if ref.startswith("store:"):
            keys.append(ref.removeprefix("store:"))
    return keys


def job_spec(run: Run, cfg: ServeConfig, inputs: Path) -> dict[str, object]:
    """The job.json of a run: everything its process needs, no secret. ``inputs`` is the
    node-local folder the run's inputs (:func:`input_keys`) were copied into, by key."""
    opts: RunOptions = run.options or {}
    if run.model_kind == "onnx":
        model = str(inputs / run.model_ref)
    else:
        model = run.model_ref
    data = (str(inputs / run.dataset.removeprefix("store:"))
            if run.dataset.startswith("store:") else str(cfg.datasets[run.dataset]))
    suite = (str(inputs / run.suite.removeprefix("store:"))
             if run.suite.startswith("store:") else run.suite)
    reference, surrogate = opts.get("reference"), opts.get("surrogate")
    # what the signed card says of the data and suite: names, never the server's paths
    public = {
        "data_source": (f"uploaded dataset {run.dataset.rsplit('/', 1)[-1][:16]}"
                        if run.dataset.startswith("store:") else
                        f"registered dataset {run.dataset!r}"),
        "suite_source": (f"uploaded suite {run.suite_name!r}" if run.suite.startswith("store:")
                         else f"packaged suite {run.suite!r}")}
    return {
        "public": public,
        "run_id": run.id, "model_kind": run.model_kind, "model": model, "suite": suite,
        "data": data, "samples": opts.get("samples"), "seed": opts.get("seed"),
        "reference": None if reference is None else str(inputs / reference),
        "surrogate": None if surrogate is None else str(inputs / surrogate),
        "http": opts.get("http"), "has_secret": run.secret_enc is not None,
        "query_budget": opts.get("query_budget"), "model_card": opts.get("model_card"),
        "sign_key": str(cfg.sign_key), "passphrase_env": cfg.passphrase_env,
        "device": run.device or cfg.device,
        "executor": cfg.executor, "ray_address": cfg.ray_address,
        "allow_endpoints": list(cfg.allow_endpoints),
        # folders the run's error message must not show (certify.service.job._no_server_paths)
        "server_paths": sorted({str(p) for p in (
            cfg.home, inputs, cfg.scratch, *cfg.datasets.values(),
            *(Path(d).parent for d in cfg.datasets.values()))}),
    }


class _RunRefused(Exception):
    """This worker cannot run this run (a registered dataset or a key it lacks): the run ends
    ``error`` with this message."""


class _Lease:
    """A claimed run's lease, renewed from claim to finish by its own thread on the database's
    clock (store transfers and a slow process never delay it). ``held`` turns False when a
    heartbeat finds another owner, or when none has succeeded for a whole lease (the database
    away: another worker may claim the run then); ``cancel`` when a cancel was requested."""

    def __init__(self, pool: WorkerPool, run_id: str, progress: Path) -> None:
        self.pool, self.run_id, self.progress = pool, run_id, progress
        self.held, self.cancel = True, False
        self._ok = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"certify-lease-{run_id[:8]}",
                                        daemon=True)

    def start(self) -> None:  # noqa: D102
        self._thread.start()

    def stop(self) -> None:  # noqa: D102
        self._done.set()
        self._thread.join(10)

    def beat(self) -> bool:
        """One renewal now; whether the run is still held."""
        cfg = self.pool.cfg
        try:
            held, cancel = queue.heartbeat(self.pool.factory, self.run_id, self.pool.owner,
                                           cfg.lease_s, _read_json(self.progress))
        except Exception:  # noqa: BLE001 - the database may be briefly away
            log.warning("run %s: lease renewal failed", self.run_id, exc_info=True)
            if time.monotonic() - self._ok > cfg.lease_s:
                self.held = False
            return self.held
        self._ok = time.monotonic()
        self.held, self.cancel = held, cancel
        return held

    def _loop(self) -> None:
        while not self._done.wait(self.pool.cfg.heartbeat_s):
            if not self.beat():
                return


class WorkerPool:
    """``cfg.workers`` threads that run queued runs until :meth:`stop`.

    Each thread is a worker of its own (a row in ``workers``, heartbeating on the database's
    clock) that advertises this machine's device: a run that asks for ``cuda`` is claimed
    only by a worker that has one. The pool may live in an API node (``certify serve
    --workers N``) or alone (``certify worker``); either way runs read their inputs from, and
    write their records and cards to, the shared store.
    """

    def __init__(self, cfg: ServeConfig, factory: sessionmaker[Session], store: Store,
                 tlog: TransparencyLog, secrets: SecretBox | None) -> None:
        self.cfg, self.factory, self.store, self.tlog, self.secrets = (
            cfg, factory, store, tlog, secrets)
        # at most 58 characters: the lease_owner and workers.id columns hold 64
        self.owner = f"{os.uname().nodename[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.device = worker_device(cfg.device)
        self._stop = threading.Event()
        #: set when a run may be claimable (one was submitted here or put back): idle slots
        #: claim at once
        self._wake = threading.Event()
        self._unlisten: Callable[[], None] | None = None
        self._threads: list[threading.Thread] = []
        self._procs: dict[str, JobProcess] = {}
        self._lock = threading.Lock()
        #: Each slot's job host (:mod:`certify.service.jobhost`), started with its thread.
        self.hosts: list[JobHost] = []

    def start(self) -> None:
        """Start the worker threads."""
        log.info("worker %s: %d slot(s), device %s", self.owner, self.cfg.workers, self.device)
        self._unlisten = queue.on_enqueue(self._wake.set)
        for i in range(self.cfg.workers):
            host = JobHost(f"worker-{i}")
            self.hosts.append(host)
            t = threading.Thread(target=self._loop, args=(host,), name=f"certify-worker-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        beat = threading.Thread(target=self._beat_loop, name="certify-worker-beat",
                                daemon=True)
        beat.start()
        self._threads.append(beat)

    def stop_claiming(self) -> None:
        """Claim no more runs (the first step of a shutdown; running runs go on until
        :meth:`stop`)."""
        self._stop.set()
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming; kill running jobs and put their runs back on the queue with their
        records (they resume where they were after a restart, on any worker)."""
        self._stop.set()
        self._wake.set()
        if self._unlisten is not None:
            self._unlisten()
        with self._lock:
            procs = dict(self._procs)
        for p in procs.values():
            p.kill()
        for t in self._threads:
            t.join(timeout)
        for rid in procs:  # a worker thread requeues its own run; this covers a stuck one
            self._requeue(rid)

    def _requeue(self, run_id: str) -> None:
        """Put this worker's running run back on the queue (idempotent); a run whose
        cancellation was asked meanwhile ends cancelled instead (the queue never claims it, so
        it would stay queued)."""
        mine = (Run.id == run_id, Run.lease_owner == self.owner, Run.state == RUNNING)
        with self.factory() as s:
            s.execute(update(Run).where(*mine, Run.cancel_requested.is_(True))
                      .values(state=CANCELLED, error="cancelled while running",
                              lease_owner=None, lease_expires=None,
                              updated=utcnow()))
            s.execute(update(Run).where(*mine, Run.cancel_requested.is_(False))
                      .values(state=QUEUED, lease_owner=None, lease_expires=None,
                              updated=utcnow()))
            s.commit()
        self._wake.set()

    def _host_lost(self, run: Run, why: str) -> None:
        """The run's job host died (or never took it): back on the queue, unless that has
        happened on each of its last :data:`HOST_ATTEMPTS` attempts, which ends it an error
        (a run that takes its host down each time, or a host that cannot start in time, is
        not retried for ever)."""
        if run.attempts >= HOST_ATTEMPTS:
            log.warning("run %s: %s; attempt %d, no more", run.id, why, run.attempts)
            self._end(run.id, state=ERROR,
                      error=f"the worker's job host died during each of this run's last "
                            f"{HOST_ATTEMPTS} attempts ({why}); the service's log says why")
            return
        log.warning("run %s: %s; back on the queue", run.id, why)
        self._requeue(run.id)

    def _beat_loop(self) -> None:
        """This pool's heartbeat as a worker (``/metrics`` shows it), on the database's
        clock, every heartbeat; a failure is only logged. The row goes at a clean stop; a
        killed worker's row ages (its runs are re-queued when their leases expire)."""
        host = os.uname().nodename
        while not self._stop.is_set():
            with self._lock:
                running = len(self._procs)
            try:
                queue.worker_heartbeat(self.factory, self.owner, host, self.device,
                                       self.cfg.workers, running)
            except Exception:  # noqa: BLE001 - the database may be briefly away
                log.warning("worker heartbeat failed", exc_info=True)
            self._stop.wait(self.cfg.heartbeat_s)
        with contextlib.suppress(Exception):
            queue.worker_gone(self.factory, self.owner)

    def _loop(self, host: JobHost) -> None:
        """One slot: claim a run, run it, again, until :meth:`stop`. The slot's job host is
        started (and replaced) from this thread, whose end its parent-death signal follows."""
        try:
            host.start()  # its imports overlap the wait for the first run
        except OSError:  # no process to be had now: the first run starts it again
            log.exception("the job host could not start; retrying at the next run")
        try:
            self._claim_loop(host)
        finally:
            host.close()

    def _claim_loop(self, host: JobHost) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the claim: a run submitted after it sets it again
            try:
                run = queue.claim(self.factory, self.owner, self.cfg.lease_s, self.device)
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the worker
                log.exception("claiming a run failed; retrying")
                self._stop.wait(2.0)
                continue
            if run is None:
                self._wake.wait(CLAIM_POLL_S)
                continue
            try:
                self._run(run, host)
            except _Abandoned:
                log.info("run %s: given up by this worker; it will be resumed", run.id)
            except (NotInStore, _RunRefused) as exc:
                log.error("run %s: %s", run.id, exc)
                why = (f"an input of this run is no longer in the service's store ({exc}); "
                       "submit it again") if isinstance(exc, NotInStore) else str(exc)
                self._end(run.id, state=ERROR, exit_code=3, error=why)
            except StoreError as exc:  # the store is away: the run waits for it
                log.error("run %s: the store did not answer (%s); back on the queue", run.id,
                          exc)
                with contextlib.suppress(Exception):
                    self._requeue(run.id)
                self._stop.wait(5.0)
            except Exception as exc:  # noqa: BLE001 - the run fails, the worker goes on
                log.exception("run %s failed in the service", run.id)
                self._end(run.id, state=ERROR, exit_code=EXIT_INTERNAL,
                          error=f"internal error in the service: {type(exc).__name__}")

    def _end(self, run_id: str, **values: object) -> None:
        """Record a run's end; a database that is away is logged (the lease then expires
        and the run is taken up again), never the end of this worker."""
        try:
            queue.finish(self.factory, run_id, self.owner, charge=0, **values)
        except Exception:  # noqa: BLE001
            log.exception("run %s: its end could not be recorded", run_id)

    def _run(self, run: Run, host: JobHost) -> None:
        """Run one claimed run: its inputs and any records a lost worker left are copied from
        the store into this node's scratch folder, its process (forked by ``host``) computes
        there, its records go to the store as segments while it runs, and its written files
        at the end. The lease is renewed by its own thread from the claim to the end."""
        folder = self.cfg.scratch / "runs" / run.id
        shutil.rmtree(folder, ignore_errors=True)
        make_private_dir(folder / job.OUT_DIR)  # the run's folder: 0700, as its parents
        lease = _Lease(self, run.id, folder / job.PROGRESS_FILE)
        lease.start()
        try:
            self._run_in(run, folder, lease, host)
        finally:
            lease.stop()
            shutil.rmtree(folder, ignore_errors=True)

    def _run_in(self, run: Run, folder: Path, lease: _Lease, host: JobHost) -> None:
        if run.dataset and not run.dataset.startswith("store:") \
                and run.dataset not in self.cfg.datasets:
            raise _RunRefused(f"the worker that took this run has no registered dataset "
                              f"{run.dataset!r} (every worker needs --dataset "
                              f"{run.dataset}=PATH)")
        if run.secret_enc is not None and self.secrets is None:
            raise _RunRefused("the worker that took this run has no secrets key to read the "
                              "endpoint's secret (every worker needs --secrets-key)")
        inputs = folder / "in"
        for key in input_keys(run):
            if key.endswith("/"):
                got = fetch_tree(self.store, key, inputs / key)
                if not got:
                    raise NotInStore(f"{key} is not in the store")
            else:
                fetch_file(self.store, key, inputs / key)
        segments = RecordSegments(self.store, run.id, run.attempts, folder / job.OUT_DIR)
        segments.restore()
        segments.poll(force=True)  # this attempt's series starts with what it resumes from
        if not lease.held:
            raise _Abandoned
        spec = job_spec(run, self.cfg, inputs)
        (folder / job.JOB_FILE).write_text(json.dumps(spec, indent=1), encoding="utf-8")
        secret = ""
        # (a run with a secret was refused above where this worker has no secrets key)
        if run.secret_enc is not None and self.secrets is not None:
            secret = self.secrets.decrypt(run.secret_enc, run.id)
        log.info("run %s: starting (attempt %d)", run.id, run.attempts)
        try:
            proc = host.run(folder, secret, self.cfg.run_memory_mb * 1024 * 1024,
                            abort=self._stop)
        except HostDied as exc:  # not the run's doing: it goes back on the queue
            self._host_lost(run, str(exc))
            raise _Abandoned from None
        except HostBroken as exc:
            raise _RunRefused(str(exc)) from None
        finally:
            del secret
        log.info("run %s: process %s in job host %s", run.id, proc.pid, host.pid)
        with self._lock:
            self._procs[run.id] = proc
        try:
            ended = self._watch(run, proc, host, segments, lease)
        finally:
            proc.release()
            with self._lock:
                self._procs.pop(run.id, None)
            if not proc.ended:  # whatever went wrong here, the process goes with it
                proc.kill()
                host.reap(proc)
        if proc.returncode is not None:
            log.info("run %s: process %s ended with status %d (%.2f s of CPU, peak %d MB)",
                     run.id, proc.pid, proc.returncode, proc.cpu_s, proc.maxrss_kb // 1024)
        if ended is not None:
            segments.flush()
            self._end(run.id, **ended)
            return
        if proc.host_died and not (folder / job.OUTCOME_FILE).exists():
            # killed with its job host, not by its model: resumed from its records, as a run
            # whose server was killed (the host is replaced at the next run)
            proc.kill()  # whatever the run started in its group goes too
            segments.flush()
            self._host_lost(run, "its job host died")
            raise _Abandoned
        returncode = -signal.SIGKILL if proc.returncode is None else proc.returncode
        if self._stop.is_set() and returncode < 0:
            # killed by the shutdown, not by its model: back on the queue, never an error
            segments.flush()
            self._requeue(run.id)
            raise _Abandoned
        segments.flush()
        self._record_outcome(run, returncode, folder, segments, lease)

    def _watch(self, run: Run, proc: JobProcess, host: JobHost, segments: RecordSegments,
               lease: _Lease) -> dict[str, object] | None:
        """Wait for the process (its end is heard at once), sending its new records to the
        store (:class:`RecordSegments`) and checking its lease, cancellation and time limit
        every second; the final values if it had to be killed."""
        started = time.monotonic()
        exited_at: float | None = None
        while True:
            if proc.wait(timeout=1.0):
                return None
            if proc.exited():  # the child is gone, yet its host has not said so
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > HOST_SILENT_S:
                    log.warning("run %s: its process %s ended %.1f s ago and job host %s "
                                "has not reported it: the host is replaced", run.id,
                                proc.pid, time.monotonic() - exited_at, host.pid)
                    host.reap(proc, timeout=0.0)  # kills the host: the job reads as lost
                    continue
            if not self._stop.is_set() and lease.held:
                try:
                    segments.poll()
                except StoreError as exc:  # kept locally; sent at the next poll
                    log.warning("run %s: records not yet in the store: %s", run.id, exc)
            reason: dict[str, object] | None = None
            if self._stop.is_set():
                reason = {}
            elif not lease.held:
                log.warning("run %s: lease lost; stopping its process", run.id)
                reason = {}
            elif lease.cancel:
                reason = {"state": CANCELLED, "error": "cancelled while running",
                          "exit_code": EXIT_INTERRUPTED}
            elif time.monotonic() - started > self.cfg.run_timeout_s:
                reason = {"state": ERROR, "exit_code": 3,
                          "error": f"the run exceeded the service's time limit of "
                                   f"{self.cfg.run_timeout_s:.0f} s and was stopped"}
            if reason is not None:
                proc.kill()
                host.reap(proc)
                if not reason:  # stopping or lease lost: the run is someone else's now
                    if self._stop.is_set() and lease.beat():  # still ours: records first
                        segments.flush()
                        self._requeue(run.id)
                    raise _Abandoned
                return reason

    def _record_outcome(self, run: Run, returncode: int, folder: Path,
                        segments: RecordSegments, lease: _Lease) -> None:
        outcome = _read_json(folder / job.OUTCOME_FILE)
        with contextlib.suppress(OSError, StoreError):  # the run's log, for its operator
            with (folder / job.LOG_FILE).open("rb") as f:
                self.store.put(f"{run_prefix(run.id)}/{job.LOG_FILE}", f)
        progress = _read_json(folder / job.PROGRESS_FILE) or {}
        if outcome is None:
            if returncode < 0:
                name = signal.Signals(-returncode).name
                why = (f"the run's process was killed by {name}: the model crashed or hung "
                       "the runtime (the service is unaffected)")
            else:
                why = (f"the run's process exited with code {returncode} without a result "
                       f"(a model exceeding the {self.cfg.run_memory_mb} MB memory limit ends "
                       "like this)")
            self._end(run.id, state=ERROR, exit_code=3, error=why, progress=progress)
            return
        if outcome["state"] != "done":
            self._end(run.id, state=ERROR, exit_code=outcome["exit_code"],
                      error=outcome["error"], progress=progress)
            return
        sig = _read_json(folder / job.OUT_DIR / "results.json.sig")
        if sig is None:
            raise RuntimeError("the finished run has no signature")
        if not lease.beat():  # another worker has the run now: it publishes, not this one
            raise _Abandoned
        segments.publish()  # the card, results and signature, before the run is done
        signed = sig.get("signed")
        if not isinstance(signed, dict):
            raise RuntimeError("the finished run's signature states nothing")
        index = self.tlog.append(signed, run.id)
        progress["checks"] = outcome.get("checks", {})
        if "files" in outcome:  # the run page and API link only what was written
            progress["files"] = outcome["files"]
        # the queries are charged as the run stops holding its budget (one transaction)
        queries = outcome.get("queries", 0)
        held = queue.finish(self.factory, run.id, self.owner, state=DONE,
                            verdict=outcome["verdict"], exit_code=outcome["exit_code"],
                            log_index=index, progress=progress,
                            charge=int(queries) if isinstance(queries, int | float) else 0)
        if held:
            segments.cleanup()
        log.info("run %s: %s (log entry %d)", run.id, outcome["verdict"], index)


class _Abandoned(Exception):
    """The run was given up by this worker (server stopping, lease lost): no final state."""


def _read_json(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path`` (a run's progress, outcome or signature), or None where
    there is none (not written, not JSON, not an object)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def worker_device(choice: str = "auto") -> str:
    """The device a worker advertises: ``cuda`` where asked or where the NVIDIA driver
    answers with a device (``auto``), else ``cpu`` (the decision is certify.device's)."""
    if choice == "cpu":
        return "cpu"
    from certify.device import cuda_driver_devices

    has = cuda_driver_devices() > 0
    if choice == "cuda" and not has:
        from certify.errors import UsageError

        raise UsageError("--device cuda: this machine has no usable NVIDIA GPU",
                         hint="start the worker with --device auto or cpu")
    return "cuda" if has else "cpu"
