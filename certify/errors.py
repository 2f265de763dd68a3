"""The one error tree of certify, and the one table of process exit codes.

Every error a user can cause carries the process exit code it maps to and a hint. The CLI prints
``error: <message>`` and ``hint: <hint>`` on one line each and exits with ``exit_code``; the
codes of every command come from :data:`EXIT_CODES` (errors through their class, a run's
verdict through :func:`exit_code_for_verdict`), and nothing else decides exit codes.

======  =====================================================================================
code    meaning
======  =====================================================================================
0       OK: ``run``: every check PASS or INFO; ``demo``: the card was written (whatever its
        verdict); ``verify``, ``verify-bundle``: valid; ``compare``: no resolved regression;
        other commands: done
1       FAIL: ``run``: a check failed (card written); ``verify``, ``verify-bundle``: invalid
        or tampered; ``compare``: a resolved regression on a gating row with a threshold (a
        threat model, or a check that is not an attack row)
2       usage, suite or data error (nothing measured)
3       the model could not be loaded, reached or used (an endpoint failing beyond retries)
4       ``compare``: the two runs are not comparable (suite, data digest, threat model,
        reference model or results schema differ; the message says which)
5       ``run``: a check ERRORed (card written)
6       ``run``: a check is INCONCLUSIVE (card written)
7       ``run``: a check passed with a WARNing (card written)
8       ``verify``: the signature and the signed payload are intact but the visible layer was
        not compared (a card from another renderer, or a card.pdf from before PDF
        signatures)
9       untrusted: ``compare --pubkey``, ``runs fetch``/``watch``, ``submit`` and the GitHub
        Action met a card (or a service's answer) that cannot be trusted: unsigned where a key
        was given, tampered, signed by another key, not in the service's log, or naming
        another run; no verdict of it is reported (``verify`` keeps 1 for an invalid card)
70      internal error: a bug in certify (no card; rerun with ``--debug``, or
        ``CERTIFY_DEBUG=1`` for a command without it, and report it)
130     interrupted (records kept: rerun with ``--resume``)
======  =====================================================================================

When several checks' verdicts apply, the run's verdict is the first of
:data:`VERDICT_PRECEDENCE` (ERROR > FAIL > INCONCLUSIVE > WARN > PASS) present among them.
SKIPPED checks (a check the model cannot be evaluated by, e.g. a score-based attack on a
labels-only endpoint) were not evaluated: they are listed and counted, never passed, and the
verdict is computed over the evaluated checks. A run whose every check is skipped evaluated
nothing: it is refused when the suite loads (code 2), and its verdict could never be PASS.
Code 70 is ``EX_SOFTWARE`` from sysexits.h: a crash must not read as a failed check (1), which
a pipeline may accept because the card was still written.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_MODEL = 3
EXIT_NOT_COMPARABLE = 4
EXIT_ERROR = 5
EXIT_INCONCLUSIVE = 6
EXIT_WARN = 7
EXIT_VISIBLE_NOT_COMPARED = 8
EXIT_UNTRUSTED = 9
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

#: Every exit code of every command, with its meaning (the README's table says the same).
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "OK: run: every check PASS/INFO; demo: card written; verify: valid; compare: "
             "every gating row with a threshold unchanged or non-inferior; others: done",
    EXIT_FAIL: "FAIL: run: a check failed (card written); verify, verify-bundle: invalid; "
               "compare: a resolved regression on a gating row (a threat model, or a check "
               "that is not an attack row) with a threshold",
    EXIT_USAGE: "usage, suite or data error",
    EXIT_MODEL: "the model could not be loaded, reached or used",
    EXIT_NOT_COMPARABLE: "compare: the runs are not comparable (source data or reference "
                         "model differ, or no check in common)",
    EXIT_ERROR: "run: a check ERRORed (card written)",
    EXIT_INCONCLUSIVE: "run: a check is INCONCLUSIVE (card written); compare: neither a "
                       "regression nor non-inferiority shown for a gating row with a "
                       "threshold",
    EXIT_WARN: "run: a check passed with a WARNing (card written)",
    EXIT_VISIBLE_NOT_COMPARED: "verify: the signature and the signed payload are intact but "
                               "the visible layer was not compared (a card from another "
                               "renderer, or a card.pdf from before PDF signatures)",
    EXIT_UNTRUSTED: "untrusted: compare --pubkey, runs fetch/watch, submit and the Action met a "
                    "card (or a service's answer) that cannot be trusted: unsigned where a key "
                    "was given, tampered, another key's, not in the service's log, or naming "
                    "another run; no verdict of it is reported (verify keeps 1 for invalid)",
    EXIT_INTERNAL: "internal error (a bug: rerun with --debug, or CERTIFY_DEBUG=1, and report "
                   "it)",
    EXIT_INTERRUPTED: "interrupted: records kept, rerun with --resume",
}

#: Run verdicts, most severe first: a run's verdict is the first one any of its checks has.
VERDICT_PRECEDENCE: tuple[str, ...] = ("ERROR", "FAIL", "INCONCLUSIVE", "WARN", "PASS")

_VERDICT_EXIT: dict[str, int] = {
    "ERROR": EXIT_ERROR,
    "FAIL": EXIT_FAIL,
    "INCONCLUSIVE": EXIT_INCONCLUSIVE,
    "WARN": EXIT_WARN,
    "PASS": EXIT_OK,
    "INFO": EXIT_OK,  # a check without a threshold that has nothing to warn about
}

#: The codes with which ``certify run`` ends having written its card: one per verdict.
CARD_WRITTEN_CODES: frozenset[int] = frozenset(_VERDICT_EXIT.values())


#: A check that was not evaluated on this model (no query sent): not a verdict, never a pass.
SKIPPED = "SKIPPED"

#: What each status of a check row means, whatever its kind (each kind adds its own cases:
#: :attr:`certify.kinds.Kind.statuses`). The documentation's suite reference prints it.
STATUS_MEANINGS: dict[str, str] = {
    "PASS": "the check's threshold is met: with the interval rule its metric's whole 95% "
            "interval meets it (with the point rule, the point estimate), and nothing warned",
    "FAIL": "the threshold is missed: the whole 95% interval lies on the wrong side of it "
            "(with the point rule, the point estimate misses it)",
    "INCONCLUSIVE": "neither shown: the interval straddles the threshold (the row says how "
                    "many samples would decide it, or why more samples would not), the "
                    "thresholded metric is not a number, or samples were left out for "
                    "non-finite model outputs; not a pass",
    "WARN": "the threshold is met (or there is none) but a warning stops the row from "
            "passing; the warning says why",
    "INFO": "no threshold and nothing to warn about: the figures are information",
    "ERROR": "the check raised an error; the run goes on and the card is written, and the row "
             "names the error",
    SKIPPED: "not evaluated on this model (no query sent), with the reason: listed and "
             "counted, never passed; the verdict is computed over the evaluated checks",
}


def overall_verdict(statuses: Iterable[str]) -> str:
    """The run's verdict from its checks' statuses: the most severe by
    :data:`VERDICT_PRECEDENCE`; PASS when none is more severe (INFO counts as PASS).

    SKIPPED checks are left out (they were not evaluated); when every check was skipped there
    is nothing to pass, and the verdict is ERROR.
    """
    listed = list(statuses)
    present = set(listed) - {SKIPPED}
    unknown = present - set(_VERDICT_EXIT)
    if unknown:
        raise ValueError(f"unknown check status {sorted(unknown)}")
    if listed and not present:
        return "ERROR"
    return next((v for v in VERDICT_PRECEDENCE if v in present), "PASS")


def exit_code_for_verdict(verdict: str) -> int:
    """The exit code of ``certify run`` for a run's (or a check's) verdict."""
    try:
        return _VERDICT_EXIT[verdict]
    except KeyError:
        raise ValueError(f"unknown verdict {verdict!r}; expected one of "
                         f"{', '.join(_VERDICT_EXIT)}") from None


class CertifyError(Exception):
    """Base class: a problem the user can fix, reported without a traceback.

    Subclasses set ``exit_code`` to a key of :data:`EXIT_CODES`.
    """

    exit_code: int = EXIT_USAGE

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

    exit_code = EXIT_USAGE


class SuiteError(CertifyError):
    """A suite file that cannot be read or does not validate (exit 2)."""

    exit_code = EXIT_USAGE


class DataError(CertifyError):
    """A dataset that cannot be read: missing files, bad rows, bad labels (exit 2)."""

    exit_code = EXIT_USAGE


class PdfUnavailableError(CertifyError):
    """WeasyPrint cannot load its system libraries (Pango, HarfBuzz, fontconfig), which pip
    does not install: no PDF can be rendered here (exit 2 where a PDF was the point, e.g.
    ``compare --pdf`` or verifying a card.pdf; ``run``, ``demo`` and ``sign`` write the HTML
    card instead and print how to get the PDF)."""

    exit_code = EXIT_USAGE


class ModelError(CertifyError):
    """A model that cannot be loaded, reached or used as an image classifier (exit 3)."""

    exit_code = EXIT_MODEL


class BudgetExceeded(CertifyError):
    """A check asked for more model queries than its budget allows.

    The runner records it as the check's ERROR (the run exits 5); the code applies only if it
    escapes a check.
    """

    exit_code = EXIT_ERROR


class VerificationError(CertifyError):
    """A card's payload or its signature does not check out (exit 1)."""

    exit_code = 1


class UntrustedError(CertifyError):
    """A card, or a service's answer about one, that cannot be trusted (exit 9): a card
    unsigned where a key was given, tampered, signed by another key than the one given or
    pinned, missing from the service's transparency log, or an answer about another run than
    the one asked. Where a gate or a client must tell "we got worse" (1) from "this is not what
    it claims" (9). ``certify verify`` itself keeps exit 1 for an invalid card
    (:class:`VerificationError`)."""

    exit_code = EXIT_UNTRUSTED

    @classmethod
    def from_error(cls, exc: CertifyError, prefix: str = "") -> UntrustedError:
        """The same message and hint, as an untrusted card (``prefix`` before the message)."""
        return cls(prefix + exc.message, hint=exc.hint)


class AttackProtocolError(CertifyError):
    """An attack broke the sealed attack protocol (:meth:`certify.attacks.Attack.__call__`).

    It reported a number of queries other than the counter saw, or returned candidates of the
    wrong shape. The runner records the check as ERROR (exit 5): the attack's evidence cannot
    be trusted, so it supports no verdict.
    """

    exit_code = EXIT_ERROR


class NonFiniteOutput(CertifyError):
    """The model answered a query with NaN or infinite scores.

    Raised by the counting wrapper on any query after the model was loaded; the runner makes
    the samples concerned error records (never robust or correct ones). At load, a non-finite
    answer to the probe images is a :class:`ModelError` instead.
    """

    exit_code = EXIT_MODEL
