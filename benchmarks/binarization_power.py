"""Power of the binarization test: which configurations tell a starved attack from an adequate one?

On the demo's standard model and the first ``--samples`` correctly classified generated signs,
each packaged attack runs, at an adequate and at a starved budget, through every rung of the
test ladder (certify.attacks.binarization.LADDER, hardest first): per rung the attack's score
(with its 95% Wilson interval), the R-ASR (random sampling with the attack's full budget), the
setup failures and whether the paper's rule passes (score ≥ 0.95 and ≥ R-ASR + 0.1). A rung
*separates* an attack when the adequate budget passes it and the starved budget does not.
The attack's robust accuracy on the same images at the same budget is printed beside, as the
ground truth for "starved".

Run: ``nice -n 10 .venv/bin/python benchmarks/binarization_power.py [--samples 20] [--only NAME]``
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from certify.api import demo_model_path
from certify.attacks import HopSkipJump, RandomSearch, SquareLinf, margin, project
from certify.attacks.base import Attack
from certify.attacks.binarization import LADDER, PACKAGED, ladder_scores, ladder_test, passes
from certify.checks.attack import PASS_SCORE, RASR_MARGIN, one_hot_answers
from certify.demo.synthetic import generate
from certify.device import choose_device
from certify.models.base import QueryCounter
from certify.models.onnx import OnnxModel
from certify.stats import wilson_interval

EPS = {"linf": 8 / 255, "l2": 0.5}
#: (name, norm, adequate attack, starved attack); random search has no adequate budget.
ATTACKS: list[tuple[str, str, Attack | None, Attack]] = [
    ("square_linf", "linf", SquareLinf(epsilon=EPS["linf"], max_queries=1000),
     SquareLinf(epsilon=EPS["linf"], max_queries=100)),
    ("hopskipjump_l2", "l2", HopSkipJump(epsilon=EPS["l2"], max_queries=5000, norm="l2"),
     HopSkipJump(epsilon=EPS["l2"], max_queries=1000, norm="l2")),
    ("random_linf", "linf", None, RandomSearch(epsilon=EPS["linf"], max_queries=1000)),
]


def robust_accuracy(model: Any, attack: Attack, x: torch.Tensor, y: torch.Tensor, norm: str,
                    output: str) -> float:
    """Share of the (correctly classified) images the attack leaves unbroken."""
    res = attack.run(model, x, y, torch.arange(len(x)) + 7, output)
    adv = project(res.x_adv, x, norm, attack.epsilon)
    return float((model.predict(adv).argmax(1) == y).float().mean())


def run_ladder(model: OnnxModel, attack: Attack, norm: str, x: torch.Tensor, y: torch.Tensor,
               output: str) -> tuple[list[dict[str, Any]], float, int]:
    """Every rung on every image: rung scores, wall seconds, queries."""
    counter = QueryCounter(model)
    scores = counter.predict(x)
    m0 = margin(scores.cpu(), y.cpu(), output)
    oh = one_hot_answers(scores, output)
    ladder = LADDER[norm]
    records = []
    t0 = time.perf_counter()
    for j in range(len(x)):
        records.append(ladder_test(counter, x[j], attack, norm, EPS[norm], 1000 + 97 * j,
                                   ladder, ladder.index(PACKAGED[norm]), output, float(m0[j]),
                                   bool(oh[j]), every_rung=True))
    return ladder_scores(records, len(ladder)), time.perf_counter() - t0, counter.queries


def main() -> None:
    """Print one markdown table per attack."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--only", default=None, help="one attack name")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = OnnxModel(demo_model_path("standard"), choose_device("cpu"))
    output = model.info.output
    xu8, yl = generate(4, seed=4242)
    x = torch.from_numpy(xu8.transpose(0, 3, 1, 2).copy()).float() / 255
    y = torch.from_numpy(yl)
    keep = (model.predict(x).argmax(1) == y).nonzero().flatten()[: args.samples]
    x, y = x[keep], y[keep]
    for name, norm, adequate, starved in ATTACKS:
        if args.only and name != args.only:
            continue
        rows: dict[str, list[dict[str, Any]]] = {}
        for label, attack in (("adequate", adequate), ("starved", starved)):
            if attack is None:
                continue
            tag = f"{label} {attack.max_queries}"
            ra = robust_accuracy(model, attack, x, y, norm, output)
            rungs, secs, queries = run_ladder(model, attack, norm, x, y, output)
            rows[tag] = rungs
            print(f"\n### {name}, {tag} queries: robust accuracy on these {len(x)} images "
                  f"{ra:.2f}; ladder {secs:.0f} s, {queries} queries "
                  f"({queries / len(x):.0f} per image)\n")
            print("| rung | configuration | score (95% CI) | R-ASR | setup failed | passes |")
            print("|---|---|---|---|---|---|")
            for k, (s, r) in enumerate(zip(LADDER[norm], rungs, strict=True)):
                t = r["tested"]
                lo, hi = wilson_interval(r["success"], t) if t else (0.0, 1.0)
                ok = passes(r["success"], r["rasr_success"], t, PASS_SCORE, RASR_MARGIN)
                mark = " (packaged)" if s == PACKAGED[norm] else ""
                print(f"| {k} | {s.label()}{mark} | "
                      f"{r['success'] / max(t, 1):.2f} ({lo:.2f}–{hi:.2f}) | "
                      f"{r['rasr_success'] / max(t, 1):.2f} | {r['setup_failed']} | "
                      f"{'yes' if ok else 'no'} |", flush=True)
        if len(rows) == 2:
            (_, a), (_, b) = rows.items()
            sep = [k for k in range(len(LADDER[norm]))
                   if passes(a[k]["success"], a[k]["rasr_success"], a[k]["tested"],
                             PASS_SCORE, RASR_MARGIN)
                   and not passes(b[k]["success"], b[k]["rasr_success"], b[k]["tested"],
                                  PASS_SCORE, RASR_MARGIN)]
            print(f"\nrungs separating starved from adequate {name}: {sep or 'none'}")


if __name__ == "__main__":
    main()
