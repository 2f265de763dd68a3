"""Card verification in bounded child processes, for the service's public verify route.

The API process never parses an uploaded card. It writes the upload into a private folder and
hands the job to the *verifier*: one process per service process
(``python -m certify.service.verify_sandbox``), started at the first verification, that has
imported the verification code (certify's report package pulls in torch through the check
registry; with pypdf and Pillow, 2 to 5 s of CPU and about 220 MB). For each card the verifier
forks a child, which

- lowers its priority (nice 10), so that the API process keeps the CPU it needs to answer;
- caps its address space at the verifier's own plus ``--verify-memory-mb`` (``RLIMIT_AS``: an
  allocation beyond it fails) and its CPU time at ``--verify-timeout`` (``RLIMIT_CPU``);
- moves into the upload's folder and verifies the file by its own name (so that no message
  names a server path), with ``max_inflated_bytes`` for embedded attachments;
- writes ``answer.json`` beside that folder and exits.

The verifier kills a child at the wall-clock limit and reports how each one ended (with its
peak RSS, from ``wait4``). A child lives for one card: whatever a card did to the heap is
given back when it exits. Forking a child costs tens of milliseconds where a fresh interpreter
per card would pay those seconds of imports each time (``benchmarks/verify_load.py`` measures
both).

The verifier speaks the fork protocol (:mod:`certify.service.forkproto`, which the service's
job hosts speak too): a job on its stdin per card, a report on its stdout as each child starts
and ends (:func:`outcome_of` reads how). When the service process ends, the verifier reads
end-of-file, kills its children and exits. Its loop is
:class:`certify.service.forks.ForkLoop`, which the job hosts (:mod:`certify.service.jobhost`)
share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from certify.service import forkproto

#: The child's answer, written beside the folder holding the upload.
ANSWER = "answer.json"
#: The folder (inside the job's private folder) holding the upload under its own name.
INBOX = "in"
#: Largest answer the service reads back (a card certify wrote answers in a few KB).
MAX_ANSWER_BYTES = 1 << 20
#: Largest file a verification child may write.
MAX_WRITE_BYTES = 64 << 20
#: Exit status of a child whose allocation failed at its memory limit.
EXIT_MEMORY = 3
#: Exit status of a child that failed before or after verifying (a bug, not the card).
EXIT_BROKEN = 70
#: Seconds the service gives the verifier to start (import the verification code).
START_ALLOWANCE_S = 120.0


@dataclass(frozen=True)
class Limits:
    """What one verification may take (``certify serve --verify-*``)."""

    #: Address space beyond the verifier's own (its imported code and libraries), in MB.
    memory_mb: int = 1024
    #: Wall-clock and CPU seconds.
    timeout_s: float = 30.0
    #: Most bytes an embedded attachment may inflate to (``--max-verify-mb``).
    max_inflated_bytes: int = 16 * 2**20


@dataclass(frozen=True)
class Outcome:
    """How a verification child ended, as the verifier reports it."""

    #: ``answered`` (answer.json written), ``memory``, ``time``, ``signal`` or ``failed``.
    how: str
    #: Peak resident set of the child (KB), from ``wait4``; 0 where it never started.
    maxrss_kb: int = 0
    #: The child's CPU seconds (user + system).
    cpu_s: float = 0.0
    #: The signal that ended it, or its exit status.
    code: int = 0


class Busy(RuntimeError):
    """Every verification slot stayed busy for as long as an upload may wait."""


class VerifierUnavailable(RuntimeError):
    """The verifier process stopped or did not answer in time (not the card's fault)."""


# --- the service's side ------------------------------------------------------------------

class Verifier:
    """The service process's handle on its verifier process (started on first use).

    Thread-safe: jobs may be submitted from any thread or event loop; the fork protocol's
    client (:class:`certify.service.forkproto.Server`) resolves each job from the verifier's
    reports.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: forkproto.Server | None = None

    @property
    def pid(self) -> int | None:
        """The verifier's process id (None before the first verification)."""
        server = self._server
        return server.pid if server is not None and server.alive else None

    def _start(self) -> forkproto.Server:
        from certify.service.config import child_env

        env = child_env()  # a verification never needs the node's keys or credentials
        # one thread per library: the verifier forks, and a child has no use for thread pools
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        return forkproto.start([sys.executable, "-m", "certify.service.verify_sandbox"],
                               "verifier", env)

    def submit(self, folder: Path, name: str, public_pem: bytes, limits: Limits
               ) -> forkproto.Child:
        """Ask for ``folder/in/name`` to be verified; the child's future says how it ended
        (:func:`outcome_of`)."""
        job: dict[str, forkproto.Scalar] = {
            "folder": str(folder), "name": name, "key": public_pem.decode("ascii"),
            "memory_mb": limits.memory_mb, "timeout_s": limits.timeout_s,
            "max_inflated_bytes": limits.max_inflated_bytes}
        with self._lock:
            if self._server is None or not self._server.alive:
                self._server = self._start()
            server = self._server
        try:
            return server.send(job)
        except (OSError, ValueError) as exc:
            raise VerifierUnavailable(f"cannot reach the verifier: {exc}") from None

    async def run(self, folder: Path, name: str, public_pem: bytes, limits: Limits) -> Outcome:
        """Verify ``folder/in/name`` in a child; wait for it without holding a thread."""
        child = self.submit(folder, name, public_pem, limits)
        # the verifier enforces the limit; this bound only catches a verifier that hangs
        ready = child.server.ready.is_set()
        grace = limits.timeout_s + 15.0 + (0.0 if ready else START_ALLOWANCE_S)
        try:
            ending = await asyncio.wait_for(asyncio.wrap_future(child.future), grace)
        except asyncio.TimeoutError:
            self.restart()
            raise VerifierUnavailable("the verifier did not answer in time") from None
        except forkproto.ServerLost as exc:
            raise VerifierUnavailable(str(exc)) from None
        return outcome_of(ending)

    def restart(self) -> None:
        """Kill the verifier and its children; the next job starts a new one."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None and server.alive:
            server.proc.kill()  # its children die with it (parent-death signal)

    def close(self) -> None:
        """Stop the verifier: end of file on its stdin; it kills its children and exits."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.close(10.0)


def outcome_of(ending: forkproto.Ending) -> Outcome:
    """How a verification child ended, from the verifier's report: ``answered`` (exit 0),
    ``memory`` (its allocation failed at the limit), ``time`` (killed at its deadline, or its
    CPU limit's SIGXCPU), ``signal`` (another signal), ``failed`` (any other status, or no
    fork)."""
    if isinstance(ending, forkproto.ForkFailed):
        return Outcome("failed", code=ending.errno)
    if ending.returncode < 0:
        code = -ending.returncode
        how = "time" if ending.overdue or code == signal.SIGXCPU else "signal"
    else:
        code = ending.returncode
        how = {0: "answered", EXIT_MEMORY: "memory"}.get(code, "failed")
    return Outcome(how, ending.maxrss_kb, ending.cpu_s, code)


_VERIFIER: Verifier | None = None
_VERIFIER_LOCK = threading.Lock()


def verifier() -> Verifier:
    """This process's verifier handle (one per process, whatever the number of services)."""
    global _VERIFIER
    with _VERIFIER_LOCK:
        if _VERIFIER is None:
            import atexit

            _VERIFIER = Verifier()
            atexit.register(_VERIFIER.close)
        return _VERIFIER


class Gate:
    """At most ``slots`` verifications at once; a caller waits at most ``wait_s`` for one.

    Waiting is asynchronous: a queue of waiting uploads holds no thread (the routes' thread
    pool stays free for ``/health`` and the rest of the API)."""

    def __init__(self, slots: int, wait_s: float) -> None:
        self.slots, self.wait_s = slots, wait_s
        self._sem: asyncio.Semaphore | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot; raise :class:`Busy` when none frees within ``wait_s``."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
        try:
            await asyncio.wait_for(self._sem.acquire(), self.wait_s)
        except asyncio.TimeoutError:
            raise Busy(f"no verification slot free within {self.wait_s:g} s") from None
        try:
            yield
        finally:
            self._sem.release()


def limit_reason(outcome: Outcome, limits: Limits) -> str:
    """What the service says of a child that its limits (or a signal) ended."""
    if outcome.how == "memory":
        said = f"memory: more than {limits.memory_mb} MB"
    elif outcome.how == "time":
        said = f"time: more than {limits.timeout_s:g} s"
    elif outcome.how == "signal":
        sig = outcome.code
        with contextlib.suppress(ValueError):
            sig = signal.Signals(outcome.code).name  # type: ignore[assignment]
        said = f"memory/time: its process was ended by {sig}"
    else:  # not a limit: the child failed on its own (the service's log has its traceback)
        return (f"the card could not be verified: its verification process failed (status "
                f"{outcome.code})")
    return f"the card could not be verified within the service's limits ({said})"


# --- the verifier's side -----------------------------------------------------------------

def _preload() -> None:
    """Import what a verification needs, once, before any child is forked (what it does not
    need, the card's PDF renderer and pyHanko's signer, stays out: a child imports it if ever
    it must)."""
    import certify.report.sign
    import certify.report.visible
    import certify.results  # noqa: F401

    for optional in ("pypdf", "asn1crypto.cms", "PIL.Image", "PIL.PngImagePlugin"):
        with contextlib.suppress(Exception):  # absent or unloadable: the child says so
            __import__(optional)
    # the renderer's identity (digests of the templates and code) that an HTML card's check
    # compares; computed once here rather than in every child
    with contextlib.suppress(Exception):
        from certify.report.card import html_renderer

        html_renderer()


def _vm_bytes() -> int:
    """This process's address space now (VmSize)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limit_self(memory_mb: int, timeout_s: float) -> None:
    import resource

    os.nice(10)
    cap = _vm_bytes() + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    cpu = max(1, math.ceil(timeout_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    # the child writes one small answer (libraries may write a font cache): nothing a card
    # does may fill the disk; a write past the limit fails (EFBIG) instead of killing it
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_WRITE_BYTES, MAX_WRITE_BYTES))


def answer_for(path: Path, key_pem: bytes, max_inflated_bytes: int) -> dict[str, object]:
    """Verify ``path`` (relative: messages name the file, not a folder) and say what the API
    answers of it: valid or not, why, and what a valid card states."""
    import dataclasses
    import inspect

    from cryptography.hazmat.primitives import serialization

    from certify.errors import CertifyError
    from certify.report.sign import fingerprint, verify_file

    key = serialization.load_pem_public_key(key_pem)
    kw: dict[str, int] = {}
    if "max_inflated_bytes" in inspect.signature(verify_file).parameters:
        kw["max_inflated_bytes"] = max_inflated_bytes
    try:
        v = verify_file(path, key, **kw)  # type: ignore[arg-type]
    except CertifyError as exc:
        return {"valid": False, "reason": exc.message, "hint": exc.hint,
                "service_key": fingerprint(key)}  # type: ignore[arg-type]
    except RecursionError:
        return {"valid": False, "reason": f"{path}: the card could not be verified within the "
                "service's limits (nesting depth)", "hint": "do not trust this card",
                "service_key": fingerprint(key)}  # type: ignore[arg-type]
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a hostile file is invalid, not a server error
        return {"valid": False, "reason": f"{path}: the card could not be read "
                f"({type(exc).__name__})", "hint": "is it a card certify wrote?",
                "service_key": fingerprint(key)}  # type: ignore[arg-type]
    out: dict[str, object] = {"valid": True, "key_fingerprint": v.signature.key_fingerprint,
                           "signed": v.signature.signed, "visible": v.visible,
                           "model": None, "suite": None, "verdict": None, "checks": {},
                           "run_id": None}
    if v.result is not None:  # None: an older results format, whose figures are not re-read
        m = v.result.measurement
        service = (v.result.provenance.model_extra or {}).get("service") or {}
        out.update(model=m.model.name, suite=m.suite.name, verdict=m.verdict,
                   checks={c.id: c.status for c in m.checks},
                   run_id=service.get("run_id") if isinstance(service, dict) else None)
    # what else the verifier established (whether the visible layer was compared, the
    # results format, a PDF's standard signature ...), as plain values
    for f in dataclasses.fields(v):
        if f.name not in out and f.name not in ("result", "signature"):
            value = _plain(getattr(v, f.name))
            if value is not _SKIP:
                out[f.name] = value
    note = getattr(v, "format_note", None)
    if callable(note):
        with contextlib.suppress(Exception):
            out["note"] = note()
    return out


_SKIP = object()


def _plain(value: object) -> object:
    """``value`` as JSON (scalars, sequences of them, dataclasses of them), else ``_SKIP``."""
    import dataclasses

    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(
            isinstance(x, (str, bool, int, float)) for x in value):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {k: x for k, x in fields.items() if x is not _SKIP}
    return _SKIP


def _child(job: forkproto.Job) -> None:
    """The forked child: limit itself, verify, write the answer; never returns."""
    from certify.service.forks import die_with_parent

    status = EXIT_BROKEN
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # stdout is the verifier's report channel
        os.closerange(3, 1024)
        die_with_parent()
        # a hostile file makes parsers warn by the thousand: the answer says what matters
        logging.disable(logging.CRITICAL)
        import warnings

        warnings.simplefilter("ignore")
        _limit_self(job.integer("memory_mb"), job.number("timeout_s"))
        folder = Path(job.text("folder"))
        name = job.text("name")
        os.chdir(folder / INBOX)
        try:
            answer = answer_for(Path(name), job.text("key").encode("ascii"),
                                job.integer("max_inflated_bytes"))
            data = json.dumps(answer).encode()
        except MemoryError:
            status = EXIT_MEMORY
            raise
        if len(data) > MAX_ANSWER_BYTES - 1:
            data = json.dumps({"valid": False, "reason": f"{name}: the card states more "
                               "than this service reports", "hint": "do not trust this card"}
                              ).encode()
        tmp = folder / (ANSWER + ".part")
        tmp.write_bytes(data)
        tmp.rename(folder / ANSWER)
        status = 0
    except BaseException:  # noqa: BLE001 - the status says it; nothing may escape a fork
        pass
    finally:
        os._exit(status)


def serve(stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None) -> None:
    """The verifier's loop (:class:`certify.service.forks.ForkLoop`): fork a child per job,
    kill it at its deadline; the loop reports how each ended."""
    from certify.service.forks import Forked, ForkLoop

    stdin = stdin or sys.stdin.buffer
    if stdout is None:
        # reports go on a private copy of stdout; what a library prints goes to stderr (a
        # stray line on the report channel is a protocol error: the verifier is killed)
        stdout = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
    # the service ends this process (end of file on stdin), not a Ctrl-C sent to the group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _preload()
    loop = ForkLoop(stdin.fileno(), stdout)

    def start(job: forkproto.Job) -> Forked:
        deadline = time.monotonic() + job.number("timeout_s")
        pid = loop.fork()
        if pid == 0:
            _child(job)
        return Forked(pid, deadline)

    loop.report(forkproto.Ready(os.getpid()))
    loop.run(start)


def main() -> int:
    """Entry point of the verifier process."""
    logging.basicConfig(level=logging.WARNING)
    try:
        serve()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
