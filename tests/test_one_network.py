"""Issue 62 point 1: one network gets one card, whatever file it comes in.

The same small network (the session's seeded CNN) as ONNX from both exporters at batch 1 (the
legacy TorchScript-based one and the default dynamo one), as a ``.pt2`` from
``torch.export``, as ``torch.jit.trace`` TorchScript and as a module in memory: one
``square_linf`` row with its binarization test on a few samples (fixed seed) gives the same
feature source (the penultimate features: the input of the last linear layer), the same
binarization score and the same status in every format, and ``certify compare`` of the ONNX
card with each other card says NO CHANGE. The binarization test names itself on the progress
display as it runs ("binarization test, k of n").
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

import certify
from certify.progress import NullProgress

import builders

pytestmark = pytest.mark.e2e

SAMPLES = 6
BT_SAMPLES = 2


@pytest.fixture(scope="module")
def one_attack_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("one-network") / "suite.yaml"
    path.write_text(yaml.safe_dump({
        "name": "one-network", "classes": [f"c{i}" for i in range(43)], "seed": 11,
        "checks": [{"id": "square_linf", "kind": "attack", "samples": SAMPLES,
                    "params": {"attack": "square_linf", "epsilon": 0.004,
                               "max_queries": 200,
                               "binarization": {"samples": BT_SAMPLES}},
                    "threshold": {"metric": "robust_accuracy", "min": 0.5}}]}))
    return path


@pytest.fixture(scope="module")
def own_answers(net: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 images labelled with the network's own answers: every sample is attacked."""
    x = builders.make_images(24, seed=62)
    path = tmp_path_factory.mktemp("one-network-data") / "own.npz"
    np.savez(path, x=x, y=builders.predict_net(net, x))
    return path


@pytest.fixture(scope="module")
def formats(net: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    """The network in every form a team brings it in (all at batch 1, as exported)."""
    folder = tmp_path_factory.mktemp("formats")
    x = torch.rand(1, 3, 32, 32)
    out: dict[str, Any] = {"onnx-legacy": builders.export(net, folder / "legacy.onnx",
                                                          fixed_batch=True)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' own deprecation and info warnings
        torch.onnx.export(net, (x,), str(folder / "dynamo.onnx"), dynamo=True)
        torch.export.save(torch.export.export(net, (x,)), str(folder / "net.pt2"))
        torch.jit.save(torch.jit.trace(net, x), str(folder / "traced.pt"))
    out["onnx-dynamo"] = folder / "dynamo.onnx"
    out["pt2"] = folder / "net.pt2"
    out["traced"] = folder / "traced.pt"
    out["memory"] = net
    return out


class _Steps(NullProgress):
    """A progress reporter that keeps every step the run names (and shows nothing else)."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, text: str) -> None:  # noqa: D102
        self.steps.append(text)


@pytest.fixture(scope="module")
def cards(formats: dict[str, Any], one_attack_suite: Path, own_answers: Path,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """Each format's card folder and the progress steps its run named."""
    folder = tmp_path_factory.mktemp("cards")
    out = {}
    for name, model in formats.items():
        steps = _Steps()
        certify.evaluate(model if name == "memory" else str(model), str(own_answers),
                         suite=str(one_attack_suite), out=folder / name, progress=steps,
                         pdf=False, input_size=(32, 32) if name == "memory" else None)
        out[name] = (folder / name, steps.steps)
    return out


def _row(card: Path) -> dict[str, Any]:
    doc = json.loads((card / "results.json").read_text())
    return next(c for c in doc["measurement"]["checks"] if c["id"] == "square_linf")


def test_every_format_gives_the_same_binarization_row(cards):
    seen = {}
    for name, (card, _) in cards.items():
        row = _row(card)
        bt = row["details"]["binarization"]
        seen[name] = (tuple(bt["features"]), row["metrics"]["binarization_score"],
                      row["status"], row["metrics"]["robust_accuracy"])
    assert len(set(seen.values())) == 1, seen
    features, score, status, robust = next(iter(seen.values()))
    assert features == ("penultimate",), seen
    row = _row(cards["onnx-legacy"][0])
    assert row["metrics"]["n_broken"] + row["metrics"]["n_robust"] == SAMPLES, row["metrics"]
    assert row["metrics"]["binarization_tested"] == BT_SAMPLES


def test_the_binarization_test_names_itself_on_the_progress_display(cards):
    for name, (_, steps) in cards.items():
        bt = [s for s in steps if s.startswith("binarization test")]
        assert bt == [f"binarization test, {k} of {BT_SAMPLES}"
                      for k in range(1, BT_SAMPLES + 1)], (name, steps)


@pytest.mark.parametrize("other", ["onnx-dynamo", "pt2", "traced", "memory"])
def test_compare_of_the_onnx_card_with_each_format_says_no_change(cards, other):
    proc = builders.run_cli("compare", cards["onnx-legacy"][0], cards[other][0])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NO CHANGE" in proc.stdout, proc.stdout


def test_the_plan_bounds_the_queries_its_binarization_test_spends(formats, one_attack_suite,
                                                                   own_answers, tmp_path):
    """Issue 62: the plan left the binarization test out, so its "at most" was below what a
    run spent. Now the logged bound holds the test's queries, and the run stays within it."""
    out = tmp_path / "run"
    proc = builders.run_cli("run", formats["onnx-legacy"], "--suite", one_attack_suite,
                            "--data", own_answers, "--out", out, "--no-pdf")
    assert proc.returncode in (0, 1, 6, 7), proc.stderr
    text = " ".join(proc.stderr.split())
    line = text.split("query plan: square_linf at most ", 1)[1]
    per, rest = line.split(" queries per sample x ", 1)
    n = int(rest.split(" samples", 1)[0])
    bt = int(rest.split("binarization test at most ", 1)[1].split(" queries", 1)[0]
             .replace(",", ""))
    assert "The checks' own work (transforms, attack steps) comes on top" in text
    total = json.loads((out / "results.json").read_text())["measurement"]["queries"]["total"]
    attack_alone = int(per.replace(",", "")) * n
    assert total <= attack_alone + bt, (total, attack_alone, bt)
    assert total > attack_alone, "the old bound (the attack alone) held: not a test of it"
