"""The progress seam: the library reports, its caller decides how to show it (the CLI with
rich, ``certify.evaluate`` with :class:`TextProgress` unless told otherwise)."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO, runtime_checkable


class Progress(Protocol):
    """Receives progress of long work (one task at a time)."""

    def start(self, label: str, total: int) -> None:
        """A task of ``total`` units begins."""
        ...

    def advance(self, n: int) -> None:
        """``n`` more units are done."""
        ...

    def finish(self) -> None:
        """The current task is over."""
        ...


@runtime_checkable
class ReusesRecords(Protocol):
    """A reporter that tells a resumed run's reused records apart from work done now (so its
    rate counts only the samples evaluated in this process)."""

    def reuse(self, n: int) -> None:
        """``n`` units of the current task were done by an earlier run (records kept on disk)."""
        ...


@runtime_checkable
class ShowsSteps(Protocol):
    """A reporter that names the step of the current task that is running (a check's
    binarization test between its samples), shown until the task next advances."""

    def step(self, text: str) -> None:
        """``text`` (e.g. "binarization test, 3 of 20") is what the current task does now."""
        ...


def report_step(progress: Progress, text: str) -> None:
    """Name the running step of the current task where the reporter can show one."""
    if isinstance(progress, ShowsSteps):
        progress.step(text)


class StepCounter:
    """Counts a task's repeated steps as they start, from whichever thread or batch, and
    names each on ``progress`` as "LABEL, k of n" (k: how many have started so far)."""

    def __init__(self, progress: Progress, started: dict[str, int] | None = None) -> None:
        import threading

        self._progress = progress
        #: label -> steps started so far (``started``: those an earlier pass of the same task
        #: made, whose records it keeps)
        self.started: dict[str, int] = dict(started or {})
        self._lock = threading.Lock()

    def __call__(self, label: str, total: int) -> None:
        """One more step ``label`` of ``total`` starts."""
        with self._lock:
            k = self.started[label] = self.started.get(label, 0) + 1
        report_step(self._progress, f"{label}, {min(k, total)} of {total}")


def report_reused(progress: Progress, n: int) -> None:
    """Report ``n`` units of the current task as done by an earlier run: through ``reuse``
    where the reporter has it, as ordinary progress otherwise."""
    if isinstance(progress, ReusesRecords):
        progress.reuse(n)
    else:
        progress.advance(n)


class NullProgress:
    """Shows nothing (the engine's default when its caller passes no reporter)."""

    def start(self, label: str, total: int) -> None:  # noqa: D102
        pass

    def advance(self, n: int) -> None:  # noqa: D102
        pass

    def finish(self) -> None:  # noqa: D102
        pass


class TextProgress:
    """Progress as text on a stream (``certify.evaluate``'s default): one line rewritten in
    place (``\\r``) in a terminal and in a Jupyter notebook, which both honour it, at most
    every :attr:`REDRAW_S` seconds; elsewhere (a log file, a pipe) one line when a task
    starts, every :attr:`LINE_EVERY_S` seconds and when it ends. Standard library only."""

    REDRAW_S = 0.2
    LINE_EVERY_S = 30.0

    def __init__(self, stream: TextIO | None = None, inplace: bool | None = None) -> None:
        self._stream = stream
        self._inplace = inplace
        self._label = ""
        self._total = 0
        self._done = 0
        self._reused = 0
        self._t0 = 0.0
        self._drawn = 0.0
        self._width = 0  # of the line last drawn in place (a shorter one pads it out)
        self._step = ""  # the running step of the task, until it advances

    @property
    def stream(self) -> TextIO:
        """Where the lines go (``sys.stderr`` at the time of writing unless given)."""
        return self._stream if self._stream is not None else sys.stderr

    def _rewrites(self) -> bool:
        if self._inplace is not None:
            return self._inplace
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty()) or "ipykernel" in sys.modules

    def text(self) -> str:
        """The current line: task, samples done of total, share, rate, elapsed and ETA."""
        elapsed = time.perf_counter() - self._t0
        new = self._done - self._reused
        rate = new / elapsed if elapsed > 0 else 0.0
        total, done = self._total, self._done
        parts = [f"{self._label}: {done:,}/{total:,}" + (f" ({100 * done / total:.0f}%)"
                                                         if total else "")]
        if self._step:
            parts.append(self._step)
        if self._reused:
            parts.append(f"{self._reused:,} reused")
        if new > 0:
            parts.append(f"{rate:,.1f}/s")
        parts.append(f"{elapsed:,.0f} s")
        if total and done >= total:
            parts.append("done")
        elif rate > 0 and total:
            parts.append(f"ETA {(total - done) / rate:,.0f} s")
        return ", ".join(parts)

    def _show(self, final: bool = False) -> None:
        now = time.perf_counter()
        if self._rewrites():
            if final or now - self._drawn >= self.REDRAW_S:
                line = self.text()
                pad = " " * max(0, self._width - len(line))
                self._width = 0 if final else len(line)
                self.stream.write("\r" + line + pad + ("\n" if final else ""))
                self.stream.flush()
                self._drawn = now
        elif final or now - self._drawn >= self.LINE_EVERY_S:
            self.stream.write(self.text() + "\n")
            self.stream.flush()
            self._drawn = now

    def start(self, label: str, total: int) -> None:  # noqa: D102
        self._label, self._total = label, total
        self._done = self._reused = 0
        self._step = ""
        self._t0 = time.perf_counter()
        self._drawn = 0.0
        self._show()

    def step(self, text: str) -> None:
        """Name the running step (shown until the task advances)."""
        self._step = text
        self._show()

    def reuse(self, n: int) -> None:
        """``n`` units were done by an earlier run (shown, kept out of the rate)."""
        self._done += n
        self._reused += n
        self._show()

    def advance(self, n: int) -> None:  # noqa: D102
        self._done += n
        self._step = ""
        self._show()

    def finish(self) -> None:  # noqa: D102
        if self._label:
            self._show(final=True)
        self._label = ""
