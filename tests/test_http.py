"""Certifying a model behind an HTTP endpoint: real servers on 127.0.0.1, started here.

The same ONNX model is certified as a file and through MLServer (v2), a v1 server and a
fault-injecting server; results.json metrics must be equal. An outage beyond the retry budget
stops the run with exit 3, and --resume finishes it with nothing lost.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from certify.errors import CARD_WRITTEN_CODES, EXIT_ERROR

import builders
from servers import Faults, OnnxHttpServer, mlserver

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

N = 24
CLASSES = [f"c{i}" for i in range(43)]


@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("http") / "d.npz", N,
                                       seed=21)


def _suite(path: Path, attacks: bool = True, binarization: bool = False) -> Path:
    checks: list[dict] = [
        {"id": "clean", "kind": "clean_accuracy", "threshold": {"metric": "accuracy",
                                                                 "min": 0.0}},
        {"id": "coverage", "kind": "coverage"},
        {"id": "rotation", "kind": "corruption", "params": {"property": "rotation",
                                                            "bound": 15, "steps": 3}},
        {"id": "noise", "kind": "corruption", "params": {
            "property": "gaussian_noise", "bound": 0.1, "steps": 2, "max_draws": 96}},
        {"id": "brittle", "kind": "brittleness", "samples": 4, "params": {"num_masks": 60}},
    ]
    if attacks:
        checks += [
            {"id": "square", "kind": "attack", "samples": 8, "params": {
                "attack": "square_linf", "epsilon": 0.03, "max_queries": 60,
                "binarization": {"samples": 2, "n_inner": 49} if binarization else False}},
            {"id": "hsj", "kind": "attack", "samples": 4, "params": {
                "attack": "hopskipjump", "norm": "l2", "epsilon": 0.5, "max_queries": 120,
                "binarization": False}},
        ]
    path.write_text(yaml.safe_dump({"name": "http-test", "classes": CLASSES, "seed": 5,
                                    "data": {"samples": N}, "checks": checks}))
    return path


def _run(model: str | Path, suite: Path, data: Path, out: Path, *extra: str,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return builders.run_cli("run", model, "--suite", suite, "--data", data, "--out", out,
                            "--no-pdf", *extra, env=env)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return _suite(tmp_path_factory.mktemp("suite") / "s.yaml")


@pytest.fixture(scope="module")
def baseline(model_path, suite, data, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("onnx") / "run"
    proc = _run(model_path, suite, data, out)
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    return builders.check_metrics(out)


def test_mlserver_v2_gives_the_onnx_metrics(model_path, suite, data, baseline, tmp_path):
    with mlserver(model_path, tmp_path / "mls") as url:
        proc = _run(url, suite, data, tmp_path / "run", "--model-version", "7")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.check_metrics(tmp_path / "run") == baseline
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["provenance"]["device"]["provider"] == "HTTP (v2)"
    assert r["measurement"]["model"]["metadata"]["declared_version"] == "7"
    assert r["measurement"]["model"]["identity"].startswith(url)
    assert r["provenance"]["traffic"]["model"]["images"] >= r["measurement"]["queries"]["total"] > 0
    card = (tmp_path / "run" / "card.html").read_text()
    assert "cannot vouch" in card and url in card


def test_v1_server_gives_the_onnx_metrics(net, suite, data, baseline, tmp_path):
    server = OnnxHttpServer(builders.export(net, tmp_path / "nhwc.onnx", nhwc=True))
    try:
        proc = _run(server.v1_url, suite, data, tmp_path / "run", "--input-size", "32", "32")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.check_metrics(tmp_path / "run") == baseline


def test_faults_are_retried_to_the_same_metrics(model_path, suite, data, baseline, tmp_path):
    faults = Faults(seed=3, p_500=0.08, p_429=0.03, p_slow=0.02, p_malformed=0.04,
                    p_drop=0.04, slow_s=1.0, retry_after=1,
                    first=("500", "429", "slow", "malformed", "drop"))
    server = OnnxHttpServer(model_path, faults=faults)
    try:
        proc = _run(server.v2_url, suite, data, tmp_path / "run", "--timeout", "0.5",
                    "--retries", "6", "--http-batch", "16", "--no-hedge")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert set(server.faults_injected) == {"500", "429", "slow", "malformed", "drop"}, \
        server.faults_injected
    assert builders.check_metrics(tmp_path / "run") == baseline
    # every injected fault cost one retry (a retry more is a valid answer slower than its
    # deadline, a timeout), and the provenance says how many
    traffic = json.loads((tmp_path / "run" / "results.json").read_text())["provenance"][
        "traffic"]["model"]
    faults = sum(server.faults_injected.values())
    assert faults <= traffic["retries"] <= faults + traffic["timeouts"], (
        server.faults_injected, traffic)
    assert faults > 0 and traffic["hedges"] == 0
    assert traffic["requests"] > traffic["retries"]


def test_request_cap_stops_the_run_and_resume_finishes_it(model_path, suite, data, baseline,
                                                          tmp_path):
    server = OnnxHttpServer(model_path)
    out = tmp_path / "run"
    try:
        proc = _run(server.v2_url, suite, data, out, "--http-batch", "8", "--max-requests", "12")
        assert proc.returncode == 3, proc.stderr
        assert "request cap of 12 is reached" in proc.stderr and "--resume" in proc.stderr
        assert not (out / "results.json").exists()
        proc = _run(server.v2_url, suite, data, out, "--http-batch", "8", "--resume")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.check_metrics(out) == baseline


def test_outage_exits_3_and_resume_loses_nothing(model_path, suite, data, baseline, tmp_path):
    server = OnnxHttpServer(model_path, faults=Faults(outage_after=40))
    out = tmp_path / "run"
    try:
        proc = _run(server.v2_url, suite, data, out, "--retries", "1", "--http-batch", "8",
                    "--breaker-wait", "0")
        assert proc.returncode == 3, proc.stderr
        assert "error:" in proc.stderr and "--resume" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (out / "results.json").exists() and not (out / "card.html").exists()
        kept = (out / "records.jsonl").read_text().splitlines()
        assert kept, "records written before the outage are on disk"
        server.faults.outage_after = None
        proc = _run(server.v2_url, suite, data, out, "--resume", "--http-batch", "8")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.check_metrics(out) == baseline
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    keys = [(r["check"], r["i"]) for r in rows]
    assert len(keys) == len(set(keys)), "no sample is recorded twice"
    assert [json.loads(line) for line in kept] == rows[:len(kept)], "nothing recorded is lost"


def test_secret_appears_in_no_output(model_path, data, tmp_path):
    secret = "s3cr3t-t0ken-4242"
    suite = _suite(tmp_path / "s.yaml", attacks=False)
    server = OnnxHttpServer(model_path, token=secret)
    env = {"CERTIFY_TEST_TOKEN": f"Bearer {secret}"}
    out = tmp_path / "run"
    try:
        denied = _run(server.v2_url, suite, data, tmp_path / "denied", "--auth-env",
                      "NO_SUCH_VAR_SET")
        wrong = _run(server.v2_url, suite, data, tmp_path / "wrong", "--auth-env",
                     "CERTIFY_TEST_TOKEN", env={"CERTIFY_TEST_TOKEN": "Bearer nope"})
        proc = builders.run_cli("run", server.v2_url, "--suite", suite, "--data", data,
                                "--out", out, "--auth-env", "CERTIFY_TEST_TOKEN", "--debug",
                                env=env)
    finally:
        server.stop()
    assert denied.returncode == 2 and "NO_SUCH_VAR_SET" in denied.stderr
    assert wrong.returncode == 3 and "401" in wrong.stderr and "--auth-env" in wrong.stderr
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert any(h.get("Authorization") == f"Bearer {secret}" for h in server.headers_seen)
    assert secret not in proc.stdout + proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"results.json", "card.html", "card.pdf", "records.jsonl"} <= {p.name for p in files}
    for p in files:
        assert secret.encode() not in p.read_bytes(), p
    text = subprocess.run(["pdftotext", str(out / "card.pdf"), "-"], capture_output=True,
                          check=True).stdout
    assert secret.encode() not in text


def test_labels_only_endpoint(model_path, data, tmp_path):
    server = OnnxHttpServer(model_path, labels_only=True)
    try:
        mixed = _run(server.v2_url, _suite(tmp_path / "s.yaml"), data, tmp_path / "r")
        suite = tmp_path / "labels.yaml"
        suite.write_text(yaml.safe_dump({"name": "labels", "classes": CLASSES, "checks": [
            {"id": "clean", "kind": "clean_accuracy"},
            {"id": "rotation", "kind": "corruption",
             "params": {"property": "rotation", "bound": 15, "steps": 3}},
            {"id": "hsj", "kind": "attack", "samples": 4, "params": {
                "attack": "hopskipjump", "norm": "l2", "epsilon": 0.5, "max_queries": 100,
                "binarization": False}}]}))
        proc = _run(server.v2_url, suite, data, tmp_path / "ok")
    finally:
        server.stop()
    # score-based checks are SKIPPED rows with their reason; the rest still runs
    assert mixed.returncode in CARD_WRITTEN_CODES, mixed.stderr
    rows = {c["id"]: c for c in json.loads((tmp_path / "r" / "results.json").read_text())[
        "measurement"]["checks"]}
    assert {i for i, c in rows.items() if c["status"] == "SKIPPED"} == {
        "coverage", "brittle", "square"}
    assert all("needs scores" in rows[i]["decision"] for i in ("coverage", "brittle", "square"))
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    r = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert r["measurement"]["model"]["output"] == "labels"
    statuses = {c["id"]: c["status"] for c in r["measurement"]["checks"]}
    assert statuses.keys() == {"clean", "rotation", "hsj"}
    assert all(c["status"] != "ERROR" for c in r["measurement"]["checks"])


def test_binarization_over_http_uses_the_output_vector(model_path, data, tmp_path):
    server = OnnxHttpServer(model_path)
    try:
        proc = _run(server.v2_url, _suite(tmp_path / "s.yaml", binarization=True), data,
                    tmp_path / "run")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    sq = next(c for c in r["measurement"]["checks"] if c["id"] == "square")
    assert sq["status"] != "ERROR", sq["error"]
    bt = sq["details"]["binarization"]
    assert bt["features"] == ["output"]  # no penultimate tensor behind an API
    assert bt["separation_rate"] is not None
    assert sq["metrics"]["binarization_tested"] + sq["metrics"]["binarization_setup_failed"] >= 1


def test_query_budget_caps_the_run(model_path, data, tmp_path):
    server = OnnxHttpServer(model_path)
    try:
        proc = _run(server.v2_url, _suite(tmp_path / "s.yaml"), data, tmp_path / "run",
                    "--query-budget", "200")
    finally:
        server.stop()
    assert proc.returncode == EXIT_ERROR, proc.stderr  # a check ran out of queries
    r = json.loads((tmp_path / "run" / "results.json").read_text())
    assert r["measurement"]["queries"]["budget"] == 200
    traffic = r["provenance"]["traffic"]["model"]
    probes = traffic["probe_images"]
    # what the server itself ran: the probe images plus at most the budget, plus the images of
    # hedged requests (requests, not model queries: the budget does not depend on timing)
    assert 0 < server.images_served - probes <= 200 + traffic["hedged_images"]
    assert traffic["hedges"] <= 0.05 * traffic["requests"]
    # the card's total is what the records claim, and the server saw at least that many
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert r["measurement"]["queries"]["total"] == sum(row["queries"] for row in rows) > 0
    assert r["measurement"]["queries"]["total"] <= server.images_served - probes
    errored = [c for c in r["measurement"]["checks"] if c["status"] == "ERROR"]
    assert errored and all("budget" in c["error"] for c in errored)
    assert any(c["status"] != "ERROR" for c in r["measurement"]["checks"]), \
        "the budget ran out, not the run"


@pytest.mark.parametrize("url, code, words", [
    ("http://127.0.0.1:9/v2/models/x", 3, "could not be reached"),
    ("http://127.0.0.1:9/predict", 2, "not a model URL"),
])
def test_bad_endpoints(url, code, words, data, tmp_path):
    proc = _run(url, _suite(tmp_path / "s.yaml"), data, tmp_path / "o", "--retries", "0")
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_http_flags_refused_for_a_file(model_path, data, tmp_path):
    proc = _run(model_path, _suite(tmp_path / "s.yaml"), data, tmp_path / "o", "--auth-env",
                "X")
    assert proc.returncode == 2 and "only apply to endpoints (HTTP or gRPC)" in proc.stderr


def test_redirects_are_refused_not_followed(model_path, data, tmp_path):
    """An endpoint that redirects is refused: following it would send the auth secret (and
    the images) to a host the user never named."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    target = OnnxHttpServer(model_path)
    seen: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self.send_response(307)
            self.send_header("Location", target.v2_url)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET  # noqa: N815

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v2/models/signs"
        proc = _run(url, _suite(tmp_path / "s.yaml"), data, tmp_path / "o", "--retries", "0")
    finally:
        httpd.shutdown()
        httpd.server_close()
        target.stop()
    assert proc.returncode == 3, proc.stderr
    assert "does not follow redirects" in proc.stderr and "Traceback" not in proc.stderr
    assert seen and target.headers_seen == []  # the target never heard from certify
