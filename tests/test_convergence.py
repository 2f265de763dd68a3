"""Attack convergence (issue 17, point 1): the late-break rule, ``max_queries: auto`` rounds,
their records, resume, and starved attacks that must never PASS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from certify.api import DEMO_PER_CLASS, DEMO_SEED, demo_model_path
from certify.checks.attack import AttackCheck, convergence, robustness_curve
from certify.demo.synthetic import generate
from certify.errors import CARD_WRITTEN_CODES, SuiteError
from certify.suite import load_suite, packaged_suites

import builders

pytestmark = pytest.mark.e2e

CLASSES = [f"c{i}" for i in range(43)]


def _robust(q: int, **kw: float) -> dict:
    return {"outcome": "robust", "attack_queries": q, **kw}


def _broken(at: int) -> dict:
    return {"outcome": "broken", "attack_queries": at, "broken_at": at}


def test_late_breaks_decide_convergence():
    recs = [_robust(1000) for _ in range(96)] + [_broken(100), _broken(300), _broken(900)]
    recs.append({"outcome": "misclassified", "attack_queries": 0})
    one_late = convergence(recs, 0, 1000)
    assert one_late["late_breaks"] == 1 and one_late["allowance"] == 1
    assert one_late["converged"]
    recs[0] = _broken(501)  # a second break in the last half: over max(1, 1% of 100)
    assert not convergence(recs, 0, 1000)["converged"]
    # 1% of 300 samples allows three late breaks
    many = recs + [_robust(1000) for _ in range(200)]
    assert convergence(many, 0, 1000)["converged"]
    # after rounds, only the latest run's late breaks count
    later = [{**_broken(1500), "broken_round": 1, "round_queries": [1000, 500]},
             {**_broken(1700), "broken_round": 1, "round_queries": [1000, 700]},
             {**_broken(2900), "broken_round": 1, "round_queries": [1000, 1900]}]
    res = convergence([_robust(3000) for _ in range(97)] + later, 1, 2000)
    assert res["late_breaks"] == 1 and res["converged"]


def test_samples_still_being_approached_are_not_converged():
    # gap to success 0.4 at half the budget, 0.1 at the end: as much again would close it
    closing = _robust(1000, gap=0.1, half_gap=0.4)
    stalled = _robust(1000, gap=0.35, half_gap=0.4)
    recs = [_robust(1000) for _ in range(98)] + [closing, closing]
    res = convergence(recs, 0, 1000)
    assert res["approaching"] == 2 and not res["converged"]
    recs = [_robust(1000) for _ in range(98)] + [stalled, stalled]
    assert convergence(recs, 0, 1000)["converged"]


def test_square_and_hopskipjump_report_the_gap_at_half_and_at_the_end(net):
    import torch

    from certify.attacks import HopSkipJump, SquareLinf

    class Net:
        def predict(self, z: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return net(z)

    x = torch.from_numpy(builders.make_images(6, seed=2).transpose(0, 3, 1, 2).copy()) / 255
    model = Net()
    y = model.predict(x.float()).argmax(1)
    for attack in (SquareLinf(epsilon=0.01, max_queries=40),
                   HopSkipJump(epsilon=0.01, max_queries=300)):
        res = attack.run(model, x.float(), y, torch.arange(6), "logits")
        assert res.gap is not None and res.half_gap is not None
        unbroken = torch.isfinite(res.gap)
        assert bool(unbroken.any())
        # the gap only closes: the end is never further from success than the half-way point
        assert bool((res.gap[unbroken] <= res.half_gap[unbroken] + 1e-6).all())


def test_the_curve_falls_with_the_break_queries():
    recs = [_robust(800), _broken(3), _broken(200), {"outcome": "misclassified",
                                                    "attack_queries": 0}]
    curve = {p["queries"]: p["robust_accuracy"] for p in robustness_curve(recs, 800)}
    assert curve[0] == 0.75 and curve[2] == 0.75 and curve[4] == 0.5
    assert curve[256] == 0.25 and curve[800] == 0.25
    values = list(curve.values())
    assert values == sorted(values, reverse=True)


def test_auto_budgets_double_up_to_the_cap():
    c = AttackCheck("square_linf", max_queries="auto", initial_queries=100, query_cap=800)
    assert [c.round_budget(r) for r in range(4)] == [100, 200, 400, 800]
    assert [c.total_after(r) for r in range(4)] == [100, 300, 700, 1500]
    unconverged = {i: _broken(90) for i in range(10)} | {10: _robust(100)}
    nxt = c.next_round(unconverged, 0)
    assert nxt is not None and nxt[1] == [10] and nxt[0].build().max_queries == 200
    assert c.next_round(unconverged, 3) is None  # the next budget (1,600) passes the cap
    converged = {i: _robust(100) for i in range(10)}
    # converged but below its floor (5,000 queries in one run): it doubles on, up to the cap
    after = c.next_round(converged, 0)
    assert after is not None and after[0].build().max_queries == 200
    assert c.next_round(converged, 3) is None
    at_floor = AttackCheck("square_linf", max_queries="auto", initial_queries=5000)
    assert at_floor.next_round(converged, 0) is None  # converged at its floor: done
    fixed = AttackCheck("square_linf", max_queries=100)
    assert fixed.next_round(unconverged, 0) is None


def test_merge_adds_queries_and_dates_a_late_break():
    c = AttackCheck("square_linf", max_queries="auto", initial_queries=100)
    first = {0: {**_robust(100), "queries": 102, "label": 3, "bt": "success"},
             1: {**_robust(100), "queries": 102, "label": 4}}
    second = {0: {**_broken(7), "queries": 9, "label": 3, "adv_pred": 5, "confidence": 0.4},
              1: {**_robust(100), "queries": 102, "label": 4, "confidence": 0.9}}
    merged = c.merge_round(first, second, 1)
    assert merged[0]["outcome"] == "broken" and merged[0]["broken_at"] == 107
    assert merged[0]["queries"] == 111 and merged[0]["round_queries"] == [100, 7]
    assert merged[0]["bt"] == "success"  # round 0's binarization fields stay
    assert merged[1]["outcome"] == "robust" and merged[1]["attack_queries"] == 200


@pytest.mark.parametrize("params, words", [
    ({"max_queries": 100, "initial_queries": 50}, "go with max_queries: auto"),
    ({"max_queries": "auto", "initial_queries": 500, "query_cap": 600}, "no room"),
    ({"max_queries": "often"}, "max_queries"),
])
def test_bad_budgets_are_refused_at_load(tmp_path, params, words):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "classes": CLASSES, "checks": [
        {"id": "a", "kind": "attack", "params": {"attack": "square_linf", **params}}]}))
    with pytest.raises(SuiteError, match=words):
        load_suite(str(path))


def test_an_exhaustive_grid_has_no_auto_budget_and_ids_have_no_hash(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "classes": CLASSES, "checks": [
        {"id": "g", "kind": "attack", "params": {"attack": "spatial_grid",
                                                  "max_queries": "auto"}}]}))
    with pytest.raises(SuiteError, match="exhaustively"):
        load_suite(str(path))
    path.write_text(yaml.safe_dump({"name": "t", "classes": CLASSES, "checks": [
        {"id": "a#round1", "kind": "clean_accuracy"}]}))
    with pytest.raises(SuiteError, match="'#'"):
        load_suite(str(path))


# -- end to end on the tiny model ----------------------------------------------------------
@pytest.fixture(scope="module")
def data(net, tmp_path_factory) -> Path:
    return builders.write_labelled_npz(net, tmp_path_factory.mktemp("conv") / "d.npz", 40,
                                       seed=5)


def _suite(path: Path, params: dict, threshold: float = 0.0) -> Path:
    path.write_text(yaml.safe_dump({"name": "conv", "classes": CLASSES, "seed": 3, "checks": [
        {"id": "sq", "kind": "attack", "samples": 40,
         "params": {"attack": "square_linf", "epsilon": 0.1, "binarization": False,
                    **params},
         "threshold": {"metric": "robust_accuracy", "min": threshold}}]}))
    return path


def _run(model_path: Path, suite: Path, data: Path, out: Path, *extra: str):
    return builders.run_cli("run", str(model_path), "--suite", str(suite), "--data", str(data),
                            "--out", str(out), "--no-pdf", *extra)


def test_a_starved_fixed_budget_warns_instead_of_passing(model_path, data, tmp_path):
    suite = _suite(tmp_path / "s.yaml", {"max_queries": 40, "epsilon": 0.15})
    proc = _run(model_path, suite, data, tmp_path / "o")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    (c,) = json.loads((tmp_path / "o" / "results.json").read_text())["measurement"]["checks"]
    conv = c["details"]["convergence"]
    assert conv["late_breaks"] > conv["allowance"] and not conv["converged"]
    assert c["status"] == "WARN" and any("not converged" in w for w in c["warnings"])
    html = (tmp_path / "o" / "card.html").read_text()
    assert "not converged" in html and "queries per sample" in html  # the curve's axis


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_auto_rounds_attack_the_unbroken_and_resume_to_the_same_result(model_path, data,
                                                                         tmp_path):
    suite = _suite(tmp_path / "s.yaml", {"max_queries": "auto", "initial_queries": 40,
                                         "query_cap": 320, "epsilon": 0.15})
    out = tmp_path / "o"
    proc = _run(model_path, suite, data, out)
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    (c,) = json.loads((out / "results.json").read_text())["measurement"]["checks"]
    rounds = c["details"]["convergence"]["rounds"]
    assert len(rounds) >= 2 and c["metrics"]["rounds"] == len(rounds)
    recs = _records(out)
    by_round: list[dict[int, dict]] = [{} for _ in rounds]
    for r in recs:
        k = 0 if r["check"] == "sq" else int(r["check"].split("#round")[1])
        by_round[k][r["i"]] = r
    unbroken = {i for i, r in by_round[0].items() if r["outcome"] == "robust"}
    for k in range(1, len(rounds)):
        assert set(by_round[k]) == unbroken  # exactly the samples still unbroken
        assert all(r["attack_queries"] <= 40 * 2 ** k for r in by_round[k].values())
        unbroken = {i for i, r in by_round[k].items() if r["outcome"] == "robust"}
    assert c["queries"]["total"] == sum(r["queries"] for r in recs)  # every round accounted
    assert c["metrics"]["query_budget"] == 40 * (2 ** len(rounds) - 1)
    # interrupted in the last round: its records are lost, resume redoes them
    cut = tmp_path / "cut"
    shutil.copytree(out, cut)
    last = f"sq#round{len(rounds) - 1}"
    kept = [line for line in (cut / "records.jsonl").read_text().splitlines()
            if json.loads(line)["check"] != last]
    (cut / "records.jsonl").write_text("\n".join(kept) + "\n")
    (cut / "results.json").unlink()
    proc = _run(model_path, suite, data, cut, "--resume")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    assert builders.measurement(cut) == builders.measurement(out)


# -- acceptance: starved attacks on the demo model never PASS ------------------------------
@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    x, y = generate(DEMO_PER_CLASS, seed=DEMO_SEED)  # the demo's data
    path = tmp_path_factory.mktemp("demo") / "d.npz"
    np.savez(path, x=x, y=y)
    return path


def _packaged(check_id: str) -> dict:
    raw = yaml.safe_load(packaged_suites()["gtsrb"].read_text())
    return next(c for c in raw["checks"] if c["id"] == check_id)


STARVED = {
    "square_1000": ("square_linf", {"max_queries": 1000}),
    "square_100": ("square_linf", {"max_queries": 100}),
    "hsj_1000": ("hopskipjump_l2", {"max_queries": 1000}),
    # random search at Square's initial budget (it sees no scores to raise confidence with)
    "random_1000": ("square_linf", {"attack": "random", "norm": "linf", "max_queries": 1000,
                                    "confident_queries": None}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STARVED))
def test_starved_attacks_never_pass_on_the_demo_model(name, demo_data, tmp_path):
    base, change = STARVED[name]
    check = _packaged(base)
    params = {k: v for k, v in ({**check["params"], **change}).items()
              if k not in ("initial_queries", "query_cap") and v is not None}
    check = check | {"params": params}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "starved", "classes": CLASSES, "seed": 0,
                                    "checks": [check]}))
    for seed in (0, 1, 2):
        out = tmp_path / f"o{seed}"
        proc = _run(demo_model_path("standard"), path, demo_data, out, "--seed", str(seed))
        assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
        (c,) = json.loads((out / "results.json").read_text())["measurement"]["checks"]
        assert c["status"] != "PASS", (name, seed, c["decision"], c["metrics"])


def test_checks_of_different_sizes_share_their_samples(model_path, data, tmp_path):
    path = tmp_path / "s.yaml"
    attack = {"attack": "square_linf", "epsilon": 0.05, "max_queries": 20,
              "binarization": False}
    path.write_text(yaml.safe_dump({"name": "nested", "classes": CLASSES, "seed": 3, "checks": [
        {"id": "small", "kind": "attack", "samples": 8, "params": attack},
        {"id": "large", "kind": "attack", "samples": 20, "params": attack}]}))
    proc = _run(model_path, path, data, tmp_path / "o")
    assert proc.returncode in CARD_WRITTEN_CODES, proc.stderr
    recs = _records(tmp_path / "o")
    small = {r["i"] for r in recs if r["check"] == "small"}
    large = {r["i"] for r in recs if r["check"] == "large"}
    assert len(small) == 8 and small <= large
    (worst,) = json.loads((tmp_path / "o" / "results.json").read_text()
                          )["measurement"]["attack_worst_case"]
    assert worst["n"] == 8  # every sample of the smaller check is in the worst case
