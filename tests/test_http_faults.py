"""Endpoints that fail quietly: adaptive deadlines, hedged requests, the circuit breaker.

Real servers on 127.0.0.1 (tests/servers.py) inject seeded faults: connections accepted and
never answered, slow answers, resets in the middle of a body, truncated or garbage bodies, 429s
and outages. The tests assert what certify recorded (the deadline that ran out, the hedges it
counted, the breaker's trips) and that metrics equal the same model's in-process ones; they
never assert elapsed time.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from test_http import _run, _suite

from certify.device import choose_device
from certify.errors import CARD_WRITTEN_CODES
from certify.models.http import HttpModel, HttpOptions
from certify.models.resilience import WARMUP

import builders
from servers import Faults, OnnxHttpServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WARM = 24  # requests answered before the fault under test (past WARMUP and the hedge share)


@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("faults") / "d.npz", 16,
                                       seed=23)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return _suite(tmp_path_factory.mktemp("suite") / "s.yaml")


@pytest.fixture(scope="module")
def baseline(model_path, suite, data, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("onnx") / "run"
    proc = _run(model_path, suite, data, out)
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    return builders.check_metrics(out)


def _traffic(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["provenance"]["traffic"]["model"]


def _model(server: OnnxHttpServer, **opts: object) -> HttpModel:
    return HttpModel(server.v2_url, choose_device("cpu"),
                     options=HttpOptions(batch=8, **opts))  # type: ignore[arg-type]


def _warm_then(*faults: str) -> Faults:
    """No fault for the model's load and WARM inference requests, then ``faults`` in order."""
    return Faults(first=("",) * WARM + faults)


def _ask(model: HttpModel, times: int) -> list[torch.Tensor]:
    x = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    return [model.predict(x) for _ in range(times)]


def test_a_hang_after_warm_up_costs_a_deadline_under_a_second(model_path):
    server = OnnxHttpServer(model_path, faults=_warm_then("hang"))
    model = _model(server, hedge=False)
    try:
        answers = _ask(model, WARM + 3)
        t = model.traffic()
    finally:
        model.close()
        server.stop()
    assert server.faults_injected == {"hang": 1}
    assert t["timeouts"] == 1 and t["retries"] == 1 and t["hedges"] == 0
    [expired] = t["deadlines"]["expired_s"]
    assert expired <= 1.0, t["deadlines"]  # not --timeout's 30 s
    assert t["deadlines"]["warmup_attempts"] >= WARMUP
    assert all(torch.equal(a, answers[0]) for a in answers)


def test_a_hang_is_hedged_and_the_loser_connection_closed(model_path):
    server = OnnxHttpServer(model_path, faults=_warm_then("hang"))
    model = _model(server)
    threads = threading.active_count()
    try:
        answers = _ask(model, WARM + 3)
        t = model.traffic()
        for _ in range(50):  # the hung handler returns once certify shut its socket
            if server.in_flight == 0:
                break
            time.sleep(0.1)
        assert server.in_flight == 0, "the losing attempt's connection is still open"
    finally:
        model.close()
        server.stop()
    assert server.faults_injected == {"hang": 1}
    assert t["hedges"] == 1 and t["hedge_wins"] == 1 and t["timeouts"] == 0
    assert t["requests"] == 2 + 1 + WARM + 3 + 1  # 2 GETs + probe + asks + the hedge
    assert all(torch.equal(a, answers[0]) for a in answers)
    assert threading.active_count() <= threads + 2 * 8 + 2  # the bounded attempt pool


def _slow_after(model_path: Path, *before: str, retry_after: float = 0
                ) -> tuple[dict[str, int], dict]:
    """Ask a server whose faults after warm-up are ``before`` then one 0.6 s answer; return
    the faults it injected and certify's traffic record."""
    server = OnnxHttpServer(model_path, faults=_warm_then(*before, "slow"))
    server.faults.slow_s = 0.6
    server.faults.retry_after = retry_after
    model = _model(server)
    try:
        _ask(model, WARM + 2 + sum(1 for f in before if f == ""))
        return dict(server.faults_injected), model.traffic()
    finally:
        model.close()
        server.stop()


@pytest.mark.parametrize("first", ["429", "503"])
def test_no_hedge_after_429_or_503(model_path, first):
    # the request that got 429 (or 503) is retried slowly: it must wait, not be hedged
    kind = "429" if first == "429" else "outage"  # the server's 503
    injected, t = _slow_after(model_path, kind)
    assert injected == {kind: 1, "slow": 1}
    assert t["overloaded"] == 1 and t["hedges"] == 0, t


@pytest.mark.parametrize("overloads, hedges", [(1, 1), (4, 0)])
def test_hedging_pauses_for_everyone_only_while_429s_are_frequent(model_path, overloads,
                                                                   hedges):
    # one 429 stops its own request's hedges only; four in the last ~33 answers (over 10%)
    # mean an overloaded server, and the next request's slow answer is not hedged either
    injected, t = _slow_after(model_path, *["429"] * overloads, "", retry_after=1)
    assert injected == {"429": overloads, "slow": 1}
    assert t["overloaded"] == overloads and t["hedges"] == hedges, t


def test_a_slow_answer_without_429_is_hedged(model_path):
    # the control for the tests above: the same slow answer, no 429 before it
    injected, t = _slow_after(model_path)
    assert injected == {"slow": 1}
    assert t["hedges"] == 1 and t["hedge_wins"] == 1


def test_every_fault_kind_is_retried_to_the_same_metrics(model_path, suite, data, baseline,
                                                         tmp_path):
    faults = Faults(seed=8, p_500=0.04, p_429=0.04, p_hang=0.04, p_reset=0.03,
                    p_garbage=0.02, p_malformed=0.02, p_slow=0.02, slow_s=1.0,
                    retry_after=1, first=("hang", "reset", "garbage", "malformed"))
    server = OnnxHttpServer(model_path, faults=faults)
    try:
        proc = _run(server.v2_url, suite, data, tmp_path / "run", "--timeout", "5",
                    "--http-batch", "8")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert {"hang", "reset", "garbage", "malformed", "500", "429"} <= set(
        server.faults_injected), server.faults_injected
    assert builders.check_metrics(tmp_path / "run") == baseline
    t = _traffic(tmp_path / "run")
    assert t["connection_errors"] >= 1 and t["malformed"] >= 2 and t["overloaded"] >= 1
    assert t["hedges"] <= 0.05 * t["requests"]
    assert t["deadlines"]["chosen_s"]["count"] > 0


def test_hedges_are_requests_not_queries_and_the_budget_holds(model_path, suite, data,
                                                              baseline, tmp_path):
    out0 = tmp_path / "clean"
    server = OnnxHttpServer(model_path)
    try:
        assert _run(server.v2_url, suite, data, out0).returncode in CARD_WRITTEN_CODES
    finally:
        server.stop()
    queries = json.loads((out0 / "results.json").read_text())["measurement"]["queries"]["total"]
    server = OnnxHttpServer(model_path, faults=Faults(seed=2, p_slow=0.08, slow_s=0.5))
    out = tmp_path / "run"
    try:  # a budget of exactly the queries the suite needs: hedges must not eat into it
        proc = _run(server.v2_url, suite, data, out, "--query-budget", str(queries),
                    "--http-batch", "8")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    r = json.loads((out / "results.json").read_text())
    assert r["measurement"]["queries"]["total"] == queries
    assert builders.check_metrics(out) == baseline
    t = r["provenance"]["traffic"]["model"]
    assert t["hedges"] > 0 and t["hedges"] <= 0.05 * t["requests"]
    assert t["images"] >= queries  # the endpoint saw the hedged images twice


def test_no_hedge_flag_and_a_randomised_model_turn_hedging_off(model_path, data, tmp_path):
    suite = builders.write_small_suite(tmp_path / "s.yaml", "random", [
        {"id": "sanity", "kind": "sanity", "samples": 8}])
    server = OnnxHttpServer(model_path, noise=0.05)
    try:
        proc = _run(server.v2_url, suite, data, tmp_path / "random")
        flag = _run(server.v2_url, suite, data, tmp_path / "flag", "--no-hedge")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert "randomised" in _traffic(tmp_path / "random")["hedging_off"]
    assert flag.returncode in CARD_WRITTEN_CODES, flag.stderr
    t = _traffic(tmp_path / "flag")
    assert t["hedging_off"] == "--no-hedge" and t["hedges"] == 0 and t["hedging"] is False


def test_breaker_pauses_probes_and_resumes(model_path, suite, data, baseline, tmp_path):
    server = OnnxHttpServer(model_path, faults=Faults(outage_after=30, outage_s=2.0))
    try:
        proc = _run(server.v2_url, suite, data, tmp_path / "run", "--http-batch", "8",
                    "--retries", "2")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.check_metrics(tmp_path / "run") == baseline
    t = _traffic(tmp_path / "run")
    assert t["breaker"]["trips"] >= 1 and t["health_probes"] >= 2
    assert "probe its health" in proc.stderr


def test_breaker_gives_up_with_exit_3_and_resume_gives_the_same_results(
        model_path, suite, data, baseline, tmp_path):
    server = OnnxHttpServer(model_path, faults=Faults(outage_after=30))
    out = tmp_path / "run"
    try:
        proc = _run(server.v2_url, suite, data, out, "--http-batch", "8", "--retries", "1",
                    "--breaker-wait", "1")
        assert proc.returncode == 3, proc.stderr
        assert "is down" in proc.stderr and "health probe still failed" in proc.stderr
        assert "--resume" in proc.stderr and "Traceback" not in proc.stderr
        assert not (out / "results.json").exists()
        assert (out / "records.jsonl").read_text().strip(), "records before the outage kept"
        server.faults.outage_after = None
        proc = _run(server.v2_url, suite, data, out, "--http-batch", "8", "--resume")
    finally:
        server.stop()
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.check_metrics(out) == baseline
