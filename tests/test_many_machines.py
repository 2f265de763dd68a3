"""Issue 39: one service on many machines. PostgreSQL and an S3-compatible store (moto's
server) on 127.0.0.1, two API nodes with their own ``--home`` and no workers, and worker
processes (``certify worker``) with their own homes: every run ends once, every card
downloads from either API and verifies against the one log, a worker SIGKILLed mid-run
loses nothing that its run's resumption on another worker does not recompute identically,
and a run that asks for a GPU waits for a worker that has one."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import requests
from pg import postgres_cluster
from service_fixture import Service, post_run, small_inputs
from sqlalchemy import select

import builders as b

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _wait(what: str, ok, timeout: float = 300.0, *logs: Service) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} not after {timeout} s\n" + "\n".join(s.log() for s in logs))


def test_two_apis_and_workers_share_postgresql_an_s3_store_and_one_identity(
        tmp_path: Path, s3_server) -> None:
    from certify.report.sign import keygen
    from certify.service.db import Run, make_engine, sessions
    from certify.service.store_url import open_store

    suite, data = small_inputs(tmp_path / "in", per_class=4)
    key, _pub = keygen(tmp_path / "keys", "service")  # writes service.crt beside it too
    store_url = s3_server.url("certify-test", f"mm-{uuid.uuid4().hex[:8]}")
    env = {"CERTIFY_SESSION_SECRET": os.urandom(32).hex()}
    with postgres_cluster() as pg:
        common = ("--store", store_url, "--sign-key", str(key), "--dataset", f"small={data}",
                  "--lease", "3", "--heartbeat", "0.5")
        # B answers card downloads with a redirect to a presigned GET of the store
        apis = [Service(tmp_path / f"api-{n}", "--workers", "0", *common, *extra, db=pg,
                        env=env) for n, extra in (("a", ()), ("b", ("--presigned-downloads",)))]
        workers = [Service(tmp_path / f"worker-{n}", "--workers", "1", *common, db=pg,
                           env=env, command="worker") for n in (1, 2)]
        nodes = [*apis, *workers]
        try:
            for node in nodes:
                node.start()
            a, bb = apis
            # A node with another signing key is refused: the database names the service's.
            other, _ = keygen(tmp_path / "other-keys", "other")
            proc = b.run_cli_process("worker", "--home", tmp_path / "rogue", "--db", pg,
                                     "--store", store_url, "--sign-key", other, timeout=120,
                                     env=env)
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert "is not the service's" in proc.stderr and "--sign-key" in proc.stderr

            token = a.token("submit", "--max-concurrent", "30")
            gpu = post_run(bb, token, suite, samples="12", device="cuda")
            assert gpu.status_code == 202, gpu.text
            gpu_id = gpu.json()["id"]
            assert gpu.json()["device"] == "cuda"

            # A longer run, killed with its worker once its first records segment is stored.
            long_id = post_run(a, token, suite, samples="172", seed="7").json()["id"]
            store = open_store(store_url, tmp_path)
            engine = make_engine(pg)
            factory = sessions(engine)
            _wait("a records segment of the long run",
                  lambda: bool(store.list(f"runs/{long_id}/records/")), 300, *nodes)
            with factory() as s:
                owner = s.scalar(select(Run.lease_owner).where(Run.id == long_id))
                assert s.scalar(select(Run.state).where(Run.id == long_id)) == "running"
            pid = int(owner.split(":")[1])
            victim = next(w for w in workers if w.proc is not None and w.proc.pid == pid)
            assert store.size(f"runs/{long_id}/out/results.json") is None  # mid-run
            victim.kill()
            replacement = Service(tmp_path / "worker-3", "--workers", "1", *common, db=pg,
                                  env=env, command="worker").start()
            nodes.append(replacement)

            ids = [post_run(apis[i % 2], token, suite, samples="12", seed=str(i % 5))
                   for i in range(20)]
            assert all(r.status_code == 202 for r in ids), [r.text for r in ids]
            ids_ = [r.json()["id"] for r in ids]
            again = post_run(bb, token, suite, samples="172", seed="7").json()["id"]
            every = [long_id, *ids_, again]
            docs = {i: apis[n % 2].wait_run(i, token, timeout=900)
                    for n, i in enumerate(every)}
            assert all(d["state"] == "done" for d in docs.values()), \
                [d.get("error") for d in docs.values()]
            assert docs[long_id]["attempts"] >= 2  # resumed on another worker
            # Ended exactly once: one log entry each, in one log both APIs serve.
            indices = sorted(d["log_index"] for d in docs.values())
            assert indices == list(range(len(every)))
            heads = [api.get("/log").json() for api in apis]
            assert {(h["tree_size"], h["root_hash"], h["key_fingerprint"]) for h in heads} == \
                {(len(every), heads[0]["root_hash"], heads[0]["key_fingerprint"])}
            # The interrupted run's measurement is the uninterrupted one's.
            m1, m2 = (json.loads(a.get(f"/runs/{i}/results.json", token).content)["measurement"]
                      for i in (long_id, again))
            assert m1 == m2
            # Every card downloads, the same bytes, from either API, and verifies against the
            # log; the service's published certificate is the one in every node's key folder.
            assert a.get("/certificate").content == bb.get("/certificate").content
            for n, run_id in enumerate(every):
                pdfs = [api.get(f"/runs/{run_id}/card.pdf", token) for api in apis]
                assert all(r.status_code == 200 for r in pdfs), [r.text[:200] for r in pdfs]
                assert pdfs[0].content == pdfs[1].content
                assert not pdfs[0].history and pdfs[1].history[0].status_code == 307
                assert pdfs[1].url.startswith(s3_server.endpoint)
                if n % 5 == 0:  # the in-process verifier; a sample of the 22 keeps it short
                    card = tmp_path / f"card-{run_id}.pdf"
                    card.write_bytes(pdfs[0].content)
                    v = b.run_cli("verify", card, "--log", apis[(n + 1) % 2].url,
                                  "--log-state", tmp_path / "log-state.json")
                    assert v.returncode == 0, v.stdout + v.stderr
                    assert "inclusion: proven" in v.stdout
            # Nothing of the runs on any node's disk: the store holds it all.
            for node in nodes:
                assert not (node.home / "store").exists()
            # The GPU run waits: no worker here has one.
            gpu_doc = a.get(f"/runs/{gpu_id}", token).json()
            assert gpu_doc["state"] == "queued" and gpu_doc["attempts"] == 0
            # Operations: readiness names the store; /metrics lists the live workers'
            # heartbeats and the store's latency.
            ready = a.get("/ready")
            assert ready.status_code == 200 and ready.json()["store"] == "s3"
            metrics = requests.get(f"{a.url}/metrics", timeout=30).text
            beats = [ln for ln in metrics.splitlines()
                     if ln.startswith("certify_worker_heartbeat_age_seconds{")]
            fresh = [ln for ln in beats if float(ln.rsplit(" ", 1)[1]) < 10]
            assert len(fresh) >= 2, beats  # the two live workers (the killed one ages)
            assert "certify_store_up{store=\"s3\"} 1" in metrics
            assert "certify_store_latency_seconds " in metrics
            engine.dispose()
        finally:
            for node in nodes:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGTERM)
            for node in nodes:
                node.stop()
