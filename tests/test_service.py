"""``certify serve`` end to end: real server processes on 127.0.0.1, real runs, real clients."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from api_fuzz import assert_documented
from service_fixture import (
    CERTIFY,
    Service,
    job_processes,
    post_run,
    slow_attack_suite,
    small_inputs,
    submit_cli,
)

import builders

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small suite and data every test here submits."""
    return small_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, inputs: tuple[Path, Path]):
    """One SQLite service for the module, with the small data registered as 'small'."""
    home = tmp_path_factory.mktemp("svc") / "home"
    svc = Service(home, "--workers", "2", "--dataset", f"small={inputs[1]}",
                  "--max-upload-mb", "2", "--heartbeat", "0.5").start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def slow_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A suite whose run takes long enough to be interrupted (Square L∞, 2,000 queries)."""
    return slow_attack_suite(tmp_path_factory.mktemp("slow"))


def _demo_model() -> Path:
    from certify.api import demo_model_path

    return demo_model_path("standard")


def _submit(svc: Service, token: str, suite: Path, samples: int = 20, **data: str
            ) -> requests.Response:
    return post_run(svc, token, suite, samples=str(samples), **data)


def test_submit_wait_download_and_verify_against_the_log(
        service: Service, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """certify submit → signed card → certify verify --log passes (SQLite)."""
    suite, _ = inputs
    token = service.token("submit")
    out = tmp_path / "card"
    r = submit_cli(service, token, suite, out, 20, "--model-name", "Sign reader",
                   "--model-version", "4.1", "--owner", "Perception", "--license", "MIT",
                   "--intended-use", "Dash-camera sign crops.")
    assert r.returncode == 0, r.stderr + service.log()
    assert "verdict: PASS" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "card.html", "card.pdf", "results.json", "results.json.sig"]
    results = json.loads((out / "results.json").read_text())
    assert results["measurement"]["model"]["name"].startswith("standard")
    # issue 30: the model-card fields travel through the API into the signed card
    assert results["measurement"]["model_card"] == {
        "name": "Sign reader", "version": "4.1", "owner": "Perception", "license": "MIT",
        "intended_use": "Dash-camera sign crops."}
    assert "Dash-camera sign crops." in (out / "card.html").read_text()
    assert [c["id"] for c in results["measurement"]["checks"]] == ["clean", "noise"]
    state = tmp_path / "log-state.json"
    v = builders.run_cli("verify", out / "card.pdf", "--log", service.url, "--log-state", state)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "inclusion" in v.stdout.lower()
    assert f"are now pinned in {state}" in v.stdout  # issue 62: it says where it pinned
    # The service's verify endpoint agrees (public: no token).
    with (out / "card.html").open("rb") as f:
        doc = assert_documented(service.url, "POST", "/api/v1/verify",
                                service.post("/verify", files={"file": ("card.html", f)}))
    assert doc["valid"] is True and doc["in_log"] is True and doc["verdict"] == "PASS"
    # issue 62: the log's answers are as the HTTP reference documents them
    log = "/api/v1/log"
    head = assert_documented(service.url, "GET", log, service.get("/log"))
    found = assert_documented(service.url, "GET", f"{log}/lookup", service.get(
        "/log/lookup", params={"statement_digest": doc["statement_digest"]}))
    assert found["index"] == doc["log_index"]
    assert_documented(service.url, "GET", f"{log}/entries/{{n}}",
                      service.get(f"/log/entries/{found['index']}"))
    assert_documented(service.url, "GET", f"{log}/proof/inclusion", service.get(
        "/log/proof/inclusion", params={"index": found["index"],
                                        "tree_size": head["tree_size"]}))
    assert_documented(service.url, "GET", f"{log}/proof/consistency", service.get(
        "/log/proof/consistency", params={"first": 1, "second": head["tree_size"]}))
    assert_documented(service.url, "GET", f"{log}/entries/{{n}}",
                      service.get(f"/log/entries/{head['tree_size'] + 5}"))  # a 404
    _pdf_signature_is_the_service_s(service, out / "card.pdf", tmp_path)
    # issue 28 item 6: the card names its run (signed provenance), and submit checked it
    run_id = results["provenance"]["service"]["run_id"]
    # item 10: names, never the server's paths, in the signed card
    assert results["provenance"]["data_source"] == "registered dataset 'small'"
    assert results["provenance"]["suite_source"].startswith("uploaded suite ")
    assert str(service.home) not in (out / "results.json").read_text()
    assert doc["run_id"] == doc["log_run_id"] == run_id
    assert f"the card is run {run_id}'s and measured standard.onnx (sha256:" in r.stderr
    assert f", run {run_id}" in v.stdout


def _pdf_signature_is_the_service_s(service: Service, card: Path, tmp_path: Path) -> None:
    """Issue 38: the service's card.pdf carries a PAdES signature by the certificate it
    publishes (for its own key): the service's verify route and pdfsig, given an NSS database
    that trusts that certificate, accept it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from pdf_tools import CERTUTIL, PDFSIG, accepted_by_pdfsig, pdfsig, trusting_nss

    r = service.get("/certificate")
    assert r.status_code == 200, r.text
    cert = x509.load_pem_x509_certificate(r.text.encode())
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert cert.public_key().public_bytes(serialization.Encoding.PEM, spki).decode() \
        == service.get("/key").text
    assert (service.home / "keys" / "service.crt").read_text() == r.text
    with card.open("rb") as f:
        doc = service.post("/verify", files={"file": ("card.pdf", f)}).json()
    assert doc["valid"] is True and doc["in_log"] is True, doc
    if PDFSIG is None or CERTUTIL is None:
        pytest.skip("pdfsig and certutil come with scripts/setup.sh --test")
    (tmp_path / "service.crt").write_text(r.text)
    (tmp_path / "nss").mkdir()
    sigs = pdfsig(card, trusting_nss(tmp_path / "nss", tmp_path / "service.crt"))
    assert len(sigs) == 1 and accepted_by_pdfsig(sigs), sigs


def test_a_card_moved_into_another_run_s_folder_is_caught(
        service: Service, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 28 item 6: run X's files copied into run Y's folder are served as Y's, but the
    client's check names X, and X's own card still verifies as X's."""
    import shutil

    from certify.errors import VerificationError
    from certify.service.client import FILES, Client, check_downloaded
    from certify.service.job import OUT_DIR

    suite, _ = inputs
    token = service.token("submit")
    ids = [_submit(service, token, suite, samples=8, seed=str(s)).json()["id"] for s in (1, 2)]
    assert [service.wait_run(i, token)["state"] for i in ids] == ["done", "done"]
    src, dst = (service.home / "store" / "runs" / i / OUT_DIR for i in ids)
    client = Client(service.url, token)
    client.download(ids[0], tmp_path / "x")
    assert "measured standard.onnx" in check_downloaded(tmp_path / "x", ids[0], _demo_model())
    for name in FILES:
        shutil.copyfile(src / name, dst / name)
    client.download(ids[1], tmp_path / "y")
    with pytest.raises(VerificationError, match=f"names run {ids[0]}"):
        check_downloaded(tmp_path / "y", ids[1], _demo_model())
    from certify.api import demo_model_path

    with pytest.raises(VerificationError, match="not the file uploaded"):
        check_downloaded(tmp_path / "x", ids[0], demo_model_path("robust"))


def test_bad_inputs_are_refused_with_4xx_and_nothing_is_written_outside_the_store(
        service: Service, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    suite, _ = inputs
    token = service.token("submit")
    reader = service.token("read")
    before = {p for p in service.home.parent.rglob("*")}

    def post(files: dict, data: dict | None = None, tok: str | None = token) -> requests.Response:
        return service.post("/runs", tok, files=files,
                            data={"dataset": "small", **(data or {})})

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model" * 10)
    with junk.open("rb") as m, suite.open("rb") as s:
        r = post({"model": ("junk.onnx", m), "suite_file": ("s.yaml", s)})
    assert r.status_code == 422 and "not an ONNX model" in r.json()["detail"]

    # PyTorch programs are for `certify run`: the service loads ONNX only, whatever the name
    torch_net = builders.make_net(seed=1)
    for program in builders.save_programs(torch_net, tmp_path / "programs"):
        with program.open("rb") as m:
            r = post({"model": (program.name, m)}, {"suite": "gtsrb"})
        assert r.status_code == 422 and "takes ONNX models only" in r.json()["detail"], r.text
        with program.open("rb") as m:
            r = post({"model": ("renamed.onnx", m)}, {"suite": "gtsrb"})
        assert r.status_code == 422 and "not an ONNX model" in r.json()["detail"], r.text

    big = tmp_path / "big.onnx"
    big.write_bytes(os.urandom(3 * 2**20))  # the service allows 2 MB
    with big.open("rb") as m:
        r = post({"model": ("big.onnx", m)}, {"suite": "gtsrb"})
    assert r.status_code == 413, r.text

    # A body declared larger than any submission may be is refused before it is read.
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    conn.putrequest("POST", "/api/v1/runs")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Length", str(50 * 2**30))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and b"larger than" in resp.read()
    conn.close()

    evil = _external_data_model(tmp_path, "../../etc/passwd")
    with evil.open("rb") as m:
        r = post({"model": ("evil.onnx", m)}, {"suite": "gtsrb"})
    assert r.status_code == 422 and "etc/passwd" in r.json()["detail"], r.text

    bad_suite = tmp_path / "bad.yaml"
    bad_suite.write_text("name: x\nchecks: [ {kind: nope\n")
    with _demo_model().open("rb") as m, bad_suite.open("rb") as s:
        r = post({"model": ("m.onnx", m), "suite_file": ("bad.yaml", s)})
    assert r.status_code == 422 and "YAML" in r.json()["detail"], r.text

    with _demo_model().open("rb") as m:
        files = {"model": ("m.onnx", m)}
        assert post(files, {"suite": "gtsrb"}, tok=None).status_code == 401
        m.seek(0)
        assert post(files, {"suite": "gtsrb"}, tok="cfy_not-a-token").status_code == 401
        m.seek(0)
        r = post(files, {"suite": "gtsrb"}, tok=reader)
        assert r.status_code == 403 and "submit" in r.json()["detail"]
    assert service.get("/runs").status_code == 401
    assert service.get("/runs", reader).status_code == 200
    # Nothing outside the service's home, and no temporary upload left behind.
    after = {p for p in service.home.parent.rglob("*")}
    assert all(service.home in p.parents or p.parent == service.home.parent
               for p in after - before), sorted(map(str, after - before))
    assert not Path("/etc/passwd").with_name("passwd.onnx").exists()
    tmp = service.home / "work" / "uploads"  # where this node spools uploads
    assert not tmp.exists() or not any(tmp.iterdir())


def _external_data_model(folder: Path, location: str) -> Path:
    """A small ONNX model whose one initializer claims to live in ``location``."""
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)
    w.data_location = TensorProto.EXTERNAL
    del w.float_data[:]
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    path = folder / "evil.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_crashing_run_ends_error_and_the_server_stays_up(
        service: Service, inputs: tuple[Path, Path], slow_suite: Path) -> None:
    """A job process killed by SIGSEGV (as a crash in onnxruntime ends it): its run is
    ``error`` with a message saying so; the server answers and runs the next one."""
    suite, _ = inputs
    token = service.token("submit")
    run = _submit(service, token, slow_suite, samples=40).json()
    service.wait_run(run["id"], token, states=("running",))
    deadline = time.monotonic() + 60
    while not (pids := job_processes(service.home)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGSEGV)
    doc = service.wait_run(run["id"], token)
    assert doc["state"] == "error" and "SIGSEGV" in doc["error"], doc
    ok = _submit(service, token, suite).json()
    assert service.wait_run(ok["id"], token)["state"] == "done"


def test_cancel_a_running_run(service: Service, slow_suite: Path) -> None:
    token = service.token("submit")
    run = _submit(service, token, slow_suite, samples=40).json()
    service.wait_run(run["id"], token, states=("running",))
    r = service.post(f"/runs/{run['id']}/cancel", token)
    assert r.status_code == 200
    doc = service.wait_run(run["id"], token)
    assert doc["state"] == "cancelled"
    assert service.get(f"/runs/{run['id']}/card.html", token).status_code == 409
    assert not job_processes(service.home, run["id"])


def _verify_log(card: Path, svc: Service, state: Path, url: str | None = None
                ) -> subprocess.CompletedProcess[str]:
    """`certify verify --log` in this process (the command, not its process, is under test)."""
    return builders.run_cli("verify", card, "--log", url or svc.url, "--log-state", state)


def test_verify_log_catches_a_rewritten_log_a_missing_entry_and_a_new_key(
        service: Service, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    import sqlite3

    suite, _ = inputs
    token = service.token("submit")
    ids = [_submit(service, token, suite, samples=10, seed=str(s)).json()["id"]
           for s in (7, 8)]
    docs = [service.wait_run(i, token) for i in ids]
    assert [d["state"] for d in docs] == ["done", "done"]
    card = tmp_path / "card.html"
    card.write_bytes(service.get(f"/runs/{ids[1]}/card.html", token).content)
    state = tmp_path / "state.json"
    first = _verify_log(card, service, state)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "first time this log is seen" in first.stdout
    assert "consistency: the log extends" in _verify_log(card, service, state).stdout
    db = sqlite3.connect(service.home / "state.db")
    try:
        # Rewrite history: another leaf in place of the first run's entry.
        (old,) = db.execute("SELECT leaf_hash FROM log_entries WHERE idx = ?",
                            (docs[0]["log_index"],)).fetchone()
        db.execute("UPDATE log_entries SET leaf_hash = ? WHERE idx = ?",
                   (bytes(32), docs[0]["log_index"]))
        db.commit()
        # the server reads each leaf once (issue 38): the rewrite is served from its next
        # start, as a rogue operator's would be
        service.stop()
        service.start()
        r = _verify_log(card, service, state)
        assert r.returncode == 1 and "rewrote its history" in r.stderr, r.stdout + r.stderr
        # issue 28 item 7: the head is pinned by the log's key, not by the URL's spelling
        for url in (f"http://localhost:{service.port}", f"http://127.1:{service.port}"):
            r = _verify_log(card, service, state, url)
            assert r.returncode == 1 and "rewrote its history" in r.stderr, (url, r.stderr)
        db.execute("UPDATE log_entries SET leaf_hash = ? WHERE idx = ?",
                   (old, docs[0]["log_index"]))
        # A card whose entry is gone is not in the log.
        db.execute("UPDATE log_entries SET statement_digest = 'sha256:gone' WHERE idx = ?",
                   (docs[1]["log_index"],))
        db.commit()
        r = _verify_log(card, service, tmp_path / "fresh.json")
        assert r.returncode == 1 and "not in the log" in r.stderr, r.stdout + r.stderr
    finally:
        db.close()
    # A log that presents another key than the one pinned is refused.
    doc = json.loads(state.read_text())
    doc["urls"][service.url] = "sha256:" + "0" * 64
    state.write_text(json.dumps(doc))
    r = _verify_log(card, service, state)
    assert r.returncode == 1 and "pinned" in r.stderr
    # An unreachable log is exit 3, one line.
    r = builders.run_cli("verify", card, "--log", "http://127.0.0.1:9", "--log-state", state)
    assert r.returncode == 3 and "cannot reach the log" in r.stderr
    assert "Traceback" not in r.stderr


def test_events_compare_uploads_and_query_budget(service: Service, inputs: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    suite, _ = inputs
    probe = service.token("submit")
    first = _submit(service, probe, suite, samples=12, seed="1").json()
    # Server-sent events: the run's states as they change, ending with `end`.
    with requests.get(f"{service.url}/api/v1/runs/{first['id']}/events", stream=True,
                      headers={"Authorization": f"Bearer {probe}"}, timeout=300) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines(decode_unicode=True) if line]
    states = [json.loads(e[6:])["state"] for e in events if e.startswith("data: {\"")]
    assert states[-1] == "done" and events[-2:] == ["event: end", "data: {}"]
    needed = json.loads(service.get(f"/runs/{first['id']}/results.json", probe).content)[
        "measurement"]["queries"]["total"]
    # A token whose budget is exactly that run's queries: the run completes, the budget is
    # then spent, and the next submission is refused; a smaller budget ends checks ERROR.
    exact = service.token("submit", "--query-budget", str(needed))
    run = _submit(service, exact, suite, samples=12, seed="1").json()
    assert service.wait_run(run["id"], exact)["verdict"] == "PASS"
    r = _submit(service, exact, suite, samples=12, seed="1")
    assert r.status_code == 403 and "budget" in r.json()["detail"]
    short = service.token("submit", "--query-budget", str(needed // 2))
    run = _submit(service, short, suite, samples=12, seed="1").json()
    doc = service.wait_run(run["id"], short)
    assert doc["verdict"] == "ERROR" and doc["exit_code"] == 5
    owner = probe
    # compare: the same model on the same data twice is no regression.
    other = service.token("submit")
    ids = [_submit(service, other, suite, samples=12, seed="3").json()["id"] for _ in range(2)]
    for i in ids:
        assert service.wait_run(i, other)["state"] == "done"
    c = assert_documented(service.url, "GET", "/api/v1/runs/{a}/compare/{b}",
                          service.get(f"/runs/{ids[0]}/compare/{ids[1]}", other))
    assert c["exit_code"] == 0 and {row["id"] for row in c["checks"]} == {"clean", "noise"}
    # issue 38: the sides are named by run id, never by the server's paths; another token's
    # runs are not compared (404, as missing ones); stored results edited on disk are not
    # compared (their signature fails) and the service logs it
    assert (c["old"]["run_id"], c["new"]["run_id"]) == tuple(ids) and "path" not in c["old"]
    text = json.dumps(c)
    assert str(service.home) not in text and "/store/" not in text
    r = service.get(f"/runs/{ids[0]}/compare/{ids[1]}", probe)
    assert r.status_code == 404 and r.json()["detail"] == f"no run {ids[0]!r}"
    from certify.service.job import OUT_DIR

    stored = service.home / "store" / "runs" / ids[1] / OUT_DIR / "results.json"
    original = stored.read_bytes()
    edited = original.replace(b'"PASS"', b'"FAIL"', 1)
    assert edited != original
    stored.write_bytes(edited)
    try:
        r = service.get(f"/runs/{ids[0]}/compare/{ids[1]}", other)
        assert_documented(service.url, "GET", "/api/v1/runs/{a}/compare/{b}", r)
        assert r.status_code == 500 and "fail their signature" in r.json()["detail"], r.text
        assert service.get(f"/runs/{ids[1]}/card.html", other).status_code == 500
        assert f"run {ids[1]}: the stored results.json fails its signature" in service.log()
    finally:
        stored.write_bytes(original)
    assert service.get(f"/runs/{ids[0]}/compare/{ids[1]}", other).json() == c
    # Uploads: deletable by their owner (not by another token) once no live run uses them.
    from certify.models.onnx import sha256_file

    from builders import write_small_suite

    mine = write_small_suite(tmp_path / "mine.yaml", f"mine-{os.getpid()}-{time.time_ns()}")
    run = _submit(service, owner, mine, samples=12, seed="1").json()
    assert service.wait_run(run["id"], owner)["state"] == "done"
    digest = "sha256:" + sha256_file(mine)
    admin_less = service.token("submit")
    # another token learns nothing: the same 404 as for a digest that does not exist
    assert service.session_delete(f"/uploads/{digest}", admin_less).status_code == 404
    assert service.session_delete("/uploads/sha256:" + "0" * 64, admin_less).status_code == 404
    gone = service.session_delete(f"/uploads/{digest}", owner)
    assert gone.status_code == 200, gone.text
    blob = service.home / "store" / "blobs" / "sha256" / digest[7:9] / digest[7:]
    assert not blob.exists()
    assert not (service.home / "store" / "suites" / f"{digest[7:]}.yaml").exists()
    assert service.session_delete(f"/uploads/{digest}", owner).status_code == 404


def test_serve_refuses_a_bad_home_database_or_busy_port(tmp_path: Path) -> None:
    """One line and exit 2, never a traceback, for every way `certify serve` cannot start."""
    import socket

    (tmp_path / "file").write_text("x")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cases = [
            (["--home", str(tmp_path / "file")], "is a file"),
            (["--home", str(tmp_path / "h"), "--db", "postgresql+psycopg://u:pw@127.0.0.1:9/x"],
             "cannot open the database"),
            (["--home", str(tmp_path / "h"), "--db", "nosuchdb://x"], "cannot open the database"),
            (["--home", str(tmp_path / "h"), "--port", str(port)], "Address already in use"),
        ]
        for args, words in cases:
            r = subprocess.run([CERTIFY, "serve", *args], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 2 and words in r.stderr, (args, r.stderr)
            assert "Traceback" not in r.stderr and "pw@" not in r.stderr
