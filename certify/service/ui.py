"""The web UI: server-rendered Jinja2 pages over the same logic as the API, no build step.

Log in with an API token (a session row in the database; the cookie holds only its random id),
list your runs with verdict badges and filters, submit a model, watch a run's progress live
(server-sent events from the API), open its card, share it (public to every token, or a share
link that needs no token), and verify a card. Every page but login, verify and share links needs
a session; every POST but login and verify carries the session's CSRF token. Another token's
private run answers 404, as a missing one does.

The pages live one module per resource in :mod:`certify.service.pages`; this module assembles
them.
"""

from __future__ import annotations

from fastapi import APIRouter

from certify.service.pages import links, runs, session, submit, verify


def ui_router() -> APIRouter:
    """The UI's routes (mounted at the root; none in the API's document)."""
    r = APIRouter(include_in_schema=False)
    for pages in (session, runs, links, submit, verify):
        r.include_router(pages.router)
    return r
