"""Runs: submit one (``POST /runs``), list them, read one, follow it (server-sent events),
cancel it.

A submission passes only static checks before its 202
(:func:`certify.service.submit_checks.accept_submission`); the model is loaded and probed in
the run's own process.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select

from certify.service import auth, queue
from certify.service.db import FINAL_STATES, Run
from certify.service.routes.deps import MAX_INT, Reader, RunId, Submitter, Svc
from certify.service.shared import API, Services, find_run, run_json, runs_query

log = logging.getLogger("certify.service")

router = APIRouter(tags=["runs"])


@router.post(f"{API}/runs", status_code=202)
async def submit(
    svc: Svc,
    who: Submitter,
    model: Annotated[list[UploadFile] | None, File(
        description="The .onnx file, with its external-data files, or one archive")] = None,
    endpoint: Annotated[str | None, Form(description="An inference endpoint URL")] = None,
    endpoint_secret: Annotated[str | None, Form(
        description="Sent in endpoint_header; stored encrypted, never returned")] = None,
    endpoint_header: Annotated[str, Form()] = "Authorization",
    model_version: Annotated[str | None, Form(
        description="Model card: the version evaluated (an endpoint's: the version it "
                    "serves)")] = None,
    suite: Annotated[str | None, Form(description="A packaged suite name")] = None,
    suite_file: Annotated[UploadFile | None, File(description="A suite YAML")] = None,
    dataset: Annotated[str | None, Form(description="A registered dataset name")] = None,
    dataset_file: Annotated[UploadFile | None, File(description="An .npz (x, y)")] = None,
    reference: Annotated[UploadFile | None, File(
        description="A reference model (.onnx)")] = None,
    surrogate: Annotated[UploadFile | None, File(
        description="An endpoint's surrogate (.onnx): the white-box attacks take its "
                    "gradients and the endpoint judges every candidate")] = None,
    samples: Annotated[int | None, Form(ge=1, le=MAX_INT)] = None,
    seed: Annotated[int | None, Form(ge=0, le=MAX_INT)] = None,
    model_name: Annotated[str | None, Form(
        description="Model card: the model's name as its team calls it")] = None,
    owner: Annotated[str | None, Form(description="Model card: who ships the model")] = None,
    license: Annotated[str | None, Form(description="Model card: the model's license")
                       ] = None,
    intended_use: Annotated[str | None, Form(
        description="Model card: what the model is for (the card says 'not stated' "
                    "without it)")] = None,
    device: Annotated[str | None, Form(
        description="auto (default), cpu, or cuda: a cuda run waits for a worker with a "
                    "GPU")] = None,
) -> dict[str, object]:
    """Submit a run: 202 with its id once the static checks pass."""
    from certify.service.submit_checks import RunRequest, accept_submission

    run = await accept_submission(svc, who, RunRequest(
        model=list(model or []), endpoint=endpoint, endpoint_secret=endpoint_secret,
        endpoint_header=endpoint_header, model_version=model_version, suite=suite,
        suite_file=suite_file, dataset=dataset, dataset_file=dataset_file,
        reference=reference, surrogate=surrogate, samples=samples, seed=seed,
        card={"model_name": model_name, "model_version": model_version, "owner": owner,
              "license": license, "intended_use": intended_use}, device=device))
    log.info("run %s queued by token %d (%s)", run.id, who.token_id, run.model_name)
    return run_json(run)


@router.get(f"{API}/runs")
def list_runs(svc: Svc, who: Reader, model: str | None = None,
              suite: str | None = None, verdict: str | None = None,
              state: str | None = None,
              limit: Annotated[int, Query(ge=-MAX_INT, le=MAX_INT)] = 50,
              offset: Annotated[int, Query(ge=-MAX_INT, le=MAX_INT)] = 0
              ) -> dict[str, object]:
    """The caller's runs (an admin's: every run), newest first, filtered by model name,
    suite, verdict or state."""
    q = runs_query(who, model, suite, verdict, state)
    limit = max(1, min(limit, 500))
    with svc.factory() as s:
        total = s.scalar(select(func.count()).select_from(q.subquery()))
        runs = s.scalars(q.order_by(Run.seq.desc()).limit(limit).offset(max(0, offset)))
        return {"total": total, "runs": [run_json(r) for r in runs]}


@router.get(f"{API}/runs/{{run_id}}")
def get_run(svc: Svc, run_id: RunId, who: Reader) -> dict[str, object]:
    """One run: state, progress per check, statuses, verdict (404 for another token's
    private run, as for a missing one)."""
    return run_json(find_run(svc, run_id, who))


@router.get(f"{API}/runs/{{run_id}}/events")
async def events(svc: Svc, run_id: RunId, request: Request,
                 who: Reader) -> StreamingResponse:
    """Server-sent events: the run's state whenever it changes, until it ends."""
    find_run(svc, run_id, who)
    return StreamingResponse(_follow(svc, run_id, who, request),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


async def _follow(svc: Services, run_id: str, who: auth.Principal, request: Request
                  ) -> AsyncIterator[bytes]:
    """The event stream of :func:`events`: the run whenever it changes, then ``end``
    (``shutdown`` where the service stops first: follow again after the restart)."""
    last = None
    while True:
        try:
            run = await asyncio.to_thread(find_run, svc, run_id, who)
        except HTTPException:  # made private (or deleted) while followed
            yield b"event: end\ndata: {}\n\n"
            return
        text = json.dumps(run_json(run))
        if text != last:
            last = text
            yield f"event: run\ndata: {text}\n\n".encode()
        if run.state in FINAL_STATES:
            yield b"event: end\ndata: {}\n\n"
            return
        if svc.stopping.is_set():  # the run goes on after the restart: follow again
            yield b"event: shutdown\ndata: {}\n\n"
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.5)


@router.post(f"{API}/runs/{{run_id}}/cancel")
def cancel(svc: Svc, run_id: RunId, who: Submitter) -> dict[str, object]:
    """Cancel a queued or running run (your own, or any as admin)."""
    run = find_run(svc, run_id, who, own=True)
    if run.state in FINAL_STATES:
        raise HTTPException(409, f"run {run_id} already ended ({run.state})")
    with svc.factory() as s:
        queue.request_cancel(s, run_id)
    return run_json(find_run(svc, run_id, who, own=True))
