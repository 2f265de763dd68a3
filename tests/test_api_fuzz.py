"""Issue 28: the API fuzzed from its own OpenAPI document, derandomised (a fixed seed, so it
never flakes): at least 2,000 generated requests over every operation, valid and invalid, with
and without tokens; no 5xx, every status documented, every refusal ``{"detail": "..."}``.
``benchmarks/api_fuzz.py`` runs the same property randomised and longer."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from api_fuzz import Operation, check, operations, requests_for
from hypothesis import HealthCheck, given, settings
from test_service_hardening import InProcess

pytestmark = pytest.mark.e2e

#: Requests in CI, spread evenly over the operations.
REQUESTS = 2000


def fuzz_service(home: Path) -> tuple[InProcess, dict[str, str], list[str]]:
    """A service (no workers) with tokens of every role and two runs to find."""
    from certify.api import demo_model_path

    data = home.parent / "d.npz"
    np.savez(data, x=np.zeros((2, 32, 32, 3), np.uint8), y=np.zeros(2, np.int64))
    svc = InProcess(home, datasets={"d": data}, verify_per_minute=10**6,
                    token_uploads_per_hour=10**6)
    tokens = {role: svc.token(role) for role in ("read", "submit", "admin")}
    ids = []
    for seed in (1, 2):
        r = requests.post(f"{svc.url}/api/v1/runs",
                          headers={"Authorization": f"Bearer {tokens['submit']}"},
                          files={"model": ("m.onnx", demo_model_path().read_bytes())},
                          data={"suite": "gtsrb", "dataset": "d", "seed": str(seed)},
                          timeout=60)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return svc, tokens, ids


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory) -> Iterator[tuple[InProcess, dict[str, str], list[str],
                                               list[Operation]]]:
    svc, tokens, ids = fuzz_service(tmp_path_factory.mktemp("fuzz") / "home")
    doc = requests.get(f"{svc.url}/openapi.json", timeout=30).json()
    yield svc, tokens, ids, operations(doc)
    svc.stop()


SEEN: Counter[str] = Counter()


def _ops() -> list[str]:
    """The operations' names, read from a document made without a server (for parametrize)."""
    import tempfile

    from certify.service.app import create_app
    from certify.service.config import ServeConfig

    home = Path(tempfile.mkdtemp(prefix="certify-openapi-")) / "home"
    doc = create_app(ServeConfig(home=home, workers=0), start_workers=False).openapi()
    return [f"{o.method} {o.path}" for o in operations(doc)]


OPS = _ops()


@pytest.mark.parametrize("name", OPS)
def test_no_5xx_and_every_answer_as_documented(name, fuzzed):
    svc, tokens, ids, ops = fuzzed
    (op,) = [o for o in ops if f"{o.method} {o.path}" == name]
    examples = math.ceil(REQUESTS / len(OPS))

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(req=requests_for(op, tokens, ids))
    def run(req: dict) -> None:
        SEEN[f"{name} {check(op, svc.url, req)}"] += 1

    run()
    statuses = {k.rsplit(" ", 1)[1] for k in SEEN if k.startswith(name + " ")}
    assert sum(v for k, v in SEEN.items() if k.startswith(name + " ")) >= examples
    assert statuses, name


def test_the_fuzz_covered_every_operation_with_2000_requests():
    """Runs after the parametrized tests of this module (pytest keeps the file's order)."""
    if len({k.rsplit(" ", 1)[0] for k in SEEN}) < len(OPS):
        pytest.skip("run with the whole module")
    assert sum(SEEN.values()) >= REQUESTS, SEEN


@pytest.mark.unit
def test_each_operation_documents_its_own_answers():
    """Issue 62: the document listed the same ten codes on every route (401 on routes that
    need no token) and no response schema. Now: 401 exactly where a token is needed, 403 where
    a role above read is, 404 where the path names something, and every success a body."""
    import tempfile

    from certify.service.app import create_app
    from certify.service.config import ServeConfig
    from certify.service.conn import PUBLIC

    home = Path(tempfile.mkdtemp(prefix="certify-openapi-")) / "home"
    doc = create_app(ServeConfig(home=home, workers=0), start_workers=False).openapi()
    public = {"GET /api/v1/health", "GET /api/v1/ready", "GET /api/v1/log",
              "GET /api/v1/log/entries/{n}", "GET /api/v1/log/proof/inclusion",
              "GET /api/v1/log/proof/consistency", "GET /api/v1/log/lookup",
              "GET /api/v1/key", "GET /api/v1/certificate",
              *(f"{m} {p}" for m, p in PUBLIC)}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            name, codes = f"{method.upper()} {path}", set(op["responses"])
            ok = [c for c in codes if c.startswith("2")]
            assert len(ok) == 1 and op["responses"][ok[0]].get("content"), name
            if name == "GET /metrics":  # an admin token, or a request from this host
                assert {"401", "403"} <= codes
            elif name in public:
                assert not {"401", "403"} & codes, name
            else:
                assert "401" in codes, name
                assert ("403" in codes) == (method != "get" or "links" in path), name
            assert ("404" in codes) == ("{" in path or name.endswith("certificate")
                                        or name.endswith("lookup")), name
            assert ("411" in codes) == (method == "post"), name
    assert "HTTPValidationError" not in doc["components"]["schemas"]
