"""A property-based fuzzer of certify's HTTP API, driven by its own ``/openapi.json`` (issue 28).

For every operation of the document it generates requests, valid and invalid: path and query
parameters from their schemas and beyond them (huge and negative integers, empty, long and
odd strings, run ids that exist and that do not), multipart bodies with random files, fields
left out or repeated, and every kind of caller (no token, a garbage one, read, submit, admin).
The property: no response is a 5xx, every status is one the operation documents, and every
refusal's body is the documented ``{"detail": "..."}``. Shared by ``tests/test_api_fuzz.py``
(derandomised, in CI) and ``benchmarks/api_fuzz.py`` (a longer randomised run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import requests
from hypothesis import strategies as st

#: Values for an integer parameter: in range, at its bounds, beyond them and beyond 2^63.
INTS = st.one_of(st.integers(-5, 50), st.sampled_from([
    0, -1, 2**31, 2**63 - 1, 2**63, -(2**63), 10**30, -(10**30)]), st.integers())
#: Text for a string parameter: short, odd, long, path-like, URL-like.
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "..", "../../etc/passwd", "%2e%2e%2f", "\r\nX: y", "null",
                     "0" * 32, "a" * 32, "f" * 33, "sha256:" + "0" * 64, "card.pdf",
                     "results.json", "gtsrb", "PASS", "running", "http://127.0.0.1:1/v2/x",
                     "http://169.254.169.254/v2/models/m", "\x00", "é" * 300]),
    st.text(min_size=200, max_size=3000))
FILES = st.one_of(
    st.binary(max_size=2000),
    st.sampled_from([b"", b"name: x\nclasses: [a]\nchecks: []\n", b"a: &a [x]\nb: [*a, *a]",
                     b"<script type=\"application/json\" id=\"certify-results\">" * 200,
                     b"PK\x03\x04" + b"\0" * 100, b"\x93NUMPY" + b"\0" * 50,
                     b"%PDF-1.4\n%%EOF"]))
FILENAMES = st.one_of(st.sampled_from(["m.onnx", "s.yaml", "d.npz", "card.html", "card.pdf",
                                       "results.json", "../x", "a.tar.gz", ""]),
                      st.text(max_size=30))


@dataclass(frozen=True)
class Operation:
    """One operation of the document: method, path template, parameters, body fields."""

    method: str
    path: str
    params: list[dict[str, Any]]
    form: dict[str, dict[str, Any]]
    statuses: frozenset[str]
    #: status -> the JSON schema of its application/json body (with the document's
    #: components, so that its references resolve), where the document gives one
    bodies: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def operations(doc: dict[str, Any]) -> list[Operation]:
    """Every operation of an OpenAPI document (its multipart body resolved)."""
    schemas = doc.get("components", {}).get("schemas", {})
    out = []
    for path, ops in sorted(doc["paths"].items()):
        for method, op in sorted(ops.items()):
            form: dict[str, dict[str, Any]] = {}
            body = op.get("requestBody", {}).get("content", {})
            for media in body.values():
                ref = media.get("schema", {}).get("$ref", "")
                schema = schemas.get(ref.rsplit("/", 1)[-1], media.get("schema", {}))
                form.update(schema.get("properties", {}))
            bodies = {status: {**answer["content"]["application/json"]["schema"],
                               "components": doc.get("components", {})}
                      for status, answer in op.get("responses", {}).items()
                      if "application/json" in answer.get("content", {})}
            out.append(Operation(method.upper(), path, op.get("parameters", []), form,
                                 frozenset(op.get("responses", {})), bodies))
    return out


def _kinds(schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema admits (through anyOf), and ``file`` for binary content."""
    if "anyOf" in schema:
        return set().union(*(_kinds(s) for s in schema["anyOf"]))
    if schema.get("type") == "array":
        return {f"array-{k}" for k in _kinds(schema.get("items", {}))}
    if schema.get("contentMediaType") == "application/octet-stream" or \
            schema.get("format") == "binary":
        return {"file"}
    return {str(schema.get("type", "string"))}


def _value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    kinds = _kinds(schema)
    choices: list[st.SearchStrategy[Any]] = [TEXT]
    if "integer" in kinds or "number" in kinds:
        choices.append(INTS)
    if "boolean" in kinds:
        choices.append(st.sampled_from(["true", "false", "1", "yes"]))
    return st.one_of(*choices)


def requests_for(op: Operation, tokens: dict[str, str], run_ids: list[str]
                 ) -> st.SearchStrategy[dict[str, Any]]:
    """Requests for ``op``: a dict of ``requests.request`` arguments and the caller kind."""
    ids = st.sampled_from(run_ids) if run_ids else TEXT

    @st.composite
    def build(draw: Callable[..., Any]) -> dict[str, Any]:
        path = op.path
        query: dict[str, Any] = {}
        for p in op.params:
            schema = p.get("schema", {})
            if p["in"] == "path":
                name = p["name"]
                value = draw(st.one_of(ids, _value(schema))) if "id" in name or name in \
                    ("a", "b") else draw(_value(schema))
                text = str(value).replace("/", "%2F") or "x"
                path = path.replace("{" + name + "}", requests.utils.quote(text, safe="%"))
            elif p["in"] == "query" and (p.get("required") or draw(st.booleans())):
                query[p["name"]] = draw(_value(schema))
        data: list[tuple[str, str]] = []
        files: list[tuple[str, tuple[str, bytes]]] = []
        for name, schema in op.form.items():
            if not draw(st.integers(0, 2)):  # about a third left out
                continue
            kinds = _kinds(schema)
            if kinds & {"file", "array-file"}:
                for _ in range(draw(st.integers(1, 2 if "array-file" in kinds else 1))):
                    files.append((name, (draw(FILENAMES), draw(FILES))))
            else:
                data.append((name, str(draw(_value(schema)))))
        # parameters the operation does not take, and odd headers: ignored or refused
        for k, v in draw(st.dictionaries(st.text(min_size=1, max_size=8), TEXT,
                                         max_size=2)).items():
            query.setdefault(k, v)
        caller = draw(st.sampled_from(["none", "garbage", *sorted(tokens)]))
        headers = {}
        if draw(st.booleans()):
            headers["X-Forwarded-For"] = draw(st.sampled_from(
                ["1.2.3.4", "::1", "garbage", "1.2.3.4, 5.6.7.8", "x" * 300]))
        if caller == "garbage":
            headers["Authorization"] = "Bearer " + draw(st.sampled_from(
                ["", "cfy_x", "x" * 500, "cfy_" + "A" * 43]))
        elif caller != "none":
            headers["Authorization"] = f"Bearer {tokens[caller]}"
        return {"method": op.method, "path": path, "params": query or None,
                "data": data or None, "files": files or None, "headers": headers,
                "caller": caller}

    return build()


def check(op: Operation, base: str, req: dict[str, Any], timeout: float = 30.0) -> int:
    """Send ``req`` and assert the property; returns the status."""
    kw = {k: v for k, v in req.items() if k not in ("method", "path", "caller")}
    with requests.request(req["method"], base + req["path"], timeout=timeout, stream=True,
                          allow_redirects=False, **kw) as r:
        status = r.status_code
        where = f"{req['method']} {req['path']} ({req['caller']}) -> {status}"
        assert status < 500, where + ": " + r.text[:500]
        assert str(status) in op.statuses, where + " is not in the document: " + r.text[:300]
        if status >= 400:
            body = r.json()
            assert isinstance(body, dict) and isinstance(body.get("detail"), str), \
                where + ": " + r.text[:300]
        schema = op.bodies.get(str(status))
        if schema is not None and r.headers.get("content-type", "").startswith(
                "application/json"):
            problem = jsonschema.exceptions.best_match(
                jsonschema.Draft202012Validator(schema).iter_errors(r.json()))
            assert problem is None, f"{where}: the body is not as documented: {problem}"
    return status


_DOCS: dict[str, dict[str, Any]] = {}


def assert_documented(base: str, method: str, template: str, r: requests.Response) -> Any:
    """Assert that answer ``r`` of ``method template`` (an operation of the document at
    ``base``) has a status the document lists and, for JSON, the body it documents; returns
    the body (JSON where it is JSON)."""
    if base not in _DOCS:
        _DOCS[base] = requests.get(f"{base}/openapi.json", timeout=30).json()
    (op,) = [o for o in operations(_DOCS[base]) if (o.method, o.path) == (method, template)]
    assert str(r.status_code) in op.statuses, (method, template, r.status_code, r.text[:300])
    if not r.headers.get("content-type", "").startswith("application/json"):
        return r.content
    body = r.json()
    schema = op.bodies.get(str(r.status_code))
    if schema is not None:
        problem = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(body))
        assert problem is None, f"{method} {template}: not as documented: {problem}"
    return body
