"""The fork protocol: how the service talks to its fork servers, both sides of it.

A fork server (:mod:`certify.service.forks`) is a process that imported what its jobs need and
forks one child per job: the worker slots' job hosts (:mod:`certify.service.jobhost`) and the
card verifier (:mod:`certify.service.verify_sandbox`). Both speak this protocol and only this
one; its two ends change together, here.

**Framing.** One JSON object a line (UTF-8, ``\\n``), at most :data:`MAX_LINE` bytes, both
ways: jobs on the server's stdin, reports on its report channel (its stdout). A longer line,
or one that is not a message of the protocol, is a :class:`ProtocolError`: the service then
takes the server for broken and replaces it.

**Messages.** The service sends a :class:`Job` (an id it chose, and parameters: strings,
numbers, booleans). The server answers with reports, each tagged by ``type``:

- :class:`Ready` once it has imported what its jobs need (its pid, and facts such as its
  import time);
- :class:`Started` when it forked a job's child (its pid, also its process group);
- :class:`Ended` when it reaped that child: ``returncode`` as :class:`subprocess.Popen` says
  it (minus the signal that ended it), CPU seconds and peak RSS from ``wait4``, and whether
  the server killed it at its deadline (``overdue``);
- :class:`ForkFailed` where it could not fork (the errno).

**The service's side.** :class:`Server` is the handle on one server process: it sends jobs
(:meth:`Server.send`) and a reader thread turns the reports into each job's :class:`Child`
(its pid, how it ended; a future to await). When the server's report channel ends (it exited
or was killed), each job it had not reported ended is marked lost (:class:`ServerLost`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import logging
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TypeVar

log = logging.getLogger("certify.service")

#: The longest line either side sends or reads (a job names a folder and a key in PEM, a
#: report a few numbers): a longer one is a :class:`ProtocolError`.
MAX_LINE = 1 << 16

#: What a job's parameters and a ready report's facts may hold.
Scalar = str | int | float | bool | None
_T = TypeVar("_T")


class ProtocolError(ValueError):
    """A line that is not a message of the protocol (or is longer than :data:`MAX_LINE`)."""


class ServerLost(RuntimeError):
    """The fork server ended (or was killed) before it reported how a job ended."""


# --- messages ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """A job for a fork server: its id (the service's) and its parameters."""

    id: int
    params: Mapping[str, Scalar] = field(default_factory=dict)

    def text(self, name: str) -> str:
        """The string parameter ``name`` (:class:`ProtocolError` where it is not one)."""
        return _typed(self.params, name, str)

    def integer(self, name: str) -> int:
        """The integer parameter ``name``."""
        return _typed(self.params, name, int)

    def number(self, name: str) -> float:
        """The number parameter ``name`` (an integer reads as a float)."""
        value = self.params.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"job parameter {name!r} is not a number: {value!r}")
        return float(value)


@dataclass(frozen=True)
class Ready:
    """The server imported what its jobs need and takes jobs."""

    pid: int
    facts: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True)
class Started:
    """The server forked job ``id``'s child, ``pid`` (also its process group's id)."""

    id: int
    pid: int


@dataclass(frozen=True)
class Ended:
    """Job ``id``'s child ended (the server reaped it)."""

    id: int
    pid: int
    #: As :attr:`subprocess.Popen.returncode`: the exit status, or minus the signal.
    returncode: int
    #: CPU seconds (user and system) and peak resident set (KB), from ``wait4``.
    cpu_s: float = 0.0
    maxrss_kb: int = 0
    #: The server killed it at the job's deadline.
    overdue: bool = False


@dataclass(frozen=True)
class ForkFailed:
    """The server could not fork job ``id``'s child (``errno``: out of memory or processes)."""

    id: int
    errno: int


#: What a fork server reports.
Report = Ready | Started | Ended | ForkFailed
#: How a job ended, as its :class:`Child` holds it.
Ending = Ended | ForkFailed

_TYPES: dict[str, type[Report]] = {"ready": Ready, "started": Started, "ended": Ended,
                                   "fork_failed": ForkFailed}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(msg: Job | Report) -> bytes:
    """``msg`` as one line of the protocol."""
    if isinstance(msg, Job):
        doc: dict[str, object] = {"type": "job", "id": msg.id, "params": dict(msg.params)}
    elif isinstance(msg, Ready):
        doc = {"type": "ready", "pid": msg.pid, "facts": dict(msg.facts)}
    else:
        doc = {"type": _NAMES[type(msg)], **msg.__dict__}
    line = json.dumps(doc, separators=(",", ":")).encode("utf-8") + b"\n"
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a {doc['type']} message of {len(line)} bytes (at most "
                            f"{MAX_LINE})")
    return line


def decode_job(line: bytes) -> Job:
    """The job on ``line`` (:class:`ProtocolError` where it is none)."""
    doc = _document(line)
    params = doc.get("params")
    if doc.get("type") != "job" or not isinstance(params, dict) or not all(
            isinstance(v, str | int | float | bool) or v is None for v in params.values()):
        raise ProtocolError(f"not a job: {line[:200]!r}")
    return Job(_typed(doc, "id", int), params)


def decode_report(line: bytes) -> Report:
    """The report on ``line`` (:class:`ProtocolError` where it is none)."""
    doc = _document(line)
    kind = _TYPES.get(str(doc.get("type")))
    if kind is Ready:
        facts = doc.get("facts")
        if not isinstance(facts, dict):
            raise ProtocolError(f"a ready report without facts: {line[:200]!r}")
        if not all(isinstance(v, str | int | float | bool) or v is None for v in facts.values()):
            raise ProtocolError(f"a ready report whose facts are not scalars: {line[:200]!r}")
        return Ready(_pid(doc), facts)
    if kind is Started:
        return Started(_typed(doc, "id", int), _pid(doc))
    if kind is Ended:
        cpu = doc.get("cpu_s", 0.0)
        if not isinstance(cpu, int | float) or isinstance(cpu, bool) or not 0 <= cpu < 1e12:
            raise ProtocolError(f"'cpu_s' is not a number of seconds: {cpu!r}")
        return Ended(_typed(doc, "id", int), _pid(doc), _typed(doc, "returncode", int),
                     float(cpu), _typed(doc, "maxrss_kb", int),
                     _typed(doc, "overdue", bool) if "overdue" in doc else False)
    if kind is ForkFailed:
        return ForkFailed(_typed(doc, "id", int), _typed(doc, "errno", int))
    raise ProtocolError(f"not a report: {line[:200]!r}")


def _document(line: bytes) -> dict[str, object]:
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of {len(line)} bytes (at most {MAX_LINE})")
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack
        raise ProtocolError(f"not JSON: {line[:200]!r}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"not a JSON object: {line[:200]!r}")
    return doc


#: The largest process id a report may name (Linux's pid_max limit, 2^22).
PID_MAX = 1 << 22


def _pid(doc: Mapping[str, object]) -> int:
    """The report's ``pid``: a process of the server's own (above 1: a pid of 0 or -1 would
    make a kill reach the worker's process group or every process of the service's user)."""
    pid = _typed(doc, "pid", int)
    if not 1 < pid <= PID_MAX:
        raise ProtocolError(f"'pid' is not a child's process id: {pid!r}")
    return pid


def _typed(doc: Mapping[str, object], name: str, kind: type[_T]) -> _T:
    value = doc.get(name)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ProtocolError(f"{name!r} is not a {kind.__name__}: {value!r}")
    return value


# --- framing ----------------------------------------------------------------------------

class LineBuffer:
    """Complete lines out of the bytes a non-blocking read gives (the server's stdin): a
    line that grows past :data:`MAX_LINE` without its end is a :class:`ProtocolError`."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes (without their ``\\n``)."""
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > MAX_LINE or any(len(x) > MAX_LINE for x in lines):
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
        return lines


def read_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The lines of a blocking stream (the server's report channel), each read with at most
    :data:`MAX_LINE` bytes held, until its end."""
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
        yield line.rstrip(b"\n")


def write_line(out: IO[bytes], msg: Job | Report) -> None:
    """Send ``msg`` on ``out``, flushed at once."""
    out.write(encode(msg))
    out.flush()


# --- the service's side -----------------------------------------------------------------

class Child:
    """A job sent to a fork server, and its child as the server reports it (made by
    :meth:`Server.send`)."""

    def __init__(self, job_id: int, server: Server,
                 on_started: Callable[[int], None] | None = None) -> None:
        self.id, self.server = job_id, server
        self._on_started = on_started
        self._pid: int | None = None
        self._started = threading.Event()
        #: How the job ended: :class:`Ended` or :class:`ForkFailed`, or :class:`ServerLost`.
        self.future: concurrent.futures.Future[Ending] = concurrent.futures.Future()

    @property
    def pid(self) -> int | None:
        """The child's pid, also its process group's (None until the server forked it)."""
        return self._pid

    @property
    def ending(self) -> Ending | None:
        """How the job ended, where the server said so (None while it runs, or if lost)."""
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.future.result()

    @property
    def lost(self) -> bool:
        """The server ended before it reported how the job ended (the child died with it)."""
        return self.future.done() and self.future.exception() is not None

    @property
    def done(self) -> bool:
        """Whether the job ended, could not fork, or its server was lost."""
        return self.future.done()

    def wait_started(self, timeout: float) -> bool:
        """Wait until the server forked the child (or could not, or was lost); whether that
        happened within ``timeout`` seconds."""
        return self._started.wait(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the job is :attr:`done`; whether it was within ``timeout`` seconds."""
        done, _ = concurrent.futures.wait([self.future], timeout)
        return bool(done)

    def give_up(self, why: str) -> None:
        """Mark the job lost (where its server's end was not seen: a server killed for not
        answering); nothing once it is done."""
        self._end(ServerLost(why))

    # the reader thread's side
    def _report(self, msg: Started | Ending) -> None:
        if isinstance(msg, Started):
            self._pid = msg.pid
            if self._on_started is not None:
                self._on_started(msg.pid)
            self._started.set()
            return
        if isinstance(msg, Ended) and self._pid is None:
            self._pid = msg.pid
        self._end(msg)

    def _end(self, outcome: Ending | ServerLost) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if isinstance(outcome, ServerLost):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)
        self._started.set()


class Server:
    """The service's handle on one fork server process (:func:`start` makes one).

    Thread-safe: jobs may be sent from any thread. A reader thread resolves each job's
    :class:`Child` from the server's reports; when the report channel ends, every job not yet
    reported ended is lost, and so is every job sent afterwards.
    """

    def __init__(self, proc: subprocess.Popen[bytes], name: str,
                 on_ready: Callable[[Ready], None] | None = None) -> None:
        if proc.stdin is None or proc.stdout is None:
            raise ValueError("a fork server needs pipes on its stdin and stdout")
        self.proc, self.name = proc, name
        self._jobs, self._reports = proc.stdin, proc.stdout
        self._on_ready = on_ready
        self._lock = threading.Lock()
        self._pending: dict[int, Child] = {}
        self._ids = itertools.count(1)
        self._closed = False  # its report channel ended
        #: Set once the server reported :class:`Ready`.
        self.ready = threading.Event()
        #: Its ready report (None before it).
        self.facts: Ready | None = None
        threading.Thread(target=self._read, name=f"certify-{name}", daemon=True).start()

    @property
    def pid(self) -> int:
        """The server process's pid."""
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """Whether the server process has not exited."""
        return self.proc.poll() is None

    def send(self, params: Mapping[str, Scalar],
             on_started: Callable[[int], None] | None = None,
             before: Callable[[], None] | None = None) -> Child:
        """Send a job; its :class:`Child` follows it. ``before`` runs just before the job's
        line is written, under the lock that keeps jobs in order (what the job needs beside
        its line: a job host's secret pipe). ``on_started(pid)`` runs in the reader thread
        as the server reports the fork, before anyone waiting for it wakes. OSError where
        the server cannot be written to (the job is then dropped)."""
        with self._lock:
            child = Child(next(self._ids), self, on_started)
            if self._closed:
                child._end(ServerLost(self._lost_why()))
                return child
            self._pending[child.id] = child
            try:
                if before is not None:
                    before()
                write_line(self._jobs, Job(child.id, dict(params)))
            except (OSError, ValueError):
                self._pending.pop(child.id, None)
                raise
        return child

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the server (its children die with it: parent-death signal) and wait up to
        ``timeout`` seconds for its end."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """End of file on the server's stdin (it kills its children and exits), then SIGKILL
        where it has not exited within ``timeout`` seconds."""
        with contextlib.suppress(OSError):
            self._jobs.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def _read(self) -> None:
        try:
            for line in read_lines(self._reports):
                self._dispatch(decode_report(line))
        except Exception as exc:  # noqa: BLE001 - a protocol error, or a callback's failure
            # on what the server said: either way the channel is no longer trusted
            log.error("%s: fork server %d broke the protocol (%s); it is killed", self.name,
                      self.proc.pid, exc)
            self.kill()
        finally:
            self._reader_done()

    def _reader_done(self) -> None:
        """The report channel ended: every job still pending is lost."""
        with contextlib.suppress(OSError):
            self._reports.close()
        self.proc.wait()
        with self._lock:
            self._closed = True
            lost = list(self._pending.values())
            self._pending.clear()
            with contextlib.suppress(OSError):
                self._jobs.close()
        if lost or self.proc.returncode not in (0, None):
            log.warning("%s: fork server %d ended (status %s) with %d job(s) running",
                        self.name, self.proc.pid, self.proc.returncode, len(lost))
        for child in lost:
            child._end(ServerLost(self._lost_why()))

    def _dispatch(self, msg: Report) -> None:
        if isinstance(msg, Ready):
            self.facts = msg
            if self._on_ready is not None:
                self._on_ready(msg)
            self.ready.set()
            return
        with self._lock:
            child = self._pending.get(msg.id)
            if child is not None and not isinstance(msg, Started):
                self._pending.pop(msg.id, None)
        if child is not None:
            child._report(msg)

    def _lost_why(self) -> str:
        return f"the {self.name} process ended (status {self.proc.returncode})"


def start(argv: Sequence[str], name: str, env: Mapping[str, str],
          pass_fds: Sequence[int] = (), preexec_fn: Callable[[], None] | None = None,
          on_ready: Callable[[Ready], None] | None = None) -> Server:
    """Start a fork server process (``argv``, pipes on its stdin and stdout; its stderr is
    the service's, so its warnings reach the service's log) and its :class:`Server`."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=dict(env), close_fds=True, pass_fds=tuple(pass_fds),
                            preexec_fn=preexec_fn)
    return Server(proc, name, on_ready)

