"""Warm job hosts: each worker slot forks its runs from a process that has imported them.

A run computed in a fresh interpreter paid about 3 s of CPU importing certify, torch, kornia,
the card's renderers (jinja2, WeasyPrint) and its PDF
signer before its first sample. Each
worker slot (:class:`certify.service.workers.WorkerPool`) keeps instead a *job host*
(``python -m certify.service.jobhost``): a process that imports those modules once and, for
each run, forks a child that runs exactly what ``python -m certify.service.job RUN_FOLDER``
runs (:func:`certify.service.job.run_process`: the same job folder, ``job.log``, outputs and
exit status). The host never computes: no torch operation, no thread pool; it has one thread
whenever it forks (its ready report says so). onnxruntime is the exception to "imported once":
its import starts a thread (onnxruntime 1.31's Python module does), so it is imported where the
first session is made (:func:`certify.models.onnx._ort`), in the child (about 0.1 s of CPU).
The host's objects are frozen for the garbage collector (:func:`gc.freeze`) before each fork,
so that a child's collections neither walk nor write the memory it shares with the host.

Each child

- makes its own session and process group: the worker kills a cancelled or overdue run with
  ``os.killpg``, as it killed the job process;
- takes the parent-death signal (SIGKILL) from its host, which takes it from the worker thread
  that started it: a killed service, or a killed host, leaves no run computing;
- caps its address space at ``--run-memory`` MB (``RLIMIT_AS``, as the job process did);
- writes its stdout and stderr to the run's ``job.log``;
- reads the endpoint secret from a pipe of its own, which the worker made for this run and
  handed to the host (``SCM_RIGHTS`` over a socket pair) before the fork: the worker writes the
  secret into it once the child runs. The host never reads a secret, so no child holds another
  run's (nor is it on disk); host and children are not dumpable (no core file, no
  ``/proc/PID/mem`` for processes of the same user);
- gives its memory back when it exits, at the end of its run.

The protocol is the fork protocol (:mod:`certify.service.forkproto`), shared with the card
verifier: a job a line on the host's stdin, a report a line on its stdout; the host's loop is
:class:`certify.service.forks.ForkLoop`, the worker's client :class:`forkproto.Server`. The
host reports
each child's pid when it forks it, and how it ended (``returncode`` as
:class:`subprocess.Popen` says it: negative for a signal) when it reaps it, since the worker
cannot wait for a grandchild. A host that exits, is killed, or does not take a job within
:data:`ACK_TIMEOUT_S` is replaced by a fresh one; a run whose host died before reporting its
end is put back on the queue by the worker and resumes from its records, as a run whose server
was killed does.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import logging
import os
import resource
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from certify.service import forkproto, forks

log = logging.getLogger("certify.service")

#: Seconds a started host has to import what runs need (a loaded machine, a cold disk).
START_ALLOWANCE_S = 180.0
#: Seconds a ready host has to fork a job's child and say so; past them it is replaced.
ACK_TIMEOUT_S = 30.0
#: Seconds a host has to report a child that was killed; past them it is replaced.
KILL_WAIT_S = 10.0
#: Exit status of a child that failed before it could run its job (a bug, not the run).
EXIT_BROKEN = forks.EXIT_BROKEN
_PR_SET_DUMPABLE = 4


class HostDied(RuntimeError):
    """The job host ended, or stopped answering, before it reported how a job ended."""


class HostBroken(RuntimeError):
    """The job host exited with an error before it was ready (its imports fail here): a run
    in a fresh interpreter would have failed the same way."""


# --- the worker's side ------------------------------------------------------------------

class JobProcess:
    """A run's child in a job host, as the worker sees it (:class:`subprocess.Popen`'s
    ``pid``, ``returncode``, ``wait``, ``poll`` and ``kill``).

    Made by :meth:`JobHost.run`, which sends the job: what the host reports of the child
    (:class:`certify.service.forkproto.Child`) and what the kernel says of it (its pidfd) are
    this object's own state, read through its properties and methods.
    """

    def __init__(self, server: forkproto.Server, folder: Path, memory_bytes: int,
                 before: Callable[[], None] | None = None) -> None:
        """Send the job in ``folder`` to the job host behind ``server`` (``before``: what is
        sent beside its line, just before it)."""
        #: A pidfd of the child (Linux): readable once the child exits, whether or not its
        #: host reaps it and says so (a frozen host does neither).
        self._pidfd: int | None = None
        self._child = server.send({"folder": str(folder), "memory_bytes": int(memory_bytes)},
                                  on_started=self._watch_pid, before=before)

    @property
    def pid(self) -> int | None:
        """The child's pid, also its process group's id (None until the host forked it)."""
        return self._child.pid

    @property
    def returncode(self) -> int | None:
        """As :attr:`subprocess.Popen.returncode`: the exit status, or minus the signal
        (None while it runs, or where its host died first)."""
        ending = self._child.ending
        return ending.returncode if isinstance(ending, forkproto.Ended) else None

    @property
    def host_died(self) -> bool:
        """The host ended before it reported this child's end (the child died with it)."""
        return self._child.lost

    @property
    def fork_error(self) -> int | None:
        """The errno where the host could not fork (out of memory or processes)."""
        ending = self._child.ending
        return ending.errno if isinstance(ending, forkproto.ForkFailed) else None

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the ended child, from ``wait4`` (0 before it ended)."""
        ending = self._child.ending
        return ending.cpu_s if isinstance(ending, forkproto.Ended) else 0.0

    @property
    def maxrss_kb(self) -> int:
        """Peak resident set (KB) of the ended child, from ``wait4`` (0 before it ended)."""
        ending = self._child.ending
        return ending.maxrss_kb if isinstance(ending, forkproto.Ended) else 0

    @property
    def ended(self) -> bool:
        """Whether the child ended (or could not fork) or its host died."""
        return self._child.done

    def _watch_pid(self, pid: int) -> None:
        """The host forked the child (its report's reader thread calls this)."""
        with contextlib.suppress(OSError, AttributeError):  # no pidfd: the host's word only
            self._pidfd = os.pidfd_open(pid)

    def exited(self) -> bool:
        """Whether the kernel says the child exited, whatever its host reported (its pidfd
        became readable); False where no pidfd could be opened."""
        fd = self._pidfd
        if fd is None:
            return False
        readable, _, _ = select.select([fd], [], [], 0)
        return bool(readable)

    def release(self) -> None:
        """Close the child's pidfd (once the worker is done with the run)."""
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def wait_started(self, timeout: float) -> bool:
        """Wait until the host forked the child (or could not, or died); whether it did
        within ``timeout``."""
        return self._child.wait_started(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the child ended (or its host died); whether it did within ``timeout``."""
        return self._child.wait(timeout)

    def poll(self) -> int | None:
        """The return code if the child ended, else None."""
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the child's process group (everything the run started); nothing once the
        host reported the child's end (its pid may be another process's by then)."""
        pid = self.pid
        if pid is not None and self.returncode is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                # just forked: the child may not have made its own group yet
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def kill_host(self, timeout: float) -> None:
        """Kill the job host that forked this child (it stopped answering; the child dies
        with it) and mark the child's host dead, when its end is seen or ``timeout`` later."""
        self._child.server.kill(KILL_WAIT_S)
        self._child.wait(timeout)
        self._child.give_up("the job host was killed before it reported the child's end")


class JobHost:
    """A worker slot's handle on its job host process, started (and restarted) from that
    slot's thread: the host's parent-death signal is tied to the thread that started it.

    The fork protocol's client (:class:`certify.service.forkproto.Server`) turns the host's
    reports into each :class:`JobProcess`'s state; when the host's stdout ends (it exited or
    was killed), every job it had not reported is marked :attr:`JobProcess.host_died`.
    """

    def __init__(self, name: str = "job-host") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._server: forkproto.Server | None = None
        #: How many host processes this handle started (a replaced host adds one).
        self.started = 0
        self._sock: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        """The live host's pid (None before it starts or once it ended)."""
        server = self._server
        return server.pid if server is not None and server.alive else None

    @property
    def info(self) -> Mapping[str, forkproto.Scalar]:
        """The host's ready report (its pid, seconds of imports, threads) once it is ready;
        empty before."""
        server = self._server
        facts = None if server is None else server.facts
        return {} if facts is None else {"pid": facts.pid, **facts.facts}

    def start(self) -> None:
        """Start the host if none is running (it imports in the background)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> forkproto.Server:
        if self._server is not None and self._server.alive:
            return self._server
        from certify.service.config import child_env

        forks.libc()  # loaded here: the host's preexec_fn may not load a library
        # the channel that carries each run's secret pipe (its read end) to the host
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server = forkproto.start(
                [sys.executable, "-m", "certify.service.jobhost", str(theirs.fileno())],
                self.name, child_env(), pass_fds=(theirs.fileno(),),
                preexec_fn=forks.die_with_parent, on_ready=self._said_ready)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = ours
        self._server = server
        self.started += 1
        return server

    def _said_ready(self, ready: forkproto.Ready) -> None:
        facts = ready.facts
        log.info("%s: job host %d ready (imports %.1f s of CPU, %d thread(s))", self.name,
                 ready.pid, _number(facts.get("import_s")), _number(facts.get("threads")))

    def run(self, folder: Path, secret: str, memory_bytes: int,
            ack_timeout: float = ACK_TIMEOUT_S,
            abort: threading.Event | None = None) -> JobProcess:
        """Have the host fork a child that runs the job in ``folder``; returns once the child
        runs. :class:`HostDied` where the host ended or did not answer in time (it is then
        replaced at the next run) or ``abort`` was set meanwhile (the service is stopping:
        the host is killed), :class:`HostBroken` where it could not start at all, OSError
        where it could not fork."""
        with self._lock:
            server = self._ensure()
            sock = self._sock
            assert sock is not None
            read_end, write_end = os.pipe()
            try:
                # the secret pipe's read end goes to the host just before the job's line
                job = JobProcess(server, folder, memory_bytes,
                                 before=lambda: _send_fd(sock, read_end))
            except (OSError, ValueError) as exc:
                os.close(write_end)
                server.kill(KILL_WAIT_S)
                raise HostDied(f"the job host did not take the job ({exc})") from None
            finally:
                os.close(read_end)
        try:
            return self._started_job(job, server, write_end, secret, ack_timeout, abort)
        finally:
            os.close(write_end)  # the child reads the secret to its end

    def _started_job(self, job: JobProcess, server: forkproto.Server, write_end: int,
                     secret: str, ack_timeout: float,
                     abort: threading.Event | None) -> JobProcess:
        """Wait until the host forked the job's child, then write the secret into the
        child's own pipe (never through the host)."""
        allowance = ack_timeout + (0.0 if server.ready.is_set() else START_ALLOWANCE_S)
        deadline = time.monotonic() + allowance
        while not job.wait_started(min(0.1, max(0.0, deadline - time.monotonic()))):
            aborted = abort is not None and abort.is_set()
            if aborted or time.monotonic() >= deadline:
                server.kill(KILL_WAIT_S)
                job.release()  # its pidfd, where the start came in with the deadline
                raise HostDied("the service is stopping" if aborted else
                               f"the job host did not start the job within {allowance:.0f} s;"
                               " it was replaced")
        if job.fork_error is not None:
            raise OSError(job.fork_error, f"the job host could not fork: "
                          f"{os.strerror(job.fork_error)}")
        if job.pid is None:  # the host ended before it forked
            returncode = server.proc.wait()
            if not server.ready.is_set() and returncode > 0:
                raise HostBroken(f"the worker's job host could not start (exit status "
                                 f"{returncode}; the service's log says why)")
            raise HostDied(f"the job host ended (status {returncode}) before it "
                           "started the job")
        data = secret.encode("utf-8")
        with contextlib.suppress(BrokenPipeError):  # the child died before it read it
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
        del data
        return job

    def reap(self, job: JobProcess, timeout: float = KILL_WAIT_S) -> None:
        """Wait for a killed job's end; a host that does not report it in ``timeout`` is
        killed (and the job marked :attr:`JobProcess.host_died`)."""
        if job.wait(timeout):
            return
        log.warning("%s: job host did not report process %s within %.0f s; replacing it",
                    self.name, job.pid, timeout)
        job.kill_host(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the host: end of file on its stdin (it kills its children and exits), then
        SIGKILL if it has not exited within ``timeout``; a host still importing (it reads its
        stdin only once ready, and has no child yet) is killed at once."""
        with self._lock:
            server, self._server = self._server, None
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if server is None:
            return
        if not server.ready.is_set():
            server.kill(KILL_WAIT_S)
            return
        server.close(timeout)


def _send_fd(sock: socket.socket, fd: int) -> None:
    """Send ``fd`` to the host over ``sock`` (``SCM_RIGHTS``)."""
    socket.send_fds(sock, [b"s"], [fd])


def _number(value: forkproto.Scalar) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


# --- the host's side --------------------------------------------------------------------

def preload() -> list[str]:
    """Import what a run imports (the engine, checks, models, the card's renderers, figures
    and PDF signer), without running any of it; returns the top-level packages now loaded."""
    import certify.api
    import certify.figures
    import certify.models.http
    import certify.redact
    import certify.service.endpoints
    import certify.service.job
    import certify.service.secrets  # noqa: F401
    from certify.errors import PdfUnavailableError
    from certify.report.weasy import load_weasyprint

    with contextlib.suppress(PdfUnavailableError):  # no PDF here: the child says so
        load_weasyprint()
    # the card's PDF signer (absent or unloadable: the child meets it as a fresh interpreter
    # would)
    for optional in ("pyhanko.sign.signers", "pyhanko.sign.fields",
                     "pyhanko.pdf_utils.incremental_writer", "pyhanko_certvalidator.registry"):
        with contextlib.suppress(Exception):
            importlib.import_module(optional)
    # the renderer's identity (digests of the templates and of the code this host loaded),
    # computed once here rather than in every run
    with contextlib.suppress(Exception):
        from certify.report.card import html_renderer

        html_renderer()
    return sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")})


def _run_child(job: forkproto.Job, secret_fd: int, host_pid: int) -> int:
    """The child's part: its own group, tied to the host, limited, logging to job.log; then
    the job process's own function. Returns the exit status."""
    os.setsid()
    gc.enable()  # as in a fresh interpreter (the host's own objects stay frozen: serve())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    forks.die_with_parent()
    if os.getppid() != host_pid:  # the host died before the signal was asked for
        return EXIT_BROKEN
    folder = Path(job.text("folder"))
    from certify.service.job import LOG_FILE, run_process

    fd = os.open(folder / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    memory = job.integer("memory_bytes")
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    with os.fdopen(secret_fd, "rb") as pipe:  # written by the worker
        secret = pipe.read().decode("utf-8") or None
    try:
        return run_process(folder, secret)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a process
        import traceback

        traceback.print_exc()
        return 1


def _child(job: forkproto.Job, secret_fd: int, host_pid: int) -> NoReturn:
    """The forked child: run the job, then exit as an interpreter does (atexit handlers,
    threads joined, streams flushed); nothing may return into the host's loop."""
    try:
        status = _run_child(job, secret_fd, host_pid)
    except BaseException:  # noqa: BLE001 - a failure before the job could start
        with contextlib.suppress(BaseException):  # in job.log, or the service's log
            import traceback

            sys.stderr.write("certify job host: the run's process could not start:\n")
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(EXIT_BROKEN)
    raise SystemExit(status)


def serve() -> None:
    """The host's loop: preload, then fork a child per job (:func:`_start`); the loop
    (:class:`certify.service.forks.ForkLoop`) reports each child's pid and its end."""
    # the worker ends this process (end of file on stdin), not a Ctrl-C sent to the group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # no core file and no /proc/PID/mem for the host or its children (fork keeps both)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    forks.prctl(_PR_SET_DUMPABLE, 0)
    secrets = socket.socket(fileno=int(sys.argv[1])) if len(sys.argv) > 1 else None
    # reports go on a private copy of stdout; what a library prints goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    # The imported modules' objects are shared with every child until written to; a child's
    # garbage collector would write to each of them (and walk them all) at every full
    # collection. So the host collects nothing while it imports, and freezes what it holds
    # before each fork (gc.freeze: the children's collections skip it); measured on the
    # demo's two-check run, a child took 1.25 s of CPU without this and 1.0 s with it.
    gc.disable()
    began = time.process_time()
    packages = preload()
    imported = time.process_time() - began
    host_pid = os.getpid()
    loop = forks.ForkLoop(0, out)
    threads = _fork_once(loop, host_pid)
    loop.report(forkproto.Ready(host_pid, {
        "import_s": round(imported, 3), "threads": threads, "packages": len(packages),
        "torch": "torch" in packages, "onnxruntime": "onnxruntime" in packages}))
    loop.run(functools.partial(_start, loop, secrets, host_pid), kill=_kill_group)


def _fork_once(loop: forks.ForkLoop, host_pid: int) -> int:
    """One fork before the first job: libraries whose pools stop at fork (OpenBLAS) stop now,
    and the thread count returned (for the ready report) is the one every child is forked
    with."""
    gc.freeze()
    pid = loop.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    threads = forks.thread_count()
    if threads > 1:
        sys.stderr.write(f"certify job host {host_pid}: {threads} threads before forking; "
                         "an import started a thread pool\n")
    return threads


def _start(loop: forks.ForkLoop, secrets: socket.socket | None, host_pid: int,
           job: forkproto.Job) -> forks.Forked:
    """Fork ``job``'s child, handing it the read end of the run's secret pipe, which the
    worker sent over ``secrets`` just before the job's line."""
    if secrets is None:
        raise RuntimeError("the job host has no channel for secrets")
    try:
        _, fds, _, _ = socket.recv_fds(secrets, 1, 1)
    except OSError as exc:  # the channel broke: this host can take no job (it exits)
        raise RuntimeError(f"the job host's channel for secrets failed: {exc}") from None
    if len(fds) != 1:
        raise RuntimeError("the job host got a job without its secret pipe")
    gc.freeze()
    try:
        pid = loop.fork()
    except OSError:
        os.close(fds[0])
        raise  # the loop reports the fork's failure
    if pid == 0:
        with contextlib.suppress(OSError):
            secrets.close()
        _child(job, fds[0], host_pid)
    os.close(fds[0])
    return forks.Forked(pid)


def _kill_group(pid: int) -> None:
    """SIGKILL a child's whole group: what its run started too."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def main() -> int:
    """Entry point of the job host process."""
    try:
        serve()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
