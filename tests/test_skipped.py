"""SKIPPED rows: score-based checks on a labels-only model are listed, not run, not passed.

The packaged suite runs on a labels-only HTTP endpoint: its score-based checks (Square L∞ and
L2, coverage, brittleness) become SKIPPED rows with the reason, cost no query, and the verdict
is computed over the evaluated checks. A suite whose every check would be skipped is refused.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from certify.errors import CARD_WRITTEN_CODES, EXIT_USAGE, overall_verdict
from certify.suite import resolve_suite_path

import builders
from servers import OnnxHttpServer

pytestmark = pytest.mark.e2e

N = 16
SCORE_BASED = {"square_linf", "square_l2", "sparse_rs_l0", "coverage", "brittleness"}
#: The packaged white-box attacks: an endpoint has no graph to take gradients of.
WHITE_BOX = {"apgd_linf", "apgd_t_linf", "apgd_l2", "apgd_t_l2"}


@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("skip") / "d.npz", N,
                                       seed=31)


@pytest.fixture(scope="module")
def labels_server(model_path):
    server = OnnxHttpServer(model_path, labels_only=True)
    yield server
    server.stop()


def _packaged_suite_small(path: Path) -> Path:
    """The packaged gtsrb suite, every check kept, with budgets small enough for a test."""
    raw = yaml.safe_load(resolve_suite_path("gtsrb").read_text())
    raw["data"]["samples"] = N
    for c in raw["checks"]:
        if c["kind"] == "attack":
            c["samples"] = 3
            p = c["params"]
            if p["attack"] == "spatial_grid":
                p["max_queries"] = 48
                p["attack_params"] = {"max_rotation": 30, "max_translation": 1,
                                      "rotation_steps": 1, "translation_steps": 1}
            else:
                p["max_queries"] = 60
                p.pop("initial_queries", None)
                p.pop("query_cap", None)
                p["binarization"] = False
        elif c.get("samples"):
            c["samples"] = min(c["samples"], 4)
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(url: str, suite: Path, data: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return builders.run_cli("run", url, "--suite", suite, "--data", data, "--out", out,
                            "--no-pdf", timeout=600)


def test_verdict_rule_leaves_skipped_checks_out():
    assert overall_verdict(["PASS", "SKIPPED", "INFO"]) == "PASS"
    assert overall_verdict(["WARN", "SKIPPED"]) == "WARN"
    assert overall_verdict(["FAIL", "SKIPPED", "PASS"]) == "FAIL"
    # nothing evaluated: nothing passed
    assert overall_verdict(["SKIPPED", "SKIPPED"]) == "ERROR"


@pytest.mark.slow
def test_packaged_suite_runs_on_a_labels_only_endpoint(labels_server, data, tmp_path):
    suite = _packaged_suite_small(tmp_path / "gtsrb-small.yaml")
    assert {c["id"] for c in yaml.safe_load(suite.read_text())["checks"]} >= SCORE_BASED
    out = tmp_path / "run"
    proc = _run(labels_server.v2_url, suite, data, out)
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    r = json.loads((out / "results.json").read_text())
    m = r["measurement"]
    assert m["model"]["output"] == "labels"
    rows = {c["id"]: c for c in m["checks"]}
    skipped = {i for i, c in rows.items() if c["status"] == "SKIPPED"}
    assert skipped == SCORE_BASED | WHITE_BOX
    for i in skipped:
        c = rows[i]
        if i in WHITE_BOX:
            assert "is a white-box attack" in c["decision"], c
        else:
            assert "needs scores" in c["decision"] and "labels only" in c["decision"], c
        assert c["metrics"] is None and c["queries"]["total"] == 0
    # the reason names the attack that still covers the norm, or says none does
    assert "hopskipjump_l2 covers l2" in rows["square_l2"]["decision"]
    assert "no attack of this suite covers linf" in rows["square_linf"]["decision"]
    # everything else was evaluated, on the same run
    evaluated = [c for i, c in rows.items() if i not in SCORE_BASED | WHITE_BOX]
    assert evaluated and all(c["status"] not in ("SKIPPED", "ERROR") for c in evaluated)
    assert all(c["metrics"] for c in evaluated)
    assert m["summary"]["skipped"] == len(SCORE_BASED | WHITE_BOX)
    # attack rows enter the verdict through their threat model's row
    grouped = {i for w in m["attack_worst_case"] for i in w["attacks"]}
    assert m["verdict"] == overall_verdict(
        [c["status"] for c in evaluated if c["id"] not in grouped] +
        [w["status"] for w in m["attack_worst_case"]])
    assert "skipped" in m["decision"]
    # the worst case over L2 attacks still comes from the attack that ran
    l2 = [w for w in m["attack_worst_case"] if w["norm"] == "l2"]
    assert l2 and l2[0]["attacks"] == ["hopskipjump_l2"]
    # card and CLI show the rows and the count
    html = (out / "card.html").read_text()
    skipped = len(SCORE_BASED | WHITE_BOX)
    assert f"{skipped} checks skipped (model returns labels only)" in html
    assert html.count('class="verdict SKIPPED"') >= 2 * skipped  # summary + section
    assert "square_l2 needs scores" in html
    assert "SKIPPED" in proc.stdout and f"{skipped} check(s) skipped" in proc.stdout
    # the written results follow the published schema
    schema = json.loads(builders.run_cli("schema").stdout)
    assert "SKIPPED" in json.dumps(schema)
    # signed afterwards, the card with SKIPPED rows verifies (its visible text re-renders)
    keys = tmp_path / "keys"
    assert builders.run_cli("keygen", "--out", keys).returncode == 0
    # --no-pdf: the run wrote none, and the HTML card is what is verified below
    signed = builders.run_cli("sign", out, "--key", keys / "certify.key", "--no-pdf")
    assert signed.returncode == 0, signed.stderr
    verified = builders.run_cli("verify", out / "card.html", "--pubkey", keys / "certify.pub")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "SKIPPED      square_l2" in verified.stdout


def test_a_suite_whose_every_check_is_skipped_is_refused(labels_server, data, tmp_path):
    suite = tmp_path / "scores-only.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "classes": [f"c{i}" for i in range(43)],
                                     "checks": [
        {"id": "coverage", "kind": "coverage"},
        {"id": "sq", "kind": "attack", "samples": 2,
         "params": {"attack": "square_l2", "max_queries": 20, "binarization": False}}]}))
    proc = _run(labels_server.v2_url, suite, data, tmp_path / "out")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "every check" in proc.stderr and "would be skipped" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "card.html").exists()
