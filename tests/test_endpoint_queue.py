"""Issue 61 against a real serving stack: MLServer 1.7.1 (``.venv-mlserver``, started by the
test on 127.0.0.1) serving the demo's standard model over REST and gRPC.

- what concurrent engine lanes ask arrives packed in one request (the server's own log of
  images per request), each lane's budget counts its own images, and every lane gets the rows
  the model gives its images in this process;
- a malformed answer to a packed request is retried as a whole and answers every caller, and
  one that stays malformed fails every caller in it with the same error (the stated rule);
- the Open Inference Protocol over gRPC gives the metrics REST and in-process give.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from certify.api import demo_model_path
from certify.device import choose_device
from certify.errors import BudgetExceeded, ModelError
from certify.models.base import QueryCounter
from certify.models.http import HttpModel, HttpOptions
from certify.models.onnx import OnnxModel

import builders
from servers import Faults, MLServer, Proxy, mlserver_process

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServer]:
    with mlserver_process(demo_model_path("standard"),
                          tmp_path_factory.mktemp("mlserver") / "m") as s:
        yield s


def _lanes(model: HttpModel, counters: list[QueryCounter], asks: list[torch.Tensor]
           ) -> list[torch.Tensor | BaseException]:
    """Each ask from its own registered lane through its own counter, all at once."""
    return builders.in_lanes(model.lane, [functools.partial(c.predict, a)
                                          for c, a in zip(counters, asks, strict=True)], 60)


def test_concurrent_lanes_arrive_packed_and_budgets_and_rows_hold(served: MLServer) -> None:
    device = choose_device("cpu")
    model = HttpModel(served.url, device, options=HttpOptions(batch=64, concurrency=4))
    local = OnnxModel(demo_model_path("standard"), device)
    try:
        torch.manual_seed(0)
        asks = [torch.rand(6, 3, 32, 32) for _ in range(6)]
        counters = [QueryCounter(model, budget=None if k else 5) for k in range(6)]
        before = len(served.batches())
        got = _lanes(model, counters, asks)
        sizes = served.batches()[before:]
    finally:
        model.close()
    # lane 0's budget (5) refuses its 6 images before any is sent; the other five lanes'
    # 30 images go in one request
    assert isinstance(got[0], BudgetExceeded) and counters[0].queries == 0
    assert sizes == [30], sizes
    for k in range(1, 6):
        assert counters[k].queries == 6
        assert torch.equal(got[k], local.predict(asks[k])), k  # type: ignore[arg-type]
    assert model.traffic()["inference_requests"] == 2  # the load-time probe, then one


def test_a_malformed_answer_retries_the_packed_request_or_fails_all_its_callers(
        served: MLServer) -> None:
    device = choose_device("cpu")
    proxy = Proxy(served.url.split("/v2/")[0], faults=Faults(first=("", "garbage")))
    model = HttpModel(proxy.url(served.url), device,
                      options=HttpOptions(batch=64, concurrency=2, retries=1,
                                          breaker_wait=2.0, hedge=False))
    local = OnnxModel(demo_model_path("standard"), device)
    try:
        asks = [torch.rand(5, 3, 32, 32) for _ in range(3)]
        counters = [QueryCounter(model) for _ in asks]
        got = _lanes(model, counters, asks)  # the packed request's first answer is garbage
        for ask, rows in zip(asks, got, strict=True):
            assert torch.equal(rows, local.predict(ask))  # type: ignore[arg-type]
        t = model.traffic()
        assert t["malformed"] == 1 and t["retries"] == 1, t
        assert proxy.infer_requests == 3  # probe, garbage, the packed request again
        # from now on every answer is garbage: every caller of the request gets its error
        proxy.faults = Faults(p_garbage=1.0)
        got = _lanes(model, counters, asks)
        errors = {str(g) for g in got}
        assert all(isinstance(g, ModelError) for g in got) and len(errors) == 1, got
        assert "malformed response" in errors.pop()
    finally:
        model.close()
        proxy.stop()


def _suite(path: Path) -> Path:
    return builders.write_small_suite(path, "grpc", [
        {"id": "square", "kind": "attack", "samples": 12, "params": {
            "attack": "square_linf", "epsilon": 0.03, "max_queries": 150,
            "binarization": False}, "threshold": {"metric": "robust_accuracy", "min": 0.0}}])


def test_grpc_rest_and_in_process_give_the_same_metrics(served: MLServer,
                                                         tmp_path: Path) -> None:
    import numpy as np

    from certify.api import DEMO_SEED
    from certify.demo.synthetic import generate

    suite = _suite(tmp_path / "s.yaml")
    x, y = generate(2, seed=DEMO_SEED)
    data = tmp_path / "d.npz"
    np.savez(data, x=x, y=y)
    metrics = {}
    for name, spec in (("inproc", demo_model_path("standard")), ("rest", served.url),
                       ("grpc", f"grpc://{served.grpc}/v2/models/{served.name}")):
        out = tmp_path / name
        http = () if name == "inproc" else ("--http-batch", "64", "--concurrency", "4")
        proc = builders.run_cli("run", spec, "--suite", suite, "--data", data, "--out", out,
                                "--no-pdf", "--quiet", *http)
        assert proc.returncode in (0, 1, 6, 7), proc.stdout + proc.stderr
        metrics[name] = builders.check_metrics(out)
        if name == "grpc":
            import json

            doc = json.loads((out / "results.json").read_text())
            model = doc["measurement"]["model"]
            assert model["metadata"]["protocol"] == "v2 (Open Inference Protocol) over gRPC"
            traffic = doc["provenance"]["traffic"]["model"]
            assert traffic["protocol"] == "grpc" and traffic["bytes_sent"] > 0
    assert metrics["rest"] == metrics["inproc"] and metrics["grpc"] == metrics["inproc"]
