"""Tokens and endpoint secrets never appear in clear: not in a file, a log or a response."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from service_fixture import Service, small_inputs

from servers import OnnxHttpServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _demo_model() -> Path:
    from certify.api import demo_model_path

    return demo_model_path("standard")


def test_endpoint_run_with_a_secret_leaks_neither_secret_nor_token(tmp_path: Path) -> None:
    suite, data = small_inputs(tmp_path / "in")
    endpoint_token = "ep-" + os.urandom(12).hex()
    query_token = "qs-" + os.urandom(12).hex()
    model = OnnxHttpServer(_demo_model(), token=endpoint_token)
    # issue 28 item 8: an endpoint whose credential is in its URL's query string
    keyed = OnnxHttpServer(_demo_model(), query_token=query_token)
    key = tmp_path / "secrets.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    home = tmp_path / "home"
    svc = Service(home, "--workers", "1", "--dataset", f"small={data}",
                  "--allow-endpoint", f"127.0.0.1:{model.port}",
                  "--allow-endpoint", f"127.0.0.1:{keyed.port}",
                  "--secrets-key", str(key)).start()
    try:
        token = svc.token("submit")
        # An endpoint on a loopback address that the operator did not allow is refused.
        with suite.open("rb") as s:
            r = svc.post("/runs", token, files={"suite_file": ("s.yaml", s)},
                         data={"dataset": "small", "endpoint": "http://127.0.0.1:1/v2/models/x"})
        assert r.status_code == 422 and "--allow-endpoint" in r.json()["detail"]
        # A surrogate is for endpoints: with an uploaded model it is refused.
        with suite.open("rb") as s, _demo_model().open("rb") as m, \
                _demo_model().open("rb") as g:
            r = svc.post("/runs", token, files={"suite_file": ("s.yaml", s),
                                                "model": ("m.onnx", m),
                                                "surrogate": ("g.onnx", g)},
                         data={"dataset": "small"})
        assert r.status_code == 422 and "surrogate is for endpoints" in r.json()["detail"]
        responses = []
        with suite.open("rb") as s, _demo_model().open("rb") as g:
            r = svc.post("/runs", token, files={"suite_file": ("s.yaml", s),
                                                "surrogate": ("local.onnx", g)},
                         data={"dataset": "small", "samples": "12", "endpoint": model.v2_url,
                               "endpoint_secret": f"Bearer {endpoint_token}"})
        assert r.status_code == 202, r.text
        responses.append(r.content)
        run = svc.wait_run(r.json()["id"], token)
        assert run["state"] == "done", run.get("error")
        # the job loaded the uploaded surrogate beside the endpoint (a transfer attack source)
        doc = svc.get(f"/runs/{run['id']}/results.json", token).json()
        assert doc["measurement"]["model"]["white_box"].startswith("transfer"), doc
        with suite.open("rb") as s:
            r = svc.post("/runs", token, files={"suite_file": ("s.yaml", s)},
                         data={"dataset": "small", "samples": "12",
                               "endpoint": f"{keyed.v2_url}?api_key={query_token}"})
        assert r.status_code == 202, r.text
        responses.append(r.content)
        keyed_run = svc.wait_run(r.json()["id"], token)
        assert keyed_run["state"] == "done", keyed_run.get("error")
        assert keyed.infer_requests > 0  # the credential reached the endpoint
        responses.append(svc.get(f"/runs/{keyed_run['id']}", token).content)
        # The secret reached the endpoint, in its header.
        assert any(h.get("Authorization") == f"Bearer {endpoint_token}"
                   for h in model.headers_seen)
        for path in (f"/runs/{run['id']}", "/runs", f"/runs/{run['id']}/results.json",
                     f"/runs/{run['id']}/card.html", f"/runs/{run['id']}/card.pdf"):
            resp = svc.get(path, token)
            assert resp.ok
            responses.append(resp.content)
    finally:
        svc.stop()
        model.stop()
        keyed.stop()
    needles = [endpoint_token.encode(), token.encode(), token.removeprefix("cfy_").encode(),
               query_token.encode()]
    blobs = [(f"response {i}", b) for i, b in enumerate(responses)]
    blobs.append(("server log", svc.log().encode()))
    for p in home.rglob("*"):
        if p.is_file():
            blobs.append((str(p), p.read_bytes()))
    for where, blob in blobs:
        for needle in needles:
            assert needle not in blob, f"a secret in clear in {where}"
