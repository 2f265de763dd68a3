"""The contract every registered check keeps, checked on one small suite of every kind.

A check's records do not depend on how samples are batched or how many lanes run them; a run's
result validates against the JSON Schema and survives a parse; a finished run's records, read
back by ``--resume``, give the same measurement without a query. (The Ray executor gives the
same measurement too: tests/test_ray.py; each kind's planted defects are in its own module.)
"""

from __future__ import annotations

import json
import shutil

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
