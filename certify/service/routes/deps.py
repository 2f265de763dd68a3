"""What the API's routes take from FastAPI's dependency injection: the service's state, the
caller with a role, and the parameters several resources share.

Authentication is :func:`certify.service.shared.require` (the caller, from a bearer token or,
for reading, the web UI's session cookie); :class:`certify.service.conn.AuthBeforeBody` reads
the role a route asks for here and refuses a caller before any of the request's body is read.
Tenants are :func:`certify.service.shared.find_run`: a run another token may not read answers
404, as a missing one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi import Path as PathParam

from certify.service import auth
from certify.service.runids import RUN_ID_FORMAT
from certify.service.shared import Services, require

#: The largest integer a request may carry (a database integer); larger ones are refused (422).
MAX_INT = 2**63 - 1


async def services(request: Request) -> Services:
    """The service's state (:class:`Services`), which :func:`certify.service.app.create_app`
    keeps on the application."""
    svc: Services = request.app.state.services
    return svc


def workers_started_here(request: Request) -> bool:
    """Whether this application starts the service's workers (``create_app(start_workers=)``):
    where it does, readiness waits for them."""
    return bool(request.app.state.start_workers)


#: The service's state, in a route's parameters.
Svc = Annotated[Services, Depends(services)]
#: Route parameters: the caller, with at least this role.
Reader = Annotated[auth.Principal, Depends(require("read"))]
Submitter = Annotated[auth.Principal, Depends(require("submit"))]
#: A run id in a route's path: its format is stated in the API document (any other id is 404).
RunId = Annotated[str, PathParam(description=f"A run id: {RUN_ID_FORMAT}")]
