"""Verification within fixed bounds (issue 38 point 2): every uploaded card is verified in a
child process with a memory and a time limit, behind a concurrency limit; the API process
never parses the upload, stays small and keeps answering; reasons name the upload, never a
server path.

One real ``certify serve`` for the module, with small limits so that they are reached quickly:
64 MB of memory beyond the verifier's code, 2 s, 2 verifications at once, 1 s of waiting for a
free one.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import requests
from hostile_cards import (
    deep_json,
    html_card,
    inflation_bomb_pdf,
    legacy_signature,
    nested_array_pdf,
    wide_json,
)
from service_fixture import Service

from certify.report.sign import fingerprint, keygen, load_private_key

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Service, bytes]]:
    """The service, and a genuine signature of the older statement type made with its key
    (what any card it signed before issue 38 carries)."""
    home = tmp_path_factory.mktemp("verify-bounds") / "home"
    key_path, _ = keygen(home / "keys", "service")
    key = load_private_key(key_path)
    svc = Service(home, "--workers", "0", "--verify-per-minute", "100000",
                  "--max-verify-mb", "4", "--verify-memory-mb", "64", "--verify-timeout", "2",
                  "--verify-concurrency", "2", "--verify-wait", "1").start()
    try:
        # the verifier process starts at the first verification (it imports the verification
        # code, seconds on a busy machine): start it here, so that the tests time only theirs
        assert _post(svc, "warm.json", b"{}", b"{}").json()["valid"] is False
        yield svc, legacy_signature(key, fingerprint(key.public_key()))
    finally:
        svc.stop()


def _post(svc: Service, name: str, data: bytes, sig: bytes | None = None
          ) -> requests.Response:
    files = {"file": (name, data)}
    if sig is not None:
        files["signature"] = (name + ".sig", sig)
    return requests.post(f"{svc.url}/api/v1/verify", files=files, timeout=60)


def _healthy(svc: Service) -> bool:
    return requests.get(f"{svc.url}/api/v1/health", timeout=5).ok


def _rss_mb(svc: Service) -> float:
    assert svc.proc is not None
    return psutil.Process(svc.proc.pid).memory_info().rss / 2**20


def _verifier(svc: Service) -> psutil.Process | None:
    """The service's verifier process (its children are the verifications)."""
    assert svc.proc is not None
    for child in psutil.Process(svc.proc.pid).children():
        try:
            if "certify.service.verify_sandbox" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_bombs_and_deep_json_are_answered_invalid_at_once_and_the_server_stays_small(served):
    svc, sig = served
    before = _rss_mb(svc)
    uploads = [
        ("bomb.pdf", inflation_bomb_pdf(256, sig), None),  # 256 MB behind two deflates
        ("issue.pdf", inflation_bomb_pdf(75, sig, layers=1), None),  # the issue's: 75 MB
        ("deep.json", deep_json(3 * 2**20), sig),
        ("deep.html", html_card(deep_json(3 * 2**20), sig), None),
    ]
    for name, data, detached in uploads:
        t0 = time.monotonic()
        r = _post(svc, name, data, detached)
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["valid"] is False and name in doc["reason"], doc
        assert "limit" not in doc, doc  # refused on its merits, not stopped by a limit
        assert took < 5, (name, took)
        assert _healthy(svc)
    # the payloads were inflated and parsed (or refused) elsewhere: the API process did not grow
    assert _rss_mb(svc) - before < 60, (before, _rss_mb(svc))


def test_a_child_over_its_memory_limit_is_killed_and_reported(served):
    svc, sig = served
    before = _rss_mb(svc)
    # 3 MB of [{},{},...] behind a genuine older signature: parsed before its digests are
    # compared, about 75 MB of heap, over the 64 MB the service allows
    r = _post(svc, "wide.json", wide_json(3), sig)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["valid"] is False and doc["limit"] == "memory", doc
    assert doc["reason"] == ("wide.json: the card could not be verified within the service's "
                             "limits (memory: more than 64 MB)")
    assert _healthy(svc)
    assert _rss_mb(svc) - before < 60
    # the same upload a tenth the size fits: the limit, not the kind of file, refused it
    small = _post(svc, "wide.json", wide_json(0.3), sig).json()
    assert small["valid"] is False and "limit" not in small, small


def test_the_concurrency_limit_holds_and_a_full_service_answers_503(served):
    """4 slow uploads at once (3 KB, about 8 s of CPU to parse each) against 2 slots of 2 s
    and 1 s of waiting: never more than 2 verification children; 2 answered invalid at the
    time limit, 2 refused with Retry-After."""
    svc, sig = served
    slow = nested_array_pdf(10, sig)
    verifier = _verifier(svc)
    assert verifier is not None
    answers: list[tuple[requests.Response, float]] = []
    seen: list[int] = []
    done = threading.Event()

    def count() -> None:
        while not done.is_set():
            try:
                seen.append(len(verifier.children()))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.005)

    counter = threading.Thread(target=count)
    counter.start()

    def post() -> None:
        t0 = time.monotonic()
        r = _post(svc, "slow.pdf", slow)
        answers.append((r, time.monotonic() - t0))  # one append: the pair stays together

    posts = [threading.Thread(target=post) for _ in range(4)]
    try:
        for t in posts:
            t.start()
        for t in posts:
            t.join(60)
    finally:
        done.set()
        counter.join(10)
    assert max(seen) == 2, max(seen)  # the limit was reached, never passed
    statuses = sorted(r.status_code for r, _ in answers)
    assert statuses == [200, 200, 503, 503], [r.text for r, _ in answers]
    # the refusals came after --verify-wait and before a slot freed
    refused = [seconds for r, seconds in answers if r.status_code == 503]
    assert 0.9 < max(refused) < min(seconds for r, seconds in answers if r.status_code == 200)
    for r, seconds in answers:
        if r.status_code == 503:
            assert int(r.headers["Retry-After"]) >= 1 and "try again" in r.json()["detail"]
        else:
            doc = r.json()
            assert doc["valid"] is False and doc["limit"] == "time", doc
            assert doc["reason"] == ("slow.pdf: the card could not be verified within the "
                                     "service's limits (time: more than 2 s)")
            assert 1.9 < seconds < 8, seconds
    assert _healthy(svc)


def test_reasons_name_the_upload_never_a_server_path(served):
    svc, _ = served
    tmp = tempfile.gettempdir()
    cases = [
        _post(svc, "release-card.pdf", b"%PDF-1.7\nnot really"),
        _post(svc, "my results.json", b"{}"),  # no detached signature
        _post(svc, "card.html", b"<p>nothing embedded</p>"),
        _post(svc, "../évil$name.html", b"<p>x</p>"),  # not a plain name: card.html
    ]
    names = ["release-card.pdf", "my results.json", "card.html", "card.html"]
    for r, name in zip(cases, names, strict=True):
        doc = r.json()
        assert r.status_code == 200 and doc["valid"] is False, doc
        said = f"{doc['reason']} {doc.get('hint')}"
        assert name in said, (name, said)
        assert tmp not in said and "certify-verify-" not in said and "/in/" not in said, said
    # the UI's verify page says the same
    page = requests.post(f"{svc.url}/verify", files={"file": ("release-card.pdf", b"%PDF-")},
                         timeout=60)
    assert page.ok and "release-card.pdf" in page.text and tmp not in page.text
