"""Issue 39: a worker's side of the store, without a process: records as per-attempt segment
series, resumption from an older home's run folder, what the processes a node starts inherit,
and a store that fails answering 503."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from certify.rundir import RECORDS_FILE, RUN_FILE
from certify.service.store import LocalStore, check_key, put_bytes, read_bytes

pytestmark = pytest.mark.unit

RUN = "a" * 32


def _lines(n: int, start: int = 0) -> bytes:
    return b"".join(json.dumps({"check": "clean", "i": i}).encode() + b"\n"
                    for i in range(start, start + n))


def _segments(tmp_path: Path, store: LocalStore, attempt: int, name: str):
    from certify.service.workers import RecordSegments

    out = tmp_path / name / "out"
    out.mkdir(parents=True)
    return RecordSegments(store, RUN, attempt, out, every=4, seconds=3600.0), out


def test_each_attempt_writes_its_own_series_and_the_next_resumes_from_the_latest(
        tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    first, out1 = _segments(tmp_path, store, 1, "w1")
    assert first.restore() == 0 and not (out1 / RECORDS_FILE).exists()
    (out1 / RUN_FILE).write_bytes(b'{"fingerprint": 1}')
    (out1 / RECORDS_FILE).write_bytes(_lines(3) + b'{"check": "cle')  # a line in flight
    first.poll()
    assert store.list(f"runs/{RUN}/records/") == []  # 3 < every, and not yet due
    assert read_bytes(store, f"runs/{RUN}/out/run.json") == b'{"fingerprint": 1}'
    with (out1 / RECORDS_FILE).open("ab") as f:
        f.write(b'an", "i": 3}\n' + _lines(2, 4))
    first.poll()
    assert read_bytes(store, f"runs/{RUN}/records/0001/00000000.jsonl") == _lines(6)
    # the worker is lost; attempt 2 resumes from attempt 1's series, and sends it as its own
    second, out2 = _segments(tmp_path, store, 2, "w2")
    assert second.restore() == 6
    assert (out2 / RECORDS_FILE).read_bytes() == _lines(6)
    assert (out2 / RUN_FILE).read_bytes() == b'{"fingerprint": 1}'
    second.poll(force=True)
    with (out2 / RECORDS_FILE).open("ab") as f:
        f.write(_lines(1, 6))
    second.flush()
    # attempt 1 did not know its lease was gone and wrote on: attempt 2's series is untouched
    with (out1 / RECORDS_FILE).open("ab") as f:
        f.write(_lines(5, 100))
    first.flush()
    assert read_bytes(store, f"runs/{RUN}/records/0002/00000000.jsonl") + \
        read_bytes(store, f"runs/{RUN}/records/0002/00000001.jsonl") == _lines(7)
    third, out3 = _segments(tmp_path, store, 3, "w3")
    assert third.restore() == 7 and (out3 / RECORDS_FILE).read_bytes() == _lines(7)
    third.publish()
    third.cleanup()
    assert store.list(f"runs/{RUN}/records") == []
    assert store.size(f"runs/{RUN}/out/{RECORDS_FILE}") == len(_lines(7))


def test_an_older_home_s_torn_records_resume_whole_lines_only(tmp_path: Path) -> None:
    """A run folder from before segments (``runs/<id>/out/records.jsonl``) whose server was
    killed mid-write: the torn line is not sent on, so a later resumption reads whole lines."""
    store = LocalStore(tmp_path / "store")
    put_bytes(store, f"runs/{RUN}/out/{RECORDS_FILE}", _lines(5) + b'{"torn')
    seg, out = _segments(tmp_path, store, 1, "w")
    assert seg.restore() == 5 and (out / RECORDS_FILE).read_bytes() == _lines(5)
    seg.poll(force=True)
    with (out / RECORDS_FILE).open("ab") as f:
        f.write(_lines(1, 5))
    seg.flush()
    again, out2 = _segments(tmp_path, store, 2, "w2")
    assert again.restore() == 6 and (out2 / RECORDS_FILE).read_bytes() == _lines(6)


def test_the_processes_a_node_starts_inherit_none_of_its_keys(monkeypatch) -> None:
    from certify.service.config import child_env

    for name in ("CERTIFY_SIGN_KEY", "CERTIFY_SESSION_SECRET", "CERTIFY_SECRETS_KEY",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PGPASSWORD"):
        monkeypatch.setenv(name, "secret")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = child_env()
    assert "OMP_NUM_THREADS" in env
    assert not [k for k in env if k.startswith(("AWS_", "PG")) or k in (
        "CERTIFY_SIGN_KEY", "CERTIFY_SESSION_SECRET", "CERTIFY_SECRETS_KEY")]


def test_uploaded_file_names_are_valid_keys() -> None:
    """Every name an upload may have (letters, digits, . _ + -, no leading dot) is a key."""
    assert check_key("models/" + "f" * 64 + "/resnet+v2.onnx")
    for bad in ("models/.hidden", "a/../b", "a b"):
        with pytest.raises(ValueError):
            check_key(bad)


class _Failing:
    """A store that answers its probe but fails every write (a full or read-only bucket)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner, self.description = inner, inner.description

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def put(self, key, stream):
        from certify.service.store import StoreError

        raise StoreError("the bucket refused the write (AccessDenied)")


def test_a_store_that_fails_answers_503_not_a_traceback(tmp_path: Path) -> None:
    from test_service_hardening import InProcess

    from certify.api import demo_model_path

    svc = InProcess(tmp_path / "home", datasets={"d": tmp_path})
    try:
        svc.app.state.services.store = _Failing(svc.app.state.services.store)
        token = svc.token("submit")
        r = requests.post(f"{svc.url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"},
                          files={"model": ("m.onnx", demo_model_path().read_bytes())},
                          data={"dataset": "d", "suite": "gtsrb"}, timeout=60)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
        assert "store did not answer" in r.json()["detail"]
        assert "AccessDenied" not in r.text and "Traceback" not in r.text
    finally:
        svc.stop()
