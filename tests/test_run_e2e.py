"""`certify run` end to end on ONNX models and GTSRB-layout folders built by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import builders

pytestmark = pytest.mark.e2e


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _accuracy(out: Path) -> float:
    return _results(out)["measurement"]["checks"][0]["metrics"]["accuracy"]


@pytest.mark.parametrize("layout", ["official", "csv"])
def test_clean_accuracy_matches_bare_onnxruntime(clean_suite, layout, model_path, official_dir,
                                                 csv_dir, dataset_arrays, tmp_path):
    x, y = dataset_arrays
    data = official_dir if layout == "official" else csv_dir
    out = tmp_path / "run"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", data, "--out", out)
    expected = builders.reference_accuracy(model_path, x, y, nhwc=False, scale255=False)
    # the suite threshold is 0.9 and the labels are 30% wrong by construction: exit 1 (FAIL)
    assert proc.returncode == 1, proc.stderr
    assert _accuracy(out) == pytest.approx(expected, abs=1e-9)
    r = _results(out)
    assert r["measurement"]["data"]["layout"] == f"gtsrb-{layout}"
    assert r["measurement"]["data"]["n"] == len(y)
    assert r["measurement"]["model"]["identity"].startswith("sha256:")
    assert r["measurement"]["checks"][0]["status"] == "FAIL"
    for name in ("results.json", "card.html", "card.pdf", "records.jsonl"):
        assert (out / name).stat().st_size > 0
    assert (out / "card.pdf").read_bytes().startswith(b"%PDF")


def test_nhwc_255_probs_fixed_batch_model(clean_suite, net, dataset_arrays, csv_dir, tmp_path):
    x, y = dataset_arrays
    model = builders.export(net, tmp_path / "conv.onnx", nhwc=True, fixed_batch=True,
                            probs=True, scale255=True)
    out = tmp_path / "run"
    proc = builders.run_cli("run", model, "--suite", clean_suite, "--data", csv_dir, "--out", out,
                            "--input-scale", "255", "--no-pdf")
    assert proc.returncode == 1, proc.stderr
    expected = builders.reference_accuracy(model, x, y, nhwc=True, scale255=True)
    assert _accuracy(out) == pytest.approx(expected, abs=1e-9)
    info = _results(out)["measurement"]["model"]
    assert info["layout"] == "NHWC"
    assert info["output"] == "probs"
    assert info["batch"].startswith("symbolic")
    # the same network under every convention gives the same accuracy as plain NCHW logits
    plain = builders.reference_accuracy(
        builders.export(net, tmp_path / "plain.onnx"), x, y, nhwc=False, scale255=False)
    assert expected == pytest.approx(plain)


def test_fixed_batch_graph_that_cannot_be_rewritten_is_chunked(clean_suite, dataset_arrays,
                                                               npz_path, tmp_path):
    """A graph fixed at batch 1 whose answer depends on the whole input tensor (legal at batch
    1): certify's clean accuracy is onnxruntime's one image at a time (issue 49), and the card
    says why the batch stayed fixed."""
    x, y = dataset_arrays
    net = builders.WholeInput(builders.make_net(seed=0)).eval()
    model = builders.export(net, tmp_path / "fixed.onnx", fixed_batch=True)
    out = tmp_path / "run"
    proc = builders.run_cli("run", model, "--suite", clean_suite, "--data", npz_path, "--out", out,
                            "--no-pdf", "--batch-size", "64")
    assert proc.returncode == 1, proc.stderr
    r = _results(out)
    assert r["measurement"]["model"]["batch"] == "fixed 1 (chunked)"
    assert "reduces over every axis, the batch included" in \
        r["measurement"]["model"]["metadata"]["batching"]
    expected = builders.reference_accuracy(model, x, y, nhwc=False, scale255=False)
    assert _accuracy(out) == pytest.approx(expected, abs=1e-9)


def test_a_batch_fixed_by_a_reshape_is_proven_and_batched(clean_suite, dataset_arrays,
                                                          npz_path, tmp_path):
    """``view(1, -1)`` at batch 1 writes a Reshape to ``[1, -1]``: rewritten to copy the batch,
    proven by shape inference, and the same accuracy as one image at a time."""
    x, y = dataset_arrays
    model = builders.export(builders.make_net(seed=0, reshape_fixed=True),
                            tmp_path / "fixed.onnx", fixed_batch=True)
    out = tmp_path / "run"
    proc = builders.run_cli("run", model, "--suite", clean_suite, "--data", npz_path, "--out", out,
                            "--no-pdf", "--batch-size", "64")
    assert proc.returncode == 1, proc.stderr
    model_doc = _results(out)["measurement"]["model"]
    assert model_doc["batch"] == "symbolic (rewritten from fixed 1)"
    assert "shape inference" in model_doc["metadata"]["batching"]
    expected = builders.reference_accuracy(model, x, y, nhwc=False, scale255=False)
    assert _accuracy(out) == pytest.approx(expected, abs=1e-9)


def test_image_folder_layout_and_samples(clean_suite, model_path, dataset_arrays, tmp_path):
    from PIL import Image

    x, y = dataset_arrays
    root = tmp_path / "folder"
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        d = root / f"{label:05d}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(d / f"{i}.png")
    out = tmp_path / "run"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", root, "--out", out,
                            "--no-pdf", "--samples", "50")
    assert proc.returncode == 1, proc.stderr
    r = _results(out)
    assert r["measurement"]["data"]["layout"] == "folder"
    assert r["measurement"]["data"]["n"] == 50
    # stratified: no class has more than one sample more than any other class that had spare
    counts = np.array(r["measurement"]["data"]["per_class_counts"])
    avail = np.bincount(y, minlength=43)
    assert counts.sum() == 50
    assert np.all(counts <= avail)
    assert counts[avail > 0].max() - counts[avail >= counts.max()].min() <= 1


def test_passing_run_exits_zero(clean_suite, net, tmp_path):
    x = builders.make_images(86, seed=9)
    y = builders.predict_net(net, x)  # labels the model gets right
    np.savez(tmp_path / "d.npz", x=x, y=y)
    model = builders.export(net, tmp_path / "m.onnx")
    proc = builders.run_cli("run", model, "--suite", clean_suite, "--data", tmp_path / "d.npz",
                            "--out", tmp_path / "run", "--no-pdf")
    assert proc.returncode == 0, proc.stderr
    assert _accuracy(tmp_path / "run") == 1.0
    assert "verdict: PASS" in proc.stdout


def test_same_inputs_give_same_metrics(clean_suite, model_path, official_dir, tmp_path):
    runs = {"a": "7", "b": "7", "other": "8"}
    for name, seed in runs.items():
        proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data",
                                official_dir, "--out", tmp_path / name, "--no-pdf",
                                "--samples", "60", "--seed", seed)
        assert proc.returncode == 1, proc.stderr  # 30% wrong labels: the 0.9 threshold fails
    a, b, other = (_results(tmp_path / name) for name in runs)
    ca, cb = a["measurement"]["checks"][0], b["measurement"]["checks"][0]
    assert ca["status"] == cb["status"] == "FAIL"
    assert a["measurement"]["checks"][0]["metrics"]["n"] == 60
    assert a["measurement"]["checks"][0]["metrics"] == b["measurement"]["checks"][0]["metrics"]
    # the whole signed measurement is byte-identical for the same inputs
    assert builders.measurement(tmp_path / "a") == builders.measurement(tmp_path / "b")
    assert a["measurement"]["data"]["digest"] == b["measurement"]["data"]["digest"]
    # the seed draws the subset: another seed is another subset (so equality above means
    # something), and the records name the same samples only for the same seed
    assert other["measurement"]["data"]["digest"] != a["measurement"]["data"]["digest"]

    def ids(name: str) -> list[str]:
        rows = (tmp_path / name / "records.jsonl").read_text().splitlines()
        return sorted(json.loads(r)["id"] for r in rows)

    assert ids("a") == ids("b") != ids("other")


def test_outcome_bitmaps_match_the_records(clean_suite, model_path, npz_path, tmp_path):
    """The measurement's packed per-sample outcomes say what the records say."""
    from certify.results import unpack_bits

    out = tmp_path / "run"
    proc = builders.run_cli("run", model_path, "--suite", clean_suite, "--data", npz_path,
                            "--out", out, "--no-pdf", "--samples", "60")
    assert proc.returncode == 1, proc.stderr  # 30% wrong labels: the 0.9 threshold fails
    outcomes = _results(out)["measurement"]["checks"][0]["outcomes"]
    n = outcomes["n"]
    rows = [json.loads(r) for r in (out / "records.jsonl").read_text().splitlines()]
    correct = {r["i"] for r in rows if r["outcome"] == "correct"}
    assert set(np.flatnonzero(unpack_bits(outcomes["selected"], n))) == {r["i"] for r in rows}
    assert set(np.flatnonzero(unpack_bits(outcomes["bits"]["correct"], n))) == correct
    assert 0 < len(correct) < len(rows)


def test_samples_all_lifts_every_limit_and_changes_the_suite_digest(model_path, npz_path,
                                                                     dataset_arrays, tmp_path):
    """``--samples all``: the data's and every check's ``samples`` are lifted (an attack then
    runs on every correctly classified sample), and the card's suite digest says so."""
    suite = builders.write_small_suite(tmp_path / "s.yaml", "limited", extra=[
        {"id": "rand", "kind": "attack", "samples": 5,
         "params": {"attack": "random", "epsilon": 0.03, "max_queries": 4,
                    "binarization": False}}])
    raw = suite.read_text().replace("checks:", "data: {samples: 30}\nchecks:", 1)
    suite.write_text(raw)
    runs = {}
    for arg in ("all", None):
        out = tmp_path / f"run-{arg}"
        extra = ("--samples", arg) if arg else ()
        proc = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                                "--out", out, "--no-pdf", *extra)
        assert (out / "results.json").exists(), proc.stderr  # a verdict, whichever it is
        runs[arg] = _results(out)["measurement"]
        assert all(c["status"] != "ERROR" for c in runs[arg]["checks"])
    n = len(dataset_arrays[1])
    assert runs["all"]["data"]["n"] == n and runs[None]["data"]["n"] == 30
    rand = {k: next(c for c in m["checks"] if c["id"] == "rand") for k, m in runs.items()}
    assert rand["all"]["metrics"]["n"] == n and rand[None]["metrics"]["n"] == 5
    assert runs["all"]["suite"]["digest"] != runs[None]["suite"]["digest"]
    bad = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                           "--out", tmp_path / "bad", "--samples", "most")
    assert bad.returncode == 2 and "neither a whole number nor all" in bad.stderr


def test_a_time_budget_chooses_the_attacks_samples_states_it_and_resumes_with_them(
        model_path, npz_path, dataset_arrays, tmp_path):
    """``--time-budget``: the plan is priced before the first query, every attack check gets
    the same number of samples that fits (here the whole data: a generous budget), the rows
    and the card say so, a resumed run keeps the choice, and a budget too small is refused."""
    suite = builders.write_small_suite(tmp_path / "s.yaml", "budgeted", extra=[
        {"id": "rand", "kind": "attack", "samples": 5,
         "params": {"attack": "random", "epsilon": 0.03, "max_queries": 4,
                    "binarization": False}}])
    out = tmp_path / "run"
    first = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path, "--out",
                             out, "--no-pdf", "--time-budget", "10m")
    plan = [line for line in first.stderr.splitlines() if "query plan: rand" in line]
    assert plan and "queries per sample x" in plan[0] and ", model time at most " in plan[0], \
        first.stderr
    m = _results(out)["measurement"]
    rand = next(c for c in m["checks"] if c["id"] == "rand")
    n = len(dataset_arrays[1])
    assert rand["metrics"]["n"] == n
    assert rand["details"]["time_budget"]["samples"] == n
    assert rand["details"]["time_budget"]["seconds"] == 600
    assert "Samples chosen by a time budget of 600 s" in (out / "card.html").read_text()
    again = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                             "--out", out, "--no-pdf", "--time-budget", "10m", "--resume")
    assert (out / "results.json").exists(), again.stderr
    assert "cannot resume" not in again.stderr
    small = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                             "--out", tmp_path / "small", "--time-budget", "0.001s")
    assert small.returncode == 2 and "raise --time-budget to about" in small.stderr
    assert not (tmp_path / "small").exists()  # refused before the run folder is made
    bad = builders.run_cli("run", model_path, "--suite", suite, "--data", npz_path,
                           "--out", tmp_path / "bad", "--time-budget", "soon")
    assert bad.returncode == 2 and "is not a duration" in bad.stderr
