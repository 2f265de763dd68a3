"""No secret in any message (issue 16.7): one redaction function, used on every channel.

Runs against real servers on 127.0.0.1 with credentials in the URL (user:password, an
``api_key`` query parameter) and in ``--auth-env``; every file the run writes and everything it
prints must be free of them, Ray's worker logs included.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from certify.errors import ModelError, UsageError
from certify.redact import MASK, redact, redact_obj, register_secret

import builders
from servers import Faults, OnnxHttpServer, free_port

pytestmark = pytest.mark.e2e

CLASSES = [f"c{i}" for i in range(43)]
N = 16
TOKEN = "tok-7f3a9c1e55d2"  # the --auth-env bearer token
QKEY = "qk-91b2c3d4e5f6"  # the api_key query parameter
PASSWORD = "pw-0a1b2c3d4e5f"  # the URL's user:password
SECRETS = (TOKEN, QKEY, PASSWORD)


def test_redact_removes_url_credentials_and_credential_parameters():
    text = ("GET https://alice:pw-SECRET@api.example.com/v2/models/m/infer?api_key=K1&"
            "page=2&X-Amz-Signature=S2&X-Amz-Credential=C3&Token=T4&sig=S5#frag")
    out = redact(text)
    for secret in ("pw-SECRET", "alice", "K1", "S2", "C3", "T4", "S5"):
        assert secret not in out
    assert "page=2" in out and "api.example.com/v2/models/m/infer" in out
    assert out.count(MASK) == 5
    assert redact("accuracy 12.5% within 8/255, key figures") == \
        "accuracy 12.5% within 8/255, key figures"


def test_registered_secrets_are_masked_but_not_the_scheme_word():
    register_secret("Bearer unit-secret-42")
    out = redact("server said: Bearer unit-secret-42 refused (unit-secret-42)")
    assert "unit-secret-42" not in out
    assert "server said" in out
    assert redact("use a Bearer token") == "use a Bearer token"


def test_errors_and_json_documents_are_redacted():
    err = UsageError("http://u:p4ssw0rd@h/x?access_token=abc is bad", hint="not ?apikey=zz")
    assert "p4ssw0rd" not in err.message and "abc" not in err.message
    assert "zz" not in err.hint and "zz" not in str(err)
    doc = redact_obj({"spec": "http://h/v2/models/m?signature=xyz", "n": 3,
                      "list": ["https://a:b@h/"]})
    assert "xyz" not in str(doc) and "a:b@" not in str(doc) and doc["n"] == 3


def test_log_filters_cover_certify_and_urllib3_retry_warnings(caplog):
    import logging

    from certify.redact import RedactingFilter, install_log_filters

    handler = logging.StreamHandler()
    install_log_filters(handler)
    assert any(isinstance(f, RedactingFilter) for f in handler.filters)
    with caplog.at_level(logging.WARNING):
        logging.getLogger("urllib3.connectionpool").warning(
            "Retrying (%r) after connection broken by '%r': %s", "Retry(total=4)", "reset",
            "/v2/models/m/infer?api_key=retry-secret-1")
    assert caplog.records and "retry-secret-1" not in caplog.text
    record = logging.LogRecord("certify", logging.INFO, __file__, 1, "endpoint %s", (
        "https://u:retry-secret-2@h/v2/models/m",), None)
    assert handler.filters[0].filter(record)
    assert "retry-secret-2" not in record.getMessage()


@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("redact") / "d.npz", N,
                                       seed=41)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("redact-suite") / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "redact-test", "classes": CLASSES, "seed": 3,
                                    "data": {"samples": N}, "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "rotation", "kind": "corruption",
         "params": {"property": "rotation", "bound": 10, "steps": 2}},
    ]}))
    return path


def _assert_clean(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked into {where}"


def _scan_tree(root: Path) -> int:
    n = 0
    for p in root.rglob("*"):
        if p.is_file():
            _assert_clean(str(p), p.read_bytes().decode("utf-8", "replace"))
            n += 1
    return n


def _cred_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v2/models/signs?api_key={QKEY}"


def test_credentials_reach_no_file_and_no_log(model_path, suite, data, tmp_path):
    # Dropped connections make urllib3 log each retry (with the request's query) at WARNING.
    server = OnnxHttpServer(model_path, token=TOKEN, query_token=QKEY,
                            faults=Faults(seed=2, p_drop=0.2))
    env = {"CERTIFY_TEST_TOKEN": f"Bearer {TOKEN}"}
    try:
        out = tmp_path / "run"
        proc = builders.run_cli("run", _cred_url(server.port), "--suite", suite, "--data", data,
                                "--out", out, "--auth-env", "CERTIFY_TEST_TOKEN", "--retries",
                                "8", "--debug", env=env)
        assert proc.returncode in (0, 1), proc.stderr
        assert server.faults_injected.get("drop", 0) > 0
        assert (out / "card.html").exists() and (out / "run.json").exists()
        assert _scan_tree(out) >= 4
        _assert_clean("stdout", proc.stdout)
        _assert_clean("stderr", proc.stderr)

        # A refused key: the server echoes it in its 403 body; the error line must not.
        wrong = _cred_url(server.port).replace(QKEY, QKEY[::-1])
        bad = builders.run_cli("run", wrong, "--suite", suite, "--data", data, "--out",
                               tmp_path / "bad", env=env)
        assert bad.returncode == 3, bad.stderr
        assert "403" in bad.stderr and QKEY[::-1] not in bad.stderr
    finally:
        server.stop()


def test_unreachable_and_malformed_credential_urls_are_redacted(suite, data, tmp_path):
    port = free_port()  # nothing listens there
    url = f"http://alice:{PASSWORD}@127.0.0.1:{port}/v2/models/signs?token={QKEY}"
    proc = builders.run_cli("run", url, "--suite", suite, "--data", data, "--out",
                            tmp_path / "o", "--retries", "0")
    assert proc.returncode == 3, proc.stderr
    assert "could not be reached" in proc.stderr
    _assert_clean("stderr", proc.stderr + proc.stdout)

    bad = f"http://alice:{PASSWORD}@127.0.0.1:{port}/v3/whatever?api_key={QKEY}"
    proc = builders.run_cli("run", bad, "--suite", suite, "--data", data, "--out",
                            tmp_path / "o2")
    assert proc.returncode == 2, proc.stderr
    assert "is not a model URL" in proc.stderr
    _assert_clean("stderr", proc.stderr + proc.stdout)


def test_model_error_from_the_library_is_redacted():
    with pytest.raises(ModelError) as exc:
        from certify.device import choose_device
        from certify.models.http import HttpModel

        HttpModel(f"http://bob:{PASSWORD}@127.0.0.1:{free_port()}/v1/models/m?sig={QKEY}",
                  choose_device("cpu"), input_size=(32, 32))
    _assert_clean("ModelError", f"{exc.value.message} {exc.value.hint}")


@pytest.mark.slow
def test_ray_worker_logs_hold_no_credentials(model_path, suite, data, tmp_path):
    pytest.importorskip("ray")
    # A short private temp dir: Ray's logs land there, apart from other Ray sessions.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))
    server = OnnxHttpServer(model_path, token=TOKEN, query_token=QKEY,
                            faults=Faults(seed=4, p_drop=0.15))
    try:
        out = tmp_path / "run"
        proc = builders.run_cli(
            "run", _cred_url(server.port), "--suite", suite, "--data", data, "--out", out,
            "--no-pdf", "--auth-env", "CERTIFY_TEST_TOKEN", "--retries", "8",
            "--executor", "ray", "--workers", "2", "--concurrency", "2", timeout=600,
            env={"CERTIFY_TEST_TOKEN": f"Bearer {TOKEN}", "RAY_TMPDIR": str(ray_tmp)})
        assert proc.returncode in (0, 1), proc.stderr
        assert server.faults_injected.get("drop", 0) > 0
        _assert_clean("stdout/stderr", proc.stdout + proc.stderr)
        _scan_tree(out)
        logs = list(ray_tmp.rglob("logs"))
        assert logs, "Ray wrote no logs under RAY_TMPDIR"
        worker_logs = [p for d in logs for p in d.glob("worker-*")]
        assert worker_logs
        for d in logs:
            _scan_tree(d)
    finally:
        server.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
