"""NaN or infinite model outputs: refused at the probe (exit 3, no folder), error records later.

Planted defect: an ONNX model that answers NaN for bright images (mean pixel above a
threshold) and one that answers NaN for everything. A NaN answer must never count as a correct
or robust sample, and a check with errored samples can never PASS.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from certify.checks.base import Check, CheckContext, Measurement
from certify.engine import NON_FINITE, decide, run_batch_isolating
from certify.errors import EXIT_ERROR, EXIT_INCONCLUSIVE, NonFiniteOutput
from certify.models.base import ModelInfo, QueryCounter
from certify.suite import CheckSpec, Threshold

import builders

pytestmark = pytest.mark.e2e

CLASSES = [f"c{i}" for i in range(43)]
BRIGHT = 0.62  # dark images have a mean pixel <= 0.52 (probe images about 0.5), bright >= 0.73


@pytest.fixture(scope="module")
def nan_bright_model(net, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nan") / "nan-bright.onnx"
    return builders.export(builders.NanWhenBright(net, BRIGHT), path)


@pytest.fixture(scope="module")
def nan_everywhere_model(net, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nan") / "nan-all.onnx"
    return builders.export(builders.NanWhenBright(net, None), path)


@pytest.fixture(scope="module")
def bright_data(net, tmp_path_factory) -> tuple[Path, np.ndarray]:
    return builders.bright_and_dark_npz(net, tmp_path_factory.mktemp("nan") / "d.npz", 20, 5)


def _suite(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"name": "nan", "classes": CLASSES, "checks": [
        # min 0: the finite samples pass it, so only the errors can keep it from PASS
        {"id": "clean", "kind": "clean_accuracy", "threshold": {"metric": "accuracy",
                                                                 "min": 0.0}},
        {"id": "square", "kind": "attack", "params": {
            "attack": "square_linf", "epsilon": 0.03, "max_queries": 20,
            "binarization": False}, "threshold": {"metric": "robust_accuracy", "min": 0.0}},
    ]}))
    return path


def test_nan_everywhere_exits_3_before_the_out_folder(nan_everywhere_model, bright_data,
                                                        tmp_path):
    out = tmp_path / "never"
    proc = builders.run_cli("run", nan_everywhere_model, "--suite", _suite(tmp_path / "s.yaml"),
                            "--data", bright_data[0], "--out", out, "--no-pdf")
    assert proc.returncode == 3, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "NaN or infinite" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_nan_everywhere_over_http_exits_3(nan_everywhere_model, bright_data, tmp_path):
    from servers import OnnxHttpServer

    server = OnnxHttpServer(nan_everywhere_model)
    try:
        out = tmp_path / "never"
        proc = builders.run_cli("run", server.v2_url, "--suite", _suite(tmp_path / "s.yaml"),
                                "--data", bright_data[0], "--out", out, "--no-pdf")
    finally:
        server.stop()
    assert proc.returncode == 3, proc.stderr
    assert "NaN or infinite" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def nan_run(nan_bright_model, bright_data, tmp_path_factory) -> tuple[Path, Path]:
    """(suite, run folder) of the NaN-when-bright model, in process, batches of 8."""
    tmp = tmp_path_factory.mktemp("nanrun")
    suite = _suite(tmp / "s.yaml")
    out = tmp / "run"
    proc = builders.run_cli("run", nan_bright_model, "--suite", suite, "--data",
                            bright_data[0], "--out", out, "--no-pdf", "--batch-size", "8")
    assert proc.returncode == EXIT_INCONCLUSIVE, proc.stderr
    return suite, out


def _records(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["check"], r["i"]))


def test_nan_samples_are_errors_and_the_checks_inconclusive(nan_run, model_path, bright_data,
                                                             tmp_path):
    data, bright = bright_data
    suite, out = nan_run
    results = json.loads((out / "results.json").read_text())["measurement"]
    assert (out / "card.html").is_file()
    assert results["verdict"] == "INCONCLUSIVE"
    checks = {c["id"]: c for c in results["checks"]}
    for cid in ("clean", "square"):
        c = checks[cid]
        assert c["status"] == "INCONCLUSIVE", c
        assert c["sample_errors"] == int(bright.sum())
        assert any("NaN or infinite" in w for w in c["warnings"])
    # the metrics are computed on the finite samples only
    assert checks["square"]["metrics"]["n"] == int((~bright).sum())

    records = _records(out)
    for cid in ("clean", "square"):
        errored = {r["i"] for r in records if r["check"] == cid and r["outcome"] == "error"}
        assert errored == set(np.flatnonzero(bright).tolist())
        assert all(r["error"] == NON_FINITE for r in records
                   if r["check"] == cid and r["outcome"] == "error")

    # The same model without the defect: the same finite samples give the same records.
    ref_out = tmp_path / "ref"
    proc = builders.run_cli("run", model_path, "--suite", suite, "--data", data,
                            "--out", ref_out, "--no-pdf")
    ref = _records(ref_out)
    assert [r for r in ref if not bright[r["i"]]] == [r for r in records if not bright[r["i"]]]
    ref_doc = json.loads((ref_out / "results.json").read_text())
    statuses = {c["id"]: c["status"] for c in ref_doc["measurement"]["checks"]}
    # 20 queries are far below Square's floor: the attack row is evidence (WARN), not a PASS
    assert statuses == {"clean": "PASS", "square": "WARN"}, proc.stderr
    assert proc.returncode == 7, proc.stderr


def test_a_check_with_nothing_finite_is_an_error(nan_bright_model, bright_data, tmp_path):
    """Every sample NaN: no metric exists, so the check is an ERROR row and the card says so."""
    data, bright = bright_data
    arrays = np.load(data)
    only_bright = tmp_path / "bright.npz"
    np.savez(only_bright, x=arrays["x"][bright], y=arrays["y"][bright])
    out = tmp_path / "run"
    proc = builders.run_cli("run", nan_bright_model, "--suite", _suite(tmp_path / "s.yaml"),
                            "--data", only_bright, "--out", out, "--no-pdf")
    assert proc.returncode == EXIT_ERROR, proc.stderr
    r = json.loads((out / "results.json").read_text())["measurement"]
    assert r["verdict"] == "ERROR"
    for c in r["checks"]:
        assert c["status"] == "ERROR" and "every sample" in c["error"], c
    assert (out / "card.html").is_file()


@pytest.mark.slow
def test_ray_workers_record_the_same_errors(nan_run, nan_bright_model, bright_data, tmp_path):
    """The Ray worker isolates NaN samples through the same helper: the same records."""
    pytest.importorskip("ray")
    suite, local = nan_run
    out = tmp_path / "ray"
    proc = builders.run_cli("run", nan_bright_model, "--suite", suite, "--data",
                            bright_data[0], "--out", out, "--no-pdf", "--executor", "ray",
                            "--workers", "2", timeout=300)
    assert proc.returncode == EXIT_INCONCLUSIVE, proc.stderr
    assert json.loads((out / "results.json").read_text())["measurement"]["verdict"] == \
        "INCONCLUSIVE"

    def same(r: dict[str, Any]) -> dict[str, Any]:
        # an error row carries a share of its failed batch attempt's queries: batching differs
        return {k: v for k, v in r.items() if r["outcome"] != "error"
                or k not in ("queries", "batch_queries")}

    assert [same(r) for r in _records(out)] == [same(r) for r in _records(local)]


# -- the rerun inside one batch -----------------------------------------------------------------
class _Bright:
    """A torch model that answers NaN when an image's mean pixel is above 0.6."""

    info = ModelInfo(name="bright", identity="test", input_shape=(1, 2, 2), num_classes=2,
                     output="logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.stack([x.flatten(1).mean(1), 1 - x.flatten(1).mean(1)], dim=1)
        out[x.flatten(1).mean(1) > 0.6] = math.nan
        return out


class _TwoLooks(Check):
    """Queries the batch, then the batch brightened by 0.2: NaN appears mid-check."""

    kind = "two_looks"

    def run_batch(self, model: Any, x: torch.Tensor, y: torch.Tensor, index: Sequence[int],
                  ctx: CheckContext) -> list[dict[str, Any]]:
        a = model.predict(x).argmax(1)
        b = model.predict(x + 0.2).argmax(1)
        return [{"outcome": "same" if int(p) == int(q) else "changed", "queries": 2}
                for p, q in zip(a.tolist(), b.tolist(), strict=True)]

    def summarize(self, records: list[dict[str, Any]], data: Any) -> Measurement:
        return Measurement(metrics={})


def test_mid_check_nan_isolates_the_sample_and_keeps_queries_exact():
    means = torch.tensor([0.1, 0.5, 0.2, 0.7, 0.15])  # 0.5 + 0.2 and 0.7 go NaN
    x = means.view(5, 1, 1, 1).expand(5, 1, 2, 2).contiguous()
    counter = QueryCounter(_Bright())
    ctx = CheckContext(check_seed=0, device=torch.device("cpu"), class_names=["a", "b"])
    rows = run_batch_isolating(_TwoLooks(), counter, x, torch.zeros(5, dtype=torch.long),
                               [10, 11, 12, 13, 14], ctx)
    assert [r["outcome"] for r in rows] == ["same", "error", "same", "error", "same"]
    assert all(r["error"] == NON_FINITE for r in rows if r["outcome"] == "error")
    # every query the model saw is claimed by some record, the failed batch attempt included
    assert sum(r["queries"] for r in rows) == counter.queries
    assert counter.queries > 5 * 2
    assert all(r["queries"] == 2 for r in rows if r["outcome"] != "error")


def test_counter_raises_on_non_finite_after_counting():
    counter = QueryCounter(_Bright())
    x = torch.full((3, 1, 2, 2), 0.9)
    with pytest.raises(NonFiniteOutput):
        counter.predict(x)
    assert counter.queries == 3
    assert torch.isfinite(counter.predict(torch.full((2, 1, 2, 2), 0.1))).all()


@pytest.mark.parametrize(("value", "errors", "warned", "status"), [
    (0.95, 0, False, "PASS"),
    (0.95, 0, True, "WARN"),
    (0.95, 2, False, "INCONCLUSIVE"),  # passing on fewer samples than asked: not a PASS
    (0.10, 2, False, "FAIL"),
    (math.nan, 0, False, "INCONCLUSIVE"),
    (math.inf, 0, False, "INCONCLUSIVE"),
])
def test_threshold_status(value, errors, warned, status):
    spec = CheckSpec("clean", "clean_accuracy", None, Threshold("accuracy", min=0.9))  # type: ignore[arg-type]
    got, rule = decide(spec, {"accuracy": value}, ["w"] if warned else [], errors)
    assert got == status
    assert "accuracy" in rule  # the decision names the rule that made it
