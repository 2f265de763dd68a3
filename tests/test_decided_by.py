"""What the card reads about a row is typed, written where the engine decides (issue 38): the
rule that made a status (``decided_by``) and what keeps a figure from being final
(``settled``); neither is parsed from a decision sentence or re-read from ``details``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from certify.checks import CHECKS
from certify.engine import judge
from certify.kinds import Settlement
from certify.report import card as card_mod
from certify.report import glance
from certify.results import DecidedBy, SchemaError, parse_result
from certify.stats import wilson_interval
from certify.suite import CheckSpec, Threshold

pytestmark = pytest.mark.unit

PREVIOUS = Path(__file__).parent / "data" / "previous_release" / "results.json"


def _spec(threshold: Threshold, rule: str = "interval") -> CheckSpec:
    check = CHECKS["attack"].__new__(CHECKS["attack"])  # only its declared metrics are read
    return CheckSpec("c", "attack", check, threshold, decision=rule)


def _rate(k: int, n: int) -> tuple[dict, dict]:
    return {"robust_accuracy": k / n}, {"robust_accuracy": wilson_interval(k, n)}


@pytest.mark.parametrize(("k", "n", "rule", "warnings", "errors", "status", "typed", "stopped"), [
    (33, 40, "interval", [], 0, "PASS", "interval_within", []),
    (5, 40, "interval", [], 0, "FAIL", "interval_outside", []),
    (21, 40, "interval", [], 0, "INCONCLUSIVE", "interval_straddles", []),
    (21, 40, "point", [], 0, "PASS", "point_meets", []),
    (19, 40, "point", [], 0, "FAIL", "point_misses", []),
    (33, 40, "interval", ["too weak"], 0, "WARN", "interval_within", ["warning"]),
    (33, 40, "interval", [], 2, "INCONCLUSIVE", "interval_within", ["sample_errors"]),
])
def test_the_engine_types_the_rule_beside_its_sentence(k, n, rule, warnings, errors, status,
                                                       typed, stopped):
    metrics, iv = _rate(k, n)
    v = judge(_spec(Threshold("robust_accuracy", min=0.5), rule), metrics, warnings, errors, iv)
    assert (v.status, v.decided_by.rule, v.decided_by.stopped) == (status, typed, stopped)
    if typed == "interval_straddles":  # the reason is what the sentence ends with
        assert v.decided_by.reason and v.decision.endswith(f"(interval rule): "
                                                           f"{v.decided_by.reason}")
    if warnings:
        assert v.decided_by.reason == warnings[0]


def _row(status: str, decision: str, by: DecidedBy, settled: Settlement,
         details: dict | None = None) -> SimpleNamespace:
    thr = SimpleNamespace(metric="robust_accuracy", min=0.5, max=None,
                          text="robust_accuracy ≥ 0.5", rule="interval")
    return SimpleNamespace(id="square", kind="attack", status=status,
                           metrics={"robust_accuracy": 0.52},
                           intervals={"robust_accuracy": [0.37, 0.67]}, threshold=thr,
                           warnings=[], decision=decision, error=None, sample_errors=0,
                           details=details or {}, decided_by=by, settled=settled)


def test_the_card_reads_why_and_what_is_unsettled_from_the_typed_fields(monkeypatch):
    monkeypatch.setattr(card_mod, "headline", lambda c: "a headline")  # not under test
    # the sentence says "wholly outside", the typed rule says it straddles: the rule decides
    row = _row("INCONCLUSIVE", "x lies wholly outside y (interval rule): misleading words",
               DecidedBy(rule="interval_straddles", reason="about 464 samples would decide"),
               Settlement(attack_converged=False),
               details={"convergence": {"converged": True}})
    (found,) = card_mod.findings([row], [])
    assert found["why"] == "about 464 samples would decide"
    # a failure whose sentence lacks the old markers still reads as the interval rule's
    fail = _row("FAIL", "some sentence", DecidedBy(rule="interval_outside"), Settlement())
    assert card_mod.findings([fail], [])[0]["why"] == ("its whole 95% interval misses the "
                                                       "threshold (interval rule)")
    # unsettled from `settled`, whatever the details say
    assert card_mod._unsettled(row)["attack"] and not card_mod._unsettled(fail)["attack"]
    g = glance.Row(id="square", status="INCONCLUSIVE", group="Attacks", metric="robust_accuracy",
                   words="robust accuracy", rate=True, value=0.52, interval=(0.37, 0.67),
                   threshold=(0.5, None))
    assert card_mod.summary_result(row, g).endswith("; not converged")
    assert "not converged" not in card_mod.summary_result(
        _row("PASS", "", DecidedBy(rule="interval_within"), Settlement(attack_converged=True),
             details={"convergence": {"converged": False}}), g)


def test_a_threat_model_whose_pass_was_stopped_says_what_stopped_it():
    w = SimpleNamespace(
        norm="l0", epsilon=8.0, attacks=["sparse"], n=12, robust_accuracy=0.833,
        interval=[0.552, 0.953], threshold=0.5, status="WARN", warnings=[],
        decision="worst case … lies wholly within robust_accuracy ≥ 0.5 (interval rule; the "
                 "strictest threshold of its attack rows); but no attack PASSed on its own",
        decided_by=DecidedBy(rule="interval_within", stopped=["no_support"],
                             reason="no attack of this threat model PASSed on its own"))
    (found,) = card_mod.findings([], [w])
    assert found["why"] == "no attack of this threat model PASSed on its own"


def test_an_older_results_document_is_read_through_its_adapter_only_when_asked():
    doc = json.loads(PREVIOUS.read_text())
    assert doc["schema"] == "certify.results/2"
    with pytest.raises(SchemaError, match="older certify"):
        parse_result(doc)
    old = parse_result(doc, older=True)
    assert old.schema_version == "certify.results/2"
    by_id = {c.id: c for c in old.checks}
    # derived the old way: from the details keys and the decision sentences
    assert by_id["spatial_grid"].decided_by.rule == "interval_straddles"
    assert by_id["spatial_grid"].decided_by.reason == ("about 379 evaluated samples at the "
                                                       "observed 0.06977 would decide it")
    assert by_id["spatial_grid"].settled == Settlement()  # a grid: nothing to converge
    assert by_id["clean"].decided_by.rule == "interval_within"
    (w,) = old.measurement.attack_worst_case
    assert w.decided_by.rule == "interval_straddles"
    assert doc["measurement"]["checks"][0].get("settled") is None  # the document is untouched
