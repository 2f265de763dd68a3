"""Worker threads: claim a run, start its subprocess, watch it, record how it ended.

Each of ``--workers N`` threads runs one run at a time in a subprocess
(``python -m certify.service.job``) with an address-space limit and a wall-clock limit, in its
own process group, with the parent-death signal set: a model that crashes or hangs ends its run
``error``, and a killed server leaves no orphan writing to the store. While the subprocess runs
the thread renews the run's lease (carrying its progress) every heartbeat; a cancelled run's
process group is killed. A finished run's signed statement is appended to the transparency log.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from certify.errors import EXIT_INTERNAL, EXIT_INTERRUPTED
from certify.service import job, queue
from certify.service.config import ServeConfig
from certify.service.db import CANCELLED, DONE, ERROR, QUEUED, RUNNING, Run, utcnow

log = logging.getLogger("certify.service")

_PR_SET_PDEATHSIG = 1


def _child_setup(memory_bytes: int) -> Any:
    """What the job process does between fork and exec: die with its parent, cap memory."""

    def setup() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return setup


def job_spec(run: Run, cfg: ServeConfig, store_root: Path) -> dict[str, Any]:
    """The job.json of a run: everything its process needs, no secret."""
    opts = dict(run.options or {})
    if run.model_kind == "onnx":
        model = str(store_root / run.model_ref)
    else:
        model = run.model_ref
    data = (str(store_root / run.dataset.removeprefix("store:"))
            if run.dataset.startswith("store:") else str(cfg.datasets[run.dataset]))
    suite = (str(store_root / run.suite.removeprefix("store:"))
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
        "reference": None if reference is None else str(store_root / reference),
        "surrogate": None if surrogate is None else str(store_root / surrogate),
        "http": opts.get("http"), "has_secret": run.secret_enc is not None,
        "query_budget": opts.get("query_budget"), "model_card": opts.get("model_card"),
        "sign_key": str(cfg.sign_key), "passphrase_env": cfg.passphrase_env,
        "executor": cfg.executor, "ray_address": cfg.ray_address,
        "allow_endpoints": list(cfg.allow_endpoints),
        # folders the run's error message must not show (certify.service.job._no_server_paths)
        "server_paths": sorted({str(p) for p in (
            cfg.home, store_root, *cfg.datasets.values(),
            *(Path(d).parent for d in cfg.datasets.values()))}),
    }


class WorkerPool:
    """``cfg.workers`` threads that run queued runs until :meth:`stop`."""

    def __init__(self, cfg: ServeConfig, factory: sessionmaker[Any], store: Any, tlog: Any,
                 secrets: Any) -> None:
        self.cfg, self.factory, self.store, self.tlog, self.secrets = (
            cfg, factory, store, tlog, secrets)
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the worker threads."""
        for i in range(self.cfg.workers):
            t = threading.Thread(target=self._loop, name=f"certify-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop_claiming(self) -> None:
        """Claim no more runs (the first step of a shutdown; running runs go on until
        :meth:`stop`)."""
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming; kill running jobs and put their runs back on the queue with their
        records (they resume where they were after a restart, on any worker)."""
        self._stop.set()
        with self._lock:
            procs = dict(self._procs)
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for t in self._threads:
            t.join(timeout)
        for rid in procs:  # a worker thread requeues its own run; this covers a stuck one
            self._requeue(rid)

    def _requeue(self, run_id: str) -> None:
        """Put this worker's running run back on the queue (idempotent)."""
        with self.factory() as s:
            s.execute(update(Run).where(Run.id == run_id, Run.lease_owner == self.owner,
                                        Run.state == RUNNING)
                      .values(state=QUEUED, lease_owner=None, lease_expires=None,
                              updated=utcnow()))
            s.commit()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                run = queue.claim(self.factory, self.owner, self.cfg.lease_s)
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the worker
                log.exception("claiming a run failed; retrying")
                self._stop.wait(2.0)
                continue
            if run is None:
                self._stop.wait(0.5)
                continue
            try:
                self._run(run)
            except _Abandoned:
                log.info("run %s: given up by this worker; it will be resumed", run.id)
            except Exception as exc:  # noqa: BLE001 - the run fails, the worker goes on
                log.exception("run %s failed in the service", run.id)
                queue.finish(self.factory, run.id, self.owner, state=ERROR,
                             exit_code=EXIT_INTERNAL,
                             error=f"internal error in the service: {type(exc).__name__}")

    def _run(self, run: Run) -> None:
        folder = self.store.run_dir(run.id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / job.OUTCOME_FILE).unlink(missing_ok=True)
        spec = job_spec(run, self.cfg, self.store.root)
        (folder / job.JOB_FILE).write_text(json.dumps(spec, indent=1), encoding="utf-8")
        secret = ""
        if run.secret_enc is not None:
            secret = self.secrets.decrypt(run.secret_enc, run.id)
        env = {k: v for k, v in os.environ.items() if k != "CERTIFY_SECRETS_KEY"}
        log.info("run %s: starting (attempt %d)", run.id, run.attempts)
        with (folder / job.LOG_FILE).open("ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "certify.service.job", str(folder)],
                stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
                preexec_fn=_child_setup(self.cfg.run_memory_mb * 1024 * 1024))
        with self._lock:
            self._procs[run.id] = proc
        try:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(secret.encode() + b"\n")
                proc.stdin.close()
            del secret
            ended = self._watch(run, proc, folder)
        finally:
            with self._lock:
                self._procs.pop(run.id, None)
        if ended is not None:
            queue.finish(self.factory, run.id, self.owner, **ended)
            return
        if self._stop.is_set() and proc.returncode < 0:
            # killed by the shutdown, not by its model: back on the queue, never an error
            self._requeue(run.id)
            raise _Abandoned
        self._record_outcome(run, proc.returncode, folder)

    def _watch(self, run: Run, proc: subprocess.Popen[bytes], folder: Path
               ) -> dict[str, Any] | None:
        """Wait for the process, renewing the lease; the final values if it had to be killed."""
        started = time.monotonic()
        while True:
            try:
                proc.wait(timeout=self.cfg.heartbeat_s)
                return None
            except subprocess.TimeoutExpired:
                pass
            held, cancel = queue.heartbeat(self.factory, run.id, self.owner, self.cfg.lease_s,
                                           _read_json(folder / job.PROGRESS_FILE))
            reason: dict[str, Any] | None = None
            if self._stop.is_set():
                reason = {}
            elif not held:
                log.warning("run %s: lease lost; stopping its process", run.id)
                reason = {}
            elif cancel:
                reason = {"state": CANCELLED, "error": "cancelled while running",
                          "exit_code": EXIT_INTERRUPTED}
            elif time.monotonic() - started > self.cfg.run_timeout_s:
                reason = {"state": ERROR, "exit_code": 3,
                          "error": f"the run exceeded the service's time limit of "
                                   f"{self.cfg.run_timeout_s:.0f} s and was stopped"}
            if reason is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if not reason:  # stopping or lease lost: the run is someone else's now
                    if self._stop.is_set():
                        self._requeue(run.id)
                    raise _Abandoned
                return reason

    def _record_outcome(self, run: Run, returncode: int, folder: Path) -> None:
        outcome = _read_json(folder / job.OUTCOME_FILE)
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
            queue.finish(self.factory, run.id, self.owner, state=ERROR, exit_code=3, error=why,
                         progress=progress)
            return
        if outcome["state"] != "done":
            queue.finish(self.factory, run.id, self.owner, state=ERROR,
                         exit_code=outcome["exit_code"], error=outcome["error"],
                         progress=progress)
            return
        sig = _read_json(folder / job.OUT_DIR / "results.json.sig")
        if sig is None:
            raise RuntimeError("the finished run has no signature")
        index = self.tlog.append(sig["signed"], run.id)
        progress["checks"] = outcome.get("checks", {})
        if "files" in outcome:  # the run page and API link only what was written
            progress["files"] = outcome["files"]
        # the queries are charged as the run stops holding its budget (one transaction)
        queue.finish(self.factory, run.id, self.owner, state=DONE,
                     verdict=outcome["verdict"], exit_code=outcome["exit_code"],
                     log_index=index, progress=progress,
                     charge=int(outcome.get("queries", 0)))
        log.info("run %s: %s (log entry %d)", run.id, outcome["verdict"], index)


class _Abandoned(Exception):
    """The run was given up by this worker (server stopping, lease lost): no final state."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
