"""Issue 60 point 3: ``certify runs fetch|watch|show`` and ``certify submit`` trust nothing a
server sends until it is checked.

A fake certify service on 127.0.0.1, started by the tests, answers as an attacker would: a
run id that climbs out of the working folder, an answer about another run than the one asked,
an unsigned card, a key other than the one pinned, a body far above the byte cap, bytes
trickled past the deadline, a run that never ends, control characters in every string. Nothing
may be written outside the folder asked for, no verdict printed for a card that did not verify
(exit 9), memory stays below the cap plus 100 MB (measured in a subprocess), and each command
ends within its deadline with a one-line message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builders import run_cli

pytestmark = pytest.mark.e2e

A = "a" * 32  # the run the user asks for
B = "b" * 32  # another run
ESC = "\x1b[2J\x1b[32mverdict: PASS\r"  # clears the screen and prints a green PASS

#: What a handler answers: (status, headers, body) or a callable writing the answer itself.
Answer = tuple[int, dict[str, str], bytes] | Callable[[BaseHTTPRequestHandler], None]


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


class FakeService:
    """A server on 127.0.0.1 that answers each path as :attr:`routes` says (the longest
    matching prefix wins; anything else is 404)."""

    def __init__(self) -> None:
        self.routes: dict[str, Answer] = {}
        self.stop = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # bodies end when the connection closes

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                match = max((p for p in fake.routes if path.startswith(p)), key=len,
                            default=None)
                try:
                    if match is None:
                        self._send(404, {}, b'{"detail": "no such route"}')
                        return
                    answer = fake.routes[match]
                    if callable(answer):
                        answer(self)
                    else:
                        self._send(*answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading, as it should

            def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _json(doc: object, status: int = 200) -> Answer:
    return status, {}, json.dumps(doc).encode()


def _run(run_id: str = A, state: str = "done", **extra: object) -> dict[str, object]:
    return {"id": run_id, "state": state, "verdict": "PASS", "exit_code": 0, "log_index": 7,
            "model": "m", "suite": "s", "progress": {},
            "links": {n: f"/api/v1/runs/{run_id}/{n}" for n in
                      ("card.html", "results.json", "results.json.sig")}, **extra}


@pytest.fixture
def fake() -> Iterator[FakeService]:
    server = FakeService()
    server.routes["/api/v1/key"] = (200, {"Content-Type": "text/plain"},
                                    _pem(ec.generate_private_key(ec.SECP256R1())))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the commands run in (their relative paths land here)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _cli(fake: FakeService, *args: str | Path, state: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {"CERTIFY_TOKEN": "cfy_test"}
    if state is not None:
        env["CERTIFY_LOG_STATE"] = str(state)
    return run_cli(*args, "--server", fake.url, env=env)


def _everything(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_a_climbing_run_id_is_refused_whoever_sends_it(fake: FakeService, workdir: Path,
                                                      tmp_path: Path) -> None:
    target = tmp_path / "outside"
    climbing = "x/" + "../" * 12 + str(target).lstrip("/")
    before = _everything(tmp_path)
    r = _cli(fake, "runs", "fetch", climbing)
    assert r.returncode == 2 and "is not a run id" in r.stderr, r.stderr
    # submit: the id the service sends back names the folder, so it is checked too
    fake.routes["/api/v1/runs"] = _json(_run(climbing, state="queued"), 202)
    from certify.api import demo_model_path

    r = _cli(fake, "submit", demo_model_path(), "--suite", "gtsrb", "--dataset", "d")
    assert r.returncode == 9 and "sent a run id that is not one" in r.stderr, r.stderr
    assert _everything(tmp_path) == before and not target.exists()


def test_an_answer_about_another_run_is_refused(fake: FakeService, workdir: Path) -> None:
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run(B))
    for args in (("runs", "fetch", A), ("runs", "show", A), ("runs", "watch", A)):
        r = _cli(fake, *args)
        assert r.returncode == 9, (args, r.stdout + r.stderr)
        assert f"asked for run {A}, the service answered about run '{B}'" in r.stderr
        assert "verdict" not in r.stdout + r.stderr
    assert _everything(workdir) == set()


def test_an_unsigned_card_is_not_kept_and_its_verdict_is_not_printed(
        fake: FakeService, workdir: Path) -> None:
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run())
    fake.routes[f"/api/v1/runs/{A}/card.html"] = (200, {"Content-Type": "text/html"},
                                                  b"<html><body>verdict: PASS</body></html>" +
                                                  b" " * 17)
    fake.routes[f"/api/v1/runs/{A}/results.json"] = _json(
        {"schema": "certify.results/3", "measurement": {"verdict": "PASS"},
         "provenance": {"service": {"run_id": A}}})
    fake.routes[f"/api/v1/runs/{A}/results.json.sig"] = (200, {}, b'"AAAA"')
    for args in (("runs", "fetch", A), ("runs", "watch", A, "--out", "card")):
        r = _cli(fake, *args)
        assert r.returncode == 9, r.stdout + r.stderr
        assert "is not trusted" in r.stderr and "verdict" not in r.stdout + r.stderr.replace(
            "verdict: PASS</body>", ""), r.stderr
        assert r.stderr.count("\n") <= 3, r.stderr  # what it checked, then one error line
    assert _everything(workdir) == set()  # the folders it made are gone with the card


def test_a_key_other_than_the_pinned_one_is_refused(fake: FakeService, workdir: Path,
                                                    tmp_path: Path) -> None:
    from certify.report.sign import fingerprint

    pinned = ec.generate_private_key(ec.SECP256R1())
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 2, "logs": {},
                                 "urls": {fake.url: fingerprint(pinned.public_key())}}))
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run())
    r = _cli(fake, "runs", "fetch", A, state=state)
    assert r.returncode == 9 and "now signs with key" in r.stderr, r.stderr
    assert fingerprint(pinned.public_key()) in r.stderr
    assert _everything(workdir) == set()
    # a --pubkey other than the pinned one is refused the same way
    other = tmp_path / "other.pub"
    other.write_bytes(fake.routes["/api/v1/key"][2])  # type: ignore[index]
    r = _cli(fake, "runs", "fetch", A, "--pubkey", other, state=state)
    assert r.returncode == 9 and "now signs with key" in r.stderr, r.stderr


# The peak resident memory of this process's own image (VmHWM; ru_maxrss would carry over the
# peak of the pytest process it was forked from, which Linux keeps across exec).
_MEASURE = """
import re, sys
from certify.cli import main
code = 0
try:
    main(sys.argv[2:], prog_name="certify")
except SystemExit as exc:
    code = exc.code
with open("/proc/self/status") as status:
    peak_kb = re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1)
with open(sys.argv[1], "w") as f:
    f.write(f"{peak_kb} {code}")
"""


def _endless(step: bytes, pause: float, limit_bytes: int | None = None
             ) -> Callable[[BaseHTTPRequestHandler], None]:
    """An answer whose body is ``step`` again and again (``pause`` s apart), with no length."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.end_headers()
        sent = 0
        while limit_bytes is None or sent < limit_bytes:
            h.wfile.write(step)
            h.wfile.flush()
            sent += len(step)
            if pause:
                time.sleep(pause)
    return answer


def test_a_body_past_the_cap_is_refused_as_it_arrives_in_bounded_memory(
        fake: FakeService, workdir: Path, tmp_path: Path) -> None:
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run())
    fake.routes[f"/api/v1/runs/{A}/card.html"] = _endless(b"<p>" * 2**16, 0.0, 50 * 2**20)
    usage = tmp_path / "usage.txt"
    r = subprocess.run([sys.executable, "-c", _MEASURE, str(usage), "runs", "fetch", A,
                        "--server", fake.url, "--max-download-mb", "1"], capture_output=True,
                       text=True, timeout=120,
                       env={**os.environ, "CERTIFY_TOKEN": "cfy_test",
                            "CERTIFY_LOG_STATE": str(tmp_path / "state.json")})
    rss_kb, code = usage.read_text().split()
    assert int(code) == 2, r.stderr
    assert f"answer passed {2**20:,} bytes" in r.stderr and "--max-download-mb" in r.stderr
    assert int(rss_kb) * 1024 < 2**20 + 100 * 10**6, rss_kb  # the cap plus 100 MB
    assert _everything(workdir) == set()


def test_a_trickle_ends_at_the_deadline_in_the_headers_and_in_the_body(
        fake: FakeService, workdir: Path) -> None:
    def headers_a_byte_at_a_time(h: BaseHTTPRequestHandler) -> None:
        for ch in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 10_000:
            if fake.stop.is_set():
                return
            h.wfile.write(bytes([ch]))
            h.wfile.flush()
            time.sleep(0.5)

    fake.routes[f"/api/v1/runs/{A}"] = headers_a_byte_at_a_time
    started = time.monotonic()
    r = _cli(fake, "runs", "show", A, "--request-timeout", "3")
    took = time.monotonic() - started
    assert r.returncode == 2 and "did not complete within 3 s" in r.stderr, r.stderr
    assert took < 3 + 1.0, took

    fake.routes[f"/api/v1/runs/{A}"] = _json(_run())
    fake.routes[f"/api/v1/runs/{A}/card.html"] = _endless(b"x", 0.5)
    started = time.monotonic()
    r = _cli(fake, "runs", "fetch", A, "--request-timeout", "3")
    took = time.monotonic() - started
    assert r.returncode == 2 and "did not complete within 3 s" in r.stderr, r.stderr
    assert took < 3 + 1.0, took
    assert _everything(workdir) == set()


def test_an_endless_watch_stops_at_its_timeout_and_strings_are_escaped(
        fake: FakeService, workdir: Path) -> None:
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run(
        state="running", progress={"current": ESC, "steps": {ESC: {"done": 1, "total": ESC}}}))
    started = time.monotonic()
    r = _cli(fake, "runs", "watch", A, "--timeout", "2.5")
    took = time.monotonic() - started
    assert r.returncode == 130, r.stdout + r.stderr
    assert f"run {A} is still running after 2.5 s (--timeout)" in r.stderr
    assert took < 2.5 + 1.0, took
    out = r.stdout + r.stderr
    assert "\x1b" not in out and "\r" not in out
    assert "\\x1b[2J\\x1b[32mverdict: PASS\\x0d" in out, out
    # a failed run's error, and runs show/list, print what the server said, escaped
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run(state="error", error=ESC, exit_code=3,
                                                  model=ESC, suite=ESC))
    fake.routes["/api/v1/runs"] = _json({"total": 1, "runs": [_run(verdict=ESC, model=ESC)]})
    for args in (("runs", "watch", A), ("runs", "show", A), ("runs", "list")):
        r = _cli(fake, *args)
        out = r.stdout + r.stderr
        assert "\x1b" not in out and "\r" not in out and "\\x1b[2J" in out, (args, out)
    # a failed run that claims the exit code of a card is not believed
    fake.routes[f"/api/v1/runs/{A}"] = _json(_run(state="error", error="boom", exit_code=0))
    r = _cli(fake, "runs", "watch", A)
    assert r.returncode == 9 and "exit code 0" in r.stderr, r.stderr
    # a refusal's detail is escaped too
    fake.routes[f"/api/v1/runs/{A}"] = _json({"detail": ESC}, 500)
    r = _cli(fake, "runs", "show", A)
    assert r.returncode == 2 and "\x1b" not in r.stderr and "\\x1b[2J" in r.stderr, r.stderr
