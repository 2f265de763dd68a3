"""What each operation of the service's API answers: its success bodies (as models, for the
OpenAPI document) and the status codes it can refuse with (issue 62: the HTTP reference listed
the same ten codes on every route, 401 where no token is needed, and no response schema).

The refusals of an operation follow from how it is built (:func:`refusals`), plus what its
own code raises (:data:`RAISES`):

- **401** where the route asks for a role (:func:`certify.service.shared.require`); **403**
  where that role is above ``read`` (every valid token may read);
- **404** where the path names a resource (a missing one, or another token's private run,
  which answers exactly as a missing one);
- **422** where the request carries any parameter or body to validate;
- **411** and **413** on every POST (the body-size gate reads no body of unstated or too large
  length); **400** where the body is a multipart form (a form that does not parse);
- and the codes in :data:`RAISES`: 409 (the run's state), 429 (a rate limit or quota, with
  ``Retry-After``), 503 (the store, the verifier or readiness; with ``Retry-After`` where a
  retry can help); 500 where stored results fail their signature check (an integrity alarm,
  logged).

The success models describe the bodies; they do not filter them (the routes return plain
dictionaries). ``tests/test_api_fuzz.py`` checks every answer of its 2,000 requests against
the document: a status it does not list, or a success body its schema refuses, fails it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.routing import BaseRoute


class _Open(BaseModel):
    """A body that may carry fields beyond those named (added later without a new version)."""

    model_config = ConfigDict(extra="allow")


class ErrorBody(BaseModel):
    """Every refusal's body."""

    detail: str


class Health(BaseModel):
    """``GET /health``: the database answers."""

    status: str = Field(description='"ok"')
    version: str


class Ready(BaseModel):
    """``GET /ready``: the database and the store answer, the workers run."""

    status: str = Field(description='"ready"')
    workers: int
    store: str = Field(description="the store's kind (file, s3)")


class RunAnswer(BaseModel):
    """A run as the API shows it (never its endpoint secret)."""

    id: str = Field(description="32 lowercase hex digits")
    state: str = Field(description="queued, running, done, failed, cancelled or interrupted")
    model: str
    model_kind: str
    suite: str
    dataset: str
    options: dict[str, object] = Field(description="samples and seed, where given")
    created: str
    updated: str
    attempts: int
    progress: dict[str, object] = Field(description="current check, each check's done and "
                                                 "total, the running step")
    verdict: str | None
    exit_code: int | None
    error: str | None
    log_index: int | None
    public: bool
    device: str
    links: dict[str, str] = Field(description="self, events, and a done run's files")


class RunList(BaseModel):
    """``GET /runs``: the caller's runs, newest first."""

    total: int
    runs: list[RunAnswer]


class LinkCreated(BaseModel):
    """``POST /runs/{id}/links``: the new share link (its URL is shown only here)."""

    id: int
    path: str
    url: str
    created: str | None = None


class Link(BaseModel):
    """A share link of a run (its URL is not kept)."""

    id: int
    created: str


class LinkList(BaseModel):
    """``GET /runs/{id}/links``."""

    links: list[Link]


class Revoked(BaseModel):
    """How many share links were revoked."""

    revoked: int


class Deleted(BaseModel):
    """``DELETE /uploads/{digest}``: the upload's digest."""

    deleted: str


class Comparison(_Open):
    """``GET /runs/{a}/compare/{b}``: ``certify compare --json`` of two finished runs (its
    sides named by run id) with the exit code the CLI would give."""

    schema_: str = Field(alias="schema")
    decision: str
    exit_code: int
    old: dict[str, object]
    new: dict[str, object]
    tolerance: dict[str, object]


class Verification(_Open):
    """``POST /verify``: whether the card is this service's and unchanged, and why not."""

    valid: bool
    state: str = Field(description="valid, visible_not_checked or invalid")
    reason: str | None = None
    hint: str | None = None


class TreeHead(BaseModel):
    """``GET /log``: the latest signed tree head."""

    tree_size: int
    root_hash: str
    timestamp: int = Field(description="milliseconds since the Unix epoch")
    key_fingerprint: str
    algorithm: str
    signature: str


class LogEntry(BaseModel):
    """``GET /log/entries/{n}``: one entry and the statement it logs."""

    index: int
    leaf_hash: str
    statement_digest: str
    statement: object
    run_id: str | None
    created: str


class InclusionProof(BaseModel):
    """``GET /log/proof/inclusion``: an entry's audit path."""

    index: int
    tree_size: int
    leaf_hash: str
    audit_path: list[str]


class ConsistencyProof(BaseModel):
    """``GET /log/proof/consistency``."""

    first: int
    second: int
    proof: list[str]


class LookedUp(BaseModel):
    """``GET /log/lookup``: the index of the entry logging a statement digest."""

    index: int


#: The success body (or media types) of each operation, by its function's name.
ANSWERS: dict[str, type[BaseModel] | dict[str, str]] = {
    "health": Health, "ready": Ready, "submit": RunAnswer, "list_runs": RunList,
    "get_run": RunAnswer, "share": RunAnswer, "cancel": RunAnswer,
    "create_link": LinkCreated, "list_links": LinkList, "revoke_links": Revoked,
    "revoke_link": Revoked, "compare_runs": Comparison, "verify": Verification,
    "delete_upload": Deleted, "tree_head": TreeHead, "entry": LogEntry,
    "inclusion": InclusionProof, "consistency": ConsistencyProof, "lookup": LookedUp,
    "metrics": {"text/plain": "Prometheus text format"},
    "key": {"text/plain": "the public key (PEM)"},
    "certificate": {"text/plain": "the certificate (PEM)"},
    "events": {"text/event-stream": "events run (the run, as GET /runs/{id}), end, shutdown"},
    "artefact": {"text/html": "card.html", "application/pdf": "card.pdf",
                 "application/json": "results.json, results.json.sig"},
}

_TAMPERED = ("The stored results fail their signature check: changed since the run signed "
             "them (the service logs it)")
#: What an operation's own code refuses with, beyond what its build implies (:func:`refusals`).
RAISES: dict[str, dict[int, str]] = {
    "ready": {503: "Not ready (the body says why)"},
    "metrics": {401: "No admin token, and not from this host",
                403: "The token is not an admin's"},
    "submit": {429: "A quota of this token (live runs, query budget, uploads per hour); see "
                    "Retry-After",
               503: "The upload could not be recorded, or the store did not answer; retry"},
    "artefact": {409: "The run is not done", 503: "The store did not answer; see Retry-After",
                 500: _TAMPERED},
    "compare_runs": {409: "A run is not done", 503: "The store did not answer; see Retry-After",
                     500: _TAMPERED},
    "cancel": {409: "The run already ended"},
    "delete_upload": {409: "A queued or running run uses this upload"},
    "verify": {429: "Too many verifications from this address; see Retry-After",
               503: "Every verification slot busy, or the verifier is down; see Retry-After"},
    "inclusion": {400: "No such proof (an index beyond the tree)"},
    "lookup": {404: "No entry logs that statement digest"},
    "certificate": {404: "This service publishes no certificate"},
    "consistency": {400: "No such proof (sizes out of order or beyond the tree)"},
}

#: The words of each derived refusal.
WORDS = {400: "Malformed form", 401: "No valid token", 403: "The token's role may not",
         404: "Not found", 411: "No Content-Length", 413: "Too large", 422: "Refused input"}


def refusals(route: APIRoute) -> dict[int, str]:
    """The refusals ``route`` can answer with and their descriptions (see the module)."""
    from certify.service.conn import declared_role

    d = route.dependant
    out: dict[int, str] = {}
    role = declared_role(route)
    if role is not None:
        out[401] = WORDS[401]
        if role != "read":
            out[403] = WORDS[403] + f" (needs {role})"
    if d.path_params:
        runs = {"run_id", "a", "b"} & {p.name for p in d.path_params}
        out[404] = WORDS[404] + (" (or another token's private run, which answers as a "
                                 "missing one)" if runs else "")
    if d.path_params or d.query_params or d.body_params or d.header_params:
        out[422] = WORDS[422]
    if "POST" in (route.methods or ()):
        out[411] = WORDS[411]
        out[413] = WORDS[413]
    if any(getattr(p.field_info, "media_type", "") == "multipart/form-data"
           for p in d.body_params):
        out[400] = WORDS[400]
    out.update(RAISES.get(route.name, {}))
    if route.name == "artefact":
        out[307] = "Redirect to the store's presigned download URL (where enabled)"
    return out


def document(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document give every operation its success body and its own
    refusals (see the module), in place of one list shared by every route."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            _answers(app, doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _schema_of(model: type[BaseModel], components: dict[str, object]) -> dict[str, str]:
    """A ``$ref`` to ``model``'s schema, which (with the models it uses) joins
    ``components``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}",
                                     by_alias=True)
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components.setdefault(model.__name__, schema)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every API route of ``routes``, those of included routers too."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        elif hasattr(r, "original_router"):  # an included router (FastAPI >= 0.16x)
            yield from _api_routes(r.original_router.routes)


def _route_of(routes: list[APIRoute], path: str, method: str, op: Mapping[str, object]
              ) -> APIRoute:
    """The route behind the document's operation ``method path`` (its path ends with the
    route's, a router's prefix before it; its operation id starts with the route's name)."""
    found = [r for r in routes if r.include_in_schema and method in (r.methods or ())
             and path.endswith(r.path_format)
             and str(op.get("operationId", "")).startswith(r.name)]
    if not found:
        raise RuntimeError(f"no route behind {method} {path}")
    return max(found, key=lambda r: len(r.path_format))


def _media_schema(media: str) -> dict[str, str]:
    """The schema of a body that is not one of the models: a file's bytes, or text."""
    if media == "application/json":
        return {"type": "object"}  # a run's results.json or its signature
    if media == "application/pdf":
        return {"type": "string", "format": "binary"}
    return {"type": "string"}


def _answers(app: FastAPI, doc: dict[str, Any]) -> None:
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    error = _schema_of(ErrorBody, components)
    routes = list(_api_routes(app.routes))
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            route = _route_of(routes, path, method.upper(), op)
            answer = ANSWERS.get(route.name)
            if answer is None:
                raise RuntimeError(f"operation {route.name} states no answer in "
                                   "certify.service.answers.ANSWERS")
            ok: dict[str, object]
            if isinstance(answer, dict):
                ok = {"description": "; ".join(f"{k}: {v}" for k, v in answer.items()),
                      "content": {k: {"schema": _media_schema(k)} for k in answer}}
            else:
                ok = {"description": (answer.__doc__ or "").strip().split("\n")[0],
                      "content": {"application/json": {
                          "schema": _schema_of(answer, components)}}}
            responses: dict[str, object] = {str(route.status_code or 200): ok}
            for code, words in sorted(refusals(route).items()):
                responses[str(code)] = ({"description": words} if code < 400 else
                                        {"description": words,
                                         "content": {"application/json": {"schema": error}}})
            op["responses"] = responses
    for unused in ("HTTPValidationError", "ValidationError"):  # every refusal is ErrorBody
        components.pop(unused, None)
