"""Coverage, confident mistakes and suspect models (Brown et al. 2018)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import yaml

from certify.checks.confidence import Coverage
from certify.data.loaders import from_arrays
from certify.errors import exit_code_for_verdict

import builders

pytestmark = pytest.mark.e2e

CLASSES = [f"c{i}" for i in range(43)]


def _records(conf, correct, abstained=None):
    abstained = abstained or [False] * len(conf)
    return [{"confidence": c, "pred": 0 if ok else 1, "label": 0, "abstained": a, "i": i,
             "id": str(i)} for i, (c, ok, a) in enumerate(zip(conf, correct, abstained,
                                                               strict=True))]


def test_accuracy_at_80_percent_coverage_known_answer():
    # 10 samples; the 2 least confident (0.1, 0.2) are dropped, leaving 8 of which 6 correct
    conf = [0.9, 0.8, 0.1, 0.7, 0.2, 0.95, 0.6, 0.5, 0.4, 0.3]
    correct = [True, True, False, True, False, False, True, True, False, True]
    data = from_arrays(np.zeros((10, 2, 2, 3), np.uint8), np.zeros(10, np.int64),
                       [str(i) for i in range(10)], CLASSES, "t", "npz")
    m = Coverage(coverage=0.8, confidence_threshold=0.9).summarize(_records(conf, correct),
                                                                    data).metrics
    assert m["answered"] == 8
    assert m["accuracy_at_coverage"] == pytest.approx(6 / 8)
    assert m["accuracy_full_coverage"] == pytest.approx(6 / 10)
    # one confident mistake: the wrong answer at 0.95
    assert m["confident_mistakes"] == 1 and m["confident_mistake_rate"] == pytest.approx(0.1)


def test_explicit_abstentions_are_not_mistakes():
    conf = [0.9, 0.99, 0.8, 0.7]
    correct = [True, False, True, True]
    data = from_arrays(np.zeros((4, 2, 2, 3), np.uint8), np.zeros(4, np.int64),
                       [str(i) for i in range(4)], CLASSES, "t", "npz")
    recs = _records(conf, correct, abstained=[False, True, False, False])
    m = Coverage(coverage=1.0, abstain_class=42).summarize(recs, data).metrics
    assert m["explicit_abstentions"] == 1
    assert m["confident_mistakes"] == 0
    assert m["accuracy_at_coverage"] == 1.0 and m["answered"] == 3


def test_worst_case_coverage_known_answer():
    from certify.checks.confidence import worst_case_coverage

    recs = [{"confidence": c, "outcome": o} for c, o in [
        (0.99, "robust"), (0.95, "broken"), (0.2, "broken"), (0.9, "robust"), (0.3, "robust"),
        (0.8, "robust"), (0.7, "misclassified"), (0.6, "robust"), (0.5, "robust"),
        (0.1, "broken")]]
    m = worst_case_coverage(recs, lambda r: r["outcome"] == "robust")
    # keep the 8 most confident: 0.99 0.95 0.9 0.8 0.7 0.6 0.5 0.3 -> 6 right of 8
    assert m["worst_case_accuracy_at_coverage"] == pytest.approx(6 / 8)


class UninterestingDefense(torch.nn.Module):
    """Brown et al. 2018, Appendix E: Gaussian input noise, then a one-hot output."""

    def __init__(self, net: torch.nn.Module, sigma: float = 0.05) -> None:
        super().__init__()
        self.net, self.sigma = net, sigma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.net(x + self.sigma * torch.randn_like(x))
        return (logits == logits.max(dim=1, keepdim=True).values).float()


def test_uninteresting_defense_does_not_look_robust(tmp_path):
    net = builders.make_net(seed=0)
    path = tmp_path / "defense.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(UninterestingDefense(net).eval(), (torch.rand(2, 3, 32, 32),),
                          str(path), input_names=["input"], output_names=["out"], dynamo=False,
                          dynamic_axes={"input": {0: "n"}, "out": {0: "n"}}, opset_version=17)
    x = builders.make_images(30, seed=21)
    np.savez(tmp_path / "d.npz", x=x, y=builders.predict_net(net, x))
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "e", "classes": CLASSES, "checks": [
        {"id": "sanity", "kind": "sanity", "samples": 20},
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "coverage", "kind": "coverage"},
        {"id": "square", "kind": "attack", "samples": 10,
         "params": {"attack": "square_linf", "max_queries": 300,
                    "binarization": {"samples": 5, "n_inner": 99}},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}},
    ]}))
    out = tmp_path / "out"
    proc = builders.run_cli("run", path, "--suite", suite, "--data", tmp_path / "d.npz",
                            "--out", out, "--no-pdf")
    r = json.loads((out / "results.json").read_text())
    assert proc.returncode == exit_code_for_verdict(r["measurement"]["verdict"]), proc.stderr
    checks = {c["id"]: c for c in r["measurement"]["checks"]}
    sanity = " ".join(checks["sanity"]["warnings"])
    assert "randomised model" in sanity
    assert "saturated outputs" in sanity
    assert checks["sanity"]["status"] == "WARN"
    sq = checks["square"]
    assert sq["details"]["binarization"]["features"] == ["penultimate"]
    assert sq["metrics"]["binarization_tested"] > 0
    assert sq["metrics"]["binarization_score"] < 0.95
    # 10 samples: the interval rule may leave it undecided; it never passes
    assert sq["status"] in ("WARN", "FAIL", "INCONCLUSIVE")
    assert any("check sanity found the model randomised" in w for w in sq["warnings"])
    assert r["measurement"]["verdict"] != "PASS"
    html = (out / "card.html").read_text()
    assert "randomised model" in html and "too weak" in html
