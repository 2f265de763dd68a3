"""Transfer to endpoints (issue 27, point 9): ``--surrogate model.onnx`` runs the white-box
attacks on a local model's graph and the endpoint (a real HTTP server on 127.0.0.1) judges every
candidate; the row is labelled transfer, its breaks count in the threat model's row, and it
never supports a PASS."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from certify.api import demo_model_path
from certify.checks.attack import AttackCheck
from certify.device import choose_device
from certify.engine.crosscheck import attack_worst_case
from certify.errors import ModelError, UsageError
from certify.models import load_model
from certify.models.base import TRANSFER, ModelInfo, transfer_text
from certify.models.torchcopy import transfer_source_of
from certify.results import check_result_model
from certify.suite import parse_suite

from pgd_oracle import Judge, oracle_broken, oracle_candidates, oracle_net, with_head
from servers import OnnxHttpServer

pytestmark = pytest.mark.unit

STANDARD = demo_model_path("standard")


@pytest.fixture(scope="module")
def rounded(tmp_path_factory) -> Path:
    """The demo's standard model behind logits rounded to multiples of 4 (issue 27's defect)."""
    return with_head(STANDARD, tmp_path_factory.mktemp("heads") / "round4.onnx", "round4")


@pytest.fixture(scope="module")
def endpoint(rounded):
    server = OnnxHttpServer(rounded)
    yield server
    server.stop()


def test_a_surrogate_is_attached_to_an_endpoint_and_said_on_its_info(endpoint):
    from certify.distributed import ModelSource

    # the Ray workers load their models through ModelSource: the surrogate comes along
    model = ModelSource(endpoint.v2_url, surrogate=str(STANDARD)).load(choose_device("cpu"), 1)
    try:
        assert model.info.white_box == transfer_text("standard.onnx")
        assert model.info.white_box.startswith(TRANSFER)
        assert "standard.onnx (sha256:" in model.info.metadata["surrogate"]
        assert transfer_source_of(model) is not None
        # a white-box attack is no longer skipped on this endpoint
        assert AttackCheck("apgd_ce").skip_reason(model.info) is None
    finally:
        model.close()  # type: ignore[attr-defined]


def test_without_a_surrogate_the_skip_reason_names_the_option():
    info = ModelInfo("http://127.0.0.1:1/v2", "id", (3, 32, 32), 43, "logits")
    why = AttackCheck("apgd_ce").skip_reason(info)
    assert why is not None and "--surrogate" in why


@pytest.mark.parametrize(("model", "surrogate", "error", "words"), [
    ("file", "standard", UsageError, "--surrogate is for endpoints"),
    ("endpoint", "url", UsageError, "must be a model file"),
    ("endpoint", "tiny", ModelError, "answers 5 classes; the endpoint"),
    ("endpoint", "missing", ModelError, "missing.onnx"),
])
def test_a_surrogate_that_cannot_serve_is_refused_with_the_reason(
        model, surrogate, error, words, endpoint, tmp_path):
    import builders

    spec = endpoint.v2_url if model == "endpoint" else str(STANDARD)
    sur = {"standard": str(STANDARD), "url": endpoint.v2_url,
           "tiny": str(tmp_path / "five.onnx"), "missing": str(tmp_path / "missing.onnx")
           }[surrogate]
    if surrogate == "tiny":
        builders.export(builders.TinyNet(num_classes=5).eval(), Path(sur))
    with pytest.raises(error) as exc:
        load_model(spec, choose_device("cpu"), surrogate=sur)
    assert words in str(exc.value.message), exc.value.message


def _transfer_row(cid: str, status: str = "WARN") -> object:
    return check_result_model("attack").model_construct(
        id=cid, kind="attack", status=status, warnings=[], decision="",
        details={"white_box": {"transfer": {"attacked": 100, "surrogate_agrees": 90}}})


def test_transfer_breaks_count_but_never_support_and_never_suggest_masking():
    suite = parse_suite({"name": "t", "classes": [f"c{i}" for i in range(5)], "checks": [
        {"id": "square", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 0.03, "max_queries": 100},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}},
        {"id": "apgd", "kind": "attack", "params": {"attack": "apgd_ce", "epsilon": 0.03},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}}]}, "s.yaml")
    word = {"r": "robust", "b": "broken"}

    def recs(s: str) -> dict[int, dict]:
        return {i: {"i": i, "outcome": word[c]} for i, c in enumerate(s)}

    # square breaks 10 samples, the transfer attack 5 others: 85 robust, and square breaking
    # 10 more than the transfer is no sign of gradient masking
    finals = {"square": recs("b" * 10 + "r" * 90), "apgd": recs("r" * 10 + "b" * 5 + "r" * 85)}
    results = [check_result_model("attack").model_construct(
        id="square", kind="attack", status="PASS", warnings=[], decision="", details={}),
        _transfer_row("apgd")]
    (row,) = attack_worst_case(suite, finals, results)
    assert row.n_robust == 85 and row.broken_by == {"square": 10, "apgd": 5}
    assert row.transfer == ["apgd"] and row.white_box == []
    assert not row.warnings and row.support == ["square"] and row.status == "PASS"
    # alone, a transfer attack that broke nothing supports nothing
    (row,) = attack_worst_case(suite, {"apgd": recs("r" * 100)}, [_transfer_row("apgd")],
                               skipped=frozenset({"square"}))
    assert row.status == "WARN" and not row.support, row.decision


@pytest.mark.e2e
@pytest.mark.slow
def test_transfer_from_a_surrogate_breaks_a_rounded_endpoint(endpoint, rounded, tmp_path):
    """The acceptance's rounded-logits defect behind a real endpoint: Square at a starved
    budget breaks almost nothing, APGD on the unrounded surrogate breaks what the independent
    PGD breaks (within 5 points), every candidate judged on the endpoint; the L∞ threat-model
    row FAILs through the transfer row's breaks, which is labelled transfer and is not a PASS."""
    import yaml

    from certify.demo.synthetic import GTSRB_CLASS_NAMES, generate

    from builders import run_cli

    checks = [
        {"id": "square_linf", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 8 / 255, "max_queries": 100,
                    "binarization": False, "confident_queries": 0},
         "threshold": {"metric": "robust_accuracy", "min": 0.5}},
        *({"id": f"{a}_linf", "kind": "attack",
           "params": {"attack": a, "norm": "linf", "epsilon": 8 / 255},
           "threshold": {"metric": "robust_accuracy", "min": 0.5}}
          for a in ("apgd_ce",))]  # APGD-T transfers the same way; one attack keeps it short
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "transfer", "seed": 0,
                                     "classes": list(GTSRB_CLASS_NAMES), "checks": checks}))
    x, y = generate(1, seed=11)
    np.savez(tmp_path / "signs.npz", x=x, y=y)
    served = endpoint.images_served
    r = run_cli("run", endpoint.v2_url, "--suite", suite, "--data", tmp_path / "signs.npz",
                "--surrogate", STANDARD, "--out", tmp_path / "out", "--no-pdf")
    assert r.returncode == 1, r.stdout + r.stderr
    m = json.loads((tmp_path / "out" / "results.json").read_text())["measurement"]
    assert m["model"]["white_box"].startswith(TRANSFER)
    (row,) = m["attack_worst_case"]
    assert row["status"] == "FAIL" and row["transfer"] == ["apgd_ce_linf"]
    assert row["white_box"] == [] and not row["support"], row
    checks_by_id = {c["id"]: c for c in m["checks"]}
    for cid in row["transfer"]:
        c = checks_by_id[cid]
        assert c["status"] != "PASS" and c["metrics"]["gradient_evaluations"] > 0
        transfer = c["details"]["white_box"]["transfer"]
        assert transfer["agreement"] >= 0.9, transfer  # the surrogate is the unrounded model
        assert c["details"]["white_box"]["eps_sweep"] is None  # not swept on a surrogate
        assert any("transfer attack" in w for w in c["warnings"])
    # square ran after the transfer attack, on the samples it left (their breaks carried over)
    square = checks_by_id["square_linf"]
    inherited = square["details"]["inherited"]
    assert inherited["by"] == {"apgd_ce_linf": row["broken_by"]["apgd_ce_linf"]}
    assert row["broken_by"]["square_linf"] - inherited["samples"] < \
        row["broken_by"]["apgd_ce_linf"]
    # every judgement reached the endpoint: clean answers and one candidate per sample
    assert endpoint.images_served - served >= 3 * len(y)
    # within 5 points of the independent PGD, judged on the rounded model
    judge = Judge(rounded)
    xs = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
    ys = torch.from_numpy(y)
    keep = judge.predict(xs).argmax(1) == ys
    candidates = oracle_candidates(oracle_net(STANDARD), xs[keep], ys[keep], "linf", 8 / 255)
    truth = oracle_broken(candidates, judge, ys[keep])
    oracle_ra = int((~truth).sum()) / len(ys)
    assert row["robust_accuracy"] <= oracle_ra + 0.05, (row, oracle_ra)
    html = (tmp_path / "out" / "card.html").read_text()
    assert "transfer from the surrogate" in html
