"""The progress seam: the library reports, the CLI decides how to show it."""

from __future__ import annotations

from typing import Protocol


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


class NullProgress:
    """Shows nothing (the library's default)."""

    def start(self, label: str, total: int) -> None:  # noqa: D102
        pass

    def advance(self, n: int) -> None:  # noqa: D102
        pass

    def finish(self) -> None:  # noqa: D102
        pass
