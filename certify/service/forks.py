"""Fork servers: a process that has imported what its jobs need forks one child per job.

Two parts of the service pay seconds of imports (torch, the check registry, the card's
renderers) for work that takes less: verifying an uploaded card
(:mod:`certify.service.verify_sandbox`) and computing a run (:mod:`certify.service.jobhost`).
Each runs a long-lived process that imports once and then, for each job, forks a child that
starts with those modules loaded and gives its memory back when it exits. This module is
what the two share:

- :class:`ForkLoop`, the process's loop: one JSON job a line on its stdin, one JSON report a
  line on its report channel; it forks children, reaps them (``wait4``, with their resource
  usage), calls back at deadlines, and when its stdin ends (the service went away) kills its
  children and returns once they are reaped;
- :func:`die_with_parent`, the parent-death signal (SIGKILL) that ties a process to the thread
  that started it;
- :func:`thread_count`: a process that forks must have one thread; a library that started a
  thread pool at import would leave its locks half-held in the child.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

_PR_SET_PDEATHSIG = 1
#: Exit status of a child that could not be set up after the fork.
EXIT_BROKEN = 70


_libc: Any = None


def libc() -> Any:
    """The C library, loaded once: between ``fork`` and ``exec`` (a ``preexec_fn``) a process
    must not ``dlopen``, whose lock another thread may have held at the fork."""
    global _libc
    if _libc is None:
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return _libc


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that forked it ends
    (``prctl(PR_SET_PDEATHSIG)``; a no-op where there is no prctl). Call :func:`libc` before
    forking where this runs as a ``preexec_fn``."""
    with contextlib.suppress(OSError, AttributeError):
        libc().prctl(_PR_SET_PDEATHSIG, sig)


def thread_count() -> int:
    """This process's threads, as the kernel counts them (0 where /proc cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def write_report(out: BinaryIO, msg: dict[str, Any]) -> None:
    """One report line on ``out``, flushed at once."""
    out.write(json.dumps(msg).encode() + b"\n")
    out.flush()


class ForkLoop:
    """A fork server's loop over its stdin (jobs) and its children (reaped as they end).

    ``start(job)`` forks (with :meth:`fork`) and returns the child's pid, or None where it
    made none; ``reap(pid, status, rusage)`` hears how a child ended; ``tick(now)`` may kill
    overdue children and returns the next monotonic time it wants to be called at (None:
    none). At the end of stdin every child is killed with ``kill(pid)`` and the loop returns
    once they are all reaped.
    """

    def __init__(self, stdin_fd: int, out: BinaryIO) -> None:
        self.stdin_fd, self.out = stdin_fd, out
        self.children: set[int] = set()
        self._wake_r, self._wake_w = -1, -1

    def report(self, msg: dict[str, Any]) -> None:
        """Send one report line to the service."""
        write_report(self.out, msg)

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

    def run(self, start: Callable[[dict[str, Any]], int | None],
            reap: Callable[[int, int, Any], None],
            tick: Callable[[float], float | None] | None = None,
            kill: Callable[[int], None] | None = None) -> None:
        """Serve until stdin ends and no child is left."""
        kill = kill or (lambda pid: os.kill(pid, signal.SIGKILL))
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        buf = b""
        open_ = True
        while open_ or self.children:
            now = time.monotonic()
            due = tick(now) if tick is not None else None
            wait = 3600.0 if due is None else max(0.0, due - now)
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
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    child = start(json.loads(line))
                    if child is not None:
                        self.children.add(child)
            while self.children:
                try:
                    pid, status, usage = os.wait4(-1, os.WNOHANG)
                except ChildProcessError:
                    self.children.clear()
                    break
                if pid == 0:
                    break
                if pid in self.children:
                    self.children.discard(pid)
                    reap(pid, status, usage)
