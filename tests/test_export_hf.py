"""`certify export`: the model card loads in Hugging Face's own library (issue 18 point 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

import builders

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hf_run(model_path, npz_path, tmp_path_factory) -> Path:
    """A clean-accuracy and coverage run on data at an absolute tmp path."""
    from certify.suite import resolve_suite_path

    tmp = tmp_path_factory.mktemp("hf")
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    raw["checks"] = [c for c in raw["checks"] if c["kind"] in ("clean_accuracy", "coverage")]
    suite = tmp / "suite.yaml"
    suite.write_text(yaml.safe_dump(raw))
    out = tmp / "run"
    proc = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                            "--out", out, "--no-pdf", "--quiet")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr
    return out


def _export(run: Path, tmp_path: Path, *args: str) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    proc = builders.run_cli("export", copy, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return copy / "model-index.md"


def test_the_export_loads_with_model_card_and_eval_results(hf_run, tmp_path):
    path = _export(hf_run, tmp_path)
    card = ModelCard.load(path)  # raised "source_name ... source_url" before
    results = card.data.eval_results
    by_name = {r.metric_name: r for r in results}
    clean = by_name["Clean accuracy: clean"]
    assert clean.task_type == "image-classification" and clean.metric_type == "accuracy"
    metrics = json.loads((hf_run / "results.json").read_text())["measurement"]["checks"]
    expected = next(c for c in metrics if c["id"] == "clean")
    assert clean.metric_value == pytest.approx(expected["metrics"]["accuracy"])
    lo, hi = clean.metric_args["ci95"]
    assert lo <= clean.metric_value <= hi and clean.metric_args["verdict"] == expected["status"]
    # accuracy at a chosen coverage is not the model's accuracy: a leaderboard must not rank
    # it as such
    assert by_name["Accuracy at coverage: coverage"].metric_type == "accuracy_at_coverage"
    # the Hub's own fields are left to the Hub
    assert all(r.verified is None and r.verify_token is None for r in results)
    name, again = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == card.data.model_name and len(again) == len(results) == 2


def test_the_results_digest_survives_the_round_trip(hf_run, tmp_path):
    from certify.report.export import results_digest
    from certify.results import parse_result

    path = _export(hf_run, tmp_path)
    doc = json.loads((hf_run / "results.json").read_text())
    digest = results_digest(parse_result(doc))
    kept = ModelCard.load(path).data.to_dict()["certify"]
    assert kept["results_digest"] == digest
    assert kept["data_digest"] == doc["measurement"]["data"]["digest"]
    # and once more through the Hub's own YAML writer
    again = ModelCard(ModelCard.load(path).content)
    assert again.data.to_dict()["certify"]["results_digest"] == digest


def test_a_source_is_written_only_with_its_url(hf_run, tmp_path):
    url = "https://github.com/o/r/releases/download/v1/card.pdf"
    path = _export(hf_run, tmp_path, "--source-url", url)
    results = ModelCard.load(path).data.eval_results
    assert {r.source_url for r in results} == {url}
    assert all("sha256:" in (r.source_name or "") for r in results)
    bad = builders.run_cli("export", hf_run, "--source-url", "card.pdf")
    assert bad.returncode == 2 and "not an http(s) URL" in bad.stderr


def test_local_data_is_named_as_local_and_no_local_path_is_written(hf_run, npz_path, tmp_path):
    text = _export(hf_run, tmp_path).read_text(encoding="utf-8")
    assert str(npz_path.parent) not in text and "/tmp" not in text
    assert str(tmp_path) not in text
    dataset = ModelCard.load(tmp_path / "run" / "model-index.md").data.eval_results[0]
    # the suite is gtsrb, but nothing says the data is GTSRB: no Hub dataset id is claimed
    assert dataset.dataset_type == "local-data" and "gtsrb" not in dataset.dataset_type.lower()
    assert npz_path.name in dataset.dataset_name and "local data" in dataset.dataset_name


def test_a_named_hub_dataset_is_written_when_the_user_asserts_it(hf_run, tmp_path):
    path = _export(hf_run, tmp_path, "--dataset-id", "someone/gtsrb", "--dataset-split", "test")
    r = ModelCard.load(path).data.eval_results[0]
    assert (r.dataset_type, r.dataset_split) == ("someone/gtsrb", "test")


def test_the_demo_data_is_named_synthetic_not_gtsrb(hf_run):
    from certify.report.export import model_index
    from certify.results import parse_result

    doc = json.loads((hf_run / "results.json").read_text())
    doc["measurement"]["data"]["name"] = "synthetic-gtsrb-test.npz"
    doc["provenance"]["data_source"] = "/somewhere/card/demo-data/synthetic-gtsrb-test.npz"
    text = model_index(parse_result(doc))
    entry = yaml.safe_load(text.split("---\n")[1])["model-index"][0]["results"][0]["dataset"]
    assert entry["type"] == "certify-synthetic-traffic-signs"
    assert "synthetic" in entry["name"] and "not GTSRB" in entry["name"]
    assert "/somewhere" not in text
