"""Fork servers: a process that has imported what its jobs need forks one child per job.

Two parts of the service pay seconds of imports (torch, the check registry, the card's
renderers) for work that takes less: verifying an uploaded card
(:mod:`certify.service.verify_sandbox`) and computing a run (:mod:`certify.service.jobhost`).
Each runs a long-lived process that imports once and then, for each job, forks a child that
starts with those modules loaded and gives its memory back when it exits. This module is
what the two share:

- :class:`ForkLoop`, the process's loop, the server's side of the fork protocol
  (:mod:`certify.service.forkproto`: jobs on its stdin, reports on its report channel); it
  forks children, reports each one, kills those past their deadline, reaps them (``wait4``,
  with their resource usage) and reports how they ended, and when its stdin ends (the service
  went away) kills its children and returns once they are reaped;
- :func:`die_with_parent`, the parent-death signal (SIGKILL) that ties a process to the thread
  that started it;
- :func:`thread_count`: a process that forks must have one thread; a library that started a
  thread pool at import would leave its locks half-held in the child.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from certify.service.forkproto import (
    Ended,
    ForkFailed,
    Job,
    LineBuffer,
    Report,
    Started,
    decode_job,
    write_line,
)

_PR_SET_PDEATHSIG = 1
#: Exit status of a child that could not be set up after the fork.
EXIT_BROKEN = 70


_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL | None:
    """The C library, loaded once (None where it cannot be): between ``fork`` and ``exec`` (a
    ``preexec_fn``) a process must not ``dlopen``, whose lock another thread may have held at
    the fork."""
    global _libc
    if _libc is None:
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return _libc


def prctl(option: int, arg: int) -> None:
    """``prctl(option, arg)`` where the C library has it (a no-op elsewhere)."""
    lib = libc()
    with contextlib.suppress(OSError, AttributeError):
        if lib is not None:
            lib.prctl(option, arg, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it ends
    (``prctl(PR_SET_PDEATHSIG)``; a no-op where there is no prctl). Call :func:`libc` before
    forking where this runs as a ``preexec_fn``."""
    prctl(_PR_SET_PDEATHSIG, sig)


def thread_count() -> int:
    """This process's threads, as the kernel counts them (0 where /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


@dataclass(frozen=True)
class Forked:
    """A job's child, as ``start`` forked it: its pid, and the monotonic time at which the
    loop kills it (None: never; the service decides)."""

    pid: int
    deadline: float | None = None


@dataclass
class _Running:
    job_id: int
    deadline: float | None
    overdue: bool = False  # killed at its deadline


class ForkLoop:
    """A fork server's loop over its stdin (jobs) and its children (reaped as they end).

    For each job, ``start(job)`` forks its child (with :meth:`fork`) and returns it as
    :class:`Forked`; an OSError from it is reported as the fork's failure. The loop reports
    each child's start and end (:mod:`certify.service.forkproto`), kills a child at its
    deadline with ``kill(pid)`` (its end then says ``overdue``), and at the end of stdin kills
    every child and returns once they are all reaped.
    """

    def __init__(self, stdin_fd: int, out: IO[bytes]) -> None:
        self.stdin_fd, self.out = stdin_fd, out
        #: pid -> the job of each child not yet reaped
        self.children: dict[int, _Running] = {}
        self._wake_r, self._wake_w = -1, -1

    def report(self, msg: Report) -> None:
        """Send one report to the service."""
        write_line(self.out, msg)

    def fork(self) -> int:
        """``os.fork()``; in the child (0 returned) the loop's signal handling is undone and
        its stdin and report channel are /dev/null: the child can neither read jobs nor write
        reports, and holds neither pipe open."""
        for stream in (self.out, sys.stdout, sys.stderr):  # nothing buffered twice
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                # the report channel's fd stays open, on /dev/null: the file object that owns
                # it may still flush or close it, and it must not hold the service's pipe open
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (self.stdin_fd, self.out.fileno()):
                    os.dup2(devnull, fd)
                os.close(devnull)
                for fd in (self._wake_r, self._wake_w):
                    if fd > 2:
                        with contextlib.suppress(OSError):
                            os.close(fd)
            except BaseException:  # noqa: BLE001 - a child must never return into the loop
                os._exit(EXIT_BROKEN)
        return pid

    def run(self, start: Callable[[Job], Forked],
            kill: Callable[[int], None] | None = None) -> None:
        """Serve until stdin ends and no child is left (see the class)."""
        kill = kill or _sigkill
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        lines = LineBuffer()
        open_ = True
        while open_ or self.children:
            wait = self._overdue(kill)
            watch = [self.stdin_fd, self._wake_r] if open_ else [self._wake_r]
            try:
                ready, _, _ = select.select(watch, [], [], wait)
            except InterruptedError:
                ready = []
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            if self.stdin_fd in ready:
                data = os.read(self.stdin_fd, 1 << 16)
                if not data:  # the service ended: so do the children
                    open_ = False
                    for pid in self.children:
                        with contextlib.suppress(ProcessLookupError):
                            kill(pid)
                for line in lines.feed(data):
                    self._start(decode_job(line), start)
            self._reap()

    def _start(self, job: Job, start: Callable[[Job], Forked]) -> None:
        """Fork ``job``'s child (a child never returns from ``start``) and report it."""
        try:
            forked = start(job)
        except OSError as exc:
            self.report(ForkFailed(job.id, exc.errno or 0))
            return
        self.children[forked.pid] = _Running(job.id, forked.deadline)
        self.report(Started(job.id, forked.pid))

    def _overdue(self, kill: Callable[[int], None]) -> float:
        """Kill the children past their deadline; the seconds until the next one is due."""
        now = time.monotonic()
        for pid, child in self.children.items():
            if not child.overdue and child.deadline is not None and now >= child.deadline:
                child.overdue = True
                with contextlib.suppress(ProcessLookupError):
                    kill(pid)
        # a child killed for time is waited for at a short tick, not at its past deadline
        # (which would spin this loop until the kernel reaps it)
        due = [now + 0.05 if c.overdue else c.deadline for c in self.children.values()]
        times = [t for t in due if t is not None]
        return max(0.0, min(times) - now) if times else 3600.0

    def _reap(self) -> None:
        """Report each child that ended."""
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self.report(Ended(child.job_id, pid, os.waitstatus_to_exitcode(status),
                                  round(usage.ru_utime + usage.ru_stime, 3), usage.ru_maxrss,
                                  child.overdue))


def _sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
