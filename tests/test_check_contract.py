"""The contract every registered check keeps, checked on one small suite of every kind.

A check's records do not depend on how samples are batched or how many lanes run them; a run's
result validates against the JSON Schema and survives a parse; a finished run's records, read
back by ``--resume``, give the same measurement without a query. (The Ray executor gives the
same measurement too: tests/test_ray.py.) And a defect planted in every kind at once (records
that under-report the model's queries; a metric the kind does not declare) makes each check an
ERROR row that names it, never a result. Each kind's own planted defects (a starved attack, a
randomised model, ...) are in its own module.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
import yaml

from certify.canonical import canonical_json
from certify.checks import CHECKS
from certify.results import json_schema, parse_result

import builders

pytestmark = pytest.mark.e2e


def test_the_contract_suite_has_every_registered_check_kind(demo_small_suite):
    kinds = {c["kind"] for c in yaml.safe_load(demo_small_suite.read_text())["checks"]}
    assert kinds == set(CHECKS)


def test_records_do_not_depend_on_batch_size_or_lanes(demo_small_suite, demo_small_run,
                                                      tmp_path, monkeypatch):
    """Batches of 5 samples on one lane give the default run's measurement (256, device lanes)
    byte for byte."""
    from certify import api
    from certify.engine import run as engine_run

    monkeypatch.setattr(engine_run, "local_lanes", lambda model, device: 1)
    out = tmp_path / "b5"
    api.run_demo(out, pdf=False, suite=str(demo_small_suite), batch_size=5)
    assert builders.measurement(out) == builders.measurement(demo_small_run)


def test_results_validate_against_the_schema_and_round_trip(demo_small_run):
    import jsonschema

    doc = json.loads((demo_small_run / "results.json").read_text())
    jsonschema.validate(doc, json_schema())
    again = json.loads(parse_result(doc).model_dump_json())
    assert canonical_json(again["measurement"]) == canonical_json(doc["measurement"])
    assert {c["kind"] for c in doc["measurement"]["checks"]} == set(CHECKS)
    assert all(c["status"] != "ERROR" for c in doc["measurement"]["checks"])


def test_resuming_a_finished_run_reads_its_records_back(demo_small_suite, demo_small_run,
                                                        tmp_path):
    out = tmp_path / "again"
    shutil.copytree(demo_small_run, out)
    proc = builders.run_cli("demo", "--suite", demo_small_suite, "--no-pdf", "--out", out,
                            "--resume")
    assert proc.returncode == 0, proc.stderr
    assert builders.measurement(out) == builders.measurement(demo_small_run)
    prov = json.loads((out / "results.json").read_text())["provenance"]
    assert prov["timings"]["resumed_records"] > 0


def _plant_in_every_kind(monkeypatch, defect: str) -> None:
    """Wrap every registered check kind so that it has ``defect``."""
    for cls in set(CHECKS.values()):
        if defect == "under_reports_queries":
            def run_batch(self, *args: Any, _run=cls.run_batch, **kw: Any) -> list:
                rows = _run(self, *args, **kw)
                rows[0]["queries"] = int(rows[0].get("queries", 0)) - 1  # one query unclaimed
                return rows
            monkeypatch.setattr(cls, "run_batch", run_batch)
        else:
            def summarize(self, *args: Any, _summarize=cls.summarize, **kw: Any) -> Any:
                m = _summarize(self, *args, **kw)
                m.metrics["planted_undeclared"] = 0.5
                return m
            monkeypatch.setattr(cls, "summarize", summarize)


@pytest.mark.parametrize("defect, says", [
    ("under_reports_queries", "queries but the models saw"),
    ("undeclared_metric", "planted_undeclared"),
])
def test_a_defect_planted_in_every_check_kind_makes_each_an_error(defect, says,
                                                                  demo_small_suite, tmp_path,
                                                                  monkeypatch):
    from certify import api

    _plant_in_every_kind(monkeypatch, defect)
    out = tmp_path / defect
    api.run_demo(out, pdf=False, suite=str(demo_small_suite))
    checks = json.loads((out / "results.json").read_text())["measurement"]["checks"]
    assert (out / "card.html").exists()  # a card that says so, not a crash
    assert {c["kind"] for c in checks} == set(CHECKS)
    for c in checks:
        assert c["status"] == "ERROR" and c["metrics"] is None, (c["id"], c["status"])
        assert says in c["error"], (c["id"], c["error"])
