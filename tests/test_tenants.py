"""Issue 38 point 4: tenants apart. One real ``certify serve`` (no workers) with two submitting
tokens, an admin and a reader: every run route and UI page answers another token's ids exactly
as missing ones (404); lists show only the caller's runs; sharing is explicit (public runs,
revocable share links); sessions end at logout and with their token; re-uploading another
token's bytes looks like a first upload; stored results edited on disk are never served.

Finished runs are made here without running anything: a results.json (the previous release's)
signed with the service's own key, written where a worker would have put it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from service_fixture import Service, post_run, small_inputs

from builders import write_small_suite

pytestmark = pytest.mark.e2e

RESULTS = Path(__file__).parent / "data" / "previous_release" / "results.json"
FILES = ("card.html", "card.pdf", "results.json", "results.json.sig")


@dataclass
class World:
    """The service, its database, and who owns what."""

    svc: Service
    factory: Any
    tokens: dict[str, str]  # name -> plaintext
    ids: dict[str, int]  # name -> token id
    queued: dict[str, str]  # owner -> a queued run of theirs
    done: dict[str, str]  # owner -> a finished run of theirs
    suite: Path


def _token(factory: Any, role: str, name: str) -> tuple[str, int]:
    from certify.service import auth

    with factory() as s:
        plain, row = auth.create_token(s, name, role, None)
        return plain, row.id


def _finished_run(world_svc: Service, factory: Any, token_id: int) -> str:
    """A done run of ``token_id`` whose results are signed with the service's key."""
    from certify.canonical import canonical_json
    from certify.report.sign import load_private_key, sign
    from certify.service import queue
    from certify.service.db import DONE, Run
    from certify.service.job import OUT_DIR

    with factory() as s:
        run = queue.enqueue(s, token_id=token_id, model_kind="onnx", model_ref="m",
                            model_name=f"made-{token_id}", suite="gtsrb", suite_name="gtsrb",
                            dataset="small", options={})
        row = s.get(Run, run.id)
        row.state, row.verdict, row.exit_code = DONE, "PASS", 0
        row.progress = {"files": list(FILES)}
        s.commit()
    out = world_svc.home / "store" / "runs" / run.id / OUT_DIR
    out.mkdir(parents=True)
    doc = json.loads(RESULTS.read_text())
    key = load_private_key(world_svc.home / "keys" / "service.key")
    (out / "results.json").write_bytes(canonical_json(doc))
    (out / "results.json.sig").write_text(sign(doc, key).to_json())
    (out / "card.html").write_text(f"<!doctype html><title>card of {run.id}</title>")
    (out / "card.pdf").write_bytes(b"%PDF-1.7 stand-in\n")
    return run.id


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from certify.service.db import make_engine, sessions, sqlite_url

    folder = tmp_path_factory.mktemp("tenants")
    suite, data = small_inputs(folder / "in", per_class=1)
    svc = Service(folder / "home", "--workers", "0", "--dataset", f"small={data}").start()
    engine = make_engine(sqlite_url(svc.home))
    factory = sessions(engine)
    tokens, ids = {}, {}
    for name, role in (("a", "submit"), ("b", "submit"), ("admin", "admin"),
                       ("reader", "read")):
        tokens[name], ids[name] = _token(factory, role, name)
    queued = {}
    for name in ("a", "b"):
        r = post_run(svc, tokens[name], suite, samples="4")
        assert r.status_code == 202, r.text
        queued[name] = r.json()["id"]
    done = {name: _finished_run(svc, factory, ids[name]) for name in ("a", "b")}
    try:
        yield World(svc, factory, tokens, ids, queued, done, suite)
    finally:
        svc.stop()
        engine.dispose()


def _call(svc: Service, method: str, path: str, token: str | None, **kw: Any
          ) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.request(method, f"{svc.url}{path}", headers=headers, timeout=30, **kw)


def _routes(run: str, mine: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every run route, aimed at ``run`` (``mine``: a run of the caller, for comparisons)."""
    api = "/api/v1/runs"
    return [("GET", f"{api}/{run}", {}), ("GET", f"{api}/{run}/events", {}),
            *[("GET", f"{api}/{run}/{name}", {}) for name in FILES],
            ("GET", f"{api}/{run}/compare/{mine}", {}), ("GET", f"{api}/{mine}/compare/{run}", {}),
            ("POST", f"{api}/{run}/cancel", {}),
            ("POST", f"{api}/{run}/share", {"json": {"public": True}}),
            ("POST", f"{api}/{run}/links", {}), ("GET", f"{api}/{run}/links", {}),
            ("DELETE", f"{api}/{run}/links", {}), ("DELETE", f"{api}/{run}/links/1", {})]


def _login(svc: Service, token: str) -> tuple[requests.Session, str]:
    """A browser-like session logged in with ``token``, and its CSRF token."""
    s = requests.Session()
    r = s.post(f"{svc.url}/login", data={"token": token}, timeout=30)
    assert r.status_code == 200 and r.url.endswith("/runs"), r.text
    m = re.search(r'name="csrf" value="([^"]+)"', r.text)
    assert m is not None
    return s, m.group(1)


def test_another_tenant_s_runs_answer_exactly_as_missing_ones(world: World) -> None:
    """The issue's probe: token A read token B's runs, results, cards, events and comparisons
    (16 of 16 reads answered 200). Now every route x B's ids answers as a missing id does."""
    svc, a = world.svc, world.tokens["a"]
    missing = uuid.uuid4().hex
    probes = 0
    for theirs in (world.queued["b"], world.done["b"]):
        for (method, path, kw), (_, path_missing, _) in zip(
                _routes(theirs, world.done["a"]), _routes(missing, world.done["a"]),
                strict=True):
            got = _call(svc, method, path, a, **kw)
            expect = _call(svc, method, path_missing, a, **kw)
            assert got.status_code == expect.status_code == 404, (method, path, got.text)
            assert got.json()["detail"].replace(theirs, "X") == \
                expect.json()["detail"].replace(missing, "X"), (method, path)
            probes += 1
    assert probes == 2 * 14  # 14 routes
    # nothing changed behind the refusals
    b_run = _call(svc, "GET", f"/api/v1/runs/{world.queued['b']}", world.tokens["b"]).json()
    assert b_run["state"] == "queued" and b_run["public"] is False
    # the owner reads its own (the controls of the probe: the same routes do answer)
    own = world.done["a"]
    assert _call(svc, "GET", f"/api/v1/runs/{own}/results.json", a).status_code == 200
    assert _call(svc, "GET", f"/api/v1/runs/{own}/card.html", a).text.endswith(own + "</title>")
    # the UI: another's run page is the missing-run page; its sharing form too
    ui, csrf = _login(svc, a)
    got, expect = (ui.get(f"{svc.url}/runs/{i}", timeout=30) for i in (world.done["b"], missing))
    assert got.status_code == expect.status_code == 404
    assert got.text.replace(world.done["b"], "X") == expect.text.replace(missing, "X")
    r = ui.post(f"{svc.url}/runs/{world.done['b']}/share", data={"csrf": csrf, "public": "1"},
                timeout=30, allow_redirects=False)
    assert r.status_code == 404
    assert ui.get(f"{svc.url}/runs/{own}", timeout=30).status_code == 200


def test_lists_show_the_caller_s_runs_and_an_admin_sees_all(world: World) -> None:
    svc = world.svc

    def listed(token: str) -> set[str]:
        doc = _call(svc, "GET", "/api/v1/runs?limit=500", token).json()
        assert doc["total"] == len(doc["runs"])
        return {r["id"] for r in doc["runs"]}

    mine = {name: {world.queued[name], world.done[name]} for name in ("a", "b")}
    assert listed(world.tokens["a"]) == mine["a"]
    assert listed(world.tokens["b"]) == mine["b"]
    assert listed(world.tokens["reader"]) == set()  # a read token owns no runs
    assert listed(world.tokens["admin"]) >= mine["a"] | mine["b"]
    ui, _ = _login(svc, world.tokens["a"])
    page = ui.get(f"{svc.url}/runs", timeout=30).text
    assert all(f"/runs/{i}" in page for i in mine["a"])
    assert not any(f"/runs/{i}" in page for i in mine["b"])
    admin = world.tokens["admin"]
    for name in FILES:
        assert _call(svc, "GET", f"/api/v1/runs/{world.done['b']}/{name}", admin).ok
    assert _call(svc, "GET", f"/api/v1/runs/{world.queued['b']}/links", admin).json() == {
        "links": []}


def test_public_runs_and_share_links_are_explicit_and_revocable(world: World) -> None:
    svc, a, b = world.svc, world.tokens["a"], world.tokens["b"]
    run = world.done["b"]
    api = f"/api/v1/runs/{run}"
    results = _call(svc, "GET", f"{api}/results.json", b).content
    # public: every token reads it (it stays out of their lists); only B changes it
    r = _call(svc, "POST", f"{api}/share", b, json={"public": True})
    assert r.status_code == 200 and r.json()["public"] is True
    for token in (a, world.tokens["reader"]):
        assert _call(svc, "GET", api, token).json()["public"] is True
        assert _call(svc, "GET", f"{api}/results.json", token).content == results
    assert run not in {x["id"] for x in _call(svc, "GET", "/api/v1/runs", a).json()["runs"]}
    for method, path, kw in (("POST", f"{api}/cancel", {}), ("POST", f"{api}/links", {}),
                             ("POST", f"{api}/share", {"json": {"public": False}})):
        r = _call(svc, method, path, a, **kw)
        assert r.status_code == 404 and "of this token" in r.json()["detail"], (path, r.text)
    assert _call(svc, "POST", f"{api}/share", b, json={"public": False}).json()["public"] is False
    assert _call(svc, "GET", f"{api}/results.json", a).status_code == 404
    # share links: no token needed, each revocable; the run stays private
    made = [_call(svc, "POST", f"{api}/links", b) for _ in range(3)]
    assert all(m.status_code == 201 for m in made)
    paths = [m.json()["path"] for m in made]
    assert len(set(paths)) == 3 and all(re.fullmatch(r"/shared/[\w-]{43}", p) for p in paths)
    assert made[0].json()["url"] == svc.url + paths[0]
    assert requests.get(f"{svc.url}{paths[0]}/results.json", timeout=30).content == results
    card = requests.get(f"{svc.url}{paths[0]}", timeout=30)
    assert card.status_code == 200 and card.text.endswith(f"card of {run}</title>")
    listed = _call(svc, "GET", f"{api}/links", b).json()["links"]
    assert [x["id"] for x in listed] == [m.json()["id"] for m in made]
    assert "path" not in listed[0]  # the secret is not kept
    first = made[0].json()["id"]
    assert _call(svc, "DELETE", f"{api}/links/{first}", b).json() == {"revoked": 1}
    assert requests.get(f"{svc.url}{paths[0]}/results.json", timeout=30).status_code == 404
    assert requests.get(f"{svc.url}{paths[1]}/results.json", timeout=30).status_code == 200
    assert _call(svc, "DELETE", f"{api}/links/{first}", b).status_code == 404
    assert _call(svc, "DELETE", f"{api}/links", b).json() == {"revoked": 2}
    assert all(requests.get(f"{svc.url}{p}", timeout=30).status_code == 404 for p in paths)
    assert requests.get(f"{svc.url}/shared/{'x' * 43}", timeout=30).status_code == 404
    # the UI's controls: make public, create a link (shown once), revoke every link
    ui, csrf = _login(svc, b)
    page = ui.post(f"{svc.url}/runs/{run}/share", data={"csrf": csrf, "public": "1"},
                   timeout=30).text
    assert 'id="visibility">public' in page
    page = ui.post(f"{svc.url}/runs/{run}/links", data={"csrf": csrf}, timeout=30).text
    link = re.search(r'id="new-link">([^<]+)<', page)
    assert link is not None and requests.get(link.group(1), timeout=30).status_code == 200
    ui.post(f"{svc.url}/runs/{run}/links/revoke", data={"csrf": csrf, "link": "all"},
            timeout=30)
    assert requests.get(link.group(1), timeout=30).status_code == 404
    page = ui.post(f"{svc.url}/runs/{run}/share", data={"csrf": csrf, "public": "0"},
                   timeout=30).text
    assert 'id="visibility">private' in page
    assert _call(svc, "GET", api, a).status_code == 404


def test_logout_ends_the_session_and_so_does_revoking_its_token(world: World) -> None:
    """A session cookie copied before logout stopped working only when it expired."""
    from certify.service import auth

    svc = world.svc
    plain, tid = _token(world.factory, "submit", "leaver")
    ui, csrf = _login(svc, plain)
    copied = dict(ui.cookies)
    assert list(copied) == ["certify_session"]
    assert requests.get(f"{svc.url}/api/v1/runs", cookies=copied, timeout=30).status_code == 200
    r = ui.post(f"{svc.url}/logout", data={"csrf": csrf}, timeout=30, allow_redirects=False)
    assert r.status_code == 303
    r = requests.get(f"{svc.url}/runs", cookies=copied, timeout=30, allow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert requests.get(f"{svc.url}/api/v1/runs", cookies=copied, timeout=30).status_code == 401
    # a revoked token's live session ends at once
    ui, _ = _login(svc, plain)
    cookie = dict(ui.cookies)
    with world.factory() as s:
        assert auth.revoke(s, tid)
    r = requests.get(f"{svc.url}/runs", cookies=cookie, timeout=30, allow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert requests.get(f"{svc.url}/api/v1/runs", cookies=cookie, timeout=30).status_code == 401
    # a made-up cookie of the right shape is no session
    fake = {"certify_session": "A" * 43}
    assert requests.get(f"{svc.url}/api/v1/runs", cookies=fake, timeout=30).status_code == 401


def test_re_uploading_another_token_s_bytes_looks_like_a_first_upload(
        world: World, tmp_path: Path) -> None:
    """Uploading bytes token A already sent answered differently (B could not delete its
    upload: 404), which told B that A had them."""
    from sqlalchemy import select

    from certify.models.onnx import sha256_file
    from certify.service.db import Upload

    svc, a = world.svc, world.tokens["a"]
    c, _ = _token(world.factory, "submit", "c")
    b = world.tokens["b"]
    shared = write_small_suite(tmp_path / "shared.yaml", f"shared-{uuid.uuid4().hex}")
    fresh = write_small_suite(tmp_path / "fresh.yaml", f"fresh-{uuid.uuid4().hex}")
    first = post_run(svc, a, shared, samples="4")
    again = post_run(svc, b, shared, samples="4")  # A's bytes
    alone = post_run(svc, c, fresh, samples="4")  # bytes nobody sent before
    assert first.status_code == again.status_code == alone.status_code == 202

    def shape(doc: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in doc.items()
                if k not in ("id", "created", "updated", "links", "suite")}

    assert shape(again.json()) == shape(alone.json())
    digests = {name: "sha256:" + sha256_file(p) for name, p in (("shared", shared),
                                                                 ("fresh", fresh))}
    with world.factory() as s:
        owners = sorted(s.scalars(select(Upload.token_id).where(
            Upload.digest == digests["shared"])))
        size = s.get(Upload, (digests["shared"], world.ids["b"])).size  # B's quota counts it
    assert owners == sorted([world.ids["a"], world.ids["b"]]) and size == shared.stat().st_size
    # another token's upload answers as a missing one
    missing = "sha256:" + "0" * 64
    got, expect = (_call(svc, "DELETE", f"/api/v1/uploads/{d}", a)
                   for d in (digests["fresh"], missing))
    assert got.status_code == expect.status_code == 404
    assert got.json()["detail"].replace(digests["fresh"], "X") == \
        expect.json()["detail"].replace(missing, "X")
    # deleting: while one's own run uses it, 409 for both; after cancelling, each deletes
    # its own copy; A's copy (and run) are untouched by B's delete
    blob = svc.home / "store" / "blobs" / "sha256" / digests["shared"][7:9] / \
        digests["shared"][7:]
    for token, run, digest in ((b, again, "shared"), (c, alone, "fresh")):
        assert _call(svc, "DELETE", f"/api/v1/uploads/{digests[digest]}", token
                     ).status_code == 409
        assert _call(svc, "POST", f"/api/v1/runs/{run.json()['id']}/cancel", token).ok
        gone = _call(svc, "DELETE", f"/api/v1/uploads/{digests[digest]}", token)
        assert gone.status_code == 200 and gone.json() == {"deleted": digests[digest]}
        assert _call(svc, "DELETE", f"/api/v1/uploads/{digests[digest]}", token
                     ).status_code == 404
    assert blob.is_file()  # still A's
    suite_copy = svc.home / "store" / "suites" / f"{digests['shared'][7:]}.yaml"
    assert suite_copy.is_file()
    assert _call(svc, "POST", f"/api/v1/runs/{first.json()['id']}/cancel", a).ok
    assert _call(svc, "DELETE", f"/api/v1/uploads/{digests['shared']}", a).status_code == 200
    assert not blob.exists() and not suite_copy.exists()


def test_stored_results_edited_on_disk_are_refused_and_logged(world: World) -> None:
    """A results.json edited in the store was served (and compared) as it was."""
    from certify.service.job import OUT_DIR

    svc, a = world.svc, world.tokens["a"]
    run = world.done["a"]
    path = svc.home / "store" / "runs" / run / OUT_DIR / "results.json"
    original = path.read_bytes()
    edited = original.replace(b'"INCONCLUSIVE"', b'"PASS"', 1)
    assert edited != original
    path.write_bytes(edited)
    try:
        for name in FILES:
            r = _call(svc, "GET", f"/api/v1/runs/{run}/{name}", a)
            assert r.status_code == 500, (name, r.status_code)
            assert "fail their signature" in r.json()["detail"]
            assert b'"PASS"' not in r.content
        r = _call(svc, "GET", f"/api/v1/runs/{run}/compare/{run}", a)
        assert r.status_code == 500 and "fail their signature" in r.json()["detail"]
        link = _call(svc, "POST", f"/api/v1/runs/{run}/links", a).json()["path"]
        assert requests.get(f"{svc.url}{link}/results.json", timeout=30).status_code == 500
        assert f"run {run}: the stored results.json fails its signature" in svc.log()
    finally:
        path.write_bytes(original)
    assert _call(svc, "GET", f"/api/v1/runs/{run}/results.json", a).content == original
