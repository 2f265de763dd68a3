"""Verdicts per threat model (issue 27): one headline row per (norm, ε) over every attack of
it, what may support its PASS, AutoAttack's gradient-masking cross-check, and the black-box
rules an attack row must meet before it may PASS on its own (query floors, two doubled
rounds, not stalled, validated by the binarization test)."""

from __future__ import annotations

import pytest
import torch

from certify.attacks import ATTACKS
from certify.checks import attack_verdict
from certify.checks.attack import AttackCheck, stalled_counts
from certify.engine.crosscheck import attack_worst_case
from certify.results import check_result_model, verdict_statuses
from certify.suite import parse_suite

import builders

pytestmark = pytest.mark.unit

CLASSES = [f"c{i}" for i in range(builders.NUM_CLASSES)]


def _suite(rule: str = "interval", square_min: float = 0.5, apgd_min: float = 0.6):
    return parse_suite({"name": "t", "classes": CLASSES, "decision": rule, "checks": [
        {"id": "square", "kind": "attack",
         "params": {"attack": "square_linf", "epsilon": 0.03, "max_queries": "auto"},
         "threshold": {"metric": "robust_accuracy", "min": square_min}},
        {"id": "apgd", "kind": "attack", "params": {"attack": "apgd_ce", "epsilon": 0.03},
         "threshold": {"metric": "robust_accuracy", "min": apgd_min}},
        {"id": "l2", "kind": "attack",
         "params": {"attack": "square_l2", "epsilon": 0.5, "max_queries": 100}},
        {"id": "clean", "kind": "clean_accuracy"}]}, "s.yaml")


def _finals(square: str, apgd: str, n: int = 100) -> dict[str, dict[int, dict]]:
    """Records per check from outcome strings: ``r`` robust, ``b`` broken, ``m`` misclassified
    (each string's last letter repeats to ``n``)."""
    def recs(spec: str) -> dict[int, dict]:
        spec = spec + spec[-1] * (n - len(spec))
        word = {"r": "robust", "b": "broken", "m": "misclassified"}
        return {i: {"i": i, "outcome": word[c]} for i, c in enumerate(spec)}
    return {"square": recs(square), "apgd": recs(apgd), "l2": recs("r")}


def _results(square: str, apgd: str, l2: str = "WARN") -> list:
    make = check_result_model("attack").model_construct
    return [make(id="square", kind="attack", status=square, warnings=[], decision="", details={}),
            make(id="apgd", kind="attack", status=apgd, warnings=[], decision="", details={}),
            make(id="l2", kind="attack", status=l2, warnings=[], decision="", details={}),
            check_result_model("clean_accuracy").model_construct(
                id="clean", kind="clean_accuracy", status="INFO", warnings=[], decision="",
                details={})]


def _linf(rows):
    return next(w for w in rows if w.norm == "linf")


def test_a_sample_is_robust_only_if_every_attack_failed_and_the_strictest_threshold_decides():
    # square breaks samples 0-9, apgd breaks 1-14: 15 broken together, 85 robust (square's
    # one sample beyond apgd's is below the masking allowance of 2)
    finals = _finals("b" * 10 + "r", "r" + "b" * 14 + "r")
    row = _linf(attack_worst_case(_suite(), finals, _results("PASS", "PASS")))
    assert (row.n, row.n_robust, row.robust_accuracy) == (100, 85, 0.85)
    assert row.broken_by == {"square": 10, "apgd": 14} and row.white_box == ["apgd"]
    assert not row.warnings
    assert row.threshold == 0.6  # the strictest of the two attack rows
    assert row.interval[0] < 0.85 < row.interval[1]
    assert row.status == "PASS" and row.support == ["square", "apgd"]
    assert "supported by square, apgd" in row.decision


def test_no_pass_without_an_attack_that_passed_on_its_own():
    finals = _finals("r", "r")
    row = _linf(attack_worst_case(_suite(), finals, _results("WARN", "WARN")))
    assert row.status == "WARN" and row.support == []
    assert "no attack of this threat model PASSed on its own" in row.decision
    assert "a stronger attack can only lower" in row.decision


def test_a_failing_worst_case_fails_whatever_supports_it():
    finals = _finals("b" * 60 + "r", "r")
    row = _linf(attack_worst_case(_suite(), finals, _results("FAIL", "PASS")))
    assert row.status == "FAIL" and "lies wholly below robust_accuracy ≥ 0.6" in row.decision


def test_a_straddling_row_names_a_sample_size_only_when_supported():
    finals = _finals("b" * 38 + "r", "b" * 38 + "r", n=100)  # 62% against 0.6: straddles
    supported = _linf(attack_worst_case(_suite(), finals, _results("INCONCLUSIVE", "PASS")))
    assert supported.status == "INCONCLUSIVE"
    assert "samples at the observed value would decide it" in supported.decision
    alone = _linf(attack_worst_case(_suite(), finals, _results("WARN", "WARN")))
    assert alone.status == "INCONCLUSIVE"
    assert "a stronger attack can only lower it" in alone.decision
    assert "samples at the observed" not in alone.decision


@pytest.mark.parametrize(("extra", "suspected"), [(1, False), (2, True), (5, True)])
def test_gradient_masking_is_suspected_when_a_black_box_attack_breaks_clearly_more(extra,
                                                                                   suspected):
    # apgd breaks 3 samples; square the same 3 plus ``extra`` more (threshold max(2, 2% of 100))
    finals = _finals("b" * (3 + extra) + "r", "bbbr")
    row = _linf(attack_worst_case(_suite(), finals, _results("PASS", "PASS")))
    assert bool(row.warnings) == suspected
    if suspected:
        assert row.status == "WARN" and "gradient masking suspected" in row.warnings[0]
        assert f"square (black-box) broke {extra} sample(s) that the white-box" \
            in row.warnings[0]
    else:
        assert row.status == "PASS"


def test_an_errored_attack_stops_a_pass_and_counts_itself_in_the_verdict():
    results = _results("ERROR", "PASS")
    finals = _finals("r", "r")
    finals["square"] = {}  # an errored check leaves no records
    rows = attack_worst_case(_suite(), finals, results)
    row = _linf(rows)
    assert row.attacks == ["apgd"] and row.status == "WARN"
    assert "square produced no result" in row.decision
    statuses = verdict_statuses(results, rows)
    assert "ERROR" in statuses


def test_attack_rows_enter_the_verdict_through_their_threat_model_row():
    finals = _finals("r", "r")
    results = _results("PASS", "PASS", l2="WARN")
    rows = attack_worst_case(_suite(), finals, results)
    assert {(w.norm, w.status) for w in rows} == {("linf", "PASS"), ("l2", "WARN")}
    # the l2 row has no threshold: informational, but it carries its attack row's WARN
    assert "warnings on l2" in _linf([w.model_copy(update={"norm": "linf"}) for w in rows
                                      if w.norm == "l2"]).decision
    assert sorted(verdict_statuses(results, rows)) == ["INFO", "PASS", "WARN"]
    results[2] = results[2].model_copy(update={"status": "INFO"})
    rows = attack_worst_case(_suite(), finals, results)
    assert sorted(verdict_statuses(results, rows)) == ["INFO", "INFO", "PASS"]


def test_the_point_rule_decides_the_row_on_its_point_estimate():
    finals = _finals("b" * 39 + "r", "b" * 39 + "r")
    row = _linf(attack_worst_case(_suite("point"), finals, _results("PASS", "PASS")))
    assert row.status == "PASS" and "point rule" in row.decision


# -- black-box attack rows ------------------------------------------------------------------

def _records(outcomes: str, gap: float = 1.0, half: float = 2.0, rounds: int = 1,
             queries: int = 1000) -> list[dict]:
    out = []
    for i, c in enumerate(outcomes):
        r = {"i": i, "id": str(i), "label": 0, "queries": queries, "confidence": 0.9,
             "outcome": {"r": "robust", "b": "broken"}[c], "attack_queries": queries,
             "round_queries": [queries >> (rounds - 1 - k) for k in range(rounds)]}
        if c == "r":
            r.update(gap=gap, half_gap=half)
        else:
            r.update(adv_pred=1, broken_at=10)
        out.append(r)
    return out


def _summary(check: AttackCheck, records: list[dict]):
    return check.summarize(records, None)  # type: ignore[arg-type]


def test_floors_are_the_reference_budgets():
    """Each attack declares its floor; white-box attacks and exhaustive grids need none."""
    assert {name: cls.query_floor for name, cls in ATTACKS.items()} == {
        "square_linf": 5000, "square_l2": 5000, "random": 5000, "sparse_rs": 10000,
        "hopskipjump": 25000, "spatial_grid": 0, "apgd_ce": 0, "apgd_t": 0}


@pytest.mark.parametrize(("attack", "budget"), [("square_linf", 2), ("square_linf", 100),
                                                ("square_l2", 100), ("hopskipjump", 100),
                                                ("hopskipjump", 1000), ("sparse_rs", 1000)])
def test_a_starved_black_box_budget_is_evidence_never_a_pass(attack, budget):
    """The acceptance's starved budgets (binarization off): never a PASS, and why."""
    check = AttackCheck(attack, max_queries=budget, binarization=False)
    m = _summary(check, _records("r" * 40 + "b" * 2, queries=budget))
    ev = m.details["evidence"]
    assert not ev["can_pass"]
    floor = ATTACKS[attack].query_floor
    assert any(f"below its floor of {floor:,}" in s for s in ev["short_of_pass"])
    assert any("evidence, not a PASS" in w for w in m.warnings)


def test_a_run_whose_scores_never_moved_is_stalled_not_converged():
    check = AttackCheck("square_linf", max_queries="auto", initial_queries=1000)
    flat = _records("r" * 30 + "b", gap=1.0, half=1.0)
    assert stalled_counts(flat) == (30, 30)
    m = _summary(check, flat)
    assert m.details["evidence"]["stalled"] and m.metrics["stalled"] == 30
    assert any("gave the attack no signal" in w for w in m.warnings)
    assert m.unsettled and "stalled" in m.unsettled
    moving = _records("r" * 30 + "b", gap=1.0, half=5.0)
    assert stalled_counts(moving) == (0, 30)


def test_at_its_floor_over_two_rounds_a_validated_attack_may_pass_on_its_own():
    check = AttackCheck("square_linf", max_queries="auto", initial_queries=2500,
                        query_cap=8000)
    recs = _records("r" * 30 + "b", rounds=2, queries=7500)
    for r in recs:
        r["round_queries"] = [2500, 5000]
    short = AttackCheck("square_linf", max_queries="auto", initial_queries=2000,
                        query_cap=8000)
    assert short.floor() == 5000 and "below its floor of 5,000 (the cap is 8,000)" in \
        _summary(short, recs).details["evidence"]["short_of_pass"][0]
    ev = _summary(check, recs).details["evidence"]
    # the binarization test has no records here, but it is configured: only the floor and the
    # rounds are judged by the evidence rule (the test's own warning stops an untested PASS)
    assert ev["short_of_pass"] == [] and ev["can_pass"]


def test_auto_rounds_keep_doubling_a_converged_run_up_to_the_floor():
    check = AttackCheck("square_linf", max_queries="auto", initial_queries=1000,
                        query_cap=16000)
    converged = {i: r for i, r in enumerate(_records("r" * 30, gap=1.0, half=1.0))}
    nxt = check.next_round(converged, 0)
    assert nxt is not None and nxt[0].round_budget(1) == 2000  # converged, below the floor
    after_4000 = check.next_round(converged, 2)
    assert after_4000 is not None and after_4000[0].round_budget(3) == 8000
    assert check.next_round(converged, 3) is None  # an 8,000-query run reached the floor


# -- quantised scores -----------------------------------------------------------------------

class _Headed:
    """A fixed random linear classifier behind an output head (no decision changes)."""

    def __init__(self, head: str) -> None:
        from certify.models.base import ModelInfo

        g = torch.Generator().manual_seed(3)
        self.w = torch.randn(builders.NUM_CLASSES, 48, generator=g) * 20
        self.head = head
        self.info = ModelInfo(name=head, identity=f"sha256:{head}", input_shape=(3, 32, 32),
                              num_classes=builders.NUM_CLASSES,
                              output="probs" if head == "softmax2" else "logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        z = (torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1) - 0.5) @ self.w.T
        if self.head == "round4":
            return torch.round(z / 4) * 4
        if self.head == "softmax2":
            return torch.round(torch.softmax(z, 1) * 100) / 100
        return z


@pytest.mark.parametrize(("head", "quantised"), [("none", False), ("round4", True),
                                                 ("softmax2", True)])
def test_the_sanity_probe_reports_quantised_scores(head, quantised):
    from certify.checks.base import CheckContext
    from certify.checks.sanity import QUANT_DRAWS, Sanity, quantisation_probe

    model = _Headed(head)
    x = torch.from_numpy(builders.make_images(12, seed=4)).permute(0, 3, 1, 2).float() / 255
    found = quantisation_probe(model, x, model.predict(x), list(range(len(x))))
    assert len(found) == len(x) and all(0 <= f[0] <= QUANT_DRAWS for f in found)
    ctx = CheckContext(check_seed=1, device=torch.device("cpu"), class_names=CLASSES,
                       selected=tuple(range(len(x))))
    rows = Sanity(near_boundary=False).run_batch(model, x, torch.zeros(len(x)).long(),
                                                 list(range(len(x))), ctx)
    probed = [r for r in rows if "quant_identical" in r]
    assert len(probed) == 10  # at most QUANT_SAMPLES, evenly spread
    m = Sanity().summarize(rows, None)  # type: ignore[arg-type]
    assert bool(m.metrics["quantised"]) == quantised, m.details["quantisation"]
    assert any("quantised scores" in w for w in m.warnings) == quantised


def test_quantised_scores_stop_score_based_attacks_from_passing_alone():
    from certify.checks.base import Measurement
    from certify.engine.crosscheck import no_score_based_pass_when_quantised

    suite = parse_suite({"name": "t", "classes": CLASSES, "checks": [
        {"id": "sanity", "kind": "sanity"},
        {"id": "square", "kind": "attack", "params": {"attack": "square_linf"}},
        {"id": "apgd", "kind": "attack", "params": {"attack": "apgd_ce"}},
        {"id": "hsj", "kind": "attack", "params": {"attack": "hopskipjump"}}]}, "s.yaml")
    from certify.results import DecidedBy

    make = check_result_model("attack").model_construct
    results = [make(id=i, kind="attack", status="PASS", warnings=[], decision="d",
                    decided_by=DecidedBy(rule="interval_within"))
               for i in ("square", "apgd", "hsj")]
    out = no_score_based_pass_when_quantised(
        suite, results, {"sanity": Measurement(metrics={"quantised": 1.0})})
    assert [r.status for r in out] == ["WARN", "PASS", "PASS"]
    assert "cannot PASS on its own" in out[0].decision
    # the stop is typed beside the sentence (issue 38): the card reads it, not the sentence
    assert out[0].decided_by.stopped == ["warning"] and "quantised" in out[0].decided_by.reason
    same = no_score_based_pass_when_quantised(
        suite, results, {"sanity": Measurement(metrics={"quantised": 0.0})})
    assert [r.status for r in same] == ["PASS", "PASS", "PASS"]


# -- the ε sweep ----------------------------------------------------------------------------

def _swept(rows: list[list[bool]], epsilons: list[float]) -> list[dict]:
    return [{"i": k, "id": str(k), "label": 0, "queries": 8, "confidence": 0.9,
             "outcome": "broken" if b[2] else "robust", "attack_queries": 0, "gradients": 10,
             "sweep_broken": b, "sweep_epsilons": epsilons} for k, b in enumerate(rows)]


def test_the_eps_sweep_radii_reach_any_image():
    linf = AttackCheck("apgd_ce", norm="linf", epsilon=8 / 255)
    assert linf.sweep_epsilons((3, 32, 32)) == pytest.approx(
        [2 / 255, 4 / 255, 8 / 255, 16 / 255, 32 / 255, 0.5])
    l2 = AttackCheck("apgd_ce", norm="l2", epsilon=0.5)
    assert l2.sweep_epsilons((3, 32, 32))[-1] == pytest.approx(3072 ** 0.5)


@pytest.mark.parametrize(("pattern", "reliable", "why"), [
    ("monotone", True, None),
    ("rises", False, "robust accuracy rose from"),
    ("survives", False, "which reaches any image"),
])
def test_an_eps_sweep_that_rises_or_cannot_destroy_the_image_flags_the_attack(pattern,
                                                                              reliable, why):
    check = AttackCheck("apgd_ce", norm="linf", epsilon=8 / 255)
    eps = check.sweep_epsilons((3, 32, 32))
    rows = [[False, False, True, True, True, True]] * 10 + \
        [[False, False, False, False, True, True]] * 10
    if pattern == "rises":  # broken at ε, robust again at 2ε, for 3 samples
        rows = rows[:17] + [[False, True, True, False, True, True]] * 3
    if pattern == "survives":
        rows = rows[:18] + [[False] * 6] * 2
    warnings: list[str] = []
    doc = attack_verdict.sweep_details(_swept(rows, eps), warnings)
    assert doc is not None and doc["samples"] == 20 and doc["reliable"] == reliable
    assert doc["robust"][-1] == (2 if pattern == "survives" else 0)
    if why:
        assert len(warnings) == 1 and why in warnings[0]
        assert "attack unreliable on this model" in warnings[0]
    else:
        assert warnings == []
