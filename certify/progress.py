"""The progress seam: the library reports, the CLI decides how to show it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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


def report_reused(progress: Progress, n: int) -> None:
    """Report ``n`` units of the current task as done by an earlier run: through ``reuse``
    where the reporter has it, as ordinary progress otherwise."""
    if isinstance(progress, ReusesRecords):
        progress.reuse(n)
    else:
        progress.advance(n)


class NullProgress:
    """Shows nothing (the library's default)."""

    def start(self, label: str, total: int) -> None:  # noqa: D102
        pass

    def advance(self, n: int) -> None:  # noqa: D102
        pass

    def finish(self) -> None:  # noqa: D102
        pass
