"""The certified check through the engine (issue 64): the floor under each threat model's row.

One suite on the IBP-trained demo fixture (``certify/demo/certified.onnx``): clean accuracy,
APGD at L∞ 2/255 and L2 0.1, and a certified check of each threat model. The same network as a
``torch.export`` program must give the ONNX card's certified figures, sample by sample; a model
without a graph certify can bound is SKIPPED with the reason; a sample certified and broken at
once stops the run (exit 70) with both records.
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
from torch import nn

from certify.api import DEMO_PER_CLASS, DEMO_SEED
from certify.demo.synthetic import generate

from builders import CLASSES, run_cli
from pgd_oracle import oracle_net

pytestmark = pytest.mark.unit

DEMO = Path(__file__).resolve().parents[1] / "certify" / "demo"
SAMPLES = 40
#: CROWN at L2 costs about 1.6 s per sample here (IBP's enclosing box proves none of them)
L2_SAMPLES = 12
#: certified.onnx's figures here, measured at 335cae4: L∞ 2/255 17 of 40 signs by IBP → CROWN
#: (16 by IBP alone; APGD left 19), L2 0.1 4 of 12 (none by IBP); the test's floor is each
#: minus a margin of about two samples
MEASURED = {"cert_linf": 17 / 40, "cert_l2": 4 / 12}
MARGIN = {"cert_linf": 2 / 40, "cert_l2": 1 / 12}


def _suite(path: Path, extra: list[dict[str, Any]] | None = None) -> Path:
    eps = 2 / 255
    checks = [
        {"id": "clean", "kind": "clean_accuracy", "threshold": {"metric": "accuracy", "min": 0}},
        {"id": "apgd_linf", "kind": "attack", "samples": SAMPLES,
         "params": {"attack": "apgd_ce", "norm": "linf", "epsilon": eps, "eps_sweep": False},
         "threshold": {"metric": "robust_accuracy", "min": 0.2}},
        {"id": "cert_linf", "kind": "certified", "samples": SAMPLES,
         "params": {"norm": "linf", "epsilon": eps, "methods": ["ibp", "crown"]}},
        {"id": "apgd_l2", "kind": "attack", "samples": SAMPLES,
         "params": {"attack": "apgd_ce", "norm": "l2", "epsilon": 0.1, "eps_sweep": False},
         "threshold": {"metric": "robust_accuracy", "min": 0.95}},
        {"id": "cert_l2", "kind": "certified", "samples": L2_SAMPLES,
         "params": {"norm": "l2", "epsilon": 0.1, "methods": ["ibp", "crown"]},
         "threshold": {"metric": "certified_accuracy", "min": 0.1}},
        *(extra or []),
    ]
    path.write_text(yaml.safe_dump({"name": "certified", "classes": CLASSES, "seed": 0,
                                    "checks": checks}))
    return path


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("certified")
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)
    np.savez(root / "signs.npz", x=x, y=y)
    module = oracle_net(DEMO / "certified.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(module, (torch.rand(1, 3, 32, 32),)),
                          str(root / "certified.pt2"))
    return {"root": root, "data": root / "signs.npz", "suite": _suite(root / "suite.yaml"),
            "pt2": root / "certified.pt2"}


def _run(setting: dict[str, Path], model: Path | str, name: str, *extra: str,
         suite: Path | None = None, code: int | None = None) -> dict[str, Any]:
    out = setting["root"] / name
    proc = run_cli("run", model, "--suite", suite or setting["suite"], "--data",
                   setting["data"], "--out", out, "--no-pdf", "-q", *extra)
    if code is not None:
        assert proc.returncode == code, proc.stdout + proc.stderr
        return {"proc": proc}
    assert proc.returncode in (0, 1, 6, 7), proc.stdout + proc.stderr
    r = json.loads((out / "results.json").read_text())["measurement"]
    return {"out": out, "checks": {c["id"]: c for c in r["checks"]},
            "rows": {(w["norm"], round(w["epsilon"], 6)): w for w in r["attack_worst_case"]}}


@pytest.fixture(scope="module")
def onnx_run(setting: dict[str, Path]) -> dict[str, Any]:
    return _run(setting, DEMO / "certified.onnx", "onnx")


def test_the_floor_is_informative_and_below_the_attacked_figure(onnx_run: dict[str, Any]
                                                                  ) -> None:
    checks, rows = onnx_run["checks"], onnx_run["rows"]
    for cid, key in (("cert_linf", ("linf", round(2 / 255, 6))), ("cert_l2", ("l2", 0.1))):
        c = checks[cid]
        share = c["metrics"]["certified_accuracy"]
        assert share >= MEASURED[cid] - MARGIN[cid], (cid, share)
        m = c["metrics"]
        assert m["n_certified_ibp"] <= m["n_certified_crown"] == m["n_certified"]
        row = rows[key]
        floor = row["certified"]
        # over the row's samples: those the certified check did not evaluate are not certified
        assert floor["check"] == cid and floor["n"] == row["n"]
        assert floor["n_unevaluated"] == row["n"] - c["metrics"]["n"]
        assert floor["n_certified"] == m["n_certified"]
        # certified ≤ attacked, sample by sample (a certified sample no attack broke)
        assert floor["share"] <= row["robust_accuracy"]
        lo, hi = floor["interval"]
        assert lo <= floor["share"] <= hi
    linf = rows[("linf", round(2 / 255, 6))]
    assert linf["status"] == "PASS" and linf["decided_by"]["rule"] == "certified_within"
    assert "decided by proof" in linf["decision"]
    l2 = rows[("l2", 0.1)]  # 95% is beyond both figures: the attacks decide, not a proof
    assert l2["decided_by"]["rule"] != "certified_within" and "does not prove it" in \
        l2["decision"]
    html = (onnx_run["out"] / "card.html").read_text()
    assert "Certified robustness (bound propagation)" in html
    assert "Certified (proved)" in html


def test_the_exported_program_gives_the_onnx_cards_certified_figures(
        setting: dict[str, Path], onnx_run: dict[str, Any]) -> None:
    pt2 = _run(setting, setting["pt2"], "pt2")
    for cid in ("cert_linf", "cert_l2"):
        a, b = onnx_run["checks"][cid], pt2["checks"][cid]
        assert a["metrics"] == b["metrics"], cid
        assert a["outcomes"] == b["outcomes"], cid
    for key, row in onnx_run["rows"].items():
        assert pt2["rows"][key]["certified"] == row["certified"]


def test_compare_gates_on_the_certified_share(setting: dict[str, Path],
                                              onnx_run: dict[str, Any]) -> None:
    suite = setting["root"] / "cert-only.yaml"
    raw = yaml.safe_load(setting["suite"].read_text())
    raw["checks"] = [c for c in raw["checks"] if c["kind"] != "attack"]
    for c in raw["checks"]:  # IBP only: CROWN takes minutes per sample on the standard CNN
        c.get("params", {}).update(methods=["ibp"])
        if c["id"] == "cert_linf":  # a row gates where it has a threshold
            c["threshold"] = {"metric": "certified_accuracy", "min": 0.0}
    suite.write_text(yaml.safe_dump(raw))
    old = _run(setting, DEMO / "certified.onnx", "old", suite=suite)
    new = _run(setting, DEMO / "standard.onnx", "new", suite=suite)
    assert new["checks"]["cert_linf"]["metrics"]["certified_accuracy"] < \
        old["checks"]["cert_linf"]["metrics"]["certified_accuracy"]
    report_path = setting["root"] / "compare.json"
    proc = run_cli("compare", old["out"] / "results.json", new["out"] / "results.json",
                   "--json", report_path)
    rows = {r["id"]: r for r in json.loads(report_path.read_text())["checks"]}
    row = rows["cert_linf"]
    assert row["metric"] == "certified_accuracy" and row["paired"]
    assert row["outcome"] == "regression" and row["blocks"], row
    assert proc.returncode == 1, proc.stdout


def test_a_model_without_a_graph_to_bound_is_skipped_with_the_reason(
        setting: dict[str, Path], tmp_path: Path) -> None:
    class Squashed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = oracle_net(DEMO / "certified.onnx")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.net(x)) * 10

    model = tmp_path / "squashed.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Squashed().eval(), (torch.rand(1, 3, 32, 32),), str(model),
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}}, dynamo=False)
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "s", "classes": CLASSES, "preprocessing": {"input_size": [32, 32]}, "checks": [
        {"id": "clean", "kind": "clean_accuracy"},
        {"id": "cert", "kind": "certified", "samples": 4, "params": {"methods": ["ibp"]}}]}))
    r = _run(setting, model, "squashed", suite=suite)
    cert = r["checks"]["cert"]
    assert cert["status"] == "SKIPPED"
    assert "certified: not available (operator Sigmoid)" in cert["decision"]
    script = tmp_path / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(oracle_net(DEMO / "certified.onnx")), str(script))
    r = _run(setting, script, "script", suite=suite)
    assert r["checks"]["cert"]["status"] == "SKIPPED"
    assert "certified: not available (format)" in r["checks"]["cert"]["decision"]


def test_a_sample_certified_and_broken_stops_the_run(setting: dict[str, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: bounds that prove every sample at 16/255, where APGD breaks many."""
    from certify.checks.certified import Certified

    def wrong(self: Certified, graph: Any, x: torch.Tensor, y: torch.Tensor, tm: Any,
              stage: tuple[str, ...], *args: Any) -> list[dict[str, float]]:
        return [{m: 1e9 for m in stage} for _ in range(len(x))]

    monkeypatch.setattr(Certified, "_bound", wrong)
    suite = setting["root"] / "planted.yaml"
    suite.write_text(yaml.safe_dump({"name": "planted", "classes": CLASSES, "checks": [
        {"id": "apgd", "kind": "attack", "samples": 12,
         "params": {"attack": "apgd_ce", "norm": "linf", "epsilon": 16 / 255,
                    "eps_sweep": False, "binarization": False}},
        {"id": "cert", "kind": "certified", "samples": 12,
         "params": {"norm": "linf", "epsilon": 16 / 255, "methods": ["ibp"]}}]}))
    proc = _run(setting, DEMO / "certified.onnx", "planted", suite=suite, code=70)["proc"]
    said = proc.stderr + proc.stdout
    assert "CertifiedButBroken" in said and "certified robust by cert" in said
    assert "broken by apgd" in said and "certified record" in said and "attack record" in said
    assert not (setting["root"] / "planted" / "card.html").exists()


def test_the_time_budget_never_certifies(setting: dict[str, Path]) -> None:
    suite = setting["root"] / "budget.yaml"
    suite.write_text(yaml.safe_dump({"name": "budget", "classes": CLASSES, "checks": [
        {"id": "cert", "kind": "certified", "samples": 12,
         "params": {"epsilon": 2 / 255, "seconds_per_sample": 1e-9}}]}))
    r = _run(setting, DEMO / "certified.onnx", "budget", suite=suite)
    m = r["checks"]["cert"]["metrics"]
    assert m["n_certified"] == m["n_certified_ibp"]  # only the first method ran
    correct = round(m["clean_accuracy"] * m["n"])
    assert m["n_budget"] == correct - m["n_certified"] > 0
    assert any("time budget" in w for w in r["checks"]["cert"]["warnings"])


def test_a_graph_that_measures_another_function_is_refused() -> None:
    from certify.models.bound_ops import BoundGraph, BoundsUnavailable
    from certify.models.bound_source import margin_tolerance

    graph = BoundGraph(DEMO / "certified.onnx")
    x = torch.rand(3, 3, 32, 32)
    scores = graph.logits(x.double()).float()
    assert margin_tolerance(graph, x, scores, "m") > 0
    with pytest.raises(BoundsUnavailable, match="differ from m's"):
        margin_tolerance(graph, x, scores + 0.05 * scores.abs().max(), "m")


def _inline_suite(rule: str, cert_samples: int, cert_eps: float, cert_norm: str = "linf"
                  ) -> Any:
    from certify.suite import parse_suite

    return parse_suite({"name": "s", "decision": rule, "classes": ["a", "b"], "checks": [
        {"id": "apgd", "kind": "attack", "samples": 1000,
         "params": {"attack": "apgd_ce", "norm": "linf", "epsilon": 8 / 255},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}},
        {"id": "cert", "kind": "certified", "samples": cert_samples,
         "params": {"norm": cert_norm, "epsilon": cert_eps, "methods": ["ibp"]}}]}, "inline")


@pytest.mark.parametrize("rule", ["interval", "point"])
def test_a_floor_on_fewer_samples_never_passes_the_row(rule: str) -> None:
    """The review's case: APGD leaves 400 of 1,000 samples; the certified check ran on 12 and
    proved all 12. The floor is over the row's 1,000 samples (the 988 unevaluated count as not
    certified): no PASS by proof while the attacked interval lies below the threshold."""
    from certify.engine.crosscheck import attack_worst_case

    apgd = {i: {"outcome": "robust" if i < 400 else "broken", "queries": 1}
            for i in range(1000)}
    cert = {i: {"outcome": "certified", "method": "ibp", "queries": 1} for i in range(12)}
    (row,) = attack_worst_case(_inline_suite(rule, 12, 8 / 255), {"apgd": apgd, "cert": cert})
    assert row.certified is not None
    assert (row.certified.n, row.certified.n_certified, row.certified.n_unevaluated) == \
        (1000, 12, 988)
    assert row.status == "FAIL" and not row.decided_by.rule.startswith("certified")


def test_a_break_inside_a_larger_certified_ball_stops_the_run() -> None:
    """An attack at a smaller radius, or of an L2 ball inside the certified L∞ ball, that
    breaks a certified sample contradicts the proof as much as one at the same radius."""
    from certify.engine.crosscheck import CertifiedButBroken, no_certified_sample_broken

    apgd = {0: {"outcome": "broken", "queries": 1}, 1: {"outcome": "robust", "queries": 1}}
    cert = {0: {"outcome": "certified", "method": "ibp", "queries": 1}}
    finals = {"apgd": apgd, "cert": cert}
    with pytest.raises(CertifiedButBroken, match="sample 0 is certified robust by cert"):
        no_certified_sample_broken(_inline_suite("interval", 2, 16 / 255), finals, 3072)
    # a certified ball smaller than the attack's: the break may lie outside it
    no_certified_sample_broken(_inline_suite("interval", 2, 4 / 255), finals, 3072)
    # an L2 certificate of radius 8/255·√D contains the L∞ ball of 8/255
    with pytest.raises(CertifiedButBroken):
        no_certified_sample_broken(
            _inline_suite("interval", 2, 8 / 255 * 3072 ** 0.5 + 1e-9, "l2"), finals, 3072)
