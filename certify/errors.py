"""The one error tree of certify.

Every error a user can cause carries the process exit code it maps to and a hint. The CLI prints
``error: <message>`` and ``hint: <hint>`` on one line each and exits with ``exit_code``; nothing
else in the library decides exit codes.
"""

from __future__ import annotations


class CertifyError(Exception):
    """Base class: a problem the user can fix, reported without a traceback."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        # The one place error text is redacted: no URL credential or secret in any message.
        from certify.redact import redact

        message = redact(message)
        hint = None if hint is None else redact(hint)
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(CertifyError):
    """Bad command-line usage or run directory state (exit 2)."""

    exit_code = 2


class SuiteError(CertifyError):
    """A suite file that cannot be read or does not validate (exit 2)."""

    exit_code = 2


class DataError(CertifyError):
    """A dataset that cannot be read: missing files, bad rows, bad labels (exit 2)."""

    exit_code = 2


class ModelError(CertifyError):
    """A model that cannot be loaded, reached or used as an image classifier (exit 3)."""

    exit_code = 3


class BudgetExceeded(CertifyError):
    """A check asked for more model queries than its budget allows."""

    exit_code = 1


class NonFiniteOutput(CertifyError):
    """The model answered a query with NaN or infinite scores.

    Raised by the counting wrapper on any query after the model was loaded; the runner makes
    the samples concerned error records (never robust or correct ones). At load, a non-finite
    answer to the probe images is a :class:`ModelError` instead.
    """

    exit_code = 3
