"""A finished run's card and results: its files (``/runs/{id}/card.html``, ``card.pdf``,
``results.json``, ``results.json.sig``) and ``certify compare`` of two runs, each served only
once its stored results pass their signature check with the service's key
(:func:`certify.service.shared.verified_results`)."""

from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from certify.service.routes.deps import Reader, RunId, Svc
from certify.service.shared import API, ARTEFACTS, artefact_response, find_run, verified_results

router = APIRouter(tags=["runs"])


@router.get(f"{API}/runs/{{run_id}}/{{name}}")
def artefact(svc: Svc, run_id: RunId, name: str, who: Reader) -> Response:
    """A finished run's card.html, card.pdf, results.json or results.json.sig, served
    once its stored results pass their signature check."""
    if name not in ARTEFACTS:
        raise HTTPException(404, f"no such file {name!r}; one of {', '.join(ARTEFACTS)}")
    return artefact_response(svc, find_run(svc, run_id, who), name)


@router.get(f"{API}/runs/{{a}}/compare/{{b}}")
def compare_runs(svc: Svc, a: RunId, b: RunId, who: Reader,
                 tolerance: float | None = Query(None, ge=0, le=100)) -> dict[str, object]:
    """``certify compare`` of two finished runs (a = old, b = new), from their stored
    results once these pass their signature check; the sides are named by run id.
    ``tolerance`` is the CLI's ``--tolerance``. Without --tolerance, the gate's tolerance
    is the smaller of OLD's and NEW's release_tolerance, a run whose results state none
    counting as certify's default of 2, so the release under test can narrow its gate but
    never widen it. (The rule: :data:`certify.tolerance.TOLERANCE_RULE`.)"""
    from certify.report.compare import NotComparable, compare
    from certify.results import OLDER_SCHEMAS, SCHEMA, parse_result

    runs = [find_run(svc, rid, who) for rid in (a, b)]  # both readable, before anything
    results = []
    for rid, run in zip((a, b), runs, strict=True):
        if run.state != "done":
            raise HTTPException(409, f"run {rid} is {run.state}, not done")
        doc = json.loads(verified_results(svc, run))
        readable = (SCHEMA, *OLDER_SCHEMAS)  # runs stored before an upgrade compare too
        if doc.get("schema") not in readable:
            raise NotComparable(f"incompatible certify schema: run {rid} is "
                                f"{doc.get('schema')!r}, this service compares "
                                f"{' and '.join(readable)}",
                                hint="rerun the older release's suite with this certify")
        results.append(parse_result(doc, older=True))
    c = compare(results[0], results[1], tolerance)
    out = c.to_json()
    for side, rid in (("old", a), ("new", b)):  # run ids, never the server's paths
        out[side].pop("path", None)
        out[side]["run_id"] = rid
    return {**out, "exit_code": c.exit_code}
