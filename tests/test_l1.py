"""The L1 threat model: the projection onto the L1 ball and the box, l1-APGD, and an L1 row on
the card.

The projection is held to an independent float64 oracle (a bisection on the soft threshold in
numpy, not certify's breakpoint search); the attack's proposals and judged points to a numpy
check of the ball and the box; the row runs end to end through the CLI on the demo model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import certify.norms as norms
from certify.attacks import APGD, APGDTargeted
from certify.attacks.apgd import _sparse_direction, l1_reviews
from certify.attacks.base import CountingProxy, inside, project
from certify.checks.attack import AttackCheck
from certify.demo.synthetic import GTSRB_CLASS_NAMES, generate
from certify.errors import SuiteError
from certify.norms import L1, project_l1_box

pytestmark = pytest.mark.unit

DEMO = Path(__file__).resolve().parents[1] / "certify" / "demo"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """torch on one thread, as certify runs on CPU (two threads on a loaded 2-core machine
    run the attack tests many times slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def oracle(v: np.ndarray, x: np.ndarray, eps: float) -> np.ndarray:
    """argmin ||z − v||² over ||z − x||₁ ≤ ε, 0 ≤ z ≤ 1 (one flat sample, float64): the
    threshold λ by bisection on Σ min(max(|w| − λ, 0), room) (non-increasing in λ)."""
    w = v - x
    room = np.where(w > 0, 1.0 - x, x)

    def moved(lam: float) -> np.ndarray:
        return np.sign(w) * np.clip(np.abs(w) - lam, 0.0, room)

    lo, hi = 0.0, float(np.abs(w).max()) + 1.0
    if np.abs(moved(0.0)).sum() <= eps:
        return x + moved(0.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.abs(moved(mid)).sum() > eps else (lo, mid)
    return x + moved(hi)


def _l1(z: torch.Tensor, x: torch.Tensor) -> np.ndarray:
    return np.abs(z.double().numpy() - x.double().numpy()).reshape(len(x), -1).sum(1)


def _problems(seed: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Small random problems: images with many values at 0 and 1, offsets that leave the box,
    radii from tiny to beyond the box, and points already inside."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(12):
        x = torch.rand(4, 2, 3, 3, generator=g)
        x = torch.where(x < 0.25, 0.0, torch.where(x > 0.75, 1.0, x))
        scale = [0.05, 0.3, 1.0, 3.0][k % 4]
        v = x + scale * torch.randn(x.shape, generator=g)
        eps = [0.01, 0.5, 2.0, 40.0][(k // 4 + k) % 4]
        out.append((v, x, eps))
    x = torch.rand(3, 2, 3, 3, generator=g)
    inner = (x + 0.001 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    out.append((inner, x, 5.0))  # already in the ball and the box
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_the_projection_matches_an_independent_oracle(seed):
    for v, x, eps in _problems(seed):
        z = project_l1_box(v, x, eps)
        assert z.dtype == torch.float32 and z.shape == v.shape
        assert bool(((z >= 0) & (z <= 1)).all())  # the box exactly
        assert (_l1(z, x) <= eps * (1 + 1e-9)).all(), (_l1(z, x), eps)
        for b in range(len(x)):
            want = oracle(v[b].double().numpy().ravel(), x[b].double().numpy().ravel(), eps)
            got = z[b].double().numpy().ravel()
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
        assert torch.equal(project(v, x, "l1", eps), z)
        assert bool(inside(z, x, "l1", eps).all())


def test_the_projection_keeps_a_point_inside_and_lands_on_the_sphere_otherwise():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(5, 3, 32, 32, generator=g)
    v = x + torch.randn(x.shape, generator=g)
    z = project_l1_box(v, x, 12.0)
    np.testing.assert_allclose(_l1(z, x), 12.0, rtol=1e-6)  # Gaussian offsets leave the ball
    assert torch.equal(project_l1_box(z, x, 12.0), z)
    inner = (x + 1e-4 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    assert torch.equal(project_l1_box(inner, x, 12.0), inner)
    assert not bool(inside(v.clamp(0, 1), x, "l1", 12.0).any())


def test_the_search_on_few_candidates_widens_to_the_exact_answer(monkeypatch):
    g = torch.Generator().manual_seed(5)
    x = torch.rand(6, 3, 8, 8, generator=g)
    v = x + 0.5 * torch.randn(x.shape, generator=g)
    for eps in (0.3, 5.0, 40.0):
        whole = project_l1_box(v, x, eps)  # 192 values: one search on all of them
        monkeypatch.setattr(norms, "L1_CANDIDATES", 2)
        narrow = project_l1_box(v, x, eps)
        monkeypatch.setattr(norms, "L1_CANDIDATES", 256)
        np.testing.assert_allclose(narrow.numpy(), whole.numpy(), rtol=0, atol=1e-7)


def test_the_sparse_step_moves_the_top_coordinates_the_box_lets_move():
    grad = torch.tensor([[5.0, -4.0, 3.0, -2.0, 1.0, 0.5, 0.0, -0.1, 0.2, 0.3]]).view(1, 1, 2, 5)
    x_adv = torch.tensor([[1.0, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]]).view(1, 1, 2, 5)
    d = _sparse_direction(grad, x_adv, torch.tensor([0.3])).flatten()
    # the 3 largest that can move: 5.0 is held at 1 and -2.0 at 0, so -4.0, 3.0 and 1.0
    assert d.tolist() == pytest.approx([0, -1 / 3, 1 / 3, 0, 1 / 3, 0, 0, 0, 0, 0])
    assert float(d.abs().sum()) == pytest.approx(1.0)
    assert l1_reviews(100) == list(range(4, 101, 4)) and l1_reviews(10) == list(range(1, 11))
    # the norm's own steepest ascent: the largest magnitude alone
    assert L1.direction(grad).flatten().tolist() == [1.0] + [0.0] * 9


def test_the_l1_norm_names_measures_and_orders_itself():
    assert norms.norm("l1") is L1 and L1.short(12.0) == "L1 12"
    assert [n.name for n in norms.NORMS.values()] == ["linf", "l2", "l1", "l0", "spatial"]
    assert L1.default_epsilon == 12.0 and not L1.binarization and L1.chosen
    assert L1.sweep_top((3, 32, 32)) == 3072.0
    x = torch.zeros(1, 3, 4, 4)
    z = x.clone()
    z[0, 0, 0, :2] = 0.5
    assert L1.size((z - x).flatten(1)).tolist() == [1.0]
    assert L1.inside(z, x, 1.0).tolist() == [True] and L1.inside(z, x, 0.99).tolist() == [False]
    s = L1.start(_Normals(), [0, 1], (3, 4, 4))
    np.testing.assert_allclose(s.flatten(1).abs().sum(1).numpy(), 1.0, rtol=1e-6)


class _Normals:
    def normal(self, shape: tuple[int, ...], i: int) -> torch.Tensor:
        return torch.randn(shape, generator=torch.Generator().manual_seed(i))


@pytest.fixture(scope="module")
def signs():
    from pgd_oracle import Judge

    judge = Judge(DEMO / "standard.onnx")
    x, y = generate(1, seed=11)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
    yt = torch.from_numpy(y)
    keep = judge.predict(xt).argmax(1) == yt
    return xt[keep][:10], yt[keep][:10], judge


def _copy():
    import onnx

    from certify.models.base import Preprocessing
    from certify.models.torchcopy import TorchCopy

    return TorchCopy(onnx.load(str(DEMO / "standard.onnx")), Preprocessing(), 3, "NCHW", 43)


def test_apgd_l1_proposes_and_breaks_inside_the_ball_and_the_box(signs):
    x, y, judge = signs
    copy, eps = _copy(), 6.0
    seeds = torch.arange(len(x))
    attack = APGD(epsilon=eps, norm="l1", iterations=20, restarts=1)
    proposal = attack.run(CountingProxy(copy), x, y, seeds, "logits")
    assert (_l1(proposal.x_adv, x) <= eps * (1 + 1e-6)).all()
    assert bool(((proposal.x_adv >= 0) & (proposal.x_adv <= 1)).all())
    out = attack(copy, x, y, seeds, "logits", judge=judge, threat=("l1", eps))
    assert out.gradients.tolist() == [21] * len(x)
    assert (_l1(out.x_adv, x) <= eps * (1 + 1e-6)).all()
    assert bool(((out.x_adv >= 0) & (out.x_adv <= 1)).all())
    wrong = judge.predict(out.x_adv).argmax(1) != y
    assert out.success.tolist() == wrong.tolist() and int(wrong.sum()) >= 3
    # sparse: the breaks change far fewer values than an L2 or L∞ attack would
    changed = (out.x_adv != x).flatten(1).sum(1)[out.success]
    assert int(changed.max()) < x[0].numel() // 4
    t = APGDTargeted(epsilon=eps, norm="l1", iterations=5, targets=2)(
        copy, x[:4], y[:4], seeds[:4], "logits", judge=judge, threat=("l1", eps))
    assert (_l1(t.x_adv, x[:4]) <= eps * (1 + 1e-6)).all()


def test_the_suite_takes_l1_for_the_attacks_that_list_it():
    check = AttackCheck("apgd_ce", norm="l1", binarization=True)
    check.check_params("checks[0]")
    assert check.threat_model() == ("l1", 12.0)
    assert check.binarization_ladder() is None
    assert check.sweep_epsilons((3, 32, 32)) == [3.0, 6.0, 12.0, 24.0, 48.0, 3072.0]
    AttackCheck("apgd_t", norm="l1", epsilon=6).check_params("checks[0]")
    for attack in ("square_linf", "hopskipjump", "random"):
        with pytest.raises(SuiteError, match="works in"):
            AttackCheck(attack, norm="l1").check_params("checks[0]")
    with pytest.raises(SuiteError, match="norm must be linf, l2 or l1"):
        AttackCheck("apgd_ce", norm="l3").check_params("checks[0]")


@pytest.mark.e2e
def test_an_l1_row_runs_end_to_end_and_renders_on_the_card(tmp_path):
    from builders import run_cli

    x, y = generate(1, seed=11)
    np.savez(tmp_path / "signs.npz", x=x[:8], y=y[:8])
    checks = [{"id": "apgd_l1", "kind": "attack",
               "params": {"attack": "apgd_ce", "norm": "l1", "epsilon": 6.0,
                          "attack_params": {"iterations": 10, "restarts": 1}},
               # unreachable on this model at ε = 6: the row FAILs (a determinate verdict)
               "threshold": {"metric": "robust_accuracy", "min": 0.99}}]
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "l1", "seed": 0, "classes": list(GTSRB_CLASS_NAMES),
                                     "checks": checks}))
    r = run_cli("run", DEMO / "standard.onnx", "--suite", suite, "--data",
                tmp_path / "signs.npz", "--out", tmp_path / "out", "--no-pdf")
    assert r.returncode == 1, r.stdout + r.stderr
    m = json.loads((tmp_path / "out" / "results.json").read_text())["measurement"]
    (row,) = m["attack_worst_case"]
    assert (row["norm"], row["epsilon"]) == ("l1", 6.0) and row["n"] == 8
    assert row["status"] == "FAIL", row["decision"]
    (c,) = m["checks"]
    assert c["status"] != "ERROR", c
    assert c["details"]["norm"] == "l1" and c["details"]["binarization"] is None
    assert c["metrics"]["gradient_evaluations"] > 0 and c["metrics"]["n_broken"] >= 1
    sweep = c["details"]["white_box"]["eps_sweep"]
    assert sweep["epsilons"][-1] == 3072.0
    html = (tmp_path / "out" / "card.html").read_text()
    assert "L1 6" in html and "l1, ε = 6" in html
    # compare pairs the L1 threat-model row by its norm and radius, like any other
    proc = run_cli("compare", tmp_path / "out", tmp_path / "out", "--json", "-")
    doc = json.loads(proc.stdout)
    (threat,) = doc["threat_models"]
    assert threat["id"] == "threat model L1 6" and threat["paired"], threat
    assert threat["norm"] == "l1" and threat["epsilon"] == 6.0, threat
