"""The randomness probe: at least 10 repeats, near-boundary inputs, and no attack PASS on a
randomised model (issue 17, point 10)."""

from __future__ import annotations

import pytest
import torch

from certify.checks.base import CheckContext, Measurement
from certify.checks.sanity import MIN_REPEATS, Sanity, top2_margin
from certify.data.loaders import from_arrays
from certify.engine import no_attack_passes_when_randomised
from certify.errors import SuiteError
from certify.models.base import ModelInfo, QueryCounter
from certify.results import check_result_model
from certify.suite import parse_suite

import builders

pytestmark = pytest.mark.unit

CLASSES = [f"c{i}" for i in range(builders.NUM_CLASSES)]


class Linear(torch.nn.Module):
    """A fixed random linear classifier on 4x4-pooled images: varied, confident labels."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = torch.randn(builders.NUM_CLASSES, 48, generator=g) * 20

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1) - 0.5
        return f @ self.w.T


class BoundaryRandom:
    """A classifier that randomises only where its top-2 margin is below ``delta``:
    ``mode="noise"`` adds tiny logit noise, ``mode="flip"`` swaps the top two classes at
    random. Far from its boundaries it answers the same input the same way every time."""

    def __init__(self, net: torch.nn.Module, delta: float, mode: str | None) -> None:
        self.net, self.delta, self.mode = net, delta, mode
        self.info = ModelInfo(name="planted", identity="sha256:planted", input_shape=(3, 32, 32),
                              num_classes=builders.NUM_CLASSES, output="logits")

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = self.net(x.float())
        unsure = top2_margin(logits, "logits") < self.delta
        if self.mode == "noise":
            logits = logits + unsure[:, None] * 1e-3 * torch.randn_like(logits)
        elif self.mode == "flip":
            top = logits.topk(2, dim=1).indices
            swap = unsure & (torch.rand(len(logits)) < 0.5)
            rows = swap.nonzero().flatten()
            a, b = top[rows, 0], top[rows, 1]
            va, vb = logits[rows, a].clone(), logits[rows, b].clone()
            logits[rows, a], logits[rows, b] = vb, va
        return logits


@pytest.fixture(scope="module")
def setup():
    net = Linear()
    x = torch.from_numpy(builders.make_images(12, seed=5)).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        clean = top2_margin(net(x), "logits")
    delta = 0.01  # a sure model: every sample's own margin is far above it
    assert float(clean.min()) > 50 * delta
    return net, x, delta


def _ctx() -> CheckContext:
    return CheckContext(check_seed=11, device=torch.device("cpu"), class_names=CLASSES)


def _run(model, x: torch.Tensor, check: Sanity, split: int | None = None) -> list[dict]:
    counter = QueryCounter(model)
    idx = list(range(len(x)))
    parts = [idx] if split is None else [idx[:split], idx[split:]]
    rows = [r for p in parts for r in check.run_batch(counter, x[p], torch.zeros(len(p)), p,
                                                      _ctx())]
    assert sum(r["queries"] for r in rows) == counter.queries  # every query is claimed
    return rows


def _summary(rows: list[dict]):
    data = from_arrays(torch.zeros(len(rows), 2, 2, 3, dtype=torch.uint8).numpy(),
                       torch.zeros(len(rows), dtype=torch.int64).numpy(),
                       [str(i) for i in range(len(rows))], CLASSES, "t", "npz")
    return Sanity().summarize(rows, data)


@pytest.mark.parametrize("mode", ["noise", "flip"])
def test_a_model_random_only_near_its_boundary_is_flagged(setup, mode):
    net, x, delta = setup
    rows = _run(BoundaryRandom(net, delta, mode), x, Sanity())
    assert not any(r["random"] for r in rows)  # the samples themselves look deterministic
    m = _summary(rows)
    assert m.metrics["nondeterministic_share"] > 0.5
    assert m.metrics["boundary_nondeterministic_share"] > 0.5
    assert any("randomised model" in w and "near the decision boundary" in w
               for w in m.warnings)


def test_the_probe_reaches_small_margins(setup):
    net, x, delta = setup
    rows = _run(BoundaryRandom(net, delta, None), x, Sanity())
    margins = sorted(r["boundary_margin"] for r in rows)
    assert margins[len(margins) // 2] < delta


def test_a_deterministic_model_is_not_flagged_and_batching_changes_no_record(setup):
    net, x, delta = setup
    model = BoundaryRandom(net, delta, None)
    # One torch thread (as certify runs on the CPU): a multi-threaded matmul sums in an order
    # that depends on the batch, and then the model itself would not be batch-independent.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _check_batching(model, x)
    finally:
        torch.set_num_threads(threads)


def _check_batching(model, x: torch.Tensor) -> None:
    rows = _run(model, x, Sanity())
    assert _run(model, x, Sanity(), split=5) == rows
    m = _summary(rows)
    assert m.metrics["nondeterministic_share"] == 0 and not m.warnings
    assert all(r["queries"] >= 2 * MIN_REPEATS for r in rows)


def test_at_least_ten_repeats_by_default_and_fewer_are_refused():
    assert Sanity().repeats == MIN_REPEATS == 10
    with pytest.raises(SuiteError, match="repeats must be an integer >= 10"):
        parse_suite({"name": "t", "classes": CLASSES, "checks": [
            {"kind": "sanity", "params": {"repeats": 3}}]}, "s.yaml")


def _results(sanity_share: float, attack_status: str, order: str):
    """The two checks' typed results (in ``order``) and the sanity check's measurement."""
    from certify.results import DecidedBy

    sanity = check_result_model("sanity").model_construct(
        id="sanity", kind="sanity", status="WARN" if sanity_share else "INFO", warnings=[],
        decision="no threshold (informational)", decided_by=DecidedBy(rule="no_threshold"))
    attack = check_result_model("attack").model_construct(
        id="square", kind="attack", status=attack_status, warnings=[],
        decision="robust_accuracy = 0.9 (95% interval 0.8–0.95) lies wholly within "
                 "robust_accuracy ≥ 0.5 (interval rule)",
        decided_by=DecidedBy(rule="interval_within"))
    measured = {"sanity": Measurement(metrics={"nondeterministic_share": sanity_share})}
    return ([sanity, attack] if order == "sanity-first" else [attack, sanity]), measured


SUITE = parse_suite({"name": "t", "classes": CLASSES, "checks": [
    {"id": "square", "kind": "attack", "samples": 5,
     "params": {"attack": "square_linf", "max_queries": 10},
     "threshold": {"metric": "robust_accuracy", "min": 0.5}},
    {"id": "sanity", "kind": "sanity"}]}, "s.yaml")


@pytest.mark.parametrize("order", ["sanity-first", "attack-first"])
def test_no_attack_passes_on_a_randomised_model_whatever_the_order(order):
    results = no_attack_passes_when_randomised(SUITE, *_results(0.25, "PASS", order))
    attack = next(r for r in results if r.kind == "attack")
    assert attack.status == "WARN"
    assert "no attack can PASS on a randomised model" in attack.decision
    assert any("check sanity found the model randomised" in w for w in attack.warnings)
    assert [r.id for r in results] == (["sanity", "square"] if order == "sanity-first"
                                       else ["square", "sanity"])


@pytest.mark.parametrize("status", ["FAIL", "INCONCLUSIVE"])
def test_other_attack_statuses_stay_and_a_deterministic_model_changes_nothing(status):
    results = no_attack_passes_when_randomised(SUITE, *_results(0.25, status, "sanity-first"))
    assert results[1].status == status
    results = no_attack_passes_when_randomised(SUITE, *_results(0.0, "PASS", "sanity-first"))
    assert results[1].status == "PASS" and not results[1].warnings
