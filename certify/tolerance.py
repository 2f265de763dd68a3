"""The release gate's tolerance: one rule, stated in one sentence, held by one function.

``certify compare``, the GitHub Action (:mod:`certify.ci_action`), the service's
``/runs/A/compare/B`` and the card all take the tolerance from :func:`gate_tolerance` and
quote :data:`TOLERANCE_RULE`. A leaf module: it imports nothing of certify, so the CLI's help
text can quote the rule without loading the comparison.
"""

from __future__ import annotations

import math

#: The largest drop a release may take per gating row in ``certify compare`` when a run states
#: none: percentage points for rates, percent of the old value for scores.
DEFAULT_RELEASE_TOLERANCE = 2.0

#: The rule, in the one sentence every help text, docstring and page quotes.
TOLERANCE_RULE = (
    "Without --tolerance, the gate's tolerance is the smaller of OLD's and NEW's "
    "release_tolerance, a run whose results state none counting as certify's default of "
    f"{DEFAULT_RELEASE_TOLERANCE:g}, so the release under test can narrow its gate but never "
    "widen it.")


def gate_tolerance(old: float | None, new: float | None, given: float | None = None
                   ) -> tuple[float, str]:
    """The tolerance a comparison uses, and where it came from in words.

    ``old`` and ``new``: the ``release_tolerance`` each run's results state (``None`` where
    they state none, e.g. results written before the key existed); ``given``: ``--tolerance``
    (the caller's explicit choice, which wins). Otherwise :data:`TOLERANCE_RULE`: the smaller
    of the two, a run that states none counting as :data:`DEFAULT_RELEASE_TOLERANCE`, so a NEW
    that states a wide tolerance cannot widen the gate it is judged by.

    Raises ``ValueError`` for a ``given`` that is not a finite number >= 0.
    """
    if given is not None:
        if not math.isfinite(given) or given < 0:
            raise ValueError(f"--tolerance must be a finite number >= 0, got {given}")
        return float(given), "--tolerance"

    def side(name: str, value: float | None) -> tuple[float, str]:
        if value is None:
            return DEFAULT_RELEASE_TOLERANCE, (f"{name} {DEFAULT_RELEASE_TOLERANCE:g}: its "
                                               "results state none, certify's default")
        return float(value), f"{name} {value:g}: its suite's release_tolerance"

    (o, o_why), (n, n_why) = side("OLD", old), side("NEW", new)
    low = min(o, n)
    return low, f"the smaller of OLD's and NEW's release_tolerance ({o_why}; {n_why})"
