"""The service under attack (issue 28): each reproduction of the issue, now refused or answered.

The app runs in this process (uvicorn in a thread, no workers) so that a test can hold one
verification part-way and watch the server keep answering.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from service_fixture import InProcess

from certify.service.ratelimit import RateLimiter, client_address

pytestmark = pytest.mark.unit

BOMB = '<script type="application/json" id="certify-results">'


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[InProcess]:
    svc = InProcess(tmp_path_factory.mktemp("svc"), verify_per_minute=1000, max_verify_mb=1)
    yield svc
    svc.stop()


def test_a_page_of_unclosed_tags_is_read_in_linear_time():
    from certify.report.sign import embedded_parts

    assert embedded_parts(BOMB * 6000) == {}
    page = ('<p>x</p><script type="application/json" id="certify-results">{"a": 1}</script>'
            '<script type="application/json" id="certify-signature">null</script>' + BOMB)
    assert embedded_parts(page) == {"results": '{"a": 1}', "signature": "null"}


def test_the_issue_s_upload_is_answered_at_once_and_health_stays_up(service, tmp_path):
    """Item 1's reproduction: 300 KB of unclosed script tags (8.7 s before, GIL held)."""
    bomb = tmp_path / "x.html"
    bomb.write_text(BOMB * 6000)
    with bomb.open("rb") as f:
        r = requests.post(f"{service.url}/api/v1/verify", files={"file": ("x.html", f)},
                          timeout=30)
    assert r.status_code == 200 and r.json()["valid"] is False
    assert "carries no certify results" in r.json()["reason"]
    assert requests.get(f"{service.url}/api/v1/health", timeout=5).ok


def test_a_verification_held_part_way_does_not_hold_the_server(service):
    """The card is verified in a child process (issue 38): stopped part-way, the server still
    answers; killed, the upload is answered invalid (not a 500)."""
    import psutil
    from hostile_cards import nested_array_pdf

    from certify.service.verify_sandbox import verifier

    card = nested_array_pdf(10, b"{}")  # 3 KB, seconds of parsing
    answers: list[requests.Response] = []

    def post() -> None:
        answers.append(requests.post(f"{service.url}/api/v1/verify",
                                     files={"file": ("card.pdf", card)}, timeout=60))

    t = threading.Thread(target=post)
    t.start()
    child = None
    try:
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline:
            pid = verifier().pid  # this process's verifier (the server runs in this process)
            kids = psutil.Process(pid).children() if pid else []
            child = kids[0] if kids else None
            time.sleep(0.01)
        assert child is not None
        child.suspend()  # held part-way
        token = service.token()
        assert requests.get(f"{service.url}/api/v1/health", timeout=5).ok
        r = requests.get(f"{service.url}/api/v1/runs",
                         headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert r.ok and r.json()["total"] == 0
    finally:
        if child is not None:
            child.kill()
        t.join(60)
    assert [r.status_code for r in answers] == [200]
    doc = answers[0].json()
    assert doc["valid"] is False and "card.pdf: the card could not be verified within the " \
        "service's limits (memory/time: its process was ended by SIGKILL)" == doc["reason"]


def test_a_card_over_the_verify_limit_is_refused_before_it_is_read(service):
    r = requests.post(f"{service.url}/api/v1/verify",
                      files={"file": ("card.html", b"x" * (4 * 2**20))}, timeout=30)
    assert r.status_code == 413 and "limit of 3 MB" in r.json()["detail"]


def test_verifications_without_a_token_are_rate_limited_per_client(tmp_path):
    svc = InProcess(tmp_path / "home", verify_per_minute=2)
    try:
        def verify(headers: dict[str, str] | None = None) -> requests.Response:
            return requests.post(f"{svc.url}/verify", files={"file": ("c.html", b"<p>")},
                                 headers=headers or {}, timeout=10)

        assert [verify().status_code for _ in range(2)] == [200, 200]
        r = verify()
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        # X-Forwarded-For from an untrusted peer changes nothing
        assert verify({"X-Forwarded-For": "203.0.113.9"}).status_code == 429
        # a token holder is not limited
        token = svc.token()
        assert verify({"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        svc.stop()


def test_the_token_bucket_refills_and_the_proxy_header_is_read_only_from_trusted_proxies():
    now = [0.0]
    limiter = RateLimiter(2, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("a") == pytest.approx(30.0)
    assert limiter.take("b") == 0.0  # another client has its own bucket
    now[0] += 30.0
    assert limiter.take("a") == 0.0
    assert client_address("10.0.0.1", "1.2.3.4", ()) == "10.0.0.1"
    assert client_address("10.0.0.1", "6.6.6.6, 1.2.3.4", ["10.0.0.1"]) == "1.2.3.4"
    assert client_address("10.0.0.1", "1.2.3.4, 10.0.0.2", ["10.0.0.1", "10.0.0.2"]) \
        == "1.2.3.4"
    assert client_address("::ffff:10.0.0.1", None, ["10.0.0.1"]) == "10.0.0.1"


def _alias_bomb(levels: int = 7) -> str:
    """Item 3's suite: nested YAML aliases (460 bytes at 7 levels, 10^7 values expanded)."""
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]"
                               for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nname: *a{levels}\nclasses: *a{levels}\nchecks: *a{levels}\n"


@pytest.mark.parametrize(("text", "words"), [
    (_alias_bomb(), "more than 100,000 values once its YAML aliases are expanded"),
    (_alias_bomb(5), "more than 100,000 values once its YAML aliases are expanded"),
    ("a: &a x\nb: [" + ",".join(["*a"] * 250) + "]\n", "more than 200 YAML aliases"),
    ("a: " + "[" * 600 + "]" * 600, "nested deeper than 32 levels"),
    ("x: " + "{a: " * 600 + "1" + "}" * 600, "nested deeper than 32 levels"),
    ("name: s\nseed: " + "9" * 4301 + "\nclasses: [a]\nchecks: []\n", "cannot be read"),
    ("name: s\nseed: 9223372036854775808\nclasses: [a]\nchecks: []\n", "seed must be"),
], ids=["bomb7", "bomb5", "aliases", "deep-list", "deep-map", "long-int", "big-seed"])
def test_the_suite_loader_is_bounded_for_the_cli_and_the_service(text, words, tmp_path):
    from certify.errors import SuiteError
    from certify.service.uploads import Limits, UploadError, check_suite_yaml
    from certify.suite import load_suite

    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SuiteError) as exc:
        load_suite(str(path))
    assert words in exc.value.message, exc.value.message
    with pytest.raises(UploadError) as up:
        check_suite_yaml(text.encode(), Limits())
    assert words in up.value.message


def test_an_alias_bomb_submitted_to_the_service_is_refused_at_once(service, tmp_path):
    token = service.token("submit")
    r = requests.post(f"{service.url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"},
                      files={"suite_file": ("b.yaml", _alias_bomb().encode())},
                      data={"endpoint": "http://198.51.100.7/v2/models/m"}, timeout=30)
    assert r.status_code == 422 and "aliases are expanded" in r.json()["detail"], r.text


@pytest.mark.parametrize("path", [
    "/api/v1/log/entries/9223372036854775808",
    "/api/v1/log/proof/inclusion?index=0&tree_size=99999999999999999999",
    "/api/v1/log/proof/consistency?first=1&second=9223372036854775808",
    "/api/v1/runs?offset=9223372036854775808",
    "/api/v1/runs?limit=-99999999999999999999",
])
def test_integers_beyond_a_database_integer_are_refused_not_a_500(service, path):
    token = service.token()
    r = requests.get(service.url + path, headers={"Authorization": f"Bearer {token}"},
                     timeout=10)
    assert r.status_code == 422, (r.status_code, r.text)


def _stored(root: Path) -> list[str]:
    """Files in the service's store (its temporary folder aside)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and "tmp" not in p.relative_to(root).parts)


def test_a_refused_submission_leaves_no_file_and_tokens_have_upload_quotas(tmp_path):
    """Item 4: uploads are recorded when stored and deleted when their submission is refused;
    a token may send at most --token-uploads-per-hour uploads an hour (refused ones count) and
    keep at most --token-storage-mb stored."""
    from certify.api import demo_model_path
    from certify.service.db import Upload

    svc = InProcess(tmp_path / "home", token_uploads_per_hour=3, token_storage_mb=1,
                    datasets={"d": tmp_path})
    try:
        root = svc.app.state.services.cfg.store_root  # the default local store
        token = svc.token("submit")
        auth = {"Authorization": f"Bearer {token}"}
        model = demo_model_path("standard").read_bytes()  # 0.8 MB

        def submit(*files: tuple[str, tuple[str, bytes]]) -> requests.Response:
            named = [f for f, _ in files]
            data = {"dataset": "d"} | ({} if "suite_file" in named else {"suite": "gtsrb"})
            return requests.post(f"{svc.url}/api/v1/runs", headers=auth, files=list(files),
                                 data=data, timeout=60)

        before = _stored(root)
        r = submit(("model", ("m.onnx", model)), ("suite_file", ("s.yaml", b"name: [unc")))
        assert r.status_code == 422 and "not valid YAML" in r.json()["detail"], r.text
        assert _stored(root) == before  # the suite's blob went with the refusal
        with svc.app.state.services.factory() as s:
            assert s.query(Upload).count() == 0
        # the storage quota: 0.8 MB of model and 0.3 MB of its external data are over 1 MB
        r = submit(("model", ("m.onnx", model)), ("model", ("w.bin", b"\0" * 300_000)))
        assert r.status_code == 413 and "per token" in r.json()["detail"], r.text
        assert _stored(root) == before
        # three uploads this hour (all refused and swept); the fourth is refused
        r = submit(("model", ("m.onnx", model)))
        assert r.status_code == 429 and "in the last hour" in r.json()["detail"], r.text
        assert int(r.headers["Retry-After"]) > 60
        assert _stored(root) == before
    finally:
        svc.stop()


def test_verify_log_refuses_an_entry_of_another_run(tmp_path):
    """Item 6: the log entry that logs a card's statement must be the run the card names."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from certify.service.logclient import check_in_log
    from certify.service.merkle import LogError
    from certify.service.tlog import statement_digest

    statement = {"type": "t", "schema": "1", "measurement": "sha256:aa", "provenance": "b"}
    digest = statement_digest(statement)

    class Log:
        url = "http://log.example"

        def get(self, path: str, **params: object) -> object:
            if path == "/log/lookup":
                return {"index": 7}
            assert path == "/log/entries/7", path
            return {"statement_digest": digest, "run_id": "x" * 32}

    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(LogError, match="is run x+'s"):
        check_in_log(statement, Log(), key, tmp_path / "state.json",  # type: ignore[arg-type]
                     run_id="y" * 32)


def test_a_url_keyed_log_state_is_migrated_to_heads_pinned_by_key():
    """Item 7: a version 1 state (heads by URL) becomes heads by key, the largest head kept."""
    from certify.service.logclient import STATE_VERSION, migrate_state

    old = {"logs": {
        "http://127.0.0.1:1": {"key_fingerprint": "sha256:k", "tree_size": 5, "root_hash": "a",
                               "seen_at": "t1"},
        "http://localhost:1": {"key_fingerprint": "sha256:k", "tree_size": 9, "root_hash": "b",
                               "seen_at": "t2"},
        "http://other:2": {"key_fingerprint": "sha256:j", "tree_size": 1, "root_hash": "c",
                           "seen_at": "t3"}}}
    new = migrate_state(old)
    assert new["version"] == STATE_VERSION
    assert new["logs"]["sha256:k"] == {"tree_size": 9, "root_hash": "b", "seen_at": "t2",
                                       "urls": ["http://127.0.0.1:1", "http://localhost:1"]}
    assert new["urls"] == {"http://127.0.0.1:1": "sha256:k", "http://localhost:1": "sha256:k",
                           "http://other:2": "sha256:j"}
    assert migrate_state(new) == new


def test_credentials_stored_in_clear_by_an_older_service_are_migrated(tmp_path):
    """Item 8: a run stored with ``?api_key=…`` in clear (database and job.json) keeps it
    encrypted with its header secret after the service starts; the clear copies are gone."""
    import json
    import os

    from certify.service.app import open_services
    from certify.service.config import ServeConfig
    from certify.service.db import Run
    from certify.service.queue import enqueue
    from certify.service.secrets import unpack

    key = tmp_path / "secrets.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    cfg = ServeConfig(home=tmp_path / "home", secrets_key=key, workers=0)
    svc = open_services(cfg)
    url = "http://198.51.100.7/v2/models/m?api_key=s3cr3t-value"
    with svc.factory() as s:
        run = enqueue(s, token_id=None, model_kind="http", model_ref=url, model_name="m",
                      suite="gtsrb", suite_name="gtsrb", dataset="d", options={})
        run.secret_enc = svc.secrets.encrypt("Bearer head3r-secret", run.id)
        s.commit()
        rid = run.id
    folder = cfg.store_root / "runs" / rid  # a run folder from before issue 39
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"model": url}))
    svc = open_services(cfg)  # a restart with the new code
    with svc.factory() as s:
        row = s.get(Run, rid)
        assert "s3cr3t-value" not in row.model_ref and row.model_ref.endswith("api_key=***")
        assert unpack(svc.secrets.decrypt(row.secret_enc, rid)) == \
            ("Bearer head3r-secret", url)
    assert "s3cr3t-value" not in (folder / "job.json").read_text()
    assert b"s3cr3t-value" not in (cfg.home / "state.db").read_bytes()


@pytest.mark.parametrize("url", [
    "http://224.0.0.1/v2/models/m",                 # multicast (its docstring refused it)
    "http://[::127.0.0.1]/v2/models/m",             # IPv4-compatible loopback
    "http://[64:ff9b::127.0.0.1]/v2/models/m",      # NAT64 of loopback
    "http://[::ffff:169.254.169.254]/v2/models/m",  # IPv4-mapped metadata address
    "http://[2002:7f00:1::]/v2/models/m",           # 6to4 of loopback
    "http://198.51.100.7/v2/models/m\r\nX-Injected: 1",
    "http://198.51.100.7/v2/models/m\tx",
    "http://10.0.0.1/v2/models/m",
    "http://127.0.0.1:8080/v2/models/m",
])
def test_the_address_filter_refuses_every_non_global_form(url):
    """Item 9: every address that is not global unicast, in any spelling, and control
    characters anywhere in the URL."""
    from certify.service.endpoints import EndpointRefused, check_endpoint

    with pytest.raises(EndpointRefused):
        check_endpoint(url, ())


def test_a_global_address_passes_the_filter():
    from certify.service.endpoints import check_endpoint

    for url in ("http://8.8.8.8/v2/models/m", "http://[2001:4860:4860::8888]/v2/models/m"):
        assert check_endpoint(url, ()) == url


def test_external_data_named_by_a_constant_node_is_checked_like_a_weight(tmp_path):
    """Item 10: a Constant's value pointing at /etc/passwd was accepted (refused only when the
    run loaded it)."""
    import onnx
    from onnx import TensorProto, helper

    from certify.service.uploads import Limits, UploadError, check_onnx

    value = helper.make_tensor("c", TensorProto.FLOAT, [4], [0.0] * 4)
    value.data_location = TensorProto.EXTERNAL
    del value.float_data[:]
    for k, v in (("location", "/etc/passwd"), ("offset", "0"), ("length", "16")):
        e = value.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Constant", [], ["c"], value=value),
                           helper.make_node("Add", ["x", "c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(UploadError, match="/etc/passwd"):
        check_onnx(path, Limits())


def test_the_api_takes_the_ui_session_cookie_for_reading_only(service):
    """Item 10: a POST with the UI's cookie and no CSRF token was accepted by the API."""
    from certify.service.sessions import new_session

    svc = service.app.state.services
    token = service.token("submit")
    from certify.service import auth

    with svc.factory() as s:
        who = auth.authenticate(s, token)
    cookie = {"certify_session": new_session(svc.factory, who.token_id)}
    assert requests.get(f"{service.url}/api/v1/runs", cookies=cookie, timeout=10).ok
    r = requests.post(f"{service.url}/api/v1/runs", cookies=cookie, timeout=10,
                      files={"suite_file": ("s.yaml", b"name: x")}, data={"dataset": "d"})
    assert r.status_code == 401, r.text
    r = requests.delete(f"{service.url}/api/v1/uploads/sha256:{'0' * 64}", cookies=cookie,
                        timeout=10)
    assert r.status_code == 401


def test_a_job_s_error_message_has_no_server_path(tmp_path):
    from certify.service.job import _no_server_paths

    folder = tmp_path / "store" / "runs" / ("a" * 32)
    folder.mkdir(parents=True)
    spec = {"data": "/srv/data/gtsrb/Test.npz"}
    text = (f"{tmp_path}/store/models/abc/m.onnx is not a readable ONNX model; "
            "/srv/data/gtsrb/Test.npz has no y")
    assert _no_server_paths(text, folder, spec) == \
        "models/abc/m.onnx is not a readable ONNX model; Test.npz has no y"


def test_metrics_in_the_prometheus_format_for_this_host_or_an_admin(tmp_path):
    svc = InProcess(tmp_path / "home", trusted_proxies=("127.0.0.1",))
    try:
        requests.post(f"{svc.url}/api/v1/verify", files={"file": ("c.html", b"<p>")},
                      timeout=10)
        # the peer (127.0.0.1) is a trusted proxy: only an admin reads them (issue 38;
        # tests/test_quotas.py holds the loopback case)
        assert requests.get(f"{svc.url}/metrics", timeout=10).status_code == 401
        r = requests.get(f"{svc.url}/metrics", timeout=10,
                         headers={"Authorization": f"Bearer {svc.token('admin')}"})
        assert r.ok and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = r.text
        for line in ('certify_runs{state="queued"} 0', "certify_queue_depth 0",
                     'certify_run_duration_seconds_bucket{le="+Inf"} 0',
                     'certify_verifications_total{outcome="invalid"} 1',
                     "# TYPE certify_http_responses_total counter"):
            assert line in text, (line, text)
        assert 'certify_http_responses_total{class="2xx"}' in text
        # through the trusted proxy the client is the forwarded one: not this host
        far = {"X-Forwarded-For": "203.0.113.5"}
        assert requests.get(f"{svc.url}/metrics", headers=far, timeout=10).status_code == 401
        reader = {"Authorization": f"Bearer {svc.token('read')}"}
        assert requests.get(f"{svc.url}/metrics", headers=far | reader,
                            timeout=10).status_code == 403
        admin = {"Authorization": f"Bearer {svc.token('admin')}"}
        assert requests.get(f"{svc.url}/metrics", headers=far | admin, timeout=10).ok
    finally:
        svc.stop()


def test_readiness_is_distinct_from_liveness(tmp_path):
    from certify.service.shared import begin_shutdown

    svc = InProcess(tmp_path / "home")
    try:
        assert requests.get(f"{svc.url}/api/v1/ready", timeout=10).json()["status"] == "ready"
        begin_shutdown(svc.app.state.services)
        r = requests.get(f"{svc.url}/api/v1/ready", timeout=10)
        assert r.status_code == 503 and "shutting down" in r.json()["detail"]
        assert requests.get(f"{svc.url}/api/v1/health", timeout=10).ok  # still alive
    finally:
        svc.stop()
