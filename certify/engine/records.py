"""Where records live: round keys, the subset seed's key, and the queries records claim."""

from __future__ import annotations

from certify.rundir import RunDir, SampleRecord

#: Separates a check id from its round in record keys (refused in check ids at suite load).
ROUND_SEP = "#round"

#: The key of the seed of the one stratified sample order all checks draw subsets from (no
#: check id contains '#').
SUBSET_KEY = "#samples"


def round_key(check_id: str, r: int) -> str:
    """Where round ``r`` of a check keeps its records in the run directory."""
    return check_id if r == 0 else f"{check_id}{ROUND_SEP}{r}"


def record_queries(r: SampleRecord) -> int:
    """Images one record's sample cost, over all models."""
    return int(r.get("queries", 0)) + int(r.get("ref_queries", 0))


def recorded_queries(run: RunDir) -> tuple[int, int]:
    """(model, reference) images recorded in the run directory so far."""
    recs = [r for recs in run.records.values() for r in recs.values()]
    return (sum(int(r.get("queries", 0)) for r in recs),
            sum(int(r.get("ref_queries", 0)) for r in recs))

