"""The service's routes keep their paths, methods, status codes and schemas (issue 65): the
OpenAPI document of the current app, and the web UI's routes (not in the document), compared
with the ones stored in ``tests/data/openapi.json`` before the routes were split per resource.

Three things are compared:

- the OpenAPI document, as canonical JSON (only ``info.version`` is left out: it changes with
  every release);
- every route of the app, API and UI (path, methods, whether it is documented), as a set;
- how a request reaches a route: for each route's path (its parameters filled with their
  names) and each of GET, POST, PUT and DELETE, the status the whole app answers without a
  token and the route that took it (its name and path). So a route shadowed by another (the
  order of ``/runs/{run_id}/links`` and ``/runs/{run_id}/{name}``) or a refusal that moved
  (a 405 that became a 404, a 401 that became a 404) fails here too. The requests carry no
  token and no body, so the gates that read one (authentication before a body, the body
  limit, the verify gate, CSRF, tenants) are not tried here: tests/test_connections.py,
  tests/test_service_hardening.py and tests/test_service_ui.py try them.

Run ``python tests/test_service_openapi.py`` to rewrite the stored document, after a change
to the API that is meant.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

STORED = Path(__file__).parent / "data" / "openapi.json"
METHODS = ("GET", "POST", "PUT", "DELETE")
#: Paths beyond the routes' own: the root, a trailing slash, nothing at all.
EXTRA_PATHS = ("/", "/api/v1/runs/", "/api/v1/nothing", "/nothing")


def _routes(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, str, list[str],
                                                                        bool]]:
    """(kind, full path, methods, documented) of every route, those of included routers
    too (FastAPI keeps an included router as one entry holding the router)."""
    for r in routes:
        original = getattr(r, "original_router", None)
        if original is not None:
            yield from _routes(original.routes, prefix + r.include_context.prefix)
            continue
        yield (type(r).__name__, prefix + r.path, sorted(getattr(r, "methods", None) or ()),
               bool(getattr(r, "include_in_schema", False)))


def _dispatch(app: Any, paths: Iterable[str]) -> dict[str, list[Any]]:
    """``"METHOD path"`` -> [status, route name, route path] for each path and method, sent
    without a token or body through the whole app (its middleware included)."""
    from starlette.testclient import TestClient

    seen: list[Any] = []

    async def probe(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        seen.append(scope.get("route"))  # the routing writes it into the request's scope

    out: dict[str, list[Any]] = {}
    client = TestClient(probe, follow_redirects=False)  # no lifespan: no janitor, no workers
    for path in sorted(set(paths)):
        for method in METHODS:
            status = client.request(method, path).status_code
            route = seen[-1]
            out[f"{method} {path}"] = [status, getattr(route, "name", None),
                                       getattr(route, "path_format", None)]
    return out


def describe() -> dict[str, Any]:
    """What is compared: the document, the routes, and where requests go."""
    from certify.service.app import create_app
    from certify.service.config import ServeConfig

    home = Path(tempfile.mkdtemp(prefix="certify-openapi-")) / "home"
    app = create_app(ServeConfig(home=home, workers=0), start_workers=False)
    doc = app.openapi()
    doc = {**doc, "info": {k: v for k, v in doc["info"].items() if k != "version"}}
    routes = sorted(_routes(app.routes))
    samples = [re.sub(r"\{(\w+)(:\w+)?\}", r"\1", path) for _, path, _, _ in routes]
    return {"openapi": json.loads(json.dumps(doc)), "routes": [list(r) for r in routes],
            "dispatch": _dispatch(app, [*samples, *EXTRA_PATHS])}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False)


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    return describe()


@pytest.fixture(scope="module")
def stored() -> dict[str, Any]:
    return json.loads(STORED.read_text(encoding="utf-8"))


def test_the_openapi_document_is_unchanged(now, stored):
    doc, was = now["openapi"], stored["openapi"]
    assert sorted(doc["paths"]) == sorted(was["paths"])
    for path, ops in was["paths"].items():
        assert sorted(doc["paths"][path]) == sorted(ops), path
        for method, op in ops.items():
            assert sorted(doc["paths"][path][method]["responses"]) == sorted(op["responses"]), \
                f"{method.upper()} {path}"
    assert _canonical(doc) == _canonical(was)


def test_every_route_of_the_api_and_the_ui_is_kept(now, stored):
    gone = [r for r in stored["routes"] if r not in now["routes"]]
    new = [r for r in now["routes"] if r not in stored["routes"]]
    assert (gone, new) == ([], [])
    assert now["routes"] == stored["routes"]


def test_every_request_reaches_the_same_route_with_the_same_answer(now, stored):
    changed = {k: (stored["dispatch"].get(k), v) for k, v in now["dispatch"].items()
               if stored["dispatch"].get(k) != v}
    assert not changed
    assert now["dispatch"].keys() == stored["dispatch"].keys()


if __name__ == "__main__":
    STORED.write_text(_canonical(describe()) + "\n", encoding="utf-8")
    sys.exit(0)
